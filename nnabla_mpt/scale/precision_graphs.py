"""The graphs of a precision schedule, checked against the updater's loss and parameters:
the reduced-precision loss in half, the full-precision one in float, sharing the
parameters (:class:`~nnabla_mpt.scale.precision.PrecisionSchedule` decides when to switch)."""
from typing import Any, Mapping, Optional, Sequence, Tuple

import nnabla as nn
from nnabla.logger import logger

from ..core import graph
from ..core.loss_and_solver import computed_loss
from .precision import PrecisionSchedule


def updater_schedule(given: Optional[PrecisionSchedule], loss: "nn.Variable",
                     params: Mapping[str, "nn.Variable"],
                     outputs: Sequence["nn.Variable"]) -> Optional[PrecisionSchedule]:
    """``given``, the schedule the updater runs (None without one), checked against
    ``loss``, the solver's ``params`` and the ``outputs`` option."""
    if given is None:
        return None
    mode = given.mode.text
    if outputs:
        raise ValueError(f"outputs (a list of {len(outputs)} Variables) cannot be combined "
                         f"with the precision schedule {mode!r}: they belong to one graph, "
                         f"and the schedule switches to high_precision_loss's")
    if given.mode.type == "fast1" and not graph.has_bfloat16(loss):
        raise ValueError(f"the precision schedule {mode!r} asks for bfloat16 ('fast1'), but "
                         f"the backend {graph.extension_of(loss)!r} of this nnabla has no "
                         f"bfloat16 type; use 'fast' (float16) instead")
    if graph.gradient_precision(loss, params) != "half":
        raise ValueError(f"the precision schedule {mode!r} needs loss built under a half "
                         f"context (get_extension_context(..., type_config='half')); the "
                         f"given loss computes its gradients in float")
    given.high_precision_loss = _high_precision_loss(given.high_precision_loss, mode, params)
    return given


def graph_at(schedule: Optional[PrecisionSchedule], index: int, loss: "nn.Variable",
             precision: str) -> Tuple["nn.Variable", str]:
    """``(loss, precision)`` of step ``index``: the reduced-precision ``loss`` (its
    gradients in ``precision``), or after the ``schedule``'s switch its full-precision
    loss (run at scale 1, checked for overflow); the switch says so once, in the log."""
    if schedule is None or schedule.reduced(index):
        return loss, precision
    if index == schedule.switch_step:
        logger.info(f"nnabla_mpt: precision schedule {schedule.mode.text!r}: "
                    f"{schedule.describe_switch()}")
    return schedule.high_precision_loss, "float"


def _high_precision_loss(high: Any, mode: str,
                         params: Mapping[str, "nn.Variable"]) -> "nn.Variable":
    """The schedule's full-precision loss, checked: a float graph using every parameter."""
    if high is None:
        raise ValueError(f"the precision schedule {mode!r} needs high_precision_loss: the "
                         f"same network's loss built under the full-precision context "
                         f"(PrecisionSchedule({mode!r}, ..., high_precision_loss=...))")
    high = computed_loss(high, "high_precision_loss")
    if graph.gradient_precision(high, params) != "float":
        raise ValueError("high_precision_loss must be built under a float context "
                         "(type_config='float'); the given one computes in half")
    used = graph.graph_inputs(high)
    missing = sorted(name for name, v in params.items() if v not in used)
    if missing:
        raise ValueError(f"high_precision_loss does not use the solver's parameters "
                         f"{missing}: build it in the same parameter scope as loss so that "
                         f"both graphs share them")
    return high
