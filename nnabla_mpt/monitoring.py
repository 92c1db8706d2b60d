"""Watching the loss scale while training: step hooks for the updaters.

An updater created with ``monitor=hook`` calls ``hook(result)`` once per step, after the step
is complete, with the step's :class:`~nnabla_mpt.StepResult`. Any callable taking one
argument is a hook. This module offers three that summarise the steps every ``interval``
steps:

* :class:`LossScaleCallback` calls a function of yours with a :class:`LossScaleStats`.
* :class:`LossScaleMonitor` writes the loss scale, the skipped steps and the overflow rate
  as ``nnabla.monitor.MonitorSeries`` files (``python -m nnabla_mpt.report`` reads them
  back into a summary and a figure).
* :class:`LossScaleTensorBoard` writes the same series as TensorBoard scalars.

Windows follow the updater's step index: a summary is made after every step whose index
``i`` satisfies ``(i + 1) % interval == 0``, so summaries land on the same steps whether the
run is fresh or resumed from a checkpoint. :meth:`LossScaleCallback.flush` summarises the
steps of an unfinished window, for the end of a run.

This module does not import nnabla until a :class:`LossScaleMonitor` is created, nor
tensorboardX until a :class:`LossScaleTensorBoard` is.

Example:
    >>> from nnabla_mpt import LossScaleCallback, StepResult
    >>> seen = []
    >>> hook = LossScaleCallback(seen.append, interval=2)
    >>> hook(StepResult(step=0, skipped=True, scale=1024.0, next_scale=512.0))
    >>> hook(StepResult(step=1, skipped=False, scale=512.0, next_scale=512.0))
    >>> seen[0].step, seen[0].skipped, seen[0].overflow_rate, seen[0].scale
    (1, 1, 0.5, 512.0)
"""
import contextlib
import itertools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from .core import _validate as check
from .files.writable import writable_folder

#: Numbers the event files of the process's LossScaleTensorBoard writers.
_WRITERS = itertools.count(1)

if TYPE_CHECKING:  # pragma: no cover
    from .scale.gradient_stats import GradientStats
    from .step.decision import StepResult


@dataclass(frozen=True)
class LossScaleStats:
    """A summary of the steps of one window.

    Attributes:
        step: Index of the last step of the window (the updater's step index, from 0).
        steps: Steps in the window: ``interval``, or fewer for the first window of a hook
            attached mid-run and for :meth:`LossScaleCallback.flush`.
        skipped: Skipped (overflowing) steps in the window.
        total_steps: Steps the hook has seen since it was created.
        total_skipped: Skipped steps of the run up to the window's end: the updater's
            ``skipped_steps`` (``StepResult.skipped_steps``), which a run resumed from a
            checkpoint goes on from; for results made by hand, those the hook has seen.
        scale: The loss scale the last step of the window ran with (its last
            reduced-precision step's, where it has any: see below).
        next_scale: The loss scale of the step after the window.
        min_scale: The smallest loss scale a step of the window ran with.
        max_scale: The largest loss scale a step of the window ran with.
        gradient_stats: The last gradient statistics a step of the window carried
            (``StepResult.gradient_stats``, see ``gradient_stats_every``), or None.
        held_by_ceiling: Growth points of the window where the loss dtype's ceiling, not
            the gradients, held the scale (``StepResult.held_by == "ceiling"``).
        first_scale: The loss scale the first step of the window ran with.
        float32_steps: Steps of the window that ran in full precision
            (``StepResult.precision == "float"``): all of them in a float32 graph, those
            from the switch on with a precision schedule (which run with no loss scale).

    In a window with steps in reduced precision, :attr:`scale`, :attr:`min_scale` and
    :attr:`max_scale` are those of these steps: after a precision schedule's switch to
    float32 the steps run at scale 1, which is no loss scale, and a window holding the
    switch keeps the scales used before it.
    """
    step: int
    steps: int
    skipped: int
    total_steps: int
    total_skipped: int
    scale: float
    next_scale: float
    min_scale: float
    max_scale: float
    gradient_stats: Optional[Dict[str, "GradientStats"]] = None
    held_by_ceiling: int = 0
    first_scale: Optional[float] = None
    float32_steps: int = 0

    @property
    def overflow_rate(self) -> float:
        """Fraction of the window's steps that overflowed: ``skipped / steps``."""
        return self.skipped / self.steps


class LossScaleCallback:
    """A step hook that calls ``callback(stats)`` every ``interval`` steps.

    Pass it to an updater as ``monitor=``. ``stats`` is a :class:`LossScaleStats`.

    Args:
        callback: Called with one :class:`LossScaleStats` at the end of every window.
        interval: Steps per window; ``>= 1``.

    Raises:
        TypeError, ValueError: an argument is not valid; the message names it.
    """

    def __init__(self, callback: Callable[[LossScaleStats], Any], interval: int = 100) -> None:
        if not callable(callback):
            raise TypeError(f"callback must be callable with one LossScaleStats argument, "
                            f"got {callback!r} of type {type(callback).__name__}")
        self.callback = callback
        self.interval = check.integer("interval", interval, ge=1)
        self.total_steps = 0
        self.total_skipped = 0
        self._last: Optional["StepResult"] = None
        self._reset_window()

    def _reset_window(self) -> None:
        self._steps = 0
        self._skipped = 0
        self._first: Optional[float] = None
        self._float_range = [float("inf"), float("-inf")]     # of the full-precision steps
        self._reduced_range = [float("inf"), float("-inf")]   # of the reduced-precision ones
        self._float32 = 0
        self._reduced_last = float("nan")                     # the last reduced one's
        self._gradient_stats = None
        self._held_by_ceiling = 0

    def __call__(self, result: "StepResult") -> None:
        """Counts one step; at the end of a window, calls the callback."""
        if self._last is not None and result.step <= self._last.step:
            # The updater was rewound (e.g. a checkpoint was loaded): start a new window.
            self._reset_window()
        self._last = result
        self._steps += 1
        self.total_steps += 1
        if result.skipped:
            self._skipped += 1
            self.total_skipped += 1
        if result.skipped_steps is not None:
            self.total_skipped = result.skipped_steps
        scale = result.scale
        if self._first is None:
            self._first = scale
        if result.precision == "float":
            self._float32 += 1
            r = self._float_range
        else:
            r = self._reduced_range
            self._reduced_last = scale
        r[0] = min(r[0], scale)
        r[1] = max(r[1], scale)
        if result.gradient_stats is not None:
            self._gradient_stats = result.gradient_stats
        if result.held_by == "ceiling":
            self._held_by_ceiling += 1
        if (result.step + 1) % self.interval == 0:
            self._emit()

    def flush(self) -> Optional[LossScaleStats]:
        """Summarises the steps of the current, unfinished window now.

        Returns:
            The :class:`LossScaleStats` passed to the callback, or None when the window holds
            no step.
        """
        if self._steps == 0:
            return None
        return self._emit()

    def _emit(self) -> LossScaleStats:
        last = self._last
        reduced = self._float32 < self._steps
        low, high = self._reduced_range if reduced else self._float_range   # all, if none
        stats = LossScaleStats(step=last.step, steps=self._steps, skipped=self._skipped,
                               total_steps=self.total_steps, total_skipped=self.total_skipped,
                               scale=self._reduced_last if reduced else last.scale,
                               next_scale=last.next_scale,
                               min_scale=low, max_scale=high,
                               gradient_stats=self._gradient_stats,
                               held_by_ceiling=self._held_by_ceiling,
                               first_scale=self._first, float32_steps=self._float32)
        self._reset_window()
        self.callback(stats)
        return stats

    def __repr__(self) -> str:
        return f"{type(self).__name__}(callback={self.callback!r}, interval={self.interval})"


class LossScaleMonitor(LossScaleCallback):
    """A step hook writing loss-scale series with ``nnabla.monitor``.

    Every ``interval`` steps it adds one line ``<step index> <value>`` to each of seven
    ``MonitorSeries`` files in ``monitor.save_path``:

    * ``<prefix>-scale.series.txt``: the loss scale the window's last step ran with (its
      last reduced-precision step's, where it has any: see :class:`LossScaleStats`);
    * ``<prefix>-skipped-steps.series.txt``: skipped steps of the run so far (the
      updater's ``skipped_steps``, restored with a checkpoint: see :class:`LossScaleStats`);
    * ``<prefix>-overflow-rate.series.txt``: fraction of the window's steps that overflowed;
    * ``<prefix>-scale-first.series.txt``, ``-scale-min`` and ``-scale-max``: the scale
      of the window's first step, the smallest and the largest (see :class:`LossScaleStats`);
    * ``<prefix>-float32-steps.series.txt``: steps of the window that ran in full
      precision (after a precision schedule's switch, with no loss scale).

    When a step of the window carried gradient statistics (the updater's
    ``gradient_stats_every``), three more, over all the parameters' gradients together
    (the last statistics of the window):

    * ``<prefix>-gradient-zero-fraction.series.txt``: fraction of gradient values that are
      exactly zero (inf and NaN are not);
    * ``<prefix>-gradient-subnormal-fraction.series.txt``: fraction that are subnormal;
    * ``<prefix>-gradient-headroom.series.txt``: the smallest headroom of any parameter,
      in powers of two (see :class:`~nnabla_mpt.GradientStats`).

    From the first window where the loss dtype's ceiling, not the gradients, held the
    scale at a growth point of measured growth (``StepResult.held_by``), one more:

    * ``<prefix>-growth-held-by-ceiling.series.txt``: such growth points in the window.

    ``MonitorSeries`` writes values with ``%g``, that is six significant digits.

    Args:
        monitor: An ``nnabla.monitor.Monitor`` (the output directory).
        interval: Steps per window; ``>= 1``.
        prefix: Start of the series names; a non-empty file name without path separators.
        verbose: Also log every value with nnabla's logger (``MonitorSeries(verbose=...)``).
        append: Add to the lines the files hold, for a run resumed from a checkpoint in a
            new process: the series go on in the same files (a line the earlier process
            left half written is dropped; an index written again counts with its last
            value in ``python -m nnabla_mpt.report``). By default the files start empty, as
            every ``MonitorSeries``'s do.

    Raises:
        TypeError, ValueError: an argument is not valid; the message names it.
    """

    def __init__(self, monitor: Any, interval: int = 100, prefix: str = "loss-scale",
                 verbose: bool = False, *, append: bool = False) -> None:
        from nnabla.monitor import Monitor

        if not isinstance(monitor, Monitor):
            raise TypeError(f"monitor must be an nnabla.monitor.Monitor, got {monitor!r} of "
                            f"type {type(monitor).__name__}")
        self._verbose = check.boolean("verbose", verbose)
        super().__init__(self._write, interval)
        self.monitor = monitor
        self.prefix = checked_prefix(prefix)
        self.append = check.boolean("append", append)
        self.series = {}
        for key in ("scale", "skipped-steps", "overflow-rate", "scale-first", "scale-min",
                    "scale-max", "float32-steps"):
            self._add_series(key)

    def _add_series(self, key: str) -> Any:
        from nnabla.monitor import MonitorSeries
        name = f"{self.prefix}-{key}"
        # given the monitor, MonitorSeries empties the file: appending, given the path only
        series = MonitorSeries(name, None if self.append else self.monitor, interval=1,
                               verbose=self._verbose)
        if self.append:
            series.sp = os.path.join(self.monitor.save_path,
                                     name.replace(" ", "-") + ".series.txt")
            drop_partial_line(series.sp)
        self.series[key] = series
        return series

    def _write(self, stats: LossScaleStats) -> None:
        for key, value in series_values(stats, "growth-held-by-ceiling" in self.series):
            # the gradient and ceiling series appear with their first values
            series = self.series.get(key) or self._add_series(key)
            # After a rewind the index may repeat; MonitorSeries would otherwise hold it back.
            series.flush_at = min(series.flush_at, stats.step - 1)
            series.add(stats.step, value)

    def __repr__(self) -> str:
        return (f"LossScaleMonitor(monitor=Monitor({self.monitor.save_path!r}), "
                f"interval={self.interval}, prefix={self.prefix!r}"
                + (", append=True)" if self.append else ")"))


def drop_partial_line(path: str) -> None:
    """Cuts a last line without its newline (half written when a run stopped) off the file
    at ``path``, if there is one."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


class LossScaleTensorBoard(LossScaleCallback):
    """A step hook writing the loss-scale series as TensorBoard scalars (with tensorboardX).

    Every ``interval`` steps it adds the scalars ``<prefix>/<key>`` of the series a
    :class:`LossScaleMonitor` writes, ``<key>`` the part of the file's name after the
    prefix, at ``global_step`` the index the monitor writes: the window's last step.
    With gradient statistics, each parameter's too,
    grouped by parameter: ``<prefix>/gradients/<parameter>/zero-fraction``,
    ``.../subnormal-fraction`` and ``.../headroom``.

    Given a directory, the hook makes its ``tensorboardX.SummaryWriter`` at the first step
    it sees, with ``purge_step`` that step, and a new one after a rewind (a checkpoint of an
    earlier step loaded): TensorBoard drops the points from that step on that the files
    held, and the curves of a resumed run go on from where it resumed. Given a writer, the
    hook writes with it; when you resume, make it with ``purge_step=`` the first step.

    Args:
        logdir: A directory (a str or a path), or a ``tensorboardX.SummaryWriter`` (any
            object with ``add_scalar(tag, value, global_step=...)``).
        interval: Steps per window; ``>= 1``.
        prefix: Start of the tags; a non-empty name without path separators.

    Raises:
        ImportError: tensorboardX is not installed; the message says how to install it.
        OSError: the directory cannot be made or written to (checked here, not at the
            first step).
        TypeError, ValueError: an argument is not valid; the message names it.
    """

    def __init__(self, logdir: Any, interval: int = 100, prefix: str = "loss-scale") -> None:
        try:
            import tensorboardX  # noqa: F401
        except ImportError as err:
            raise ImportError("LossScaleTensorBoard writes with tensorboardX, which is not "
                              "installed: pip install tensorboardX (from a checkout of "
                              "nnabla_mpt: pip install \".[tensorboard]\")") from err
        if isinstance(logdir, (str, os.PathLike)):
            self.logdir, self.writer = os.fspath(logdir), None
            writable_folder("logdir", self.logdir)
        elif callable(getattr(logdir, "add_scalar", None)):
            self.logdir, self.writer = None, logdir
        else:
            raise TypeError(f"logdir must be a directory or a tensorboardX.SummaryWriter, got "
                            f"{logdir!r} of type {type(logdir).__name__}")
        super().__init__(self._write, interval)
        self.prefix = checked_prefix(prefix)
        self._ceiling_seen = False

    def __call__(self, result: "StepResult") -> None:
        """Counts one step (a writer of its own made at the first step and after a rewind);
        at the end of a window, writes its scalars."""
        rewound = self._last is not None and result.step <= self._last.step
        if self.logdir is not None and (self.writer is None or rewound):
            self._open(result.step)
        super().__call__(result)

    def _open(self, step: int) -> None:
        from tensorboardX import SummaryWriter

        if self.writer is not None:
            self.writer.close()
        # A file name of its own, in the order written: two writers of one second share one.
        self.writer = SummaryWriter(self.logdir, purge_step=step,
                                    filename_suffix=f".{os.getpid()}.{next(_WRITERS):06d}")

    def _write(self, stats: LossScaleStats) -> None:
        add = self.writer.add_scalar
        for key, value in series_values(stats, self._ceiling_seen):
            add(f"{self.prefix}/{key}", value, global_step=stats.step)
        self._ceiling_seen = self._ceiling_seen or stats.held_by_ceiling > 0
        for name, s in (stats.gradient_stats or {}).items():
            for key, value in (("zero-fraction", s.zero_fraction),
                               ("subnormal-fraction", s.subnormal_fraction),
                               ("headroom", s.headroom)):
                add(f"{self.prefix}/gradients/{name}/{key}", value, global_step=stats.step)

    def flush(self) -> Optional[LossScaleStats]:
        """Summarises the unfinished window, as :meth:`LossScaleCallback.flush`, and writes
        what the writer holds to its file."""
        stats = super().flush()
        if self.writer is not None and hasattr(self.writer, "flush"):
            self.writer.flush()
        return stats

    def close(self) -> Optional[LossScaleStats]:
        """:meth:`flush`, then closes the writer the hook made (not one given to it)."""
        stats = self.flush()
        if self.logdir is not None and self.writer is not None:
            self.writer.close()
            self.writer = None
        return stats

    def __repr__(self) -> str:
        where = self.logdir if self.logdir is not None else self.writer
        return (f"LossScaleTensorBoard({where!r}, interval={self.interval}, "
                f"prefix={self.prefix!r})")


def series_values(stats: LossScaleStats, ceiling_seen: bool) -> List[Tuple[str, float]]:
    """``(key, value)`` of each series a window writes: the scale, the skipped steps, the
    overflow rate, the first, smallest and largest scale and the float32 steps; the
    gradient statistics over all the parameters when the window
    carried some; the growth points held by the ceiling from the first (``ceiling_seen``:
    a window before this one had some)."""
    values = [("scale", stats.scale), ("skipped-steps", stats.total_skipped),
              ("overflow-rate", stats.overflow_rate), ("scale-first", stats.first_scale),
              ("scale-min", stats.min_scale), ("scale-max", stats.max_scale),
              ("float32-steps", stats.float32_steps)]
    if stats.gradient_stats:
        from .scale.gradient_stats import overall
        together = overall(stats.gradient_stats)
        values += [("gradient-zero-fraction", together.zero_fraction),
                   ("gradient-subnormal-fraction", together.subnormal_fraction),
                   ("gradient-headroom", together.headroom)]
    if stats.held_by_ceiling or ceiling_seen:
        values.append(("growth-held-by-ceiling", stats.held_by_ceiling))
    return values


def checked_prefix(prefix: Any) -> str:
    """The ``prefix`` option checked: a non-empty file name without path separators."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {prefix!r} of type "
                        f"{type(prefix).__name__}")
    if not prefix.strip() or "/" in prefix or os.sep in prefix:
        raise ValueError(f"prefix must be a non-empty file name without path separators, "
                         f"got {prefix!r}")
    return prefix


def checked_step_hook(name: str, monitor: Any) -> Any:
    """The ``monitor`` option checked: None or a callable (a bare nnabla Monitor is refused
    with how to wrap it)."""
    if monitor is None or callable(monitor):
        return monitor
    hint = ""
    if hasattr(monitor, "save_path"):
        hint = (" (wrap an nnabla.monitor.Monitor in nnabla_mpt.LossScaleMonitor: "
                "monitor=LossScaleMonitor(Monitor(path), interval=100))")
    raise TypeError(f"{name} must be None or a callable taking one StepResult, got "
                    f"{monitor!r} of type {type(monitor).__name__}{hint}")
