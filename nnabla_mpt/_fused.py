"""The fused index space of one ``all_reduce`` call and the copies into and out of it.

All arrays of a call are laid end to end: array ``i`` occupies elements
``[start_i, stop_i)`` of a virtual buffer of ``total`` elements in the reduction dtype.
:func:`gather` copies a range of that buffer from the arrays into contiguous memory and
:func:`scatter` copies it back, converting dtypes where an array's own dtype differs.

Each array's host pointer is read once per call with ``NdArray.data_ptr``; a numpy view
is only built for arrays that need a dtype conversion, because building one costs about
as much as the pointer itself and an array in the reduction dtype is copied with a plain
``memmove``.
"""
import bisect
import ctypes
from typing import List, NamedTuple, Optional, Sequence

import numpy as np

_memmove = ctypes.memmove


class Piece(NamedTuple):
    """One array's place in the fused buffer and its host memory."""
    start: int
    stop: int
    ptr: int
    dtype: Optional[np.dtype]  # None when the array already holds the reduction dtype


class Layout(NamedTuple):
    """Where every (non-empty) array of one call sits in the fused buffer."""
    dtype: np.dtype
    total: int
    pieces: List[Piece]
    stops: List[int]  # piece.stop for every piece, for bisect


def layout(arrays: Sequence, dtypes: Sequence[np.dtype], dtype: np.dtype, ctx) -> Layout:
    """Read every array's host pointer in its own dtype and lay the arrays end to end.

    ``NdArray.data_ptr`` makes the array in that dtype and context the only valid copy,
    so what is written through the pointer later in the same call is what nnabla reads
    next. The pointers stay valid until nnabla next touches the arrays.
    """
    pieces = []
    off = 0
    for a, dt in zip(arrays, dtypes):
        n = a.size
        if n == 0:
            continue
        ptr = a.data_ptr(dt, ctx, False)
        pieces.append(Piece(off, off + n, ptr, None if dt == dtype else dt))
        off += n
    return Layout(dtype, off, pieces, [p.stop for p in pieces])


def _view(ptr: int, n: int, dtype: np.dtype) -> np.ndarray:
    return np.frombuffer((ctypes.c_char * (n * dtype.itemsize)).from_address(ptr), dtype=dtype)


def _overlapping(lay: Layout, lo: int, hi: int):
    """(piece, a, b) for every piece that overlaps ``[lo, hi)``, with the overlap ``[a, b)``."""
    i = bisect.bisect_right(lay.stops, lo)
    pieces = lay.pieces
    while i < len(pieces):
        p = pieces[i]
        if p.start >= hi:
            return
        yield p, max(p.start, lo), min(p.stop, hi)
        i += 1


def gather(lay: Layout, lo: int, hi: int, dst: np.ndarray, dst_ptr: int) -> None:
    """Copy fused elements ``[lo, hi)`` from the arrays into ``dst`` (reduction dtype).

    ``dst_ptr`` is ``dst``'s address, passed in because reading it costs a microsecond.
    """
    isz = lay.dtype.itemsize
    for p, a, b in _overlapping(lay, lo, hi):
        if p.dtype is None:
            _memmove(dst_ptr + (a - lo) * isz, p.ptr + (a - p.start) * isz, (b - a) * isz)
        else:
            src = _view(p.ptr + (a - p.start) * p.dtype.itemsize, b - a, p.dtype)
            np.copyto(dst[a - lo:b - lo], src, casting="unsafe")


def scatter(lay: Layout, lo: int, hi: int, src: np.ndarray, src_ptr: int) -> None:
    """Copy fused elements ``[lo, hi)`` from ``src`` back into the arrays.

    A value beyond the range of an array's own dtype (a float16 sum above 65504) becomes
    ``inf`` there, by design: an overflow check then sees it.
    """
    isz = lay.dtype.itemsize
    with np.errstate(over="ignore"):
        for p, a, b in _overlapping(lay, lo, hi):
            if p.dtype is None:
                _memmove(p.ptr + (a - p.start) * isz, src_ptr + (a - lo) * isz, (b - a) * isz)
            else:
                dst = _view(p.ptr + (a - p.start) * p.dtype.itemsize, b - a, p.dtype)
                np.copyto(dst, src[a - lo:b - lo], casting="unsafe")
