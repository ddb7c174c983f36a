"""The harness: configs, numerics applied before JAX starts, run records, the launcher and its one process
boundary, and the training loop every experiment shares. Importing this package does not import JAX."""
