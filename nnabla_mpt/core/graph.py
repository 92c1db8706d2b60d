"""What the updaters read off a loss graph: its backend, its precision, its inputs."""
import collections
import functools
from typing import Any, Dict, List, Mapping, Tuple

import nnabla as nn
import nnabla.functions as F
import nnabla.parameter as registry
from nnabla.ext_utils import get_extension_context

from .dtypes import float_type

#: The dtype of each type configuration of nnabla that is not float32.
_DTYPES = {"half": "float16", "bfloat16": "bfloat16"}


def type_config_of(loss) -> str:
    """The type configuration nnabla runs the graph of ``loss`` in (``"half"``,
    ``"float"``, ...): that of the first backend of the loss's context that nnabla has
    functions for (:func:`runnable_backend`); ``"float"`` for a leaf.

    The first backend named is not always the one that runs: nothing is registered under
    ``*:mixed_half``, so cudnn's ``mixed_half`` context (``cudnn:mixed_half, cudnn:half,
    ...``) runs in float16 and cuda's (``cuda:mixed_half, cuda:float, ...``) in float32.
    """
    return "float" if loss.parent is None else context_type_config(loss.parent.context)


def context_type_config(ctx) -> str:
    """The type configuration a function made under the context ``ctx`` runs in: that of
    its first backend nnabla has functions for (:func:`runnable_backend`)."""
    backend = runnable_backend(tuple(ctx.backend), ctx.array_class, ctx.device_id)
    return backend.rsplit(":", 1)[-1]


@functools.lru_cache(maxsize=None)
def runnable_backend(backends: Tuple[str, ...], array_class: str, device_id: str) -> str:
    """The first of ``backends`` that nnabla has functions registered for, found by
    creating ``F.identity`` under each alone (nnabla raises for a backend without it).
    Every type configuration nnabla runs has Identity in its cuda and cpu backends, and
    nothing has any under ``*:mixed_half``; cudnn registers no Identity, so a cudnn
    context resolves at its cuda backend of the same type configuration, listed after it.

    Raises:
        ValueError: none of them is registered (the message lists them).
    """
    for backend in backends:
        try:
            with nn.context_scope(nn.Context([backend], array_class, device_id)), \
                    nn.auto_forward(False):
                F.identity(nn.Variable((1,)))
        except RuntimeError:
            continue
        return backend
    raise ValueError(f"none of the backends {list(backends)} of the loss's context has "
                     f"functions registered in nnabla (is its extension installed?)")


def gradient_dtypes(loss, params: Mapping) -> Dict[str, str]:
    """``name -> dtype`` of the gradient of each parameter of ``params`` (name ->
    Variable) that the graph of ``loss`` reads: the dtype of the backward of the functions
    reading it, the narrowest where several do. A graph may mix dtypes (a float16 network
    under a loss built in float32): each gradient is computed in its readers' dtype,
    whatever the loss's. A parameter the graph does not read has none."""
    names = {v: name for name, v in params.items()}
    found: Dict[str, str] = {}
    for f in graph_functions(loss):
        dtype = _DTYPES.get(context_type_config(f.context), "float32")
        for v in f.inputs:
            name = names.get(v)
            if name is not None and (name not in found or
                                     float_type(dtype).max < float_type(found[name]).max):
                found[name] = dtype
    return found


def gradient_precision(loss, params: Mapping) -> str:
    """``"half"`` when the graph of ``loss`` computes some parameter's gradient in float16
    (:func:`gradient_dtypes`) or the loss itself in float16, else ``"float"``."""
    dtypes = {loss_dtype(loss), *gradient_dtypes(loss, params).values()}
    return "half" if "float16" in dtypes else "float"


def extension_of(loss) -> str:
    """The extension (``"cpu"``, ``"cudnn"``, ...) ``loss`` is computed with."""
    backend = [] if loss.parent is None else loss.parent.context.backend
    return backend[0].split(":")[0] if backend else "cpu"


def has_bfloat16(loss) -> bool:
    """Whether the extension ``loss`` is computed with offers a bfloat16 type."""
    try:
        get_extension_context(extension_of(loss), type_config="bfloat16")
    except (ValueError, ImportError):
        return False
    return True


def graph_functions(loss) -> List:
    """The functions of the graph of ``loss``, in the order nnabla visits them (forward)."""
    found: List = []
    loss.visit(found.append)
    return found


def graph_inputs(loss) -> Dict:
    """Every Variable some function of the graph of ``loss`` reads (parameters included), in
    the order the graph visits them: the keys of the dict returned (an ordered set)."""
    # Variables hash and compare by the variable
    return dict.fromkeys(v for f in graph_functions(loss) for v in f.inputs)


def shared_parameters(loss, params: Mapping) -> List[str]:
    """The names of the parameters in ``params`` (name -> Variable) that more than one
    function of the graph of ``loss`` reads (tied weights, recurrent networks)."""
    readers = collections.Counter(v for f in graph_functions(loss) for v in set(f.inputs))
    return [name for name, v in params.items() if readers[v] > 1]


def data_inputs(loss, params: Mapping) -> List:
    """The batch the graph of ``loss`` reads: the leaf Variables without ``need_grad`` that
    some function reads, except parameters: those in ``params`` (name -> Variable) and
    every one registered with nnabla, such as BatchNormalization's running statistics
    (state, not data: :func:`registered_state`)."""
    skip = set(params.values()) | set(_registered().values())
    return [v for v in graph_inputs(loss)
            if v.parent is None and not v.need_grad and v not in skip]


def registered_state(loss, params: Mapping) -> Dict[str, Any]:
    """The model's state the graph of ``loss`` reads, by name: the parameters registered
    with nnabla that need no gradient and are not in ``params`` (name -> Variable), such
    as BatchNormalization's running statistics, which its forward pass updates in place
    in training mode (a batch holding NaN leaves them NaN)."""
    read = graph_inputs(loss)
    trained = set(params.values())
    return {name: v for name, v in _registered().items()
            if v in read and not v.need_grad and v not in trained}


def _registered() -> Dict[str, Any]:
    """Every parameter registered with nnabla, by its full name."""
    with nn.parameter_scope("", registry.root_scope):
        return nn.get_parameters(grad_only=False)


def loss_dtype(loss) -> str:
    """The dtype the backward pass of ``loss`` is seeded in: ``"float16"`` where the loss
    is computed in half (:func:`type_config_of`), ``"bfloat16"`` in bfloat16, else
    ``"float32"``."""
    return _DTYPES.get(type_config_of(loss), "float32")


def float_context(loss):
    """The float32 context of our own reductions over the gradients of ``loss``: the
    loss's own context (same device, same array class) with every backend's type
    configuration made ``float`` (``cudnn:half, cudnn:float, cuda:half, ...`` becomes
    ``cudnn:float, cuda:float, ...``); the CPU's for a leaf."""
    if loss.parent is None:
        return get_extension_context("cpu", type_config="float")
    ctx = loss.parent.context
    backends = [f"{b.split(':', 1)[0]}:float" for b in ctx.backend]
    return nn.Context(list(dict.fromkeys(backends)), ctx.array_class, ctx.device_id)


def float_type_of(loss):
    """The :class:`~nnabla_mpt.core.dtypes.FloatType` of the loss's dtype: the type
    ``loss.backward(scale)`` seeds the pass in, which bounds the scale."""
    return float_type(loss_dtype(loss))

