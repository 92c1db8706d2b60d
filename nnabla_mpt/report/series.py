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
import os
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

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
        lookup = dict(zip(self.steps.tolist(), self.values.tolist()))
        return np.array([lookup.get(int(s), np.nan) for s in steps], dtype=np.float64)


@dataclass(frozen=True)
class MonitorRun:
    """The loss-scale series of one directory.

    Attributes:
        directory: The directory read.
        prefix: The prefix of the series (``LossScaleMonitor(prefix=...)``).
        series: The series found, by key (see :data:`SERIES`).
        steps: The last step of each window: the indices all three series of :data:`CORE`
            hold, increasing.
    """
    directory: str
    prefix: str
    series: Dict[str, Series]
    steps: np.ndarray

    def values(self, key: str) -> Optional[np.ndarray]:
        """The series ``key`` at every window (NaN where it has no value), or None when the
        directory has no such series."""
        found = self.series.get(key)
        return None if found is None else found.at(self.steps)


def read_series(path: str) -> Series:
    """Reads one ``MonitorSeries`` file.

    Raises:
        ValueError: a complete line is not ``<index> <value>``; the message names the file,
            the line and what it holds.
    """
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    lines = text.split("\n")
    partial = lines[-1] != ""          # the last line has no newline yet
    by_step: Dict[int, float] = {}
    rewritten = 0
    for number, line in enumerate(lines[:-1], 1):
        if not line.strip():
            continue
        step, value = _parse(path, number, line)
        rewritten += step in by_step
        by_step[step] = value
    steps = np.array(sorted(by_step), dtype=np.int64)
    values = np.array([by_step[s] for s in steps.tolist()], dtype=np.float64)
    return Series(path=path, steps=steps, values=values, rewritten=rewritten,
                  partial=partial)


def _parse(path: str, number: int, line: str):
    fields = line.split()
    try:
        if len(fields) != 2:
            raise ValueError
        return int(fields[0]), float(fields[1])
    except ValueError:
        raise ValueError(f"{path}, line {number}: {line[:80]!r} is not '<index> <value>' as "
                         f"nnabla's MonitorSeries writes it: not a series a LossScaleMonitor "
                         f"wrote") from None


def read_run(directory: str, prefix: str = "loss-scale") -> MonitorRun:
    """Reads the loss-scale series of ``directory`` (the ``Monitor``'s ``save_path``).

    Raises:
        FileNotFoundError: no such directory.
        NotADirectoryError: ``directory`` is a file.
        ValueError: it holds no loss-scale series with ``prefix`` (the message names the
            prefixes of the series it holds), one of the three every window has is missing,
            a file is not a ``MonitorSeries``, or the series hold no window yet.
    """
    directory = os.fspath(directory)
    if not os.path.exists(directory):
        raise FileNotFoundError(f"{directory}: no such directory; give the directory a "
                                f"LossScaleMonitor writes to (its Monitor's save_path)")
    if not os.path.isdir(directory):
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
    series = {key: read_series(path) for key, path in found.items()}
    steps = series["scale"].steps
    for key in WINDOW[1:]:
        if key in series:
            steps = np.intersect1d(steps, series[key].steps)
    if steps.size == 0:
        raise ValueError(f"{directory}: the {prefix} series hold no window yet (a run that "
                         f"has just started: a LossScaleMonitor writes its first line after "
                         f"`interval` steps)")
    return MonitorRun(directory=directory, prefix=prefix, series=series, steps=steps)


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
