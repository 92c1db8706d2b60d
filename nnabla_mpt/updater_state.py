"""The updater's state as plain values: its version, its keys, its checks and the warning
naming the settings a loaded state replaces; and the updater's side of it, its counters
and its methods (``state_dict()``, ``load_state_dict()``, ``save_checkpoint()``,
``load_checkpoint()``), which the step loop's class lists by name.

The rest of this module says what a valid state is. The policy's and
the precision schedule's parts are theirs to check (:mod:`nnabla_mpt.scale.policy`,
:mod:`nnabla_mpt.scale.precision`).
"""
import copy
from typing import Any, Callable, Dict, Mapping, Tuple

from nnabla.logger import logger

from .core import _validate as check
from .files import checkpoint
from .core.dtypes import FloatType
from .scale.scale_history import checked_state

#: The version of the state's format: the first (0.1.0's).
VERSION = 1

#: The updater's counters, integers >= 0.
COUNTERS = ("steps", "updates", "skipped_steps", "overflow_streak",
            "longest_overflow_streak", "bad_batches")
#: Every key of a state of the current version.
KEYS = ("version", "updater", "policy", "precision", "calibration_pending",
        "scale_history") + COUNTERS
#: The policy's settings that nnabla's updater names otherwise, by the option's name.
_OPTION_OF_SETTING = {"growth_factor": "scaling_factor", "growth_interval": "N"}
#: How messages name the policy's part of the state.
POLICY = "state['policy']"


def _counter(name: str, read: Callable[[Any], int], doc: str) -> property:
    """A counter of the updater as a documented attribute, ``read`` from its record of the
    run (which the step loop updates). An assignment is refused with what to do instead:
    the counters hold together (``steps == updates + skipped_steps``), and a state saved
    with one of them set alone would not load."""
    def set_(updater: Any, value: Any) -> None:
        raise AttributeError(
            f"{type(updater).__name__}.{name} = {value!r} refused: the counters are the "
            f"updater's record of its run (steps = updates + skipped_steps), changed by "
            f"update() and by load_state_dict()/load_checkpoint() only; count steps of your "
            f"own in a variable of the script")

    return property(lambda updater: read(updater._run), set_, doc=doc)


#: The step counters an updater keeps and its state saves (``help()`` lists them).
steps = _counter("steps", lambda run: run.steps, "Steps run so far (each ``update()`` runs "
                 "one, whatever its retries): ``updates + skipped_steps``.")
updates = _counter("updates", lambda run: run.updates, "Steps that updated the parameters.")
skipped_steps = _counter("skipped_steps", lambda run: run.skipped_steps, "Steps skipped, "
                         "leaving the parameters and the solver's state as they were: an "
                         "overflow, a batch holding inf/NaN (``bad_batches``) or a gradient "
                         "norm that is not finite.")


def check_all(updater: Any, state: Any) -> Dict[str, Any]:
    """Checks the whole ``state`` for ``updater`` (its class name, its policy, its
    precision schedule, its loss's dtype) without changing anything: the keys, the
    version, the counters' consistency (a fixed policy cannot measure a scale, and
    refuses a state with a calibration due). Returns the counters,
    ``calibration_pending``, ``scale_history`` and ``precision``, the policy's state to
    load (``"policy"``, within the loss's dtype) and the values lowered to fit it
    (``"lowered"``, see :func:`within_dtype`)."""
    name, policy, schedule = type(updater).__name__, updater._policy, updater._schedule
    check.exact_keys("state", state, KEYS)
    check.version("state", state, VERSION)
    if state["updater"] != name:
        raise ValueError(f"state was saved by {state['updater']}, cannot load it into {name}")
    values: Dict[str, Any] = _checked_counters(state)
    pending = check.boolean("state['calibration_pending']", state["calibration_pending"])
    if pending and policy.kind != "dynamic":
        raise ValueError(f"state['calibration_pending'] is True, but {name} has no "
                         f"scale='auto' to measure")
    values["calibration_pending"] = pending
    values["scale_history"] = checked_state("state['scale_history']", state["scale_history"])
    if (state["precision"] is None) != (schedule is None):
        mine = None if schedule is None else schedule.mode.text
        raise ValueError(f"state has precision schedule {state['precision']!r} but this "
                         f"updater has {mine!r}")
    copy.copy(policy).load_state_dict(state["policy"], name=POLICY)
    values["policy"], values["lowered"] = within_dtype(state["policy"], updater._dtype)
    if schedule is not None:
        copy.copy(schedule).load_state_dict(state["precision"])
    values["precision"] = state["precision"]
    return values


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


def warn_replaced_settings(policy, policy_state: Mapping[str, Any],
                           calibration_pending: bool, auto_scale: bool) -> None:
    """Logs one warning naming each setting of the loading updater that its state
    replaces, by the name of the updater's option: the settings of ``policy`` that
    ``policy_state`` changes, and ``scale`` where the state still has ``scale="auto"`` to
    measure (``calibration_pending``) and the updater was given a number (not
    ``auto_scale``)."""
    replaced = [(_OPTION_OF_SETTING.get(name, name), mine, saved)
                for name, (mine, saved) in policy.replaced_settings(policy_state).items()]
    if calibration_pending and not auto_scale:
        replaced.append(("scale", policy.loss_scale, "auto"))
    if replaced:
        values = ", ".join(f"{name}={_shown(mine)} with {_shown(saved)}"
                           for name, mine, saved in replaced)
        logger.warning(f"nnabla_mpt: the loaded state replaces the constructor's {values}")


def within_dtype(policy_state: Mapping[str, Any], dtype: FloatType,
                 name: str = POLICY) -> Tuple[Dict[str, Any], Dict[str, float]]:
    """``policy_state``, a policy's state already checked, with its ``scale`` and
    ``max_scale`` lowered to the largest power of two ``dtype`` (the loss's) holds, as
    the constructor bounds them (a state of a float32 run loaded into a float16
    updater); and the values lowered, ``key -> value in the state``.

    Raises:
        ValueError: its ``min_scale`` lies outside what ``dtype`` can seed (above that
            power of two, or below its smallest positive value); the message names the
            key (``name``) and the value.
    """
    ceiling = dtype.max_power_of_two
    low = policy_state.get("min_scale")
    if low is not None and not dtype.smallest <= low <= ceiling:
        raise ValueError(f"{name}['min_scale']={_shown(low)} lies outside what the loss's "
                         f"dtype {dtype.name} can seed, [{_shown(dtype.smallest)}, "
                         f"{_shown(ceiling)}]: backward(scale) seeds the pass in that dtype")
    lowered = {key: policy_state[key] for key in ("scale", "max_scale")
               if policy_state.get(key, 0.0) > ceiling}
    return {**policy_state, **{key: ceiling for key in lowered}}, lowered


def warn_lowered(lowered: Mapping[str, float], dtype: FloatType, name: str = POLICY) -> None:
    """Logs one warning naming the values of a loaded state that :func:`within_dtype`
    lowered; none without any."""
    if lowered:
        values = " and ".join(f"{name}[{key!r}]={_shown(value)}"
                              for key, value in lowered.items())
        logger.warning(f"nnabla_mpt: the loaded {values} "
                       f"{'is' if len(lowered) == 1 else 'are'} above "
                       f"{_shown(dtype.max_power_of_two)}, the largest power of two the "
                       f"loss's dtype {dtype.name} holds (backward(scale) seeds the pass in "
                       f"that dtype, where a larger scale overflows every step): lowered to "
                       f"{_shown(dtype.max_power_of_two)}")


def _shown(value: Any) -> str:
    """``value`` as an argument would be written, compact and exact: 32768 for 32768.0,
    1e+308 (not its 309 digits), 'probe' quoted."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


# -- the updater's side: its methods (listed by name in the step loop's class) ----------

def state_dict(self) -> Dict[str, Any]:
    """The updater's whole state as plain Python values, versioned: the policy's (scale,
    counters, bounds), the precision schedule's, the updater's counters, whether
    ``scale="auto"`` is still to measure (``calibration_pending``) and measured growth's
    history (``scale_history``), all of one step: called from another thread during
    ``update()`` it waits for the step to end; from the step's own feeder or monitor it
    is refused (``RuntimeError``). Parameters and solver states: :meth:`save_checkpoint`."""
    with self._lock.held(type(self).__name__, "state_dict()", save=True):
        return _state_of(self)


def _state_of(self) -> Dict[str, Any]:
    """:func:`state_dict` with the updater to itself."""
    return {"version": VERSION, "updater": type(self).__name__,
            "policy": self._policy.state_dict(),
            "precision": None if self._schedule is None else self._schedule.state_dict(),
            **{name: getattr(self, name) for name in COUNTERS},      # as the updater shows them
            **self._meter.state_dict()}


def load_state_dict(self, state: Mapping[str, Any]) -> None:
    """Restores what :meth:`state_dict` returned; all or nothing. The policy's settings
    (``N``, ``max_scale``, ...) come from ``state``, and a calibration still due makes
    the next step measure (``scale="auto"``) where this updater was given a number: one
    warning names each setting replaced; a scale the loss's dtype cannot seed is
    lowered, with a warning (:func:`within_dtype`). Refused during ``update()`` (from its
    feeder, its monitor or another thread).

    Raises:
        ValueError: keys are missing or unknown (the message lists them), the version
            or the updater type differs, a value is out of range (named by its key,
            ``state['policy']['scale']``), or the counters contradict each other.
        TypeError: a value has the wrong type (a counter that is no integer,
            ``calibration_pending`` that is no bool); the message names it.
    """
    with self._lock.held(type(self).__name__, "load_state_dict()"):
        _apply_state(self, check_all(self, state))


def _apply_state(self, checked: Mapping[str, Any]) -> None:
    """Loads a state :func:`check_all` checked into the updater, with the updater to
    itself."""
    policy_state = checked["policy"]
    warn_lowered(checked["lowered"], self._dtype)
    warn_replaced_settings(self._policy, policy_state, checked["calibration_pending"],
                           self._meter.auto_scale)
    self._policy.load_state_dict(policy_state, name=POLICY)
    if self._schedule is not None:
        self._schedule.load_state_dict(checked["precision"])
    self._run.steps, self._run.updates, self._run.skipped_steps = (
        checked["steps"], checked["updates"], checked["skipped_steps"])
    self._meter.load_state_dict(checked)
    self._collapse.overflow_streak = checked["overflow_streak"]
    self._collapse.longest_overflow_streak = checked["longest_overflow_streak"]
    self._collapse.bad_batches = checked["bad_batches"]


def save_checkpoint(self, path: str) -> None:
    """Writes parameters, solver states and updater state to ``path`` atomically, all of
    one step (from another thread during ``update()`` it waits for the step, as
    :meth:`state_dict` does).

    Written beside ``path`` as ``.<name>.tmp`` (a killed save's is replaced), flushed
    and renamed over ``path``: a crash leaves the previous checkpoint or the new one.
    A new file gets the umask's permissions, an existing one keeps its own, a
    symlink's target is replaced. The format: :mod:`nnabla_mpt.files.checkpoint`.

    Raises:
        TypeError, ValueError: ``path`` is not a path (not a str or PathLike, '', NUL).
        OSError: no folder, or a folder, FIFO, device or socket at ``path`` (left as it
            is; checked first), or writing failed (the old file stays); names ``path``.
        RuntimeError: called from the feeder or the monitor of a running ``update()``.
    """
    with self._lock.held(type(self).__name__, "save_checkpoint()", save=True):
        checkpoint.save(path, self._params, self._solver, _state_of(self))


def load_checkpoint(self, path: str) -> None:
    """Restores what :meth:`save_checkpoint` wrote: parameters, solver states, state;
    all checked first, each array from its header before it is read (settings it
    changes are logged as by :meth:`load_state_dict`).

    Raises:
        OSError, TypeError: as :meth:`save_checkpoint` (no file: ``FileNotFoundError``).
        ValueError: the file is not an nnabla_mpt checkpoint, is corrupted, holds inf or
            NaN, or its parameters, solver states or updater state do not match this
            updater (the message names ``path`` and the arrays). Nothing is changed.
    """
    with self._lock.held(type(self).__name__, "load_checkpoint()"):
        _apply_state(self, checkpoint.load(path, self._params, self._solver,
                                           lambda loaded: check_all(self, loaded)))
