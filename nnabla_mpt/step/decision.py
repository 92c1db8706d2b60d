"""The step's decision, "skip or update", of a single process: its own gradients' check.

With a communicator the ranks decide together instead
(:class:`~nnabla_mpt.distributed.agreement.StepAgreement`), with the same interface and
the same :data:`Decision`.
"""
import math
from typing import Callable, List, Optional, Tuple

import nnabla as nn

from .detector import BatchCheck
from .step_loss import StepLosses

#: What the check of one step found, ``(overflow, loss_nonfinite, bad_batch)``: skip the
#: step (the reduced gradients overflowed); on a skipped step, whether some micro-batch's
#: loss (on some rank) was itself non-finite, and whether some rank's batch held inf/NaN
#: (:class:`~nnabla_mpt.step.detector.BatchCheck`): either way a smaller scale cannot help and
#: the scale is kept.
Decision = Tuple[bool, bool, bool]


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

    def decide(self, loss: "nn.Variable", losses: StepLosses, step: int) -> Decision:
        """Checks the step's gradients; on overflow only, reads the step's ``losses``."""
        if self.check is None or not self.check():
            return False, False, False
        return True, not math.isfinite(losses.total()), bool(self._batch.nonfinite(loss))

    def agree_on_diagnosis(self, report) -> bool:
        """Whether a collapse is a pure overflow: the report says so."""
        return report.kind == "overflow"

    def gather(self, *values: float) -> List[List[float]]:
        """Each of ``values`` of every rank: this one's."""
        return [[value] for value in values]
