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
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from . import _validate as check
from .dtypes import FP16_MAX
from .report import LossScaleCollapseError, OverflowReport, fmt_scale

__all__ = ["OverflowReport", "LossScaleCollapseError", "diagnose"]


# --------------------------------------------------------------------------- replay


def _stats(arr: np.ndarray) -> Tuple[int, float, float]:
    """(number of non-finite values, max |finite|, min |finite|) of an array."""
    a = np.asarray(arr)
    if a.size == 0:
        return 0, float("nan"), float("nan")
    if a.dtype.kind not in "fc":
        aa = np.abs(a)
        return 0, float(aa.max()), float(aa.min())
    fin = np.isfinite(a)
    bad = int(a.size - np.count_nonzero(fin))
    if bad == a.size:
        return bad, float("nan"), float("nan")
    aa = np.abs(a[fin] if bad else a).astype(np.float64)
    return bad, float(aa.max()), float(aa.min())


def _dtype_name(array: Any) -> str:
    try:
        return str(array.dtype)
    except Exception:  # an array never written has no dtype yet
        return "uninitialized"


def _scope_of(names: List[str]) -> Optional[str]:
    if not names:
        return None
    parts = [n.split("/")[:-1] for n in names]
    common: List[str] = []
    for level in zip(*parts):
        if all(p == level[0] for p in level):
            common.append(level[0])
        else:
            break
    return "/".join(common) if common else names[0]


@dataclass
class _Rec:
    type_name: str
    inputs: List[int]
    outputs: List[int]
    params: List[str]


class _Replay:
    """State shared by the hooks of one diagnosis."""

    def __init__(self, param_names: Dict[int, str]) -> None:
        self.param_names = param_names
        self.records: List[_Rec] = []
        self.producer: Dict[int, int] = {}       # output hash -> forward index
        self.fwd_index: Dict[int, int] = {}      # function hash -> forward index
        self.finite: Dict[int, bool] = {}        # variable hash -> data all finite
        self.leaves: Dict[int, Any] = {}         # leaf hash -> Variable (need_grad)
        self.leaf_names: Dict[int, str] = {}
        self.error: Optional[BaseException] = None
        self.culprit: Optional[Dict[str, Any]] = None

    # names ------------------------------------------------------------------
    def name_of(self, var: Any) -> str:
        h = hash(var)
        if h in self.param_names:
            return self.param_names[h]
        if h in self.producer:
            k = self.producer[h]
            return f"{self.records[k].type_name}#{k}"
        if h not in self.leaf_names:
            n = var.name
            self.leaf_names[h] = f"input '{n}'" if n else f"input #{len(self.leaf_names)}"
        return self.leaf_names[h]

    # forward hooks ----------------------------------------------------------
    def fwd_pre(self, f: Any) -> None:
        if self.error is not None:
            return
        try:
            leaves = [v for v in f.inputs if v.parent is None]
            for v in leaves:
                if v.need_grad:
                    self.leaves.setdefault(hash(v), v)
            if self.culprit is not None:
                return
            bad = []
            for v in leaves:
                h = hash(v)
                if h not in self.finite:
                    self.finite[h] = _stats(v.d)[0] == 0
                if not self.finite[h]:
                    bad.append(self.name_of(v))
            if bad:
                k = len(self.records)
                self._add_record(f)
                self.culprit = dict(kind="data", phase="forward", f=f, index=k,
                                    bad_leaves=bad)
        except BaseException as e:  # surfaced after the pass; nnabla would mask it
            self.error = e

    def _add_record(self, f: Any) -> None:
        k = len(self.records)
        ins = [hash(v) for v in f.inputs]
        outs = [hash(v) for v in f.outputs]
        self.records.append(_Rec(f.info.type_name, ins, outs,
                                 [self.param_names[h] for h in ins
                                  if h in self.param_names]))
        self.fwd_index[hash(f)] = k
        for h in outs:
            self.producer[h] = k

    def fwd_post(self, f: Any) -> None:
        if self.error is not None:
            return
        try:
            if hash(f) in self.fwd_index:   # recorded by fwd_pre (a data culprit)
                return
            k = len(self.records)
            self._add_record(f)
            if self.culprit is not None:
                return
            outputs_finite = True
            for v in f.outputs:
                fin = _stats(v.d)[0] == 0
                self.finite[hash(v)] = fin
                outputs_finite &= fin
            if not outputs_finite and all(self.finite.get(hash(v), True)
                                          for v in f.inputs):
                self.culprit = dict(kind="model", phase="forward", f=f, index=k)
        except BaseException as e:
            self.error = e

    def raise_error(self) -> None:
        if self.error is not None:
            err, self.error = self.error, None
            raise err

    # description ------------------------------------------------------------
    def describe(self, report: OverflowReport, culprit: Dict[str, Any],
                 chain_length: int) -> None:
        f = culprit["f"]
        k = self.fwd_index.get(hash(f))
        report.function = f.info.type_name
        report.index = culprit["index"]
        report.forward_index = k
        report.input_names = [self.name_of(v) for v in f.inputs]
        report.input_shapes = [tuple(v.shape) for v in f.inputs]
        stats = [_stats(v.d) for v in f.inputs]
        report.input_dtypes = [_dtype_name(v.data) for v in f.inputs]
        report.input_nonfinite = [s[0] for s in stats]
        report.input_max_abs = [s[1] for s in stats]
        report.input_min_abs = [s[2] for s in stats]
        report.output_shapes = [tuple(v.shape) for v in f.outputs]
        report.output_dtypes = [_dtype_name(v.data) for v in f.outputs]
        if k is None:
            report.path = report.function
            return
        # producing chain along the first input that has a producer
        chain = [k]
        cur = k
        while len(chain) < chain_length:
            ups = [self.producer[h] for h in self.records[cur].inputs if h in self.producer]
            if not ups:
                break
            cur = ups[0]
            chain.append(cur)
        truncated = len(chain) == chain_length and any(
            h in self.producer for h in self.records[chain[-1]].inputs)
        parts = []
        for j in reversed(chain):
            rec = self.records[j]
            sc = _scope_of(rec.params)
            parts.append(f"{rec.type_name}#{j}" + (f"[{sc}]" if sc else ""))
        report.path = ("... -> " if truncated else "") + " -> ".join(parts)
        # own scope, else the nearest parametric function upstream (any input)
        own = _scope_of(self.records[k].params)
        if own:
            report.scope = own
            return
        seen, todo = set(), [k]
        while todo:
            j = todo.pop(0)
            for h in self.records[j].inputs:
                u = self.producer.get(h)
                if u is None or u in seen:
                    continue
                seen.add(u)
                sc = _scope_of(self.records[u].params)
                if sc:
                    report.scope, report.scope_is_upstream = sc, True
                    return
                todo.append(u)


class _BackwardWatch:
    """Hooks for one backward pass: where gradients turn non-finite, and who is to blame.

    A function is an *origin* when it turns an input gradient non-finite while every
    gradient flowing into it (its outputs' gradients) is finite. Each variable remembers
    the function that first made its gradient non-finite, so a non-finite parameter
    gradient can be traced back through the propagating functions to its origins.
    """

    def __init__(self) -> None:
        self.count = 0
        self.error: Optional[BaseException] = None
        self.grad_bad: Dict[int, bool] = {}
        self.turned_bad_by: Dict[int, int] = {}   # variable hash -> backward index
        self.bad_outputs: Dict[int, List[int]] = {}  # backward index -> bad output hashes
        self.origins: List[Dict[str, Any]] = []
        self.grad_max = 0.0
        self._out: List[Tuple[int, float, float]] = []

    def pre(self, f: Any) -> None:
        if self.error is not None:
            return
        try:
            self._out = [_stats(v.g) for v in f.outputs]
        except BaseException as e:  # surfaced after the pass; nnabla would mask it
            self.error = e

    def post(self, f: Any) -> None:
        idx = self.count
        self.count += 1
        if self.error is not None:
            return
        try:
            out = self._out
            newly = False
            in_stats: List[Tuple[int, float, float]] = []
            for v in f.inputs:
                if not v.need_grad:
                    continue
                st = _stats(v.g)
                in_stats.append(st)
                h = hash(v)
                if st[0] and not self.grad_bad.get(h, False):
                    self.turned_bad_by[h] = idx
                    self.grad_bad[h] = newly = True
            for st in out + in_stats:
                if not math.isnan(st[1]):
                    self.grad_max = max(self.grad_max, st[1])
            if newly:
                bad_out = [hash(v) for v, st in zip(f.outputs, out) if st[0]]
                self.bad_outputs[idx] = bad_out
                if not bad_out:
                    self.origins.append(dict(
                        f=f, index=idx, fhash=hash(f),
                        out_grad_max=[st[1] for st in out],
                        in_grad_dtypes=[_dtype_name(v.grad) if v.need_grad else "-"
                                        for v in f.inputs]))
        except BaseException as e:
            self.error = e

    def run(self, loss: Any, scale: float) -> "_BackwardWatch":
        loss.backward(scale, clear_buffer=False, function_pre_hook=self.pre,
                      function_post_hook=self.post)
        if self.error is not None:
            raise self.error
        return self

    def responsible(self, var_hashes: List[int]) -> List[Dict[str, Any]]:
        """Origins whose non-finite gradients reach the given variables, in order."""
        by_index = {o["index"]: o for o in self.origins}
        found, seen = set(), set()
        todo = [self.turned_bad_by[h] for h in var_hashes if h in self.turned_bad_by]
        while todo:
            g = todo.pop()
            if g in seen:
                continue
            seen.add(g)
            if g in by_index:
                found.add(g)
                continue
            todo.extend(self.turned_bad_by[h] for h in self.bad_outputs.get(g, [])
                        if h in self.turned_bad_by)
        return [by_index[i] for i in sorted(found)]


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
    param_names = {hash(v): name for name, v in params.items()}

    rp = _Replay(param_names)
    report = OverflowReport(kind="not_reproduced", scale=scale)

    # forward --------------------------------------------------------------------
    loss.forward(clear_no_need_grad=False, function_pre_hook=rp.fwd_pre,
                 function_post_hook=rp.fwd_post)
    rp.raise_error()
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
                if hash(v) in rp.leaves and _stats(v.g)[0]]

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
        watch = _BackwardWatch().run(loss, scale)
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
                at_one = _BackwardWatch().run(loss, 1.0)
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
                        f"{o['f'].info.type_name} (#{rp.fwd_index.get(o['fhash'])})"
                        for o in others) + ".")
            gmax = _dtype_max(report.input_grad_dtypes)
            if report.kind == "overflow" and gmax is not None and at_one.grad_max > 0:
                report.max_safe_scale = 2.0 ** math.floor(math.log2(gmax / at_one.grad_max))
            if gmax is not None and scale > gmax:
                report.notes.append(
                    f"the scale {fmt_scale(scale)} itself is larger than the largest "
                    f"{_grad_dtype(report.input_grad_dtypes)} value ({gmax:.6g}): the "
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


def _dtype_max(dtypes: List[str]) -> Optional[float]:
    name = _grad_dtype(dtypes)
    return float(np.finfo(np.dtype(name)).max) if name else None


def _grad_dtype(dtypes: List[str]) -> Optional[str]:
    floats = [d for d in dtypes if d.startswith("float")]
    if not floats:
        return None
    return min(floats, key=lambda d: np.finfo(np.dtype(d)).max)
