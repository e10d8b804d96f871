"""The worker process and what it sets up in itself (signals, threads, seed, malloc)."""
