"""Arrays in an MPI shared-memory window, one copy per rank, that an all-reduce sums where
they are (:class:`SharedArrays`), and the room an array takes there (:func:`padded`).
"""
import numpy as np

from ..core._hostarray import host_ndarray
from .fused_buffer import Layout

_ALIGN = 16  # elements: every array of a SharedArrays starts on a 64-byte boundary


class SharedArrays:
    """float32 arrays laid out end to end in an MPI shared-memory window, one copy per rank.

    Rank ``j``'s copy is ``areas[j]``; array ``i`` occupies its elements
    ``[starts[i], stops[i])``, each array starting on a 64-byte boundary (the gaps stay
    zero: their sums are zero). ``arrays[i]`` is an :class:`nnabla.NdArray` over array
    ``i`` of this rank's copy (:func:`nnabla_mpt.core._hostarray.host_ndarray`), so what nnabla
    writes there the other ranks can read, and an all-reduce of ``arrays`` needs no copy
    (:meth:`~nnabla_mpt.distributed.shared_memory_reduction.SharedMemoryReduction.all_reduce`
    with a place).

    Creating one is collective: every rank of ``comm`` creates it with the same shapes, in
    the same order relative to the other ones of ``comm``, as the ``ident`` must agree.
    The window is held until the program ends (its memory must outlive every array over
    it, and nnabla may keep an array longer than this object).
    """

    _windows = []  # every window ever allocated: never freed before MPI is finalized

    def __init__(self, MPI, comm, shapes, ident: int, ctx) -> None:
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
        win, parts = allocate_shared(MPI, comm, max(off, 1) * 4, 4)
        SharedArrays._windows.append(win)
        self.areas = [part.view(np.float32)[:off] for part in parts]
        mine = self.areas[comm.Get_rank()]
        mine[:] = 0
        comm.Barrier()  # no rank reads another's copy before it is zeroed
        base = mine.ctypes.data if off else 0
        self.ptrs = [base + 4 * a for a in self.starts]
        self._index = {p: i for i, p in enumerate(self.ptrs)}
        self._ctx = ctx
        self.arrays = [host_ndarray(p, s) for p, s in zip(self.ptrs, self.shapes)]
        self.mine = mine

    def fresh(self, i: int):
        """A new NdArray over array ``i`` of this rank's copy (its current values kept)."""
        return host_ndarray(self.ptrs[i], self.shapes[i])

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
        if i0 is None or lay.ptrs != self.ptrs[i0:i0 + len(lay.ptrs)]:
            return None
        i1 = i0 + len(lay.ptrs) - 1
        if lay.stops[-1] != sum(self.stops[i] - self.starts[i] for i in range(i0, i1 + 1)):
            return None
        return self, self.starts[i0], self.stops[i1]


def padded(n: int) -> int:
    """Elements that an array of ``n`` takes in a :class:`SharedArrays`, padding included."""
    return -(-n // _ALIGN) * _ALIGN


def allocate_shared(MPI, comm, nbytes: int, disp_unit: int):
    """``(window, parts)``: an MPI shared-memory window to which this rank brings
    ``nbytes`` (on pages of its own), and every rank's part of it as bytes, in rank order."""
    info = MPI.Info.Create()
    info.Set("alloc_shared_noncontig", "true")
    try:
        win = MPI.Win.Allocate_shared(nbytes, disp_unit, info=info, comm=comm)
    finally:
        info.Free()
    return win, [np.frombuffer(win.Shared_query(j)[0], np.uint8)
                 for j in range(comm.Get_size())]
