"""The solver and the loss an updater trains, checked: an nnabla solver holding parameters,
a scalar loss that a function computes from some of them."""
from typing import Any, Dict, Mapping

import nnabla as nn

from . import graph


def solver_parameters(solver: Any) -> Dict[str, "nn.Variable"]:
    """The parameters of ``solver``, checked to be an nnabla solver that has some."""
    for attr in ("zero_grad", "update", "scale_grad", "check_inf_or_nan_grad",
                 "get_parameters", "weight_decay", "get_states", "set_states"):
        if not callable(getattr(solver, attr, None)):
            raise TypeError(f"solver must be an nnabla solver (missing method {attr!r}), "
                            f"got {type(solver).__name__}")
    params = solver.get_parameters()
    if len(params) == 0:
        raise ValueError("solver has no parameters: call solver.set_parameters(...) "
                         "before creating the updater")
    return params


def computed_loss(loss: Any, name: str = "loss") -> "nn.Variable":
    """``loss``, checked to be a one-element Variable that a function computes, other than
    ``F.sink``."""
    if not isinstance(loss, nn.Variable):
        raise TypeError(f"{name} must be an nnabla.Variable, got {type(loss).__name__}")
    if loss.size != 1:
        raise ValueError(f"{name} must be a scalar Variable (one element), got shape "
                         f"{tuple(loss.shape)}")
    if loss.parent is None:
        raise ValueError(f"{name} is a leaf Variable (no function computes it, shape "
                         f"{tuple(loss.shape)}): the updater runs {name}.forward() and "
                         f"{name}.backward(), which need the graph; pass the Variable the "
                         f"network's loss function returns (e.g. F.mean(...)), not one "
                         f"holding its value")
    if loss.parent.info.type_name == "Sink":
        makers = ", ".join("a leaf" if v.parent is None else v.parent.info.type_name
                           for v in loss.parent.inputs)
        raise ValueError(f"{name} is the output of F.sink ({len(loss.parent.inputs)} inputs, "
                         f"made by {makers}): Sink's backward sets its inputs' gradients to "
                         f"1 whatever the loss scale, so the scale would be lost while the "
                         f"updater still divides the gradients by it; pass the loss "
                         f"variable itself (e.g. loss, not F.sink(loss, error)) and the other "
                         f"inputs of the sink as outputs=[error]: the step's forward pass "
                         f"computes them with the loss")
    return loss


def trained_loss(loss: Any, params: Mapping[str, "nn.Variable"]) -> "nn.Variable":
    """``loss``, checked as by :func:`computed_loss` and to depend on some of the solver's
    parameters ``params`` (not necessarily all)."""
    loss = computed_loss(loss)
    used = graph.graph_inputs(loss)
    if not any(v in used for v in params.values()):
        names = list(params)
        shown = ", ".join(repr(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
        raise ValueError(f"loss does not depend on any of the solver's {len(names)} "
                         f"parameters ({shown}): no step would change them; build the loss "
                         f"from them, or set the solver's parameters from the same parameter "
                         f"scope the loss was built in (solver.set_parameters("
                         f"nn.get_parameters()) inside that nn.parameter_scope)")
    return loss
