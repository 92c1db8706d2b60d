"""What one ``update()`` did: :class:`StepResult`, the value every step returns and every
step hook (``monitor=``) receives."""
import math
from dataclasses import dataclass, field
from typing import Dict, Optional

from ..scale.gradient_stats import GradientStats
from .step_loss import StepLosses

__all__ = ["StepResult"]


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
