"""The harness: configs, numerics applied before JAX starts, run records, the launcher and its one process
boundary, and the training loop every experiment shares. Importing this package does not import JAX."""

# Modules, imported by name (e.g. `from hwrepro.harness import records`): loop and checkpoints import JAX.
__all__ = ["checkpoints", "config", "interrupts", "launcher", "loop", "numerics", "parallel", "process",
           "progress", "records", "runner"]
