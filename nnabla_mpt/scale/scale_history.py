"""The history of measured growth: what the watched backward passes saw, the scale it
supports, and what held each growth point (:class:`GrowthLimit`).

Each watched pass of ``growth_mode="measured"`` (on a good step where growth is due, on
every :data:`WATCH_EVERY`-th good step, and on every good step while the history holds
fewer than :data:`MIN_SAMPLES`) gives one *reach*: the scale at which its
largest gradient without a bound (a parameter's, an activation's; see
:mod:`nnabla_mpt.scale.measured`) would reach its dtype's largest value. A reach is relative to
the scale the pass ran at (``s * dtype_max / max|g|``), so passes run at different scales
compare directly. The history keeps the last :data:`LENGTH`::

    record(reach):      a good step's watched pass, agreed over the ranks (the smallest);
                        skipped steps (overflow, bad batch) record nothing
    margin():           over log2 of the reaches (mean m, standard deviation d, worst
                        w = the smallest):
                            e = SPREADS * d - (m - w)     how far SPREADS deviations below
                                                          the mean reach beyond the worst
                            margin = 2 ** clamp(e, MIN_EXPONENT, 3)
    supported(reach):   fewer than MIN_SAMPLES reaches:   reach / MARGIN    (one batch, as
                                                          it was: no spread seen yet)
                        else:  max(worst / margin(),      what the history supports,
                                   recent / MARGIN)       never below the worst of the
                                                          RECENT newest with one
                                                          batch's margin

A steady stream (every pass alike) keeps the smallest margin, ``2**0.5``; a noisy one a
larger margin, up to 8. The worst of the history already covers the batches it has seen;
the margin covers the next one, by as far as the history's spread says it may fall below
the mean. Where the gradients shrink fast (early in training) the history's worst is its
oldest pass: the floor, the last :data:`RECENT` passes with the margin of one batch, keeps
the scale from lagging below what they allow.

The scale the updater grows to is the largest power of two below both what the history
supports and what the gradients bounded by the scale allow: so after a back-off the first
growth point moves straight back to it, however low the back-off went, and a batch that
overflows, being skipped, never lowers it.

What held a growth point: the gradients, the policy's ``max_scale``, or the seed's
ceiling. ``loss.backward(scale)`` seeds the backward pass in the loss's dtype, so no scale
grows past the largest power of two that dtype holds (``2**15`` in float16), however much
room the gradients leave. With a mean loss in a float16 graph that ceiling, not the
gradients, holds the scale for the whole run. A float16 network whose loss alone is built
in float32 (``F.identity(logits)``, then the loss, under a float context) seeds in float32
and lifts it, while every gradient stays bounded by float16 (:mod:`nnabla_mpt.scale.measured`).

Plain Python: no nnabla here but its logger.
"""
import math
import statistics
from collections import deque
from typing import Any, List, Optional, Sequence

from nnabla.logger import logger

from ..core import _validate as check
from ..core.dtypes import FloatType
from .policy import growth_factors

#: The safety factor between one measured gradient and its dtype's largest value, used
#: while the history is too short to show a spread (and by ``scale="auto"``, which sees
#: one batch).
MARGIN = 2.0 ** 3

#: How many watched passes the history keeps.
LENGTH = 8

#: Every this many steps a step is watched for the history besides the growth points: the
#: gradients shrink or grow over training, and growth points ``N`` (2000 by default) steps
#: apart would keep reaches of long ago. A watched step costs about 10-17% more (the
#: digits MLP), so this costs about 0.4-0.7% of a run.
WATCH_EVERY = 25

#: How many passes the history needs before its spread sets the margin. Until it holds
#: them every step is watched, so that the first growth point finds them: the first good
#: steps of a run, or after a state without a history is loaded. (A run whose steps are
#: all skipped, or whose unbounded gradients are all zero, records none and stays
#: watched, each step about 10-17% slower.)
MIN_SAMPLES = 4

#: How many standard deviations (of log2 of the reaches) below the mean a batch may fall.
SPREADS = 3.0

#: The smallest margin, as a power of two: a steady stream keeps ``2**0.5``.
MIN_EXPONENT = 0.5

#: The floor of what the history supports: the worst of this many of the newest passes
#: over ``MARGIN``.
RECENT = 2


class ScaleHistory:
    """The reaches of the last :data:`LENGTH` watched passes (see the module's docstring).

    Example:
        >>> from nnabla_mpt.scale.scale_history import ScaleHistory
        >>> steady = ScaleHistory()
        >>> for _ in range(4):
        ...     steady.record(4096.0)
        >>> round(steady.margin(), 3), round(steady.supported(4096.0))
        (1.414, 2896)
    """

    def __init__(self) -> None:
        self._reaches: deque = deque(maxlen=LENGTH)

    def record(self, reach: float) -> None:
        """Adds a watched pass's reach; one that says nothing (``inf``: every gradient
        without a bound was zero; 0 or not finite: the pass overflowed) is left out."""
        if 0.0 < reach < math.inf:
            self._reaches.append(float(reach))

    def margin(self) -> float:
        """The factor kept between the history's worst reach and the scale (``MARGIN``
        while it holds fewer than :data:`MIN_SAMPLES` reaches)."""
        if len(self._reaches) < MIN_SAMPLES:
            return MARGIN
        logs = [math.log2(r) for r in self._reaches]
        spread = SPREADS * statistics.stdev(logs) - (statistics.fmean(logs) - min(logs))
        return 2.0 ** min(max(spread, MIN_EXPONENT), math.log2(MARGIN))

    def supported(self, reach: float) -> float:
        """The largest scale the history supports after a pass of ``reach``: its worst
        reach over the margin, or the worst of its :data:`RECENT` newest over ``MARGIN``
        if that is more; while it holds fewer than :data:`MIN_SAMPLES`, ``reach`` over
        ``MARGIN`` (``inf`` when every gradient without a bound was zero)."""
        if len(self._reaches) < MIN_SAMPLES:
            return reach / MARGIN
        recent = min(list(self._reaches)[-RECENT:]) / MARGIN
        return max(min(self._reaches) / self.margin(), recent)

    def __len__(self) -> int:
        return len(self._reaches)

    def state(self) -> List[float]:
        """The reaches, oldest first, as plain floats."""
        return list(self._reaches)

    def load(self, reaches: Sequence[float]) -> None:
        """Restores what :meth:`state` returned."""
        self._reaches = deque((float(r) for r in reaches), maxlen=LENGTH)


def checked_state(name: str, value: Any) -> List[float]:
    """A history's state (:meth:`ScaleHistory.state`) from a loaded updater state: a list
    of at most :data:`LENGTH` finite positive numbers; ``name`` names it in messages."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list of reaches, got {value!r}")
    if len(value) > LENGTH:
        raise ValueError(f"{name} holds {len(value)} reaches, at most {LENGTH} are kept")
    return [check.real(f"{name}[{i}]", r, gt=0.0) for i, r in enumerate(value)]


#: Powers of two of room beyond the ceiling from which the ceiling is said to hold the
#: scale (the margin of measured growth aside).
ROOM_WORTH_SAYING = 2


class GrowthLimit:
    """Tells, at each measured growth point, what held the scale, and says once when the
    loss dtype's ceiling holds it while the gradients leave room.

    Args:
        policy: The dynamic policy (its ``growth_factor`` and ``max_scale``).
        dtype: The loss's :class:`~nnabla_mpt.core.dtypes.FloatType`, whose largest power
            of two is the ceiling.
        max_scale: The upper bound the user asked for (the policy's is the smaller of it
            and the ceiling), or None: where it is no higher than the ceiling, it holds
            the scale, not the ceiling.
    """

    def __init__(self, policy: Any, dtype: FloatType, max_scale: Optional[float] = None
                 ) -> None:
        self._policy = policy
        self._dtype = dtype
        self._ceiling_binds = max_scale is None or max_scale > dtype.max_power_of_two
        self.said = False

    def held_by(self, before: float, after: float, room: float, free: float,
                margin: float) -> Optional[str]:
        """What held the growth point that moved the scale from ``before`` to ``after``,
        with ``room`` measured (the factor the policy was given; ``inf`` where nothing
        bounds it) of which the gradients' own reach supports ``free``: ``"ceiling"``
        where the scale sits at the loss dtype's largest power of two, below the bound
        asked for, while the gradients leave room for a growth (said once where they leave
        :data:`ROOM_WORTH_SAYING` powers of two, naming ``margin``, the factor measured
        growth kept below the dtype's largest value); ``"gradients"`` where the room allowed
        no growth; ``"max_scale"`` where the policy's upper bound stopped it short of the
        room; None where the scale grew as far as the room allows."""
        factor = self._policy.growth_factor
        left = free * before / after
        if self._ceiling_binds and after >= self._dtype.max_power_of_two and left >= factor:
            if left >= 2.0 ** ROOM_WORTH_SAYING:
                self._say(after, left, margin)
            return "ceiling"
        # the scale the room allows from before, as the policy counts its growth
        reachable = math.inf if math.isinf(room) else before * factor ** growth_factors(room,
                                                                                      factor)
        if reachable <= before:
            return "gradients" if after <= before else None
        return "max_scale" if after < reachable else None

    def _say(self, scale: float, left: float, margin: float) -> None:
        if self.said:
            return
        self.said = True
        room = ("room for {} more powers of two".format(math.floor(math.log2(left)))
                if math.isfinite(left) else "unbounded room (every gradient is zero)")
        logger.warning(
            f"nnabla_mpt: the loss scale is held at {scale:g} by the largest power of two "
            f"the loss's dtype ({self._dtype.name}) holds, not by the gradients, which leave "
            f"{room} beyond the margin measured growth keeps below the dtype's largest value, "
            f"{margin:.3g} times here (set between 1.41 and 8 by the spread of the watched "
            f"steps; the headroom of the gradient statistics counts without it): "
            f"backward(scale) seeds the pass in "
            f"the loss's dtype. A loss built in "
            f"float32 lifts the ceiling: build the network in half and only the loss under "
            f"a float context (F.identity(logits), then the loss); the gradients stay "
            f"float16 and bounded by it (see the measured-scaling page)")

