"""What a run's loss scale did, from its series: the numbers of the report, and its text.

How the numbers are made from the windows (the indices of the series, see
:mod:`nnabla_mpt.report.series`)::

    a window ends at its index and starts after the previous index (the first one
        `interval` steps back, at most to step 0); `interval` is the most common distance
        between indices
    skipped steps of a window = its overflow rate x its steps (the rate is k / n to six
        digits: exact); per thousand = 1000 x their sum / the steps the windows cover
    longest overflow streak: at least what the windows force (full windows in a row;
        k skips among n steps force ceil(k / (n - k + 1)) in a row), at most what they
        allow (a window's skips at its end, full windows, the next window's at its start);
        with windows of one step the two are the same
    where the scale sat: the steps at each scale, a window counted at its last step's (of
        its reduced-precision steps: after a precision switch no scale counts)
    what held it: growth points held by the loss dtype's ceiling (growth-held-by-ceiling),
        overflows after the first window, the last headroom (gradient-headroom)
"""
import math
import os
import textwrap
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..core.dtypes import FLOATS
from .series import MonitorRun


@dataclass(frozen=True)
class Windows:
    """The windows of a run, as arrays: first and last step, skipped steps, the scale of the
    last step, ``interval`` (the steps of a full window), the scale of the first step, the
    smallest and the largest (the last step's where the files do not record them:
    ``ranged`` False), the growth points held by the ceiling (0 where not recorded) and
    the float32 steps (None where not recorded)."""
    first: np.ndarray
    last: np.ndarray
    skipped: np.ndarray
    scale: np.ndarray
    interval: int
    scale_first: np.ndarray
    low: np.ndarray
    high: np.ndarray
    held: np.ndarray
    float32: Optional[np.ndarray] = None
    ranged: bool = False

    @property
    def steps(self) -> np.ndarray:
        return self.last - self.first + 1

    @property
    def switch(self) -> Optional[int]:
        """The first float32 step after steps in reduced precision (a precision schedule's
        switch, from which no loss scale is used), or None."""
        if self.float32 is None:
            return None
        at = np.flatnonzero(self.float32 > 0)
        if not at.size or (at[0] == 0 and self.float32[0] >= self.steps[0]):
            return None                     # none, or float32 from the first step on
        j = int(at[0])
        return int(self.last[j] - self.float32[j] + 1)

    @property
    def scaled(self) -> np.ndarray:
        """Which windows have steps that ran with a loss scale (all but those after a
        switch)."""
        switch = self.switch
        return np.ones(len(self.last), bool) if switch is None else self.first < switch

    @property
    def used_scale(self) -> np.ndarray:
        """The scale of each window's last step that ran with one (the monitor writes the
        last reduced-precision step's), NaN after a switch."""
        return np.where(self.scaled, self.scale, np.nan)

    @property
    def float32_throughout(self) -> bool:
        """Whether every step of every window ran in float32 (a float32 graph)."""
        return self.float32 is not None and bool((self.float32 >= self.steps).all())


def windows_of(run: MonitorRun) -> Windows:
    """The windows of ``run``: where each starts and how many of its steps were skipped."""
    last = run.steps
    # the most common distance between indices (the longer of two as common)
    gaps, counts = np.unique(np.diff(last), return_counts=True)
    interval = max(zip(counts.tolist(), gaps.tolist()))[1] if gaps.size else int(last[0]) + 1
    first = np.concatenate([[max(0, int(last[0]) - interval + 1)], last[:-1] + 1])
    rate = run.values("overflow-rate")
    skipped = np.rint(rate * (last - first + 1)).astype(np.int64)
    scale = run.values("scale")
    ranged = all(k in run.series for k in ("scale-first", "scale-min", "scale-max"))
    low, high, at_first = ((run.values("scale-min"), run.values("scale-max"),
                            run.values("scale-first")) if ranged else (scale, scale, scale))
    float32 = run.values("float32-steps")
    held = run.values("growth-held-by-ceiling")
    return Windows(first=first.astype(np.int64), last=last, skipped=skipped, scale=scale,
                   interval=int(interval), scale_first=at_first, low=low, high=high,
                   held=np.zeros(len(last)) if held is None else np.nan_to_num(held),
                   float32=None if float32 is None else float32.astype(np.int64),
                   ranged=ranged)


def streak_bounds(steps: np.ndarray, skipped: np.ndarray) -> Tuple[int, int]:
    """``(at least, at most)`` the longest run of skipped steps in a row, from the skipped
    steps of consecutive windows of ``steps`` steps each."""
    lower = upper = run = ending = 0       # ending: the longest run that may end a window
    previous = -2
    for j in np.flatnonzero(skipped > 0).tolist():   # a window without skips ends any run
        if j != previous + 1:
            run = ending = 0
        previous = j
        n, k = int(steps[j]), int(skipped[j])
        if k >= n:
            run += n
            ending += n
            lower = max(lower, run)
        else:
            if k:
                lower = max(lower, math.ceil(k / (n - k + 1)))
            upper = max(upper, ending + k)
            run, ending = 0, k
        upper = max(upper, ending)
    return lower, upper


@dataclass(frozen=True)
class RunSummary:
    """The numbers of a run's report.

    Attributes:
        directory, prefix: The series read.
        first_step, last_step: The first and last step the windows cover.
        windows: How many windows; ``interval``: the steps of a full one.
        skipped: Skipped steps; ``per_thousand``: per thousand steps covered.
        skipped_in: ``(first step, last step, skipped)`` of each window with skipped steps.
        streak: ``(at least, at most)`` the longest overflow streak, in steps.
        scale_first: The scale of the first step.
        scale_last: The scale of the last window's last step; with a precision switch
            (``switch``), the last scale used before it (:attr:`Windows.used_scale`).
        scale_min, scale_max: The smallest and largest scale of any step that ran with one
            (of the windows' last steps, where the files do not record the range:
            ``ranged`` False).
        scale_steps: ``(scale, steps)``: how many steps ran at each scale (a window counted
            at the scale of its last step that ran with one), the most first; the float32
            steps after a switch are not counted.
        last_change: The first and last step of the window where the scale took its last
            value, or None when it never changed.
        switch: The first float32 step of a precision schedule (no loss scale from there
            on), or None; ``float32_throughout``: every step ran in float32;
            ``precision_recorded``: the files record the float32 steps.
        held_by_ceiling: Growth points held by the loss dtype's ceiling,
            ``ceiling_windows`` the first and last steps of their windows and
            ``ceiling_scale`` the ceiling: the largest power of two of the narrowest float
            type that holds the scales from the first of them on (None without any).
        gradients: ``(step, zero fraction, subnormal fraction, headroom)`` of the last
            gradient statistics, or None; ``most_subnormal``: ``(step, fraction)`` of the
            largest subnormal fraction.
        rewritten: Lines whose index was written before (a rewound or resumed run).
        partial: The files whose last line was still being written.
        beyond: The series that went on after the last window all the series hold, by
            key: their last index (a file cut short, or a run still writing).
    """
    directory: str
    prefix: str
    first_step: int
    last_step: int
    windows: int
    interval: int
    skipped: int
    per_thousand: float
    skipped_in: List[Tuple[int, int, int]]
    streak: Tuple[int, int]
    scale_first: float
    scale_last: float
    scale_min: float
    scale_max: float
    scale_steps: List[Tuple[float, int]]
    last_change: Optional[Tuple[int, int]]
    held_by_ceiling: int
    ceiling_windows: List[Tuple[int, int]]
    ceiling_scale: Optional[float]
    gradients: Optional[Tuple[int, float, float, float]]
    most_subnormal: Optional[Tuple[int, float]]
    rewritten: int
    partial: List[str]
    switch: Optional[int] = None
    beyond: Dict[str, int] = field(default_factory=dict)
    float32_throughout: bool = False
    precision_recorded: bool = False
    ranged: bool = False

    @property
    def steps(self) -> int:
        """The steps the windows cover."""
        return self.last_step - self.first_step + 1

    def text(self) -> str:
        """The summary as the report prints it."""
        return summary_text(self)


def summarize(run: MonitorRun, windows: Optional[Windows] = None) -> RunSummary:
    """The :class:`RunSummary` of ``run`` (its ``windows``, when already made)."""
    w = windows_of(run) if windows is None else windows
    steps = int(w.steps.sum())
    scaled, switch, used = w.scaled, w.switch, w.used_scale
    counted = w.steps if switch is None else np.minimum(w.last + 1, switch) - w.first
    scales, at = np.unique(used[scaled], return_inverse=True)
    at_scale = dict(zip(scales.tolist(), np.bincount(at, counted[scaled]).astype(int).tolist()))
    return RunSummary(
        directory=run.directory, prefix=run.prefix, first_step=int(w.first[0]),
        last_step=int(w.last[-1]), windows=len(w.last), interval=w.interval,
        skipped=int(w.skipped.sum()), per_thousand=1000.0 * float(w.skipped.sum()) / steps,
        skipped_in=[(int(w.first[j]), int(w.last[j]), int(w.skipped[j]))
                    for j in np.flatnonzero(w.skipped)],
        streak=streak_bounds(w.steps, w.skipped),
        scale_first=float(w.scale_first[0]), scale_last=float(used[scaled][-1]),
        scale_min=float(w.low[scaled].min()), scale_max=float(w.high[scaled].max()),
        scale_steps=sorted(at_scale.items(), key=lambda item: -item[1]),
        last_change=_last_change(w), held_by_ceiling=int(w.held.sum()),
        ceiling_windows=[(int(w.first[j]), int(w.last[j])) for j in np.flatnonzero(w.held > 0)],
        ceiling_scale=_ceiling(w),
        gradients=_last_gradients(run), most_subnormal=_most_subnormal(run),
        rewritten=sum(s.rewritten for s in run.series.values()),
        partial=sorted(s.path for s in run.series.values() if s.partial),
        switch=switch, beyond=dict(run.beyond), float32_throughout=w.float32_throughout,
        precision_recorded=w.float32 is not None, ranged=w.ranged)


def _ceiling(w: Windows) -> Optional[float]:
    """The ceiling that held the scale: the smallest largest power of two of a float type
    that the scales from its first growth point on stay within (the scale of a window's last
    step may be the one a growth point started from, cut short at the ceiling)."""
    held = w.held > 0
    if not held.any():
        return None
    reached = float(np.nanmax(w.scale[int(np.argmax(held)):]))
    return min((f.max_power_of_two for f in FLOATS.values() if f.max_power_of_two >= reached),
               default=reached)


def _last_change(w: Windows) -> Optional[Tuple[int, int]]:
    """The window where the last scale used (:attr:`Windows.used_scale`) was first taken."""
    at = np.flatnonzero(w.scaled)
    scale = w.used_scale[at]
    changed = np.flatnonzero(scale[1:] != scale[:-1])
    if not changed.size:
        return None
    j = int(at[int(changed[-1]) + 1])
    return int(w.first[j]), int(w.last[j])


def _last_gradients(run: MonitorRun) -> Optional[Tuple[int, float, float, float]]:
    keys = ("gradient-zero-fraction", "gradient-subnormal-fraction", "gradient-headroom")
    if not all(k in run.series and run.series[k].steps.size for k in keys):
        return None
    step = int(run.series[keys[0]].steps[-1])
    return (step,) + tuple(float(run.series[k].at(np.array([step]))[0]) for k in keys)


def _most_subnormal(run: MonitorRun) -> Optional[Tuple[int, float]]:
    series = run.series.get("gradient-subnormal-fraction")
    if series is None or not series.steps.size:
        return None
    i = int(np.argmax(series.values))
    return int(series.steps[i]), float(series.values[i])


def wrap(text: str, width: int = 88) -> str:
    """One item of the summary: indented by two, continued by four."""
    return textwrap.fill(text, width=width, initial_indent="  ", subsequent_indent="    ",
                         break_long_words=False, break_on_hyphens=False)


def format_scale(scale: float) -> str:
    """A loss scale as text: whole numbers in full (16777216, not 1.67772e+07)."""
    return str(int(scale)) if float(scale).is_integer() else f"{scale:g}"


def plural(n: float, word: str) -> str:
    return f"{n:g} {word}" + ("" if n == 1 else "s")


def summary_text(s: RunSummary) -> str:
    """The text of :meth:`RunSummary.text`."""
    lines = [f"{s.prefix} series of {s.directory}: steps {s.first_step}-{s.last_step}, "
             f"{plural(s.windows, 'window')} of {plural(s.interval, 'step')}"]
    lines += [wrap(text) for text in (_skipped_text(s), _streak_text(s), _scale_text(s),
                                      _held_text(s))]
    if s.gradients is not None:
        lines.append(wrap(_gradient_text(s)))
    if s.rewritten:
        lines.append(wrap(f"note: {plural(s.rewritten, 'line')} wrote an index again (a run "
                          f"rewound, or resumed from a checkpoint into the same files): the "
                          f"value written last is used"))
    if s.partial:
        lines.append(wrap("note: a last line still being written (a run in progress) left "
                          "out of " + ", ".join(os.path.basename(p) for p in s.partial)))
    if s.beyond:
        ends = ", ".join(f"{key} at {last}" for key, last in sorted(s.beyond.items()))
        lines.append(wrap(f"note: the series end at different steps ({ends}; the others at "
                          f"{s.last_step}): the report covers the steps up to {s.last_step}, "
                          f"which all of them hold"))
    if not (s.ranged and s.precision_recorded):
        lines.append(wrap("note: these files record neither each window's first, smallest "
                          "and largest scale nor its float32 steps (a LossScaleMonitor of an "
                          "earlier version wrote them): the scales are those of the windows' "
                          "last steps, and a scale of 1 may be a switch to float32"))
    return "\n".join(lines)


def _ranges(windows: List[Tuple[int, int, int]], limit: int = 8) -> str:
    """The windows with skipped steps (first step, last step, skipped), adjacent windows of
    the same length and count joined: ``0-3 (4), 5-59 (1 in each of its 11 windows)``."""
    groups: List[List[int]] = []            # first, last, skipped in each, steps of each
    for first, last, k in windows:
        n = last - first + 1
        g = groups[-1] if groups else None
        if g and g[1] + 1 == first and g[2] == k and g[3] == n:
            g[1] = last
        else:
            groups.append([first, last, k, n])
    items = []
    for a, b, k, n in groups:
        where, m = (f"{a}" if a == b else f"{a}-{b}"), (b - a + 1) // n
        if k == n or m == 1:                # every step skipped, or one window
            items.append(f"{where} ({k * m})")
        else:
            items.append(f"{where} ({k} in each of its {m} windows)")
    if len(items) > limit:
        items = items[:limit] + [f"and {len(items) - limit} more"]
    return ", ".join(items)


def _skipped_text(s: RunSummary) -> str:
    if not s.skipped:
        return f"skipped steps: none of {s.steps}"
    return (f"skipped steps: {s.skipped} of {s.steps}, {s.per_thousand:.1f} per thousand; "
            f"in steps {_ranges(s.skipped_in)}")


def _streak_text(s: RunSummary) -> str:
    lower, upper = s.streak
    if not upper:
        return "longest overflow streak: none"
    if lower == upper:
        return f"longest overflow streak: {plural(upper, 'step')} in a row"
    return (f"longest overflow streak: between {lower} and {upper} steps in a row (the series "
            f"count the skipped steps of each window of {s.interval} steps, not where in it "
            f"they fell; a LossScaleMonitor with interval=1 tells it exactly)")


def _scale_text(s: RunSummary) -> str:
    sat = ", ".join(f"{format_scale(scale)} for {100 * n / s.steps:.0f}%"
                    for scale, n in s.scale_steps[:3])
    where = "" if s.ranged else " (at each window's last step)"
    last = "" if s.switch is None else " before the switch"
    text = (f"loss scale{where}: first {format_scale(s.scale_first)}, last{last} "
            f"{format_scale(s.scale_last)}, min {format_scale(s.scale_min)}, max "
            f"{format_scale(s.scale_max)}; it sat at {sat} of the steps")
    if s.last_change is None:
        text += ("; it never changed" if s.interval == 1 or s.ranged and
                 s.scale_min == s.scale_max else "; the same at every window's last step")
    else:
        text += (f"; at {format_scale(s.scale_last)} since the window of steps "
                 f"{s.last_change[0]}-{s.last_change[1]}")
    if s.switch is not None:
        float32 = s.last_step - s.switch + 1
        text += (f"; float32 from step {s.switch}: no loss scale ({100 * float32 / s.steps:.0f}% "
                 f"of the steps, after a precision schedule's switch)")
    elif s.float32_throughout:
        text += "; every step ran in float32 (a float32 graph, scaled all the same)"
    return text


def _held_text(s: RunSummary) -> str:
    parts = []
    later = [w for w in s.skipped_in if w[0] != s.first_step]   # after the first window
    room = None if s.gradients is None else s.gradients[3]
    if later:
        parts.append(f"the gradients: {plural(sum(k for _, _, k in later), 'overflow')} "
                     f"after the first window (in steps {later[0][0]}-{later[-1][1]}), each "
                     f"backing the scale off")
    elif room is not None and math.isfinite(room) and room <= 1:
        parts.append(f"the gradients: {plural(room, 'power')} of two of headroom at step "
                     f"{s.gradients[0]}")
    if s.held_by_ceiling:
        parts.append(f"the loss dtype's ceiling, {format_scale(s.ceiling_scale)}, at "
                     f"{plural(s.held_by_ceiling, 'growth point')} (in steps "
                     f"{s.ceiling_windows[0][0]}-{s.ceiling_windows[-1][1]}), not the "
                     f"gradients: a loss built in float32 lifts it")
    if parts:
        return "what held it: " + "; ".join(parts)
    text = ("what held it: nothing the series record (no overflow after the first window, "
            "no growth point held by the loss dtype's ceiling")
    if room is not None:
        text += f"; headroom {room:g} at step {s.gradients[0]}"
    return text + ")"


def _gradient_text(s: RunSummary) -> str:
    step, zero, subnormal, room = s.gradients
    if room == -math.inf:
        room_text = "-inf (a gradient held inf or NaN: the step was skipped)"
    elif room == math.inf:
        room_text = "inf (every gradient was zero)"
    else:
        room_text = f"{plural(room, 'power')} of two"
    text = (f"gradient statistics, last at step {step}: {100 * zero:.2f}% zero, "
            f"{100 * subnormal:.2f}% subnormal, headroom {room_text}")
    if s.most_subnormal is not None and s.most_subnormal[1] > subnormal:
        text += (f"; the most subnormal {100 * s.most_subnormal[1]:.2f}% at step "
                 f"{s.most_subnormal[0]}")
    return text
