"""Gradients in memory shared by the ranks of one machine, made by
:meth:`nnabla_mpt.MPICommunicator.share_grads`.

:class:`SharedGradients` places the parameters' gradients in a shared-memory window and
keeps them there; ``shared_memory_shortfall`` checks first that the window fits in the memory the
ranks can get (:mod:`~nnabla_mpt.distributed.memory_room`), where it would otherwise end the
job with ``SIGBUS`` or the out-of-memory killer.
:class:`ShareGrads` gives :class:`~nnabla_mpt.MPICommunicator` its ``share_grads`` and
``shared_memory_shortfall``; the communicator keeps its windows, in which its
``all_reduce`` finds the arrays it is given.
"""
from typing import Any, Dict, List, Sequence, Union

import nnabla as nn
from nnabla.logger import logger

from . import memory_room
from ._collective_args import parameter_items
from .collective_timeout import timed
from .shared_arrays import SharedArrays, padded

__all__ = ["SharedGradients"]

def parameter_variables(params: Union[Dict[str, Any], Sequence[Any]]) -> List["nn.Variable"]:
    """The Variables of ``params`` (a dict of name to Variable, or a list), in order, after
    checking that there is at least one and that none is there twice."""
    items = parameter_items(params, "Variables")
    seen = {}
    for name, v in items:
        if not isinstance(v, nn.Variable):
            raise TypeError(f"params[{name!r}] must be an nnabla.Variable, got "
                            f"{type(v).__name__}")
        if id(v) in seen:
            raise ValueError(f"params[{name!r}] is the same Variable as "
                             f"params[{seen[id(v)]!r}]")
        seen[id(v)] = name
    return [v for _, v in items]


class SharedGradients:
    """Gradients placed in shared memory by :meth:`MPICommunicator.share_grads`.

    Zero the gradients with :meth:`zero`, not ``solver.zero_grad()``: nnabla implements
    ``zero_grad`` by dropping the arrays' memory, so the gradients would leave the shared
    memory (correct, but reduced by copying again until the next :meth:`zero` puts them
    back). The same holds for a gradient nnabla writes in another dtype (float16 graphs):
    it is reduced by copying.

    Attributes:
        variables: The parameters, in the order given.
        arrays: Their gradient arrays (the current ``.grad`` of each; :meth:`zero` renews
            an entry whose gradient had to be put back), the list to pass to
            :meth:`MPICommunicator.all_reduce`. Parameters with no elements keep
            gradients of their own.
        n_replaced (int): How many times :meth:`zero` found a gradient outside the shared
            memory and put it back.
    """

    # After this many calls of zero() in a row that had to put a gradient back, one
    # warning says that the gradients keep leaving the shared memory.
    _WARN_AFTER = 3

    def __init__(self, variables: List["nn.Variable"], MPI: Any, comm: Any,
                 windows: List[SharedArrays], ctx: Any) -> None:
        """Place the gradients of ``variables`` (current values kept) in a new window
        (collective), appended to the communicator's ``windows``."""
        self.variables = list(variables)
        self._placed = [i for i, v in enumerate(self.variables) if v.size > 0]
        self._empty = [v for v in self.variables if v.size == 0]
        self._region = SharedArrays(MPI, comm, [self.variables[i].shape for i in self._placed],
                                    len(windows) + 1, ctx)
        windows.append(self._region)
        for k, i in enumerate(self._placed):
            v = self.variables[i]
            self._region.view(k)[...] = v.g.reshape(-1)   # the current values kept
            v.grad = self._region.arrays[k]
        self.arrays = [v.grad for v in self.variables]
        self.n_replaced = 0
        self._streak = 0
        self._warned = False

    def zero(self) -> None:
        """Set every gradient to zero, in place in the shared memory.

        A gradient found elsewhere (after ``solver.zero_grad()``, an assignment to
        ``.grad`` or a float16 backward pass) is put back first: its parameter's
        ``.grad`` becomes a new array over its place (and :attr:`arrays` is renewed).
        """
        region, variables, arrays = self._region, self.variables, self.arrays
        replaced = False
        for k, i in enumerate(self._placed):
            v = variables[i]
            if not region.in_place(k, v.grad):
                v.grad = region.fresh(k)
                arrays[i] = v.grad
                replaced = True
        region.mine[:] = 0
        for v in self._empty:
            v.grad.zero()
        if replaced:
            self.n_replaced += 1
            self._streak += 1
            if self._streak >= self._WARN_AFTER and not self._warned:
                self._warned = True
                logger.warning(
                    f"nnabla_mpt: the gradients in shared memory were found elsewhere at "
                    f"{self._streak} zero() calls in a row (solver.zero_grad(), float16 "
                    f"gradients?); they are reduced by copying meanwhile. Zero them with "
                    f"SharedGradients.zero(), or do not share them")
        else:
            self._streak = 0


class ShareGrads:
    """The shared-memory gradients of :class:`~nnabla_mpt.MPICommunicator`: its
    :meth:`share_grads` and :meth:`shared_memory_shortfall` (it holds ``_comm``,
    ``_algorithm``, ``_local_size``, ``_windows``, ``_timeout`` and ``n_collectives``).
    """

    @timed("share_grads")
    def share_grads(self, params: Union[Dict[str, Any], Sequence[Any]]) -> "SharedGradients":
        """Put the gradients of ``params`` in memory shared by the ranks, end to end, so that
        an :meth:`all_reduce` of them copies nothing.

        Each parameter's ``.grad`` becomes an :class:`nnabla.NdArray` over its place in a
        shared-memory window that holds every rank's gradients (current values kept).
        An :meth:`all_reduce` of consecutive arrays of the returned
        :attr:`SharedGradients.arrays` then sums them where they are: rank ``i`` adds
        block ``i`` over the ranks' copies, in rank order, and writes the sum into every
        copy; two barriers in all, whatever the size, and the same bits as the copying
        path. It is what the loss-scaling updaters do with this communicator on float32
        graphs (``shared_grads=``).

        Zero the gradients with :meth:`SharedGradients.zero`, not ``solver.zero_grad()``,
        which takes them out of the shared memory (see :class:`SharedGradients`).

        Collective: every rank calls it with the same shapes, in the same order relative
        to its other calls. The window (the gradients' size, in float32, per rank, in the
        machine's shared memory, ``/dev/shm`` with MPICH) is held until the program ends.

        Args:
            params: A dict of name to :class:`nnabla.Variable` (such as
                ``solver.get_parameters()``; the order is the dict's) or a list of
                Variables.

        Returns:
            SharedGradients: the handle to zero the gradients and to pass to
            :meth:`all_reduce`.

        Raises:
            TypeError: ``params`` or one of its values is not a Variable.
            ValueError: ``params`` is empty or has a Variable twice, or this communicator
                does not use ``algorithm="shared_memory"``.
        """
        variables = parameter_variables(params)
        if self._algorithm != "shared_memory":
            raise ValueError(f"share_grads needs algorithm='shared_memory' (every rank on "
                             f"one machine); this communicator uses {self._algorithm!r}")
        missing = self.shared_memory_shortfall(variables)
        if missing:
            raise ValueError(f"share_grads: {missing}")
        shared = SharedGradients(variables, self._MPI, self._comm, self._windows,
                                 self._host_ctx)
        self.n_collectives += 1  # the barrier after zeroing the window
        return shared

    @timed("shared_memory_shortfall")
    def shared_memory_shortfall(self, variables: Sequence["nn.Variable"]) -> str:
        """Why the gradients of ``variables`` would not fit in this machine's shared memory,
        or ``""`` if they fit (or neither figure below can be read).

        The window of :meth:`share_grads` takes the gradients' size in float32 per rank
        of this machine from ``/dev/shm`` (where MPICH allocates it), which is memory too:
        a full ``/dev/shm`` would kill the processes with ``SIGBUS`` at the first write,
        exhausted memory would bring the kernel's out-of-memory killer. So the window must
        fit in ``/dev/shm``'s free space and in half of the memory the processes can still
        get (``MemAvailable``, or what a cgroup's memory limit leaves, whichever is
        smaller): the other half is left for the training
        (:mod:`nnabla_mpt.distributed.memory_room`). The ranks agree on the answer (one
        collective), so that they all decide alike.
        """
        self.n_collectives += 1  # the ranks' agreement on the answer
        per_rank = 4 * sum(padded(int(v.size)) for v in variables)
        missing = memory_room.shortfall(f"the gradients ({memory_room.mib(per_rank)} a rank)",
                                        per_rank * self._local_size, self._local_size,
                                        self._comm)
        if not missing:
            return ""
        return (f"{missing}; make room (free memory, or a container's --shm-size and memory "
                f"limit) or do not share the gradients")
