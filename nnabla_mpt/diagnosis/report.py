"""What a diagnosis found, for programs and as a text for people.

:class:`OverflowReport` holds the finding of :func:`nnabla_mpt.diagnose`
and prints as a report: what happened, where, why it matters and what to do (the advice for
common culprit functions is a table here). :class:`LossScaleCollapseError` carries a report
when the loss scale collapses.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from typing import Dict, List, Literal, Optional, Tuple

__all__ = ["OverflowReport", "LossScaleCollapseError"]

Kind = Literal["overflow", "model", "data", "not_reproduced"]
Phase = Literal["forward", "backward"]


@dataclass
class OverflowReport:
    """What a replay of the last batch found out about non-finite gradients.

    Attributes:
        kind: ``"overflow"`` when only the backward pass at the given scale produces
            inf/NaN (a scaling problem: the same batch is finite at scale 1);
            ``"model"`` when a function produces inf/NaN from finite inputs in the
            forward pass, or in the backward pass even at scale 1 (lowering the scale
            cannot fix it); ``"data"`` when the graph's leaf variables (input data or
            parameters) already hold inf/NaN, so no function is to blame;
            ``"not_reproduced"`` when the replay is finite everywhere.
        phase: ``"forward"``, ``"backward"`` or ``None`` when nothing was found.
        function: Type name of the culprit function (``f.info.type_name``, e.g.
            ``"Log"``); for ``"data"`` the first function that consumed the bad values.
        index: Position of the culprit in the execution order of its phase (0-based).
        forward_index: Position of the culprit in forward execution order (0-based).
        num_functions: Number of functions in the forward pass.
        scope: Parameter scope of the culprit's own parameters, or of the nearest
            parametric function upstream of it (see ``scope_is_upstream``).
        scope_is_upstream: True when ``scope`` belongs to a function upstream.
        path: Chain of functions producing the culprit's first input, ending with the
            culprit, e.g. ``"Affine#0[fc] -> Softmax#1 -> Log#2"``.
        input_names: Readable name of each input: parameter name, variable name,
            producing function (``"Softmax#1"``) or ``"input #k"`` for unnamed data.
        input_shapes: Shape of each input.
        input_dtypes: Storage dtype of each input's data.
        input_max_abs: Largest absolute finite value of each input (NaN if none).
        input_min_abs: Smallest absolute finite value of each input (NaN if none).
        input_nonfinite: Number of inf/NaN values in each input.
        output_shapes: Shape of each output.
        output_dtypes: Storage dtype of each output's data.
        output_grad_max_abs: For a backward culprit, the largest absolute gradient
            flowing into it (its outputs' gradients, all finite); empty otherwise.
        input_grad_dtypes: For a backward culprit, the dtype of each input gradient.
        bad_leaves: For ``"data"``, names of the leaf variables holding inf/NaN.
        nonfinite_params: Names of the parameters whose gradients are non-finite after
            the replay at ``scale``.
        loss_value: Value of the loss in the replay (before any scaling).
        scale: Loss scale used for the replayed backward pass.
        finite_at_scale_one: For a backward culprit, whether a backward pass at scale 1
            is finite (``None`` when not tried).
        max_grad_at_scale_one: For ``"overflow"``, the largest absolute gradient seen in
            the backward pass at scale 1; ``None`` otherwise.
        max_safe_scale: For ``"overflow"``, the largest power of two that keeps that
            gradient inside the gradient dtype's range; ``None`` otherwise.
        notes: Further observations, one sentence each.
    """

    kind: Kind
    phase: Optional[Phase] = None
    function: Optional[str] = None
    index: Optional[int] = None
    forward_index: Optional[int] = None
    num_functions: int = 0
    scope: Optional[str] = None
    scope_is_upstream: bool = False
    path: str = ""
    input_names: List[str] = field(default_factory=list)
    input_shapes: List[Tuple[int, ...]] = field(default_factory=list)
    input_dtypes: List[str] = field(default_factory=list)
    input_max_abs: List[float] = field(default_factory=list)
    input_min_abs: List[float] = field(default_factory=list)
    input_nonfinite: List[int] = field(default_factory=list)
    output_shapes: List[Tuple[int, ...]] = field(default_factory=list)
    output_dtypes: List[str] = field(default_factory=list)
    output_grad_max_abs: List[float] = field(default_factory=list)
    input_grad_dtypes: List[str] = field(default_factory=list)
    bad_leaves: List[str] = field(default_factory=list)
    nonfinite_params: List[str] = field(default_factory=list)
    loss_value: float = float("nan")
    scale: float = 1.0
    finite_at_scale_one: Optional[bool] = None
    max_grad_at_scale_one: Optional[float] = None
    max_safe_scale: Optional[float] = None
    notes: List[str] = field(default_factory=list)

    # ------------------------------------------------------------------ properties
    @property
    def found(self) -> bool:
        """True when the replay located the origin of the non-finite values."""
        return self.kind != "not_reproduced"

    @property
    def loss_finite(self) -> bool:
        """True when the loss value (before scaling) is finite."""
        return math.isfinite(self.loss_value)

    @property
    def harmless(self) -> bool:
        """True when inf/NaN appear but are masked before the loss and every parameter
        gradient: the overflow check never sees them and no step is skipped for them."""
        return self.found and self.loss_finite and not self.nonfinite_params

    @property
    def scale_helps(self) -> bool:
        """True when a smaller loss scale makes this batch finite (kind "overflow")."""
        return self.kind == "overflow"

    # ------------------------------------------------------------------ text
    def summary(self) -> str:
        """One line: what was found, where, and in which phase."""
        if self.kind == "not_reproduced":
            return ("no function reproduced the non-finite gradients when replaying the "
                    f"current batch at scale {fmt_scale(self.scale)}")
        if self.kind == "data":
            what = ", ".join(self.bad_leaves) or "a leaf variable"
            return (f"the graph's inputs already contain inf/NaN ({what}), first used by "
                    f"{self.function} (#{self.index}) in forward")
        where = f" in {self.scope}" if self.scope and not self.scope_is_upstream else (
            f" after {self.scope}" if self.scope else "")
        if self.kind == "model" and self.phase == "forward":
            return (f"{self.function} (#{self.index}){where} produced inf/NaN from finite "
                    "inputs in forward")
        if self.kind == "model":
            return (f"{self.function} (#{self.forward_index}){where} produced non-finite "
                    "gradients in backward from finite gradients, even at scale 1")
        return (f"{self.function} (#{self.forward_index}){where} overflowed in backward at "
                f"scale {fmt_scale(self.scale)} (finite at scale 1)")

    def __str__(self) -> str:
        lines = [f"Loss-scale diagnosis: {self.kind}"
                 + (f" ({self.phase})" if self.phase else ""),
                 f"  What happened: {self.summary()}."]
        if self.function is not None:
            lines.append(f"  Where: {self.path}")
            lines.append(f"    function #{self.forward_index} of {self.num_functions} in "
                         "forward order" + (f", #{self.index} in backward order"
                                            if self.phase == "backward" else ""))
            for k, name in enumerate(self.input_names):
                bad = f", {self.input_nonfinite[k]} inf/NaN" if self.input_nonfinite[k] else ""
                lines.append(f"    input {k}: {name} {self.input_dtypes[k]} "
                             f"{self.input_shapes[k]}, max |x| "
                             f"{self.input_max_abs[k]:.6g} (finite part), min |x| "
                             f"{self.input_min_abs[k]:.6g}{bad}")
            for k, shape in enumerate(self.output_shapes):
                lines.append(f"    output {k}: {self.output_dtypes[k]} {shape}")
            if self.output_grad_max_abs:
                at = 1.0 if self.kind == "model" else self.scale
                lines.append("    gradient flowing in: max |g| "
                             + ", ".join(f"{g:.6g}" for g in self.output_grad_max_abs)
                             + f" (finite, at scale {fmt_scale(at)})")
        lines.append(f"  Loss before scaling: {self.loss_value:.6g}"
                     + ("" if self.loss_finite else
                        " -- non-finite before any scaling: a model/data problem, "
                        "not an overflow"))
        lines += _wrap(f"Parameters with non-finite gradients at scale "
                       f"{fmt_scale(self.scale)}: "
                       + (", ".join(self.nonfinite_params) or "none"))
        if self.max_grad_at_scale_one is not None:
            lines += _wrap(f"Largest gradient at scale 1: "
                           f"{self.max_grad_at_scale_one:.6g}"
                           + (f"; scales up to {fmt_scale(self.max_safe_scale)} keep it "
                              "in range" if self.max_safe_scale else ""))
        lines += _wrap(f"Why it matters: {self._why()}")
        lines += _wrap(f"What to do: {self._advice()}")
        for note in self.notes:
            lines += _wrap(f"Note: {note}")
        return "\n".join(lines)

    def _why(self) -> str:
        if self.harmless:
            return ("harmless for training: the non-finite values are masked before they "
                    "reach the loss or any parameter gradient, so the overflow check never "
                    "sees them and no step is skipped for them.")
        if self.kind == "overflow":
            return ("this is a scaling problem: the batch is finite at scale 1 and only the "
                    "scaled gradients exceed the gradient dtype's range. Backing the scale "
                    "off fixes it; a streak means the scale is set too high or the "
                    "gradients grew.")
        if self.kind == "model":
            return ("lowering the loss scale will not fix this: the values are non-finite "
                    "at any scale, so every step on such a batch is skipped (a scale that "
                    "backed off for it would sink to its floor).")
        if self.kind == "data":
            return ("the non-finite values exist before any function runs; no loss scale "
                    "can fix them and every step on such a batch is skipped.")
        return ("the batch still held in the input variables is finite at this scale, so "
                "the non-finite gradients came from somewhere the replay cannot see.")

    def _advice(self) -> str:
        if self.kind == "not_reproduced":
            return ("the overflow came from another batch: an earlier micro-batch when "
                    "accumulating gradients, a data feeder that has moved on, another "
                    "rank's batch or the sum over ranks, or random functions (Dropout) "
                    "that draw differently in the replay. Diagnose with accum_grad=1 on a "
                    "single process, or call diagnose() right after the failing "
                    "micro-batch.")
        if self.kind == "data":
            return ("check the batch with numpy.isfinite before feeding it; if the bad "
                    "values sit in a parameter, it was corrupted earlier (an update applied "
                    "with non-finite gradients or a damaged checkpoint): reload a good "
                    "checkpoint.")
        if self.harmless:
            return ("nothing needs fixing. The check is kept on by default; a fixed scale "
                    "with the check off is also safe for this overflow "
                    f"(FixedLossScalingUpdater(solver, loss, feeder, "
                    f"scale={self.scale:g}, enable_overflow_check=False)) as long as "
                    "diagnose() lists no parameter at that scale on your batches.")
        if self.kind == "overflow":
            cap = f"{self.max_safe_scale:g}" if self.max_safe_scale else "S"
            return (f"use a scale of at most {cap}: policy=DynamicLossScale(max_scale={cap}) "
                    f"for the dynamic updater (it also backs off by itself), scale={cap} for the "
                    f"fixed one. When "
                    "the overflow is harmless for training (masked or clipped before it "
                    "reaches an update), a fixed scale with the check off is right: "
                    f"FixedLossScalingUpdater(solver, loss, feeder, scale={cap}, "
                    "enable_overflow_check=False).")
        return (_FUNCTION_ADVICE.get((self.function, self.phase))
                or _FUNCTION_ADVICE.get((self.function, None))
                or (f"check the range of {self.function}'s inputs (see max |x| and min "
                    "|x| above), clamp them, or compute this part of the graph in "
                    "float32 (build it under a float context)."))


def _wrap(text: str, width: int = 88) -> List[str]:
    return textwrap.wrap(text, width=width, initial_indent="  ", subsequent_indent="    ",
                         break_long_words=False, break_on_hyphens=False)


def fmt_scale(s: float) -> str:
    if s > 0 and math.isfinite(s):
        e = math.log2(s)
        if e == int(e) and abs(e) >= 4:
            return f"2**{int(e)} ({s:.10g})"
    return f"{s:.10g}"


_RANGE = ("the result exceeds the float16 range (max 65504): normalize the inputs, reduce "
          "with a mean instead of a sum, or compute this part in float32 (build it under "
          "a float context).")
_FUNCTION_ADVICE: Dict[Tuple[str, Optional[str]], str] = {
    ("Log", None): ("clamp the input of Log away from zero: F.log(F.maximum_scalar(x, eps)) "
                    "with eps around 1e-4 in float16; if x is a softmax output, use "
                    "F.log_softmax or F.softmax_cross_entropy, which never take the log of "
                    "an underflowed probability."),
    ("Exp", None): ("exp overflows float16 above about 11.09: clamp the input with "
                    "F.exp(F.minimum_scalar(x, 11.0)) or use a fused function "
                    "(F.log_softmax, F.softplus)."),
    ("Div2", None): ("the denominator reaches zero: divide by F.maximum_scalar(b, eps) "
                     "(or b + eps for a positive b)."),
    ("RDivScalar", None): ("the divisor reaches zero: use F.maximum_scalar(x, eps) as "
                           "the divisor."),
    ("PowScalar", "forward"): ("a negative power of zero is not finite: clamp the base "
                               "with F.maximum_scalar(x, eps)."),
    ("PowScalar", "backward"): ("the derivative of x ** p for p < 1 is infinite at x = 0: "
                                "keep the base away from zero, e.g. "
                                "F.pow_scalar(x + eps, p) for a non-negative x, or "
                                "F.pow_scalar(F.maximum_scalar(x, eps), p)."),
    ("Norm", "backward"): ("the norm of an all-zero vector has no derivative (0/0): add "
                           "eps under the root, F.pow_scalar(F.sum(x ** 2, axis) + eps, "
                           "0.5)."),
    **{(name, "forward"): _RANGE for name in ("Affine", "Convolution", "BatchMatmul", "Sum",
                                              "SumPooling", "MulScalar", "Mul2")},
}


class LossScaleCollapseError(FloatingPointError):
    """Raised when the loss scale collapses; ``.report`` holds the diagnosis.

    The message names the culprit function and the phase, followed by the full report.

    Args:
        report: The diagnosis explaining the collapse.
        reason: What triggered the diagnosis (e.g. "8 consecutive overflowing steps").
        loss_at_fault: Whether every step of the streak had a non-finite loss: the
            message then starts with "non-finite loss", as no smaller scale can help.
    """

    def __init__(self, report: OverflowReport, reason: Optional[str] = None,
                 loss_at_fault: bool = False) -> None:
        self.report = report
        self.reason = reason
        self.loss_at_fault = loss_at_fault
        what = "non-finite loss" if loss_at_fault else "loss scale collapse"
        head = f"{what} ({reason}): " if reason else f"{what}: "
        super().__init__(head + report.summary() + "\n" + str(report))

    def __reduce__(self):  # keep the report when pickled (e.g. across processes)
        return (type(self), (self.report, self.reason, self.loss_at_fault))
