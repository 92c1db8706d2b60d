"""The overflow detector shared by every updater, and the check of a step's batch."""
from typing import Callable, Dict, List, Literal, Optional, Sequence, Tuple, get_args

import numpy as np

from ..core import _validate as check
from ..core import graph
from ..core._gradsum import GradientSum, SaturationCheck, numpy_min_size, solver_of
from ..core.dtypes import FP16_MAX

OverflowMode = Literal["inf_nan", "saturation"]


class OverflowDetector:
    """Decides whether the gradients of a step overflowed.

    Modes:

    * ``"inf_nan"`` (default): a gradient holding inf or NaN is an overflow. The check is the
      solver's own single pass over its gradients (``solver.check_inf_or_nan_grad()``). On
      a float32 CPU graph the updaters make the same decision faster: gradient arrays of
      at least ``SUM_CHECK_MIN_SIZE`` elements are checked through their sum, which is
      finite when they hold no inf or NaN; a non-finite sum is confirmed element-wise, so
      finite gradients whose float32 sum overflows (beyond 3.4e38) are no overflow.
    * ``"saturation"``: additionally, a gradient value with ``|g| >= threshold`` (by default
      65504, the largest float16) is an overflow. This is for hardware whose float16
      arithmetic saturates at the maximum instead of producing inf. :meth:`check` reads
      the gradients into NumPy; the updaters make the same decision with one prebuilt
      graph in the float32 context of the loss's device, read once a step (see
      :func:`overflow_check`).

    Args:
        mode: ``"inf_nan"`` or ``"saturation"``.
        threshold: The saturation threshold; ``> 0``. Used in saturation mode only.

    Example:
        >>> from nnabla_mpt import OverflowDetector
        >>> OverflowDetector("saturation").threshold
        65504.0
    """

    def __init__(self, mode: OverflowMode = "inf_nan", threshold: float = FP16_MAX) -> None:
        self.mode = check.choice("overflow_mode", mode, get_args(OverflowMode))
        self.threshold = check.real("threshold", threshold, gt=0.0)

    def _bad(self, g: np.ndarray) -> bool:
        if self.mode == "inf_nan":
            return not np.isfinite(g).all()
        with np.errstate(invalid="ignore"):
            return not (np.abs(g) < self.threshold).all()

    def check(self, solver, grads: Optional[Sequence] = None) -> bool:
        """Returns True when the step overflowed.

        Args:
            solver: The solver whose parameter gradients are checked.
            grads: Optional list of ``nnabla.NdArray`` to check instead of the solver's
                gradients (for example reduced gradients of a communicator).
        """
        if grads is None:
            if self.mode == "inf_nan":
                return bool(solver.check_inf_or_nan_grad())
            grads = [v.grad for v in solver.get_parameters().values()]
        return any(self._bad(g.data) for g in grads)

    def nonfinite_params(self, params: Dict[str, object]) -> List[str]:
        """Names of the parameters whose gradients count as overflow under this mode.

        Args:
            params: Mapping name -> ``nnabla.Variable``, e.g. ``solver.get_parameters()``.
        """
        return [name for name, v in params.items() if self._bad(v.g)]

    def __repr__(self) -> str:
        return f"OverflowDetector(mode={self.mode!r}, threshold={self.threshold:g})"


def overflow_check(detector: OverflowDetector, solver, params: Dict[str, object],
                   float32_cpu: bool, context) -> Callable[[], bool]:
    """The overflow check of the solver's gradients an updater calls every step.

    The detector's decision. In inf/NaN mode that is the solver's own test, called
    directly; for gradients stored as float32 on the CPU (``float32_cpu``, which the
    updater knows from the graph) with large arrays, the same decision is made with a sum
    over those arrays, several times faster than the solver's element-wise test (see
    :class:`SummedInfNanCheck`); off the CPU, with a sum over every array in ``context``,
    one host synchronisation a step where nnabla-ext-cuda's solvers take one per
    parameter. In saturation mode, one prebuilt graph in ``context``,
    the float32 context of the device the gradients live on, tests ``|g| < threshold``
    for every element and is read once; on the CPU, arrays of at least
    ``_gradsum.NUMPY_MIN_SIZE`` elements are tested by NumPy (see
    :class:`~nnabla_mpt.core._gradsum.SaturationCheck`).
    """
    if detector.mode != "inf_nan":
        return SaturationCheck(list(params.values()), detector.threshold, context,
                               numpy_min_size(context))
    if float32_cpu and any(v.size >= SUM_CHECK_MIN_SIZE for v in params.values()):
        return SummedInfNanCheck(params, context)
    if numpy_min_size(context) is None:
        # off the CPU the solver's test reads back one result per parameter
        return SummedInfNanCheck(params, context, min_size=0)
    return solver.check_inf_or_nan_grad


def overflow_checks(mode: str, solver, params: Dict[str, object], float32_cpu: bool,
                    context, ranks: bool) -> Tuple[Optional[Callable[[], bool]], ...]:
    """``(check, inf_nan_check)`` of an updater that checks its steps
    (:func:`overflow_check`): the check of the detector's ``mode`` and, with a
    communicator (``ranks``), the inf/NaN one for the reduced gradients where a reduction
    cannot saturate (the same object in that mode; None for one process, which checks its
    own gradients only)."""
    check = overflow_check(OverflowDetector(mode), solver, params, float32_cpu, context)
    if mode == "inf_nan":
        return check, check
    if not ranks:
        return check, None
    return check, overflow_check(OverflowDetector("inf_nan"), solver, params, float32_cpu,
                                 context)


#: Gradient arrays at least this large are checked through a sum (see SummedInfNanCheck).
SUM_CHECK_MIN_SIZE = 1 << 14


class SummedInfNanCheck:
    """The inf/NaN check through a sum: several times faster for large float32 arrays on
    the CPU, and one host synchronisation for all arrays off it.

    ``solver.check_inf_or_nan_grad()`` tests every element (about 1 ns per element on CPU);
    nnabla's ``F.sum`` reads an array about seven times faster but costs a few microseconds
    per array. So arrays of at least ``min_size`` elements are summed in one prebuilt graph
    (summing the sums) and the one-element total is tested; smaller arrays are tested
    element-wise by a solver that holds only them. A sum is non-finite when an element is
    inf or NaN (``inf + -inf`` is NaN), and otherwise only when the float32 sum itself
    overflows, which needs gradients summing beyond 3.4e38. So a non-finite sum is
    confirmed by the element-wise test of the large arrays (a solver holding only them),
    on that rare path only: the decision is the solver's own, and a finite gradient is
    never an overflow.

    On the CPU it pays for float32 gradients only (float16 ones would be converted for the
    sum), with large arrays; off the CPU it serves every array (``min_size=0``): the
    solver's test there reads one result per parameter back to the host, the sum one for
    all of them (float16 gradients are read as float32, exactly). The updater decides
    (:func:`overflow_check`). The graph reads the gradient arrays the parameters held when
    it was built; it is rebuilt when a parameter's gradient array has been replaced since.

    Args:
        params: Mapping name -> ``nnabla.Variable``: the parameters whose gradients to check.
        context: The float32 context of the gradients' device, where the sum runs and
            the solvers are made.
        min_size: Arrays with at least this many elements are checked through the sum.
    """

    def __init__(self, params: Dict[str, object], context,
                 min_size: int = SUM_CHECK_MIN_SIZE) -> None:
        params = {name: v for name, v in params.items() if v.size}    # nothing to check
        large = {name: v for name, v in params.items() if v.size >= min_size}
        self._small_solver = solver_of({name: v for name, v in params.items()
                                        if name not in large}, context)
        self._large_solver = solver_of(large, context)     # confirms a non-finite sum
        self._sum = GradientSum(list(large.values()), context) if large else None

    def __call__(self) -> bool:
        """True when a gradient holds inf or NaN."""
        if self._small_solver is not None and self._small_solver.check_inf_or_nan_grad():
            return True
        # a non-finite sum: inf/NaN, or finite gradients summing beyond 3.4e38; the
        # element-wise test tells them apart
        return (self._sum is not None and self._sum.nonfinite()
                and bool(self._large_solver.check_inf_or_nan_grad()))


class BatchCheck:
    """Whether the batch a step read holds inf/NaN: a *bad batch*, which no loss scale
    causes or cures (through a ReLU a NaN input can even leave the loss finite while the
    gradients are NaN).

    The inputs of each graph (:func:`nnabla_mpt.core.graph.data_inputs`) are listed once, here;
    they are read only on skipped steps. With ``accum_grad > 1`` they hold the last
    micro-batch only: a bad batch in an earlier one is taken for an overflow.

    Args:
        losses: The losses whose graphs the steps run (``None`` entries are left out).
        params: The solver's parameters (name -> Variable).
    """

    def __init__(self, losses: Sequence, params: Dict[str, object]) -> None:
        self._inputs = [(loss, graph.data_inputs(loss, params)) for loss in losses]
        self._state = [(loss, graph.registered_state(loss, params)) for loss in losses]

    def nonfinite(self, loss) -> List[str]:
        """The inputs of the graph of ``loss`` (one of ``losses``) that hold inf/NaN, named
        (``"input #0 of shape (4, 3)"``, or the Variable's name)."""
        inputs = next(found for graph_loss, found in self._inputs if graph_loss is loss)
        return [f"input {v.name!r}" if v.name else f"input #{i} of shape {tuple(v.shape)}"
                for i, v in enumerate(inputs) if not np.isfinite(v.d).all()]

    def nonfinite_state(self, loss) -> List[str]:
        """The names of the model's state in the graph of ``loss`` (running statistics,
        :func:`nnabla_mpt.core.graph.registered_state`) that hold inf/NaN: a bad batch's forward
        pass may have written them."""
        state = next(found for graph_loss, found in self._state if graph_loss is loss)
        return [name for name, v in state.items() if not np.isfinite(v.d).all()]
