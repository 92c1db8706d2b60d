"""What the updaters do about a collapsing loss scale.

A *collapse* is a streak of ``diagnose_after`` overflowing steps, or an overflow at the
scale's floor (``min_scale``). After every skipped step :meth:`CollapseWatch.after_skip`
decides:

1. no collapse, or ``floor_policy="ignore"``, or this streak was already reported: nothing;
2. else replay the batch with :func:`nnabla_mpt.diagnose` (once per streak) and
   keep the report in ``last_report``;
3. a pure overflow (the batch is finite at a smaller scale, on some rank and a data or
   model problem on none) while a dynamic scale can still back off is the policy doing
   its job: one info line, and training goes on;
4. otherwise act by ``floor_policy``: ``"raise"`` :class:`LossScaleCollapseError`,
   ``"warn"`` log the report once and keep skipping.

A *bad batch* (the step's batch held inf/NaN, see :class:`~nnabla_mpt.step.detector.BatchCheck`)
is no overflow: the scale is not at fault, so it neither extends nor ends the streak and
is never diagnosed as a collapse. It is counted apart (``bad_batches``), logged at debug
level, and at warning level on the 1st, 10th, 100th, ... one, so that a data pipeline
feeding nothing but bad batches is not skipped in silence.
"""
import logging
from typing import Callable, List, Mapping, Optional, Set

from nnabla.logger import logger

from ..diagnosis import diagnosis
from ..diagnosis.report import LossScaleCollapseError, OverflowReport
from .decision import Outcome
from .detector import BatchCheck, OverflowDetector
from .overflow_handling import OverflowHandling


class CollapseWatch:
    """The overflow streak of an updater, and the diagnosis of a collapse.

    Args:
        overflow: The updater's :class:`~nnabla_mpt.OverflowHandling`: its
            ``floor_policy`` (``"raise"``, ``"warn"`` or ``"ignore"``) and
            ``diagnose_after`` (consecutive overflowing steps that call for a diagnosis),
            kept as attributes of those names.
        params: The solver's parameters (name -> Variable), named in the reports.
        detector: The overflow detector, for the debug line of a skipped step.
        policy: The loss-scale policy (is it dynamic, at its floor?).
        agree_on_diagnosis: ``report -> bool``: whether the collapse is a pure overflow,
            decided alike on every rank (see :mod:`nnabla_mpt.distributed.agreement`).
        batch: The check of a step's batch, naming its bad inputs in the log.

    Attributes:
        overflow_streak: Consecutive overflowing steps up to now (bad batches aside).
        longest_overflow_streak: The longest such streak so far.
        bad_batches: Steps skipped because their batch held inf/NaN.
        last_report: The report of the last diagnosis, or None.
    """

    def __init__(self, overflow: OverflowHandling, params: Mapping,
                 detector: OverflowDetector, policy,
                 agree_on_diagnosis: Callable[["OverflowReport"], bool],
                 batch: BatchCheck) -> None:
        self.floor_policy = overflow.floor_policy
        self.diagnose_after = overflow.diagnose_after
        self._params = params
        self._detector = detector
        self._policy = policy
        self._agree = agree_on_diagnosis
        self._batch = batch
        self.overflow_streak = 0
        self.longest_overflow_streak = 0
        self.bad_batches = 0
        self._nonfinite_state: Set[str] = set()   # as the last bad batch found it
        self._nonfinite_losses = 0   # steps of the streak whose loss itself is non-finite
        self.last_report: Optional[OverflowReport] = None
        # A streak is diagnosed once by its length, and reported (raise/warn) at most once.
        self._streak_diagnosed = self._streak_reported = False

    def count_skip(self, outcome: Outcome) -> None:
        """Counts a skipped step of ``outcome``: an overflow extends the streak, a bad
        batch is counted apart and leaves it as it is (a good step ends the streak: the
        updater sets ``overflow_streak`` to 0)."""
        if outcome is Outcome.BAD_BATCH:
            self.bad_batches += 1
            return
        self.overflow_streak += 1
        self.longest_overflow_streak = max(self.longest_overflow_streak, self.overflow_streak)
        if self.overflow_streak == 1:
            self._streak_diagnosed = self._streak_reported = False
            self._nonfinite_losses = 0

    def after_skip(self, index: int, scale: float, next_scale: float, loss,
                   at_floor: bool, outcome: Outcome) -> None:
        """After step ``index`` run with ``scale`` on ``loss`` was skipped for ``outcome``:
        log it; on a collapse, diagnose and act by the floor policy. A bad batch is only
        logged."""
        loss_nonfinite = outcome is Outcome.NONFINITE_LOSS
        if outcome is Outcome.BAD_BATCH:
            self._log_bad_batch(index, scale, self._batch.nonfinite(loss))
            self._warn_state(index, self._batch.nonfinite_state(loss))
            return
        if logger.isEnabledFor(logging.DEBUG):      # counting reads every gradient
            self._log_skip(index, scale, next_scale, loss_nonfinite)
        self._nonfinite_losses += bool(loss_nonfinite)
        if self.floor_policy == "ignore" or self._streak_reported:
            return
        loss_at_fault = self._nonfinite_losses == self.overflow_streak
        reason = self._collapse_reason(scale, at_floor, loss_at_fault)
        if reason is None:
            return
        self._streak_diagnosed = True
        report = diagnosis.diagnose(loss, scale, self._params)
        if loss_nonfinite:
            report.notes.append(
                f"step {index} had a non-finite loss: the updater skipped it without "
                "lowering the loss scale.")
        self.last_report = report
        pure_overflow = self._agree(report)
        if pure_overflow and self._policy.kind == "dynamic" and not self._policy.at_min_scale:
            # Pure overflow while the scale can still back off: the policy is doing its
            # job (e.g. an initial scale far too high); the floor will call again if not.
            where = (f"{report.function} in backward" if report.kind == "overflow"
                     else "on another rank's batch")
            logger.info(f"nnabla_mpt: {reason}: the gradients overflow only because of the "
                        f"scale ({where}); it keeps backing off, now {next_scale:g}")
            return
        self._streak_reported = True
        if self.floor_policy == "raise":
            raise LossScaleCollapseError(report, reason, loss_at_fault=loss_at_fault and
                                         not at_floor)
        logger.warning(self._headline(reason, scale, loss_at_fault and not at_floor)
                       + f"; training goes on skipping these steps (floor_policy='warn')."
                       f"\n{report}")

    def _collapse_reason(self, scale: float, at_floor: bool,
                         loss_at_fault: bool) -> Optional[str]:
        """Why the streak is a collapse to diagnose, or None: an overflow at the floor, or
        ``diagnose_after`` overflowing steps (of a non-finite loss: ``loss_at_fault``) not
        diagnosed yet."""
        if at_floor:
            return f"overflow at the minimum loss scale {scale:g}"
        if self.overflow_streak < self.diagnose_after or self._streak_diagnosed:
            return None
        if loss_at_fault:
            return f"{self.overflow_streak} consecutive steps whose loss itself is non-finite"
        return f"{self.overflow_streak} consecutive overflowing steps"

    @staticmethod
    def _headline(reason: str, scale: float, loss_at_fault: bool) -> str:
        """The first words of a reported streak: a collapse of the scale, or a loss that
        is non-finite whatever the scale (the scale is kept: no smaller one can help)."""
        if not loss_at_fault:
            return f"nnabla_mpt: loss scale collapse ({reason})"
        return (f"nnabla_mpt: the loss is non-finite ({reason}): the forward pass produced "
                f"inf/NaN before any loss scaling, so a smaller scale cannot help and the "
                f"scale stays at {scale:g}")

    def _log_skip(self, index: int, scale: float, next_scale: float,
                  loss_nonfinite: bool) -> None:
        bad = len(self._detector.nonfinite_params(self._params))
        what = "non-finite" if self._detector.mode == "inf_nan" else "saturated"
        elsewhere = "" if bad else " here (another rank's, or the gradient norm is not finite)"
        logger.debug(f"nnabla_mpt: step {index} skipped: {bad} of {len(self._params)} "
                     f"parameter gradients {what}{elsewhere}; loss scale {scale:g} -> "
                     f"{next_scale:g}" + (" (kept: the loss itself is non-finite)"
                                          if loss_nonfinite else ""))

    def _log_bad_batch(self, index: int, scale: float, inputs: List[str]) -> None:
        what = (f"{', '.join(inputs)} {'holds' if len(inputs) == 1 else 'hold'} inf/NaN"
                if inputs else "an input of another rank holds inf/NaN")
        logger.debug(f"nnabla_mpt: step {index} skipped: a bad batch ({what}); loss scale "
                     f"{scale:g} kept")
        n = self.bad_batches
        if n == 10 ** (len(str(n)) - 1):        # the 1st, 10th, 100th, ...
            logger.warning(
                f"nnabla_mpt: {n} bad batch{'es' if n > 1 else ''} so far: step {index} read "
                f"an input holding inf/NaN ({what}); such steps are skipped without "
                f"lowering the loss scale and are no overflows (updater.bad_batches counts "
                f"them). Check the batches with numpy.isfinite before feeding them.")


    def _warn_state(self, index: int, names: List[str]) -> None:
        """Warns when a bad batch left some of the model's state (running statistics)
        non-finite that was not so at the last warning."""
        new = sorted(set(names) - self._nonfinite_state)
        self._nonfinite_state = set(names)
        if new:
            logger.warning(
                f"nnabla_mpt: the bad batch of step {index} left {', '.join(new)} holding "
                f"inf/NaN: the forward pass updates running statistics (BatchNormalization "
                f"in training mode) before any check can see the batch, and evaluation "
                f"or any graph run with batch_stat=False would use them. Restore them from a "
                f"checkpoint (load_checkpoint) or re-estimate them on clean batches, and "
                f"check the batches with numpy.isfinite before feeding them.")


# -- what an updater shows of its collapse handling (listed by name in its class) ---------

overflow_streak = property(lambda updater: updater._collapse.overflow_streak, doc=(
    "Consecutive overflowing steps up to now (a bad batch neither extends nor ends the "
    "streak)."))
longest_overflow_streak = property(
    lambda updater: updater._collapse.longest_overflow_streak,
    doc="The longest streak of overflowing steps so far.")
bad_batches = property(lambda updater: updater._collapse.bad_batches, doc=(
    "Steps skipped because their batch held inf/NaN (``StepResult.bad_batch``): no "
    "overflow, the scale was kept."))
last_report = property(lambda updater: updater._collapse.last_report, doc=(
    "The :class:`~nnabla_mpt.OverflowReport` of the last diagnosis, or None."))
