"""The argument checks of the collectives (all_reduce, bcast, all_reduce_callback): the
data as a list of NdArrays, the parameters, the source rank, the group. Each raises
``TypeError`` or ``ValueError`` naming the argument and the value."""
from typing import Any, List, Tuple

import nnabla as nn

from ..core import _validate as check


def ndarray_list(data: Any, argname: str = "data") -> List["nn.NdArray"]:
    """Normalise ``data`` (one NdArray or a sequence of them) to a list, with clear errors."""
    if isinstance(data, nn.NdArray):
        return [data]
    if isinstance(data, nn.Variable):
        raise TypeError(
            f"{argname} must be an nnabla.NdArray or a list of them, got an nnabla.Variable "
            f"of shape {tuple(data.shape)}; pass its .grad or .data")
    if not isinstance(data, (list, tuple)):
        raise TypeError(
            f"{argname} must be an nnabla.NdArray or a list of them, got {type(data).__name__}: "
            f"{data!r}")
    if len(data) == 0:
        raise ValueError(f"{argname} must contain at least one nnabla.NdArray, got an empty "
                         f"{type(data).__name__}")
    for i, a in enumerate(data):
        if not isinstance(a, nn.NdArray):
            hint = "; pass its .grad or .data" if isinstance(a, nn.Variable) else ""
            raise TypeError(f"{argname}[{i}] must be an nnabla.NdArray, got "
                            f"{type(a).__name__}{hint}")
    return list(data)


def parameter_items(params: Any, kinds: str) -> List[Tuple[Any, Any]]:
    """``(name, value)`` of every entry of ``params``, a dict of name to Variable (in its
    order) or a list of ``kinds`` (by index), after checking that it is one of the two and
    not empty."""
    if isinstance(params, dict):
        items = list(params.items())
    elif isinstance(params, (list, tuple)):
        items = list(enumerate(params))
    else:
        raise TypeError(f"params must be a dict of name to nnabla.Variable or a list of "
                        f"{kinds}, got {type(params).__name__}: {params!r}")
    if not items:
        raise ValueError(f"params must contain at least one parameter, got an empty "
                         f"{type(params).__name__}")
    return items


def check_src(src: Any, size: int) -> None:
    src = check.integer("src", src)
    if not 0 <= src < size:
        raise ValueError(f"src must be a rank in [0, {size - 1}], got {src}")


def check_group(group: Any) -> None:
    if group != "world":
        raise ValueError(f"group must be 'world' (the only group MPICommunicator "
                         f"supports), got {group!r}")
