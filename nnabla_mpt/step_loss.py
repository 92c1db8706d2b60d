"""The step's loss: each micro-batch's loss kept in an array of its own, read when asked.

nnabla writes a loss into the same array at every forward pass: after a step ``loss.d``
holds only the last micro-batch's loss, and a value kept for later is overwritten by the
next step. So before each forward pass of a step the updater gives the loss an array of
its own (:meth:`LossRecorder.before_forward`), and the step's result keeps the arrays. A
result that nobody holds any more gives its arrays back for later steps (the first forward
pass into a new array costs an allocation, about 10 µs a step for a 1e4-parameter model).
Reading a loss to the host costs 15-20 µs inside a training step on the CPU (and a
synchronisation on a GPU), so the arrays are read only where a value is needed: when
``StepResult.loss`` is asked for, on a skipped step (was a loss non-finite?), for the
ranks' mean (it travels with the gradients' all-reduce) and for the precision schedule's
loss trigger.

A loss computed in place (``F.reshape`` of the loss, by default) shares its input's array
and a new array would never be written: such a loss is read right after each forward
pass instead.

The step's last array stays the loss Variable's array until the next ``update()``: a
forward pass of that Variable run outside ``update()`` in between writes into it. A
skipped step reads its losses at once (the updater's diagnosis runs forward passes).
"""
from typing import List, Optional, Union

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
    """The losses of one step's micro-batches, in order: arrays of their own, or values
    read at once (a loss computed in place).

    Args:
        spare: Where the arrays go when this object goes away (to be written again by a
            later step), or None.
    """
    __slots__ = ("values", "spare", "_total", "_mean")

    def __init__(self, spare: Optional[List["nn.NdArray"]] = None) -> None:
        self.values: List[Union["nn.NdArray", float]] = []
        self.spare = spare
        self._total: Optional[float] = None
        self._mean: Optional[float] = None

    def __del__(self) -> None:
        if self.spare is not None:
            self.spare.extend(self.values)

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


class LossRecorder:
    """How the losses of one loss Variable are kept, step after step.

    Args:
        loss: The loss Variable.
    """

    def __init__(self, loss: "nn.Variable") -> None:
        self._loss = loss
        self._shape = loss.shape
        self._in_place = computed_in_place(loss)

    def before_forward(self, losses: StepLosses) -> None:
        """Gives the loss an array of its own for the next forward pass to write into: a
        spare one of ``losses`` if it has one of the loss's shape, else a new one."""
        if not self._in_place:
            spare = losses.spare
            if spare and spare[-1].shape == self._shape:
                array = spare.pop()
            else:
                array = nn.NdArray(self._shape)
            self._loss.data = array
            losses.values.append(array)

    def after_forward(self, losses: StepLosses) -> None:
        """Reads a loss computed in place (its array is its input's; ``losses`` then has
        no arrays to give back)."""
        if self._in_place:
            losses.values.append(scalar_value(self._loss.data))
            losses.spare = None
