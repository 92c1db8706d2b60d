"""The updaters' arguments: each one named, defaulted, checked and documented here, once.

Both updaters take their arguments through an :class:`UpdaterSignature`: after
``solver`` and ``loss``, the positional arguments in the order of nnabla's own updater
(drop-in), then a few keyword-only options, each one thing: the scale policy, the overflow
handling, the gradient reduction, the precision schedule are objects of their own, which
check their fields themselves. :meth:`UpdaterSignature.bind` checks every value and returns
them as one :class:`UpdaterOptions`; :meth:`UpdaterSignature.signature` is what ``inspect``
and the API docs show, and :meth:`UpdaterSignature.describe` writes the ``Args:`` entries
into the updater's docstring. Keywords that moved into those objects still work for one
release, with a ``DeprecationWarning`` naming their new spelling (:data:`MOVED`).
"""
import inspect
import textwrap
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Literal, Mapping, Optional, Sequence, Tuple, Union

import nnabla as nn

from .core import _validate as check
from .monitoring import checked_step_hook
from .distributed import gradient_reduction as reduction
from .distributed.gradient_reduction import GradientReduction
from .scale.bounded_policy import OPTIONS as POLICY_OPTIONS, policy_settings
from .scale.policy import (DEFAULT_MAX_SCALE, DEFAULT_MIN_SCALE, GROWTH_MODES,
                           DynamicLossScale, FixedLossScale, GrowthMode)
from .scale.precision import PrecisionSchedule
from .step.feeder import checked_feeder
from .step.overflow_handling import OverflowHandling
from .step.step_loss import checked_outputs
from .step.unscale import checked_lr_scheduler


@dataclass(frozen=True)
class Option:
    """One argument of the updaters.

    Attributes:
        name: The argument's name.
        default: Its default value.
        annotation: Its type, as the signature shows it.
        doc: Its documentation (the text of its ``Args:`` entry).
        check: ``check(name, value)`` returns the value to use or raises ``TypeError`` /
            ``ValueError`` naming the argument and the value.
    """
    name: str
    default: Any
    annotation: Any
    doc: str
    check: Callable[[str, Any], Any]


def _optional(check_value: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    return lambda name, value: None if value is None else check_value(name, value)


def _real(**bounds) -> Callable[[str, Any], float]:
    return lambda name, value: check.real(name, value, **bounds)


def _integer(ge: int) -> Callable[[str, Any], int]:
    return lambda name, value: check.integer(name, value, ge=ge)


def _instance(cls: type, default: Any = None) -> Callable[[str, Any], Any]:
    """A check that a value is None (which stands for ``default``) or a ``cls``."""
    def checked(name: str, value: Any) -> Any:
        if value is None:
            return default
        if isinstance(value, cls):
            return value
        raise TypeError(f"{name} must be None or a nnabla_mpt.{cls.__name__}, got {value!r} "
                        f"of type {type(value).__name__}")
    return checked


DATA_FEEDER = Option(
    "data_feeder", None, Optional[Callable[[], Any]],
    "Called with no arguments before every forward to load the next batch into the input "
    "Variables (``x.d = ...``); what it returns is ignored. None when the inputs are "
    "already filled. One that needs an argument is refused (``TypeError``); one that "
    "returns something (the batch, instead of writing it) is warned about at its first "
    "call.", checked_feeder)


def _scale_or_auto(name: str, value: Any) -> Any:
    if isinstance(value, str):
        if value != "auto":
            raise ValueError(f"{name} must be a positive number or 'auto', got {value!r}")
        return value
    return check.real(name, value, gt=0.0)


#: What a scale the loss's dtype rounds does, said by both updaters' ``scale``.
_ROUNDED = (" A scale the loss's dtype holds only rounded (3000.7 is 3000 in float16) seeds "
            "the pass rounded, and the gradients are divided by that rounded value "
            "(:func:`~nnabla_mpt.scale.seed.held_scale`).")

SCALE = Option(
    "scale", 8.0, Union[float, Literal["auto"]],
    "The initial loss scale, or ``\"auto\"``: measured on the first step's own batch "
    "(see :doc:`measured`; until then :attr:`scale` reads the upper bound); a batch whose "
    "loss, or whose gradients at any scale, are not finite is not measured, and the next "
    "step measures its own. A scale above "
    "the largest power of two the loss's dtype holds (``2**15`` for float16) is lowered to "
    "it, with an info line." + _ROUNDED, _scale_or_auto)
FIXED_SCALE = Option("scale", 128.0, float, "The loss scale; ``>= 1``." + _ROUNDED,
                     lambda name, value: FixedLossScale(value).loss_scale)
SCALING_FACTOR = Option("scaling_factor", 2.0, float, "Growth factor of the scale (> 1).",
                        _real(gt=1.0))
N = Option("N", 2000, int,
           "Consecutive good steps before the scale grows by ``scaling_factor``.",
           _integer(1))
ENABLE_OVERFLOW_CHECK = Option(
    "enable_overflow_check", True, bool,
    "Skip overflowing steps (the scale stays). False: no check, for harmless overflow; a "
    "step whose clipping norm is not finite (``clip_grad_norm=``) is skipped all the same.",
    check.boolean)
CLEAR_BUFFER = Option("clear_buffer", True, bool,
                      "Free intermediate buffers during forward and backward.", check.boolean)
ACCUM_GRAD = Option("accum_grad", 1, int,
                    "Forward/backward passes whose gradients are summed per update.",
                    _integer(1))
WEIGHT_DECAY = Option("weight_decay", None, Optional[float],
                      "Weight decay applied to the unscaled gradients, or None.",
                      _optional(_real(ge=0.0)))
COMM = Option(
    "comm", None, Any,
    "A communicator (``MPICommunicator``, or nnabla's "
    "``MultiProcessDataParallelCommunicator``) for data-parallel training, or None.",
    reduction.communicator)
GRADS = Option("grads", None, Optional[Sequence[nn.NdArray]],
               "Gradients to all-reduce with ``comm``; None means those of all the "
               "solver's parameters. Without ``comm`` there is nothing to reduce: a "
               "non-empty list is ignored with a warning (accepted, as nnabla's updater "
               "accepts it), ``[]`` (nnabla's default) silently.", reduction.ndarrays)

GROWTH_MODE = Option(
    "growth_mode", "probe", GrowthMode,
    "``\"probe\"`` (default): grow by ``scaling_factor`` after ``N`` good steps, as "
    "nnabla's updater does; ``\"measured\"``: on the step where growth is due, watch the "
    "backward pass and grow by as many factors as the gradients leave room for, possibly "
    "none (see :doc:`measured`).", lambda name, value: check.choice(name, value, GROWTH_MODES))
POLICY = Option(
    "policy", None, Optional[DynamicLossScale],
    "The scale policy's settings as a :class:`~nnabla_mpt.DynamicLossScale`: ``init_scale``, "
    "``growth_factor``, ``backoff_factor``, ``growth_interval``, ``hysteresis``, "
    "``min_scale``, ``max_scale``, ``growth_mode``. The updater runs a policy of its own "
    "built from them (``updater.policy``), with ``max_scale`` bounded by what the loss's "
    "dtype can seed. Given with it, ``scale`` may only be ``\"auto\"`` and ``scaling_factor``, "
    "``N`` and ``growth_mode`` not at all: the policy holds them. None (default): the policy "
    "of ``scale``, ``scaling_factor``, ``N`` and ``growth_mode``, backing off by "
    f"``1 / scaling_factor`` between ``min_scale={DEFAULT_MIN_SCALE:g}`` and "
    f"``max_scale=2**{int(DEFAULT_MAX_SCALE).bit_length() - 1}``.",
    _instance(DynamicLossScale))
OVERFLOW = Option(
    "overflow", OverflowHandling(), OverflowHandling,
    "What counts as an overflow and what is done about one, an "
    ":class:`~nnabla_mpt.OverflowHandling`: the check's ``mode`` (``\"inf_nan\"`` or "
    "``\"saturation\"``), ``max_retries`` within one ``update()``, and at a collapsing "
    "scale the ``floor_policy`` after ``diagnose_after`` overflowing steps.",
    _instance(OverflowHandling, OverflowHandling()))
REDUCTION = Option(
    "reduction", GradientReduction(), GradientReduction,
    "How the gradients are summed, a :class:`~nnabla_mpt.GradientReduction`: averaged over "
    "the micro-batches (``average_accum``) or the ranks (``average_ranks``), reduced inside "
    "the backward pass (``all_reduce_callback``), in shared memory (``shared_grads``), and "
    "whether a rank that raises aborts the job (``abort_on_exception``).",
    _instance(GradientReduction, GradientReduction()))
SCHEDULE = Option(
    "schedule", None, Optional[PrecisionSchedule],
    "A precision schedule, a :class:`~nnabla_mpt.PrecisionSchedule`: reduced precision "
    "(``loss``) first, then full precision (its ``high_precision_loss``, run with scale 1 and "
    "the overflow check kept). None (default): reduced precision throughout.",
    _instance(PrecisionSchedule))
CLIP_GRAD_NORM = Option(
    "clip_grad_norm", None, Optional[float],
    "Clip the unscaled gradients to this global L2 norm, or None. The norm is "
    "taken of the unscaled gradients in float32 on the device they live on, "
    "scaled by their largest magnitude as BLAS ``nrm2`` does: finite for all "
    "finite gradients, which are clipped and applied however large their norm "
    "(a step is never skipped for it). Only gradients holding inf or NaN have "
    "no norm: the overflow check skips them, and without it "
    "(``enable_overflow_check=False``) the norm does, as an overflow.",
    _optional(_real(gt=0.0)))
MONITOR = Option(
    "monitor", None, Optional[Callable[[Any], Any]],
    "A step hook: any callable, called once per step (after the step is complete) "
    "with its :class:`StepResult`, e.g. a :class:`LossScaleMonitor` or a "
    ":class:`LossScaleCallback`. None (default) costs one attribute test per step.",
    checked_step_hook)
OUTPUTS = Option(
    "outputs", None, Optional[Sequence[nn.Variable]],
    "Variables computed by the step's own forward passes together with the loss "
    "(an error rate, an accuracy: what ``F.sink(loss, error)`` computed), on the "
    "same batch, random draws and batch-normalization statistics; the backward "
    "pass still runs from the loss alone. After ``update()`` their ``.d`` holds "
    "the last micro-batch's values (a ``data_feeder`` finds the previous "
    "micro-batch's there when ``accum_grad > 1``), of the last attempt in retry "
    "mode, of this rank's batch with a communicator (they are not reduced). They "
    "are made persistent, so that no pass frees their values. Not with "
    "``schedule``.",
    checked_outputs)
LR_SCHEDULER = Option(
    "lr_scheduler", None, Any,
    "A learning-rate schedule with ``get_learning_rate(iter)`` (nnabla's "
    "``nnabla.utils.learning_rate_scheduler``), keyed on applied updates: before "
    "each ``solver.update()`` the solver's learning rate is set to "
    "``get_learning_rate(updater.updates)``, so a skipped step does not advance the "
    "schedule; a resumed run goes on from the saved ``updates``. None (default): "
    "the learning rate is left to the solver.", checked_lr_scheduler)
GRADIENT_STATS_EVERY = Option(
    "gradient_stats_every", None, Optional[int],
    "Every this many steps (``(step + 1) % K == 0``), :attr:`StepResult."
    "gradient_stats` holds each parameter's gradient statistics (zeros, subnormals, "
    "largest value, headroom; see :class:`~nnabla_mpt.GradientStats`); None "
    "(default): never.", _optional(_integer(1)))

#: The keyword options of both updaters, after the dynamic updater's ``growth_mode`` and
#: ``policy``: the most used first.
COMMON = (CLIP_GRAD_NORM, MONITOR, OUTPUTS, LR_SCHEDULER, GRADIENT_STATS_EVERY, OVERFLOW,
          REDUCTION, SCHEDULE)


# -- keywords that moved into the objects above ------------------------------------------

#: The fields of the objects below whose keyword had another name.
_RENAMED = {"overflow_mode": "mode", "accelerate_train_mode": "mode"}
#: Each keyword that moved: ``old -> (new keyword, field of its object)``. The old
#: keyword still works in 0.1, with a ``DeprecationWarning`` naming its new spelling, and
#: goes in :data:`REMOVED_IN`.
MOVED: Dict[str, Tuple[str, str]] = {old: (keyword, _RENAMED.get(old, old)) for keyword, olds in (
    ("policy", ("backoff_factor", "hysteresis", "min_scale", "max_scale")),
    ("overflow", ("overflow_mode", "max_retries", "floor_policy", "diagnose_after")),
    ("reduction", ("average_accum", "average_ranks", "all_reduce_callback", "shared_grads",
                   "abort_on_exception")),
    ("schedule", ("accelerate_train_mode", "total_steps", "final_loss", "high_precision_loss")),
) for old in olds}
REMOVED_IN = "0.2.0"
_CLASS_OF = {"policy": DynamicLossScale, "overflow": OverflowHandling,
             "reduction": GradientReduction, "schedule": PrecisionSchedule}


def new_spelling(old: str) -> str:
    """How the moved keyword ``old`` is written now: ``policy=DynamicLossScale(min_scale=...)``."""
    keyword, name = MOVED[old]
    return f"{keyword}={_CLASS_OF[keyword].__name__}({name}=...)"


#: What the warning of a policy keyword adds: the policy then holds the whole scale.
_POLICY_NOTE = (" with the scale's other settings in it (init_scale, growth_factor, "
                "growth_interval, growth_mode: its defaults are not the updater's)")


def _moved_objects(owner: str, moved: Mapping[str, Any],
                   passed: Mapping[str, Any]) -> Dict[str, Any]:
    """What the moved keywords ``moved`` (old name -> value) stand for, by their new
    keyword: an object, or for ``policy`` a mapping of its settings. Each keyword warns
    once; one given with its new keyword is refused."""
    fields: Dict[str, Dict[str, Any]] = {}
    for old, value in moved.items():
        keyword, name = MOVED[old]
        note = _POLICY_NOTE if keyword == "policy" else ""
        warnings.warn(f"{owner}({old}=...) is deprecated and will be removed in {REMOVED_IN}: "
                      f"pass {new_spelling(old)}{note} instead", DeprecationWarning,
                      stacklevel=4)
        if passed.get(keyword) is not None:
            raise TypeError(f"{owner}() got {old}= and {keyword}=: {old} is a field of "
                            f"{keyword} now; pass it there ({new_spelling(old)})")
        fields.setdefault(keyword, {})[name] = value
    objects: Dict[str, Any] = {}
    if "policy" in fields:
        objects["policy"] = fields["policy"]      # checked with the policy's other settings
    for keyword in ("overflow", "reduction"):
        if keyword in fields:
            objects[keyword] = _CLASS_OF[keyword](**fields[keyword])
    if "schedule" in fields:
        objects["schedule"] = PrecisionSchedule.of_keywords(**fields["schedule"])
    return objects


# -- the bound values ----------------------------------------------------------------------

@dataclass(frozen=True)
class UpdaterOptions:
    """Every option of an updater, checked (:meth:`UpdaterSignature.bind`); options the
    updater does not take hold their neutral value.

    Attributes:
        policy_settings: The dynamic policy's settings (``scale`` and
            :attr:`DynamicLossScale.SETTINGS`), from ``policy`` or from nnabla's arguments.
        shown: The same as the user gave them, for the messages.
    """
    data_feeder: Optional[Callable[[], Any]]
    scale: Union[float, str]
    clear_buffer: bool
    accum_grad: int
    weight_decay: Optional[float]
    comm: Any
    grads: Optional[Sequence["nn.NdArray"]]
    clip_grad_norm: Optional[float]
    monitor: Optional[Callable[[Any], Any]]
    outputs: Tuple["nn.Variable", ...]
    lr_scheduler: Any
    gradient_stats_every: Optional[int]
    overflow: OverflowHandling
    reduction: GradientReduction
    schedule: Optional[PrecisionSchedule]
    enable_overflow_check: bool = True
    policy_settings: Mapping[str, Any] = field(default_factory=dict)
    shown: Mapping[str, Any] = field(default_factory=dict)


# -- the signature --------------------------------------------------------------------------

class UpdaterSignature:
    """The arguments of one updater after ``solver`` and ``loss``.

    Args:
        positional: The arguments that may be given by position, in order.
        keyword: The keyword-only options.
    """

    def __init__(self, positional: Sequence[Option], keyword: Sequence[Option]) -> None:
        self.positional = tuple(positional)
        self.keyword = tuple(keyword)
        self.options = {o.name: o for o in self.positional + self.keyword}
        self.moved = {old: new for old, new in MOVED.items() if new[0] in self.options}

    def bind(self, owner: str, args: Tuple, kwargs: Mapping[str, Any]) -> UpdaterOptions:
        """Every option's checked value, from the call's ``args`` (after solver and loss)
        and ``kwargs``, defaults filled in; moved keywords folded into their objects.

        Raises:
            TypeError: too many positional arguments, an unknown keyword (the message
                lists the valid ones), an argument given twice (a moved keyword with its
                new one too), or a value of the wrong type.
            ValueError: a value out of range.
        """
        if len(args) > len(self.positional):
            raise TypeError(f"{owner}() takes at most {len(self.positional) + 2} positional "
                            f"arguments (solver, loss, "
                            f"{', '.join(o.name for o in self.positional)}), got "
                            f"{len(args) + 2}")
        given = {o.name: value for o, value in zip(self.positional, args)}
        for name, value in kwargs.items():
            if name not in self.options and name not in self.moved:
                raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}; "
                                f"valid ones: {', '.join(self.options)}")
            if name in given:
                raise TypeError(f"{owner}() got multiple values for argument {name!r}")
            given[name] = value
        passed = frozenset(given)
        moved = {name: given[name] for name in self.moved if name in given}
        given.update((name, o.default) for name, o in self.options.items() if name not in given)
        values = {name: o.check(name, given[name]) for name, o in self.options.items()}
        objects = _moved_objects(owner, moved, {name: given[name] for name in passed})
        moved_policy = objects.pop("policy", {})
        values.update(objects)
        if "policy" not in self.options:
            return UpdaterOptions(**values, shown={"scale": given["scale"]})
        settings, shown = policy_settings(owner, values, given, passed, moved_policy)
        others = {name: value for name, value in values.items() if name not in POLICY_OPTIONS}
        return UpdaterOptions(**others, policy_settings=settings, shown=shown)

    def signature(self) -> inspect.Signature:
        """The signature of the updater's ``__init__``, as ``inspect`` and the docs show it."""
        P = inspect.Parameter
        params = [P("self", P.POSITIONAL_OR_KEYWORD), P("solver", P.POSITIONAL_OR_KEYWORD),
                  P("loss", P.POSITIONAL_OR_KEYWORD)]
        params += [P(o.name, P.POSITIONAL_OR_KEYWORD, default=o.default,
                     annotation=o.annotation) for o in self.positional]
        params += [P(o.name, P.KEYWORD_ONLY, default=o.default, annotation=o.annotation)
                   for o in self.keyword]
        return inspect.Signature(params, return_annotation=None)

    def describe(self, cls: type) -> type:
        """Class decorator: writes an ``Args:`` entry for every option where the class
        docstring has the line ``{options}``, and gives ``cls.__init__`` the signature."""
        marker = "        {options}\n"
        if marker not in (cls.__doc__ or ""):
            raise ValueError(f"the docstring of {cls.__name__} has no {marker.strip()} line")
        entries = "".join(_doc_entry(o) for o in self.positional + self.keyword)
        cls.__doc__ = cls.__doc__.replace(marker, entries)
        cls.__init__.__signature__ = self.signature()
        return cls


def _doc_entry(option: Option, width: int = 88) -> str:
    """One ``Args:`` entry, wrapped to the docstring's width."""
    return "\n".join(textwrap.wrap(f"{option.name}: {option.doc}", width=width,
                                    initial_indent=" " * 8, subsequent_indent=" " * 12,
                                    break_long_words=False, break_on_hyphens=False)) + "\n"


DYNAMIC = UpdaterSignature(
    (DATA_FEEDER, SCALE, SCALING_FACTOR, N, CLEAR_BUFFER, ACCUM_GRAD, WEIGHT_DECAY, COMM,
     GRADS),
    (GROWTH_MODE, POLICY) + COMMON)

FIXED = UpdaterSignature(
    (DATA_FEEDER, FIXED_SCALE, ENABLE_OVERFLOW_CHECK, CLEAR_BUFFER, ACCUM_GRAD, WEIGHT_DECAY,
     COMM, GRADS),
    COMMON)


def option_named(name: str) -> Option:
    """The option ``name`` of the updaters (an option both take is defined once)."""
    found = DYNAMIC.options.get(name) or FIXED.options.get(name)
    if found is None:
        raise KeyError(f"no updater option is named {name!r}")
    return found
