"""Explain why gradients stop being finite.

:func:`diagnose` replays the forward and backward pass of a loss on the batch that is
still held in the graph's input variables, watching every function through nnabla's
function hooks, and returns an :class:`OverflowReport` naming the first function that
turned finite values into inf/NaN. The updaters call it only when a streak of
overflowing steps or an overflow at the scale floor calls for an explanation; a healthy
step never runs any of this code.

The report is a dataclass for programs (``report.kind``, ``report.function``,
``report.phase``, ``report.nonfinite_params``, ...) and prints as a text for people.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from . import _validate as check
from .dtypes import FP16_MAX
from .report import LossScaleCollapseError, OverflowReport, fmt_scale
from .watch import (BackwardWatch, ForwardWatch, array_stats, narrowest_float,
                    narrowest_float_max)

__all__ = ["OverflowReport", "LossScaleCollapseError", "diagnose"]


def diagnose(loss: Any, scale: float, params: Optional[Mapping[str, Any]] = None, *,
             chain_length: int = 6) -> OverflowReport:
    """Replay the current batch and find where inf/NaN first appear.

    Runs ``loss.forward`` and ``loss.backward(scale)`` again on the data still held in
    the graph's input variables, keeping every buffer (``clear_no_need_grad=False``,
    ``clear_buffer=False``) and watching each function through nnabla's
    ``function_pre_hook``/``function_post_hook``. The first function whose outputs are
    non-finite while its inputs are finite is the culprit; in the backward pass, the
    first function whose input gradients become non-finite while the gradients flowing
    into it are finite. A backward culprit is checked again at scale 1 to tell an
    overflow (fixed by a smaller scale) from a model problem.

    Call it only after a step was skipped: the gradients of the graph's leaf variables
    (parameters included) are zeroed before the replay and are zero again on return.
    Random functions (Dropout) draw new values in the replay.

    Args:
        loss: The loss ``nnabla.Variable`` the training step differentiates.
        scale: The loss scale of the failing step (> 0).
        params: Mapping name -> parameter ``Variable`` used to name parameters (e.g.
            ``solver.get_parameters()``); ``None`` uses nnabla's global parameters.
        chain_length: Number of functions shown in :attr:`OverflowReport.path`.

    Returns:
        An :class:`OverflowReport`; ``report.kind`` classifies the finding.

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

    rp = ForwardWatch(params)
    report = OverflowReport(kind="not_reproduced", scale=scale)

    # forward --------------------------------------------------------------------
    rp.run(loss)
    report.num_functions = len(rp.records)
    report.loss_value = float(np.asarray(loss.d, dtype=np.float64).reshape(-1)[0]) \
        if loss.size == 1 else float(np.asarray(loss.d, dtype=np.float64).sum())

    def zero_grads() -> None:
        for v in rp.leaves.values():
            v.grad.zero()
        for v in params.values():
            v.grad.zero()

    def nonfinite_params() -> List[str]:
        return [name for name, v in params.items()
                if hash(v) in rp.leaves and array_stats(v.g)[0]]

    def bad_hashes(names: List[str]) -> List[int]:
        return [hash(params[n]) for n in names]

    def forward_finding(fwd: Dict[str, Any]) -> None:
        report.kind, report.phase = fwd["kind"], "forward"
        if fwd["kind"] == "data":
            report.bad_leaves = list(fwd["bad_leaves"])
        rp.describe(report, fwd, chain_length)

    try:
        zero_grads()
        fwd = rp.culprit
        watch = BackwardWatch().run(loss, scale)
        report.nonfinite_params = nonfinite_params()
        blamed = watch.responsible(bad_hashes(report.nonfinite_params))
        masked_fwd = None
        if fwd is not None:
            fkey = hash(fwd["f"])
            if (not report.loss_finite or not report.nonfinite_params
                    or any(o["fhash"] == fkey for o in blamed)):
                forward_finding(fwd)
                if report.loss_finite and report.nonfinite_params:
                    report.notes.append(
                        f"the inf/NaN of {report.function} are masked before the loss, "
                        "but its backward pass still turns them into NaN gradients "
                        "(0 * inf).")
                return _finish(report, params)
            masked_fwd = fwd
        origins = blamed or watch.origins
        if origins:
            report.phase = "backward"
            # The same batch at scale 1: an overflow, or a model problem?
            if scale == 1.0:
                at_one, bad_one = watch, report.nonfinite_params
            else:
                zero_grads()
                at_one = BackwardWatch().run(loss, 1.0)
                bad_one = nonfinite_params()
            report.finite_at_scale_one = not bad_one
            culprit = origins[0]
            if bad_one:
                culprit = (at_one.responsible(bad_hashes(bad_one)) or at_one.origins
                           or [culprit])[0]
                if masked_fwd is not None and culprit["fhash"] == hash(masked_fwd["f"]):
                    forward_finding(masked_fwd)
                    report.notes.append(
                        f"the inf/NaN of {report.function} are masked before the loss, "
                        "but its backward pass still turns them into NaN gradients "
                        "(0 * inf), at any scale.")
                    return _finish(report, params)
                report.kind = "model"
            else:
                report.kind = "overflow"
                report.max_grad_at_scale_one = at_one.grad_max
            report.output_grad_max_abs = list(culprit["out_grad_max"])
            report.input_grad_dtypes = list(culprit["in_grad_dtypes"])
            rp.describe(report, culprit, chain_length)
            others = [o for o in blamed if o is not culprit]
            if others and report.kind == "overflow":
                report.notes.append(
                    "other functions whose overflow reaches the parameters: " + ", ".join(
                        f"{o['f'].info.type_name} (#{rp.position(o['f'])})"
                        for o in others) + ".")
            gmax = narrowest_float_max(report.input_grad_dtypes)
            if report.kind == "overflow" and gmax is not None and at_one.grad_max > 0:
                report.max_safe_scale = 2.0 ** math.floor(math.log2(gmax / at_one.grad_max))
            if gmax is not None and scale > gmax:
                report.notes.append(
                    f"the scale {fmt_scale(scale)} itself is larger than the largest "
                    f"{narrowest_float(report.input_grad_dtypes)} value ({gmax:.6g}): the "
                    "gradient seeded into the backward pass cannot be represented, "
                    "whatever the model does.")
        if masked_fwd is not None:
            f = masked_fwd["f"]
            report.notes.append(
                f"{f.info.type_name} (#{masked_fwd['index']}) also produces inf/NaN in "
                "forward, but they are masked before the loss and reach no parameter.")
    finally:
        zero_grads()
    return _finish(report, params)


def _finish(report: OverflowReport, params: Mapping[str, Any]) -> OverflowReport:
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

