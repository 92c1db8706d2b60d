"""The figure of a run: the loss scale with its skipped steps and held growth points, the
overflow rate, the gradient statistics and the loss, over the steps.

One drawing for two sources: the report builds a :class:`RunPicture` from a run's monitor
series (a point per window), the demo (``examples/digits_demo.py``) from its steps (a point
per step, and the loss of a float reference run). A panel is drawn when the picture has its
data: the loss (``losses``), the scale (always), the overflow rate (``overflow_rate``) and
the gradient statistics (``gradients``).

matplotlib is imported when a figure is drawn. The figure is a ``matplotlib.figure.Figure``
made without pyplot: drawing one changes no global state, and a notebook shows the one
returned.
"""
import os
from dataclasses import dataclass, field
from typing import Any, Optional, Tuple

import numpy as np

from ..core.dtypes import FLOATS

FP16 = FLOATS["float16"]
#: How high each panel is, relative to the others.
HEIGHTS = {"loss": 3.0, "scale": 2.5, "rate": 1.3, "gradients": 2.0}


def _empty() -> np.ndarray:
    return np.zeros(0, dtype=np.float64)


@dataclass(frozen=True)
class Curve:
    """A loss curve of the loss panel: drawn raw (faint) and smoothed."""
    label: str
    steps: np.ndarray
    values: np.ndarray
    color: str


@dataclass(frozen=True)
class GradientPoints:
    """Gradient statistics over all the gradients at some steps: the zero and subnormal
    fractions (0 to 1) and the headroom in powers of two (inf and -inf are not drawn)."""
    steps: np.ndarray
    zero_fraction: np.ndarray
    subnormal_fraction: np.ndarray
    headroom: np.ndarray


@dataclass(frozen=True)
class RunPicture:
    """What the figure shows, as arrays over the steps.

    Attributes:
        title: Above the first panel.
        steps: The steps where the scale is known: every step, or each window's last.
        scale: The scale at ``steps``; NaN where no scale was used (after a precision
            schedule's switch to float32).
        window: Steps per point: 1 when ``steps`` holds every step, else the windows'
            length (the monitor's ``interval``); the labels say which.
        skipped: Skipped steps; with windows, the last steps of windows with skipped steps.
        held: Growth points where the gradients held the scale (known per step only).
        held_by_ceiling: Growth points held by the loss dtype's ceiling (with windows, the
            last steps of their windows).
        window_first, window_last, overflow_rate: The windows and their overflow rates
            (0 to 1), for the overflow-rate panel; None: no such panel.
        gradients: The gradient statistics; None: no such panel.
        float32_gradients: Those of float32 steps after a precision schedule's switch.
        losses: Loss curves; the first gets the skipped steps' marks. Empty: no loss panel.
        switch: The first float32 step of a precision schedule, or None.
        dtype: The dtype of the loss and the gradients when known (``"fp16"``), for labels.
        scale_low, scale_high: With windows, the smallest and largest scale of each
            (NaN after a switch), drawn as a band; None: not known.
        binned: Whether each point stands for several windows (a long run): the labels
            say "bin" instead of "window".
    """
    title: str
    steps: np.ndarray
    scale: np.ndarray
    window: int = 1
    skipped: np.ndarray = field(default_factory=_empty)
    held: np.ndarray = field(default_factory=_empty)
    held_by_ceiling: np.ndarray = field(default_factory=_empty)
    window_first: Optional[np.ndarray] = None
    window_last: Optional[np.ndarray] = None
    overflow_rate: Optional[np.ndarray] = None
    gradients: Optional[GradientPoints] = None
    float32_gradients: Optional[GradientPoints] = None
    losses: Tuple[Curve, ...] = ()
    switch: Optional[int] = None
    dtype: Optional[str] = None
    scale_low: Optional[np.ndarray] = None
    scale_high: Optional[np.ndarray] = None
    binned: bool = False

    def scale_at(self, steps: np.ndarray) -> np.ndarray:
        """The scale at ``steps`` (steps of ``self.steps``)."""
        steps = np.asarray(steps, dtype=np.int64)
        return self.scale[np.searchsorted(self.steps, steps)] if steps.size else _empty()


#: The text fields each format keeps: the summary goes where a description goes.
_METADATA = {"png": ("Title", "Description"), "svg": ("Title", "Description"),
             "svgz": ("Title", "Description"), "pdf": ("Title", "Subject"),
             "eps": ("Title", None), "ps": ("Title", None)}


def figure_formats() -> Optional[Tuple[str, ...]]:
    """The file suffixes matplotlib writes a figure in (without the dot), or None where
    matplotlib is not installed."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return None
    return tuple(sorted(FigureCanvasBase.get_supported_filetypes()))


def draw(picture: RunPicture, path: Optional[str] = None,
         description: Optional[str] = None) -> Any:
    """Draws ``picture``; saves it to ``path`` (at 100 dpi, in the format its suffix names,
    with the picture's title and ``description`` where the format keeps them) when given.

    Returns:
        The ``matplotlib.figure.Figure``.

    Raises:
        ImportError: matplotlib is not installed; the message says how to install it.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError("drawing the figure needs matplotlib, which is not installed: "
                          "pip install matplotlib (from a checkout of nnabla_mpt: "
                          "pip install \".[plot]\")") from err
    panels = (["loss"] if picture.losses else []) + ["scale"]
    panels += ["rate"] if picture.overflow_rate is not None else []
    panels += ["gradients"] if picture.gradients is not None else []
    heights = [HEIGHTS[p] for p in panels]
    fig = Figure(figsize=(9, 9.5 * sum(heights) / 7))
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": heights})[:, 0]
    for name, ax in zip(panels, axes):
        PANELS[name](ax, picture)
    axes[0].set_title(picture.title)
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    if path is not None:
        keys = _METADATA.get(os.path.splitext(path)[1][1:].lower(), ())
        kept = {key: value for key, value in zip(keys, (picture.title, description))
                if key and value is not None}
        fig.savefig(path, dpi=100, metadata=kept or None)
    return fig


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average (same length as ``values``)."""
    values = np.asarray(values, dtype=np.float64)
    window = max(1, min(window, len(values)))
    csum = np.cumsum(np.insert(values, 0, 0.0))
    out = np.empty_like(values)
    out[window - 1:] = (csum[window:] - csum[:-window]) / window
    out[:window - 1] = csum[1:window] / np.arange(1, window)
    return out


def mark_switch(ax: Any, switch: Optional[int], label: bool = False) -> None:
    """A precision schedule's switch to float32: a vertical line at its first float32
    step (in the legend when ``label``)."""
    if switch is not None:
        ax.axvline(switch, color="black", ls="-.", lw=1.2,
                   label=f"switch to float32 (step {switch})" if label else None)


def loss_panel(ax: Any, pic: RunPicture) -> None:
    """The loss curves, raw and smoothed, the skipped steps marked on the first, and a
    precision schedule's switch."""
    for curve in pic.losses:
        ax.plot(curve.steps, curve.values, color=curve.color, alpha=0.25, lw=0.8)
    for curve in pic.losses:
        ax.plot(curve.steps, smooth(curve.values, max(1, len(curve.steps) // 50)),
                color=curve.color, label=curve.label)
    first = pic.losses[0]
    if len(pic.skipped):
        at = np.searchsorted(first.steps, pic.skipped.astype(np.int64))
        ax.scatter(first.steps[at], np.asarray(first.values)[at], marker="x", color="tab:red",
                   zorder=3, label="skipped step" + (f" ({pic.dtype})" if pic.dtype else ""))
    mark_switch(ax, pic.switch, label=True)
    ax.set_yscale("log")
    ax.set_ylabel("training loss per example")
    ax.legend(loc="upper right")
    ax.grid(True, which="both", alpha=0.3)


def scale_panel(ax: Any, pic: RunPicture) -> None:
    """The loss scale (log2 y), overflows and held growth points marked, and the two
    float16 ceilings: its largest number and the largest scale a float16 loss can seed.
    After a precision schedule's switch no scale is used: the line ends there."""
    per_step = pic.window == 1
    if pic.switch is not None:
        ax.axvspan(pic.switch, pic.steps[-1] + 1, color="gray", alpha=0.12, lw=0)
        ax.text(pic.switch + 0.01 * len(pic.steps), 0.5, "float32:\nno loss scale used",
                fontsize="small", va="center", transform=ax.get_xaxis_transform())
    unit = "bin" if pic.binned else "window"
    scale_line(ax, pic, unit)
    if len(pic.skipped):
        ax.scatter(pic.skipped, pic.scale_at(pic.skipped), marker="x", color="tab:red",
                   zorder=3, label="overflow: step skipped" if per_step
                   else f"{unit} with skipped steps")
    ceiling = ("held by the {} seed's ceiling".format(pic.dtype) if pic.dtype
               else "held by the loss dtype's ceiling")
    if len(pic.held):
        ax.scatter(pic.held, pic.scale_at(pic.held), marker="o", facecolors="none",
                   color="tab:gray", zorder=3, label="growth due, held by the gradients"
                   if len(pic.held_by_ceiling) else "growth due, scale held")
    if len(pic.held_by_ceiling):
        ax.scatter(pic.held_by_ceiling, pic.scale_at(pic.held_by_ceiling), marker="s",
                   facecolors="none", color="tab:olive", zorder=3,
                   label=("growth due, " if per_step else f"{unit} with growth ") + ceiling)
    ax.axhline(FP16.max, color="gray", ls="--", lw=0.8, label="largest fp16 number (65504)")
    # above the scale's line: a scale held there shows both (green under olive dots)
    ax.axhline(FP16.max_power_of_two, color="tab:olive", ls=":", lw=1.4, zorder=3,
               label="largest scale an fp16 loss can seed (2**15 = 32768)")
    mark_switch(ax, pic.switch, label=True)
    ax.set_yscale("log", base=2)
    ax.set_ylabel("loss scale")
    scales = pic.scale[np.isfinite(pic.scale)]
    if pic.scale_low is not None:
        scales = np.concatenate([scales, pic.scale_low[np.isfinite(pic.scale_low)],
                                 pic.scale_high[np.isfinite(pic.scale_high)]])
    if scales.size:             # room below the lowest scale for the legend
        low, high = np.log2(scales.min()), np.log2(max(scales.max(), FP16.max))
        ax.set_ylim(2.0 ** (low - 0.8 * (high - low + 2)), 2.0 ** (high + 0.5))
    if pic.switch is None:
        ax.legend(loc="lower center", ncol=2, fontsize="small")
    else:                       # one column, left of the band, which holds its own text
        ax.legend(loc="lower left", ncol=1, fontsize="x-small")
    ax.grid(True, which="both", alpha=0.3)


def scale_line(ax: Any, pic: RunPicture, unit: str) -> None:
    """The scale of every step, or of each window's last step over the window's steps,
    with the window's range as a band where it is known."""
    if pic.window == 1:
        ax.step(pic.steps, pic.scale, where="post", color="tab:green", lw=1.8, zorder=2.5,
                label="loss scale used")
        return
    x = np.column_stack([pic.window_first, pic.window_last + 1]).ravel()
    if pic.scale_low is not None:
        low, high = (np.repeat(v, 2) for v in (pic.scale_low, pic.scale_high))
        ax.fill_between(x, low, high, where=np.isfinite(low) & np.isfinite(high),
                        color="tab:green", alpha=0.25, lw=0,
                        label=f"loss scale: range of each {unit}")
    ax.plot(x, np.repeat(pic.scale, 2), color="tab:green", lw=1.8, zorder=2.5,
            label=f"loss scale at each {unit}'s last step")


def rate_panel(ax: Any, pic: RunPicture) -> None:
    """The overflow rate of each window (or bin of windows) over its steps: one filled
    outline (windows follow each other without a gap)."""
    edges = np.append(pic.window_first, pic.window_last[-1] + 1)
    unit = "bin" if pic.binned else "window"
    ax.stairs(100 * np.asarray(pic.overflow_rate), edges, fill=True, color="tab:red",
              alpha=0.6, label=f"skipped steps of the {unit} (%)")
    mark_switch(ax, pic.switch)
    top = 100 * float(np.max(pic.overflow_rate, initial=0.0))
    ax.set_ylim(0, min(100.0, max(5.0, 1.15 * top)))       # small rates stay visible
    ax.set_ylabel("overflow rate (%)")
    ax.legend(loc="upper right", fontsize="small")
    ax.grid(True, alpha=0.3)


def gradient_panel(ax: Any, pic: RunPicture) -> None:
    """The zero and subnormal fractions of all the gradients (left, %, symlog) and the
    smallest headroom over the parameters (right, powers of two). An infinite headroom
    (every gradient zero, or inf/NaN on a skipped step) is left out. After a precision
    schedule's switch the gradients are float32: their fractions are drawn apart (hollow),
    their headroom (to float32's largest value) is not drawn."""
    from matplotlib.ticker import MaxNLocator

    g, after = pic.gradients, pic.float32_gradients
    dtype = f"{pic.dtype} " if pic.dtype and after is None else ""
    ax.set_ylabel(f"{dtype}gradient values (%)")
    ax.grid(True, which="both", alpha=0.3)
    mark_switch(ax, pic.switch)
    if not len(g.steps) and after is None:
        ax.text(0.5, 0.5, "no gradient statistics in this run", ha="center", va="center",
                transform=ax.transAxes)
        return
    suffix = f", {pic.dtype}" if after is not None and pic.dtype else ""
    lines = ax.plot(g.steps, 100 * g.zero_fraction, "o-", color="tab:purple", ms=3,
                    label="zero (%)" + suffix, clip_on=False)
    lines += ax.plot(g.steps, 100 * g.subnormal_fraction, "s-", color="tab:brown", ms=3,
                     label="subnormal (%)" + suffix, clip_on=False)
    if after is not None:
        lines += _float32_fractions(ax, after)
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_ylim(0, 100)
    room = np.where(np.isfinite(g.headroom), g.headroom, np.nan)
    twin = ax.twinx()
    lines += twin.plot(g.steps, room, "^--", color="tab:cyan", ms=4,
                       label="headroom: smallest over the parameters" + suffix)
    twin.set_ylabel("headroom (powers of 2)")
    twin.yaxis.set_major_locator(MaxNLocator(integer=True))
    if np.isfinite(room).any():
        twin.set_ylim(min(0, np.nanmin(room)) - 0.5, np.nanmax(room) + 1.5)
    ax.legend(lines, [line.get_label() for line in lines], loc="lower center",
              bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize="small", frameon=False)


def _float32_fractions(ax: Any, after: GradientPoints) -> list:
    """The fractions of the float32 steps after a switch, hollow, and their last headroom
    as text."""
    lines = ax.plot(after.steps, 100 * after.zero_fraction, "o:", ms=4, color="tab:purple",
                    mfc="none", label="zero (%), float32 after the switch", clip_on=False)
    lines += ax.plot(after.steps, 100 * after.subnormal_fraction, "s:", ms=4,
                     color="tab:brown", mfc="none", clip_on=False,
                     label="subnormal (%), float32 after the switch")
    # said in the legend, where no line or marker runs through it
    lines += ax.plot([], [], ls="none", label="float32 headroom not drawn (last {:g})".format(
        after.headroom[-1]))
    return lines


PANELS = {"loss": loss_panel, "scale": scale_panel, "rate": rate_panel,
          "gradients": gradient_panel}
