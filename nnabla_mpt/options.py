"""The updaters' arguments: each one named, defaulted, checked and documented here, once.

Both updaters take their arguments through an :class:`UpdaterSignature`: after
``solver`` and ``loss``, the positional arguments in the order of nnabla's own updater
(drop-in), then keyword-only options. :meth:`UpdaterSignature.bind` checks every value
with its option's check, :meth:`UpdaterSignature.signature` is what ``inspect`` and the
API docs show, and :meth:`UpdaterSignature.document` writes the ``Args:`` entries into the
updater's docstring. The checks of arguments that depend on each other (the scale bounds,
the precision schedule, ``grads`` with ``comm``) follow the table.
"""
import inspect
from dataclasses import dataclass
from typing import (Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Tuple,
                    Union)

import nnabla as nn
from nnabla.logger import logger

from .core import _validate as check
from .core import graph
from .core.dtypes import FloatType
from .distributed import launcher
from .scale.policy import GROWTH_MODES, DynamicLossScale, FixedLossScale, GrowthMode
from .scale.precision import PrecisionSchedule
from .step.detector import OverflowMode
from .step.feeder import checked_feeder

FloorPolicy = Literal["raise", "warn", "ignore"]


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


def _choice(*allowed: str) -> Callable[[str, Any], str]:
    return lambda name, value: check.choice(name, value, allowed)


def _communicator(name: str, comm: Any) -> Any:
    if comm is None:
        return None
    for attr in ("all_reduce", "size", "rank"):
        if not hasattr(comm, attr):
            raise TypeError(f"{name} must be a communicator with all_reduce, size and rank "
                            f"(missing {attr!r}), got {type(comm).__name__}")
    return comm


def _ndarrays(name: str, grads: Any) -> Optional[List["nn.NdArray"]]:
    if grads is None:
        return None
    if not isinstance(grads, (list, tuple)) or not all(isinstance(g, nn.NdArray) for g in grads):
        raise TypeError(f"{name} must be None or a list of nnabla.NdArray, got {grads!r}")
    return list(grads)


def _with_the_schedule(name: str, value: Any) -> Any:
    """The precision-schedule options are checked together, by :func:`precision_schedule`."""
    return value


def _step_hook(name: str, monitor: Any) -> Any:
    if monitor is None or callable(monitor):
        return monitor
    hint = ""
    if hasattr(monitor, "save_path"):
        hint = (" (wrap an nnabla.monitor.Monitor in nnabla_mpt.LossScaleMonitor: "
                "monitor=LossScaleMonitor(Monitor(path), interval=100))")
    raise TypeError(f"{name} must be None or a callable taking one StepResult, got "
                    f"{monitor!r} of type {type(monitor).__name__}{hint}")


def _variables(name: str, outputs: Any) -> Tuple["nn.Variable", ...]:
    if outputs is None:
        return ()
    if not isinstance(outputs, (list, tuple)):
        raise TypeError(f"{name} must be None or a list of nnabla.Variable, got "
                        f"{type(outputs).__name__}")
    for i, v in enumerate(outputs):
        if not isinstance(v, nn.Variable):
            raise TypeError(f"{name}[{i}] must be an nnabla.Variable, got {type(v).__name__}")
        if v.parent is None:
            raise ValueError(f"{name}[{i}] is a leaf Variable (shape {tuple(v.shape)}): no "
                             f"function computes it, so a forward pass would not change it")
        if any(v is w for w in outputs[:i]):
            raise ValueError(f"{name}[{i}] is given twice (also at "
                             f"{name}[{[w is v for w in outputs].index(True)}])")
    return tuple(outputs)


def _learning_rate_schedule(name: str, scheduler: Any) -> Any:
    if scheduler is None or callable(getattr(scheduler, "get_learning_rate", None)):
        return scheduler
    raise TypeError(f"{name} must be None or a learning-rate schedule with a "
                    f"get_learning_rate(iter) method (nnabla.utils.learning_rate_scheduler), "
                    f"got {scheduler!r} of type {type(scheduler).__name__}")


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
            "(:func:`~nnabla_mpt.seed.held_scale`).")

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
    "Skip steps whose gradients overflowed (the scale stays). False runs no check and "
    "always updates, for networks whose overflow is harmless (clipped or masked later).",
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
    _communicator)
GRADS = Option("grads", None, Optional[Sequence[nn.NdArray]],
               "Gradients to all-reduce with ``comm``; None means those of all the "
               "solver's parameters. Without ``comm`` there is nothing to reduce: a "
               "non-empty list is ignored with a warning (accepted, as nnabla's updater "
               "accepts it), ``[]`` (nnabla's default) silently.", _ndarrays)

BACKOFF_FACTOR = Option(
    "backoff_factor", None, Optional[float],
    "Factor applied to the scale on overflow, in (0, 1); default ``1 / scaling_factor``.",
    _optional(_real(gt=0.0, lt=1.0)))
HYSTERESIS = Option(
    "hysteresis", 1, int,
    "Overflows tolerated before the scale backs off (see :class:`DynamicLossScale`).",
    _integer(1))
MIN_SCALE = Option("min_scale", 1.0, float, "Lower bound of the scale.", _real(gt=0.0))
MAX_SCALE = Option(
    "max_scale", 2.0 ** 24, float,
    "Upper bound of the scale; the bound in effect is the smaller of this and the largest "
    "power of two the loss's dtype holds (``2**15`` for float16: ``loss.backward(scale)`` "
    "seeds the pass in that dtype).", _real(gt=0.0))
GROWTH_MODE = Option(
    "growth_mode", "probe", GrowthMode,
    "``\"probe\"`` (default): grow by ``scaling_factor`` after ``N`` good steps, as "
    "nnabla's updater does; ``\"measured\"``: on the step where growth is due, watch the "
    "backward pass and grow by as many factors as the gradients leave room for, possibly "
    "none (see :doc:`measured`).", _choice(*GROWTH_MODES))

COMMON = (
    Option("overflow_mode", "inf_nan", OverflowMode,
           "``\"inf_nan\"`` or ``\"saturation\"`` (see :class:`OverflowDetector`).",
           _choice("inf_nan", "saturation")),
    Option("clip_grad_norm", None, Optional[float],
           "Clip the unscaled gradients to this global L2 norm, or None. The norm is "
           "taken of the unscaled gradients, squared in float32 on the device they live "
           "on; a norm that is not finite even so (beyond about 1.8e19) is an overflow: "
           "the step is skipped and a dynamic scale backs off (also with "
           "``enable_overflow_check=False``); a streak of such steps is diagnosed as an "
           "overflow streak, whose replay finds the gradients finite (kind "
           "``\"not_reproduced\"``).",
           _optional(_real(gt=0.0))),
    Option("max_retries", 0, int,
           "Retry mode: after a skipped step, run up to this many more steps on new "
           "batches within the same ``update()`` call. 0 (default) returns the skipped step.",
           _integer(0)),
    Option("average_accum", False, bool,
           "Divide the accumulated gradients by ``accum_grad`` (default: sum, as nnabla's "
           "updater does).", check.boolean),
    Option("average_ranks", False, bool,
           "Divide the reduced gradients by the number of processes (default: sum, as "
           "nnabla's updater does).", check.boolean),
    Option("accelerate_train_mode", None, Optional[str],
           "Precision schedule ``\"TYPE|TRIGGER|VALUE\"``, e.g. ``\"fast|step|0.9\"``: "
           "reduced precision (``loss``) first, then full precision "
           "(``high_precision_loss``, run with scale 1 and the overflow check kept). See "
           ":mod:`nnabla_mpt.precision`.", _with_the_schedule),
    Option("total_steps", None, Optional[int],
           "Total steps of the run, for the ``step`` trigger.", _with_the_schedule),
    Option("final_loss", None, Optional[float],
           "Target loss of the run, for the ``loss`` trigger.", _with_the_schedule),
    Option("high_precision_loss", None, Optional[nn.Variable],
           "The same network's loss built under the float context, sharing the parameters "
           "of ``loss``.", _with_the_schedule),
    Option("floor_policy", "raise", FloorPolicy,
           "What to do when the loss scale collapses, i.e. when the overflow streak "
           "reaches ``diagnose_after`` or a step overflows at ``min_scale`` (a fixed scale "
           "has no floor): the updater replays the last batch with "
           ":func:`nnabla_mpt.diagnose` and ``\"raise\"`` (default) raises "
           ":class:`~nnabla_mpt.LossScaleCollapseError` carrying the report; "
           "``\"warn\"`` logs the report once (``logger.warning``) and keeps skipping; "
           "``\"ignore\"`` does neither (and runs no diagnosis). The report is kept in "
           ":attr:`last_report`. A streak is reported at most once. A streak whose report "
           "says ``kind=\"overflow\"`` (the batch is finite at a smaller scale) while the "
           "scale can still back off is no collapse: it is logged at info level and "
           "training goes on; if the scale then reaches ``min_scale`` the floor triggers. "
           "The gradients decide whether a step is skipped: a skipped step whose loss "
           "itself is non-finite is counted without lowering the scale (the policy is "
           "not updated for it); a step whose loss is non-finite while its gradients "
           "are finite updates and counts as a good step.",
           _choice("raise", "warn", "ignore")),
    Option("diagnose_after", 8, int,
           "Consecutive overflowing steps that trigger the diagnosis (>= 1). A single "
           "overflow is only skipped and counted.", _integer(1)),
    Option("monitor", None, Optional[Callable[[Any], Any]],
           "A step hook: any callable, called once per step (after the step is complete) "
           "with its :class:`StepResult`, e.g. a :class:`LossScaleMonitor` or a "
           ":class:`LossScaleCallback`. None (default) costs one attribute test per step.",
           _step_hook),
    Option("outputs", None, Optional[Sequence[nn.Variable]],
           "Variables computed by the step's own forward passes together with the loss "
           "(an error rate, an accuracy: what ``F.sink(loss, error)`` computed), on the "
           "same batch, random draws and batch-normalization statistics; the backward "
           "pass still runs from the loss alone. After ``update()`` their ``.d`` holds "
           "the last micro-batch's values (a ``data_feeder`` finds the previous "
           "micro-batch's there when ``accum_grad > 1``), of the last attempt in retry "
           "mode, of this rank's batch with a communicator (they are not reduced). They "
           "are made persistent, so that no pass frees their values. Not with "
           "``accelerate_train_mode``.",
           _variables),
    Option("lr_scheduler", None, Any,
           "A learning-rate schedule with ``get_learning_rate(iter)`` (nnabla's "
           "``nnabla.utils.learning_rate_scheduler``), keyed on applied updates: before "
           "each ``solver.update()`` the solver's learning rate is set to "
           "``get_learning_rate(updater.updates)``, so a skipped step does not advance the "
           "schedule; a resumed run goes on from the saved ``updates``. None (default): "
           "the learning rate is left to the solver.", _learning_rate_schedule),
    Option("gradient_stats_every", None, Optional[int],
           "Every this many steps (``(step + 1) % K == 0``), :attr:`StepResult."
           "gradient_stats` holds each parameter's gradient statistics (zeros, subnormals, "
           "largest value, headroom; see :class:`~nnabla_mpt.GradientStats`); None "
           "(default): never.", _optional(_integer(1))),
    Option("all_reduce_callback", None, Optional[int],
           "Reduce the gradients inside the last micro-batch's backward pass, in packs of "
           "this many values (nnabla-examples use ``2 << 20``), with the communicator's "
           "``all_reduce_callback``: with nnabla's communicators (NCCL) the reduction "
           "overlaps the pass. None (default): one all-reduce after the pass. With an "
           ":class:`MPICommunicator` the gradients are reduced after the pass either way (a "
           "CPU all-reduce cannot run inside nnabla's backward; an info line says so), with "
           "the same result. Needs ``comm``; with nnabla's communicators, not with "
           "``overflow_mode=\"saturation\"`` (it checks each rank's own gradients before "
           "the reduction) nor with a parameter used by several functions (nnabla's "
           "callback would reduce its gradient more than once).",
           _optional(_integer(1))),
    Option("shared_grads", None, Optional[bool],
           "Put the gradients of the solver's parameters in the communicator's shared "
           "memory (:meth:`MPICommunicator.share_grads`), so that the step's all-reduce "
           "copies nothing, and zero them there instead of with ``solver.zero_grad()``. "
           "``None`` (default): do so when ``comm`` offers it with more than one rank and "
           "the shared-memory scheme, ``grads`` is None and the graph runs in float only, "
           "and the gradients fit in the machine's shared memory (a warning says when "
           "they do not); ``True``: require it (``ValueError`` naming the reason where it "
           "cannot be done); ``False``: never.", _optional(check.boolean)),
    Option("abort_on_exception", True, bool,
           "With a communicator other than an :class:`MPICommunicator` that has a callable "
           "``abort()`` (nnabla's ``MultiProcessDataParallelCommunicator``) and more than "
           "one rank: install a :data:`sys.excepthook` that prints the traceback, logs "
           "which rank raised and calls ``comm.abort()`` (``MPI_Abort``), so that a rank "
           "that raises ends the job instead of leaving the others waiting in a "
           "collective; the rank exits even if ``abort()`` returns. The hook is "
           "process-wide and only the first one installed (by an updater or an "
           "MPICommunicator) takes effect; False keeps this updater from installing it. "
           "With an :class:`MPICommunicator` the communicator's own "
           "``abort_on_exception`` rules: True has no effect of its own, and False is "
           "refused (``ValueError``) when the communicator was made with True (its hook is "
           "in place already). See :doc:`gpu`.", check.boolean),
)


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

    def bind(self, owner: str, args: Tuple,
             kwargs: Mapping[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """Every option's checked value, from the call's ``args`` (after solver and loss)
        and ``kwargs``, defaults filled in; and the values as given, for the messages of
        the checks that compare options.

        Raises:
            TypeError: too many positional arguments, an unknown keyword (the message
                lists the valid ones), an argument given twice, or a value of the wrong
                type.
            ValueError: a value out of range.
        """
        if len(args) > len(self.positional):
            raise TypeError(f"{owner}() takes at most {len(self.positional) + 2} positional "
                            f"arguments (solver, loss, "
                            f"{', '.join(o.name for o in self.positional)}), got "
                            f"{len(args) + 2}")
        given = {o.name: value for o, value in zip(self.positional, args)}
        for name, value in kwargs.items():
            if name not in self.options:
                raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}; "
                                f"valid ones: {', '.join(self.options)}")
            if name in given:
                raise TypeError(f"{owner}() got multiple values for argument {name!r}")
            given[name] = value
        given = {name: given.get(name, o.default) for name, o in self.options.items()}
        return {name: o.check(name, given[name]) for name, o in self.options.items()}, given

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
    import textwrap
    return "\n".join(textwrap.wrap(f"{option.name}: {option.doc}", width=width,
                                    initial_indent=" " * 8, subsequent_indent=" " * 12,
                                    break_long_words=False, break_on_hyphens=False)) + "\n"


DYNAMIC = UpdaterSignature(
    (DATA_FEEDER, SCALE, SCALING_FACTOR, N, CLEAR_BUFFER, ACCUM_GRAD, WEIGHT_DECAY, COMM,
     GRADS),
    (BACKOFF_FACTOR, HYSTERESIS, MIN_SCALE, MAX_SCALE, GROWTH_MODE) + COMMON)

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


# -- the arguments that depend on each other ----------------------------------------------

def solver_parameters(solver: Any) -> Dict[str, "nn.Variable"]:
    """The parameters of ``solver``, checked to be an nnabla solver that has some."""
    for attr in ("zero_grad", "update", "scale_grad", "check_inf_or_nan_grad",
                 "get_parameters", "weight_decay", "get_states", "set_states"):
        if not callable(getattr(solver, attr, None)):
            raise TypeError(f"solver must be an nnabla solver (missing method {attr!r}), "
                            f"got {type(solver).__name__}")
    params = solver.get_parameters()
    if len(params) == 0:
        raise ValueError("solver has no parameters: call solver.set_parameters(...) "
                         "before creating the updater")
    return params


def computed_loss(loss: Any, name: str = "loss") -> "nn.Variable":
    """``loss``, checked to be a one-element Variable that a function computes, other than
    ``F.sink``."""
    if not isinstance(loss, nn.Variable):
        raise TypeError(f"{name} must be an nnabla.Variable, got {type(loss).__name__}")
    if loss.size != 1:
        raise ValueError(f"{name} must be a scalar Variable (one element), got shape "
                         f"{tuple(loss.shape)}")
    if loss.parent is None:
        raise ValueError(f"{name} is a leaf Variable (no function computes it, shape "
                         f"{tuple(loss.shape)}): the updater runs {name}.forward() and "
                         f"{name}.backward(), which need the graph; pass the Variable the "
                         f"network's loss function returns (e.g. F.mean(...)), not one "
                         f"holding its value")
    if loss.parent.info.type_name == "Sink":
        makers = ", ".join("a leaf" if v.parent is None else v.parent.info.type_name
                           for v in loss.parent.inputs)
        raise ValueError(f"{name} is the output of F.sink ({len(loss.parent.inputs)} inputs, "
                         f"made by {makers}): Sink's backward sets its inputs' gradients to "
                         f"1 whatever the loss scale, so the scale would be lost while the "
                         f"updater still divides the gradients by it; pass the loss "
                         f"variable itself (e.g. loss, not F.sink(loss, error)) and the other "
                         f"inputs of the sink as outputs=[error]: the step's forward pass "
                         f"computes them with the loss")
    return loss


def trained_loss(loss: Any, params: Mapping[str, "nn.Variable"]) -> "nn.Variable":
    """``loss``, checked as by :func:`computed_loss` and to depend on some of the solver's
    parameters ``params`` (not necessarily all)."""
    loss = computed_loss(loss)
    used = graph.graph_inputs(loss)
    if not any(v in used for v in params.values()):
        names = list(params)
        shown = ", ".join(repr(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
        raise ValueError(f"loss does not depend on any of the solver's {len(names)} "
                         f"parameters ({shown}): no step would change them; build the loss "
                         f"from them, or set the solver's parameters from the same parameter "
                         f"scope the loss was built in (solver.set_parameters("
                         f"nn.get_parameters()) inside that nn.parameter_scope)")
    return loss


#: The options of the dynamic updater that set a policy setting of another name
#: (:attr:`DynamicLossScale.SETTINGS`), as :func:`dynamic_policy` passes them; the other
#: settings are options of the same name.
OPTION_OF_SETTING = {"growth_factor": "scaling_factor", "growth_interval": "N"}


def dynamic_policy(values: Mapping[str, Any], given: Mapping[str, Any],
                   dtype: FloatType) -> DynamicLossScale:
    """The policy of the dynamic updater, its bounds checked against each other and
    against ``dtype``, the loss's type, which ``loss.backward(scale)`` seeds: its upper
    bound is ``min(max_scale, ceiling)``, the largest power of two ``dtype`` holds, and a
    scale below its smallest positive value is refused (0 there)."""
    lo, hi, scale = values["min_scale"], values["max_scale"], values["scale"]
    ceiling = dtype.max_power_of_two
    if lo > hi:
        raise ValueError(f"min_scale must be <= max_scale, got min_scale="
                         f"{given['min_scale']!r} and max_scale={given['max_scale']!r}")
    if lo > ceiling:
        raise ValueError(f"min_scale={given['min_scale']!r} is above {ceiling:g}, the largest "
                         f"power of two the loss's dtype holds: backward(scale) would seed "
                         f"inf at every scale allowed")
    for name in ("scale", "min_scale"):
        seedable(name, given[name], values[name], dtype)
    if scale != "auto" and not lo <= scale <= hi:
        raise ValueError(f"scale must lie in [min_scale, max_scale] = [{lo:g}, {hi:g}], "
                         f"got scale={given['scale']!r}")
    upper = min(hi, ceiling)
    if scale == "auto":
        scale = upper    # until the first step measures it
    elif scale > upper:
        logger.info(f"nnabla_mpt: scale={given['scale']!r} is above {ceiling:g}, the largest "
                    f"power of two the loss's dtype holds (backward(scale) seeds the pass "
                    f"in that dtype): starting at {upper:g}")
        scale = upper
    backoff = values["backoff_factor"]
    if backoff is None:
        backoff = 1.0 / values["scaling_factor"]
    return DynamicLossScale(init_scale=scale, growth_factor=values["scaling_factor"],
                            backoff_factor=backoff, growth_interval=values["N"],
                            hysteresis=values["hysteresis"], min_scale=lo, max_scale=upper,
                            growth_mode=values["growth_mode"])


def check_retries(max_retries: int, enable_overflow_check: bool) -> None:
    """Retries need the overflow check: without it no step is ever skipped."""
    if max_retries and not enable_overflow_check:
        raise ValueError(f"max_retries={max_retries!r} needs enable_overflow_check=True: "
                         f"without the check no step is ever skipped")


def fixed_policy(values: Mapping[str, Any], dtype: FloatType) -> FixedLossScale:
    """The policy of the fixed updater; the scale must be one the loss's dtype ``dtype``
    can seed, and retries need the overflow check."""
    check_retries(values["max_retries"], values["enable_overflow_check"])
    policy = FixedLossScale(values["scale"])
    ceiling = dtype.max_power_of_two
    if policy.loss_scale > ceiling:
        raise ValueError(f"scale={values['scale']!r} is above {ceiling:g}, the largest power "
                         f"of two the loss's dtype holds: backward(scale) seeds the pass in "
                         f"that dtype, so every step would overflow; use scale <= {ceiling:g}")
    seedable("scale", values["scale"], policy.loss_scale, dtype)
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


def backward_reduction(values: Mapping[str, Any], losses: Sequence["nn.Variable"],
                       params: Mapping[str, "nn.Variable"]) -> Optional[int]:
    """The pack size of the all-reduce inside the backward pass that
    ``all_reduce_callback`` asks for, or None where the gradients are reduced after the
    pass: none asked for, or an :class:`MPICommunicator` (logged), whose reduction cannot
    run inside nnabla's backward pass. ``losses``: the graphs the step runs."""
    pack, comm = values["all_reduce_callback"], values["comm"]
    if pack is None:
        return None
    if comm is None:
        raise ValueError(f"all_reduce_callback={pack!r} needs a communicator (comm=...): it "
                         f"reduces the gradients over the ranks inside the backward pass")
    from .distributed.communicator import MPICommunicator
    if isinstance(comm, MPICommunicator):
        logger.info(f"nnabla_mpt: all_reduce_callback={pack!r}: MPICommunicator reduces the "
                    f"gradients after the backward pass (a CPU all-reduce cannot run inside "
                    f"nnabla's backward), with the same result")
        return None
    from nnabla.communicators import Communicator
    if not isinstance(comm, Communicator):
        raise ValueError(f"all_reduce_callback={pack!r} needs nnabla's communicator (whose "
                         f"callbacks run inside nnabla's backward pass) or an "
                         f"MPICommunicator, got comm of type {type(comm).__name__}")
    if values["overflow_mode"] == "saturation":
        raise ValueError(f"all_reduce_callback={pack!r} cannot be combined with "
                         f"overflow_mode='saturation': that mode checks each rank's own "
                         f"gradients before the reduction, which would run inside the "
                         f"backward pass; use overflow_mode='inf_nan' or "
                         f"all_reduce_callback=None")
    shared = sorted({name for loss in losses for name in graph.shared_parameters(loss, params)})
    if shared:
        raise ValueError(f"all_reduce_callback={pack!r} cannot train parameters that several "
                         f"functions read ({', '.join(shared[:5])}"
                         f"{', ...' if len(shared) > 5 else ''}): nnabla's callback reduces a "
                         f"gradient when a function reading it has run its backward, so "
                         f"once per reader; use all_reduce_callback=None")
    return pack


def exchanged_grads(values: Mapping[str, Any],
                    params: Mapping[str, "nn.Variable"]) -> Optional[List["nn.NdArray"]]:
    """``grads`` with ``comm``: None stands for all of the solver's gradients; given with
    a communicator, they must be the gradients of every one of the solver's parameters
    (a parameter left out would train on this rank's gradients alone, and the ranks'
    parameters would drift apart). Without a communicator, in a process a launcher
    started as one of several, a warning says that every rank trains alone
    (:func:`~nnabla_mpt.distributed.launcher.warn_training_alone`); a non-empty ``grads`` is
    accepted (as nnabla's updater accepts it) with a warning that it is ignored, and
    ``[]`` silently."""
    grads, comm = values["grads"], values["comm"]
    if comm is None:
        launcher.warn_training_alone()
    if grads is not None and len(grads) == 0:
        if comm is None:
            return None     # nnabla's default, spelled out: nothing to exchange
        raise ValueError("grads must not be empty when a communicator is given: grads=[] "
                         "would exchange nothing; pass grads=None to exchange the gradients "
                         "of all the solver's parameters")
    if grads is not None and comm is None:
        logger.warning(f"nnabla_mpt: grads (a list of {len(grads)} arrays) is ignored "
                       f"without a communicator: grads names the gradients to all-reduce "
                       f"over the ranks, and there are none; every gradient of the solver "
                       f"is used as it is. Pass comm=... to exchange them, or leave grads "
                       f"out")
    if values["shared_grads"] and comm is None:
        raise ValueError("shared_grads=True needs a communicator (comm=...): the "
                         "gradients are placed in the communicator's shared memory")
    if grads is not None and comm is not None:
        missing = [name for name, v in params.items() if not any(v.grad == g for g in grads)]
        if missing:
            raise ValueError(f"grads must hold the gradients of all the solver's parameters "
                             f"when a communicator is given; missing {missing[:5]}"
                             + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                             + ": their values would drift apart on the ranks; pass "
                             "grads=None to exchange all of them")
    return grads


def precision_schedule(values: Mapping[str, Any], loss: "nn.Variable",
                       params: Mapping[str, "nn.Variable"]):
    """``(schedule, high_precision_loss)`` of ``accelerate_train_mode`` and the options that
    go with it, ``(None, None)`` without it; checked against the graphs of both losses."""
    mode, high_precision_loss = values["accelerate_train_mode"], values["high_precision_loss"]
    if mode is not None and values["outputs"]:
        raise ValueError(f"outputs (a list of {len(values['outputs'])} Variables) cannot be "
                         f"combined with accelerate_train_mode={mode!r}: they belong to one "
                         f"graph, and the schedule switches to high_precision_loss's")
    if mode is None:
        for name in ("total_steps", "final_loss", "high_precision_loss"):
            if values[name] is not None:
                raise ValueError(f"{name}={values[name]!r} needs accelerate_train_mode "
                                 f"(e.g. 'fast|step|0.9'), which is None")
        return None, None
    schedule = PrecisionSchedule(mode, total_steps=values["total_steps"],
                                 final_loss=values["final_loss"])
    if schedule.mode.type == "fast1" and not graph.has_bfloat16(loss):
        raise ValueError(f"accelerate_train_mode={mode!r} asks for bfloat16 ('fast1'), but "
                         f"the backend {graph.extension_of(loss)!r} of this nnabla has no "
                         f"bfloat16 type; use 'fast' (float16) instead")
    if graph.precision_of(loss) != "half":
        raise ValueError(f"accelerate_train_mode={mode!r} needs loss built under a half "
                         f"context (get_extension_context(..., type_config='half')); the "
                         f"given loss runs in float")
    if high_precision_loss is None:
        raise ValueError(f"accelerate_train_mode={mode!r} needs high_precision_loss: the same "
                         f"network's loss built under the full-precision context")
    high_precision_loss = computed_loss(high_precision_loss, "high_precision_loss")
    if graph.precision_of(high_precision_loss) != "float":
        raise ValueError("high_precision_loss must be built under a float context "
                         "(type_config='float'); the given one runs in half")
    used = graph.graph_inputs(high_precision_loss)
    missing = sorted(name for name, v in params.items() if v not in used)
    if missing:
        raise ValueError(f"high_precision_loss does not use the solver's parameters "
                         f"{missing}: build it in the same parameter scope as loss so that "
                         f"both graphs share them")
    return schedule, high_precision_loss
