"""Reductions over the gradient arrays of parameters in one prebuilt nnabla graph.

Reading a gradient into NumPy costs tens of microseconds per array in nnabla, whatever its
size, and a Python loop over the parameters pays it for each of them. A graph built once,
one reduction per array combined into one element, runs in C++ (or on the device the
gradients live on) and leaves one number: one read of one element a step (of two for the
norm's graph, :class:`_ScaledSquaresGraph`, still one read).
"""
import math
from typing import List, Optional, Sequence

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.solvers as S


def variable_over(array):
    """A Variable whose data is ``array`` (no copy)."""
    v = nn.Variable(array.shape, need_grad=False)
    v.data = array
    return v


def solver_of(params, context):
    """A solver in ``context`` holding ``params`` (name -> Variable) only, for its
    element-wise inf/NaN test of their gradients; None if empty."""
    if not params:
        return None
    with nn.context_scope(context):
        solver = S.Sgd(0.0)
    solver.set_parameters(params)
    return solver


class _GradientGraph:
    """A float32 graph reducing the gradients of ``variables`` to one element (two for
    the norm's).

    The graph runs in ``context``, a float32 context (that of the loss's device); float16
    gradients are read as float32 (exactly). It reads the gradient arrays the parameters
    held when it was built; it is rebuilt when a parameter's gradient array has been
    replaced since. Subclasses give the reduction of one array (:meth:`_reduce`) and how
    the reductions combine (:meth:`_combine`, a sum by default), or the whole graph
    (:meth:`_build`).
    """

    #: Whether a forward pass frees its intermediate arrays (for graphs whose
    #: intermediates are as large as the gradients).
    _clear_buffer = False

    def __init__(self, variables: Sequence, context) -> None:
        self._variables = list(variables)
        self._context = context
        self._arrays: List = []
        self._build()

    def _reduce(self, array):
        """The graph reducing one gradient array (an ``nnabla.NdArray``)."""
        raise NotImplementedError

    def _combine(self, parts: List):
        """The one-element graph combining the reductions ``parts``: their sum."""
        return parts[0] if len(parts) == 1 else F.add_n(*parts)

    def _build(self) -> None:
        self._arrays = [v.grad for v in self._variables]
        with nn.context_scope(self._context), nn.auto_forward(False):
            self._total = self._combine([self._reduce(array) for array in self._arrays])

    def _forward(self) -> None:
        if any(v.grad != array for v, array in zip(self._variables, self._arrays)):
            self._build()
        self._total.forward(clear_buffer=self._clear_buffer)

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
        return F.sum(variable_over(array))

    def _build(self) -> None:
        super()._build()
        probe = nn.Variable(self._total.shape, need_grad=True)
        probe.grad = self._total.data
        self._probe = solver_of({"gradient_sum": probe}, self._context)

    def nonfinite(self) -> bool:
        """Computes the sum now; True when it is inf or NaN."""
        self._forward()
        return bool(self._probe.check_inf_or_nan_grad())


#: The norm's graph packs the gradient arrays, in order, into matrices of about this many
#: elements (one array larger than this is a matrix of its own).
GROUP_SIZE = 1 << 18
#: The columns of those matrices.
_WIDTH = 4


def _groups(arrays: Sequence) -> List[List]:
    """``arrays`` in order, in lists of at most ``GROUP_SIZE`` elements (or of one array)."""
    groups: List[List] = []
    size = 0
    for array in arrays:
        if not groups or size + array.size > GROUP_SIZE:
            groups.append([])
            size = 0
        groups[-1].append(array)
        size += array.size
    return groups


def _matrix(group: Sequence):
    """The elements of the arrays of ``group`` as one ``(1, rows, _WIDTH)`` float32 matrix
    padded with zeros: a view of a lone array whose size ``_WIDTH`` divides, else their
    concatenation."""
    size = sum(array.size for array in group)
    if len(group) == 1 and size % _WIDTH == 0:
        return variable_over(group[0].view((1, size // _WIDTH, _WIDTH)))
    parts = [variable_over(array.view((array.size,))) for array in group]
    pad = -size % _WIDTH
    if pad:
        parts.append(nn.Variable.from_numpy_array(np.zeros(pad, dtype=np.float32)))
    return F.reshape(F.concatenate(*parts, axis=0), (1, (size + pad) // _WIDTH, _WIDTH))


def _largest(x, cpu: bool):
    """The largest ``|x|`` of a ``(1, rows, _WIDTH)`` matrix, as a ``(1, 1)`` array: by
    ``top_k_data`` on the CPU (twice as fast there as ``F.max``), elsewhere by ``F.max``,
    the device's plain reduction."""
    if cpu:
        return F.top_k_data(F.abs(x), 1)
    return F.max(F.reshape(F.abs(x), (1, -1)), axis=1, keepdims=True)


class _ScaledSquaresGraph(_GradientGraph):
    """The sum of the squares of the gradients of ``variables``, scaled by their largest
    magnitude ``m``, as BLAS ``nrm2`` does: finite for all finite gradients.

    On the device, in float32: ``m``, the largest ``|g|`` (at least the smallest normal
    float32, so that zeros divide), ``r = 1 / m`` (at least the smallest normal float32
    too: above ``2**126`` its reciprocal would be subnormal, which a device that flushes
    subnormals to zero would make 0, and the norm NaN), and ``s``, the sum of the squares
    of ``g * r`` (each at most 16). The arrays are packed into matrices ``X`` of 4 columns
    (:func:`_matrix`): ``X diag(r)`` scales them, the trace of the Gram matrix of the
    result is ``s`` (on the CPU nnabla's matrix products run far faster than its
    element-wise products, and on 4 columns faster than on 1). One read of ``[r, s]``;
    the host returns ``s / r**2`` in float64 (``r`` as the device held it, so that its
    rounding cancels). A gradient holding inf or NaN makes ``s`` NaN (``inf * 0``,
    ``NaN * r``). The intermediate arrays are freed after each pass.
    """

    _clear_buffer = True

    def _build(self) -> None:
        self._arrays = [v.grad for v in self._variables]
        with nn.context_scope(self._context), nn.auto_forward(False):
            matrices = [_matrix(group) for group in _groups(self._arrays)]
            cpu = numpy_min_size(self._context) is not None
            peaks = [_largest(x, cpu) for x in matrices]                   # (1, 1) each
            if len(peaks) > 1:
                peaks = [F.max(F.concatenate(*peaks), axis=1, keepdims=True)]
            smallest = float(np.finfo(np.float32).tiny)
            inverse = F.maximum_scalar(F.r_div_scalar(F.maximum_scalar(peaks[0], smallest)),
                                       smallest)                             # r = 1 / m
            eye = nn.Variable.from_numpy_array(np.eye(_WIDTH, dtype=np.float32).reshape(1, -1))
            diagonal = F.reshape(F.affine(inverse, eye), (1, _WIDTH, _WIDTH))
            grams = []
            for x in matrices:
                scaled = F.batch_matmul(x, diagonal)
                grams.append(F.batch_matmul(scaled, scaled, transpose_a=True))
            total = F.sum(F.matrix_diag_part(self._combine(grams)), axis=1, keepdims=True)
            self._total = F.concatenate(inverse, total)

    def read(self) -> float:
        """Computes the sum of squares now, as a float (NaN for a gradient holding inf or
        NaN)."""
        self._forward()
        inverse, total = self._total.d.ravel().tolist()
        return total / (inverse * inverse) if inverse > 0.0 else math.nan


#: On the CPU, gradient arrays at least this large are squared by NumPy (see SquaredNorm).
NUMPY_MIN_SIZE = 1 << 17


def squared_norm_of(g) -> float:
    """The sum of the squares of the NumPy array ``g`` (float16 converted to float32) as a
    float: a float32 dot product, and where that overflows, again scaled by the largest
    ``|g|`` (inf or NaN only for a ``g`` holding inf or NaN)."""
    g = g.ravel().astype(np.float32, copy=False)
    total = np.dot(g, g).item()
    if not math.isfinite(total):
        peak = np.max(np.abs(g)).item()
        if 0.0 < peak < math.inf:
            scaled = g / np.float32(peak)
            total = peak * peak * np.dot(scaled, scaled).item()
    return total


class SquaredNorm:
    """The sum of the squared gradients of ``variables`` (the squared global L2 norm) as a
    Python float, finite for all finite gradients: the float32 sums are scaled by the
    largest magnitude, as BLAS ``nrm2`` does, and only scale and scaled sum are combined,
    in float64. inf or NaN only when a gradient holds inf or NaN.

    The arrays go through one prebuilt graph in the float32 ``context``
    (:class:`_ScaledSquaresGraph`: the largest ``|g|`` over all of them, ``m``, then the
    sum of the squares of ``g / m``; float16 gradients are read as float32), read once. With
    ``numpy_min_size`` (for CPU contexts only), arrays of at least that many elements are
    read into NumPy instead, whose ``dot`` is faster per element once the fixed cost of
    the read is paid; float16 ones are converted to float32 first, and a dot that
    overflows is taken again scaled by the array's largest ``|g|``
    (:func:`squared_norm_of`).
    """

    def __init__(self, variables: Sequence, context,
                 numpy_min_size: Optional[int] = None) -> None:
        small, self._large = split_by_size(variables, numpy_min_size)
        self._graph = _ScaledSquaresGraph(small, context) if small else None

    def value(self) -> float:
        """Computes the sum of squares now and returns it (NaN or inf when a gradient
        holds inf or NaN)."""
        total = 0.0 if self._graph is None else self._graph.read()
        return sum((squared_norm_of(v.g) for v in self._large), total)


class _SaturationGraph(_GradientGraph):
    """1 when every element of the gradients of ``variables`` has ``|g| < threshold``,
    else 0: per array the smallest of ``|g| < threshold`` (0 for a NaN too), then the
    smallest over the arrays."""

    def __init__(self, variables: Sequence, threshold: float, context) -> None:
        self._threshold = threshold
        super().__init__(variables, context)

    def _reduce(self, array):
        return F.min(F.less_scalar(F.abs(variable_over(array)), self._threshold))

    def _combine(self, parts: List):
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


def split_by_size(variables: Sequence, limit: Optional[int]):
    """``(graph's, NumPy's)``: the variables whose gradients a graph reduces, and those
    read into NumPy (at least ``limit`` elements; none for None). Empty arrays are in
    neither: nnabla's reductions cannot take them, and they hold nothing."""
    small = [v for v in variables if v.size and (limit is None or v.size < limit)]
    large = [v for v in variables if v.size and limit is not None and v.size >= limit]
    return small, large


def numpy_min_size(context) -> Optional[int]:
    """The size from which the reductions here read an array into NumPy in ``context``:
    ``NUMPY_MIN_SIZE`` on the CPU, None (never: the device's graph does it) elsewhere."""
    return NUMPY_MIN_SIZE if context.backend[0].startswith("cpu:") else None
