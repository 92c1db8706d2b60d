"""The step's loss: each micro-batch's loss kept in an array of its own, read when asked.

nnabla writes a loss into the same array at every forward pass: after a step ``loss.d``
holds only the last micro-batch's loss, and a value kept for later is overwritten by the
next step. So before each forward pass of a step the updater gives the loss a new array
(:meth:`StepLosses.begin`, about 1 µs), and the step's result keeps the arrays. Reading a
loss to the host costs 15-20 µs inside a training step on the CPU (and a synchronisation
on a GPU), so the arrays are read only where a value is needed: when
``StepResult.loss`` is asked for, on a skipped step (was a loss non-finite?), for the
ranks' mean (it travels with the gradients' all-reduce) and for the precision schedule's
loss trigger.

The step's last array stays the loss Variable's array until the next ``update()``: a
forward pass of that Variable run outside ``update()`` in between writes into it. A
skipped step reads its losses at once (the updater's diagnosis runs forward passes).
"""
import ctypes
import math
from typing import List, Optional

import numpy as np

import nnabla as nn
from nnabla.ext_utils import get_extension_context

_HOST = get_extension_context("cpu", type_config="float")


def scalar_value(array: "nn.NdArray") -> float:
    """The first value of ``array`` as a float, read through its host pointer in float32:
    about 5 µs where ``float(variable.d)`` costs about 100 µs in nnabla 1.39."""
    return ctypes.c_float.from_address(array.data_ptr(np.float32, _HOST, False)).value


class StepLosses:
    """The losses of one step's micro-batches, each in an array of its own.

    Attributes:
        arrays: The loss arrays, one per micro-batch, in order.
    """
    __slots__ = ("arrays", "_total", "_mean")

    def __init__(self) -> None:
        self.arrays: List["nn.NdArray"] = []
        self._total: Optional[float] = None
        self._mean: Optional[float] = None

    def begin(self, loss: "nn.Variable") -> None:
        """Gives ``loss`` a new array for the next forward pass to write into."""
        fresh = nn.NdArray(loss.shape)
        loss.data = fresh
        self.arrays.append(fresh)

    def total(self) -> float:
        """The sum of the micro-batches' losses (non-finite when one of them is); read once."""
        if self._total is None:
            self._total = math.fsum(scalar_value(a) for a in self.arrays)
        return self._total

    def set_mean(self, mean: float) -> None:
        """Sets the step's loss where it is known otherwise (the mean over the ranks)."""
        self._mean = mean

    def mean(self) -> float:
        """The step's loss: the mean over its micro-batches (or as :meth:`set_mean` set)."""
        if self._mean is None:
            self._mean = self.total() / len(self.arrays)
        return self._mean
