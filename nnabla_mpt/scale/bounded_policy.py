"""The updaters' policies, bounded by what the loss's dtype can seed.

``loss.backward(scale)`` seeds the backward pass in the loss's dtype: no scale above the
largest power of two that dtype holds (``2**15`` in float16), and none below its smallest
positive value, reaches the gradients as given. The updaters build their policy here, from
settings already checked one by one, and check the bounds against each other and the dtype.
"""
from typing import Any, Dict, FrozenSet, Mapping, Tuple

from nnabla.logger import logger

from ..core import _validate as check
from ..core.dtypes import FloatType
from .policy import (DEFAULT_HYSTERESIS, DEFAULT_MAX_SCALE, DEFAULT_MIN_SCALE,
                     DynamicLossScale, FixedLossScale)

#: The dynamic updater's options that make its policy (:func:`policy_settings`) and go
#: no further.
OPTIONS = ("policy", "growth_mode", "scaling_factor", "N")
#: The keys of the settings :func:`dynamic_policy` takes: ``scale`` (a number or
#: ``"auto"``) and the settings of :class:`DynamicLossScale` (:attr:`~DynamicLossScale.SETTINGS`).
SETTINGS = ("scale",) + DynamicLossScale.SETTINGS


def policy_settings(owner: str, values: Mapping[str, Any], given: Mapping[str, Any],
                     passed: FrozenSet[str], moved: Mapping[str, Any]) -> Tuple[Dict, Dict]:
    """``(settings, shown)`` of the dynamic policy, from the checked ``values`` of its
    options (:data:`OPTIONS`): the settings of ``policy=`` where given
    (nnabla's arguments that it holds must not be given then, ``scale="auto"`` aside), else
    those of nnabla's arguments, ``growth_mode`` and the moved keywords (``moved``, checked
    here; as given in ``given``), with their defaults."""
    policy, growth_mode, factor, interval = (values[name] for name in OPTIONS)
    if policy is not None:
        clash = [name for name in ("scale", "scaling_factor", "N", "growth_mode")
                 if name in passed and not (name == "scale" and values["scale"] == "auto")]
        if clash:
            raise TypeError(f"{owner}() got policy= and {'=, '.join(clash)}=: the policy holds "
                            f"them (init_scale, growth_factor, growth_interval, growth_mode); "
                            f"set them in the DynamicLossScale, or leave policy= out "
                            f"(scale='auto' may go with it)")
        settings = {name: getattr(policy, name) for name in DynamicLossScale.SETTINGS}
        settings["scale"] = "auto" if values["scale"] == "auto" else policy.loss_scale
        return settings, dict(settings)
    settings = dict({"scale": values["scale"], "growth_factor": factor,
                     "growth_interval": interval, "growth_mode": growth_mode,
                     "hysteresis": DEFAULT_HYSTERESIS, "min_scale": DEFAULT_MIN_SCALE,
                     "max_scale": DEFAULT_MAX_SCALE,
                     "backoff_factor": 1.0 / factor},
                    **{name: _MOVED_CHECKS[name](name, value) for name, value in moved.items()
                       if value is not None})
    shown = dict(settings, scale=given["scale"], **{name: given[name] for name in moved})
    return settings, shown


#: The checks of the policy's settings that the dynamic updater took as keywords (a
#: ``backoff_factor`` of None is the default, ``1 / scaling_factor``).
_MOVED_CHECKS = {
    "backoff_factor": lambda name, value: check.real(name, value, gt=0.0, lt=1.0),
    "hysteresis": lambda name, value: check.integer(name, value, ge=1),
    "min_scale": lambda name, value: check.real(name, value, gt=0.0),
    "max_scale": lambda name, value: check.real(name, value, gt=0.0)}


def dynamic_policy(settings: Mapping[str, Any], shown: Mapping[str, Any],
                   dtype: FloatType) -> DynamicLossScale:
    """The dynamic updater's policy from ``settings`` (:data:`SETTINGS`, each checked;
    ``shown``: the same as the user gave them, for the messages), its bounds checked
    against each other and against ``dtype``, the loss's type: its upper bound is
    ``min(max_scale, ceiling)``, the largest power of two ``dtype`` holds; ``"auto"``
    starts there until the first step measures; a larger scale is lowered to it (an info
    line); a scale below the dtype's smallest positive value is refused."""
    lo, hi, scale = settings["min_scale"], settings["max_scale"], settings["scale"]
    ceiling = dtype.max_power_of_two
    if lo > hi:
        raise ValueError(f"min_scale must be <= max_scale, got min_scale="
                         f"{shown['min_scale']!r} and max_scale={shown['max_scale']!r}")
    if lo > ceiling:
        raise ValueError(f"min_scale={shown['min_scale']!r} is above {ceiling:g}, the largest "
                         f"power of two the loss's dtype holds: backward(scale) would seed "
                         f"inf at every scale allowed")
    for name in ("scale", "min_scale"):
        seedable(name, shown[name], settings[name], dtype)
    if scale != "auto" and not lo <= scale <= hi:
        raise ValueError(f"scale must lie in [min_scale, max_scale] = [{lo:g}, {hi:g}], "
                         f"got scale={shown['scale']!r}")
    upper = min(hi, ceiling)
    if scale == "auto":
        scale = upper    # until the first step measures it
    elif scale > upper:
        logger.info(f"nnabla_mpt: scale={shown['scale']!r} is above {ceiling:g}, the largest "
                    f"power of two the loss's dtype holds (backward(scale) seeds the pass "
                    f"in that dtype): starting at {upper:g}")
        scale = upper
    policy_settings = {name: settings[name] for name in DynamicLossScale.SETTINGS}
    return DynamicLossScale(init_scale=scale, **dict(policy_settings, max_scale=upper))


def fixed_policy(scale: float, shown: Any, dtype: FloatType) -> FixedLossScale:
    """The fixed updater's policy of ``scale`` (given as ``shown``), which the loss's dtype
    ``dtype`` must be able to seed."""
    policy = FixedLossScale(scale)
    ceiling = dtype.max_power_of_two
    if policy.loss_scale > ceiling:
        raise ValueError(f"scale={shown!r} is above {ceiling:g}, the largest power "
                         f"of two the loss's dtype holds: backward(scale) seeds the pass in "
                         f"that dtype, so every step would overflow; use scale <= {ceiling:g}")
    seedable("scale", shown, policy.loss_scale, dtype)
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
