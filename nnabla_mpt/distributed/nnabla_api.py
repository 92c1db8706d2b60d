"""The rest of nnabla's ``Communicator`` API on :class:`~nnabla_mpt.MPICommunicator`:
``init`` (nothing left to do), ``all_gather``, and the methods it refuses, each with an
error that names the method and what to use instead.

nnabla's ``Communicator`` offers ``all_reduce``, ``all_reduce_callback``, ``bcast``,
``barrier``, ``abort``, ``name``, ``size``, ``rank``, ``local_rank`` (on the class
itself), ``init`` and ``all_gather`` (here), and ``reduce``, ``reduce_scatter``,
``allreduce``, ``add_context_and_parameters``, ``clear_context_parameters``,
``new_group``, ``find_group``, ``list_groups`` (refused here: :data:`REFUSED`).
"""
from typing import Any, Callable, Dict, List

import numpy as np

import nnabla as nn

from ..core._hostarray import dtype_of, host_view
from ._collective_args import check_group, ndarray_list as arrays_of
from .broadcast import write_bytes
from .collective_timeout import timed

_ONE_GROUP = ("MPICommunicator has one group, 'world' (all its ranks); for a subset of "
              "ranks make another MPICommunicator over an mpi4py communicator of them, "
              "MPICommunicator(MPI.COMM_WORLD.Split(color))")
_REGISTERED = ("MPICommunicator reduces the arrays passed to it: call "
               "all_reduce([v.grad for v in params.values()], division=...), or pass "
               "comm= to an updater, which reduces the solver's gradients itself")

#: nnabla's Communicator methods MPICommunicator refuses: name -> what to use instead.
REFUSED: Dict[str, str] = {
    "reduce": "call all_reduce(data, division=...): every rank receives the sum, rank dst "
              "among them",
    "reduce_scatter": "call all_reduce(ndarray_list, division=...) and read this rank's "
                      "array of the list",
    "allreduce": _REGISTERED,
    "add_context_and_parameters": _REGISTERED,
    "clear_context_parameters": _REGISTERED,
    "new_group": _ONE_GROUP,
    "find_group": _ONE_GROUP,
    "list_groups": _ONE_GROUP,
}


def _refused(name: str) -> Callable:
    def method(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"MPICommunicator.{name}() is not provided: "
                                  f"{REFUSED[name]}")
    method.__name__ = name
    method.__doc__ = f"Not provided (raises ``NotImplementedError``): {REFUSED[name]}."
    return method


class NnablaCommunicatorAPI:
    """``init``, ``all_gather`` and the refused methods of nnabla's Communicator, for
    :class:`MPICommunicator` (which sets ``_comm``, ``_size``, ``_host_ctx``,
    ``_timeout`` and ``n_collectives``)."""

    def init(self) -> None:
        """Nothing to do: the constructor initialised the communicator. Accepted so that
        scripts written for nnabla's communicators (``comm.init()``) run unchanged."""

    @timed("all_gather")
    def all_gather(self, ndarray: "nn.NdArray", ndarray_list: List["nn.NdArray"],
                   group: str = "world") -> None:
        """Copy every rank's ``ndarray`` into ``ndarray_list[rank]`` on every rank, bit for
        bit, as nnabla's ``all_gather`` (which nnabla's CLI calls).

        Args:
            ndarray: This rank's :class:`nnabla.NdArray`; every rank passes one of the same
                shape and dtype.
            ndarray_list: :attr:`size` NdArrays of that shape, which receive the arrays
                of ranks 0, 1, ... and take their dtype.
            group: Only ``"world"`` is supported.

        Raises:
            TypeError: an argument is not an NdArray (or a list of them).
            ValueError: on every rank, when a rank's list does not hold :attr:`size`
                arrays, or shapes or dtypes differ between ranks.
        """
        if not isinstance(ndarray, nn.NdArray):
            raise TypeError(f"ndarray must be an nnabla.NdArray, got "
                            f"{type(ndarray).__name__}: {ndarray!r}")
        outs = arrays_of(ndarray_list, "ndarray_list")
        check_group(group)
        dtype = dtype_of(ndarray)
        mine = (tuple(ndarray.shape), dtype.str, [tuple(a.shape) for a in outs])
        self.n_collectives += 1
        problem = _gather_mismatch(self._comm.allgather(mine), self._size)
        if problem:
            raise ValueError(f"cannot all_gather: {problem}")
        send = host_view(ndarray, dtype, self._host_ctx).view(np.uint8).copy()
        received = np.empty(send.size * self._size, np.uint8)
        self.n_collectives += 1
        self._comm.Allgather(send, received)
        write_bytes(received, outs, [dtype] * len(outs), self._host_ctx)


for _name in REFUSED:
    setattr(NnablaCommunicatorAPI, _name, _refused(_name))


def _gather_mismatch(signatures: List[Any], size: int) -> str:
    """How the ranks' ``(shape, dtype, output shapes)`` disagree, or ''."""
    shape, dtype, _ = signatures[0]
    for r, (r_shape, r_dtype, r_outs) in enumerate(signatures):
        if (r_shape, r_dtype) != (shape, dtype):
            return (f"rank {r} passed an array of shape {r_shape} and dtype "
                    f"{np.dtype(r_dtype)}, rank 0 one of shape {shape} and dtype "
                    f"{np.dtype(dtype)}")
        if len(r_outs) != size:
            return f"rank {r} passed {len(r_outs)} arrays in ndarray_list for {size} ranks"
        wrong = [i for i, s in enumerate(r_outs) if s != shape]
        if wrong:
            return (f"rank {r}'s ndarray_list[{wrong[0]}] has shape {r_outs[wrong[0]]}, "
                    f"the gathered arrays {shape}")
    return ""
