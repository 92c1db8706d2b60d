"""The seed of a backward pass: the loss scale as an array, kept while the scale stays.

Given a number, ``loss.backward(scale)`` makes nnabla tell it from an array with a NumPy
call, build a new array, fill it with the scale and drop it after the pass, at every
backward pass: 1.1-1.8% of an updater's step at 1e4 parameters on the CPU, about 10 µs
(``benchmarks/backward_seed.py``). Given an ``NdArray``, nnabla seeds the pass with that
array itself, leaves it as it is and puts the loss's own gradient array back afterwards.
So one array filled once per scale serves every pass at that scale, with the same values:
nnabla fills the array it would make the same way, and casts it to the loss's dtype alike.
"""
import nnabla as nn


class BackwardSeed:
    """The seed of the backward passes of one loss Variable.

    Args:
        loss: The loss Variable.
    """
    __slots__ = ("_shape", "_scale", "_array")

    def __init__(self, loss: "nn.Variable") -> None:
        self._shape = loss.shape
        self._scale = None
        self._array = None

    def at(self, scale: float) -> "nn.NdArray":
        """An array of the loss's shape filled with ``scale``: the same array as long as the
        scale is the same."""
        if scale != self._scale:
            array = nn.NdArray(self._shape)
            array.fill(scale)
            self._array, self._scale = array, scale
        return self._array
