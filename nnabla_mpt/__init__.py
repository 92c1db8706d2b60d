"""Loss scaling for mixed-precision training with nnabla.

The policies (:class:`DynamicLossScale`, :class:`FixedLossScale`) are plain Python and import
without nnabla; the updaters run one training step each and share one overflow detector.
Names that need nnabla (or mpi4py) are imported on first use, so ``import nnabla_mpt``
neither loads nnabla nor starts MPI.
"""
import importlib as _importlib
from typing import Any as _Any

from .dtypes import FP16_MAX
from .policy import DynamicLossScale, FixedLossScale

__version__ = "0.1.0"

_LAZY = {
    "OverflowDetector": "detector",
    "DynamicLossScalingUpdater": "updater",
    "FixedLossScalingUpdater": "updater",
    "StepResult": "updater",
    "GradientStats": "gradient_stats",
    "diagnose": "diagnosis",
    "OverflowReport": "report",
    "LossScaleCollapseError": "report",
    "MPICommunicator": "communicator",
    "SharedGradients": "shared_grads",
    "set_current_communicator": "launcher",
    "LossScaleCallback": "monitoring",
    "LossScaleMonitor": "monitoring",
    "LossScaleStats": "monitoring",
}

# The submodules the API reference documents (docs/api.rst): in ``dir()``, and loaded on
# first use like the names of _LAZY.
_SUBMODULES = ("gradient_stats", "launcher", "measured", "monitoring", "nnabla_api", "policy",
               "precision", "seed")

__all__ = ["DynamicLossScale", "FixedLossScale", "FP16_MAX"] + list(_LAZY)


def __getattr__(name: str) -> _Any:
    if name in _SUBMODULES:
        return _importlib.import_module(f".{name}", __name__)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nnabla_mpt' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    """The public API: ``__all__``, the documented submodules and the module's dunders
    (not the names its code imports, nor the modules it loads)."""
    dunders = {name for name in globals() if name.startswith("__")}
    return sorted(dunders | set(__all__) | set(_SUBMODULES))
