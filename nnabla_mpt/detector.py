"""The overflow detector shared by every updater."""
from typing import Dict, List, Literal, Optional, Sequence

import numpy as np

from . import _validate as check
from .policy import FP16_MAX

OverflowMode = Literal["inf_nan", "saturation"]


class OverflowDetector:
    """Decides whether the gradients of a step overflowed.

    Modes:

    * ``"inf_nan"`` (default): a gradient holding inf or NaN is an overflow. The check is the
      solver's own single pass over its gradients (``solver.check_inf_or_nan_grad()``).
    * ``"saturation"``: additionally, a gradient value with ``|g| >= threshold`` (by default
      65504, the largest float16) is an overflow. This is for hardware whose float16
      arithmetic saturates at the maximum instead of producing inf.

    Args:
        mode: ``"inf_nan"`` or ``"saturation"``.
        threshold: The saturation threshold; ``> 0``. Used in saturation mode only.

    Example:
        >>> from nnabla_mpt import OverflowDetector
        >>> OverflowDetector("saturation").threshold
        65504.0
    """

    def __init__(self, mode: OverflowMode = "inf_nan", threshold: float = FP16_MAX) -> None:
        self.mode = check.choice("overflow_mode", mode, ("inf_nan", "saturation"))
        self.threshold = check.real("threshold", threshold, gt=0.0)

    def _bad(self, g: np.ndarray) -> bool:
        if self.mode == "inf_nan":
            return not np.isfinite(g).all()
        with np.errstate(invalid="ignore"):
            return not (np.abs(g) < self.threshold).all()

    def check(self, solver, grads: Optional[Sequence] = None) -> bool:
        """Returns True when the step overflowed.

        Args:
            solver: The solver whose parameter gradients are checked.
            grads: Optional list of ``nnabla.NdArray`` to check instead of the solver's
                gradients (for example reduced gradients of a communicator).
        """
        if grads is None:
            if self.mode == "inf_nan":
                return bool(solver.check_inf_or_nan_grad())
            grads = [v.grad for v in solver.get_parameters().values()]
        return any(self._bad(g.data) for g in grads)

    def nonfinite_params(self, params: Dict[str, object]) -> List[str]:
        """Names of the parameters whose gradients count as overflow under this mode.

        Args:
            params: Mapping name -> ``nnabla.Variable``, e.g. ``solver.get_parameters()``.
        """
        return [name for name, v in params.items() if self._bad(v.g)]

    def __repr__(self) -> str:
        return f"OverflowDetector(mode={self.mode!r}, threshold={self.threshold:g})"
