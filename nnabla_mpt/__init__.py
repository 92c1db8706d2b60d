"""Loss scaling for mixed-precision training with nnabla."""
__version__ = "0.1.0"
