"""Loss scaling for mixed-precision training with nnabla.

The policies (:class:`DynamicLossScale`, :class:`FixedLossScale`) are plain Python and import
without nnabla; the updaters run one training step each and share one overflow detector.
Names that need nnabla (or mpi4py) are imported on first use, so ``import nnabla_mpt``
neither loads nnabla nor starts MPI.
"""
import importlib
from typing import Any

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

__all__ = ["DynamicLossScale", "FixedLossScale", "FP16_MAX"] + list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nnabla_mpt' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
