"""A CPU communicator over MPI (mpi4py) with the part of nnabla's Communicator API
that data-parallel training uses.

``mpi4py`` is imported only when an :class:`MPICommunicator` is constructed, so
``import nnabla_mpt`` never initialises MPI.

The class checks arguments, counts and dispatches; the work is done in modules named
after it: ``fused_buffer`` (the fused buffer of an all-reduce) and its two reductions,
``shared_memory_reduction`` (through shared memory, in place where the arrays lie in
``shared_arrays``) and ``message_reduction`` (through MPI collectives), ``broadcast`` (bcast
and broadcast_parameters), ``shared_gradients`` (share_grads and the free-space check),
``collective_timeout`` (no collective waits forever),
``reduce_callback`` (all_reduce_callback: the reduction armed for the next solver
operation), ``nnabla_api`` (``init``, ``all_gather`` and the methods of nnabla's API it
refuses) and ``abort`` (the exception hook and ``MPI_Abort``).
"""
from typing import Any, List, Literal, Optional, Sequence, Tuple, Union, get_args

import numpy as np

import nnabla as nn

from ..core._hostarray import dtype_of
from ..core._validate import boolean, choice, real
from . import memory_room
from ._collective_args import check_group, ndarray_list
from .abort import abort_job, install_excepthook
from .broadcast import Broadcast
from .collective_timeout import DEFAULT_TIMEOUT, CollectiveTimeout, timed
from .fused_buffer import layout
from .message_reduction import MessageReduction
from .nnabla_api import NnablaCommunicatorAPI
from .reduce_callback import AllReduceCallback
from .shared_gradients import ShareGrads, SharedGradients
from .shared_memory_reduction import SharedMemoryReduction, window_bytes

__all__ = ["MPICommunicator", "SharedGradients"]

Algorithm = Literal["auto", "shared_memory", "reduce_scatter", "reduce_bcast"]
_ALGORITHMS = get_args(Algorithm)


def _reduction_dtype(dtypes: Sequence[np.dtype]) -> np.dtype:
    """float32 for float16/float32 (and small integer) arrays, float64 if any array needs it."""
    unique = set(dtypes)
    for dt in unique:
        if dt.kind not in "biuf":
            raise TypeError(f"data holds an array of dtype {dt}; only boolean, integer and "
                            f"floating arrays can be reduced")
    return np.dtype(np.result_type(np.float32, *unique))


def import_mpi() -> Any:
    """``mpi4py.MPI``, imported here so that importing nnabla_mpt never starts MPI; without
    mpi4py, an error that says how to install it."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"MPICommunicator needs mpi4py, which cannot be imported ({exc}). From the "
            f"nnabla_mpt checkout, install it with  pip install \".[mpi]\"  or on its own "
            f"with  pip install mpi4py mpich  (the mpich package brings an MPI library "
            f"with it, so nothing else needs installing)", name="mpi4py") from exc
    return MPI


def _checked_comm(MPI: Any, comm: Any) -> Any:
    """``comm``, or ``MPI.COMM_WORLD`` for None, once it is known to be a usable one."""
    if comm is None:
        comm = MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm must be an mpi4py.MPI.Comm or None, got "
                        f"{type(comm).__name__}: {comm!r}")
    if comm == MPI.COMM_NULL:
        raise ValueError("comm must be a valid communicator, got MPI.COMM_NULL")
    return comm


def _rank_on_machine(MPI: Any, comm: Any) -> Tuple[int, int]:
    """This process's rank among the ranks of ``comm`` on its machine, and their number."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    rank, size = node.Get_rank(), node.Get_size()
    node.Free()
    return rank, size


def _resolved_algorithm(algorithm: str, local_size: int, size: int) -> str:
    """The scheme that ``algorithm`` names, ``"auto"`` resolved, for ``size`` ranks of which
    ``local_size`` run on this machine."""
    one_node = local_size == size
    if algorithm == "shared_memory" and not one_node:
        raise ValueError(f"algorithm='shared_memory' needs every rank on one machine, "
                         f"but this rank's machine runs {local_size} of the {size} ranks")
    if algorithm == "auto":
        algorithm = "shared_memory" if one_node else "reduce_scatter"
    return algorithm


class MPICommunicator(AllReduceCallback, Broadcast, ShareGrads, NnablaCommunicatorAPI):
    """Data-parallel communicator for CPU training over MPI.

    It offers the part of nnabla's :class:`nnabla.communicators.Communicator` API that
    training code uses, with the same names (:attr:`rank`, :attr:`size`, :meth:`all_reduce`,
    :meth:`all_reduce_callback`, :meth:`bcast`, :meth:`all_gather`, ...), plus
    :meth:`broadcast_parameters` to start every rank from rank 0's parameters; the rest
    of nnabla's API (``reduce``, groups, ...) raises ``NotImplementedError`` naming what
    to use instead (:mod:`nnabla_mpt.distributed.nnabla_api`). It can be passed as ``comm`` to the
    loss-scaling updaters.

    :meth:`all_reduce` reduces all the arrays of a call together, as one buffer, with a
    fixed number of collectives, and gradients that :meth:`share_grads` placed in shared
    memory (as the updaters do on float32 graphs) are summed where they are, without
    copies. The sum is taken in float32 also for float16 arrays (in float64 if an array
    needs it), and it is bitwise identical on every rank, so that all ranks take the same
    skip-or-update decision: each scheme of ``algorithm`` computes every element of the
    sum once, on one rank, and then only copies it. The schemes, the reduction dtype,
    the aborting and the measured speed-ups are described in :doc:`distributed`.

    Args:
        comm: An ``mpi4py.MPI.Comm``; ``None`` means ``MPI.COMM_WORLD``.
        abort_on_exception: Install a :data:`sys.excepthook` that prints the traceback as
            usual and then calls ``MPI_Abort``, so that a rank that raises while the
            others wait in a collective ends the job (with a non-zero status) instead of
            leaving it hanging. ``sys.exit(code)`` does not pass through that hook: a rank
            that must stop alone should call :meth:`abort`.
        algorithm: ``"auto"`` (default: ``"shared_memory"`` when all ranks run on one
            machine, else ``"reduce_scatter"``), ``"shared_memory"`` (requires every rank
            on one machine; the constructor allocates its window, held until the program
            ends), ``"reduce_scatter"`` or ``"reduce_bcast"``.
        timeout: Seconds a collective (an all-reduce, a broadcast, a barrier) may wait
            for the other ranks before this rank logs that it timed out and ends the job
            (``MPI_Abort``): a rank that left or stalls never leaves the others waiting
            for good (:mod:`nnabla_mpt.distributed.collective_timeout`); it must exceed the longest
            pause of any rank between two collectives (an evaluation, a checkpoint save),
            which the others spend waiting. Default 600; None waits forever.

    Attributes:
        n_all_reduce_calls (int): Number of :meth:`all_reduce` calls so far.
        n_bcast_calls (int): Number of :meth:`bcast` calls so far (including those made by
            :meth:`broadcast_parameters`).
        n_collectives (int): Number of MPI collective operations issued so far by the
            methods of this object (barriers included; the constructor's set-up is not
            counted).
        abort_on_exception (bool): The constructor's ``abort_on_exception``: whether this
            communicator asked for the exception hook (changing it later changes nothing).

    Example:
        Run with ``mpiexec -n 2 python train.py``::

            from nnabla_mpt import MPICommunicator, DynamicLossScalingUpdater

            comm = MPICommunicator()
            ...  # build the graph and the solver
            comm.broadcast_parameters(nn.get_parameters())
            updater = DynamicLossScalingUpdater(solver, loss, feeder, comm=comm,
                                                average_ranks=True)
    """

    def __init__(self, comm: Any = None, *, abort_on_exception: bool = True,
                 algorithm: Algorithm = "auto",
                 timeout: Optional[float] = DEFAULT_TIMEOUT) -> None:
        MPI = import_mpi()
        abort_on_exception = boolean("abort_on_exception", abort_on_exception)
        timeout = None if timeout is None else real("timeout", timeout, gt=0.0)
        choice("algorithm", algorithm, _ALGORITHMS)
        comm = _checked_comm(MPI, comm)
        self._comm, self._rank, self._size = comm, comm.Get_rank(), comm.Get_size()
        self._timeout = CollectiveTimeout(timeout, self._rank, self._size, comm.Abort)
        self._local_rank, self._local_size = _rank_on_machine(MPI, comm)
        self._algorithm = _resolved_algorithm(algorithm, self._local_size, self._size)
        self._shm = self._messages = None
        if self._algorithm != "shared_memory":
            self._messages = MessageReduction(MPI, comm, self._algorithm)
        elif self._size > 1:
            missing = memory_room.shortfall("the all-reduce's window",
                                            window_bytes(self._size), self._local_size, comm)
            if missing:
                raise ValueError(f"algorithm='shared_memory' (the scheme of "
                                 f"algorithm={algorithm!r} here): {missing}; free memory, or "
                                 f"pass algorithm='reduce_scatter' to reduce through MPI "
                                 f"messages")
            self._shm = SharedMemoryReduction(MPI, comm)
            self._timeout.absent = (lambda what: self._shm.absent()
                                    if what == "all_reduce" else None)
        from nnabla.ext_utils import get_extension_context
        self._host_ctx = get_extension_context("cpu")
        self._MPI = MPI
        self._windows = []      # the SharedArrays of share_grads, in the order made
        self.n_all_reduce_calls = self.n_bcast_calls = self.n_collectives = 0
        self.abort_on_exception = abort_on_exception
        if abort_on_exception:
            install_excepthook(self, comm.Abort, "error code 1")

    # ------------------------------------------------------------------ properties
    @property
    def comm(self) -> Any:
        """The underlying ``mpi4py.MPI.Comm``."""
        return self._comm

    @property
    def rank(self) -> int:
        """Rank of this process in the communicator."""
        return self._rank

    @property
    def size(self) -> int:
        """Number of processes in the communicator."""
        return self._size

    @property
    def local_rank(self) -> int:
        """Rank of this process among the processes of the same node (shared memory)."""
        return self._local_rank

    @property
    def local_size(self) -> int:
        """Number of processes of this communicator on this node."""
        return self._local_size

    @property
    def algorithm(self) -> str:
        """The reduction scheme in use: ``"shared_memory"``, ``"reduce_scatter"`` or
        ``"reduce_bcast"`` (``"auto"`` is resolved at construction)."""
        return self._algorithm

    @property
    def name(self) -> str:
        """Communicator name."""
        return type(self).__name__

    def __repr__(self) -> str:
        return (f"{self.name}(rank={self._rank}, size={self._size}, "
                f"local_rank={self._local_rank}, algorithm={self.algorithm!r})")

    # ------------------------------------------------------------------ collectives
    @timed("all_reduce")
    def all_reduce(self, data: Union["nn.NdArray", Sequence["nn.NdArray"]],
                   division: bool = False, inplace: bool = False,
                   group: str = "world") -> None:
        """Sum arrays over all ranks, in place, all arrays reduced together.

        Every array is read in its own dtype, summed in float32 (in float64 if an array is
        float64 or of an integer type wider than 16 bits), optionally divided by
        :attr:`size`, and written back in its own dtype (where a float16 value beyond 65504
        becomes ``inf``). The result is bitwise identical on every rank.

        Args:
            data: One :class:`nnabla.NdArray` or a list of them (for example the ``.grad``
                of every parameter). Every rank must pass arrays of the same sizes in the
                same order.
            division: Divide the sum by the number of ranks (average).
            inplace: Accepted for compatibility with nnabla, where it selects a memory
                strategy; as in nnabla, the result is written into ``data`` either way.
            group: Only ``"world"`` (the whole communicator) is supported.

        Raises:
            TypeError: ``data`` is not an NdArray or a list of NdArrays, or a flag is not
                a bool.
            ValueError: ``data`` is empty or ``group`` is not ``"world"``; or the ranks
                passed arrays that differ in number, in total size, in the order of their
                sizes or in the dtype they are summed in (raised on every rank, with every
                algorithm). Arrays of equal sizes swapped, or float16 beside float32 (both
                summed in float32), are not told apart.
        """
        arrays = ndarray_list(data)
        division = boolean("division", division)
        boolean("inplace", inplace)
        check_group(group)
        self.n_all_reduce_calls += 1
        if self._size == 1:
            return  # the sum over one rank is the array itself, and so is the average
        self._reduce_fused(arrays, division)

    @timed("barrier")
    def barrier(self) -> None:
        """Block until every rank has reached this call."""
        self.n_collectives += 1
        self._comm.Barrier()

    def abort(self, errorcode: int = 1) -> None:
        """Terminate every process of the job with ``errorcode`` (``MPI_Abort``).

        Does not return: this process exits right after asking the launcher to end the job.

        Args:
            errorcode: Exit status requested from the launcher.
        """
        abort_job(self, errorcode)

    # ------------------------------------------------------------------ internals
    def _reduce_fused(self, arrays: List["nn.NdArray"], division: bool) -> None:
        """Sum (or average) ``arrays`` over the ranks as one fused buffer, with the scheme
        in use, counting the collectives issued."""
        dtypes = [dtype_of(a) for a in arrays]
        lay = layout(arrays, dtypes, _reduction_dtype(dtypes), self._host_ctx)
        if self._shm is None:
            self._messages.all_reduce(lay, len(arrays), division)
            # the signatures' allgather, then Reduce_scatter_block + Allgather or Reduce + Bcast
            self.n_collectives += 3
            return
        place = None    # where the arrays lie in the windows of share_grads, if they do
        for window in self._windows:
            place = window.locate(lay)
            if place is not None:
                break
        before = self._shm.barriers
        try:
            self._shm.all_reduce(lay, len(arrays), division, place)
        finally:
            self.n_collectives += self._shm.barriers - before
