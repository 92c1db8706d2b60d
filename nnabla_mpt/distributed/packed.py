"""The step's all-reduce as one array of our own, for communicators that handle each
array they are given on its own.

nnabla's NCCL communicator, given a list of arrays in place, runs for each array one
blocking MPI all-reduce (was it written?) and one NCCL all-reduce: ``2 (P + 1)``
collectives a step for ``P`` gradients and the flags (out of place, still one MPI check
per array). :class:`PackedArrays` lays the gradients and the step's flags end to end in
one float32 buffer with nnabla functions on the loss's device (one concatenation;
float16 gradients are exact in it, and so are the float32 ones of a precision schedule's
full-precision phase), so the communicator gets one array: one MPI check and one NCCL
call a step. The communicator reduces it in its own dtype, as it would each gradient
(one made from a half context casts it to float16). After the reduction each gradient is
copied back from its part of the buffer into its own array (a slice each, in float32, so
that what a float32 reduction holds stays float32), and the flags are read back, one
small host read.

:class:`~nnabla_mpt.MPICommunicator` fuses the arrays of a call itself (and on float
graphs sums the gradients where they lie), so it is handed the list.
"""
from typing import Sequence

import numpy as np

import nnabla as nn

from ..core._gradsum import variable_over


class PackedArrays:
    """``arrays`` and the step's flags reduced as one buffer.

    Args:
        arrays: The arrays to reduce (the gradients), which keep their places.
        flags_length: Elements of the flags (``exchange.StepFlags``).
        ctx: The float32 context of the loss's device
            (:func:`nnabla_mpt.core.graph.float_context`), where the buffer is made and the
            parts are copied back.
    """

    def __init__(self, arrays: Sequence["nn.NdArray"], flags_length: int, ctx) -> None:
        import nnabla.functions as F

        arrays = [a for a in arrays if a.size]
        self._flags = nn.Variable((flags_length,), need_grad=False)
        with nn.context_scope(ctx), nn.auto_forward(False):
            self._buffer = F.concatenate(
                *[F.reshape(variable_over(a), (a.size,)) for a in arrays], self._flags, axis=0)
            # the graph that copies each part of the buffer back into its array (forward
            # _unpack), and the flags it also slices out
            source = variable_over(self._buffer.data)
            parts, start = [], 0
            for a in arrays:
                part = F.reshape(F.slice(source, (start,), (start + a.size,)), a.shape,
                                 inplace=False)
                part.data = a        # the copy lands in the array itself
                parts.append(part)
                start += a.size
            self._flags_out = F.slice(source, (start,), (start + flags_length,))
            self._unpack = F.sink(*parts, self._flags_out)

    def reduce(self, comm, flags: np.ndarray, division: bool) -> np.ndarray:
        """Packs the arrays and ``flags``, all-reduces the buffer (one call of ``comm``),
        copies the arrays back and returns the reduced flags."""
        self._flags.d = flags
        self._buffer.forward()
        comm.all_reduce([self._buffer.data], division=division, inplace=True)
        self._unpack.forward()
        return self._flags_out.d
