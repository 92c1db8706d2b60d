"""The updaters' policies, bounded by what the loss's dtype can seed.

``loss.backward(scale)`` seeds the backward pass in the loss's dtype: no scale above the
largest power of two that dtype holds (``2**15`` in float16), and none below its smallest
positive value, reaches the gradients as given. The updaters build their policy here, from
arguments checked where they are made, and check the bounds against the dtype.
"""
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from nnabla.logger import logger

from ..core import _validate as check
from ..core.dtypes import FloatType
from .policy import DEFAULT_MAX_SCALE, DEFAULT_MIN_SCALE, DynamicLossScale, FixedLossScale

#: The dynamic updater's defaults of nnabla's ``scale``, ``scaling_factor`` and ``N``, and of
#: ``growth_mode``: with ``policy=``, the policy holds them and these stay as they are.
NNABLA_DEFAULTS = {"scale": 8.0, "scaling_factor": 2.0, "N": 2000, "growth_mode": "probe"}


def checked_scale(value: Any) -> Union[float, str]:
    """The dynamic updater's ``scale``: a number > 0 or ``"auto"``."""
    if isinstance(value, str):
        if value != "auto":
            raise ValueError(f"scale must be a positive number or 'auto', got {value!r}")
        return value
    return check.real("scale", value, gt=0.0)


@dataclass(frozen=True)
class DynamicPolicyArguments:
    """The dynamic updater's arguments that make its policy, checked when made: nnabla's
    ``scale``, ``scaling_factor`` and ``N`` with ``growth_mode``, or a ``policy`` (a
    :class:`DynamicLossScale`, which holds all of them; ``scale="auto"`` may go with it).
    ``growth_mode`` is the policy's: it is checked where the policy is made.
    :meth:`policy_for` makes the policy the updater runs, or bounds the one given.

    Attributes:
        max_scale: The upper bound asked for (the policy's, or the default ``2**24``),
            before the loss's dtype lowers it.
    """
    scale: Any = 8.0
    scaling_factor: Any = 2.0
    N: Any = 2000
    growth_mode: Any = "probe"
    policy: Optional[DynamicLossScale] = None
    max_scale: float = field(init=False, default=DEFAULT_MAX_SCALE)

    def __post_init__(self) -> None:
        scale = checked_scale(self.scale)
        if self.policy is not None:
            self._check_policy()
            object.__setattr__(self, "max_scale", self.policy.max_scale)
            return
        check.real("scaling_factor", self.scaling_factor, gt=1.0)
        check.integer("N", self.N, ge=1)
        if scale != "auto" and not DEFAULT_MIN_SCALE <= scale <= DEFAULT_MAX_SCALE:
            raise ValueError(f"scale must lie in [min_scale, max_scale] = "
                             f"[{DEFAULT_MIN_SCALE:g}, {DEFAULT_MAX_SCALE:g}], got "
                             f"scale={self.scale!r}")

    def _check_policy(self) -> None:
        check.option("policy", self.policy, DynamicLossScale)
        clash = [name for name, default in NNABLA_DEFAULTS.items()
                 if getattr(self, name) != default
                 and not (name == "scale" and self.scale == "auto")]
        if clash:
            raise TypeError(f"got policy= and {'=, '.join(clash)}=: the policy holds them "
                            f"(init_scale, growth_factor, growth_interval, growth_mode); set "
                            f"them in the DynamicLossScale, or leave policy= out "
                            f"(scale='auto' may go with it)")

    def policy_for(self, dtype: FloatType) -> DynamicLossScale:
        """The policy the updater runs: the one given (itself, not a copy) or one made of
        nnabla's arguments (backing off by ``1 / scaling_factor``), bounded by ``dtype``,
        the loss's type (:func:`bound_to`)."""
        policy = self.policy
        if policy is None:
            factor = float(self.scaling_factor)
            start = DEFAULT_MAX_SCALE if self.scale == "auto" else self.scale
            policy = DynamicLossScale(init_scale=start, growth_factor=factor,
                                      backoff_factor=1.0 / factor, growth_interval=self.N,
                                      growth_mode=self.growth_mode)
        return bound_to(policy, dtype, self.scale == "auto",
                        policy.loss_scale if self.policy is not None else self.scale)


def bound_to(policy: DynamicLossScale, dtype: FloatType, auto: bool,
             shown: Any) -> DynamicLossScale:
    """``policy`` with its bounds checked against ``dtype``, the loss's type: its upper
    bound lowered to the largest power of two ``dtype`` holds; with ``auto``
    (``scale="auto"``) its scale starts there until the first step measures; a larger
    scale (given as ``shown``) is lowered to it (an info line); a ``min_scale`` or scale
    the dtype cannot seed is refused."""
    ceiling = dtype.max_power_of_two
    if policy.min_scale > ceiling:
        raise ValueError(f"min_scale={policy.min_scale!r} is above {ceiling:g}, the largest "
                         f"power of two the loss's dtype holds: backward(scale) would seed "
                         f"inf at every scale allowed")
    if not auto:
        seedable("scale", shown, policy.loss_scale, dtype)
    seedable("min_scale", policy.min_scale, policy.min_scale, dtype)
    upper = min(policy.max_scale, ceiling)
    scale = upper if auto else min(policy.loss_scale, upper)
    if not auto and policy.loss_scale > upper:
        logger.info(f"nnabla_mpt: scale={shown!r} is above {ceiling:g}, the largest "
                    f"power of two the loss's dtype holds (backward(scale) seeds the pass "
                    f"in that dtype): starting at {upper:g}")
    policy.set_loss_scale(scale)
    policy.max_scale = upper
    policy._seed_bounds = (dtype.smallest, ceiling)    # later assignments are held to them
    return policy


@dataclass(frozen=True)
class FixedScale:
    """The fixed updater's ``scale``, checked when made (``>= 1``);
    :meth:`policy_for` makes its policy."""
    scale: Any = 128.0
    max_scale = None

    def __post_init__(self) -> None:
        FixedLossScale(self.scale)

    def policy_for(self, dtype: FloatType) -> FixedLossScale:
        """The policy of the scale, which the loss's dtype ``dtype`` must be able to seed."""
        policy = FixedLossScale(self.scale)
        ceiling = dtype.max_power_of_two
        if policy.loss_scale > ceiling:
            raise ValueError(f"scale={self.scale!r} is above {ceiling:g}, the largest power "
                             f"of two the loss's dtype holds: backward(scale) seeds the pass "
                             f"in that dtype, so every step would overflow; use scale <= "
                             f"{ceiling:g}")
        seedable("scale", self.scale, policy.loss_scale, dtype)
        return policy


def seedable(name: str, given: Any, value: Any, dtype: FloatType) -> None:
    """Refuses a scale ``value`` (given as ``given``; ``"auto"`` passes) below the smallest
    positive value of ``dtype``: ``loss.backward(scale)`` seeds the pass in that dtype,
    where the scale would be 0 (or rounded up), and every gradient with it."""
    if value != "auto" and value < dtype.smallest:
        raise ValueError(f"{name}={given!r} is below {dtype.smallest:g}, the smallest positive "
                         f"{dtype.name} (the loss's dtype): backward(scale) seeds the pass in "
                         f"that dtype, where it is 0 (or rounded up), and every gradient "
                         f"would be 0; use {name} >= {dtype.smallest:g}")
