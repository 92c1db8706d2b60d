"""Loss scaling for mixed-precision training with nnabla.

The policies (:class:`DynamicLossScale`, :class:`FixedLossScale`) are plain Python and import
without nnabla; the updaters run one training step each and share one overflow detector.
Names that need nnabla (or mpi4py) are imported on first use, so ``import nnabla_mpt``
neither loads nnabla nor starts MPI. Submodules are imported by their paths in the package
(``nnabla_mpt.scale.policy``, ``nnabla_mpt.distributed.launcher``; see the API reference).
"""
import importlib as _importlib
from typing import Any as _Any

from .core.dtypes import FP16_MAX
from .scale.policy import DynamicLossScale, FixedLossScale

__version__ = "0.1.0"

# The public names that need nnabla, by the module that defines them: loaded on first use.
_LAZY = {
    "OverflowDetector": "step.detector",
    "OverflowHandling": "step.overflow_handling",
    "DynamicLossScalingUpdater": "updater",
    "FixedLossScalingUpdater": "updater",
    "StepResult": "step.decision",
    "GradientStats": "scale.gradient_stats",
    "PrecisionSchedule": "scale.precision",
    "diagnose": "diagnosis.diagnosis",
    "OverflowReport": "diagnosis.report",
    "LossScaleCollapseError": "diagnosis.report",
    "MPICommunicator": "distributed.communicator",
    "GradientReduction": "distributed.gradient_reduction",
    "SharedGradients": "distributed.shared_gradients",
    "set_current_communicator": "distributed.launcher",
    "LossScaleCallback": "monitoring",
    "LossScaleMonitor": "monitoring",
    "LossScaleStats": "monitoring",
    "LossScaleTensorBoard": "monitoring",
    "LossScaleReport": "report.run_report",
    "read_report": "report.run_report",
}

__all__ = ["DynamicLossScale", "FixedLossScale", "FP16_MAX"] + list(_LAZY)


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nnabla_mpt' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    """The public API: ``__all__`` and the module's dunders (not the names its code imports,
    nor the modules it loads)."""
    return sorted({name for name in globals() if name.startswith("__")} | set(__all__))
