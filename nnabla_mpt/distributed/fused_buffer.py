"""The fused buffer of one ``all_reduce`` call: every array of the call laid end to end.

Array ``i`` occupies elements ``[start_i, stop_i)`` of a virtual buffer of ``total``
elements in the reduction dtype (:class:`Layout`, made by :func:`layout`). :func:`gather`
copies a range of that buffer from the arrays into contiguous memory and :func:`scatter`
copies it back, converting dtypes where an array's own dtype differs. :func:`signature`
and :func:`check_signatures` let the ranks compare what they passed before they reduce.

Each array's host pointer is read once per call with ``NdArray.data_ptr``; a numpy view
is only built for arrays that need a dtype conversion, because building one costs about
as much as the pointer itself and an array in the reduction dtype is copied with a plain
``memmove``.

The buffer is reduced by :class:`~nnabla_mpt.distributed.message_reduction.MessageReduction`
(MPI collectives, on any machines) or by
:class:`~nnabla_mpt.distributed.shared_memory_reduction.SharedMemoryReduction` (an MPI
shared-memory window, among the ranks of one machine).
"""
import bisect
import ctypes
from typing import List, NamedTuple, Optional, Sequence

import numpy as np

_memmove = ctypes.memmove


class Layout(NamedTuple):
    """Where every (non-empty) array of one call sits in the fused buffer.

    Attributes:
        dtype: The reduction dtype.
        total: Number of elements of the fused buffer.
        ptrs, starts, stops: Host pointer and fused range ``[start, stop)`` of each piece.
        dtypes: Each piece's own dtype, or None when it holds the reduction dtype.
        converted: Whether any piece needs a dtype conversion.
    """
    dtype: np.dtype
    total: int
    ptrs: List[int]
    starts: List[int]
    stops: List[int]
    dtypes: List[Optional[np.dtype]]
    converted: bool


def layout(arrays: Sequence, dtypes: Sequence[np.dtype], dtype: np.dtype, ctx) -> Layout:
    """Read every array's host pointer in its own dtype and lay the arrays end to end.

    ``NdArray.data_ptr`` makes the array in that dtype and context the only valid copy,
    so what is written through the pointer later in the same call is what nnabla reads
    next. The pointers stay valid until nnabla next touches the arrays.
    """
    ptrs, starts, stops, own = [], [], [], []
    converted = False
    off = 0
    for a, dt in zip(arrays, dtypes):
        n = a.size
        if n == 0:
            continue
        ptrs.append(a.data_ptr(dt, ctx, False))
        starts.append(off)
        off += n
        stops.append(off)
        if dt == dtype:
            own.append(None)
        else:
            own.append(dt)
            converted = True
    return Layout(dtype, off, ptrs, starts, stops, own, converted)


def signature(lay: Layout, n_arrays: int):
    """``(elements, arrays, itemsize, sizes)``: what a rank passed to one all-reduce, for
    the ranks to compare. ``sizes`` is a fingerprint of the arrays' sizes in order (the
    same elements in another order or cut differently give another one)."""
    sizes = hash(tuple(lay.stops)) & ((1 << 62) - 1)
    return lay.total, n_arrays, lay.dtype.itemsize, sizes


def check_signatures(seen) -> None:
    """Raise the same ``ValueError`` on every rank if the ranks' signatures differ."""
    if all(s[:4] == seen[0][:4] for s in seen):
        return
    if all(s[:3] == seen[0][:3] for s in seen):
        s = seen[0]
        what = (f"{_plural(s[1], 'array')} of {_plural(s[0], 'element')} in total on every "
                f"rank, but the arrays' sizes differ in order on rank(s) "
                + ", ".join(str(j) for j, t in enumerate(seen) if t[3] != s[3]))
    else:
        what = "; ".join(f"rank {j}: {_plural(s[1], 'array')} of {_plural(s[0], 'element')} "
                         f"in total, summed in float{8 * s[2]}" for j, s in enumerate(seen))
    raise ValueError(f"all_reduce: the ranks passed different data ({what}); every rank "
                     f"must pass arrays of the same sizes and dtypes in the same order")


def _view(ptr: int, n: int, dtype: np.dtype) -> np.ndarray:
    return np.frombuffer((ctypes.c_char * (n * dtype.itemsize)).from_address(ptr), dtype=dtype)


def _overlapping(lay: Layout, lo: int, hi: int):
    """(piece index, a, b) for every piece overlapping ``[lo, hi)``, with the overlap ``[a, b)``."""
    i = bisect.bisect_right(lay.stops, lo)
    starts, stops = lay.starts, lay.stops
    while i < len(starts) and starts[i] < hi:
        yield i, max(starts[i], lo), min(stops[i], hi)
        i += 1


def gather(lay: Layout, lo: int, hi: int, dst: np.ndarray, dst_ptr: int) -> None:
    """Copy fused elements ``[lo, hi)`` from the arrays into ``dst`` (reduction dtype).

    ``dst_ptr`` is ``dst``'s address, passed in because reading it costs a microsecond.
    """
    isz = lay.dtype.itemsize
    if lo == 0 and hi == lay.total and not lay.converted:  # the common case, kept lean
        for p, a, b in zip(lay.ptrs, lay.starts, lay.stops):
            _memmove(dst_ptr + a * isz, p, (b - a) * isz)
        return
    for i, a, b in _overlapping(lay, lo, hi):
        p, start, dt = lay.ptrs[i], lay.starts[i], lay.dtypes[i]
        if dt is None:
            _memmove(dst_ptr + (a - lo) * isz, p + (a - start) * isz, (b - a) * isz)
        else:
            src = _view(p + (a - start) * dt.itemsize, b - a, dt)
            np.copyto(dst[a - lo:b - lo], src, casting="unsafe")


def scatter(lay: Layout, lo: int, hi: int, src: np.ndarray, src_ptr: int) -> None:
    """Copy fused elements ``[lo, hi)`` from ``src`` back into the arrays.

    A value beyond the range of an array's own dtype (a float16 sum above 65504) becomes
    ``inf`` there, by design: an overflow check then sees it.
    """
    isz = lay.dtype.itemsize
    if lo == 0 and hi == lay.total and not lay.converted:
        for p, a, b in zip(lay.ptrs, lay.starts, lay.stops):
            _memmove(p, src_ptr + a * isz, (b - a) * isz)
        return
    with np.errstate(over="ignore"):
        for i, a, b in _overlapping(lay, lo, hi):
            p, start, dt = lay.ptrs[i], lay.starts[i], lay.dtypes[i]
            if dt is None:
                _memmove(p + (a - start) * isz, src_ptr + (a - lo) * isz, (b - a) * isz)
            else:
                dst = _view(p + (a - start) * dt.itemsize, b - a, dt)
                np.copyto(dst, src[a - lo:b - lo], casting="unsafe")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
