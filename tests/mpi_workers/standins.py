"""Stand-ins for what only a GPU does, run on the CPU.

Each reproduces the behaviours of nnabla-ext-cuda 1.39 named in its docstring (read in its
sources) and nothing more; everything else in the tests is real nnabla and real MPI.
"""
import numpy as np

import nnabla as nn
import nnabla.communicators  # noqa: F401 (nn.communicators)


class NcclLikeCommunicator:
    """Stand-in for nnabla's ``MultiProcessDataParallelCommunicator`` (NCCL, CUDA only),
    summing over real MPI processes (mpi4py), or alone with ``mpi_comm=None``.

    What it reproduces:

    * ``all_reduce`` casts every array it is given, in place, to the communicator's dtype
      (``"float16"``: one made from a cudnn ``half`` or ``mixed_half`` context;
      ``"float32"``: from a float one), sums it over the ranks in that dtype (in float16,
      rounding at each add, beyond 65504 inf), ``division=True`` divides that sum by the
      number of ranks (NCCL's average may scale before it sums; the updaters' own values
      come through exactly either way, see ``nnabla_mpt.distributed.exchange``);
    * per array one blocking MPI check (counted in ``n_checks``), then one NCCL all-reduce
      per array in place, one for all of them out of place (counted in ``n_nccl``);
    * ``abort()`` is ``MPI_Abort``.
    """

    def __init__(self, dtype: str = "float32", mpi_comm=None) -> None:
        self.dtype = np.dtype(dtype)
        self._comm = mpi_comm
        self._rank = 0 if mpi_comm is None else mpi_comm.Get_rank()
        self._size = 1 if mpi_comm is None else mpi_comm.Get_size()
        self.n_calls = self.n_checks = self.n_nccl = 0

    rank = property(lambda self: self._rank)
    size = property(lambda self: self._size)
    local_rank = property(lambda self: self._rank)
    name = property(lambda self: type(self).__name__)

    def all_reduce(self, data, division=False, inplace=False, group="world"):
        arrays = [data] if isinstance(data, nn.NdArray) else list(data)
        self.n_calls += 1
        self.n_checks += len(arrays)
        self.n_nccl += len(arrays) if inplace else 1
        for a in arrays:
            view = a.cast(self.dtype)
            total = self._sum(view)
            if division:
                total = (total / self.dtype.type(self.size)).astype(self.dtype)
            view[...] = total

    def _sum(self, view: np.ndarray) -> np.ndarray:
        """The sum over the ranks, in rank order, in the communicator's dtype."""
        if self._comm is None:
            return np.array(view)
        everyone = self._comm.allgather(np.array(view))
        total = everyone[0]
        with np.errstate(over="ignore"):
            for other in everyone[1:]:
                total = np.add(total, other, dtype=self.dtype)
        return total

    def barrier(self) -> None:
        if self._comm is not None:
            self._comm.Barrier()

    def abort(self) -> None:
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(1)


class CastingSolver:
    """Stand-in for an nnabla solver on a GPU under a half context: nnabla-ext-cuda
    registers solvers for ``cuda:float`` only, whose operations cast the gradients to
    float32 in place (``scale_grad``, ``weight_decay``); here the check
    (``check_inf_or_nan_grad``) casts every gradient to float32 first, so that whatever
    reads the gradients after the check finds float32 arrays holding float16 values.
    Everything else is the real solver's.
    """

    def __init__(self, solver) -> None:
        self._solver = solver

    def __getattr__(self, name):
        return getattr(self._solver, name)

    def check_inf_or_nan_grad(self) -> bool:
        for v in self._solver.get_parameters().values():
            v.grad.cast(np.float32)
        return self._solver.check_inf_or_nan_grad()


class NcclCallbackLikeCommunicator(NcclLikeCommunicator, nn.communicators.Communicator):
    """:class:`NcclLikeCommunicator` that is an ``nnabla.communicators.Communicator``, for
    the updaters' ``backward_pack_size=``, in one process: nnabla's
    ``all_reduce_callback(data, pack_size)`` runs, inside the backward pass, an MPI check
    for each array of ``data`` (counted in ``n_checks``) and an NCCL all-reduce for each
    pack of ``pack_size`` values (counted in ``n_nccl``); made here it returns None, which
    ``backward`` accepts: the sum over one rank is the gradients themselves.
    """

    def all_reduce_callback(self, data, pack_size, division=False, group="world",
                            scale_grad=1, keep_dtype=False):
        self.n_checks += len(data)
        self.n_nccl += -(-sum(a.size for a in data) // pack_size)
        return None
