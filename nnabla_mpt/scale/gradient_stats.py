"""Per-parameter statistics of the gradients: how many values flushed to zero or fell to
subnormals, how large the largest is, and how far the loss scale could still grow.

They describe the gradients as the backward pass produced them: scaled, in the graph's
dtype, before any all-reduce. The reductions run with nnabla functions in the graph's own
extension and are read back once, as one array.

How to read them: many zeros or subnormals while the headroom is large means the scale
is too low (small gradients are lost, and there is room to scale them up); a headroom
near 0 means the scale is at its edge for that parameter.
"""
import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping

import numpy as np

from ..core.dtypes import FLOATS, dtype_name


@dataclass(frozen=True)
class GradientStats:
    """Statistics of one parameter's gradient.

    Attributes:
        size: Number of elements.
        dtype: The gradient's dtype (``"float16"``, ``"float32"``).
        zero_fraction: Fraction of the elements that are exactly zero (inf and NaN are
            not zeros).
        subnormal_fraction: Fraction that are non-zero but below the dtype's smallest
            normal value (``2**-14`` in float16): values losing precision, next to flush.
        nonfinite_fraction: Fraction that are inf or NaN. The three fractions count
            disjoint sets of elements.
        max_abs: The largest absolute value (inf when the gradient holds inf or NaN).
        headroom: How many powers of two the scale could still grow before this gradient
            overflows: ``floor(log2(dtype max / max_abs))``; ``inf`` for an all-zero
            gradient, ``-inf`` for one holding inf or NaN.
    """
    size: int
    dtype: str
    zero_fraction: float
    subnormal_fraction: float
    nonfinite_fraction: float
    max_abs: float
    headroom: float


def gradient_stats(params: Mapping[str, Any], ctx: Any) -> Dict[str, GradientStats]:
    """The statistics of the gradients of ``params`` (name -> Variable) as they are now.

    Args:
        params: The parameters.
        ctx: The float32 context of the graph's extension, where the counts are made.
    """
    import nnabla as nn
    import nnabla.functions as F

    names, rows = [], []
    with nn.context_scope(ctx):
        for name, v in params.items():
            g = v.grad
            kind = FLOATS.get(dtype_name(g))
            if kind is None or g.size == 0:
                continue
            a = F.abs(g)
            nonzero = F.greater_scalar(a, 0.0)      # false for NaN, as equal_scalar(a, 0)
            rows.append(F.stack(
                F.max(a), F.sum(F.equal_scalar(a, 0.0)),
                F.sum(F.logical_and(nonzero, F.less_scalar(a, kind.tiny))),
                F.add2(F.sum(F.isinf(g)), F.sum(F.isnan(g)))))
            names.append((name, g.size, kind))
        if not rows:
            return {}
        table = np.asarray(F.stack(*rows).data, dtype=np.float64)   # one read
    return {name: _stats(size, kind, row) for (name, size, kind), row in zip(names, table)}


def _stats(size: int, kind, row: np.ndarray) -> GradientStats:
    max_abs, zeros, subnormals, nonfinite = (float(x) for x in row)
    if nonfinite:
        max_abs, headroom = math.inf, -math.inf
    elif max_abs == 0.0:
        headroom = math.inf
    else:
        headroom = float(math.floor(math.log2(kind.max / max_abs)))
    return GradientStats(size=size, dtype=kind.name, zero_fraction=zeros / size,
                         subnormal_fraction=subnormals / size,
                         nonfinite_fraction=nonfinite / size, max_abs=max_abs,
                         headroom=headroom)


def overall(stats: Mapping[str, GradientStats]) -> GradientStats:
    """The statistics of all the gradients together: fractions over every element, the
    largest ``max_abs``, the smallest ``headroom``; ``dtype`` is the narrowest one."""
    size = sum(s.size for s in stats.values())
    if size == 0:
        raise ValueError("overall() needs the statistics of at least one gradient, got none")

    def fraction(field: str) -> float:
        return sum(getattr(s, field) * s.size for s in stats.values()) / size

    return GradientStats(size=size, dtype=min((s.dtype for s in stats.values()),
                                              key=lambda d: FLOATS[d].max),
                         zero_fraction=fraction("zero_fraction"),
                         subnormal_fraction=fraction("subnormal_fraction"),
                         nonfinite_fraction=fraction("nonfinite_fraction"),
                         max_abs=max(s.max_abs for s in stats.values()),
                         headroom=min(s.headroom for s in stats.values()))
