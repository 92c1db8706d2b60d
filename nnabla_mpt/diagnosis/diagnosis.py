"""Explain why gradients stop being finite.

:func:`diagnose` replays the forward and backward pass of a loss on the batch that is
still held in the graph's input variables, watching every function through nnabla's
function hooks, and returns an :class:`OverflowReport` naming the first function that
turned finite values into inf/NaN. The updaters call it only when a streak of
overflowing steps or an overflow at the scale floor calls for an explanation; a healthy
step never runs any of this code.

The report is a dataclass for programs (``report.kind``, ``report.function``,
``report.phase``, ``report.nonfinite_params``, ...) and prints as a text for people; it
lives in ``nnabla_mpt.diagnosis.report``, the hooks that watch each pass in
``nnabla_mpt.diagnosis.forward_watch`` (forward) and ``nnabla_mpt.diagnosis.watch``
(backward).
This module runs the passes, classifies what they saw, and writes back afterwards the
state the replay's forward pass moves (BatchNormalization's running statistics).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ..core import _validate as check
from ..core import graph
from ..core.dtypes import FP16_MAX, array_stats, dtype_name, float_type, narrowest_float
from .forward_watch import ForwardWatch
from .report import LossScaleCollapseError, OverflowReport, fmt_scale
from .watch import BackwardWatch

__all__ = ["OverflowReport", "LossScaleCollapseError", "diagnose"]


def diagnose(loss: Any, scale: float, params: Optional[Mapping[str, Any]] = None, *,
             chain_length: int = 6) -> OverflowReport:
    """Replay the current batch and find where inf/NaN first appear.

    Runs ``loss.forward`` and ``loss.backward(scale)`` again on the data still held in the
    graph's inputs, keeping every buffer and watching each function through nnabla's
    function hooks. The culprit is the first function whose outputs are non-finite while its
    inputs are finite; in the backward pass, the first whose input gradients turn non-finite
    while the gradients flowing into it are finite. A backward culprit is checked again at
    scale 1 to tell an overflow (fixed by a smaller scale) from a model problem. The
    :class:`OverflowReport` returned classifies the finding (``report.kind``).

    It leaves the model as it found it (:doc:`troubleshooting`, "Costs", says what is written
    back) but for nnabla's random generators and the gradients of the graph's leaf variables,
    zero on return: call it after a step was skipped or before the next step's backward pass.

    Args:
        loss: The loss ``nnabla.Variable`` the training step differentiates.
        scale: The loss scale of the failing step (> 0).
        params: Mapping name -> parameter ``Variable`` used to name parameters (e.g.
            ``solver.get_parameters()``); ``None`` uses nnabla's global parameters.
        chain_length: Number of functions shown in :attr:`OverflowReport.path`.

    Example:
        >>> import numpy as np, nnabla as nn, nnabla.functions as F
        >>> import nnabla.parametric_functions as PF
        >>> from nnabla.ext_utils import get_extension_context
        >>> from nnabla_mpt import diagnose
        >>> nn.clear_parameters()
        >>> x = nn.Variable.from_numpy_array(np.zeros((2, 3), dtype=np.float32))
        >>> with nn.context_scope(get_extension_context("cpu", type_config="half")):
        ...     loss = F.mean(F.log(F.relu(PF.affine(x, 2, name="fc"))))
        >>> report = diagnose(loss, scale=1024.0)
        >>> report.kind, report.phase, report.function, report.path
        ('model', 'forward', 'Log', 'Affine#0[fc/affine] -> ReLU#1 -> Log#2')
        >>> report.loss_finite
        False

    Raises:
        TypeError: if ``loss`` is not an ``nnabla.Variable`` or ``params`` not a mapping.
        ValueError: if ``scale`` is not finite and > 0, or ``chain_length`` < 1.
    """
    scale, params, chain_length = _checked_arguments(loss, scale, params, chain_length)
    with _Replay(loss, params) as replay:
        return _replayed(replay, scale, chain_length)


def _replayed(replay: "_Replay", scale: float, chain_length: int) -> OverflowReport:
    """The report of :func:`diagnose` from its replay of the batch (arguments checked)."""
    forward = ForwardWatch(replay.params).run(replay.loss)
    values = np.asarray(replay.loss.d, dtype=np.float64)  # summed if the loss is not a scalar
    loss_value = float(values.reshape(-1)[0]) if values.size == 1 else float(values.sum())
    report = OverflowReport(kind="not_reproduced", scale=scale,
                            num_functions=len(forward.records), loss_value=loss_value)
    at_scale = replay.backward(scale)
    report.nonfinite_params = at_scale.bad_params
    if _forward_is_to_blame(report, forward.culprit, at_scale):
        _forward_finding(report, forward, forward.culprit, chain_length)
    elif at_scale.origins:  # the same batch at scale 1: an overflow, or a model problem?
        at_one = at_scale if scale == 1.0 else replay.backward(1.0)
        _backward_finding(report, forward, at_scale, at_one, forward.culprit, chain_length)
    elif forward.culprit is not None:
        report.notes.append(_masked_and_harmless(forward.culprit))
    return _closing_notes(report, replay.params)


# --------------------------------------------------------------------------- replay


def _checked_arguments(loss: Any, scale: float, params: Optional[Mapping[str, Any]],
                       chain_length: int) -> Tuple[float, Mapping[str, Any], int]:
    """The arguments of :func:`diagnose`, checked; ``params`` defaults to nnabla's."""
    import nnabla as nn

    if not isinstance(loss, nn.Variable):
        raise TypeError(f"loss must be an nnabla.Variable, got {loss!r} of type "
                        f"{type(loss).__name__}")
    scale = check.real("scale", scale, gt=0.0)
    chain_length = check.integer("chain_length", chain_length, ge=1)
    if params is None:
        params = nn.get_parameters(grad_only=False)
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be None or a mapping name -> nnabla.Variable "
                        f"(e.g. solver.get_parameters()), got {type(params).__name__}")
    return scale, params, chain_length


@dataclass
class _Backward:
    """A watched backward pass and the parameters whose gradients it left non-finite."""

    watch: BackwardWatch
    bad_params: List[str]
    blamed: List[Dict[str, Any]]   # the watch's origins that reach those parameters

    @property
    def origins(self) -> List[Dict[str, Any]]:
        """The origins to blame: those reaching a parameter, else all of them."""
        return self.blamed or self.watch.origins


class _Replay:
    """The graph under diagnosis: its loss, its named parameters, its leaf variables that
    need a gradient (by hash), and the arrays that training keeps and a replay would write:
    those of the leaf variables that need no gradient (BatchNormalization's running
    statistics are updated in place by every forward pass in training mode) and the
    loss's own (the step's loss), copied when it is made.

    Used as a context manager, it leaves on exit the gradients of the graph's leaf
    variables and of the parameters zero, and writes the copied arrays back bitwise, in the
    dtype they held.
    """

    def __init__(self, loss: Any, params: Mapping[str, Any]) -> None:
        self.loss = loss
        self.params = params
        leaves = [v for v in graph.graph_inputs(loss) if v.parent is None]
        self.leaves = {hash(v): v for v in leaves if v.need_grad}
        kept = [v.data for v in leaves if not v.need_grad] + [loss.data]
        self._saved = [(a, np.array(a.data, copy=True)) for a in kept
                       if dtype_name(a) != "uninitialized"]

    def __enter__(self) -> "_Replay":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.zero_grads()
        for array, values in self._saved:
            array.cast(values.dtype)[...] = values

    def zero_grads(self) -> None:
        for v in self.leaves.values():
            v.grad.zero()
        for v in self.params.values():
            v.grad.zero()

    def backward(self, scale: float) -> _Backward:
        """Zero the gradients, then run a watched backward pass at ``scale``."""
        self.zero_grads()
        watch = BackwardWatch().run(self.loss, scale)
        bad = [name for name, v in self.params.items()
               if hash(v) in self.leaves and array_stats(v.g)[0]]
        return _Backward(watch, bad, watch.responsible([hash(self.params[n]) for n in bad]))


# --------------------------------------------------------------------------- classification


def _forward_is_to_blame(report: OverflowReport, fwd: Optional[Dict[str, Any]],
                         at_scale: _Backward) -> bool:
    """Whether there is a forward culprit and it explains the finding: the loss is not
    finite, no parameter gradient is (the inf/NaN are masked), or its own backward pass is
    an origin of a parameter's non-finite gradient."""
    if fwd is None:
        return False
    return (not report.loss_finite or not report.nonfinite_params
            or any(o["fhash"] == hash(fwd["f"]) for o in at_scale.blamed))


def _forward_finding(report: OverflowReport, forward: ForwardWatch, fwd: Dict[str, Any],
                     chain_length: int, at_any_scale: bool = False) -> None:
    """A model or data problem found in the forward pass.

    When the loss is finite but parameter gradients are not, the culprit's inf/NaN are
    masked before the loss, yet its backward pass turns them into NaN gradients: a note
    says so (``at_any_scale``: even at scale 1).
    """
    report.kind, report.phase = fwd["kind"], "forward"
    report.bad_leaves = list(fwd.get("bad_leaves", []))      # a data culprit's
    forward.describe(report, fwd, chain_length)
    if report.loss_finite and report.nonfinite_params:
        report.notes.append(
            f"the inf/NaN of {report.function} are masked before the loss, but its backward "
            "pass still turns them into NaN gradients (0 * inf)"
            + (", at any scale." if at_any_scale else "."))


def _backward_finding(report: OverflowReport, forward: ForwardWatch, at_scale: _Backward,
                      at_one: _Backward, masked: Optional[Dict[str, Any]],
                      chain_length: int) -> None:
    """An overflow (finite at scale 1) or a model problem (not finite even at scale 1) in
    the backward pass; or the masked forward culprit ``masked`` when it is the one whose
    backward pass is not finite at scale 1."""
    report.phase = "backward"
    report.finite_at_scale_one = not at_one.bad_params
    if at_one.bad_params:
        culprit = (at_one.origins or at_scale.origins)[0]
        if masked is not None and culprit["fhash"] == hash(masked["f"]):
            _forward_finding(report, forward, masked, chain_length, at_any_scale=True)
            return
        report.kind = "model"
    else:
        culprit = at_scale.origins[0]
        report.kind = "overflow"
        report.max_grad_at_scale_one = at_one.watch.grad_max
    report.output_grad_max_abs = list(culprit["out_grad_max"])
    report.input_grad_dtypes = list(culprit["in_grad_dtypes"])
    forward.describe(report, culprit, chain_length)
    _scale_findings(report, forward, culprit, at_scale, at_one)
    if masked is not None:
        report.notes.append(_masked_and_harmless(masked))


def _scale_findings(report: OverflowReport, forward: ForwardWatch, culprit: Dict[str, Any],
                    at_scale: _Backward, at_one: _Backward) -> None:
    """Other overflowing functions, the largest safe scale, and a scale that is itself
    beyond the gradient dtype's range."""
    others = [o for o in at_scale.blamed if o is not culprit]
    if others and report.kind == "overflow":
        report.notes.append(
            "other functions whose overflow reaches the parameters: " + ", ".join(
                f"{o['f'].info.type_name} (#{forward.position(o['f'])})"
                for o in others) + ".")
    narrowest = narrowest_float(report.input_grad_dtypes)
    gmax = None if narrowest is None else float_type(narrowest).max
    grad_max_at_one = at_one.watch.grad_max
    if report.kind == "overflow" and gmax is not None and grad_max_at_one > 0:
        report.max_safe_scale = 2.0 ** math.floor(math.log2(gmax / grad_max_at_one))
    if gmax is not None and report.scale > gmax:
        report.notes.append(
            f"the scale {fmt_scale(report.scale)} itself is larger than the largest "
            f"{narrowest} value ({gmax:.6g}): the "
            "gradient seeded into the backward pass cannot be represented, "
            "whatever the model does.")


# --------------------------------------------------------------------------- notes


def _masked_and_harmless(fwd: Dict[str, Any]) -> str:
    return (f"{fwd['f'].info.type_name} (#{fwd['index']}) also produces inf/NaN in forward, "
            "but they are masked before the loss and reach no parameter.")


def _closing_notes(report: OverflowReport, params: Mapping[str, Any]) -> OverflowReport:
    """Notes that depend only on the finished report."""
    if report.kind in ("model", "data") and report.phase == "forward":
        big = [report.input_names[i] for i, m in enumerate(report.input_max_abs)
               if m > FP16_MAX]
        if big and any(d == "float16" for d in report.output_dtypes):
            report.notes.append(
                "input(s) " + ", ".join(big) + " hold finite values beyond the float16 "
                "range (65504) that become inf when cast to float16.")
    if report.kind == "data" and any(n in params for n in report.bad_leaves):
        report.notes.append("a parameter already holds inf/NaN: an earlier update or a "
                            "loaded checkpoint corrupted it.")
    return report

