"""What the updaters read off a loss graph: its backend, its precision, its inputs."""
from typing import Dict, List, Mapping


def backend_of(loss) -> List[str]:
    """The backends (``"cpu:half"``, ...) of the function producing ``loss``; empty when
    ``loss`` is a leaf."""
    parent = loss.parent
    return [] if parent is None else list(parent.context.backend)


def precision_of(loss) -> str:
    """``"half"`` when the function producing ``loss`` runs on a half backend, else
    ``"float"``."""
    backend = backend_of(loss)
    return "half" if backend and backend[0].endswith(":half") else "float"


def extension_of(loss) -> str:
    """The extension (``"cpu"``, ``"cudnn"``, ...) ``loss`` is computed with."""
    backend = backend_of(loss)
    return backend[0].split(":")[0] if backend else "cpu"


def has_bfloat16(loss) -> bool:
    """Whether the extension ``loss`` is computed with offers a bfloat16 type."""
    from nnabla.ext_utils import get_extension_context
    try:
        get_extension_context(extension_of(loss), type_config="bfloat16")
    except (ValueError, ImportError):
        return False
    return True


def graph_inputs(loss) -> Dict:
    """Every Variable some function of the graph of ``loss`` reads (parameters included), in
    the order the graph visits them: the keys of the dict returned (an ordered set)."""
    seen = {}

    def collect(f):
        seen.update(dict.fromkeys(f.inputs))  # Variables hash and compare by the variable

    loss.visit(collect)
    return seen


def shared_parameters(loss, params: Mapping) -> List[str]:
    """The names of the parameters in ``params`` (name -> Variable) that more than one
    function of the graph of ``loss`` reads (tied weights, recurrent networks)."""
    readers = {}

    def count(f):
        for v in set(f.inputs):
            readers[v] = readers.get(v, 0) + 1

    loss.visit(count)
    return [name for name, v in params.items() if readers.get(v, 0) > 1]


def data_inputs(loss, params: Mapping) -> List:
    """The batch the graph of ``loss`` reads: the leaf Variables without ``need_grad`` that
    some function reads, except parameters: those in ``params`` (name -> Variable) and
    every one registered with nnabla, such as BatchNormalization's running statistics
    (state, not data: a NaN batch leaves them NaN)."""
    import nnabla as nn
    import nnabla.parameter as registry

    with nn.parameter_scope("", registry.root_scope):
        registered = nn.get_parameters(grad_only=False)
    skip = set(params.values()) | set(registered.values())
    return [v for v in graph_inputs(loss)
            if v.parent is None and not v.need_grad and v not in skip]


def loss_dtype(loss) -> str:
    """The dtype the backward pass of ``loss`` is seeded in: ``"float16"`` on a half
    backend, ``"bfloat16"`` on a bfloat16 one, else ``"float32"``."""
    backend = backend_of(loss)
    suffix = backend[0].rsplit(":", 1)[-1] if backend else "float"
    return {"half": "float16", "bfloat16": "bfloat16"}.get(suffix, "float32")


def float_context(loss):
    """The float32 context of the extension ``loss`` is computed with (for reductions
    over its gradients)."""
    from nnabla.ext_utils import get_extension_context
    return get_extension_context(extension_of(loss), type_config="float")


def ceiling_of(loss) -> float:
    """The largest loss scale ``loss.backward(scale)`` can seed: the largest power of two
    of the loss's dtype (``2**15`` for float16)."""
    from .dtypes import float_type
    return float_type(loss_dtype(loss)).max_power_of_two
