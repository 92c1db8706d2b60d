"""The step's decision, "skip or update", of a single process: its own gradients' check.

With a communicator the ranks decide together instead
(:class:`~nnabla_mpt.distributed.agreement.StepAgreement`), with the same interface and
the same :class:`Outcome`.
"""
import enum
import math
from typing import Callable, List, Optional

import nnabla as nn

from .detector import BatchCheck
from .step_loss import StepLosses


class Outcome(enum.Enum):
    """What one step came to, the step's one decision: updated, or skipped and why."""

    #: The gradients were finite (or not checked): the step updated the parameters.
    UPDATED = "updated"
    #: The reduced gradients overflowed: the scale was too large, and backs off.
    OVERFLOW = "overflow"
    #: Some micro-batch's loss (on some rank) was itself non-finite: no smaller scale
    #: helps, and the scale stays.
    NONFINITE_LOSS = "non-finite loss"
    #: Some rank's batch held inf/NaN (:class:`~nnabla_mpt.step.detector.BatchCheck`): no
    #: smaller scale helps, and the scale stays.
    BAD_BATCH = "bad batch"
    #: The clipping norm was not finite though the step was not checked
    #: (``enable_overflow_check=False``): an overflow all the same, the scale backs off.
    NONFINITE_NORM = "non-finite clipping norm"

    @property
    def skipped(self) -> bool:
        """Whether the step left the parameters and the solver's state as they were."""
        return self is not Outcome.UPDATED

    @property
    def scale_at_fault(self) -> bool:
        """Whether the scale had a part in it, so the policy hears of the step: not for a
        non-finite loss or a bad batch."""
        return self not in (Outcome.NONFINITE_LOSS, Outcome.BAD_BATCH)


def skipped_for(loss_nonfinite: bool, bad_batch: bool) -> Outcome:
    """The outcome of a step whose gradients overflowed: a bad batch first, then a
    non-finite loss, else an overflow."""
    if bad_batch:
        return Outcome.BAD_BATCH
    return Outcome.NONFINITE_LOSS if loss_nonfinite else Outcome.OVERFLOW


class LocalDecision:
    """The decision of a single process: its own gradients' check.

    Args:
        check: The overflow check of the solver's gradients, or None when checking is
            off (the decision is to update; a clipping norm that is not finite still
            skips the step, see :class:`~nnabla_mpt.step.unscale.Unscaler`); kept as the
            attribute ``check``.
        batch: The check of a skipped step's batch (:class:`~nnabla_mpt.step.detector.BatchCheck`).
    """

    #: No reduction runs inside the backward pass (see
    #: :class:`~nnabla_mpt.distributed.agreement.StepAgreement`).
    in_backward = None
    #: No all-reduce (see :class:`~nnabla_mpt.distributed.agreement.StepAgreement`).
    reduction = None

    def __init__(self, check: Optional[Callable[[], bool]], batch: BatchCheck) -> None:
        self.check = check
        self._batch = batch

    def decide(self, loss: "nn.Variable", losses: StepLosses, step: int) -> Outcome:
        """Checks the step's gradients; on overflow only, reads the step's ``losses`` and
        its batch."""
        if self.check is None or not self.check():
            return Outcome.UPDATED
        return skipped_for(not math.isfinite(losses.total()), bool(self._batch.nonfinite(loss)))

    def agree_on_diagnosis(self, report) -> bool:
        """Whether a collapse is a pure overflow: the report says so."""
        return report.kind == "overflow"

    def gather(self, *values: float) -> List[List[float]]:
        """Each of ``values`` of every rank: this one's."""
        return [[value] for value in values]
