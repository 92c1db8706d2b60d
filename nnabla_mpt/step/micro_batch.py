"""One micro-batch's pass as the step runs it: the data feeder that loads the batch,
the loss each forward pass leaves, kept in an array of its own and read when asked, and
the seed of the backward passes (:class:`BackwardSeed`).

**The data feeder**, checked when it is given and watched at its first call. nnabla calls
the feeder with no arguments before every forward pass, and ignores what it
returns: the feeder writes the next batch into the graph's input Variables (``x.d = ...``).
A feeder that needs an argument is refused when it is given (else the first update would
raise a ``TypeError`` naming only the callable); one that returns something,
the batch, as a PyTorch loop would, is warned about at its first call: the step would
train on whatever the inputs held before.

The updater calls the wrapper :func:`install_feeder` makes once, which then puts the feeder
itself in its place: the steps after the first call the feeder as they would without the
check.

**The step's loss.** nnabla writes a loss into the same array at every forward pass:
after a step ``loss.d`` holds only the last micro-batch's loss, and a value kept for later
is overwritten by the next step. So for each forward pass of a step the loss gets an array of its own
(:meth:`LossRecorder.forward`), and the step's result keeps the arrays. A step's
:class:`StepLosses` come from a ring of two steps' worth (:meth:`LossRecorder.start`), so
a step writes into arrays it has written before (a forward pass into a new array costs an
allocation at every step); losses that a result still holds go with the result, and new
ones take their place in the ring. Reading a loss is a transfer to the host inside the
training step (and a synchronisation on a GPU), so the arrays are read only where a value
is needed: when ``StepResult.loss`` is asked for, on a skipped step (was a loss
non-finite?), for the ranks' mean (it travels with the gradients' all-reduce) and for the
precision schedule's loss trigger.

A loss computed in place (``F.reshape`` of the loss, by default) shares its input's array
and a new array would never be written: such a loss is read right after each forward
pass instead.

With ``outputs`` (the updaters' option: an error rate, an accuracy) the forward pass runs
from one ``F.sink`` of the loss and the outputs (:func:`forward_root`), so that the outputs
are computed by the same pass, on the same batch, random draws and batch-normalization
statistics as the loss; the backward pass still runs from the loss, seeded with the scale.

The step's last array stays the loss Variable's array until the next ``update()``: a
forward pass of that Variable run outside ``update()`` in between writes into it. A
skipped step reads its losses at once (the updater's diagnosis runs forward passes).

Example:
    >>> from nnabla_mpt.step.micro_batch import checked_feeder
    >>> checked_feeder("data_feeder", lambda batch: None)
    Traceback (most recent call last):
    ...
    TypeError: data_feeder=<function <lambda> at ...> needs an argument ...
"""
import inspect
import math
from sys import getrefcount
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

import nnabla as nn
from nnabla.ext_utils import get_extension_context
from nnabla.logger import logger

from ..core import graph
from ..core._hostarray import dtype_of, host_view
from ..core.dtypes import held_scale

_HOST = get_extension_context("cpu", type_config="float")


def scalar_value(array: "nn.NdArray") -> float:
    """The first value of ``array`` as a float, read through a host view in the dtype it
    holds (so that reading leaves it as it is), far cheaper than ``float(variable.d)`` in
    nnabla 1.39."""
    return float(host_view(array, dtype_of(array), _HOST)[0])


def forward_root(loss: "nn.Variable", outputs: Sequence["nn.Variable"]) -> "nn.Variable":
    """The Variable whose forward pass computes ``loss`` and ``outputs`` in one pass:
    ``F.sink(loss, *outputs)``, built in the loss's context; ``loss`` itself without
    outputs. The sink is only ever run forward (its backward would set the loss's gradient
    to 1, whatever the scale). The outputs are made persistent, so that neither pass frees
    their values (an output the loss is computed from, such as the prediction, would be
    freed by the backward pass with ``clear_buffer=True``).

    Raises:
        ValueError: one of ``outputs`` is ``loss`` itself.
    """
    if not outputs:
        return loss
    import nnabla.functions as F
    for i, output in enumerate(outputs):
        if output is loss:
            raise ValueError(f"outputs[{i}] is the loss itself, which every step computes "
                             f"anyway (StepResult.loss); pass the other outputs only")
        output.persistent = True
    with nn.context_scope(loss.parent.context):
        return F.sink(loss, *outputs)


class StepLosses:
    """The losses of one step's micro-batches, in order (``values``): the arrays their
    forward passes write, or values read at once (a loss computed in place).

    Args:
        values: One entry per micro-batch.
    """
    __slots__ = ("values", "_total", "_mean")

    def __init__(self, values: List[Union["nn.NdArray", float]]) -> None:
        self.values = values
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

    def forget(self) -> None:
        """Forgets the values read, for a new step writing the same arrays."""
        self._total = self._mean = None

    def __reduce__(self):
        """Copies and pickles (``copy.deepcopy``, ``dataclasses.asdict`` of a result) hold
        the value, not nnabla's arrays: one micro-batch's loss, the mean."""
        return StepLosses, ([self.mean()],)


#: ``sys.getrefcount`` of a ring's :class:`StepLosses` that nothing else holds: the ring's
#: list, the name it is read into and the call's own argument.
_UNHELD_REFCOUNT = 3


class LossRecorder:
    """Runs the forward passes of one loss Variable, keeping each loss in the step's
    :class:`StepLosses`.

    Args:
        loss: The loss Variable.
        accum_grad: Forward passes a step runs.
        outputs: Variables computed by the same forward passes (:func:`forward_root`).
    """

    def __init__(self, loss: "nn.Variable", accum_grad: int,
                 outputs: Sequence["nn.Variable"] = ()) -> None:
        self.loss = loss
        self._root = forward_root(loss, outputs)
        # whether the function computing the loss writes it into its input's array
        self._in_place = loss.parent.inplace_data(0) != 0
        self._turn = 0
        self.set_accum_grad(accum_grad)

    def set_accum_grad(self, accum_grad: int) -> None:
        """Runs ``accum_grad`` forward passes a step from the next one on."""
        self._accum_grad = accum_grad
        # two steps' worth: the last result holds its step's losses while the next runs
        self._ring = [self._new_losses(), self._new_losses()]

    def _new_losses(self) -> StepLosses:
        """A step's losses: an array for each micro-batch, or places for the values read
        (a loss computed in place)."""
        if self._in_place:
            return StepLosses([math.nan] * self._accum_grad)
        return StepLosses([nn.NdArray(self.loss.shape) for _ in range(self._accum_grad)])

    def start(self) -> StepLosses:
        """The losses of a new step: the ring's next ones, written again, or new ones where
        a result still holds them (they stay with it)."""
        self._turn = 1 - self._turn
        losses = self._ring[self._turn]
        if getrefcount(losses) > _UNHELD_REFCOUNT:
            losses = self._ring[self._turn] = self._new_losses()
        else:
            losses.forget()
        return losses

    def forward(self, losses: StepLosses, micro_batch: int, clear_no_need_grad: bool) -> None:
        """Runs the loss's forward pass into the array of ``micro_batch`` in ``losses`` (as
        :meth:`start` gave them); a loss computed in place is read after the pass instead.
        The outputs, if any, are computed by the same pass."""
        if self._in_place:
            self._root.forward(clear_no_need_grad=clear_no_need_grad)
            losses.values[micro_batch] = scalar_value(self.loss.data)
            return
        self.loss.data = losses.values[micro_batch]
        self._root.forward(clear_no_need_grad=clear_no_need_grad)


def checked_outputs(name: str, outputs: Any) -> Tuple["nn.Variable", ...]:
    """The ``outputs`` option checked: Variables that a function computes, each once."""
    if outputs is None:
        return ()
    if not isinstance(outputs, (list, tuple)):
        raise TypeError(f"{name} must be None or a list of nnabla.Variable, got "
                        f"{type(outputs).__name__}")
    for i, v in enumerate(outputs):
        if not isinstance(v, nn.Variable):
            raise TypeError(f"{name}[{i}] must be an nnabla.Variable, got {type(v).__name__}")
        if v.parent is None:
            raise ValueError(f"{name}[{i}] is a leaf Variable (shape {tuple(v.shape)}): no "
                             f"function computes it, so a forward pass would not change it")
        if any(v is w for w in outputs[:i]):
            raise ValueError(f"{name}[{i}] is given twice (also at "
                             f"{name}[{[w is v for w in outputs].index(True)}])")
    return tuple(outputs)


class BackwardSeed:
    """The seed of the backward passes of one loss Variable: an array of the loss's shape
    filled with the scale, kept while the scale stays.

    Given a number, ``loss.backward(scale)`` makes nnabla tell it from an array with a
    NumPy call, build a new array, fill it with the scale and drop it after the pass, at
    every backward pass, a measurable part of an updater's step on small models on the CPU
    (``benchmarks/backward_seed.py``; ``benchmarks/README.md`` keeps its runs). Given an
    ``NdArray``, nnabla seeds the pass with that array itself, leaves it as it is and puts
    the loss's own gradient array back afterwards. So one array filled once per scale
    serves every pass at that scale, with the same values: nnabla fills the array it would
    make the same way, and casts it to the loss's dtype alike. Either way the pass starts
    from the scale as the loss's dtype holds it (:func:`~nnabla_mpt.core.dtypes.held_scale`),
    which :attr:`held` keeps, computed once per scale.

    Args:
        loss: The loss Variable.

    Attributes:
        held: The value the seed of the last :meth:`at` holds, :func:`held_scale` of its
            scale in the loss's dtype: the factor the gradients of its passes carry.
    """
    __slots__ = ("_shape", "_dtype", "_scale", "_array", "held")

    def __init__(self, loss: "nn.Variable") -> None:
        self._shape = loss.shape
        self._dtype = graph.loss_dtype(loss)
        self._scale = None
        self._array = None
        self.held = None

    def at(self, scale: float) -> "nn.NdArray":
        """An array of the loss's shape filled with ``scale``: the same array as long as the
        scale is the same (and :attr:`held` its value in the loss's dtype)."""
        if scale != self._scale:
            array = nn.NdArray(self._shape)
            array.fill(scale)
            self.held = held_scale(scale, self._dtype)
            self._array, self._scale = array, scale
        return self._array



def checked_feeder(name: str, feeder: Any) -> Optional[Callable[[], Any]]:
    """``feeder``, checked to be None or callable with no arguments; a callable whose
    signature cannot be read (some builtins) is accepted.

    Raises:
        TypeError: it is not callable, or it needs an argument; the message names ``name``
            and the callable.
    """
    if feeder is None:
        return None
    if not callable(feeder):
        raise TypeError(f"{name} must be callable or None, got {feeder!r}")
    try:
        signature = inspect.signature(feeder)
    except (TypeError, ValueError):
        return feeder           # no signature to read: it will tell at its first call
    try:
        signature.bind()
    except TypeError as e:
        raise TypeError(f"{name}={feeder!r} needs an argument ({e}), but the updater calls "
                        f"it with none before every forward pass: make it write the next "
                        f"batch into the graph's inputs (x.d = ...) without arguments, e.g. "
                        f"a closure over the data iterator") from None
    return feeder


def install_feeder(updater: Any, feeder: Optional[Callable[[], Any]]) -> None:
    """Makes ``feeder`` (checked) the feeder of ``updater``: kept in its ``_data_feeder``,
    and in its ``_feed``, which the step calls, a wrapper that calls it, warns once if it
    returned anything but None, and puts ``feeder`` itself in ``updater._feed`` (unless
    another feeder was set in between)."""
    updater._data_feeder = feeder
    if feeder is None:
        updater._feed = None
        return

    def first_call() -> Any:
        result = feeder()
        if updater._feed is first_call:
            updater._feed = feeder
        if result is not None:
            logger.warning(f"nnabla_mpt: data_feeder={feeder!r} returned a "
                           f"{type(result).__name__} (not None), which the updater ignores: "
                           f"data_feeder must write the batch into the graph's inputs "
                           f"(x.d = ...), not return it; the step ran on whatever the inputs "
                           f"held before")
        return result
    updater._feed = first_call


class StaleInputs:
    """Without a data feeder, the check that the script writes the inputs itself: the
    graph's data inputs are read at the first two ``update()`` calls (only there: no cost
    later) and,
    where every one held the same values at both, a warning names them once: every step
    would train on the same batch. And with ``accum_grad > 1`` a warning says once that
    each step sums one batch ``accum_grad`` times: nothing writes the inputs between its
    forward passes.

    Args:
        inputs: The data inputs of the loss's graph
            (:func:`~nnabla_mpt.core.graph.data_inputs`).
    """

    def __init__(self, inputs: List[Any]) -> None:
        self._inputs = inputs
        self._first: Optional[List[Any]] = None
        self._summed_warned = False
        self.calls = 0

    def look(self, accum_grad: int) -> None:
        """Reads the inputs before an ``update()`` runs (the first two; later ones
        return), and warns about ``accum_grad`` passes over one batch (once)."""
        self.calls += 1
        if accum_grad > 1 and self._inputs and not self._summed_warned:
            self._summed_warned = True
            logger.warning(f"nnabla_mpt: accum_grad={accum_grad} without a data_feeder: "
                           f"each update() runs {accum_grad} forward and backward passes "
                           f"over the same inputs ({self._names()}), nothing writes a new "
                           f"micro-batch between them, so every step sums one batch "
                           f"{accum_grad} times. Pass data_feeder=..., a function of no "
                           f"arguments that writes the next micro-batch (x.d = ...); "
                           f"inputs that are constants of the model are no batch")
        if self.calls > 2 or not self._inputs:
            return
        values = [np.array(v.d, copy=True) for v in self._inputs]
        if self._first is None:
            self._first = values
            return
        same = all(a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
                   for a, b in zip(self._first, values))
        self._first = None
        if same:
            logger.warning(f"nnabla_mpt: no data_feeder, and the inputs of the loss's graph "
                           f"({self._names()}) hold the same values at the first two update() "
                           f"calls: every step "
                           f"trains on the same batch. Pass data_feeder=..., a function of no "
                           f"arguments that writes the next batch (x.d = ...), or write the "
                           f"inputs before each update()")

    def _names(self) -> str:
        """The inputs, by name, or by place and shape where they have none."""
        return ", ".join(f"{v.name!r}" if v.name else f"#{i} of shape {tuple(v.shape)}"
                         for i, v in enumerate(self._inputs))
