"""Function hooks that watch a forward or a backward pass of an nnabla graph.

:class:`ForwardWatch` replays a forward pass and records each function, which function
produced which variable, the graph's leaf variables and the first function that turned
finite values into inf/NaN. :class:`BackwardWatch` runs a backward pass and records where
gradients turn non-finite; :class:`RangeWatch` records how close the gradients come to
their dtype's largest value. All hand errors raised inside a hook back to the caller after
the pass, since nnabla would mask them (:class:`FunctionHooks`). :func:`array_stats` and the dtype helpers are the
numbers the watches look at.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ..core.dtypes import FLOATS
from .report import OverflowReport

__all__ = ["FunctionHooks", "ForwardWatch", "BackwardHooks", "BackwardWatch", "RangeWatch", "NON_EXPANDING",
           "FunctionRecord",
           "array_stats", "dtype_name", "narrowest_float", "narrowest_float_max"]


# --------------------------------------------------------------------------- numbers


def array_stats(arr: np.ndarray) -> Tuple[int, float, float]:
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


def dtype_name(array: Any) -> str:
    """Name of an nnabla array's dtype, or ``"uninitialized"``."""
    try:
        return str(array.dtype)
    except Exception:  # an array never written has no dtype yet
        return "uninitialized"


def narrowest_float(dtypes: List[str]) -> Optional[str]:
    """The floating dtype name with the smallest range among ``dtypes``, or ``None``."""
    floats = [d for d in dtypes if d.startswith("float")]
    if not floats:
        return None
    return min(floats, key=lambda d: np.finfo(np.dtype(d)).max)


def narrowest_float_max(dtypes: List[str]) -> Optional[float]:
    """Largest finite value of :func:`narrowest_float` of ``dtypes``, or ``None``."""
    name = narrowest_float(dtypes)
    return float(np.finfo(np.dtype(name)).max) if name else None


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


# --------------------------------------------------------------------------- forward


@dataclass
class FunctionRecord:
    """One function of the forward pass: its type and the hashes of its variables."""

    type_name: str
    inputs: List[int]
    outputs: List[int]
    params: List[str]


class FunctionHooks:
    """A pass over a graph watched function by function, through nnabla's function hooks.

    :meth:`pre` and :meth:`post` are the hooks; they call :meth:`on_pre` and
    :meth:`on_post` of the subclass. An error raised inside one is kept and raised by
    :meth:`raise_deferred` after the pass (nnabla would mask it); the later hooks of the
    pass do nothing. ``count`` is the number of functions run so far.
    """

    def __init__(self) -> None:
        self.count = 0
        self.error: Optional[BaseException] = None

    def pre(self, f: Any) -> None:
        if self.error is None:
            try:
                self.on_pre(f)
            except BaseException as e:  # surfaced after the pass; nnabla would mask it
                self.error = e

    def post(self, f: Any) -> None:
        index = self.count
        self.count += 1
        if self.error is None:
            try:
                self.on_post(f, index)
            except BaseException as e:
                self.error = e

    def raise_deferred(self) -> None:
        """Raises the error a hook met during the pass, if any (once)."""
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def on_pre(self, f: Any) -> None:
        """Before function ``f`` runs."""

    def on_post(self, f: Any, index: int) -> None:
        """After function ``f``, the ``index``-th to run."""


class ForwardWatch(FunctionHooks):
    """Hooks for one forward pass: the graph as it runs, and the first inf/NaN in it.

    ``records`` lists the functions in execution order, ``producer`` maps an output
    variable's hash to its function's position, ``leaves`` maps the hash of each leaf
    variable that needs a gradient to the variable. ``culprit`` is ``None`` or a dict
    with ``kind`` (``"data"``: a leaf variable already holds inf/NaN, ``"model"``: a
    function made inf/NaN from finite inputs), ``phase``, ``f``, ``index`` and, for
    ``"data"``, ``bad_leaves``.

    Args:
        params: Mapping name -> parameter ``Variable``, used to name parameters.
    """

    def __init__(self, params: Mapping[str, Any]) -> None:
        super().__init__()
        self.param_names = {hash(v): name for name, v in params.items()}
        self.records: List[FunctionRecord] = []
        self.producer: Dict[int, int] = {}       # output hash -> forward index
        self.fwd_index: Dict[int, int] = {}      # function hash -> forward index
        self.finite: Dict[int, bool] = {}        # variable hash -> data all finite
        self.leaves: Dict[int, Any] = {}         # leaf hash -> Variable (need_grad)
        self.leaf_names: Dict[int, str] = {}
        self.culprit: Optional[Dict[str, Any]] = None

    def run(self, loss: Any) -> "ForwardWatch":
        """Run ``loss.forward`` keeping every buffer, watched by these hooks."""
        loss.forward(clear_no_need_grad=False, function_pre_hook=self.pre,
                     function_post_hook=self.post)
        self.raise_deferred()
        return self

    def name_of(self, var: Any) -> str:
        """Parameter name, producing function (``"Softmax#1"``) or input name of ``var``."""
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

    def position(self, f: Any) -> Optional[int]:
        """Position of function ``f`` in forward execution order (``None``: not run)."""
        return self.fwd_index.get(hash(f))

    # hooks ------------------------------------------------------------------
    def on_pre(self, f: Any) -> None:
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
                self.finite[h] = array_stats(v.d)[0] == 0
            if not self.finite[h]:
                bad.append(self.name_of(v))
        if bad:
            k = len(self.records)
            self._add_record(f)
            self.culprit = dict(kind="data", phase="forward", f=f, index=k,
                                bad_leaves=bad)

    def on_post(self, f: Any, index: int) -> None:
        if hash(f) in self.fwd_index:   # recorded by on_pre (a data culprit)
            return
        k = len(self.records)
        self._add_record(f)
        if self.culprit is not None:
            return
        outputs_finite = True
        for v in f.outputs:
            fin = array_stats(v.d)[0] == 0
            self.finite[hash(v)] = fin
            outputs_finite &= fin
        if not outputs_finite and all(self.finite.get(hash(v), True)
                                      for v in f.inputs):
            self.culprit = dict(kind="model", phase="forward", f=f, index=k)

    def _add_record(self, f: Any) -> None:
        k = len(self.records)
        ins = [hash(v) for v in f.inputs]
        outs = [hash(v) for v in f.outputs]
        self.records.append(FunctionRecord(f.info.type_name, ins, outs,
                                           [self.param_names[h] for h in ins
                                            if h in self.param_names]))
        self.fwd_index[hash(f)] = k
        for h in outs:
            self.producer[h] = k

    # description ------------------------------------------------------------
    def describe(self, report: OverflowReport, culprit: Dict[str, Any],
                 chain_length: int) -> None:
        """Fill in the culprit's part of ``report``: its inputs, outputs, path and scope.

        ``culprit`` is a dict with the function ``f`` and its ``index`` in its phase.
        """
        f = culprit["f"]
        k = self.position(f)
        report.function = f.info.type_name
        report.index = culprit["index"]
        report.forward_index = k
        report.input_names = [self.name_of(v) for v in f.inputs]
        report.input_shapes = [tuple(v.shape) for v in f.inputs]
        stats = [array_stats(v.d) for v in f.inputs]
        report.input_dtypes = [dtype_name(v.data) for v in f.inputs]
        report.input_nonfinite = [s[0] for s in stats]
        report.input_max_abs = [s[1] for s in stats]
        report.input_min_abs = [s[2] for s in stats]
        report.output_shapes = [tuple(v.shape) for v in f.outputs]
        report.output_dtypes = [dtype_name(v.data) for v in f.outputs]
        if k is None:
            report.path = report.function
            return
        report.path = self._path(k, chain_length)
        report.scope, report.scope_is_upstream = self._scope(k)

    def _path(self, k: int, chain_length: int) -> str:
        """Producing chain along the first input that has a producer, ending at ``k``."""
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
        return ("... -> " if truncated else "") + " -> ".join(parts)

    def _scope(self, k: int) -> Tuple[Optional[str], bool]:
        """(scope, is upstream): own scope, else the nearest parametric function upstream
        (any input)."""
        own = _scope_of(self.records[k].params)
        if own:
            return own, False
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
                    return sc, True
                todo.append(u)
        return None, False


# --------------------------------------------------------------------------- backward


class BackwardHooks(FunctionHooks):
    """A backward pass watched function by function: :meth:`run` calls ``loss.backward``
    with the hooks; several passes (micro-batches) can be watched by one object."""

    def run(self, loss: Any, scale: float, clear_buffer: bool = False,
            communicator_callbacks: Any = None) -> "BackwardHooks":
        """Run ``loss.backward(scale)`` watched by these hooks (every buffer kept unless
        ``clear_buffer``), with nnabla's ``communicator_callbacks`` if given."""
        loss.backward(scale, clear_buffer=clear_buffer, function_pre_hook=self.pre,
                      function_post_hook=self.post,
                      communicator_callbacks=communicator_callbacks)
        self.raise_deferred()
        return self

    def on_pre(self, f: Any) -> None:
        """Before function ``f``'s backward: its outputs' gradients are complete."""

    def on_post(self, f: Any, index: int) -> None:
        """After function ``f``'s backward, the ``index``-th of the pass: its inputs'
        gradients hold its contribution."""


class BackwardWatch(BackwardHooks):
    """Hooks for one backward pass: where gradients turn non-finite, and who is to blame.

    A function is an *origin* when it turns an input gradient non-finite while every
    gradient flowing into it (its outputs' gradients) is finite. Each variable remembers
    the function that first made its gradient non-finite, so a non-finite parameter
    gradient can be traced back through the propagating functions to its origins.

    Records, by position of the function in backward order (0-based): ``count``
    functions run; ``turned_bad_by`` (variable hash -> position of the function that
    first made its gradient non-finite); ``bad_outputs`` (position -> hashes of that
    function's outputs whose gradients were already non-finite); ``origins`` (dicts with
    the function ``f``, its ``index``, ``fhash``, ``out_grad_max``: largest |gradient|
    flowing in per output, and ``in_grad_dtypes``); ``grad_max``, the largest finite
    |gradient| seen in the pass.
    """

    def __init__(self) -> None:
        super().__init__()
        self.grad_bad: Dict[int, bool] = {}
        self.turned_bad_by: Dict[int, int] = {}   # variable hash -> backward index
        self.bad_outputs: Dict[int, List[int]] = {}  # backward index -> bad output hashes
        self.origins: List[Dict[str, Any]] = []
        self.grad_max = 0.0
        self._out: List[Tuple[int, float, float]] = []

    def on_pre(self, f: Any) -> None:
        self._out = [array_stats(v.g) for v in f.outputs]

    def on_post(self, f: Any, idx: int) -> None:
        out = self._out
        newly = False
        in_stats: List[Tuple[int, float, float]] = []
        for v in f.inputs:
            if not v.need_grad:
                continue
            st = array_stats(v.g)
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
                    in_grad_dtypes=[dtype_name(v.grad) if v.need_grad else "-"
                                    for v in f.inputs]))

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


#: Functions whose backward pass cannot make a gradient larger than the largest gradient
#: flowing into them: each input's gradient is the output's gradient passed on (reshaped,
#: spread by a reduction, divided) or multiplied by a derivative of at most 1 in absolute
#: value (a cross-entropy's ``p - y``, a ReLU's 0 or 1, tanh's and sigmoid's slopes).
NON_EXPANDING = frozenset({"Sum", "Mean", "Reshape", "Identity", "SoftmaxCrossEntropy",
                           "SigmoidCrossEntropy", "ReLU", "Tanh", "Sigmoid", "Abs"})


class RangeWatch(BackwardHooks):
    """How close the gradients of backward passes come to their dtype's largest value.

    Before each function's backward runs, the gradients flowing into it (its outputs'
    gradients, complete by then) are reduced, with nnabla functions in the graph's own
    extension, to their largest absolute value; :meth:`add` does the same for other
    arrays (the parameters' gradients). The maxima stay where the arrays are until
    :meth:`read` reads them back, all at once. The seed of a pass, the loss's own
    gradient (the scale itself), is not watched: it is exact, and a scale the loss dtype
    cannot hold is the ceiling's business.

    Each watched gradient also gets a *bound*, in units of the scale, when its size is
    known whatever the data: the seed's is 1; a function of :data:`NON_EXPANDING` hands
    the largest bound of its outputs to each input (summed over the functions that
    consume the input); any other function, and the parameters, give none (``inf``).

    Args:
        loss: The loss whose backward passes are watched.
        ctx: The float32 context of the graph's extension, where the maxima are computed.
    """

    def __init__(self, loss: Any, ctx: Any) -> None:
        super().__init__()
        self._loss = hash(loss)
        self._ctx = ctx
        self._maxima: List[Any] = []
        self._limits: List[float] = []
        self._bounds: List[float] = []
        self._bound_of: Dict[int, float] = {}

    def on_pre(self, f: Any) -> None:
        outputs = [hash(v) for v in f.outputs]
        if self._loss in outputs:
            self._bound_of = {self._loss: 1.0}      # a new pass starts at the seed
        for v, h in zip(f.outputs, outputs):
            if h != self._loss:
                self._watch(v.grad, self._bound_of.get(h, math.inf))
        passed = (max(self._bound_of.get(h, math.inf) for h in outputs)
                  if f.info.type_name in NON_EXPANDING else math.inf)
        for v in f.inputs:
            if v.need_grad:
                h = hash(v)
                self._bound_of[h] = self._bound_of.get(h, 0.0) + passed

    def add(self, arrays: List[Any], limit: float) -> "RangeWatch":
        """Watches ``arrays`` (nnabla NdArrays, the parameters' gradients) too, as they
        are now, with no bound, against ``limit``: the largest value of the dtype they can
        overflow in, whatever dtype their arrays hold now."""
        for a in arrays:
            self._watch(a, math.inf, limit)
        return self

    def _watch(self, array: Any, bound: float, limit: Optional[float] = None) -> None:
        name = dtype_name(array)
        if name not in FLOATS or array.size == 0:
            return
        import nnabla as nn
        import nnabla.functions as F
        with nn.context_scope(self._ctx):
            # max() passes over NaN: 0 * sum() adds NaN where the array holds NaN or inf
            top = F.add2(F.max(F.abs(array)), F.mul_scalar(F.sum(array), 0.0))
            self._maxima.append(F.reshape(top, (1,)))
        self._limits.append(FLOATS[name].max if limit is None else limit)
        self._bounds.append(bound)

    def read(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(maxima, limits, bounds)``: the largest ``|g|`` of every watched gradient (NaN
        or inf where it holds NaN or inf), read back now, all at once; the largest finite
        value of each one's dtype; and each one's bound in units of the scale (``inf`` for
        none). Float64 arrays, empty when nothing was watched."""
        if not self._maxima:
            return np.empty(0), np.empty(0), np.empty(0)
        import nnabla as nn
        import nnabla.functions as F
        with nn.context_scope(self._ctx):
            maxima = np.asarray(F.concatenate(*self._maxima, axis=0).data, dtype=np.float64)
        return (maxima, np.asarray(self._limits, dtype=np.float64),
                np.asarray(self._bounds, dtype=np.float64))
