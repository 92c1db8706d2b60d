"""What a good step does to the gradients before the solver's update: unscale, clip,
weight decay."""
import math
from typing import Mapping, Optional

from ._gradsum import NumpySquaredNorm, SquaredNorm


class Unscaler:
    """Unscales the summed gradients, clips them, applies weight decay and updates.

    The gradients hold ``scale`` × the sum over ``accum_grad`` micro-batches (and over the
    ranks after an all-reduce). One ``solver.scale_grad`` divides by the scale, and by
    ``accum_grad`` and the number of ranks when averaging is asked for; with
    ``clip_grad_norm`` the same call also scales the global L2 norm of the unscaled
    gradients down to the bound. Weight decay is applied to the unscaled gradients.

    Args:
        solver: The solver.
        params: Its parameters (name -> Variable), for the gradient norm.
        extension: The extension the graph runs on (``"cpu"``, ``"cudnn"``, ...).
        accum_divisor: ``accum_grad`` where the micro-batches are averaged, else 1.
        rank_divisor: The number of ranks where the ranks are averaged, else 1.
        clip_grad_norm: The bound of the global L2 norm, or None.
        weight_decay: The weight-decay rate, or None.
    """

    def __init__(self, solver, params: Mapping, extension: str, accum_divisor: int,
                 rank_divisor: int, clip_grad_norm: Optional[float],
                 weight_decay: Optional[float]) -> None:
        self._solver = solver
        self._params = params
        self._extension = extension
        self._accum_divisor = accum_divisor
        self._rank_divisor = rank_divisor
        self._clip = clip_grad_norm
        self._weight_decay = weight_decay
        self._squared_norm = None          # built on first use by grad_norm()

    def apply(self, scale: float) -> None:
        """Unscales, clips and decays the gradients of a step run with ``scale``, then
        calls ``solver.update()``."""
        factor = 1.0 / (scale * self._accum_divisor * self._rank_divisor)
        if self._clip is not None:
            norm = self.grad_norm() * factor
            if norm > self._clip:
                factor *= self._clip / norm
        if factor != 1.0:
            self._solver.scale_grad(factor)
        if self._weight_decay is not None:
            self._solver.weight_decay(self._weight_decay)
        self._solver.update()

    def grad_norm(self) -> float:
        """Global L2 norm of the (still scaled) gradients of all the solver's parameters."""
        if self._squared_norm is None:
            variables = list(self._params.values())
            # On the CPU, one prebuilt graph instead of one NumPy read per parameter.
            self._squared_norm = (SquaredNorm(variables) if self._extension == "cpu"
                                  else NumpySquaredNorm(variables))
        return math.sqrt(self._squared_norm.value())
