"""The updaters' settings a script may change between steps.

nnabla's updater reads its attributes at every ``update()``, so scripts written for it
assign them between steps (a weight-decay schedule, a new accumulation). Here each
setting is a property: an assignment is checked as the constructor checks the option
(:mod:`nnabla_mpt.options`) and takes effect from the next ``update()``; a setting the
step was built around (the communicator, the gradients it reduces, the graphs) refuses
the assignment with an ``AttributeError`` that says what to do instead. Nothing is ignored.

The values live in the updater's ``_<name>`` attributes, which the step loop reads, or only
where the step reads them (the unscaler's, the policy's).
"""
from operator import attrgetter
from typing import Any, Callable, Optional, Tuple

from . import options


def live(name: str, doc: str, apply: Optional[Callable[[Any, Any], None]] = None,
         check: Optional[Callable[[Any, Any], Any]] = None,
         kept: Optional[Tuple[str, str]] = None) -> property:
    """A setting that takes effect from the next ``update()``: the assignment is refused
    while ``update()`` runs (a feeder or a monitor assigning would mix the old and the new
    value in the running step), checked by the option's check (or
    ``check(updater, value)``), then ``apply(updater, value)`` hands it to the part of the
    step that uses it. The value lives in the updater's ``_<name>``, or, with
    ``kept=(owner, field)``, only in ``updater.<owner>.<field>`` (set there unless
    ``apply`` sets it), the one place the step reads it from."""
    option = options.option_named(name)
    owner, field = kept if kept is not None else (None, "_" + name)

    def holder(updater: Any) -> Any:
        return updater if owner is None else getattr(updater, owner)

    def assign(updater: Any, value: Any) -> None:
        if not updater._idle:      # update() holds the token: a feeder or monitor assigns
            raise RuntimeError(f"{type(updater).__name__}.{name} = {value!r} refused during "
                               f"update() (from a data_feeder or a monitor): assign it "
                               f"between update() calls; it takes effect from the next one")
        value = option.check(name, value) if check is None else check(updater, value)
        if apply is not None:
            apply(updater, value)
        if apply is None or owner is None:
            setattr(holder(updater), field, value)

    if owner is None:
        return property(attrgetter(field), assign, doc=doc)
    return property(lambda updater: getattr(holder(updater), field), assign, doc=doc)


def fixed(name: str, doc: str, instead: str) -> property:
    """A setting the step was built around: reading gives it, assigning raises
    ``AttributeError`` saying ``instead``, what to do."""
    def assign(updater: Any, value: Any) -> None:
        raise AttributeError(f"{type(updater).__name__}.{name} cannot be changed after "
                             f"construction ({name} = {value!r} refused): {instead}")

    return property(attrgetter("_" + name), assign, doc=doc)


_REBUILD = "build a new updater with it (save_checkpoint, then load_checkpoint into the new one)"

#: The options a dynamic updater's policy keeps (a loaded state may change them).
IN_POLICY = ("backoff_factor", "hysteresis", "min_scale", "max_scale", "growth_mode")


def _accum_grad(updater: Any, value: int) -> None:
    for recorder, _ in updater._passes.values():
        recorder.set_accum_grad(value)
    updater._unscaler.accum_divisor = value if updater._average_accum else 1


def _average_accum(updater: Any, value: bool) -> None:
    updater._unscaler.accum_divisor = updater._accum_grad if value else 1


def _max_retries(updater: Any, value: Any) -> int:
    value = options.option_named("max_retries").check("max_retries", value)
    options.check_retries(value, updater.enable_overflow_check)
    return value


class UpdaterSettings:
    """The settings of both updaters (a mixin of the step loop's class)."""

    accum_grad = live("accum_grad", "Forward/backward passes whose gradients are summed "
                      "per update (assignable: from the next update()).", _accum_grad)
    average_accum = live("average_accum", "Whether the accumulated gradients are divided "
                         "by ``accum_grad`` (assignable).", _average_accum)
    weight_decay = live("weight_decay", "Weight decay of the unscaled gradients, or None "
                        "(assignable: a weight-decay schedule takes effect from the next "
                        "update()).", kept=("_unscaler", "weight_decay"))
    clip_grad_norm = live("clip_grad_norm", "The bound of the unscaled gradients' global L2 "
                          "norm, or None (assignable).", kept=("_unscaler", "clip"))
    clear_buffer = live("clear_buffer", "Whether forward and backward free intermediate "
                        "buffers (assignable).")
    max_retries = live("max_retries", "Retries of a skipped step within one update() "
                       "(assignable).", check=_max_retries)
    comm = fixed("comm", "The communicator, or None.", "the all-reduce, its buffers and the "
                 "ranks' agreement are set up for it at construction; " + _REBUILD)
    grads = fixed("grads", "The gradients reduced across the ranks.", "the step's all-reduce "
                  "was set up for them at construction; " + _REBUILD)
    average_ranks = fixed("average_ranks", "Whether the all-reduce divides by the ranks.",
                          "it is part of the all-reduce set up at construction (and of "
                          "the measured scale's bounds); " + _REBUILD)
    solver = fixed("solver", "The solver.", "the step checks, unscales and updates through "
                   "the solver it was given and its parameters; " + _REBUILD)
    loss = fixed("loss", "The loss Variable.", "the step's passes, seeds and checks were "
                 "built on its graph; " + _REBUILD)
    shared_grads = fixed("shared_grads", "The :class:`~nnabla_mpt.SharedGradients` in use, "
                         "or None.", "the gradients were placed (or not) in the "
                         "communicator's shared memory at construction; " + _REBUILD)
    high_precision_loss = fixed("high_precision_loss", "The full-precision loss of the "
                                "precision schedule, or None.", "the schedule's passes were "
                                "built on its graph; " + _REBUILD)
    monitor = fixed("monitor", "The step hook given as ``monitor=``, called with every "
                    "step's result, or None.", "a hook whose work changes over the run can "
                    "decide inside itself what to do with each result; or " + _REBUILD)
    enable_overflow_check = fixed("enable_overflow_check", "Whether steps are checked for "
                                  "overflow.", "the step's check, its retries and its "
                                  "all-reduce flags were set up with it; " + _REBUILD)


def _scaling_factor(updater: Any, value: float) -> None:
    policy = updater.policy
    if policy.backoff_factor == 1.0 / policy.growth_factor:   # the default: it follows
        policy.backoff_factor = 1.0 / value
    policy.growth_factor = value


class DynamicSettings(UpdaterSettings):
    """The settings of the dynamic updater: nnabla's ``scaling_factor`` and ``N`` as well,
    kept by its policy."""

    scaling_factor = live("scaling_factor", "Growth factor of the scale (assignable; also "
                          "the back-off where it is ``1 / scaling_factor``, the default).",
                          _scaling_factor, kept=("policy", "growth_factor"))
    N = live("N", "Consecutive good steps before the scale grows (assignable; a count "
             "already at the new N grows at the next good step).",
             lambda updater, value: updater.policy.set_growth_interval(value),
             kept=("policy", "growth_interval"))


def constructor_only(name: str) -> property:
    """An option that is neither a live setting nor one of those :func:`fixed` explains:
    reading gives the value in use (the policy's, or the constructor's), assigning raises
    ``AttributeError`` naming it, where before such an assignment was ignored."""
    def read(updater: Any) -> Any:
        if name in IN_POLICY:
            return getattr(updater.policy, name)
        return updater._options[name]

    def assign(updater: Any, value: Any) -> None:
        carried = " (a loaded state carries it too)" if name in IN_POLICY else ""
        raise AttributeError(f"{type(updater).__name__}.{name} is set at construction only "
                             f"({name} = {value!r} refused): pass {name}= to the "
                             f"constructor{carried}; " + _REBUILD)

    return property(read, assign, doc=f"``{name}`` as given to the constructor (read-only).")


def guarded(signature: "options.UpdaterSignature") -> Callable[[type], type]:
    """Class decorator: gives the class a :func:`constructor_only` property for every
    option of ``signature`` it has no attribute of."""
    def guard(cls: type) -> type:
        for name in signature.options:
            if not hasattr(cls, name):
                setattr(cls, name, constructor_only(name))
        return cls

    return guard
