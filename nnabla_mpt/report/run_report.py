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
from typing import Any, Optional

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
        """Draws the figure into ``path`` (PNG), the summary in its ``Description`` text
        chunk; returns ``path``."""
        draw(self.picture, os.fspath(path), metadata={"Title": self.picture.title,
                                                      "Description": self.text()})
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


def picture_of(run: MonitorRun, windows: Optional[Windows] = None) -> RunPicture:
    """The :class:`RunPicture` of a run's series: a point per window."""
    w = windows_of(run) if windows is None else windows
    held = run.values("growth-held-by-ceiling")
    held_at = w.last[np.nan_to_num(held) > 0] if held is not None else np.zeros(0)
    return RunPicture(
        title=f"loss scale of {run.directory} ({run.prefix})", steps=w.last, scale=w.scale,
        window=w.interval, skipped=w.last[w.skipped > 0], held_by_ceiling=held_at,
        window_first=w.first, window_last=w.last, overflow_rate=w.skipped / w.steps,
        gradients=_gradients(run))


def _gradients(run: MonitorRun) -> Optional[GradientPoints]:
    keys = ("gradient-zero-fraction", "gradient-subnormal-fraction", "gradient-headroom")
    if not all(k in run.series for k in keys):
        return None
    steps = run.series[keys[0]].steps
    zero, subnormal, headroom = (run.series[k].at(steps) for k in keys)
    return GradientPoints(steps=steps, zero_fraction=zero, subnormal_fraction=subnormal,
                          headroom=headroom)
