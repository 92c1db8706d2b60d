"""The fused buffer of one ``all_reduce`` call, and its reduction through shared memory.

All arrays of a call are laid end to end: array ``i`` occupies elements
``[start_i, stop_i)`` of a virtual buffer of ``total`` elements in the reduction dtype.
:func:`gather` copies a range of that buffer from the arrays into contiguous memory and
:func:`scatter` copies it back, converting dtypes where an array's own dtype differs.

Each array's host pointer is read once per call with ``NdArray.data_ptr``; a numpy view
is only built for arrays that need a dtype conversion, because building one costs about
as much as the pointer itself and an array in the reduction dtype is copied with a plain
``memmove``.

:class:`SharedMemoryReduction` reduces such a buffer among the ranks of one machine
through an MPI shared-memory window, without MPI messages.
"""
import bisect
import ctypes
from typing import Sequence

import numpy as np

_memmove = ctypes.memmove


class Layout:
    """Where every (non-empty) array of one call sits in the fused buffer.

    Attributes:
        dtype: The reduction dtype.
        total: Number of elements of the fused buffer.
        ptrs, starts, stops: Host pointer and fused range ``[start, stop)`` of each piece.
        dtypes: Each piece's own dtype, or None when it holds the reduction dtype.
        converted: Whether any piece needs a dtype conversion.
    """
    __slots__ = ("dtype", "total", "ptrs", "starts", "stops", "dtypes", "converted")

    def __init__(self, dtype, total, ptrs, starts, stops, dtypes, converted):
        self.dtype = dtype
        self.total = total
        self.ptrs = ptrs
        self.starts = starts
        self.stops = stops
        self.dtypes = dtypes
        self.converted = converted


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


# Bytes of shared memory per input area; one area per rank plus one result area.
SHM_NODE_BUDGET_BYTES = 48 << 20
SHM_AREA_MIN_BYTES = 256 << 10
SHM_AREA_MAX_BYTES = 2 << 20
_HEADER_BYTES = 64  # two slots of four int64


def shm_area_bytes(size: int) -> int:
    """Bytes of one area for ``size`` ranks: at most 2 MiB, within a node budget of 48 MiB.

    Smaller chunks keep more of a chunk in the caches between the copy in, the sum and
    the copy out: with two ranks on one machine, 1-2 MiB chunks reduced buffers of 2-5
    million float32 elements 15-20% faster than 4 MiB chunks.
    """
    per_area = SHM_NODE_BUDGET_BYTES // (size + 1)
    per_area = max(SHM_AREA_MIN_BYTES, min(SHM_AREA_MAX_BYTES, per_area))
    return per_area // 4096 * 4096


class SharedMemoryReduction:
    """Fused all-reduce through an MPI shared-memory window, for ranks of one node.

    Every rank owns an *input area* in the window; rank 0's part also holds the *result
    area*. The fused buffer is processed in chunks of one area each:

    1. each rank copies its chunk of the fused buffer (converted to the reduction dtype)
       into its input area;
    2. barrier;
    3. rank ``r`` sums block ``r`` of the chunk over the input areas of all ranks, in rank
       order (``x0 + x1 + x2 ...``), divides it if asked, and writes it into the result
       area: every element of the result is computed once, by one rank;
    4. barrier;
    5. each rank copies the whole chunk from the result area into its arrays.

    The data never passes through MPI messages: a rank reads the other ranks' areas
    directly. Two barriers per chunk are the only collectives. No other synchronisation
    is needed between chunks or calls: a rank writes its input area again only after the
    second barrier, when every sum that reads it is done, and the result area is written
    again only after the next first barrier, when every rank has finished copying out.

    Each rank writes what it passed (the number of arrays and of elements, and the
    reduction dtype's size) into a header slot of the window before the first barrier of
    a call, and after it every rank compares all headers, so a mismatch raises the same
    error on every rank instead of summing unrelated data. The slot alternates from call
    to call, so that a rank that leaves a call early by that error cannot overwrite what a
    slower rank has still to read.

    Memory: one area per rank plus one, :func:`shm_area_bytes` each (2 MiB for up to 23
    ranks), in the node's shared memory (``/dev/shm`` with MPICH).
    """

    def __init__(self, MPI, comm) -> None:
        self._comm = comm
        self._size = comm.Get_size()
        self._rank = comm.Get_rank()
        self.area_bytes = shm_area_bytes(self._size)
        own = _HEADER_BYTES + self.area_bytes * (2 if self._rank == 0 else 1)
        info = MPI.Info.Create()
        info.Set("alloc_shared_noncontig", "true")  # each rank's part on its own pages
        try:
            self._win = MPI.Win.Allocate_shared(own, 1, info=info, comm=comm)
        finally:
            info.Free()
        self._win.Lock_all()  # a passive-target epoch for Win.Sync, held for good
        mems = [np.frombuffer(self._win.Shared_query(j)[0], np.uint8)
                for j in range(self._size)]
        h, a = _HEADER_BYTES, self.area_bytes
        self._headers = [m[:h].view(np.int64).reshape(2, 4) for m in mems]
        self._inputs = [m[h:h + a] for m in mems]
        self._result = mems[0][h + a:h + 2 * a]
        self._typed = {}
        self._slot = 0
        self.barriers = 0  # barriers issued so far (the only collectives of a reduction)

    def _areas(self, dtype: np.dtype):
        views = self._typed.get(dtype)
        if views is None:
            inputs = [m.view(dtype) for m in self._inputs]
            result = self._result.view(dtype)
            views = (inputs, inputs[self._rank].ctypes.data, result, result.ctypes.data)
            self._typed[dtype] = views
        return views

    def _barrier(self) -> None:
        self._win.Sync()
        self._comm.Barrier()
        self.barriers += 1
        self._win.Sync()

    def all_reduce(self, lay: Layout, n_arrays: int, division: bool) -> None:
        """Sum (or average) the arrays of ``lay`` over the ranks, in place.

        Raises:
            ValueError: on every rank, if the ranks passed different numbers of arrays or
                of elements, or different reduction dtypes.
        """
        P, r = self._size, self._rank
        inputs, own_ptr, result, result_ptr = self._areas(lay.dtype)
        chunk = self.area_bytes // lay.dtype.itemsize
        total = lay.total
        slot = self._slot
        self._slot ^= 1
        mine = (total, n_arrays, lay.dtype.itemsize, 0)
        self._headers[r][slot] = mine
        lo = 0
        while True:  # at least once, so that an empty call still checks the headers
            hi = min(total, lo + chunk)
            gather(lay, lo, hi, inputs[r], own_ptr)
            self._barrier()
            if lo == 0:
                self._check_headers(slot)
            n = hi - lo
            base, extra = divmod(n, P)
            b0 = r * base + min(r, extra)
            b1 = b0 + base + (r < extra)
            out = result[b0:b1]
            with np.errstate(over="ignore", invalid="ignore"):
                np.add(inputs[0][b0:b1], inputs[1][b0:b1], out=out)
                for j in range(2, P):
                    np.add(out, inputs[j][b0:b1], out=out)
                if division:
                    out /= P
            self._barrier()
            scatter(lay, lo, hi, result, result_ptr)
            lo = hi
            if lo >= total:
                return

    def _check_headers(self, slot: int) -> None:
        seen = [tuple(int(v) for v in h[slot]) for h in self._headers]
        if all(s == seen[0] for s in seen):
            return
        what = "; ".join(f"rank {j}: {_plural(s[1], 'array')} of {_plural(s[0], 'element')} "
                         f"in total, summed in float{8 * s[2]}" for j, s in enumerate(seen))
        raise ValueError(f"all_reduce: the ranks passed different data ({what}); every rank "
                         f"must pass arrays of the same sizes and dtypes in the same order")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
