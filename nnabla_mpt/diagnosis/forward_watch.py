"""The watch of a forward pass that :func:`~nnabla_mpt.diagnose` replays.

:class:`ForwardWatch` replays a forward pass and records each function
(:class:`FunctionRecord`), which function produced which variable, the graph's leaf
variables and the first function that turned finite values into inf/NaN; it then
describes a culprit for the report: its inputs and outputs, the chain of functions that
led to it and the parameter scope it belongs to. Only the diagnosis uses it; the hooks of
a backward pass, which the measured scale uses on its steps too, are in
:mod:`nnabla_mpt.diagnosis.watch`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..core.dtypes import array_stats, dtype_name
from .report import OverflowReport
from .watch import FunctionHooks

__all__ = ["ForwardWatch", "FunctionRecord"]


def _scope_of(names: List[str]) -> Optional[str]:
    """The parameter scope the parameters ``names`` share (the longest common run of their
    scopes, element by element), else the first name; None for no parameter."""
    if not names:
        return None
    common = os.path.commonprefix([n.split("/")[:-1] for n in names])
    return "/".join(common) if common else names[0]


@dataclass
class FunctionRecord:
    """One function of the forward pass: its type, the hashes of its inputs and the names of
    the parameters among them."""

    type_name: str
    inputs: List[int]
    params: List[str]


class ForwardWatch(FunctionHooks):
    """Hooks for one forward pass: the graph as it runs, and the first inf/NaN in it.

    ``records`` lists the functions in execution order, ``producer`` maps an output
    variable's hash to its function's position. ``culprit`` is ``None`` or a dict
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
        if self.culprit is not None:
            return
        leaves = [v for v in f.inputs if v.parent is None]
        for v in leaves:
            if hash(v) not in self.finite:
                self.finite[hash(v)] = array_stats(v.d)[0] == 0
        bad = [self.name_of(v) for v in leaves if not self.finite[hash(v)]]
        if bad:
            k = self._add_record(f)
            self.culprit = dict(kind="data", phase="forward", f=f, index=k,
                                bad_leaves=bad)

    def on_post(self, f: Any, index: int) -> None:
        if hash(f) in self.fwd_index:   # recorded by on_pre (a data culprit)
            return
        k = self._add_record(f)
        if self.culprit is not None:
            return
        for v in f.outputs:
            self.finite[hash(v)] = array_stats(v.d)[0] == 0
        if not all(self.finite[hash(v)] for v in f.outputs) and all(
                self.finite.get(hash(v), True) for v in f.inputs):
            self.culprit = dict(kind="model", phase="forward", f=f, index=k)

    def _add_record(self, f: Any) -> int:
        """Records ``f`` as the next function of the pass; returns its position."""
        k = len(self.records)
        ins = [hash(v) for v in f.inputs]
        outs = [hash(v) for v in f.outputs]
        self.records.append(FunctionRecord(f.info.type_name, ins,
                                           [self.param_names[h] for h in ins
                                            if h in self.param_names]))
        self.fwd_index[hash(f)] = k
        for h in outs:
            self.producer[h] = k
        return k

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
        ups = self._producers(k)
        while len(chain) < chain_length and ups:
            chain.append(ups[0])
            ups = self._producers(ups[0])
        truncated = len(chain) == chain_length and bool(ups)
        parts = []
        for j in reversed(chain):
            rec = self.records[j]
            sc = _scope_of(rec.params)
            parts.append(f"{rec.type_name}#{j}" + (f"[{sc}]" if sc else ""))
        return ("... -> " if truncated else "") + " -> ".join(parts)

    def _producers(self, j: int) -> List[int]:
        """The positions of the functions producing the inputs of function ``j`` (those
        that have one), in the order of its inputs."""
        return [self.producer[h] for h in self.records[j].inputs if h in self.producer]

    def _scope(self, k: int) -> Tuple[Optional[str], bool]:
        """(scope, is upstream): own scope, else the nearest parametric function upstream
        (any input)."""
        own = _scope_of(self.records[k].params)
        if own:
            return own, False
        seen, todo = set(), [k]
        while todo:
            j = todo.pop(0)
            for u in self._producers(j):
                if u in seen:
                    continue
                seen.add(u)
                sc = _scope_of(self.records[u].params)
                if sc:
                    return sc, True
                todo.append(u)
        return None, False
