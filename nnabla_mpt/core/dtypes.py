"""Facts about the floating-point types the gradients live in.

Pure Python (no nnabla, no NumPy): the policies import it.

Example:
    >>> from nnabla_mpt.core.dtypes import FLOATS
    >>> FLOATS["float16"].max, FLOATS["float16"].tiny, FLOATS["float16"].max_power_of_two
    (65504.0, 6.103515625e-05, 32768.0)
    >>> FLOATS["float16"].smallest == 2.0 ** -24
    True
"""
from dataclasses import dataclass


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
