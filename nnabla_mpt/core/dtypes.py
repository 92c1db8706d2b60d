"""Facts about the floating-point types the gradients live in.

Pure Python at import (no nnabla, no NumPy): the policies import it. The helpers that
read an array's dtype and values (:func:`dtype_name`, :func:`narrowest_float`,
:func:`array_stats`), which the watches of a pass and the gradient statistics use on
every step they watch, are here too, and the value a backward pass seeded in a dtype
starts from (:func:`held_scale`); those that need NumPy import it when called.

Example:
    >>> from nnabla_mpt.core.dtypes import FLOATS
    >>> FLOATS["float16"].max, FLOATS["float16"].tiny, FLOATS["float16"].max_power_of_two
    (65504.0, 6.103515625e-05, 32768.0)
    >>> FLOATS["float16"].smallest == 2.0 ** -24
    True
"""
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple


@dataclass(frozen=True)
class FloatType:
    """A floating-point type.

    Attributes:
        name: Its NumPy name (``"float16"``, ...).
        max: The largest finite value.
        tiny: The smallest normal positive value; non-zero values below it are subnormal.
        max_power_of_two: The largest power of two it holds: the largest loss scale a
            backward pass seeded in this type can start with.
        smallest: The smallest positive value (subnormal): the smallest loss scale a
            backward pass seeded in this type can start with; a smaller one is 0 there
            (or rounds up to this).
    """
    name: str
    max: float
    tiny: float
    max_power_of_two: float
    smallest: float


FLOATS = {
    "float16": FloatType("float16", 65504.0, 2.0 ** -14, 2.0 ** 15, 2.0 ** -24),
    "bfloat16": FloatType("bfloat16", 3.3895313892515355e38, 2.0 ** -126, 2.0 ** 127,
                          2.0 ** -133),
    "float32": FloatType("float32", 3.4028234663852886e38, 2.0 ** -126, 2.0 ** 127,
                         2.0 ** -149),
    "float64": FloatType("float64", 1.7976931348623157e308, 2.0 ** -1022, 2.0 ** 1023,
                         2.0 ** -1074),
}

#: The largest finite float16 value.
FP16_MAX = FLOATS["float16"].max


def float_type(name: str) -> FloatType:
    """The :class:`FloatType` of a dtype name (``str(array.dtype)``).

    Raises:
        ValueError: ``name`` is not a floating-point type this module knows.
    """
    try:
        return FLOATS[str(name)]
    except KeyError:
        raise ValueError(f"dtype {name!r} is not one of the floating-point types "
                         f"{', '.join(FLOATS)}") from None


def dtype_name(array: Any) -> str:
    """Name of an nnabla array's dtype, or ``"uninitialized"``."""
    try:
        return str(array.dtype)
    except Exception:  # an array never written has no dtype yet
        return "uninitialized"


def narrowest_float(dtypes: List[str]) -> Optional[str]:
    """The floating dtype name with the smallest range among ``dtypes``, or ``None``."""
    floats = [d for d in dtypes if d.startswith("float")]
    return min(floats, key=lambda d: float_type(d).max, default=None)


def array_stats(arr: Any) -> Tuple[int, float, float]:
    """(number of non-finite values, max |finite|, min |finite|) of an array, of any dtype."""
    import numpy as np

    a = np.asarray(arr)
    fin = np.isfinite(a)        # all True for integers and booleans
    bad = int(a.size - np.count_nonzero(fin))
    if bad == a.size:           # an empty array too
        return bad, float("nan"), float("nan")
    aa = np.abs(a[fin] if bad else a).astype(np.float64)
    return bad, float(aa.max()), float(aa.min())


def held_scale(scale: float, dtype: str) -> float:
    """The value a backward pass seeded with ``scale`` in ``dtype`` (the loss's:
    :func:`~nnabla_mpt.core.graph.loss_dtype`) starts from: the scale rounded to that dtype,
    computed on the host (see the examples below). The gradients carry that value, not the
    scale asked for, so it is the value divided out of them
    (:class:`~nnabla_mpt.step.unscale.Unscaler`) and the one every measurement of the room
    left to the gradients is taken in units of (:mod:`nnabla_mpt.scale.measured`).

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
    import numpy as np
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
