"""The updaters' settings, one property each, and the checks they share with the
constructors.

nnabla's updater reads its attributes at every ``update()``, so scripts written for it
assign them between steps (a weight-decay schedule, a new accumulation). Every public
setting of the updaters is a property here, listed by name in the step loop's class
(:mod:`nnabla_mpt.step_loop`); reading gives the value in use, from the one place the
step reads it. Assigning either takes effect from the next ``update()``, checked as the
constructor checks it (a *live* setting), or is refused with an ``AttributeError`` that
says what to do instead (:func:`fixed`). While ``update()`` runs (a data feeder, a
monitor or another thread assigning) every assignment is refused (the step loop's
:class:`~nnabla_mpt.step_loop.StepLock`): the running step would mix the old and the new
value. Nothing is ignored.
"""
from typing import Any, Callable, Optional, get_args

from .core import _validate as check
from .scale.bounded_policy import FixedScale
from .step.micro_batch import checked_feeder, install_feeder
from .step.overflow_handling import FloorPolicy, OverflowHandling, check_retries


# -- the checks a setting shares with the constructor ---------------------------------------

def checked_weight_decay(value: Any) -> Optional[float]:
    """``weight_decay``: None or a real number >= 0."""
    return None if value is None else check.real("weight_decay", value, ge=0.0)


def checked_clip_grad_norm(value: Any) -> Optional[float]:
    """``clip_grad_norm``: None or a real number > 0."""
    return None if value is None else check.real("clip_grad_norm", value, gt=0.0)


def checked_accum_grad(value: Any) -> int:
    """``accum_grad``: an integer >= 1."""
    return check.integer("accum_grad", value, ge=1)


_REBUILD = ("build a new updater with it (save_checkpoint, then load_checkpoint into the new "
            "one)")


def fixed(name: str, doc: str, read: Callable[[Any], Any], why: str,
          joint: str = "; ") -> property:
    """A setting the step was built around: ``read(updater)`` gives it; an assignment is
    refused, saying ``why`` and (after ``joint``) to rebuild the updater with it."""
    def refuse(updater: Any, value: Any) -> None:
        raise AttributeError(f"{type(updater).__name__}.{name} cannot be changed after "
                             f"construction ({name} = {value!r} refused): "
                             f"{why}{joint}{_REBUILD}")
    return property(read, refuse, doc=doc)


def given(name: str, read: Callable[[Any], Any]) -> property:
    """An option read as given to the constructor: refused, saying where to pass it."""
    return fixed(name, f"``{name}`` as given to the constructor (read-only).", read,
                 f"pass {name}= to the constructor")


def live(read: Callable[[Any], Any]) -> Callable[[Callable[[Any, Any], None]], property]:
    """Makes the decorated ``apply(updater, value)`` (which checks the value) a live
    setting of its name, documented by its docstring: ``read(updater)`` gives it; an
    assignment runs ``apply`` between steps, under the step's lock (refused during
    ``update()``, :class:`~nnabla_mpt.step_loop.StepLock`)."""
    def setting(apply: Callable[[Any, Any], None]) -> property:
        def assign(updater: Any, value: Any) -> None:
            with updater._lock.held(type(updater).__name__, f"{apply.__name__} = {value!r}"):
                apply(updater, value)
        return property(read, assign, doc=apply.__doc__)
    return setting


# -- the live settings -------------------------------------------------------------------

@live(lambda updater: updater._next_scale)
def scale(updater: Any, value: Any) -> None:
    """The loss scale of the next step (1 once a precision schedule switched to full
    precision; assignable until then, checked by the policy)."""
    if updater._switched():
        schedule = updater._schedule
        raise RuntimeError(f"updater.scale = {value!r} is refused: the precision schedule "
                           f"{schedule.mode.text!r} switched to full precision at step "
                           f"{schedule.switch_step}; those steps run unscaled (scale 1), "
                           f"so there is no loss scale to set")
    if updater._policy.kind == "fixed":      # bounded as the constructor bounds it
        FixedScale(value).policy_for(updater._dtype)
    updater._policy.set_loss_scale(value)
    # it replaces a measurement of scale="auto" still due, which would override it
    updater._meter.calibration_pending = False


@live(lambda updater: updater._data_feeder)
def data_feeder(updater: Any, value: Any) -> None:
    """The feeder given as ``data_feeder=`` (assignable, checked again)."""
    install_feeder(updater, checked_feeder("data_feeder", value))


@live(lambda updater: updater._accum_grad)
def accum_grad(updater: Any, value: Any) -> None:
    """Forward/backward passes whose gradients are summed per update (assignable, from the
    next update())."""
    value = checked_accum_grad(value)
    updater._accum_grad = value
    for recorder, _ in updater._passes.values():
        recorder.set_accum_grad(value)
    updater._unscaler.set_accumulation(value, updater._average_accum)


@live(lambda updater: updater._average_accum)
def average_accum(updater: Any, value: Any) -> None:
    """Whether the accumulated gradients are divided by ``accum_grad`` (assignable)."""
    updater._average_accum = check.boolean("average_accum", value)
    updater._unscaler.set_accumulation(updater._accum_grad, updater._average_accum)


@live(lambda updater: updater._unscaler.weight_decay)
def weight_decay(updater: Any, value: Any) -> None:
    """Weight decay of the unscaled gradients, or None (assignable; a weight-decay schedule
    takes effect from the next update())."""
    updater._unscaler.weight_decay = checked_weight_decay(value)


@live(lambda updater: updater._unscaler.clip)
def clip_grad_norm(updater: Any, value: Any) -> None:
    """The bound of the unscaled gradients' global L2 norm, or None (assignable)."""
    updater._unscaler.clip = checked_clip_grad_norm(value)


@live(lambda updater: updater._clear_buffer)
def clear_buffer(updater: Any, value: Any) -> None:
    """Whether forward and backward free intermediate buffers (assignable)."""
    updater._clear_buffer = check.boolean("clear_buffer", value)


@live(lambda updater: updater._max_retries)
def max_retries(updater: Any, value: Any) -> None:
    """Retries of a skipped step within one update() (assignable)."""
    value = check.integer("max_retries", value, ge=0)
    check_retries(value, updater.enable_overflow_check)
    updater._max_retries = value


@live(lambda updater: updater._collapse.floor_policy)
def floor_policy(updater: Any, value: Any) -> None:
    """What a collapse does, ``"raise"``, ``"warn"`` or ``"ignore"`` (assignable)."""
    updater._collapse.floor_policy = check.choice("floor_policy", value, get_args(FloorPolicy))


@live(lambda updater: updater._collapse.diagnose_after)
def diagnose_after(updater: Any, value: Any) -> None:
    """Consecutive overflowing steps that trigger the diagnosis (assignable)."""
    updater._collapse.diagnose_after = check.integer("diagnose_after", value, ge=1)


# -- what the step was built around --------------------------------------------------------

comm = fixed("comm", "The communicator, or None.", lambda updater: updater._options.comm,
                    "the all-reduce, its buffers and the ranks' agreement are set up for it "
                    "at construction")
grads = fixed("grads", "The gradients reduced across the ranks.",
                     lambda updater: updater._grads,
                     "the step's all-reduce was set up for them at construction")
solver = fixed("solver", "The solver.", lambda updater: updater._solver,
                      "the step checks, unscales and updates through the solver it was "
                      "given and its parameters")
loss = fixed("loss", "The loss Variable.", lambda updater: updater._loss,
                    "the step's passes, seeds and checks were built on its graph")
shared_gradients = fixed(
    "shared_gradients", "The :class:`~nnabla_mpt.SharedGradients` in use (the gradients "
    "``GradientReduction(shared_grads=...)`` placed in shared memory), or None.",
    lambda updater: updater._shared_gradients, "the gradients were placed (or not) in the "
    "communicator's shared memory at construction")
monitor = fixed(
    "monitor", "The step hook given as ``monitor=``, called with every step's result, or "
    "None.", lambda updater: updater._monitor, "a hook whose work changes over the run can "
    "decide inside itself what to do with each result; or", " ")
enable_overflow_check = fixed(
    "enable_overflow_check", "Whether steps are checked for overflow.",
    lambda updater: updater._options.enable_overflow_check,
    "the step's check, its retries and its all-reduce flags were set up with it")
policy = fixed(
    "policy", "The loss-scale policy the step runs (its scale, counters and settings): "
    "the ``policy=`` given, or the one made of nnabla's arguments.",
    lambda updater: updater._policy, "the step's scale and the measured growth read it; "
    "change its scale with updater.scale = ..., or", " ")
schedule = fixed(
    "schedule", "The precision schedule in use (:class:`~nnabla_mpt.PrecisionSchedule`, "
    "the ``schedule=`` given), or None.", lambda updater: updater._schedule,
    "the step's graphs were chosen with it")
overflow = fixed(
    "overflow", "The :class:`~nnabla_mpt.OverflowHandling` in use, its fields as they are "
    "now.", lambda updater: OverflowHandling(
        updater._detector.mode, updater._max_retries, updater._collapse.floor_policy,
        updater._collapse.diagnose_after), "its assignable fields are "
    "settings of their own (updater.max_retries, floor_policy, diagnose_after); for the "
    "others", " ")
reduction = given("reduction", lambda updater: updater._options.reduction)
outputs = given("outputs", lambda updater: updater._options.outputs)
lr_scheduler = given("lr_scheduler", lambda updater: updater._options.lr_scheduler)
gradient_stats_every = given("gradient_stats_every",
                             lambda updater: updater._options.gradient_stats_every)


# -- what the step runs, as it is now -------------------------------------------------

precision = property(lambda updater: "float" if updater._switched() else updater._precision,
                     doc="``\"half\"`` or ``\"float\"``: the precision the next step runs in.")
last_result = property(lambda updater: updater._run.last_result, doc=(
    "The :class:`StepResult` of the last step, or None before the first."))
