"""Loss scaling for mixed-precision training with nnabla.

The policies (:class:`DynamicLossScale`, :class:`FixedLossScale`) are plain Python and import
without nnabla; the updaters run one training step each and share one overflow detector.
Names that need nnabla (or mpi4py) are imported on first use, so ``import nnabla_mpt``
neither loads nnabla nor starts MPI.
"""
import importlib as _importlib
import importlib.abc as _abc
import importlib.util as _util
import sys as _sys
from typing import Any as _Any

from .core.dtypes import FP16_MAX
from .scale.policy import DynamicLossScale, FixedLossScale

__version__ = "0.1.0"

_LAZY = {
    "OverflowDetector": "step.detector",
    "DynamicLossScalingUpdater": "updater",
    "FixedLossScalingUpdater": "updater",
    "StepResult": "updater",
    "GradientStats": "scale.gradient_stats",
    "diagnose": "diagnosis.diagnosis",
    "OverflowReport": "diagnosis.report",
    "LossScaleCollapseError": "diagnosis.report",
    "MPICommunicator": "distributed.communicator",
    "SharedGradients": "distributed.shared_grads",
    "set_current_communicator": "distributed.launcher",
    "LossScaleCallback": "monitoring",
    "LossScaleMonitor": "monitoring",
    "LossScaleStats": "monitoring",
}

# The submodules the API reference documents (docs/api.rst), by the name they are imported
# as (``nnabla_mpt.policy``) and where they live: in ``dir()``, and loaded on first use like
# the names of _LAZY.
_SUBMODULES = {
    "gradient_stats": "scale.gradient_stats",
    "launcher": "distributed.launcher",
    "measured": "scale.measured",
    "monitoring": "monitoring",
    "nnabla_api": "distributed.nnabla_api",
    "policy": "scale.policy",
    "precision": "scale.precision",
    "seed": "scale.seed",
}

__all__ = ["DynamicLossScale", "FixedLossScale", "FP16_MAX"] + list(_LAZY)


class _DocumentedPaths(_abc.MetaPathFinder, _abc.Loader):
    """``import nnabla_mpt.policy`` (and ``from nnabla_mpt.policy import ...``) of a
    documented submodule that lives in a folder: the module at its folder's path, the same
    object under both names (an import under the short name loads nothing else)."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package != __name__ or _SUBMODULES.get(name, name) == name:
            return None
        return _util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = _importlib.import_module(f".{_SUBMODULES[spec.name.rpartition('.')[2]]}",
                                          __name__)
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):
        # The import machinery gave the module the short name's spec: it keeps its own.
        module.__spec__ = module.__spec__.loader_state


# One finder, also when the package is reloaded.
_sys.meta_path[:] = [f for f in _sys.meta_path if type(f).__name__ != "_DocumentedPaths"]
_sys.meta_path.insert(0, _DocumentedPaths())


def __getattr__(name: str) -> _Any:
    if name in _SUBMODULES:
        return _importlib.import_module(f".{_SUBMODULES[name]}", __name__)
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
