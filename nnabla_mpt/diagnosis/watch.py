"""Function hooks that watch a pass of an nnabla graph, and the watches of a backward pass.

:class:`FunctionHooks` watches a pass function by function and hands errors raised inside
a hook back to the caller after the pass, since nnabla would mask them;
:class:`BackwardHooks` runs a backward pass with them. :class:`BackwardWatch` records where
gradients turn non-finite (for :func:`~nnabla_mpt.diagnose`); :class:`RangeWatch` records
how close the gradients come to their dtype's largest value (for the measured scale, on
the steps it watches). The watch of a forward pass, which only the diagnosis replays, is
:class:`~nnabla_mpt.diagnosis.forward_watch.ForwardWatch`; the numbers the watches look at
(:func:`~nnabla_mpt.core.dtypes.array_stats`, the dtype helpers) are in
:mod:`nnabla_mpt.core.dtypes`.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import nnabla as nn
import nnabla.functions as F

from ..core.dtypes import FLOATS, array_stats, dtype_name

__all__ = ["FunctionHooks", "BackwardHooks", "BackwardWatch", "RangeWatch", "NON_EXPANDING"]


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
        self._guarded(self.on_pre, f)

    def post(self, f: Any) -> None:
        self.count += 1
        self._guarded(self.on_post, f, self.count - 1)

    def _guarded(self, hook: Any, *args: Any) -> None:
        """Calls ``hook(*args)`` unless a hook has failed already; keeps its error."""
        if self.error is None:
            try:
                hook(*args)
            except BaseException as e:  # surfaced after the pass; nnabla would mask it
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
            if st[0] and h not in self.turned_bad_by:
                self.turned_bad_by[h] = idx
                newly = True
        for st in out + in_stats:
            self.grad_max = max(self.grad_max, st[1])   # NaN (no finite value) keeps it
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
        seen = set()
        todo = [self.turned_bad_by[h] for h in var_hashes if h in self.turned_bad_by]
        while todo:
            g = todo.pop()
            if g in seen:
                continue
            seen.add(g)
            if g not in by_index:     # an origin ends the trace; others pass it on
                todo.extend(self.turned_bad_by[h] for h in self.bad_outputs.get(g, [])
                            if h in self.turned_bad_by)
        return [by_index[i] for i in sorted(seen & by_index.keys())]


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
        with nn.context_scope(self._ctx):
            maxima = np.asarray(F.concatenate(*self._maxima, axis=0).data, dtype=np.float64)
        return (maxima, np.asarray(self._limits, dtype=np.float64),
                np.asarray(self._bounds, dtype=np.float64))
