"""The reduction of a fused buffer among the ranks of one machine, through an MPI
shared-memory window, without MPI messages (:class:`SharedMemoryReduction`).
"""
from typing import List

import numpy as np

from .fused_buffer import Layout, check_signatures, gather, scatter, signature
from .shared_arrays import SharedArrays, allocate_shared

# Bytes of shared memory per input area; one area per rank plus one result area.
SHM_NODE_BUDGET_BYTES = 48 << 20
SHM_AREA_MIN_BYTES = 256 << 10
SHM_AREA_MAX_BYTES = 2 << 20
_HEADER_INTS = 8
_HEADER_BYTES = 2 * 8 * _HEADER_INTS  # two slots of eight int64


def shm_area_bytes(size: int) -> int:
    """Bytes of one area for ``size`` ranks: at most 2 MiB, within a node budget of 48 MiB.

    Smaller chunks keep more of a chunk in the caches between the copy in, the sum and
    the copy out: with two ranks on one machine, 1-2 MiB chunks reduced buffers of 2-5
    million float32 elements faster than 4 MiB chunks (``benchmarks/README.md`` keeps the
    runs).
    """
    per_area = SHM_NODE_BUDGET_BYTES // (size + 1)
    per_area = max(SHM_AREA_MIN_BYTES, min(SHM_AREA_MAX_BYTES, per_area))
    return per_area // 4096 * 4096


def window_bytes(size: int) -> int:
    """Bytes of shared memory the window of :class:`SharedMemoryReduction` takes for
    ``size`` ranks, all of them together: a header and an input area per rank, and the
    result area."""
    return size * _HEADER_BYTES + (size + 1) * shm_area_bytes(size)


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
        self._win, mems = allocate_shared(MPI, comm, own, 1)
        self._win.Lock_all()  # a passive-target epoch for Win.Sync, held for good
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
        inputs, own_ptr, result, result_ptr = self._areas(lay.dtype)
        chunk = self.area_bytes // lay.dtype.itemsize
        slot = self._begin(lay, n_arrays, place)
        lo = 0
        while True:  # at least once, so that an empty call still checks the headers
            hi = min(lay.total, lo + chunk)
            if lo > 0:
                gather(lay, lo, hi, inputs[self._rank], own_ptr)
                self._barrier()
            elif self._first_chunk_in(lay, hi, slot, place, division):
                return   # reduced in place
            b0, b1 = _block(hi - lo, self._size, self._rank)
            _sum_ranks(result[b0:b1], [area[b0:b1] for area in inputs], division)
            self._barrier()
            scatter(lay, lo, hi, result, result_ptr)
            lo = hi
            if lo >= lay.total:
                return

    def _begin(self, lay: Layout, n_arrays: int, place) -> int:
        """Writes what this rank passed to the call it begins (signature, place, the
        call's number) into the next header slot, and returns the slot."""
        slot = self._slot
        self._slot ^= 1
        self._calls += 1
        if place is None:
            where = (0, 0, 0)
        else:
            where = (place[0].ident, place[1], place[2])
        self._headers[self._rank][slot] = signature(lay, n_arrays) + where + (self._calls,)
        return slot

    def _first_chunk_in(self, lay: Layout, hi: int, slot: int, place,
                        division: bool) -> bool:
        """Copies the first chunk ``[0, hi)`` in around the call's first barrier, after
        which the ranks' headers are compared; returns True when the call was reduced in
        place instead (every rank passed the same place).

        A rank with a place copies in only once it knows that the others have one too;
        then every rank needs one more barrier before the sums."""
        inputs, own_ptr = self._areas(lay.dtype)[:2]
        if place is None:
            gather(lay, 0, hi, inputs[self._rank], own_ptr)
        self._barrier()
        if self._check_headers(slot):
            self.in_place_calls += 1
            self._reduce_in_place(*place, division)
            return True
        if place is not None:
            gather(lay, 0, hi, inputs[self._rank], own_ptr)
        if any(self._headers[j][slot][4] for j in range(self._size)):
            self._barrier()
        return False

    def absent(self) -> List[int]:
        """The ranks whose header does not show the call this rank is in (read while it
        waits in the call: who has not arrived)."""
        slot, call = self._slot ^ 1, self._calls
        return [j for j in range(self._size) if self._headers[j][slot][7] != call]

    def _reduce_in_place(self, shared: SharedArrays, lo: int, hi: int,
                         division: bool) -> None:
        """Rank ``r`` sums block ``r`` of ``[lo, hi)`` over the ranks' copies of ``shared``
        (in rank order, into rank 0's copy: the same operations as the copying path, so
        the same bits) and copies the sum into every other rank's copy."""
        areas = shared.areas
        b0, b1 = _block(hi - lo, self._size, self._rank)
        b0, b1 = lo + b0, lo + b1
        out = areas[0][b0:b1]
        _sum_ranks(out, [area[b0:b1] for area in areas], division)
        for j in range(1, self._size):
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


def _sum_ranks(out: np.ndarray, blocks: List[np.ndarray], division: bool) -> None:
    """``out`` = ``blocks[0] + blocks[1] + ...``, added in rank order (``out`` may be
    ``blocks[0]``), divided by the number of ranks if ``division``."""
    with np.errstate(over="ignore", invalid="ignore"):
        np.add(blocks[0], blocks[1], out=out)
        for block in blocks[2:]:
            np.add(out, block, out=out)
        if division:
            out /= len(blocks)
