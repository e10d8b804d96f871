"""The command line: the only code that knows Hydra (compose, errors, builders, sweeps, doctor)."""
