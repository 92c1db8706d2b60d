"""Measured loss scaling: the scale chosen from the gradients instead of guessed.

Every measurement comes from a watched backward pass (:class:`~nnabla_mpt.watch.RangeWatch`),
which finds how far the pass's gradients could be multiplied before one of them leaves
its dtype::

    R = min over every gradient g of the pass (and the parameters' gradients)
            of  dtype_max(g) / max |g|

* **Ceiling.** ``loss.backward(scale)`` seeds the pass with the scale in the loss's dtype,
  so no scale above the largest power of two that dtype holds can work (``2**15`` for
  float16, ``2**127`` for float32): the updaters' upper bound is
  ``min(max_scale, ceiling)``.
* **Calibrated start** (``scale="auto"``). On the first step's own batch the backward runs
  at a probe scale ``p`` (1; ``2**8`` times higher while every gradient is zero, up to the
  ceiling), and the first scale is::

      s0 = the largest power of two  <=  p * R / MARGIN,   within [min_scale, upper bound]

* **Measured growth** (``growth_mode="measured"``). On the step where growth is due, ``R``
  is measured at the step's own scale ``s`` and the scale becomes ``s * f**k`` for the
  largest ``k >= 0`` with ``f**k <= R / MARGIN`` (within the upper bound; ``k = 0`` holds
  the scale): a growth certain to overflow is never tried, and after a spike the scale
  comes back in one move.

With a communicator every rank takes the smallest ``R`` (the smallest start) over the
ranks: the largest gradient decides, and the ranks stay identical.

``MARGIN = 2**3``: the measurement sees one batch, and the next batches' gradients differ.
A margin of 8 lets the largest gradient of a later batch be 8 times that of the measured
one before it overflows (on the digits model the largest gradient varies within a factor
of about 2 to 4 between batches at a fixed scale); the cost is 3 bits at the bottom, where
the smallest gradients underflow, which the gradient statistics show.
"""
import math
from typing import Any, Callable, Dict, List, Mapping, Optional

from nnabla.logger import logger

from . import graph
from .gradient_stats import GradientStats, gradient_stats
from .watch import RangeWatch

#: The safety factor between a measured gradient and its dtype's largest value.
MARGIN = 2.0 ** 3

#: How much higher each probe of ``scale="auto"`` goes while every gradient is zero.
PROBE_STEP = 2.0 ** 8


def calibrated_scale(probe: float, room: float, lower: float, upper: float) -> float:
    """The start of ``scale="auto"``: the largest power of two ``<= probe * room / MARGIN``,
    within ``[lower, upper]`` (``room`` as :meth:`RangeWatch.room` measures it)."""
    target = probe * room / MARGIN
    if not target > 0.0:
        return lower
    if math.isinf(target):
        return upper
    return min(max(2.0 ** math.floor(math.log2(target)), lower), upper)


class ScaleMeter:
    """What the updater measures about its scale, and when.

    Args:
        loss: The loss the scale applies to (the reduced-precision one).
        params: The solver's parameters (name -> Variable).
        policy: The loss-scale policy.
        gather: ``value -> the value of every rank`` (one small all-reduce with a
            communicator; ``[value]`` without).
        stats_every: Steps between gradient statistics (every ``K``-th step), or None.
        calibrate: Whether the first step calibrates the scale (``scale="auto"``).
    """

    def __init__(self, loss: Any, params: Mapping[str, Any], policy: Any,
                 gather: Callable[[float], List[float]], stats_every: Optional[int],
                 calibrate: bool) -> None:
        self._loss = loss
        self._params = params
        self._policy = policy
        self._gather = gather
        self._stats_every = stats_every
        self._ctx = graph.float_context(loss)
        self.calibration_pending = calibrate

    def growth_watch(self) -> Optional[RangeWatch]:
        """A watch for the step's backward passes when a measured growth is due."""
        if getattr(self._policy, "growth_mode", None) == "measured" and self._policy.growth_due:
            return RangeWatch(self._loss, self._ctx)
        return None

    def growth_room(self, watch: RangeWatch) -> float:
        """How far the scale may grow after the watched step: ``R / MARGIN``, with ``R``
        over the watched passes and the parameters' (reduced) gradients, smallest over the
        ranks."""
        room, _ = watch.add([v.grad for v in self._params.values()]).room()
        return min(self._gather(room)) / MARGIN

    def statistics(self, index: int) -> Optional[Dict[str, GradientStats]]:
        """The gradient statistics of step ``index``, on every ``stats_every``-th step."""
        if self._stats_every is None or (index + 1) % self._stats_every:
            return None
        return gradient_stats(self._params, self._ctx)

    def calibrate(self, data_feeder: Optional[Callable[[], Any]],
                  zero_grads: Callable[[], None]) -> float:
        """``scale="auto"``: feeds the first batch, runs its forward pass keeping the
        buffers, and sets the policy's scale from watched probe backward passes on it
        (with a communicator, the smallest start over the ranks); the gradients are zero
        again on return, the forward pass's buffers kept for the step's own backward."""
        if data_feeder is not None:
            data_feeder()
        self._loss.forward(clear_no_need_grad=False)
        lower, upper = self._policy.min_scale, self._policy.max_scale
        probe = min(1.0, upper)
        while True:
            zero_grads()
            watch = RangeWatch(self._loss, self._ctx).run(self._loss, probe)
            room, largest = watch.add([v.grad for v in self._params.values()]).room()
            if largest > 0.0 or probe >= upper:
                break
            probe = min(probe * PROBE_STEP, upper)   # every gradient underflowed: look higher
        zero_grads()
        starts = self._gather(calibrated_scale(probe, room, lower, upper))
        scale = min(starts)
        self._policy.set_loss_scale(scale)
        self.calibration_pending = False
        ranks = f", the smallest start over {len(starts)} ranks" if len(starts) > 1 else ""
        logger.info(f"nnabla_mpt: scale='auto' starts at {scale:g}{ranks}: at scale {probe:g} "
                    f"the largest gradient is {largest:.4g}, and {scale:g} keeps every "
                    f"gradient {MARGIN:g} times below its dtype's largest value "
                    f"(bounds [{lower:g}, {upper:g}])")
        return scale
