"""What a good step does to the gradients before the solver's update: unscale, clip,
weight decay; and the learning rate of a schedule keyed on applied updates."""
import math
from typing import Any, Mapping, Optional

from ..core._gradsum import SquaredNorm, numpy_min_size

#: The smallest normal float32: a clip factor below it is applied in parts.
FLOAT32_TINY = 2.0 ** -126


class Unscaler:
    """Unscales the summed gradients, clips them, applies weight decay and updates.

    The gradients hold the seed's value × the sum over ``accum_grad`` micro-batches (and
    over the ranks after an all-reduce, which itself divides by the number of ranks where
    they are averaged); the seed holds the loss scale rounded to the loss's dtype
    (:func:`~nnabla_mpt.core.dtypes.held_scale`: 3000.0 for a scale of 3000.7 in float16).
    :meth:`unscale` divides them by that held value, and by ``accum_grad`` where the
    micro-batches are averaged (one ``solver.scale_grad``); with ``clip_grad_norm`` it then
    takes the global L2 norm of the unscaled gradients (scaled by their largest magnitude,
    as BLAS ``nrm2`` does: finite for all finite gradients) and scales them down to the
    bound when the norm exceeds it. :meth:`apply` applies weight decay to
    the unscaled gradients, sets the learning rate of ``lr_scheduler`` (fetched by
    :meth:`unscale`, before the step has changed anything) and updates.

    Args:
        solver: The solver.
        params: Its parameters (name -> Variable), for the gradient norm.
        context: The float32 context of the device the gradients live on
            (:func:`nnabla_mpt.core.graph.float_context`): the norm is computed there.
        options: The updater's checked options
            (:class:`~nnabla_mpt.updater.UpdaterOptions`): ``accum_grad``, the
            micro-batches whose gradients are summed per update, divided by it where
            ``average_accum``; ``clip_grad_norm``, the bound of the global L2
            norm, or None; ``weight_decay``, the rate, or None; ``lr_scheduler``, an object
            with ``get_learning_rate(iter)`` (nnabla's
            ``nnabla.utils.learning_rate_scheduler``), keyed on applied updates, or None.

    ``clip`` (the bound) and ``weight_decay`` are kept as attributes of those names, the
    accumulation by :meth:`set_accumulation`; the updater's settings change them between
    steps (:mod:`nnabla_mpt.settings`).
    """

    def __init__(self, solver, params: Mapping, context, options: Any) -> None:
        self._solver = solver
        self._lr_scheduler = options.lr_scheduler
        self._params = params
        self._context = context
        self.set_accumulation(options.accum_grad, options.average_accum)
        self.clip = options.clip_grad_norm
        self.weight_decay = options.weight_decay
        self._squared_norm = None          # built on first use by grad_norm()
        self._rate = None                  # the learning rate unscale() fetched

    def set_accumulation(self, accum_grad: int, average_accum: bool) -> None:
        """Gradients summed over ``accum_grad`` micro-batches, divided by it where
        ``average_accum``."""
        self.accum_divisor = accum_grad if average_accum else 1

    def unscale(self, held: float, updates: int = 0) -> Optional[float]:
        """Unscales the gradients of a step whose seed held ``held`` (the step's scale as
        the loss's dtype holds it, :attr:`~nnabla_mpt.step.micro_batch.BackwardSeed.held`: dividing
        by the scale itself would leave an error of up to 0.05% in float16) and clips
        them; returns the clipping norm, the unscaled gradients' global L2 norm (None
        without clipping). With ``lr_scheduler``, first fetches the rate :meth:`apply`
        sets: the schedule's at ``updates``, the updates applied so far (a skipped step
        does not advance it); a rate it refuses raises here, before the step changes
        parameters, solver states, scale or counters (its batches are consumed, and a first
        step of ``scale="auto"`` has measured its scale).

        A norm that is not finite, which only a gradient holding inf or NaN makes, leaves
        the gradients unscaled but not clipped: no factor brings them to the bound, and the
        caller skips the step (the overflow check finds those first; without it, the
        updater skips the step as an overflow). Finite gradients are clipped and applied,
        however large their norm (a clip factor below float32's smallest normal,
        ``FLOAT32_TINY``, is applied in parts of ``2**-64``, since ``scale_grad`` takes a
        float32).
        """
        if self._lr_scheduler is not None:
            self._rate = scheduled_rate(self._lr_scheduler, updates)
        factor = 1.0 / (held * self.accum_divisor)
        if factor != 1.0:
            self._solver.scale_grad(factor)
        if self.clip is None:
            return None
        norm = self.grad_norm()
        if math.isfinite(norm) and norm > self.clip:
            factor = self.clip / norm
            while 0.0 < factor < FLOAT32_TINY:  # a float32 subnormal (or 0) would lose bits
                self._solver.scale_grad(2.0 ** -64)     # exact, where the result is normal
                factor *= 2.0 ** 64
            self._solver.scale_grad(factor)
        return norm

    def apply(self) -> None:
        """Applies weight decay to the unscaled (and clipped) gradients, sets the learning
        rate :meth:`unscale` fetched (with ``lr_scheduler``), then calls
        ``solver.update()``."""
        if self.weight_decay is not None:
            self._solver.weight_decay(self.weight_decay)
        if self._rate is not None:
            self._solver.set_learning_rate(self._rate)
        self._solver.update()

    def grad_norm(self) -> float:
        """Global L2 norm of the gradients of all the solver's parameters as they are now
        (:class:`~nnabla_mpt.core._gradsum.SquaredNorm`: summed in float32 scaled by the
        largest magnitude, read once): finite for finite gradients, NaN or inf only
        where a gradient holds inf or NaN."""
        if self._squared_norm is None:
            self._squared_norm = SquaredNorm(list(self._params.values()), self._context,
                                             numpy_min_size(self._context))
        return math.sqrt(self._squared_norm.value())


def scheduled_rate(scheduler: Any, updates: int) -> float:
    """``scheduler.get_learning_rate(updates)`` as a float, checked to be finite and >= 0.

    Raises:
        ValueError: the schedule gave a negative or non-finite rate (the message names
            ``lr_scheduler``, the update and the value), or something that is no number.
    """
    rate = scheduler.get_learning_rate(updates)
    try:
        value = float(rate)
    except (TypeError, ValueError):
        raise ValueError(f"lr_scheduler.get_learning_rate({updates}) returned {rate!r} of type "
                         f"{type(rate).__name__}, not a number") from None
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"lr_scheduler.get_learning_rate({updates}) returned {rate!r}: a "
                         f"learning rate must be finite and >= 0 (the step is not taken: "
                         f"parameters, solver states and counters are unchanged)")
    return value


def checked_lr_scheduler(name: str, scheduler: Any) -> Any:
    """The ``lr_scheduler`` option checked: None or an object with ``get_learning_rate``."""
    if scheduler is None or callable(getattr(scheduler, "get_learning_rate", None)):
        return scheduler
    raise TypeError(f"{name} must be None or a learning-rate schedule with a "
                    f"get_learning_rate(iter) method (nnabla.utils.learning_rate_scheduler), "
                    f"got {scheduler!r} of type {type(scheduler).__name__}")
