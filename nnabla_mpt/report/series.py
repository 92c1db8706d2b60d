"""Reading back what a :class:`~nnabla_mpt.LossScaleMonitor` wrote: its ``MonitorSeries``
files, one line ``<index> <value>`` each.

How a directory is read::

    for each series <prefix>-<key>.series.txt of the directory (SERIES):
        every line is "<index> <value>": an integer and a number as %g writes it
            (1.04858e+06, 0.25, -inf)
        a last line without its newline is still being written: it is left out
        an index written again (a run rewound, or resumed from a checkpoint into the same
            files) keeps the value written last; the values are taken in index order
    the windows are the indices that the series of every window (WINDOW: the scale,
        skipped-steps and overflow-rate series, and where the files have them the first,
        smallest and largest scale and the float32 steps) all hold (a run in progress may
        have written one of them and not yet the others)

Pure Python and NumPy: neither nnabla nor matplotlib is imported.
"""
import io
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..core.dtypes import FLOATS
from ..files.regular_file import open_for_reading

#: The series a LossScaleMonitor writes, by the key after its prefix; the first three always,
#: the gradient series with gradient statistics, the last from the first growth point held by
#: the loss dtype's ceiling on.
SERIES = ("scale", "skipped-steps", "overflow-rate", "scale-first", "scale-min",
          "scale-max", "float32-steps", "gradient-zero-fraction",
          "gradient-subnormal-fraction", "gradient-headroom", "growth-held-by-ceiling")
#: The series every window has; the first three written by every version of the monitor.
CORE = SERIES[:3]
WINDOW = SERIES[:7]
SUFFIX = ".series.txt"


@dataclass(frozen=True)
class Series:
    """One series as read: its indices in increasing order and the value of each.

    Attributes:
        path: The file.
        steps: The indices (the step of each line), increasing, each once.
        values: The value of each index, the last one written.
        rewritten: Lines whose index an earlier line already had (a rewound or resumed run).
        partial: Whether a last line without its newline was left out (a run writing it).
    """
    path: str
    steps: np.ndarray
    values: np.ndarray
    rewritten: int = 0
    partial: bool = False

    def at(self, steps: np.ndarray) -> np.ndarray:
        """The values at ``steps``; NaN where the series has no value."""
        steps = np.asarray(steps, dtype=np.int64)
        if not self.steps.size:
            return np.full(steps.shape, np.nan)
        pos = np.minimum(np.searchsorted(self.steps, steps), self.steps.size - 1)
        return np.where(self.steps[pos] == steps, self.values[pos], np.nan)

    def upto(self, last: int) -> "Series":
        """The series without its indices after ``last``."""
        keep = int(np.searchsorted(self.steps, last, side="right"))
        return Series(path=self.path, steps=self.steps[:keep], values=self.values[:keep],
                      rewritten=self.rewritten, partial=self.partial)


@dataclass(frozen=True)
class MonitorRun:
    """The loss-scale series of one directory.

    Attributes:
        directory: The directory read.
        prefix: The prefix of the series (``LossScaleMonitor(prefix=...)``).
        series: The series found, by key (see :data:`SERIES`), none beyond the last window.
        steps: The last step of each window: the indices all the series of :data:`WINDOW`
            the directory has hold, increasing.
        beyond: The series that went on after the last window (a file cut short, or still
            being written), by key: the last index each held.
    """
    directory: str
    prefix: str
    series: Dict[str, Series]
    steps: np.ndarray
    beyond: Dict[str, int] = field(default_factory=dict)

    def values(self, key: str) -> Optional[np.ndarray]:
        """The series ``key`` at every window (NaN where it has no value), or None when the
        directory has no such series."""
        found = self.series.get(key)
        return None if found is None else found.at(self.steps)


#: Bytes a series line may hold: the digits of the index, one space, the value as ``%g``
#: writes it (digits, ``.``, ``e``, signs, ``inf``, ``nan``), and its newline.
_ALLOWED = np.zeros(256, dtype=bool)
_ALLOWED[np.frombuffer(b"0123456789 .eE+-infaINFA\n", np.uint8)] = True
_DIGITS = 18            # an index has at most this many digits (below 2**63)
_CHUNK = 32 << 20       # bytes read and parsed at a time
_LINE = re.compile(r"([0-9]{1,%d}) ([-+]?(?:[0-9]+\.?[0-9]*(?:e[-+]?[0-9]+)?|\.[0-9]+"
                   r"(?:e[-+]?[0-9]+)?|inf|nan))" % _DIGITS, re.IGNORECASE)


def read_series(path: str) -> Series:
    """Reads one ``MonitorSeries`` file (a regular file: a FIFO or a device is refused
    without being opened for reading, which could wait or act on it).

    Raises:
        ValueError: a complete line is not ``<index> <value>`` with an index of ASCII
            digits below ``10**18``; the message names the file, the line and what it
            holds.
        OSError: the file cannot be read, or is not a regular file.
    """
    parts, tail, fast = [], b"", True
    with open_for_reading(path, f"cannot read the series {path}") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):   # in blocks: memory stays low
            block = tail + block
            end = block.rfind(b"\n") + 1
            tail, parsed = block[end:], _parse_fast(block[:end])
            if parsed is None:
                fast = False
                break
            parts.append(parsed)
    if fast:
        steps = np.concatenate([p[0] for p in parts] or [np.zeros(0, np.int64)])
        values = np.concatenate([p[1] for p in parts] or [np.zeros(0)])
    else:                               # line by line, for the line to name
        with open_for_reading(path, f"cannot read the series {path}") as f:
            data = f.read()
        tail = data[data.rfind(b"\n") + 1:]
        steps, values = _parse_lines(path, data[:len(data) - len(tail)])
    partial = tail != b""                # the last line has no newline yet
    if steps.size < 2 or (np.diff(steps) > 0).all():     # each index once, in order
        return Series(path=path, steps=steps, values=values, partial=partial)
    # an index written again keeps its last value: the first one in reversed order
    unique, at = np.unique(steps[::-1], return_index=True)
    return Series(path=path, steps=unique, values=values[::-1][at],
                  rewritten=len(steps) - len(unique), partial=partial)


def _parse_fast(data: bytes) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """The indices and values of ``data`` (complete lines) where every line has the form
    ``MonitorSeries`` writes, checked and read with NumPy; None where a line does not, or
    there is a blank one (:func:`_parse_lines` then reads them one by one)."""
    if not data:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    raw = np.frombuffer(data, np.uint8)
    newlines, spaces = np.flatnonzero(raw == 10), np.flatnonzero(raw == 32)
    if len(spaces) != len(newlines) or not _ALLOWED[raw].all():
        return None
    starts = np.concatenate([[0], newlines[:-1] + 1])
    digits = spaces - starts            # one space a line, after 1 to 18 digits, before a value
    if not ((digits >= 1) & (digits <= _DIGITS) & (spaces < newlines - 1)).all():
        return None
    others = np.flatnonzero((raw < 48) | (raw > 57))     # not a digit: after the space
    others = others[(raw[others] != 32) & (raw[others] != 10)]
    if not (spaces[np.searchsorted(newlines, others)] < others).all():
        return None
    try:
        table = np.loadtxt(io.BytesIO(data), dtype=[("i", np.int64), ("v", np.float64)],
                           ndmin=1, comments=None, delimiter=" ")
    except ValueError:
        return None
    return table["i"], table["v"]


def _parse_lines(path: str, data: bytes) -> Tuple[np.ndarray, np.ndarray]:
    """The indices and values of ``data``, line by line (blank lines skipped); the first
    line that is not ``<index> <value>`` raises the error of :func:`read_series`."""
    steps, values = [], []
    for number, raw in enumerate(data.split(b"\n")[:-1], 1):
        line = raw.decode("utf-8", errors="replace")
        if not line.strip():
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            raise ValueError(f"{path}, line {number}: {line[:80]!r} is not '<index> <value>' "
                             f"as nnabla's MonitorSeries writes it (an index of at most "
                             f"{_DIGITS} ASCII digits, a space, a number): not a series a "
                             f"LossScaleMonitor wrote")
        steps.append(int(match.group(1)))
        values.append(float(match.group(2)))
    return np.array(steps, dtype=np.int64), np.array(values, dtype=np.float64)


def read_run(directory: str, prefix: str = "loss-scale") -> MonitorRun:
    """Reads the loss-scale series of ``directory`` (the ``Monitor``'s ``save_path``).

    Raises:
        FileNotFoundError: no such directory.
        NotADirectoryError: ``directory`` is a file.
        OSError: it cannot be read (a symlink loop, no permission), or a series there is
            not a regular file (a FIFO is refused without waiting for a writer).
        ValueError: it holds no loss-scale series with ``prefix`` (the message names the
            prefixes of the series it holds), one of the three every window has is missing,
            a file is not a ``MonitorSeries``, a value makes no sense (:func:`checked`), or
            the series hold no window yet.
    """
    directory = os.fspath(directory)
    found = series_files(directory, prefix)
    series = {key: checked(key, read_series(path)) for key, path in found.items()}
    steps = series["scale"].steps
    for key in WINDOW[1:]:
        if key in series and not np.array_equal(steps, series[key].steps):
            steps = np.intersect1d(steps, series[key].steps, assume_unique=True)
    if steps.size == 0:
        raise ValueError(f"{directory}: the {prefix} series hold no window yet (a run that "
                         f"has just started: a LossScaleMonitor writes its first line after "
                         f"`interval` steps)")
    last = int(steps[-1])
    beyond = {key: int(s.steps[-1]) for key, s in series.items()
              if key in WINDOW and s.steps[-1] > last}
    series = {key: s.upto(last) for key, s in series.items()}
    return MonitorRun(directory=directory, prefix=prefix, series=series, steps=steps,
                      beyond=beyond)


_FLOAT32_MAX = FLOATS["float32"].max
#: What the values of each series must be, by key: a test and what it asks for.
_SENSE = {
    **{key: (lambda v: (v > 0) & (v <= _FLOAT32_MAX),
             "a loss scale above 0 and at most float32's largest value")
       for key in ("scale", "scale-first", "scale-min", "scale-max")},
    **{key: (lambda v: (v >= 0) & (v <= 1), "a fraction from 0 to 1")
       for key in ("overflow-rate", "gradient-zero-fraction", "gradient-subnormal-fraction")},
    **{key: (lambda v: np.isfinite(v) & (v >= 0) & (v == np.floor(v)), "a whole number >= 0")
       for key in ("skipped-steps", "float32-steps", "growth-held-by-ceiling")},
    "gradient-headroom": (lambda v: ~np.isnan(v), "powers of two (inf and -inf allowed)"),
}


def series_files(directory: str, prefix: str) -> Dict[str, str]:
    """The paths of the series of ``prefix`` in ``directory``, by key (the errors of
    :func:`read_run` where the directory or its three series of every window are not
    there)."""
    try:
        is_dir = stat.S_ISDIR(os.stat(directory).st_mode)
    except FileNotFoundError:
        raise FileNotFoundError(f"{directory}: no such directory; give the directory a "
                                f"LossScaleMonitor writes to (its Monitor's save_path)") from None
    except OSError as err:          # a symlink loop, a folder that cannot be searched, ...
        raise OSError(err.errno, f"{directory}: {err.strerror}") from None
    if not is_dir:
        raise NotADirectoryError(f"{directory}: a file, not a directory; give the directory "
                                 f"that holds the {prefix}-*{SUFFIX} files")
    names = set(os.listdir(directory))
    found = {key: os.path.join(directory, f"{prefix}-{key}{SUFFIX}") for key in SERIES
             if f"{prefix}-{key}{SUFFIX}" in names}
    if not found:
        raise ValueError(f"{directory}: no {prefix}-*{SUFFIX} files: not a directory a "
                         f"LossScaleMonitor(prefix={prefix!r}) wrote to"
                         + _other_prefixes(names))
    missing = [f"{prefix}-{key}{SUFFIX}" for key in CORE if key not in found]
    if missing:
        raise ValueError(f"{directory}: {', '.join(missing)} missing; a LossScaleMonitor "
                         f"writes {', '.join(f'{prefix}-{k}{SUFFIX}' for k in CORE)} together")
    return found


def checked(key: str, series: Series) -> Series:
    """``series`` (the series ``key``) if its values make sense (:data:`_SENSE`; the
    cumulative ``skipped-steps`` never falls).

    Raises:
        ValueError: the first value that does not, naming the file and its line.
    """
    test, wanted = _SENSE[key]
    bad = np.flatnonzero(~test(series.values))
    if bad.size:
        step, value = int(series.steps[bad[0]]), float(series.values[bad[0]])
        raise ValueError(f"{_where(series.path, step)}: {key} {value:g} at step {step} is not "
                         f"{wanted}: not a series a LossScaleMonitor wrote")
    if key == "skipped-steps":
        falls = np.flatnonzero(np.diff(series.values) < 0)
        if falls.size:
            i = int(falls[0])
            a, b = int(series.steps[i]), int(series.steps[i + 1])
            raise ValueError(f"{_where(series.path, b)}: skipped-steps falls from "
                             f"{series.values[i]:g} at step {a} to {series.values[i + 1]:g} at "
                             f"step {b}: the count of skipped steps never falls")
    return series


def _where(path: str, step: int) -> str:
    """``"<path>, line <n>"``: the last line of ``path`` that writes index ``step``."""
    prefix, number = f"{step} ".encode(), None
    with open_for_reading(path, f"cannot read the series {path}") as f:
        for n, line in enumerate(f, 1):
            if line.startswith(prefix):
                number = n
    return f"{path}, line {number}"


def _other_prefixes(names) -> str:
    """What the error adds when the directory holds loss-scale series of another prefix, or
    other series."""
    others = sorted(n[:-len("-scale" + SUFFIX)] for n in names if n.endswith("-scale" + SUFFIX))
    if others:
        return (f" (it holds the loss-scale series of prefix "
                f"{', '.join(map(repr, others))})")
    series: List[str] = sorted(n for n in names if n.endswith(SUFFIX))
    if series:
        return f" (it holds other series: {', '.join(series[:5])})"
    return ""
