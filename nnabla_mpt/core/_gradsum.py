"""Reductions over the gradient arrays of parameters in one prebuilt nnabla graph.

Reading a gradient into NumPy costs tens of microseconds per array in nnabla, whatever its
size, and a Python loop over the parameters pays it for each of them. A graph built once,
one reduction per array combined into one element, runs in C++ (or on the device the
gradients live on) and leaves one number: one read of one element a step.
"""
from typing import List, Optional, Sequence

import numpy as np


def variable_over(array):
    """A Variable whose data is ``array`` (no copy)."""
    import nnabla as nn
    v = nn.Variable(array.shape, need_grad=False)
    v.data = array
    return v


class _GradientGraph:
    """A one-element float32 graph reducing the gradients of ``variables``.

    The graph runs in ``context``, a float32 context (that of the loss's device); float16
    gradients are read as float32 (exactly). It reads the gradient arrays the parameters
    held when it was built; it is rebuilt when a parameter's gradient array has been
    replaced since. Subclasses give the reduction of one array (:meth:`_reduce`) and how
    the reductions combine (:meth:`_combine`, a sum by default).
    """

    def __init__(self, variables: Sequence, context) -> None:
        if not variables:
            raise ValueError("variables must hold at least one parameter, got none")
        self._variables = list(variables)
        self._context = context
        self._arrays: List = []
        self._build()

    def _reduce(self, array):
        """The graph reducing one gradient array (an ``nnabla.NdArray``)."""
        raise NotImplementedError

    def _combine(self, parts: List):
        """The one-element graph combining the reductions ``parts``: their sum."""
        import nnabla.functions as F
        return parts[0] if len(parts) == 1 else F.add_n(*parts)

    def _build(self) -> None:
        import nnabla as nn

        self._arrays = [v.grad for v in self._variables]
        with nn.context_scope(self._context), nn.auto_forward(False):
            self._total = self._combine([self._reduce(array) for array in self._arrays])

    def _forward(self) -> None:
        for v, array in zip(self._variables, self._arrays):
            if v.grad != array:
                self._build()
                break
        self._total.forward()

    def read(self) -> float:
        """Computes the reduction now and reads its one element."""
        self._forward()
        return self._total.d.item()


class GradientSum(_GradientGraph):
    """The float32 sum of all the elements of the gradients of ``variables``.

    :meth:`nonfinite` tests the sum with a one-parameter solver whose gradient is the sum:
    no NumPy read at all.
    """

    def _reduce(self, array):
        import nnabla.functions as F
        return F.sum(variable_over(array))

    def _build(self) -> None:
        import nnabla as nn
        import nnabla.solvers as S

        super()._build()
        probe = nn.Variable(self._total.shape, need_grad=True)
        probe.grad = self._total.data
        with nn.context_scope(self._context):
            self._probe = S.Sgd(0.0)
        self._probe.set_parameters({"gradient_sum": probe})

    def nonfinite(self) -> bool:
        """Computes the sum now; True when it is inf or NaN."""
        self._forward()
        return bool(self._probe.check_inf_or_nan_grad())


class _SquaresGraph(_GradientGraph):
    """The float32 sum of the squared elements of the gradients of ``variables``."""

    def _reduce(self, array):
        import nnabla.functions as F
        # g . g as a (1, n) x (n, 1) product: a BLAS dot, on views of the same memory.
        return F.affine(variable_over(array.view((1, array.size))),
                        variable_over(array.view((array.size, 1))))


#: On the CPU, gradient arrays at least this large are squared by NumPy (see SquaredNorm).
NUMPY_MIN_SIZE = 1 << 17


class SquaredNorm:
    """The sum of the squared gradients of ``variables`` (the squared global L2 norm),
    summed in float32: finite as long as the norm is below about 1.8e19, so the caller
    squares unscaled gradients.

    The arrays go through one prebuilt graph in the float32 ``context`` (a dot product per
    array; float16 gradients are read as float32), read once. With ``numpy_min_size``
    (for CPU contexts only), arrays of at least that many elements are read into NumPy
    instead, whose ``dot`` is faster per element once the fixed cost of the read is paid;
    float16 ones are converted to float32 first.
    """

    def __init__(self, variables: Sequence, context,
                 numpy_min_size: Optional[int] = None) -> None:
        small, self._large = split_by_size(variables, numpy_min_size)
        self._graph = _SquaresGraph(small, context) if small else None

    def value(self) -> float:
        """Computes the sum of squares now and returns it (inf when it overflows float32,
        NaN when a gradient holds NaN)."""
        total = 0.0 if self._graph is None else self._graph.read()
        for v in self._large:
            g = v.g.ravel().astype(np.float32, copy=False)
            total += np.dot(g, g).item()
        return total


class _SaturationGraph(_GradientGraph):
    """1 when every element of the gradients of ``variables`` has ``|g| < threshold``,
    else 0: per array the smallest of ``|g| < threshold`` (0 for a NaN too), then the
    smallest over the arrays."""

    def __init__(self, variables: Sequence, threshold: float, context) -> None:
        self._threshold = threshold
        super().__init__(variables, context)

    def _reduce(self, array):
        import nnabla.functions as F
        return F.min(F.less_scalar(F.abs(variable_over(array)), self._threshold))

    def _combine(self, parts: List):
        import nnabla.functions as F
        return parts[0] if len(parts) == 1 else F.min(F.stack(*parts))


class SaturationCheck:
    """Whether a gradient of ``variables`` holds a value with ``|g| >= threshold`` or a
    NaN: the saturation check of :class:`~nnabla_mpt.step.detector.OverflowDetector`.

    The arrays go through one prebuilt graph in the float32 ``context``, read once. With
    ``numpy_min_size`` (for CPU contexts only), arrays of at least that many elements are
    tested by NumPy instead, faster per element once the fixed cost of the read is paid.
    """

    def __init__(self, variables: Sequence, threshold: float, context,
                 numpy_min_size: Optional[int] = None) -> None:
        small, self._large = split_by_size(variables, numpy_min_size)
        self._graph = _SaturationGraph(small, threshold, context) if small else None
        self._threshold = threshold

    def __call__(self) -> bool:
        """Computes the check now; True when some gradient saturated."""
        if self._graph is not None and self._graph.read() < 1.0:
            return True
        with np.errstate(invalid="ignore"):
            return any(not (np.abs(v.g) < self._threshold).all() for v in self._large)


def split_by_size(variables: Sequence, numpy_min_size: Optional[int]):
    """``(graph's, NumPy's)``: the variables whose gradients a graph reduces, and those
    read into NumPy (at least ``numpy_min_size`` elements; none for None). Empty arrays
    are in neither: nnabla's reductions cannot take them, and they hold nothing."""
    limit = numpy_min_size
    small = [v for v in variables if v.size and (limit is None or v.size < limit)]
    large = [v for v in variables if v.size and limit is not None and v.size >= limit]
    return small, large


def numpy_min_size(context) -> Optional[int]:
    """The size from which the reductions here read an array into NumPy in ``context``:
    ``NUMPY_MIN_SIZE`` on the CPU, None (never: the device's graph does it) elsewhere."""
    return NUMPY_MIN_SIZE if context.backend[0].startswith("cpu:") else None
