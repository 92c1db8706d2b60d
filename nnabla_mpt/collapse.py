"""What the updaters do about a collapsing loss scale.

A *collapse* is a streak of ``diagnose_after`` overflowing steps, or an overflow at the
scale's floor (``min_scale``). After every skipped step :meth:`CollapseWatch.after_skip`
decides:

1. no collapse, or ``floor_policy="ignore"``, or this streak was already reported: nothing;
2. else replay the batch with :func:`nnabla_mpt.diagnosis.diagnose` (once per streak) and
   keep the report in ``last_report``;
3. a pure overflow (the batch is finite at a smaller scale, on some rank and a data or
   model problem on none) while a dynamic scale can still back off is the policy doing
   its job: one info line, and training goes on;
4. otherwise act by ``floor_policy``: ``"raise"`` :class:`LossScaleCollapseError`,
   ``"warn"`` log the report once and keep skipping.
"""
import logging
from typing import Callable, Mapping, Optional

from nnabla.logger import logger

from . import diagnosis
from .detector import OverflowDetector
from .policy import DynamicLossScale
from .report import LossScaleCollapseError, OverflowReport


class CollapseWatch:
    """The overflow streak of an updater, and the diagnosis of a collapse.

    Args:
        floor_policy: ``"raise"``, ``"warn"`` or ``"ignore"`` (checked by the caller).
        diagnose_after: Consecutive overflowing steps that call for a diagnosis.
        params: The solver's parameters (name -> Variable), named in the reports.
        detector: The overflow detector, for the debug line of a skipped step.
        policy: The loss-scale policy (is it dynamic, at its floor?).
        agree_on_diagnosis: ``report -> bool``: whether the collapse is a pure overflow,
            decided alike on every rank (see :mod:`nnabla_mpt.agreement`).

    Attributes:
        overflow_streak: Consecutive skipped steps up to now.
        longest_overflow_streak: The longest such streak so far.
        last_report: The report of the last diagnosis, or None.
    """

    def __init__(self, floor_policy: str, diagnose_after: int, params: Mapping,
                 detector: OverflowDetector, policy,
                 agree_on_diagnosis: Callable[["OverflowReport"], bool]) -> None:
        self.floor_policy = floor_policy
        self.diagnose_after = diagnose_after
        self._params = params
        self._detector = detector
        self._policy = policy
        self._agree = agree_on_diagnosis
        self.overflow_streak = 0
        self.longest_overflow_streak = 0
        self.last_report: Optional[OverflowReport] = None
        # A streak is diagnosed once by its length, and reported (raise/warn) at most once.
        self._streak_diagnosed = self._streak_reported = False

    def count(self, overflow: bool) -> None:
        """Counts a step into the streak (an overflow) or ends the streak."""
        if not overflow:
            self.overflow_streak = 0
            return
        self.overflow_streak += 1
        self.longest_overflow_streak = max(self.longest_overflow_streak, self.overflow_streak)
        if self.overflow_streak == 1:
            self._streak_diagnosed = self._streak_reported = False

    def after_skip(self, index: int, scale: float, next_scale: float, loss,
                   at_floor: bool, loss_nonfinite: bool) -> None:
        """After skipped step ``index`` run with ``scale`` on ``loss``: log it; on a
        collapse, diagnose and act by the floor policy."""
        if logger.isEnabledFor(logging.DEBUG):
            self._log_skip(index, scale, next_scale, loss_nonfinite)
        if self.floor_policy == "ignore" or self._streak_reported:
            return
        if at_floor:
            reason = f"overflow at the minimum loss scale {scale:g}"
        elif self.overflow_streak >= self.diagnose_after and not self._streak_diagnosed:
            reason = f"{self.overflow_streak} consecutive overflowing steps"
        else:
            return
        self._streak_diagnosed = True
        report = diagnosis.diagnose(loss, scale, self._params)
        if loss_nonfinite:
            report.notes.append(
                f"step {index} had a non-finite loss: the updater skipped it without "
                "lowering the loss scale.")
        self.last_report = report
        pure_overflow = self._agree(report)
        if (pure_overflow and isinstance(self._policy, DynamicLossScale)
                and not self._policy.at_min_scale):
            # Pure overflow while the scale can still back off: the policy is doing its
            # job (e.g. an initial scale far too high); the floor will call again if not.
            where = (f"{report.function} in backward" if report.kind == "overflow"
                     else "on another rank's batch")
            logger.info(f"nnabla_mpt: {reason}: the gradients overflow only because of the "
                        f"scale ({where}); it keeps backing off, now {next_scale:g}")
            return
        self._streak_reported = True
        if self.floor_policy == "raise":
            raise LossScaleCollapseError(report, reason)
        logger.warning(f"nnabla_mpt: loss scale collapse ({reason}); training goes on "
                       f"skipping these steps (floor_policy='warn').\n{report}")

    def _log_skip(self, index: int, scale: float, next_scale: float,
                  loss_nonfinite: bool) -> None:
        bad = len(self._detector.nonfinite_params(self._params))
        what = "non-finite" if self._detector.mode == "inf_nan" else "saturated"
        logger.debug(f"nnabla_mpt: step {index} skipped: {bad} of {len(self._params)} "
                     f"parameter gradients {what}; loss scale {scale:g} -> "
                     f"{next_scale:g}" + (" (kept: the loss itself is non-finite)"
                                          if loss_nonfinite else ""))
