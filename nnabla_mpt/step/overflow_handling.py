"""What an updater counts as an overflow and what it does about one, as one value.

The step loop skips an overflowing step; :class:`OverflowHandling` says how overflow is
detected (``mode``), whether the same ``update()`` call tries again on new batches
(``max_retries``), and what a collapsing scale leads to (``floor_policy`` after
``diagnose_after`` overflowing steps, see :mod:`nnabla_mpt.step.collapse`).
"""
from dataclasses import dataclass
from typing import Literal, get_args

from ..core import _validate as check
from .detector import OverflowMode

FloorPolicy = Literal["raise", "warn", "ignore"]


@dataclass(frozen=True)
class OverflowHandling:
    """How the updaters detect an overflowing step and what they do about it.

    Args:
        mode: ``"inf_nan"`` (default): a gradient holding inf or NaN is an overflow;
            ``"saturation"``: a gradient at the float16 limits (``±65504``) counts too,
            for hardware that saturates instead of overflowing (see
            :class:`~nnabla_mpt.OverflowDetector`).
        max_retries: Retry mode: after a skipped step, run up to this many more steps
            within the same ``update()`` call, each on the batch the data feeder gives it
            (without a feeder, the same one). 0 (default) returns the skipped
            step. Needs the overflow check (``enable_overflow_check=True``).
        floor_policy: What to do when the loss scale collapses, i.e. when the overflow
            streak reaches ``diagnose_after`` or a step overflows at ``min_scale`` (a fixed
            scale has no floor): the updater replays the last batch with
            :func:`nnabla_mpt.diagnose` and ``"raise"`` (default) raises
            :class:`~nnabla_mpt.LossScaleCollapseError` carrying the report; ``"warn"``
            logs the report once (``logger.warning``) and keeps skipping; ``"ignore"``
            does neither (and runs no diagnosis). The report is kept in
            ``updater.last_report``. A streak is reported at most once. A streak whose
            report says ``kind="overflow"`` (the batch is finite at a smaller scale) while
            the scale can still back off is no collapse: it is logged at info level and
            training goes on; if the scale then reaches ``min_scale`` the floor triggers.
            A skipped step whose loss itself is non-finite is counted without lowering
            the scale; a step whose loss is non-finite while its gradients are finite
            updates and counts as a good step.
        diagnose_after: Consecutive overflowing steps that trigger the diagnosis (>= 1). A
            single overflow is only skipped and counted.

    Raises:
        TypeError, ValueError: a field out of range; the message names it.

    Example:
        >>> from nnabla_mpt import OverflowHandling
        >>> OverflowHandling(floor_policy="warn", diagnose_after=16)
        OverflowHandling(mode='inf_nan', max_retries=0, floor_policy='warn', diagnose_after=16)
    """
    mode: OverflowMode = "inf_nan"
    max_retries: int = 0
    floor_policy: FloorPolicy = "raise"
    diagnose_after: int = 8

    def __post_init__(self) -> None:
        name = f"{type(self).__name__}."
        checked = {"mode": check.choice(name + "mode", self.mode, get_args(OverflowMode)),
                   "max_retries": check.integer(name + "max_retries", self.max_retries, ge=0),
                   "floor_policy": check.choice(name + "floor_policy", self.floor_policy,
                                                get_args(FloorPolicy)),
                   "diagnose_after": check.integer(name + "diagnose_after",
                                                   self.diagnose_after, ge=1)}
        self.__dict__.update(checked)          # frozen: set past its __setattr__


def check_retries(max_retries: int, enable_overflow_check: bool) -> None:
    """Retries need the overflow check: without it no step is ever skipped."""
    if max_retries and not enable_overflow_check:
        raise ValueError(f"max_retries={max_retries!r} needs enable_overflow_check=True: "
                         f"without the check no step is ever skipped")
