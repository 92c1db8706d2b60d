"""Loss-scale policies: plain Python objects that decide the scale, and nothing else.

A policy knows nothing of nnabla. The updater asks it for the scale to use
(:attr:`loss_scale`), tells it whether the step overflowed (:meth:`update`) and saves
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
import math
from typing import Any, Callable, Dict, Literal, Mapping, Optional, Tuple, get_args

from ..core import _validate as check
from ..core.dtypes import FLOATS

_DYNAMIC_STATE_VERSION = _FIXED_STATE_VERSION = 1

#: The largest scale any policy takes or produces: a loss scale is a finite float32.
SCALE_LIMIT = FLOATS["float32"].max

GrowthMode = Literal["probe", "measured"]
GROWTH_MODES = get_args(GrowthMode)
#: The first scale of a :class:`DynamicLossScale` given none: the largest float16 can seed.
DEFAULT_INIT_SCALE = 2.0 ** 15
#: The bounds and the hysteresis of a :class:`DynamicLossScale` made without them, and of
#: the dynamic updater's policy when no ``policy=`` is given.
DEFAULT_MIN_SCALE, DEFAULT_MAX_SCALE, DEFAULT_HYSTERESIS = 1.0, 2.0 ** 24, 1


def growth_factors(room: float, factor: float, scale: float = 1.0,
                   cap: float = math.inf) -> int:
    """How many factors a measured growth takes from ``scale``: the largest ``k >= 0``
    with ``factor**(k + 1) <= room`` (``room``: the factor the gradients allow), counted
    no further than where ``scale * factor**k`` reaches ``cap``. ``room`` and ``cap``
    must not both be ``inf``."""
    k = 0
    while factor ** (k + 1) <= room and scale * factor ** k < cap:
        k += 1
    return k


def _scale_value(name: str, value: Any, **bounds) -> float:
    """A scale: a real number within ``bounds`` that float32 holds."""
    scale = check.real(name, value, **bounds)
    if scale > SCALE_LIMIT:
        raise ValueError(f"{name} must be a finite float32 (at most {SCALE_LIMIT:.7g}), got "
                         f"{value!r}")
    return scale


class _Progress:
    """What the steps change in a :class:`DynamicLossScale`: its scale, the good steps since
    the last overflow or growth, and the overflows its hysteresis still tolerates. A record
    of its own, so that a step's assignments pass no check of the policy's settings
    (:meth:`DynamicLossScale.__setattr__` checks those)."""
    __slots__ = ("scale", "good_steps", "hysteresis_left")

    def __init__(self, scale: float, good_steps: int, hysteresis_left: int) -> None:
        self.scale, self.good_steps, self.hysteresis_left = scale, good_steps, hysteresis_left


class DynamicLossScale:
    """A loss scale that grows while steps are good and backs off on overflow.

    Rules, applied by :meth:`update` after every step::

        overflow:   good_steps = 0; spend one unit of hysteresis
                    if none is left: scale = max(scale * backoff_factor, min_scale)
        good step:  good_steps += 1
                    if good_steps == growth_interval:          (growth is due)
                        probe:     k = 1
                        measured:  k = the largest k >= 0 with growth_factor**k <= room
                        scale = min(scale * growth_factor**k, max_scale, SCALE_LIMIT)
                        good_steps = 0; refill the hysteresis

    * With ``growth_mode="probe"`` (default) a growth multiplies the scale by
      ``growth_factor`` once, as every loss scaler does: the next steps find out whether it
      went too far.
    * With ``growth_mode="measured"`` the caller measures, on the step where growth is due
      (:attr:`growth_due`), how far the scale may be multiplied before a gradient of that
      step overflows (``room``, see :meth:`update`), and the scale grows by as many factors
      as fit, possibly none: ``k = 0`` holds the scale and restarts the count, so a growth
      certain to overflow is never tried. Without a measurement (``room=None``) it grows
      by one factor.
    * The hysteresis budget (``hysteresis`` units after each growth and at start) lets
      that many overflows pass before the scale backs off; the budget stays exhausted, so
      later overflows back off at once until the next growth refills it. With
      ``hysteresis=1`` (the default) every overflow backs off.

    The scale never leaves ``[min_scale, max_scale]``, and never exceeds
    :data:`SCALE_LIMIT`, the largest float32 (a larger ``max_scale`` acts as that).

    Args:
        init_scale: The scale of the first step; None (default): ``2**15``
            (:data:`DEFAULT_INIT_SCALE`), or ``max_scale`` where that is lower.
        growth_factor: Factor applied on growth; ``> 1``.
        backoff_factor: Factor applied on back-off; in ``(0, 1)``.
        growth_interval: Consecutive good steps before a growth; ``>= 1``.
        hysteresis: Overflows tolerated before backing off; ``>= 1``.
        min_scale: Lower bound of the scale; ``> 0``.
        max_scale: Upper bound of the scale; ``>= min_scale``.
        growth_mode: ``"probe"`` or ``"measured"``, see above.

    Raises:
        TypeError, ValueError: an argument is out of range; the message names it.
    """

    kind = "dynamic"

    def __init__(self, init_scale: Optional[float] = None, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 hysteresis: int = DEFAULT_HYSTERESIS, min_scale: float = DEFAULT_MIN_SCALE,
                 max_scale: float = DEFAULT_MAX_SCALE,
                 growth_mode: GrowthMode = "probe") -> None:
        if init_scale is None:
            init_scale = min(DEFAULT_INIT_SCALE, check.real("max_scale", max_scale, gt=0.0))
        settings = {"scale": init_scale, "growth_factor": growth_factor,
                    "backoff_factor": backoff_factor, "growth_interval": growth_interval,
                    "hysteresis": hysteresis, "min_scale": min_scale, "max_scale": max_scale,
                    "growth_mode": growth_mode}
        fields = _checked_dynamic(settings, lambda key: "init_scale" if key == "scale" else key)
        scale = fields.pop("scale")
        self.__dict__.update(fields)
        self._now = _Progress(scale, 0, self.hysteresis)
        self._seed_bounds = (0.0, math.inf)     # what the loss can seed, once bounded

    def __setattr__(self, name: str, value: Any) -> None:
        """A setting (:attr:`SETTINGS`) assigned is checked with the others, as the
        constructor checks it, and against what the loss can seed once an updater runs the
        policy (:func:`~nnabla_mpt.scale.bounded_policy.bound_to`); refused, nothing
        changes. Another public attribute is refused too: a policy has no other."""
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        if name not in self.SETTINGS:
            raise AttributeError(f"DynamicLossScale has no setting {name!r} ({name} = "
                                 f"{value!r} refused); its settings: "
                                 f"{', '.join(self.SETTINGS)}")
        values = self.state_dict()              # the settings and the scale, as now
        values[name] = value
        try:
            fields = _checked_dynamic(values, lambda key: key)
            _within_seed(fields, self._seed_bounds)
        except (TypeError, ValueError) as error:
            raise type(error)(f"DynamicLossScale.{name} = {value!r} refused: {error}") from None
        del fields["scale"]                     # checked against the new bounds, unchanged
        self.__dict__.update(fields)
        self._now.good_steps = min(self._now.good_steps, self.growth_interval - 1)
        self._now.hysteresis_left = min(self._now.hysteresis_left, self.hysteresis)

    @property
    def loss_scale(self) -> float:
        """The scale to use for the next step."""
        return self._now.scale

    def set_loss_scale(self, scale: float) -> None:
        """Sets the scale, checked against the bounds; restarts the growth count."""
        self._now.scale = _scale_in("scale", scale, self.min_scale, self.max_scale)
        self._now.good_steps = 0

    def set_growth_interval(self, growth_interval: int) -> None:
        """Sets ``growth_interval`` (checked, ``>= 1``); a count of good steps already at
        it or beyond is kept just below it, so the next good step grows the scale."""
        self.growth_interval = growth_interval

    @property
    def good_steps(self) -> int:
        """Consecutive good steps since the last overflow or growth."""
        return self._now.good_steps

    @property
    def hysteresis_left(self) -> int:
        """Overflows still tolerated before the next back-off."""
        return self._now.hysteresis_left

    @property
    def at_min_scale(self) -> bool:
        """Whether the scale sits at ``min_scale``, where a back-off can do nothing."""
        return self._now.scale <= self.min_scale

    @property
    def growth_due(self) -> bool:
        """Whether the next step, if good, ends a growth interval: the step to measure in
        ``"measured"`` mode."""
        return self._now.good_steps + 1 >= self.growth_interval

    def update(self, overflow: bool, room: Optional[float] = None) -> bool:
        """Adjusts the scale after a step; returns ``overflow`` unchanged.

        Args:
            overflow: Whether the step overflowed.
            room: ``"measured"`` mode, on the step where growth is due: how far the scale
                may be multiplied before a gradient of the step would overflow (the
                dtype's largest value over the largest gradient, with the caller's safety
                margin); None when not measured. Ignored in ``"probe"`` mode.
        """
        overflow = bool(overflow)
        now = self._now
        if overflow:
            now.good_steps = 0
            now.hysteresis_left = max(now.hysteresis_left - 1, 0)
            if now.hysteresis_left == 0:
                now.scale = max(now.scale * self.backoff_factor, self.min_scale)
        else:
            now.good_steps += 1
            if now.good_steps >= self.growth_interval:
                now.scale = self._grown(room)
                now.good_steps = 0
                now.hysteresis_left = self.hysteresis
        return overflow

    def _grown(self, room: Optional[float]) -> float:
        """The scale after a growth: one factor, or as many as ``room`` allows."""
        cap = min(self.max_scale, SCALE_LIMIT)
        factor, scale = self.growth_factor, self._now.scale
        if self.growth_mode == "probe" or room is None:
            return min(scale * factor, cap)
        return min(scale * factor ** growth_factors(room, factor, scale, cap), cap)

    #: The constructor's arguments that a state carries besides the scale.
    SETTINGS = ("growth_factor", "backoff_factor", "growth_interval", "hysteresis",
                "min_scale", "max_scale", "growth_mode")
    _STATE_KEYS = ("version", "kind", "scale", "good_steps", "hysteresis_left") + SETTINGS

    def state_dict(self) -> Dict[str, Any]:
        """Every field as plain Python scalars, versioned."""
        now = self._now
        return {"version": _DYNAMIC_STATE_VERSION, "kind": self.kind, "scale": now.scale,
                "good_steps": now.good_steps, "hysteresis_left": now.hysteresis_left,
                **{name: getattr(self, name) for name in self.SETTINGS}}

    def load_state_dict(self, state: Mapping[str, Any], *, name: str = "state") -> None:
        """Restores what :meth:`state_dict` returned; all or nothing.

        ``name``: how messages name the state (``"state['policy']"`` in an updater's
        state); a value is named by its key in it, e.g. ``state['scale']``.
        """
        _check_state(state, self.kind, name, self._STATE_KEYS, _DYNAMIC_STATE_VERSION)
        key = lambda k: f"{name}[{k!r}]"    # noqa: E731
        fresh = _checked_dynamic(state, key)
        good = check.integer(key("good_steps"), state["good_steps"], ge=0)
        left = check.integer(key("hysteresis_left"), state["hysteresis_left"], ge=0)
        if good >= fresh["growth_interval"] or left > fresh["hysteresis"]:
            raise ValueError(f"{name} is inconsistent: good_steps={good} must be < "
                             f"growth_interval={fresh['growth_interval']} and hysteresis_left="
                             f"{left} <= hysteresis={fresh['hysteresis']}")
        scale = fresh.pop("scale")
        self.__dict__.update(fresh)
        self._now = _Progress(scale, good, left)    # its own record: a copy shares none

    def replaced_settings(self, state: Mapping[str, Any]) -> Dict[str, Tuple[Any, Any]]:
        """The settings (:attr:`SETTINGS`) that loading ``state``, a state
        :meth:`load_state_dict` accepts, would change: ``name -> (value here, value in
        state)``, in the order of :attr:`SETTINGS`."""
        return {name: (getattr(self, name), state[name]) for name in self.SETTINGS
                if state[name] != getattr(self, name)}

    def __repr__(self) -> str:
        return (f"DynamicLossScale(scale={self._now.scale:g}, "
                f"growth_factor={self.growth_factor:g}, "
                f"backoff_factor={self.backoff_factor:g}, "
                f"growth_interval={self.growth_interval}, hysteresis={self.hysteresis}, "
                f"min_scale={self.min_scale:g}, max_scale={self.max_scale:g}, "
                f"growth_mode={self.growth_mode!r})")


def _checked_dynamic(values: Mapping[str, Any], name: Callable[[str], str]) -> Dict[str, Any]:
    """The settings of a :class:`DynamicLossScale` and its ``"scale"`` from ``values``
    (the keys of its state), each checked; ``name(key)``: how messages name a value
    (``init_scale`` in the constructor, ``state['scale']`` in a state)."""
    lo, hi = name("min_scale"), name("max_scale")
    fields = {
        "growth_factor": check.real(name("growth_factor"), values["growth_factor"], gt=1.0),
        "backoff_factor": check.real(name("backoff_factor"), values["backoff_factor"],
                                     gt=0.0, lt=1.0),
        "growth_interval": check.integer(name("growth_interval"), values["growth_interval"],
                                         ge=1),
        "hysteresis": check.integer(name("hysteresis"), values["hysteresis"], ge=1),
        "min_scale": _scale_value(lo, values["min_scale"], gt=0.0),
        "max_scale": check.real(hi, values["max_scale"], gt=0.0),
        "growth_mode": check.choice(name("growth_mode"), values["growth_mode"], GROWTH_MODES),
    }
    if fields["min_scale"] > fields["max_scale"]:
        raise ValueError(f"{lo} must be <= {hi}, got {lo}={values['min_scale']!r} and "
                         f"{hi}={values['max_scale']!r}")
    fields["scale"] = _scale_in(name("scale"), values["scale"], fields["min_scale"],
                                fields["max_scale"])
    return fields


def _within_seed(fields: Mapping[str, Any], bounds: Tuple[float, float]) -> None:
    """Refuses bounds outside ``bounds``, the smallest and the largest scale the loss's
    dtype can seed (``loss.backward(scale)`` seeds the pass in that dtype)."""
    smallest, ceiling = bounds
    if fields["max_scale"] > ceiling:
        raise ValueError(f"max_scale={fields['max_scale']:g} is above {ceiling:g}, the largest "
                         f"power of two the loss's dtype holds: backward(scale) would seed inf")
    if fields["min_scale"] < smallest:
        raise ValueError(f"min_scale={fields['min_scale']:g} is below {smallest:g}, the "
                         f"smallest positive value of the loss's dtype: backward(scale) "
                         f"would seed 0")


def _scale_in(name: str, scale: Any, min_scale: float, max_scale: float) -> float:
    """``scale``, checked to lie in ``[min_scale, max_scale]``."""
    value = _scale_value(name, scale, gt=0.0)
    if not min_scale <= value <= max_scale:
        raise ValueError(f"{name} must lie in [min_scale, max_scale] = "
                         f"[{min_scale:g}, {max_scale:g}], got {scale!r}")
    return value


def _check_state(state: Any, kind: str, name: str, keys: tuple, version: int) -> None:
    """Checks the frame of a policy's state named ``name``: a state saved by a policy of
    another kind is refused first, naming both kinds; then its keys (exactly ``keys``)
    and its ``version``."""
    if isinstance(state, Mapping) and state.get("kind", kind) != kind:
        raise ValueError(f"{name} is for a {state['kind']!r} policy, not {kind!r}")
    check.exact_keys(name, state, keys)
    check.version(name, state, version)


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
    growth_due = False

    def __init__(self, scale: float = 128.0) -> None:
        self._scale = _scale_value("scale", scale, ge=1.0)

    @property
    def loss_scale(self) -> float:
        """The scale, the same for every step."""
        return self._scale

    def set_loss_scale(self, scale: float) -> None:
        """Replaces the scale (``>= 1``)."""
        self._scale = _scale_value("scale", scale, ge=1.0)

    def update(self, overflow: bool, room: Optional[float] = None) -> bool:
        """Returns ``overflow`` unchanged; the scale stays (``room`` is ignored)."""
        return bool(overflow)

    def state_dict(self) -> Dict[str, Any]:
        return {"version": _FIXED_STATE_VERSION, "kind": self.kind, "scale": self._scale}

    def replaced_settings(self, state: Mapping[str, Any]) -> Dict[str, Tuple[Any, Any]]:
        """Empty: a fixed policy's only value, its scale, is its state."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any], *, name: str = "state") -> None:
        """Restores what :meth:`state_dict` returned; ``name``: how messages name the
        state (``"state['policy']"`` in an updater's state)."""
        _check_state(state, self.kind, name, ("version", "kind", "scale"), _FIXED_STATE_VERSION)
        self._scale = _scale_value(f"{name}['scale']", state["scale"], ge=1.0)

    def __repr__(self) -> str:
        return f"FixedLossScale(scale={self._scale:g})"
