"""The reduction of a fused buffer through MPI collectives, for ranks on any machines."""
import numpy as np

from .fused_buffer import Layout, check_signatures, gather, scatter, signature


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
        self._scratch = {}   # "buffer" and "block", kept between calls

    def all_reduce(self, lay: Layout, n_arrays: int, division: bool) -> None:
        """Sum (or average) the arrays of ``lay`` over the ranks, in place.

        The ranks first compare what they passed (one ``allgather`` of four numbers), so
        that a mismatch raises the same ``ValueError`` on every rank instead of an MPI
        error ("Message truncated") on some, or sums of unrelated data.
        """
        check_signatures(self.comm.allgather(signature(lay, n_arrays)))
        total = lay.total
        padded = -(-total // self._size) * self._size
        buf = self._held("buffer", padded, lay.dtype)
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
            blk = self._held("block", buf.size // self._size, buf.dtype)
            self.comm.Reduce_scatter_block(buf, blk, op=MPI.SUM)
            self.comm.Allgather(blk, buf)
        else:
            if self._rank == 0:
                self.comm.Reduce(MPI.IN_PLACE, buf, op=MPI.SUM, root=0)
            else:
                self.comm.Reduce(buf, None, op=MPI.SUM, root=0)
            self.comm.Bcast(buf, root=0)

    def _held(self, name: str, n: int, dtype: np.dtype) -> np.ndarray:
        """``n`` elements of the scratch array ``name`` in ``dtype`` (grown as needed)."""
        held = self._scratch.get(name)
        if held is None or held.dtype != dtype or held.size < n:
            held = self._scratch[name] = np.empty(n, dtype)
        return held[:n]
