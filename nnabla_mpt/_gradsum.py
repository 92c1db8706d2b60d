"""Reductions over the gradient arrays of parameters in one prebuilt nnabla graph.

Reading a gradient into NumPy costs tens of microseconds per array in nnabla, whatever its
size, and a Python loop over the parameters pays it for each of them. A graph built once,
one reduction per array added up by ``F.add_n``, runs in C++ and leaves one number.
"""
from typing import List, Sequence

import numpy as np


def _variable(array):
    """A Variable whose data is ``array`` (no copy)."""
    import nnabla as nn
    v = nn.Variable(array.shape, need_grad=False)
    v.data = array
    return v


class _GradientGraph:
    """A one-element float32 CPU graph reducing the gradients of ``variables``.

    The graph reads the gradient arrays the parameters held when it was built; it is
    rebuilt when a parameter's gradient array has been replaced since. Float16 gradients
    are read as float32 (exactly).
    """

    def __init__(self, variables: Sequence) -> None:
        if not variables:
            raise ValueError("variables must hold at least one parameter, got none")
        self._variables = list(variables)
        self._arrays: List = []
        self._build()

    @staticmethod
    def _reduce(array):
        """The graph reducing one gradient array (an ``nnabla.NdArray``)."""
        raise NotImplementedError

    def _build(self) -> None:
        import nnabla as nn
        import nnabla.functions as F
        from nnabla.ext_utils import get_extension_context

        self._arrays = [v.grad for v in self._variables]
        with nn.context_scope(get_extension_context("cpu", type_config="float")), \
                nn.auto_forward(False):
            parts = [self._reduce(array) for array in self._arrays]
            self._total = parts[0] if len(parts) == 1 else F.add_n(*parts)

    def _forward(self) -> None:
        for v, array in zip(self._variables, self._arrays):
            if v.grad != array:
                self._build()
                break
        self._total.forward()


class GradientSum(_GradientGraph):
    """The float32 sum of all the elements of the gradients of ``variables``.

    :meth:`nonfinite` tests the sum with a one-parameter solver whose gradient is the sum:
    no NumPy read at all.
    """

    @staticmethod
    def _reduce(array):
        import nnabla.functions as F
        return F.sum(_variable(array))

    def _build(self) -> None:
        import nnabla as nn
        import nnabla.solvers as S

        super()._build()
        probe = nn.Variable(self._total.shape, need_grad=True)
        probe.grad = self._total.data
        self._probe = S.Sgd(0.0)
        self._probe.set_parameters({"gradient_sum": probe})

    def nonfinite(self) -> bool:
        """Computes the sum now; True when it is inf or NaN."""
        self._forward()
        return bool(self._probe.check_inf_or_nan_grad())


class _SquaresGraph(_GradientGraph):
    @staticmethod
    def _reduce(array):
        import nnabla.functions as F
        # g . g as a (1, n) x (n, 1) product: a BLAS dot, on views of the same memory.
        return F.affine(_variable(array.view((1, array.size))),
                        _variable(array.view((array.size, 1))))


class SquaredNorm:
    """The sum of the squared gradients of ``variables`` (the squared global L2 norm).

    Arrays below ``numpy_min_size`` elements go through one prebuilt graph (a dot product
    per array); larger ones are read into NumPy, whose ``dot`` is faster per element once
    the fixed cost of the read is paid.
    """

    def __init__(self, variables: Sequence, numpy_min_size: int = 1 << 17) -> None:
        small = [v for v in variables if v.size < numpy_min_size]
        self._large = [v for v in variables if v.size >= numpy_min_size]
        self._graph = _SquaresGraph(small) if small else None

    def value(self) -> float:
        """Computes the sum of squares now and returns it."""
        total = 0.0
        if self._graph is not None:
            self._graph._forward()
            total += self._graph._total.d.item()
        for v in self._large:
            g = v.g.ravel()
            total += float(np.dot(g, g))
        return total


class NumpySquaredNorm:
    """The same sum of squares read through NumPy, in float64 (for non-CPU backends, where
    the prebuilt CPU graph cannot read the gradients)."""

    def __init__(self, variables: Sequence) -> None:
        self._variables = list(variables)

    def value(self) -> float:
        total = 0.0
        for v in self._variables:
            g = v.g.ravel().astype(np.float64)
            total += float(np.dot(g, g))
        return total
