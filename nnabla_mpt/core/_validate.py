"""Argument checks shared by the package.

Every check raises ``TypeError`` (wrong kind of value) or ``ValueError`` (right kind, wrong
value) with a message that names the argument, repeats the value received and says what is
allowed. Pure Python: importable without nnabla.
"""
import math
import numbers
import operator
import os
from typing import Any, Iterable, Mapping, Optional, Sequence


#: The bounds :func:`real` checks, in the order of its keywords: as a message writes each,
#: and its test.
_BOUNDS = ((">", operator.gt), (">=", operator.ge), ("<", operator.lt), ("<=", operator.le))


def real(name: str, value: Any, *, gt: Optional[float] = None, ge: Optional[float] = None,
         lt: Optional[float] = None, le: Optional[float] = None) -> float:
    """Returns ``value`` as a finite float after checking it against the given bounds."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a real number, got {value!r} "
                        f"of type {type(value).__name__}")
    received, value = value, float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {received!r}")
    bounds = [(sign, test, limit) for (sign, test), limit in zip(_BOUNDS, (gt, ge, lt, le))
              if limit is not None]
    if not all(test(value, limit) for _, test, limit in bounds):
        shown = " and ".join(f"{sign} {limit:g}" for sign, _, limit in bounds)
        raise ValueError(f"{name} must be {shown}, got {received!r}")
    return value


def path(name: str, value: Any) -> str:
    """Returns ``value`` (a ``str``, ``bytes`` or ``os.PathLike``) as a ``str`` path after
    checking it names something: not empty, no NUL byte."""
    try:
        text = os.fsdecode(os.fspath(value))
    except TypeError:
        raise TypeError(f"{name} must be a path (a str or an os.PathLike), got {value!r} "
                        f"of type {type(value).__name__}") from None
    if not text:
        raise ValueError(f"{name} must be a path, got the empty string {value!r}")
    if "\0" in text:
        raise ValueError(f"{name} must be a path, got {value!r}, which holds a NUL byte")
    return text


def integer(name: str, value: Any, *, ge: Optional[int] = None) -> int:
    """Returns ``value`` as an int after checking it is a whole number ``>= ge``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} "
                        f"of type {type(value).__name__}")
    value = int(value)
    if ge is not None and value < ge:
        raise ValueError(f"{name} must be >= {ge}, got {value!r}")
    return value


def boolean(name: str, value: Any) -> bool:
    """Returns ``value`` as a bool: ``True``, ``False`` or a NumPy bool (as an nnabla script
    may pass one); anything else, 0 and 1 included, is refused."""
    if not isinstance(value, bool) and type(value).__name__ != "bool_":
        raise TypeError(f"{name} must be True or False, got {value!r} "
                        f"of type {type(value).__name__}")
    return bool(value)


def option(name: str, value: Any, cls: type) -> Any:
    """Returns ``value`` after checking it is None or a ``cls`` (one of the package's
    option objects, named as ``nnabla_mpt.<cls>``)."""
    if value is None or isinstance(value, cls):
        return value
    raise TypeError(f"{name} must be None or a nnabla_mpt.{cls.__name__}, got {value!r} "
                    f"of type {type(value).__name__}")


def choice(name: str, value: Any, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(repr(a) for a in allowed)}, "
                         f"got {value!r}")
    return value


def exact_keys(name: str, state: Any, expected: Iterable[str]) -> None:
    """Checks that the mapping ``state`` has exactly the keys ``expected``."""
    if not isinstance(state, Mapping):
        raise TypeError(f"{name} must be a mapping (as returned by state_dict()), "
                        f"got {type(state).__name__}")
    why = mismatch(expected, state, "missing keys", "unknown keys")
    if why:
        raise ValueError(f"{name} does not match this object: {why}")


def mismatch(expected: Iterable[Any], found: Iterable[Any], missing: str, unknown: str) -> str:
    """What ``found`` lacks of ``expected`` and holds beyond it, each list sorted and led
    by its word (``"missing keys ['a']; unknown keys ['z']"``), or ``""`` where they
    match."""
    expected, found = set(expected), set(found)
    parts = ((missing, expected - found), (unknown, found - expected))
    return "; ".join(f"{what} {sorted(names, key=str)}" for what, names in parts if names)


def version(name: str, state: Mapping, expected: int) -> None:
    """Checks that ``state["version"]`` is the integer ``expected`` (not a bool or float that
    compares equal): states of earlier versions are converted before this check."""
    got = state.get("version")
    if type(got) is not int or got != expected:
        raise ValueError(f"{name} has version {got!r}; this nnabla_mpt writes version "
                         f"{expected} and reads it and the earlier versions it converts")
