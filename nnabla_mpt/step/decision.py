"""What one step comes to: its decision, "skip or update" (:class:`Outcome`), made by a
single process from its own gradients' check (:class:`LocalDecision`), and what the step
reports (:class:`StepResult`, the value every step returns and every step hook,
``monitor=``, receives).

With a communicator the ranks decide together instead
(:class:`~nnabla_mpt.distributed.agreement.StepAgreement`), with the same interface and
the same :class:`Outcome`.
"""
import enum
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import nnabla as nn

from ..scale.gradient_stats import GradientStats
from .detector import BatchCheck
from .micro_batch import StepLosses


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


@dataclass(frozen=True, init=False)
class StepResult:
    """What one call of ``update()`` did.

    Attributes:
        step: Index of the (last) step this call ran, counted from 0 over the updater's life.
        skipped: True when nothing was updated: the gradients overflowed (or the batch
            held inf/NaN, see ``bad_batch``). The gradients decide: a loss that is inf/NaN
            while the gradients are finite does not skip the step.
        scale: The loss scale the step ran with, the policy's. The backward pass's seed
            holds it rounded to the loss's dtype (3000.7 is 3000.0 in float16,
            :func:`~nnabla_mpt.core.dtypes.held_scale`), and the gradients are divided by
            that held value.
        next_scale: The loss scale of the next step.
        attempts: Steps this call ran: 1, or more in retry mode.
        precision: ``"half"`` or ``"float"``: the precision of the graph the step ran.
        gradient_stats: On the steps ``gradient_stats_every`` asks for, each parameter's
            name mapped to its gradient's :class:`~nnabla_mpt.GradientStats` as the
            backward pass produced them (scaled, in the graph's dtype, before any
            all-reduce); None on other steps.
        bad_batch: True when the step was skipped because its batch (on some rank) held
            inf/NaN: no overflow, the scale is kept (see ``updater.bad_batches``).
        held_by: What held the scale at a growth point of measured growth: ``"gradients"``
            (no room), ``"ceiling"`` (the largest power of two the loss's dtype holds, which
            a loss built in float32 lifts: :doc:`measured`), ``"max_scale"``; else None.
        skipped_steps: The updater's ``skipped_steps`` after this step: the run's skipped
            steps so far (a resumed run's included); None in a result made by hand.
    """
    step: int
    skipped: bool
    scale: float
    next_scale: float
    attempts: int
    precision: str
    gradient_stats: Optional[Dict[str, GradientStats]]
    bad_batch: bool
    held_by: Optional[str]
    skipped_steps: Optional[int]
    _losses: Optional[StepLosses] = field(repr=False, compare=False)

    def __init__(self, step: int, skipped: bool, scale: float, next_scale: float,
                 attempts: int = 1, precision: str = "float",
                 gradient_stats: Optional[Dict[str, GradientStats]] = None,
                 bad_batch: bool = False, held_by: Optional[str] = None,
                 skipped_steps: Optional[int] = None,
                 _losses: Optional[StepLosses] = None) -> None:
        # frozen: all set here, at once (a generated __init__ costs ~60 bytecodes a step)
        vars(self).update(step=step, skipped=skipped, scale=scale, next_scale=next_scale,
                          attempts=attempts, precision=precision,
                          gradient_stats=gradient_stats, bad_batch=bad_batch,
                          held_by=held_by, skipped_steps=skipped_steps, _losses=_losses)

    @property
    def updated(self) -> bool:
        """True when the solver updated the parameters."""
        return not self.skipped

    @property
    def loss(self) -> float:
        """The step's loss, before scaling: the mean over its micro-batches (and over the
        ranks, with a communicator; summed in float32 there), where ``loss.d`` holds only
        the last micro-batch's; inf/NaN where a forward pass overflowed, also on a step
        that updated (its gradients were finite). Read when first asked for (a host read,
        which training does not pay for otherwise); until the next ``update()`` the last
        micro-batch's value is the loss Variable's own array, so read it before running a
        forward pass of that Variable yourself. NaN in a result built by hand."""
        return math.nan if self._losses is None else self._losses.mean()
