"""The fused buffer of one ``all_reduce`` call, and its reduction through shared memory.

All arrays of a call are laid end to end: array ``i`` occupies elements
``[start_i, stop_i)`` of a virtual buffer of ``total`` elements in the reduction dtype.
:func:`gather` copies a range of that buffer from the arrays into contiguous memory and
:func:`scatter` copies it back, converting dtypes where an array's own dtype differs.

Each array's host pointer is read once per call with ``NdArray.data_ptr``; a numpy view
is only built for arrays that need a dtype conversion, because building one costs about
as much as the pointer itself and an array in the reduction dtype is copied with a plain
``memmove``.

:class:`MessageReduction` reduces such a buffer through MPI collectives, on any
machines. :class:`SharedMemoryReduction` reduces it among the ranks of one machine
through an MPI shared-memory window, without MPI messages. :class:`SharedArrays` lays
the gradients themselves out in such a window, so that a call on them copies nothing.
"""
import bisect
import ctypes
from typing import List, Sequence

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


class MessageReduction:
    """Fused all-reduce through MPI collectives, for ranks on any machines.

    The arrays are copied into one contiguous buffer (padded with zeros to a multiple of
    the number of ranks), the buffer is summed over the ranks by two collectives
    (:meth:`reduce`), divided if asked, and copied back into the arrays:

    * ``"reduce_scatter"``: ``Reduce_scatter_block`` leaves block ``r`` of the sum on
      rank ``r`` only, then ``Allgather`` copies the blocks to all ranks; its traffic is
      that of a ring all-reduce;
    * ``"reduce_bcast"``: ``Reduce`` to rank 0, then ``Bcast``.

    Either way every element of the sum is computed once, on one rank, and then only
    copied, so that every rank gets the same bits. The buffers are kept between calls.
    """

    def __init__(self, MPI, comm, algorithm: str) -> None:
        self.comm = comm
        self._MPI = MPI
        self._algorithm = algorithm
        self._size = comm.Get_size()
        self._rank = comm.Get_rank()
        self._buffer = np.empty(0, np.float32)
        self._block = np.empty(0, np.float32)

    def all_reduce(self, lay: Layout, n_arrays: int, division: bool) -> None:
        """Sum (or average) the arrays of ``lay`` over the ranks, in place.

        The ranks first compare what they passed (one ``allgather`` of four numbers), so
        that a mismatch raises the same ``ValueError`` on every rank instead of an MPI
        error ("Message truncated") on some, or sums of unrelated data.
        """
        check_signatures(self.comm.allgather(signature(lay, n_arrays)))
        total = lay.total
        padded = -(-total // self._size) * self._size
        buf = self._get_buffer(padded, lay.dtype)
        buf_ptr = buf.ctypes.data
        # each array is read in its own dtype; the copy converts to the buffer's
        gather(lay, 0, total, buf, buf_ptr)
        buf[total:] = 0

        self.reduce(buf)
        if division:
            buf[:total] /= self._size

        scatter(lay, 0, total, buf, buf_ptr)

    def reduce(self, buf: np.ndarray) -> None:
        """Sum ``buf`` (a multiple of the number of ranks long) over the ranks, in place."""
        MPI = self._MPI
        if self._algorithm == "reduce_scatter":
            blk = self._get_block(buf.size // self._size, buf.dtype)
            self.comm.Reduce_scatter_block(buf, blk, op=MPI.SUM)
            self.comm.Allgather(blk, buf)
        else:
            if self._rank == 0:
                self.comm.Reduce(MPI.IN_PLACE, buf, op=MPI.SUM, root=0)
            else:
                self.comm.Reduce(buf, None, op=MPI.SUM, root=0)
            self.comm.Bcast(buf, root=0)

    def _get_buffer(self, n: int, dtype: np.dtype) -> np.ndarray:
        if self._buffer.dtype != dtype or self._buffer.size < n:
            self._buffer = np.empty(n, dtype)
        return self._buffer[:n]

    def _get_block(self, n: int, dtype: np.dtype) -> np.ndarray:
        if self._block.dtype != dtype or self._block.size < n:
            self._block = np.empty(n, dtype)
        return self._block[:n]


# Bytes of shared memory per input area; one area per rank plus one result area.
SHM_NODE_BUDGET_BYTES = 48 << 20
SHM_AREA_MIN_BYTES = 256 << 10
SHM_AREA_MAX_BYTES = 2 << 20
_HEADER_INTS = 8
_HEADER_BYTES = 2 * 8 * _HEADER_INTS  # two slots of eight int64
_ALIGN = 16  # elements: every array of a SharedArrays starts on a 64-byte boundary


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
    slower rank has still to read. The header also holds the number of the call, so that
    a rank that waits too long can tell which ranks have not arrived (:meth:`absent`).

    Arrays that already lie in a :class:`SharedArrays` (``place``) skip steps 1 and 5:
    after the first barrier rank ``r`` sums block ``r`` over the ranks' copies of those
    arrays and writes the sum into every copy, and a second barrier ends the call,
    whatever the size. The header carries each rank's place; if the ranks' places differ
    (or some rank has none), the ranks with a place copy in after the first barrier and
    every rank takes one more barrier before the sums of the first chunk.

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
        self._headers = [m[:h].view(np.int64).reshape(2, _HEADER_INTS) for m in mems]
        self._inputs = [m[h:h + a] for m in mems]
        self._result = mems[0][h + a:h + 2 * a]
        self._typed = {}
        self._slot = 0
        self._calls = 0    # calls begun, written into the header: who arrived at this one
        self.barriers = 0  # barriers issued so far (the only collectives of a reduction)
        self.in_place_calls = 0  # calls reduced inside a SharedArrays, without copies

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

    def all_reduce(self, lay: Layout, n_arrays: int, division: bool, place=None) -> None:
        """Sum (or average) the arrays of ``lay`` over the ranks, in place.

        ``place`` is ``(shared, lo, hi)`` when the arrays are the consecutive arrays of a
        :class:`SharedArrays` that span its elements ``[lo, hi)`` (see
        :meth:`SharedArrays.locate`). If every rank passes such a place, the same one,
        the sums are computed inside ``shared`` and nothing is copied; otherwise (a rank
        whose arrays moved) every rank takes the copying path.

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
        self._calls += 1
        if place is None:
            where = (0, 0, 0)
        else:
            where = (place[0].ident, place[1], place[2])
        self._headers[r][slot] = signature(lay, n_arrays) + where + (self._calls,)
        lo = 0
        while True:  # at least once, so that an empty call still checks the headers
            hi = min(total, lo + chunk)
            if lo == 0:
                # A rank with a place copies in only once it knows that the others have
                # one too; then every rank needs one more barrier before the sums.
                if place is None:
                    gather(lay, lo, hi, inputs[r], own_ptr)
                self._barrier()
                if self._check_headers(slot):
                    self.in_place_calls += 1
                    self._reduce_in_place(*place, division)
                    return
                if place is not None:
                    gather(lay, lo, hi, inputs[r], own_ptr)
                if any(self._headers[j][slot][4] for j in range(P)):
                    self._barrier()
            else:
                gather(lay, lo, hi, inputs[r], own_ptr)
                self._barrier()
            b0, b1 = _block(hi - lo, P, r)
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

    def absent(self) -> List[int]:
        """The ranks whose header does not show the call this rank is in (read while it
        waits in the call: who has not arrived)."""
        slot, call = self._slot ^ 1, self._calls
        return [j for j in range(self._size) if self._headers[j][slot][7] != call]

    def _reduce_in_place(self, shared: "SharedArrays", lo: int, hi: int,
                         division: bool) -> None:
        """Rank ``r`` sums block ``r`` of ``[lo, hi)`` over the ranks' copies of ``shared``
        (in rank order, into rank 0's copy: the same operations as the copying path, so
        the same bits) and copies the sum into every other rank's copy."""
        P = self._size
        areas = shared.areas
        b0, b1 = _block(hi - lo, P, self._rank)
        b0, b1 = lo + b0, lo + b1
        out = areas[0][b0:b1]
        with np.errstate(over="ignore", invalid="ignore"):
            np.add(out, areas[1][b0:b1], out=out)
            for j in range(2, P):
                np.add(out, areas[j][b0:b1], out=out)
            if division:
                out /= P
        for j in range(1, P):
            areas[j][b0:b1] = out
        self._barrier()

    def _check_headers(self, slot: int) -> bool:
        """Raise if the ranks passed different data; return whether all of them passed the
        same place in a :class:`SharedArrays` (so that the sums can be made there)."""
        seen = [tuple(int(v) for v in h[slot]) for h in self._headers]
        check_signatures(seen)
        return seen[0][4] != 0 and all(s[4:7] == seen[0][4:7] for s in seen)


def _block(n: int, P: int, r: int):
    """Rank ``r``'s block ``[b0, b1)`` of ``n`` elements split as evenly as possible."""
    base, extra = divmod(n, P)
    b0 = r * base + min(r, extra)
    return b0, b0 + base + (r < extra)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class SharedArrays:
    """float32 arrays laid out end to end in an MPI shared-memory window, one copy per rank.

    Rank ``j``'s copy is ``areas[j]``; array ``i`` occupies its elements
    ``[starts[i], stops[i])``, each array starting on a 64-byte boundary (the gaps stay
    zero: their sums are zero). ``arrays[i]`` is an :class:`nnabla.NdArray` over array
    ``i`` of this rank's copy (:func:`nnabla_mpt.core._hostarray.host_ndarray`), so what nnabla
    writes there the other ranks can read, and an all-reduce of ``arrays`` needs no copy
    (:meth:`SharedMemoryReduction.all_reduce` with a place).

    Creating one is collective: every rank of ``comm`` creates it with the same shapes, in
    the same order relative to the other ones of ``comm``, as the ``ident`` must agree.
    The window is held until the program ends (its memory must outlive every array over
    it, and nnabla may keep an array longer than this object).
    """

    _windows = []  # every window ever allocated: never freed before MPI is finalized

    def __init__(self, MPI, comm, shapes, ident: int, ctx) -> None:
        from ..core._hostarray import host_ndarray

        self.ident = ident
        self.dtype = np.dtype(np.float32)
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.starts, self.stops = [], []
        off = 0
        for n in sizes:
            self.starts.append(off)
            self.stops.append(off + n)
            off += padded(n)
        self.total = off
        info = MPI.Info.Create()
        info.Set("alloc_shared_noncontig", "true")
        try:
            win = MPI.Win.Allocate_shared(max(off, 1) * 4, 4, info=info, comm=comm)
        finally:
            info.Free()
        SharedArrays._windows.append(win)
        self.areas = [np.frombuffer(win.Shared_query(j)[0], np.float32)[:off]
                      for j in range(comm.Get_size())]
        mine = self.areas[comm.Get_rank()]
        mine[:] = 0
        comm.Barrier()  # no rank reads another's copy before it is zeroed
        base = mine.ctypes.data if off else 0
        self.ptrs = [base + 4 * a for a in self.starts]
        self._index = {p: i for i, p in enumerate(self.ptrs)}
        self._ctx = ctx
        self._host_ndarray = host_ndarray
        self.arrays = [host_ndarray(p, s) for p, s in zip(self.ptrs, self.shapes)]
        self.mine = mine

    def fresh(self, i: int):
        """A new NdArray over array ``i`` of this rank's copy (its current values kept)."""
        return self._host_ndarray(self.ptrs[i], self.shapes[i])

    def view(self, i: int) -> np.ndarray:
        """Array ``i`` of this rank's copy, flat, as NumPy."""
        return self.mine[self.starts[i]:self.stops[i]]

    def in_place(self, i: int, a) -> bool:
        """Whether NdArray ``a`` holds array ``i`` here, as nnabla's current float32 copy
        (asked for writing: nnabla drops every other copy)."""
        return a.data_ptr(self.dtype, self._ctx, True) == self.ptrs[i]

    def locate(self, lay: Layout):
        """``(self, lo, hi)`` if the pieces of ``lay`` are consecutive arrays of this rank's
        copy, in order and whole, spanning its elements ``[lo, hi)``; else None."""
        if lay.converted or lay.dtype != self.dtype or not lay.ptrs:
            return None
        i0 = self._index.get(lay.ptrs[0])
        if i0 is None or i0 + len(lay.ptrs) > len(self.ptrs):
            return None
        if lay.ptrs != self.ptrs[i0:i0 + len(lay.ptrs)]:
            return None
        i1 = i0 + len(lay.ptrs) - 1
        if lay.stops[-1] != self.stops[i1] - self.starts[i0] - _gaps(self, i0, i1):
            return None
        return self, self.starts[i0], self.stops[i1]


def padded(n: int) -> int:
    """Elements that an array of ``n`` takes in a :class:`SharedArrays`, padding included."""
    return -(-n // _ALIGN) * _ALIGN


def _gaps(shared: SharedArrays, i0: int, i1: int) -> int:
    """Padding elements between arrays ``i0`` and ``i1`` of ``shared``."""
    return sum(shared.starts[i + 1] - shared.stops[i] for i in range(i0, i1))
