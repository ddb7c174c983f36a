"""hwrepro: how hardware and numerics change what deep networks learn, and SLIDE-style sparse training.

Importing the package does not import JAX: numerics settings (XLA_FLAGS, thread affinity) must be applied
before JAX initialises, so only the modules that need JAX import it.
"""

__version__ = "0.1.0"
