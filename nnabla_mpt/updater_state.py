"""The updater's state as plain values: its version, its keys, its checks, and the states
of earlier versions read as the current one.

The updater builds the state (``state_dict()``) and applies it (``load_state_dict()``);
this module says what a valid state is. The policy's and the precision schedule's parts
are theirs to check (:mod:`nnabla_mpt.policy`, :mod:`nnabla_mpt.precision`).
"""
from typing import Any, Dict, Mapping

from nnabla.logger import logger

from . import _validate as check
from . import options

#: The current version: 1 had no ``bad_batches``, 2 no ``calibration_pending``.
VERSION = 3

#: The updater's counters, integers >= 0.
COUNTERS = ("steps", "updates", "skipped_steps", "overflow_streak",
            "longest_overflow_streak", "bad_batches")
#: Every key of a state of the current version.
KEYS = ("version", "updater", "policy", "precision", "calibration_pending") + COUNTERS


def checked(state: Any, updater: str, calibrating: bool) -> Dict[str, Any]:
    """The counters and ``calibration_pending`` of ``state``, checked: the keys, the
    version, the updater's class name (``updater``) and the counters' consistency.
    ``calibrating``: whether the loading updater has ``scale="auto"`` still to measure (for
    a state of an earlier version, see :func:`current`)."""
    state = current(state, calibrating)
    check.exact_keys("state", state, KEYS)
    check.version("state", state, VERSION)
    if state["updater"] != updater:
        raise ValueError(f"state was saved by {state['updater']}, cannot load it into "
                         f"{updater}")
    values: Dict[str, Any] = _checked_counters(state)
    values["calibration_pending"] = check.boolean("state['calibration_pending']",
                                                  state["calibration_pending"])
    return values


def current(state: Any, calibrating: bool) -> Any:
    """``state`` in the current version. Version 1 had no ``bad_batches`` (it counted
    none); versions 1 and 2 had no ``calibration_pending``: ``scale="auto"`` (the loading
    updater's ``calibrating``) is still to measure only in a state saved before the first
    step. Anything else is returned as it is, for :func:`checked` to judge."""
    version = state.get("version") if isinstance(state, Mapping) else None
    if version not in (1, 2):
        return state
    added = {"calibration_pending": calibrating and state.get("steps") == 0}
    if version == 1:
        added["bad_batches"] = 0
    check.exact_keys(f"state (version {version})", state, set(KEYS) - set(added))
    return {**state, **added, "version": VERSION}


def _checked_counters(state: Mapping[str, Any]) -> Dict[str, int]:
    """The updater's counters in ``state``, each an integer >= 0, consistent together."""
    counters = {name: check.integer(f"state[{name!r}]", state[name], ge=0)
                for name in COUNTERS}
    steps, updates, skipped, streak, longest, bad = (counters[name] for name in COUNTERS)
    wrong = [text for broken, text in (
        (updates + skipped != steps,
         f"updates={updates} + skipped_steps={skipped} != steps={steps}"),
        (streak > longest, f"overflow_streak={streak} > longest_overflow_streak={longest}"),
        (streak > skipped, f"overflow_streak={streak} > skipped_steps={skipped}"),
        (longest > skipped, f"longest_overflow_streak={longest} > skipped_steps={skipped}"),
        (bad > skipped, f"bad_batches={bad} > skipped_steps={skipped}"),
    ) if broken]
    if wrong:
        raise ValueError(f"state's counters are inconsistent: {'; '.join(wrong)}")
    return counters


def warn_replaced_settings(policy, state: Mapping[str, Any]) -> None:
    """Logs one warning naming each setting of ``policy`` that loading its ``state``
    replaces, by the name of the updater's option."""
    replaced = policy.replaced_settings(state)
    if replaced:
        values = ", ".join(f"{options.OPTION_OF_SETTING.get(name, name)}={_shown(mine)} "
                           f"with {_shown(saved)}" for name, (mine, saved) in replaced.items())
        logger.warning(f"nnabla_mpt: the loaded state replaces the constructor's {values}")


def _shown(value: Any) -> str:
    """``value`` as an argument would be written: 32768 for 32768.0, 'probe' quoted."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value)
