"""Loss scaling for mixed-precision training with nnabla."""
__version__ = "0.1.0"

__all__ = ["MPICommunicator"]


def __getattr__(name):
    # Loaded on first use so that `import nnabla_mpt` stays light; the communicator
    # itself imports mpi4py only when one is constructed.
    if name == "MPICommunicator":
        from .communicator import MPICommunicator
        return MPICommunicator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
