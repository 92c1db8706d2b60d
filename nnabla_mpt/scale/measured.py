"""Measured loss scaling: the scale chosen from the gradients instead of guessed.

Every measurement comes from a watched backward pass
(:class:`~nnabla_mpt.diagnosis.watch.RangeWatch`) run at some scale ``s``, whose seed holds
``h``, the scale rounded to the loss's dtype (:func:`~nnabla_mpt.core.dtypes.held_scale`;
``h = s`` where the dtype holds ``s``), which finds how far the pass's gradients could be
multiplied before one of them leaves its dtype::

    R = min over every gradient g of the pass and the parameters' gradients of
            dtype_max(g) / (b(g) * h)        where g has a bound b(g), in units of h
            dtype_max(g) / (MARGIN * max|g|)  for the others

A gradient has a bound when it is the seed (the scale) passed down through functions
that cannot enlarge it (:data:`~nnabla_mpt.diagnosis.watch.NON_EXPANDING`: the loss's reductions,
a cross-entropy, ReLU, tanh, ...): whatever the data, it stays within ``b(g) * h``, so it
only has to fit. Every other gradient, and the parameters', depends on the data in ways
one batch cannot bound, and keeps ``MARGIN`` to its dtype's largest value.

* **Ceiling.** ``loss.backward(scale)`` seeds the pass with the scale in the loss's dtype,
  so no scale above the largest power of two that dtype holds can work (``2**15`` for
  float16, ``2**127`` for float32): the updaters' upper bound is
  ``min(max_scale, ceiling)``.
* **Calibrated start** (``scale="auto"``). On the first step's own batch the backward runs
  at a probe scale ``p`` (1; ``2**8`` times higher while every gradient is zero, up to the
  ceiling), whose seed holds ``h``, and the first scale is::

      s0 = the largest power of two  <=  h * R,   within [min_scale, upper bound]

  A batch no scale can measure sets no scale: one whose loss is not finite (the loss is
  computed before any scaling), or whose gradients are not finite at the probe and still
  not at the dtype's smallest normal value (an input beyond the dtype's range or holding
  inf/NaN, a corrupted parameter: no scale makes them finite). The scale stays where it
  is, the calibration stays pending, and the next step measures its own batch; with a
  communicator, one such rank makes every rank wait for the next batch. Gradients finite
  at that small scale but not at the probe are an overflow: the start is ``min_scale``.

* **Measured growth** (``growth_mode="measured"``). On the step where growth is due (and,
  for the history, every ``WATCH_EVERY``-th step and every step while it holds fewer than
  ``MIN_SAMPLES`` passes), the backward pass is watched at the
  step's own scale ``s``; if the step is good, its *reach*
  (the scale at which its largest unbounded gradient would reach its dtype's largest
  value, ``s * dtype_max / max|g|``) joins a short history
  (:class:`~nnabla_mpt.scale.scale_history.ScaleHistory`), and::

      R = min(cap, history.supported(reach)) / s    cap: the scale the bounded ones fit
      the scale becomes s * f**k for the largest k >= 0 with f**k <= R

  (within the upper bound; ``k = 0`` holds the scale): a growth certain to overflow is
  never tried, and after a back-off the first growth point moves straight back to what
  the history supports. A skipped step (overflow, bad batch) records nothing.

With a communicator every rank takes the smallest cap and reach (the smallest start) over
the ranks: the largest gradient decides, every rank records the same reach, and the ranks
stay identical.

The margin of one batch, ``MARGIN = 2**3`` (``scale="auto"``, and measured growth while
the history holds fewer than ``MIN_SAMPLES`` passes; with more, the history's spread sets
it, :mod:`~nnabla_mpt.scale.scale_history`): the measurement sees one batch, and the next
batches' gradients differ. A gradient with no bound (a parameter's gradient, summed over the
batch; an activation's gradient, amplified by the weights above it) must stay 8 times
below its dtype's largest value: a later batch's may be 8 times the measured one's. The
gradients the loss's reductions and a cross-entropy hand down are bounded by the scale
itself (the inputs of a summed loss are the scale), so asking the margin of them would
keep a summed loss 3 powers of two below the ceiling for no reason. The cost of the
margin is at most 3 bits at the bottom, where the smallest gradients underflow; the
gradient statistics show whether that matters.
"""
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
from nnabla.logger import logger

from ..core import graph
from ..core.dtypes import float_type, held_scale
from ..diagnosis.watch import RangeWatch
from .gradient_stats import GradientStats, gradient_stats
from .scale_history import MARGIN, MIN_SAMPLES, WATCH_EVERY, GrowthLimit, ScaleHistory

#: How much higher each probe of ``scale="auto"`` goes while every gradient is zero.
PROBE_STEP = 2.0 ** 8


def reaches(watch: RangeWatch, scale: float) -> Tuple[float, float, float]:
    """``(cap, reach, largest)`` of a watched pass run at ``scale``: the largest scale the
    gradients with a bound fit (``min dtype_max(g) / b(g)``), the scale at which the
    largest gradient without one would reach its dtype's largest value
    (``min s * dtype_max(g) / max|g|``), each ``inf`` when there is none or every such
    gradient is zero, both 0 when a gradient is not finite; and the largest ``max |g|``
    seen (0 if none)."""
    maxima, limits, bounds = watch.read()
    if not np.isfinite(maxima).all():
        return 0.0, 0.0, math.inf
    bounded = np.isfinite(bounds)
    with np.errstate(divide="ignore"):
        caps, free = limits[bounded] / bounds[bounded], limits[~bounded] / maxima[~bounded]
    cap = float(caps.min()) if caps.size else math.inf
    reach = float(free.min()) * scale if free.size else math.inf
    return cap, reach, float(maxima.max()) if maxima.size else 0.0


def room(watch: RangeWatch, scale: float) -> Tuple[float, float]:
    """``(R, largest)`` of a watched pass run at ``scale``: how far the scale may be
    multiplied with the margin of one batch (see the module's docstring; ``inf`` when
    every gradient is zero, 0 when one is not finite), and the largest ``max |g|`` seen
    (0 if none)."""
    cap, reach, largest = reaches(watch, scale)
    return min(cap, reach / MARGIN) / scale, largest


def calibrated_scale(target: float, lower: float, upper: float) -> float:
    """The start of ``scale="auto"``: the largest power of two ``<= target``, within
    ``[lower, upper]`` (``target``, the largest scale the measured room allows: the value
    the probe's seed held times the room :func:`room` measured there)."""
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
        decider: The step's decider (:class:`~nnabla_mpt.step.decision.LocalDecision` or
            :class:`~nnabla_mpt.distributed.agreement.StepAgreement`): its ``gather``,
            ``(*values) -> for each value, the value of every rank`` (one small
            all-reduce with a communicator; ``[[value], ...]`` without), and its
            ``reduction``, whose ``dtype_after(dtype)`` is the dtype the step's all-reduce
            leaves gradients of a dtype in (that of the communicator's reduction for
            nnabla's, the gradients' own for :class:`~nnabla_mpt.MPICommunicator`), or None
            where no all-reduce follows the backward pass.
        stats_every: Steps between gradient statistics (every ``K``-th step), or None.
        scaling: The updater's scale arguments: its ``scale`` (``"auto"``: the first step
            calibrates the scale; kept as ``auto_scale``) and its ``max_scale``, the upper
            bound the user asked for, or None
            (:class:`~nnabla_mpt.scale.scale_history.GrowthLimit`).

    The parameters' gradients are bounded by the dtype they can overflow in, not by the
    dtype their arrays hold when read (a solver or a float communicator may have cast
    them to float32 by then), nor by the loss's (a float16 network under a loss built in
    float32 computes float16 gradients: :func:`~nnabla_mpt.core.graph.gradient_dtypes`):
    each rank's own by the dtype the backward pass computes it in, before the reduce (the
    smallest room over the ranks wins); the reduced ones by what ``reduced_dtype`` says of
    that dtype. So a float32 reduction of float16 gradients does not make room
    that the next backward pass does not have, and a float32 sum over the ranks is not
    bounded as if it summed in float16.
    """

    def __init__(self, loss: Any, params: Mapping[str, Any], policy: Any, decider: Any,
                 stats_every: Optional[int], scaling: Any) -> None:
        self._loss = loss
        self._params = params
        self._policy = policy
        self._gather = decider.gather
        self.stats_every = stats_every
        self._ctx = graph.float_context(loss)
        self._dtype = graph.loss_dtype(loss)
        self._tiny = graph.float_type_of(loss).tiny
        computed = graph.gradient_dtypes(loss, params)
        own = {name: computed.get(name, self._dtype) for name in params}
        self._own = _by_bound(params, own)
        self._reduced = None if decider.reduction is None else _by_bound(
            params, {name: decider.reduction.dtype_after(dtype) for name, dtype in own.items()})
        self.limit = GrowthLimit(policy, graph.float_type_of(loss), scaling.max_scale)
        self.auto_scale = scaling.scale == "auto"
        self.calibration_pending = self.auto_scale
        self.history = ScaleHistory()

    def growth_watch(self, index: int) -> Optional[RangeWatch]:
        """A watch for the backward passes of step ``index`` in ``"measured"`` mode: where
        growth is due, and for the history every
        :data:`~nnabla_mpt.scale.scale_history.WATCH_EVERY`-th step and every step while it
        holds fewer than :data:`~nnabla_mpt.scale.scale_history.MIN_SAMPLES` passes."""
        if (self._policy.growth_due or (index + 1) % WATCH_EVERY == 0
                or len(self.history) < MIN_SAMPLES):
            return RangeWatch(self._loss, self._ctx)
        return None

    def watch_own(self, watch: RangeWatch) -> None:
        """Adds the parameters' gradients as the backward passes left them (before the
        reduce) to ``watch``, each bounded by the dtype the backward computes it in."""
        for limit, params in self._own:
            watch.add([v.grad for v in params], limit)

    def growth_room(self, watch: RangeWatch, held: float) -> Tuple[float, float, float]:
        """What the step watched with a seed holding ``held`` (its scale as the loss's
        dtype holds it, :attr:`~nnabla_mpt.step.micro_batch.BackwardSeed.held`: what the gradients
        carry) measured, before the step is decided: ``(cap, reach, held)``
        (:func:`reaches`) over the watched passes, each rank's own gradients
        (:meth:`watch_own`) and the reduced ones, each the smallest over the ranks.
        :meth:`settled` turns it into the growth's room once the step is decided."""
        for limit, params in self._reduced or ():
            watch.add([v.grad for v in params], limit)
        cap, reach, _ = reaches(watch, held)
        every_cap, every_reach = self._gather(cap, reach)
        return min(every_cap), min(every_reach), held

    def settled(self, measured: Optional[Tuple[float, float, float]],
                skipped: bool) -> Tuple[Optional[float], Optional[float]]:
        """``(R, G)``: the room ``R`` for the policy (which uses it where growth is due),
        and ``G``, the part of it the gradients' reach supports (the history's margin
        kept, the data-independent bounds of the seed's dtype left out). Both None where
        nothing was measured or the step was skipped (which records nothing); else the
        step's reach joins the history and ``R`` is what the history and the bounded
        gradients support over the step's scale (0, hold, when a gradient was not
        finite)."""
        if measured is None or skipped:
            return None, None
        cap, reach, scale = measured
        if reach == 0.0:
            return 0.0, 0.0
        self.history.record(reach)
        supported = self.history.supported(reach)
        return min(cap, supported) / scale, supported / scale

    def state_dict(self) -> Dict[str, Any]:
        """``calibration_pending`` and ``scale_history`` (the reaches), for the updater's
        state."""
        return {"calibration_pending": self.calibration_pending,
                "scale_history": self.history.state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned (``state`` as
        :func:`~nnabla_mpt.updater_state.check_all` returns it: checked, holds more)."""
        self.calibration_pending = state["calibration_pending"]
        self.history.load(state["scale_history"])

    def statistics(self, index: int) -> Optional[Dict[str, GradientStats]]:
        """The gradient statistics of step ``index``, on every ``stats_every``-th step."""
        if self.stats_every is None or (index + 1) % self.stats_every:
            return None
        return gradient_stats(self._params, self._ctx)

    def calibrate(self, data_feeder: Optional[Callable[[], Any]],
                  forward: Callable[[], None], zero_grads: Callable[[], None]
                  ) -> Optional[float]:
        """``scale="auto"``: feeds the first batch, runs its forward pass keeping the
        buffers (``forward``), and measures the start from watched probe backward passes
        on it (with a communicator, the smallest start over the ranks); the gradients are
        zero again on return, the forward pass's buffers kept for the step's own backward.
        Returns the start, which the updater gives its policy.

        A batch no scale can measure (its loss is not finite, or its gradients are not
        finite at the probe nor at the dtype's smallest normal value), on any rank, gives
        no start (None): the policy's scale is kept, ``calibration_pending`` stays True and
        the next call measures the next batch; an info line says why."""
        if data_feeder is not None:
            data_feeder()
        forward()
        lower, upper = self._policy.min_scale, self._policy.max_scale
        probe, measured, largest = min(1.0, upper), 0.0, math.nan
        why = self._loss_not_finite()
        if not why:
            probe, measured, largest = self._probe(probe, upper, zero_grads)
            lowest = min(lower, self._tiny)
            if math.isinf(largest) and math.isinf(self._probe(lowest, lowest, zero_grads)[2]):
                why = (f"its gradients are not finite at scale {probe:g} nor at {lowest:g}, "
                       f"so at no scale (an input beyond the dtype's range or holding "
                       f"inf/NaN, or a parameter that does)")
        target = held_scale(probe, self._dtype) * measured
        starts, = self._gather(math.nan if why else calibrated_scale(target, lower, upper))
        if any(math.isnan(start) for start in starts):
            scale = self._policy.loss_scale
            logger.info(f"nnabla_mpt: scale='auto' measures nothing on this step's batch: "
                        f"{why or 'the batch of another rank cannot be measured'}; the scale "
                        f"stays {scale:g} and the next step measures its own batch")
            return None
        scale = min(starts)
        self.calibration_pending = False
        self._log_start(scale, len(starts), probe, target, largest)
        return scale

    def _log_start(self, scale: float, ranks: int, probe: float, target: float,
                   largest: float) -> None:
        """The info line of a calibrated start ``scale`` (the smallest over ``ranks``): the
        largest gradient at ``probe`` and why that start (``target``: the largest scale the
        room there allows, :func:`calibrated_scale`)."""
        lower, upper = self._policy.min_scale, self._policy.max_scale
        over = f", the smallest start over {ranks} ranks" if ranks > 1 else ""
        keeps = (f"every gradient {MARGIN:g} times below its dtype's largest value")
        why = (f"{scale:g} is the largest power of two within [{lower:g}, {upper:g}] that "
               f"keeps {keeps}" if target >= lower else
               f"no scale within [{lower:g}, {upper:g}] keeps {keeps}, so it starts at the "
               f"lower bound")
        logger.info(f"nnabla_mpt: scale='auto' starts at {scale:g}{over}. Measured on this "
                    f"step's batch: the largest gradient is {largest:.4g} at scale "
                    f"{probe:g}; {why}")

    def _probe(self, probe: float, upper: float,
               zero_grads: Callable[[], None]) -> Tuple[float, float, float]:
        """``(probe, R, largest)`` of watched backward passes from ``probe`` up, ``2**8``
        times higher while every gradient is zero, up to ``upper``; the gradients are zero
        again on return."""
        while True:
            zero_grads()
            watch = RangeWatch(self._loss, self._ctx).run(self._loss, probe)
            self.watch_own(watch)
            measured, largest = room(watch, held_scale(probe, self._dtype))  # seeded value
            if largest > 0.0 or probe >= upper:
                break
            probe = min(probe * PROBE_STEP, upper)   # every gradient underflowed: look higher
        zero_grads()
        return probe, measured, largest

    def _loss_not_finite(self) -> str:
        """Why no scale can make the batch in the graph finite when its loss (computed
        before any scaling) is not, or ``""``."""
        value = np.asarray(self._loss.d, dtype=np.float64)
        bad = value[~np.isfinite(value)]
        return f"its loss is not finite ({bad[0]:g})" if bad.size else ""


def _by_bound(params: Mapping[str, Any], dtypes: Mapping[str, str]) -> List[Tuple[float, list]]:
    """The parameters of ``params`` grouped by the largest value of their gradient's dtype
    in ``dtypes`` (name -> dtype): ``[(limit, [parameter, ...]), ...]``."""
    groups: Dict[float, list] = {}
    for name, v in params.items():
        groups.setdefault(float_type(dtypes[name]).max, []).append(v)
    return sorted(groups.items(), key=lambda group: group[0])
