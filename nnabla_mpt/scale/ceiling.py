"""What held a growth point of measured growth: the gradients, or the seed's ceiling.

``loss.backward(scale)`` seeds the backward pass in the loss's dtype, so no scale grows
past the largest power of two that dtype holds (``2**15`` in float16), however much room
the gradients leave. With a mean loss in a float16 graph that ceiling, not the gradients,
holds the scale for the whole run. A float16 network whose loss alone is built in float32
(``F.identity(logits)``, then the loss, under a float context) seeds in float32 and lifts
it, while every gradient stays bounded by float16 (:mod:`nnabla_mpt.scale.measured`).
"""
import math
from typing import Any, Optional

from nnabla.logger import logger

from ..core.dtypes import FloatType
from .policy import growth_factors

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
        reachable = _reachable(before, room, factor)
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


def _reachable(before: float, room: float, factor: float) -> float:
    """The scale ``room`` allows from ``before``, as the policy counts its growth
    (:func:`~nnabla_mpt.scale.policy.growth_factors`); ``inf`` where the room is."""
    if math.isinf(room):
        return math.inf
    return before * factor ** growth_factors(room, factor)
