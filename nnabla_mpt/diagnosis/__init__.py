"""What went non-finite and where: pass watches, diagnose(), reports; may import core."""
from typing import Any

# ``from nnabla_mpt.diagnosis import diagnose`` as when the diagnosis was one module; loaded
# on first use (the diagnosis needs nnabla, the watches the scale reads do not).
__all__ = ["diagnose", "OverflowReport", "LossScaleCollapseError"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import diagnosis
        return getattr(diagnosis, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
