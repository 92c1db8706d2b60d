"""The updaters' settings: one table says, for each, whether a script may change it.

nnabla's updater reads its attributes at every ``update()``, so scripts written for it
assign them between steps (a weight-decay schedule, a new accumulation). Every public
setting of the updaters is a row of :data:`BOTH` or :data:`DYNAMIC` and becomes a property
(:func:`install`): reading gives the value in use, from the one place the step reads it;
assigning either takes effect from the next ``update()``, checked as the constructor checks
it (a *live* setting), or is refused with an ``AttributeError`` that says what to do
instead. While ``update()`` runs (a data feeder or a monitor assigning) every assignment
is refused: the running step would mix the old and the new value. Nothing is ignored.
"""
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import Any, Callable, Iterator, Optional, Sequence

from . import options
from .core import _validate as check
from .scale.bounded_policy import fixed_policy
from .step.feeder import install_feeder
from .step.overflow_handling import FLOOR_POLICIES, check_retries


def _set_path(path: str, updater: Any, value: Any) -> None:
    owner, _, name = path.rpartition(".")
    setattr(attrgetter(owner)(updater) if owner else updater, name, value)


@dataclass(frozen=True)
class Setting:
    """One public setting of the updaters.

    Attributes:
        name: The attribute's name.
        doc: What it is (its property's docstring).
        read: Where the step reads it, as an attribute path from the updater
            (``"_unscaler.weight_decay"``), or ``read(updater)``.
        live: Whether an assignment takes effect from the next ``update()``.
        check: ``check(updater, value)`` returns the value to use or raises naming the
            setting; by default the constructor option's check.
        take: ``take(updater, value)`` hands a checked value to the step; by default it is
            set at ``read``.
        instead: For a setting that is not live: what to do instead of assigning.
    """
    name: str
    doc: str
    read: Any
    live: bool = False
    check: Optional[Callable[[Any, Any], Any]] = None
    take: Optional[Callable[[Any, Any], None]] = None
    instead: str = ""

    def as_property(self) -> property:
        """The setting as a property of an updater class."""
        read = attrgetter(self.read) if isinstance(self.read, str) else self.read
        return property(read, self._assign, doc=self.doc)

    def _assign(self, updater: Any, value: Any) -> None:
        owner, name = type(updater).__name__, self.name
        if not self.live:
            raise AttributeError(f"{owner}.{name} cannot be changed after construction "
                                 f"({name} = {value!r} refused): {self.instead}")
        with updater._between_steps(f"{name} = {value!r}"):
            value = (options.option_named(name).check(name, value) if self.check is None
                     else self.check(updater, value))
            (self.take or partial(_set_path, self.read))(updater, value)


class OneAtATime:
    """One step, setting change or state load at a time, in one thread (a mixin of the
    step loop's class): :meth:`_enter` takes the updater's lock, or refuses."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: Optional[int] = None      # the thread holding the lock, if any

    def _enter(self, what: str) -> None:
        """Takes the updater for ``what`` (``"update()"``, ``"weight_decay = 0.5"``, named
        in the ``RuntimeError`` that refuses it while it is taken); :meth:`_leave` gives it
        back."""
        if not self._lock.acquire(blocking=False):
            raise _refused(f"{type(self).__name__}.{what}",
                           self._running == threading.get_ident())
        self._running = threading.get_ident()

    def _leave(self) -> None:
        """Gives back what :meth:`_enter` took."""
        self._running = None
        self._lock.release()

    @contextmanager
    def _between_steps(self, what: str) -> Iterator[None]:
        """Runs the body with the updater to itself (:meth:`_enter`)."""
        self._enter(what)
        try:
            yield
        finally:
            self._leave()


def _refused(what: str, this_thread: bool) -> RuntimeError:
    """The error of ``what`` tried while the updater runs a step, in this thread (from a
    feeder or a monitor) or in another one."""
    if what.endswith(".update()"):
        where = ("it was called from inside update() (a monitor hook or a data_feeder); "
                 "one updater runs one step at a time, so take the next step after "
                 "update() has returned" if this_thread else
                 "in another thread: one updater runs one step at a time (nnabla's graphs "
                 "and gradients are not safe to share between threads); call update() from "
                 "one thread, or give each thread an updater of its own graph")
        return RuntimeError(f"{what} is already running{':' if this_thread else ''} {where}")
    then = ("assign it between update() calls; it takes effect from the next one"
            if " = " in what else "call it between update() calls")
    if this_thread:
        return RuntimeError(f"{what} refused during update() (from a data_feeder or a "
                            f"monitor): {then}")
    return RuntimeError(f"{what} refused: update() is running in another thread; {then}, "
                        f"from the thread that calls update()")


def install(cls: type, table: Sequence[Setting]) -> type:
    """Gives ``cls`` a property for every setting of ``table``."""
    for setting in table:
        setattr(cls, setting.name, setting.as_property())
    return cls


_REBUILD = "build a new updater with it (save_checkpoint, then load_checkpoint into the new one)"


def _built_around(name: str, doc: str, read: str, why: str, joint: str = "; ") -> Setting:
    """A setting the step was built around: refused, saying why and to rebuild."""
    return Setting(name, doc, read, instead=f"{why}{joint}{_REBUILD}")


def _given(name: str, read: str, spelling: Optional[str] = None) -> Setting:
    """An option read as given to the constructor: refused, saying where to pass it."""
    where = spelling or f"{name}="
    return Setting(name, f"``{name}`` as given to the constructor (read-only).", read,
                   instead=f"pass {where} to the constructor; {_REBUILD}")


def _accum_grad(updater: Any, value: int) -> None:
    updater._accum_grad = value
    for recorder, _ in updater._passes.values():
        recorder.set_accum_grad(value)
    updater._unscaler.set_accumulation(value, updater._average_accum)


def _average_accum(updater: Any, value: bool) -> None:
    updater._average_accum = value
    updater._unscaler.set_accumulation(updater._accum_grad, value)


def _max_retries(updater: Any, value: Any) -> int:
    value = check.integer("max_retries", value, ge=0)
    check_retries(value, updater.enable_overflow_check)
    return value


def _scale(updater: Any, value: Any) -> Any:
    if updater._switched():
        schedule = updater._schedule
        raise RuntimeError(f"updater.scale = {value!r} is refused: the precision schedule "
                           f"{schedule.mode.text!r} switched to full precision at step "
                           f"{schedule.switch_step}; those steps run unscaled (scale 1), so "
                           f"there is no loss scale to set")
    if updater._policy.kind == "fixed":      # bounded as the constructor bounds it
        fixed_policy(value, value, updater._dtype)
    return value


def _take_scale(updater: Any, value: float) -> None:
    """The scale set (checked by the policy); it replaces a measurement of
    ``scale="auto"`` still due, which would otherwise override it at the next step."""
    updater._policy.set_loss_scale(value)
    updater._meter.calibration_pending = False


def _scaling_factor(updater: Any, value: float) -> None:
    policy = updater._policy
    if policy.backoff_factor == 1.0 / policy.growth_factor:   # the default: it follows
        policy.backoff_factor = 1.0 / value
    policy.growth_factor = value


def _moved(old: str, read: Any) -> Setting:
    """An option whose keyword moved into an object: read-only, saying its new spelling."""
    return _given(old, read, options.new_spelling(old))


#: The settings of both updaters.
BOTH = (
    Setting("scale", "The loss scale of the next step (1 once a precision schedule switched "
            "to full precision; assignable until then, checked by the policy).",
            "_next_scale", live=True, check=_scale, take=_take_scale),
    Setting("data_feeder", "The feeder given as ``data_feeder=`` (assignable, checked "
            "again).", "_data_feeder", live=True, take=install_feeder),
    Setting("accum_grad", "Forward/backward passes whose gradients are summed per update "
            "(assignable: from the next update()).", "_accum_grad", live=True,
            take=_accum_grad),
    Setting("average_accum", "Whether the accumulated gradients are divided by "
            "``accum_grad`` (assignable).", "_average_accum", live=True,
            check=lambda updater, value: check.boolean("average_accum", value),
            take=_average_accum),
    Setting("weight_decay", "Weight decay of the unscaled gradients, or None (assignable: a "
            "weight-decay schedule takes effect from the next update()).",
            "_unscaler.weight_decay", live=True),
    Setting("clip_grad_norm", "The bound of the unscaled gradients' global L2 norm, or None "
            "(assignable).", "_unscaler.clip", live=True),
    Setting("clear_buffer", "Whether forward and backward free intermediate buffers "
            "(assignable).", "_clear_buffer", live=True),
    Setting("max_retries", "Retries of a skipped step within one update() (assignable).",
            "_max_retries", live=True, check=_max_retries),
    Setting("floor_policy", "``\"raise\"``, ``\"warn\"`` or ``\"ignore\"``: what a collapse "
            "does (assignable).", "_collapse.floor_policy", live=True,
            check=lambda updater, value: check.choice("floor_policy", value, FLOOR_POLICIES)),
    Setting("diagnose_after", "Consecutive overflowing steps that trigger the diagnosis "
            "(assignable).", "_collapse.diagnose_after", live=True,
            check=lambda updater, value: check.integer("diagnose_after", value, ge=1)),
    _built_around("comm", "The communicator, or None.", "_options.comm", "the all-reduce, "
                  "its buffers and the ranks' agreement are set up for it at construction"),
    _built_around("grads", "The gradients reduced across the ranks.", "_grads",
                  "the step's all-reduce was set up for them at construction"),
    _built_around("solver", "The solver.", "_solver", "the step checks, unscales and updates "
                  "through the solver it was given and its parameters"),
    _built_around("loss", "The loss Variable.", "_loss", "the step's passes, seeds and checks "
                  "were built on its graph"),
    _built_around("shared_grads", "The :class:`~nnabla_mpt.SharedGradients` in use, or None.",
                  "_shared_grads", "the gradients were placed (or not) in the communicator's "
                  "shared memory at construction"),
    _built_around("monitor", "The step hook given as ``monitor=``, called with every step's "
                  "result, or None.", "_monitor", "a hook whose work changes over the run can "
                  "decide inside itself what to do with each result; or", " "),
    _built_around("enable_overflow_check", "Whether steps are checked for overflow.",
                  "_options.enable_overflow_check", "the step's check, its retries and its "
                  "all-reduce flags were set up with it"),
    _built_around("detector", "The :class:`~nnabla_mpt.OverflowDetector` the step checks "
                  "with (``detector.nonfinite_params(...)`` names overflowing gradients).",
                  "_detector", "the step's overflow check was built on it (its mode is "
                  "OverflowHandling.mode)"),
    _built_around("average_ranks", "Whether the all-reduce divides by the ranks.",
                  "_options.reduction.average_ranks", "it is part of the all-reduce set up at "
                  "construction (and of the measured scale's bounds)"),
    _built_around("high_precision_loss", "The full-precision loss of the precision schedule, "
                  "or None.", "_high_precision_loss", "the schedule's passes were built on "
                  "its graph"),
    _built_around("policy", "The loss-scale policy the step runs (its scale, counters and "
                  "settings).", "_policy", "the step's scale and the measured growth read "
                  "it; change its scale with updater.scale = ..., or", " "),
    _built_around("schedule", "The precision schedule in use "
                  "(:class:`~nnabla_mpt.PrecisionSchedule`), or None.", "_schedule",
                  "the step's graphs were chosen with it"),
    _built_around("overflow", "The :class:`~nnabla_mpt.OverflowHandling` in use, its fields "
                  "as they are now.", "_overflow_handling", "its assignable fields are "
                  "settings of their own (updater.max_retries, floor_policy, diagnose_after); "
                  "for the others", " "),
    _built_around("reduction", "The :class:`~nnabla_mpt.GradientReduction` in use, its fields "
                  "as they are now.", "_gradient_reduction", "average_accum is a setting of "
                  "its own (updater.average_accum = ...); for the others", " "),
    _given("outputs", "_options.outputs"),
    _given("lr_scheduler", "_options.lr_scheduler"),
    _given("gradient_stats_every", "_options.gradient_stats_every"),
    _moved("overflow_mode", "_detector.mode"),
    _moved("all_reduce_callback", "_options.reduction.all_reduce_callback"),
    _moved("abort_on_exception", "_options.reduction.abort_on_exception"),
    _moved("accelerate_train_mode",
           lambda updater: updater._schedule and updater._schedule.mode.text),
    _moved("total_steps", lambda updater: updater._schedule and updater._schedule.total_steps),
    _moved("final_loss", lambda updater: updater._schedule and updater._schedule.final_loss),
)

#: The settings of the dynamic updater besides :data:`BOTH`: nnabla's ``scaling_factor``
#: and ``N``, and its policy's settings, kept by its policy.
DYNAMIC = (
    Setting("scaling_factor", "Growth factor of the scale (assignable; also the back-off "
            "where it is ``1 / scaling_factor``, the default).", "_policy.growth_factor",
            live=True, take=_scaling_factor),
    Setting("N", "Consecutive good steps before the scale grows (assignable; a count "
            "already at the new N grows at the next good step).", "_policy.growth_interval",
            live=True, take=lambda updater, value: updater._policy.set_growth_interval(value)),
    _given("growth_mode", "_policy.growth_mode"),
) + tuple(_moved(name, f"_policy.{name}")
          for name in ("min_scale", "max_scale", "backoff_factor", "hysteresis"))
