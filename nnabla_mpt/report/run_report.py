"""The report of a run: its series read, summarised and drawn.

Example:
    >>> import os, tempfile
    >>> from nnabla_mpt import read_report
    >>> run = tempfile.mkdtemp()
    >>> for key, lines in {"scale": "1 1024\\n3 512\\n", "skipped-steps": "1 0\\n3 1\\n",
    ...                    "overflow-rate": "1 0\\n3 0.5\\n"}.items():
    ...     with open(os.path.join(run, f"loss-scale-{key}.series.txt"), "w") as f:
    ...         _ = f.write(lines)
    >>> report = read_report(run)
    >>> report.summary.skipped, report.summary.steps, report.summary.per_thousand
    (1, 4, 250.0)
    >>> print(report.text().splitlines()[1])
      skipped steps: 1 of 4, 250.0 per thousand; in steps 2-3 (1)
"""
import os
from typing import Any, NamedTuple, Optional

import numpy as np

from .figure import GradientPoints, RunPicture, draw
from .series import MonitorRun, read_run
from .summary import RunSummary, Windows, summarize, windows_of


class LossScaleReport:
    """What the loss scale of a run did, from the series a
    :class:`~nnabla_mpt.LossScaleMonitor` wrote: a summary (:attr:`summary`, :meth:`text`)
    and a figure (:meth:`figure`, :meth:`save`). Made by :func:`read_report`.

    Attributes:
        run: The series read (``nnabla_mpt.report.series.MonitorRun``).
        summary: The numbers (:class:`~nnabla_mpt.report.summary.RunSummary`).
        picture: What the figure draws (:class:`~nnabla_mpt.report.figure.RunPicture`).
    """

    def __init__(self, run: MonitorRun) -> None:
        self.run = run
        windows = windows_of(run)
        self.summary: RunSummary = summarize(run, windows)
        self.picture: RunPicture = picture_of(run, windows)

    def text(self) -> str:
        """The summary, as ``python -m nnabla_mpt.report`` prints it."""
        return self.summary.text()

    def __str__(self) -> str:
        return self.text()

    def figure(self) -> Any:
        """The figure (a ``matplotlib.figure.Figure``): the scale with the windows of skipped
        steps and of growth points held by the ceiling, the overflow rate, and the gradient
        statistics where they were recorded.

        Raises:
            ImportError: matplotlib is not installed (``pip install ".[plot]"``).
        """
        return draw(self.picture)

    def save(self, path: str) -> str:
        """Draws the figure into ``path`` (PNG, or the format its suffix names), the summary
        in its description (a PNG's ``Description`` text chunk); returns ``path``."""
        draw(self.picture, os.fspath(path), description=self.text())
        return path

    def __repr__(self) -> str:
        return (f"<LossScaleReport of {self.run.directory!r} (prefix {self.run.prefix!r}): "
                f"steps {self.summary.first_step}-{self.summary.last_step}>")


def read_report(directory: str, prefix: str = "loss-scale") -> LossScaleReport:
    """The report of the run whose series ``LossScaleMonitor(Monitor(directory),
    prefix=prefix)`` wrote (a run in progress, or resumed into the same files, too).

    Args:
        directory: The ``Monitor``'s ``save_path``.
        prefix: The monitor's ``prefix``.

    Raises:
        FileNotFoundError, NotADirectoryError: ``directory`` is missing or is a file.
        ValueError: it holds no loss-scale series of ``prefix``, or a file there is not a
            ``MonitorSeries``; the message names the path.
    """
    return LossScaleReport(read_run(directory, prefix))


#: The most windows the figure draws one by one; more are drawn in as many bins.
MAX_BINS = 2000


def picture_of(run: MonitorRun, windows: Optional[Windows] = None,
               max_bins: int = MAX_BINS) -> RunPicture:
    """The :class:`RunPicture` of a run's series: a point per window, or, for more than
    ``max_bins`` windows, per bin of consecutive windows (the bin's scale range, its last
    scale and its overflow rate)."""
    w = windows_of(run) if windows is None else windows
    bins = binned(w, max_bins)
    after = ~bins.scaled                    # after the switch: no loss scale
    low, high = (np.where(after, np.nan, x) for x in (bins.low, bins.high))
    return RunPicture(
        title=f"loss scale of {run.directory} ({run.prefix})", steps=bins.last,
        scale=bins.scale,
        window=w.interval, skipped=bins.last[bins.skipped > 0],
        held_by_ceiling=bins.last[bins.held > 0], window_first=bins.first,
        window_last=bins.last, overflow_rate=bins.skipped / (bins.last - bins.first + 1),
        gradients=_gradients(run), switch=w.switch,
        scale_low=low if w.ranged else None, scale_high=high if w.ranged else None,
        binned=bins.windows > 1)


class Bins(NamedTuple):
    """Consecutive windows taken together: first and last step, skipped steps, growth
    points held by the ceiling, the last scale used (NaN after a precision switch), the
    smallest and largest scale, whether any step ran with a loss scale, and ``windows``,
    the most windows in a bin."""
    first: np.ndarray
    last: np.ndarray
    skipped: np.ndarray
    held: np.ndarray
    scale: np.ndarray
    low: np.ndarray
    high: np.ndarray
    scaled: np.ndarray
    windows: int


def binned(w: Windows, max_bins: int) -> Bins:
    """The windows of ``w`` in at most ``max_bins`` bins of as many windows each (the last
    may hold fewer); one window a bin where there are no more than ``max_bins``. The scale
    range of a bin is that of its windows that ran with a loss scale."""
    n = len(w.last)
    size = max(1, -(-n // max_bins))
    starts = np.arange(0, n, size)
    ends = np.minimum(starts + size, n) - 1
    scaled = w.scaled
    # the scale of a bin: that of its last window that ran with one (NaN after a switch)
    last_scaled = np.maximum.accumulate(np.where(scaled, np.arange(n), -1))[ends]
    scale = np.where(last_scaled >= starts, w.used_scale[np.maximum(last_scaled, 0)], np.nan)
    low = np.where(scaled, w.low, np.inf)
    high = np.where(scaled, w.high, -np.inf)
    return Bins(first=w.first[starts], last=w.last[ends],
                skipped=np.add.reduceat(w.skipped, starts),
                held=np.add.reduceat(w.held, starts),
                scale=scale, low=np.minimum.reduceat(low, starts),
                high=np.maximum.reduceat(high, starts),
                scaled=np.logical_or.reduceat(scaled, starts), windows=size)


def _gradients(run: MonitorRun) -> Optional[GradientPoints]:
    keys = ("gradient-zero-fraction", "gradient-subnormal-fraction", "gradient-headroom")
    if not all(k in run.series for k in keys):
        return None
    steps = run.series[keys[0]].steps
    zero, subnormal, headroom = (run.series[k].at(steps) for k in keys)
    return GradientPoints(steps=steps, zero_fraction=zero, subnormal_fraction=subnormal,
                          headroom=headroom)
