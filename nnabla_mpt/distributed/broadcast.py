"""Copying arrays from one rank to every rank, bit for bit: the work behind
:meth:`nnabla_mpt.MPICommunicator.bcast` and
:meth:`~nnabla_mpt.MPICommunicator.broadcast_parameters`.

First the ranks exchange the names and shapes of their arrays (:func:`sender_dtypes`, one
``allgather``), so that a mismatch raises the same :class:`ValueError` on every rank
instead of corrupting memory or hanging. Then the arrays travel as raw bytes in the
sender's dtypes, in one buffer (:func:`transfer`, one ``Bcast``).
"""
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

import nnabla as nn

from ..core._hostarray import dtype_of, host_view


def parameter_arrays(params: Union[Dict[str, Any], Sequence[Any]]
                     ) -> Tuple[Optional[List[str]], List["nn.NdArray"]]:
    """The names (sorted, or None for a list) and the data arrays of ``params``: a dict of
    name to Variable, or a list of Variables or NdArrays; with clear errors."""
    if isinstance(params, dict):
        names = sorted(params)
        for k in names:
            if not isinstance(k, str):
                raise TypeError(f"params keys must be str, got {type(k).__name__}: {k!r}")
        values = [params[k] for k in names]
    elif isinstance(params, (list, tuple)):
        names, values = None, list(params)
    else:
        raise TypeError(f"params must be a dict of name to nnabla.Variable or a list of "
                        f"Variables/NdArrays, got {type(params).__name__}: {params!r}")
    if not values:
        raise ValueError(f"params must contain at least one parameter, got an empty "
                         f"{type(params).__name__}")
    arrays = []
    for i, v in enumerate(values):
        if isinstance(v, nn.Variable):
            arrays.append(v.data)
        elif isinstance(v, nn.NdArray):
            arrays.append(v)
        else:
            where = f"params[{names[i]!r}]" if names is not None else f"params[{i}]"
            raise TypeError(f"{where} must be an nnabla.Variable or nnabla.NdArray, got "
                            f"{type(v).__name__}")
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
    nbytes = [a.size * d.itemsize for a, d in zip(arrays, dtypes)]
    buf = np.empty(int(sum(nbytes)), np.uint8)
    is_src = mpi_comm.Get_rank() == src
    if is_src:
        off = 0
        for a, d, n in zip(arrays, dtypes, nbytes):
            buf[off:off + n] = host_view(a, d, ctx).view(np.uint8)
            off += n
    mpi_comm.Bcast(buf, root=src)
    if is_src:
        return
    off = 0
    for a, d, n in zip(arrays, dtypes, nbytes):
        out = host_view(a, d, ctx, write_only=True)
        out.view(np.uint8)[:] = buf[off:off + n]
        off += n


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
