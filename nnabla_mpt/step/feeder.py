"""The ``data_feeder`` of the updaters: checked when it is given, watched at its first call.

nnabla calls the feeder with no arguments before every forward pass, and ignores what it
returns: the feeder writes the next batch into the graph's input Variables (``x.d = ...``).
A feeder that needs an argument is refused when it is given (else the first update would
raise a ``TypeError`` naming only the callable); one that returns something,
the batch, as a PyTorch loop would, is warned about at its first call: the step would
train on whatever the inputs held before.

The updater calls :func:`first_call_checked`'s wrapper once, which then puts the feeder
itself in its place: the steps after the first call the feeder as they would without the
check.

Example:
    >>> from nnabla_mpt.step.feeder import checked_feeder
    >>> checked_feeder("data_feeder", lambda batch: None)
    Traceback (most recent call last):
    ...
    TypeError: data_feeder=<function <lambda> at ...> needs an argument ...
"""
import inspect
from typing import Any, Callable, List, Optional

import numpy as np
from nnabla.logger import logger


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
    and in its ``_feed``, which the step calls, a wrapper that checks the feeder's first
    return value (:func:`first_call_checked`)."""
    updater._data_feeder = feeder
    updater._feed = None if feeder is None else first_call_checked(updater, feeder,
                                                                   "data_feeder")


def first_call_checked(updater: Any, feeder: Callable[[], Any],
                       name: str) -> Callable[[], Any]:
    """A wrapper of ``feeder`` that calls it, warns once if it returned anything but
    None, and puts ``feeder`` itself in ``updater._feed`` (unless another feeder was set
    in between)."""
    def first_call() -> Any:
        result = feeder()
        if updater._feed is first_call:
            updater._feed = feeder
        if result is not None:
            logger.warning(f"nnabla_mpt: {name}={feeder!r} returned a {type(result).__name__} "
                           f"(not None), which the updater ignores: {name} must write the "
                           f"batch into the graph's inputs (x.d = ...), not return it; the "
                           f"step ran on whatever the inputs held before")
        return result
    return first_call


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
