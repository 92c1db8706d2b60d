"""The step's loss: each micro-batch's loss kept in an array of its own, read when asked.

nnabla writes a loss into the same array at every forward pass: after a step ``loss.d``
holds only the last micro-batch's loss, and a value kept for later is overwritten by the
next step. So for each forward pass of a step the loss gets an array of its own
(:meth:`LossRecorder.forward`), and the step's result keeps the arrays. The arrays come
from a ring of two steps' worth, so a step writes into arrays it has written before (the
first forward pass into a new array costs an allocation, about 10 µs a step for a
1e4-parameter model); an array that a result still holds goes with the result, and a new
one takes its place in the ring. Reading a loss to the host costs 15-20 µs inside a
training step on the CPU (and a synchronisation on a GPU), so the arrays are read only
where a value is needed: when ``StepResult.loss`` is asked for, on a skipped step (was a
loss non-finite?), for the ranks' mean (it travels with the gradients' all-reduce) and
for the precision schedule's loss trigger.

A loss computed in place (``F.reshape`` of the loss, by default) shares its input's array
and a new array would never be written: such a loss is read right after each forward
pass instead.

The step's last array stays the loss Variable's array until the next ``update()``: a
forward pass of that Variable run outside ``update()`` in between writes into it. A
skipped step reads its losses at once (the updater's diagnosis runs forward passes).
"""
import itertools
import sys
from typing import List, Union

import nnabla as nn
from nnabla.ext_utils import get_extension_context

from ._hostarray import dtype_of, host_view

_HOST = get_extension_context("cpu", type_config="float")


def scalar_value(array: "nn.NdArray") -> float:
    """The first value of ``array`` as a float, read through a host view in the dtype it
    holds (so that reading leaves it as it is): a few µs where ``float(variable.d)`` costs
    about 100 µs in nnabla 1.39."""
    return float(host_view(array, dtype_of(array), _HOST)[0])


def computed_in_place(loss: "nn.Variable") -> bool:
    """Whether the function computing ``loss`` writes it into its input's array."""
    return loss.parent.inplace_data(0) != 0


class StepLosses:
    """The losses of one step's micro-batches, in order (``values``): the arrays their
    forward passes wrote, or values read at once (a loss computed in place)."""
    __slots__ = ("values", "_total", "_mean")

    def __init__(self) -> None:
        self.values: List[Union["nn.NdArray", float]] = []
        self._total = self._mean = None

    def total(self) -> float:
        """The sum of the micro-batches' losses (non-finite when one of them is); read once."""
        if self._total is None:
            self._total = sum(v if isinstance(v, float) else scalar_value(v)
                              for v in self.values)
        return self._total

    def set_mean(self, mean: float) -> None:
        """Sets the step's loss where it is known otherwise (the mean over the ranks)."""
        self._mean = mean

    def mean(self) -> float:
        """The step's loss: the mean over its micro-batches (or as :meth:`set_mean` set)."""
        if self._mean is None:
            self._mean = self.total() / len(self.values)
        return self._mean

    def __reduce__(self):
        """Copies and pickles (``copy.deepcopy``, ``dataclasses.asdict`` of a result) hold
        the value, not nnabla's arrays."""
        return _known, (self.mean(),)


def _known(mean: float) -> StepLosses:
    losses = StepLosses()
    losses.set_mean(mean)
    return losses


#: ``sys.getrefcount`` of a ring's array that nothing else holds: the ring's list, the
#: name it is read into and the call's own argument.
_FREE = 3


class LossRecorder:
    """Runs the forward passes of one loss Variable, keeping each loss in the step's
    :class:`StepLosses`.

    Args:
        loss: The loss Variable.
        accum_grad: Forward passes a step runs.
    """

    def __init__(self, loss: "nn.Variable", accum_grad: int) -> None:
        self.loss = loss
        self._in_place = computed_in_place(loss)
        # two steps' worth: the last result holds its step's arrays while the next runs;
        # none for a loss computed in place, which is read instead
        slots = 0 if self._in_place else 2 * accum_grad
        self._ring = [nn.NdArray(loss.shape) for _ in range(slots)]
        self._turns = itertools.cycle(range(len(self._ring)))

    def forward(self, losses: StepLosses, clear_no_need_grad: bool) -> None:
        """Runs the loss's forward pass into the ring's next array, which ``losses`` keeps
        (a new one where a result still holds the ring's); a loss computed in place is read
        after the pass instead."""
        loss = self.loss
        if self._in_place:
            loss.forward(clear_no_need_grad=clear_no_need_grad)
            losses.values.append(scalar_value(loss.data))
            return
        turn = next(self._turns)
        array = self._ring[turn]
        if sys.getrefcount(array) > _FREE:       # held by a result: it stays with it
            array = self._ring[turn] = nn.NdArray(loss.shape)
        loss.data = array
        losses.values.append(array)
        loss.forward(clear_no_need_grad=clear_no_need_grad)
