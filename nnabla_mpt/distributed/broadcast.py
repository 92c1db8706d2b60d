"""Copying arrays from one rank to every rank, bit for bit:
:meth:`nnabla_mpt.MPICommunicator.bcast` and
:meth:`~nnabla_mpt.MPICommunicator.broadcast_parameters` (:class:`Broadcast`) and the work
behind them.

First the ranks exchange the names and shapes of their arrays (:func:`sender_dtypes`, one
``allgather``), so that a mismatch raises the same :class:`ValueError` on every rank
instead of corrupting memory or hanging. Then the arrays travel as raw bytes in the
sender's dtypes, in one buffer (:func:`transfer`, one ``Bcast``).
"""
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

import nnabla as nn

from ..core._hostarray import dtype_of, host_view
from ..core._validate import boolean
from ._collective_args import check_group, check_src, ndarray_list, parameter_items
from .collective_timeout import timed


def parameter_arrays(params: Union[Dict[str, Any], Sequence[Any]]
                     ) -> Tuple[Optional[List[str]], List["nn.NdArray"]]:
    """The names (sorted, or None for a list) and the data arrays of ``params``: a dict of
    name to Variable, or a list of Variables or NdArrays; with clear errors."""
    items = parameter_items(params, "Variables/NdArrays")
    names = None
    if isinstance(params, dict):
        items = sorted(items)     # by name: the names are unique
        names = [k for k, _ in items]
        for k in names:
            if not isinstance(k, str):
                raise TypeError(f"params keys must be str, got {type(k).__name__}: {k!r}")
    arrays = []
    for name, v in items:
        if isinstance(v, nn.Variable):
            arrays.append(v.data)
        elif isinstance(v, nn.NdArray):
            arrays.append(v)
        else:
            raise TypeError(f"params[{name!r}] must be an nnabla.Variable or nnabla.NdArray, "
                            f"got {type(v).__name__}")
    return names, arrays


def sender_dtypes(mpi_comm: Any, arrays: List["nn.NdArray"], src: int,
                  names: Optional[List[str]]) -> List[np.dtype]:
    """The dtypes of rank ``src``'s arrays, after checking (one ``allgather``) that every
    rank passed arrays of the same shapes (and ``names``) as ``src``.

    Raises:
        ValueError: on every rank, naming the first rank whose arrays differ.
    """
    shapes = [tuple(a.shape) for a in arrays]
    dtypes = [dtype_of(a).str for a in arrays] if mpi_comm.Get_rank() == src else None
    signatures = mpi_comm.allgather((names, shapes, dtypes))
    src_names, src_shapes, src_dtypes = signatures[src]
    for r, (r_names, r_shapes, _) in enumerate(signatures):
        problem = _signature_mismatch(src_names, src_shapes, r_names, r_shapes)
        if problem:
            raise ValueError(f"cannot broadcast from rank {src}: rank {r} {problem}")
    return [np.dtype(d) for d in src_dtypes]


def transfer(mpi_comm: Any, arrays: List["nn.NdArray"], src: int, dtypes: List[np.dtype],
             ctx: Any) -> None:
    """Copy the bytes of rank ``src``'s arrays, in ``dtypes`` (see :func:`sender_dtypes`),
    into every other rank's arrays, which take these dtypes (one ``Bcast``; ``ctx`` is
    the CPU context the arrays are read and written in)."""
    is_src = mpi_comm.Get_rank() == src
    if is_src:
        buf = np.concatenate([host_view(a, d, ctx).view(np.uint8) for a, d in zip(arrays, dtypes)])
    else:
        buf = np.empty(sum(a.size * d.itemsize for a, d in zip(arrays, dtypes)), np.uint8)
    mpi_comm.Bcast(buf, root=src)
    if not is_src:
        write_bytes(buf, arrays, dtypes, ctx)


def write_bytes(buf: np.ndarray, arrays: List["nn.NdArray"], dtypes: List[np.dtype], ctx) -> None:
    """Write ``buf``, the bytes of ``arrays`` end to end in ``dtypes``, into the arrays,
    which take these dtypes (``ctx``: the CPU context they are written in)."""
    ends = np.cumsum([a.size * d.itemsize for a, d in zip(arrays, dtypes)])
    for a, d, part in zip(arrays, dtypes, np.split(buf, ends[:-1])):
        host_view(a, d, ctx, write_only=True).view(np.uint8)[:] = part


def _signature_mismatch(src_names: Optional[List[str]], src_shapes: List[Tuple[int, ...]],
                        names: Optional[List[str]], shapes: List[Tuple[int, ...]]) -> str:
    """Describe how one rank's arrays differ from the sender's, or return ''."""
    if src_names is not None and names != src_names:
        missing = sorted(set(src_names) - set(names or []))
        extra = sorted(set(names or []) - set(src_names))
        return f"has different parameter names (missing {missing}, extra {extra})"
    if len(shapes) != len(src_shapes):
        return f"passed {len(shapes)} arrays, the sender {len(src_shapes)}"
    for i, (s, t) in enumerate(zip(shapes, src_shapes)):
        if s != t:
            label = repr(src_names[i]) if src_names is not None else str(i)
            return f"has shape {s} for array {label}, the sender {t}"
    return ""


class Broadcast:
    """``bcast`` and ``broadcast_parameters``, for :class:`~nnabla_mpt.MPICommunicator`
    (which holds ``_comm``, ``_size``, ``_host_ctx``, ``_timeout``, ``n_bcast_calls`` and
    ``n_collectives``)."""

    @timed("bcast")
    def bcast(self, data: Union["nn.NdArray", Sequence["nn.NdArray"]], src: int = 0,
              inplace: bool = False, group: str = "world") -> None:
        """Copy arrays from rank ``src`` to every rank, bit for bit.

        The arrays travel as raw bytes in ``src``'s dtypes, in one buffer; on the other
        ranks each array takes ``src``'s dtype. Before the transfer the ranks exchange the
        shapes, so a mismatch raises the same :class:`ValueError` on every rank instead of
        corrupting memory or hanging.

        Args:
            data: One :class:`nnabla.NdArray` or a list of them.
            src: Rank that sends.
            inplace: Accepted for compatibility with nnabla; the result is written into
                ``data`` either way.
            group: Only ``"world"`` is supported.

        Raises:
            TypeError: ``data`` is not an NdArray or a list of NdArrays, or ``src`` is not
                an int.
            ValueError: ``src`` is out of range, ``data`` is empty, or the shapes differ
                between ranks.
        """
        arrays = ndarray_list(data)
        check_src(src, self._size)
        boolean("inplace", inplace)
        check_group(group)
        self._bcast_arrays(arrays, src, names=None)

    @timed("broadcast_parameters")
    def broadcast_parameters(self, params: Union[Dict[str, Any], Sequence[Any]],
                             src: int = 0) -> None:
        """Overwrite the parameter values of every rank with those of rank ``src``.

        Call it once after building the graph (and before the first update) so that
        every rank starts from the same parameters.

        Args:
            params: A dict of name to :class:`nnabla.Variable` (such as
                ``nn.get_parameters()`` or ``solver.get_parameters()``), or a list of
                Variables or NdArrays. For a dict, the names must be the same on every rank.
            src: Rank whose values are copied.

        Raises:
            TypeError: ``params`` or one of its values has the wrong type.
            ValueError: ``src`` is out of range, ``params`` is empty, or names or shapes
                differ between ranks.
        """
        check_src(src, self._size)
        names, arrays = parameter_arrays(params)
        self._bcast_arrays(arrays, src, names=names)

    def _bcast_arrays(self, arrays: List["nn.NdArray"], src: int,
                      names: Optional[List[str]]) -> None:
        self.n_bcast_calls += 1
        self.n_collectives += 1
        dtypes = sender_dtypes(self._comm, arrays, src, names)
        if self._size > 1:
            self.n_collectives += 1
            transfer(self._comm, arrays, src, dtypes, self._host_ctx)
