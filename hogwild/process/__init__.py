"""Process plumbing both sides use: signals, the fork server, shared-memory strategies."""
