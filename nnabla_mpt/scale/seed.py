"""The seed of a backward pass: the loss scale as the loss's dtype holds it.

Given a number, ``loss.backward(scale)`` makes nnabla tell it from an array with a NumPy
call, build a new array, fill it with the scale and drop it after the pass, at every
backward pass, a measurable part of an updater's step on small models on the CPU
(``benchmarks/backward_seed.py``; ``benchmarks/README.md`` keeps its runs). Given an
``NdArray``, nnabla seeds the pass with that array itself, leaves it as it is and puts
the loss's own gradient array back afterwards.
So one array filled once per scale serves every pass at that scale, with the same values:
nnabla fills the array it would make the same way, and casts it to the loss's dtype alike
(:class:`~nnabla_mpt.step.step_loss.BackwardSeed` keeps it, beside the loss's arrays).

Either way the pass starts from the scale *as the loss's dtype holds it*
(:func:`held_scale`): 3000.7 is 3000.0 in a float16 seed, 17496 is 17504. The gradients
carry that value, not the scale asked for, so it is the value divided out of them
(:class:`~nnabla_mpt.step.unscale.Unscaler`) and the one every measurement of the room left to
the gradients is taken in units of (:mod:`nnabla_mpt.scale.measured`); :attr:`~nnabla_mpt.step.step_loss.BackwardSeed.held`
keeps it beside the array, computed once per scale.
"""
import numpy as np


def held_scale(scale: float, dtype: str) -> float:
    """The value a backward pass seeded with ``scale`` in ``dtype`` (the loss's:
    :func:`~nnabla_mpt.core.graph.loss_dtype`) starts from: the scale rounded to that dtype,
    computed on the host.

    nnabla fills the seed from a C float: the scale is rounded to float32 first, then to
    the loss's dtype, to nearest (ties to even), ``inf`` beyond its range. This holds for
    every scale the updaters run with (from the dtype's smallest positive value up); below
    it nnabla's float16 seed is 0. bfloat16, which only GPU extensions run, is taken to
    round the same way.

    Example:
        >>> held_scale(3000.7, "float16"), held_scale(17496.0, "float16")
        (3000.0, 17504.0)
        >>> held_scale(3000.7, "float32"), held_scale(2.0 ** 15, "float16")
        (3000.699951171875, 32768.0)

    Raises:
        ValueError: ``dtype`` is not ``"float16"``, ``"bfloat16"`` or ``"float32"``.
    """
    with np.errstate(over="ignore"):
        single = np.float32(scale)
        if dtype == "float32":
            return float(single)
        if dtype == "float16":
            return float(np.float16(single))
    if dtype == "bfloat16":
        if np.isnan(single):
            return float(single)
        bits = int(single.view(np.uint32))
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000    # nearest, ties to even
        return float(np.uint32(bits).view(np.float32))
    raise ValueError(f"dtype={dtype!r} is not a dtype a loss is seeded in: 'float16', "
                     f"'bfloat16' or 'float32'")
