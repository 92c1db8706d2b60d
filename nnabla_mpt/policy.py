"""Loss-scale policies: plain Python objects that decide the scale, and nothing else.

A policy knows nothing of nnabla. The updater asks it for the scale to use
(:meth:`get_loss_scale`), tells it whether the step overflowed (:meth:`update`) and saves
it with the rest of the training state (:meth:`state_dict`).

Example:
    >>> from nnabla_mpt import DynamicLossScale
    >>> policy = DynamicLossScale(init_scale=1024.0, growth_interval=2)
    >>> policy.update(True)          # an overflow: the scale backs off
    True
    >>> policy.loss_scale
    512.0
    >>> policy.update(False), policy.update(False)   # two good steps: it grows
    (False, False)
    >>> policy.loss_scale
    1024.0
"""
from typing import Any, Dict, Mapping

from . import _validate as check

_POLICY_STATE_VERSION = 1


class DynamicLossScale:
    """A loss scale that grows while steps are good and backs off on overflow.

    Rules, applied by :meth:`update` after every step:

    * A good step (no overflow) counts towards growth. After exactly ``growth_interval``
      consecutive good steps the scale is multiplied by ``growth_factor`` (clamped to
      ``max_scale``), the count restarts and the hysteresis budget is refilled.
    * An overflow resets the good-step count and spends one unit of the hysteresis budget
      (``hysteresis`` units after each growth and at start). When the budget is exhausted the
      scale is multiplied by ``backoff_factor`` (clamped to ``min_scale``); the budget stays
      exhausted, so later overflows back off at once until the next growth refills it. With
      ``hysteresis=1`` (the default) every overflow backs off.

    The scale never leaves ``[min_scale, max_scale]``.

    Args:
        init_scale: The scale of the first step.
        growth_factor: Factor applied on growth; ``> 1``.
        backoff_factor: Factor applied on back-off; in ``(0, 1)``.
        growth_interval: Consecutive good steps before a growth; ``>= 1``.
        hysteresis: Overflows tolerated before backing off; ``>= 1``.
        min_scale: Lower bound of the scale; ``> 0``.
        max_scale: Upper bound of the scale; ``>= min_scale``.

    Raises:
        TypeError, ValueError: an argument is out of range; the message names it.
    """

    kind = "dynamic"

    def __init__(self, init_scale: float = 2.0 ** 15, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 hysteresis: int = 1, min_scale: float = 1.0,
                 max_scale: float = 2.0 ** 24) -> None:
        self.growth_factor = check.real("growth_factor", growth_factor, gt=1.0)
        self.backoff_factor = check.real("backoff_factor", backoff_factor, gt=0.0, lt=1.0)
        self.growth_interval = check.integer("growth_interval", growth_interval, ge=1)
        self.hysteresis = check.integer("hysteresis", hysteresis, ge=1)
        self.min_scale = check.real("min_scale", min_scale, gt=0.0)
        self.max_scale = check.real("max_scale", max_scale, gt=0.0)
        if self.min_scale > self.max_scale:
            raise ValueError(f"min_scale must be <= max_scale, got min_scale={min_scale!r} "
                             f"and max_scale={max_scale!r}")
        scale = check.real("init_scale", init_scale, gt=0.0)
        if not self.min_scale <= scale <= self.max_scale:
            raise ValueError(f"init_scale must lie in [min_scale, max_scale] = "
                             f"[{self.min_scale:g}, {self.max_scale:g}], got {init_scale!r}")
        self._scale = scale
        self._good_steps = 0
        self._hysteresis_left = self.hysteresis

    @property
    def loss_scale(self) -> float:
        """The scale to use for the next step."""
        return self._scale

    def get_loss_scale(self) -> float:
        """The scale to use for the next step."""
        return self._scale

    def set_loss_scale(self, scale: float) -> None:
        """Sets the scale, checked against the bounds; restarts the growth count."""
        value = check.real("scale", scale, gt=0.0)
        if not self.min_scale <= value <= self.max_scale:
            raise ValueError(f"scale must lie in [min_scale, max_scale] = "
                             f"[{self.min_scale:g}, {self.max_scale:g}], got {scale!r}")
        self._scale = value
        self._good_steps = 0

    @property
    def good_steps(self) -> int:
        """Consecutive good steps since the last overflow or growth."""
        return self._good_steps

    @property
    def hysteresis_left(self) -> int:
        """Overflows still tolerated before the next back-off."""
        return self._hysteresis_left

    @property
    def at_min_scale(self) -> bool:
        """Whether the scale sits at ``min_scale``, where a back-off can do nothing."""
        return self._scale <= self.min_scale

    def update(self, overflow: bool) -> bool:
        """Adjusts the scale after a step; returns ``overflow`` unchanged."""
        overflow = bool(overflow)
        if overflow:
            self._good_steps = 0
            self._hysteresis_left = max(self._hysteresis_left - 1, 0)
            if self._hysteresis_left == 0:
                self._scale = max(self._scale * self.backoff_factor, self.min_scale)
        else:
            self._good_steps += 1
            if self._good_steps >= self.growth_interval:
                self._scale = min(self._scale * self.growth_factor, self.max_scale)
                self._good_steps = 0
                self._hysteresis_left = self.hysteresis
        return overflow

    _STATE_KEYS = ("version", "kind", "scale", "good_steps", "hysteresis_left",
                   "growth_factor", "backoff_factor", "growth_interval", "hysteresis",
                   "min_scale", "max_scale")

    def state_dict(self) -> Dict[str, Any]:
        """Every field as plain Python scalars, versioned."""
        return {"version": _POLICY_STATE_VERSION, "kind": self.kind, "scale": self._scale,
                "good_steps": self._good_steps, "hysteresis_left": self._hysteresis_left,
                "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "hysteresis": self.hysteresis,
                "min_scale": self.min_scale, "max_scale": self.max_scale}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned; all or nothing."""
        check.exact_keys("state", state, self._STATE_KEYS)
        check.version("state", state, _POLICY_STATE_VERSION)
        if state["kind"] != self.kind:
            raise ValueError(f"state is for a {state['kind']!r} policy, not {self.kind!r}")
        fresh = DynamicLossScale(
            init_scale=state["scale"], growth_factor=state["growth_factor"],
            backoff_factor=state["backoff_factor"], growth_interval=state["growth_interval"],
            hysteresis=state["hysteresis"], min_scale=state["min_scale"],
            max_scale=state["max_scale"])
        good = check.integer("state['good_steps']", state["good_steps"], ge=0)
        left = check.integer("state['hysteresis_left']", state["hysteresis_left"], ge=0)
        if good >= fresh.growth_interval or left > fresh.hysteresis:
            raise ValueError(f"state is inconsistent: good_steps={good} must be < "
                             f"growth_interval={fresh.growth_interval} and hysteresis_left="
                             f"{left} <= hysteresis={fresh.hysteresis}")
        self.__dict__.update(fresh.__dict__)
        self._good_steps = good
        self._hysteresis_left = left

    def __repr__(self) -> str:
        return (f"DynamicLossScale(scale={self._scale:g}, growth_factor={self.growth_factor:g}, "
                f"backoff_factor={self.backoff_factor:g}, growth_interval="
                f"{self.growth_interval}, hysteresis={self.hysteresis}, min_scale="
                f"{self.min_scale:g}, max_scale={self.max_scale:g})")


class FixedLossScale:
    """A scale that never changes.

    Args:
        scale: The scale; ``>= 1`` (a scale below one only loses fp16 precision).

    Example:
        >>> from nnabla_mpt import FixedLossScale
        >>> policy = FixedLossScale(128.0)
        >>> policy.update(True), policy.loss_scale
        (True, 128.0)
    """

    kind = "fixed"
    at_min_scale = False

    def __init__(self, scale: float = 128.0) -> None:
        self._scale = check.real("scale", scale, ge=1.0)

    @property
    def loss_scale(self) -> float:
        """The scale, the same for every step."""
        return self._scale

    def get_loss_scale(self) -> float:
        """The scale, the same for every step."""
        return self._scale

    def set_loss_scale(self, scale: float) -> None:
        """Replaces the scale (``>= 1``)."""
        self._scale = check.real("scale", scale, ge=1.0)

    def update(self, overflow: bool) -> bool:
        """Returns ``overflow`` unchanged; the scale stays."""
        return bool(overflow)

    def state_dict(self) -> Dict[str, Any]:
        return {"version": _POLICY_STATE_VERSION, "kind": self.kind, "scale": self._scale}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check.exact_keys("state", state, ("version", "kind", "scale"))
        check.version("state", state, _POLICY_STATE_VERSION)
        if state["kind"] != self.kind:
            raise ValueError(f"state is for a {state['kind']!r} policy, not {self.kind!r}")
        self._scale = check.real("state['scale']", state["scale"], ge=1.0)

    def __repr__(self) -> str:
        return f"FixedLossScale(scale={self._scale:g})"
