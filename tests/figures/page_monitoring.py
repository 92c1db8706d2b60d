"""The figures of docs/monitoring.rst: its examples' output, and the committed report
example's series."""
from figures import Figure, Quote, read, shown

PAGE = "docs/monitoring.rst"


SCALE, LARGEST = "scale", "scale-max"


def series(name: str, function) -> Figure:
    """What ``function`` makes of a report example series, ``[(step, value), ...]``."""
    return read(f"report_example/loss-scale-{name}.series.txt", function)


def first_step(name: str, test) -> Figure:
    """The first step of a series whose value passes ``test``."""
    return series(name, lambda pairs: next(step for step, value in pairs if test(value)))


def peak(pairs):
    """The last step of the window in which the largest scale was first reached."""
    top = max(value for _, value in pairs)
    return next(step for step, value in pairs if value == top)


def staying(pairs):
    """The last scale, where every window from the peak's on ended."""
    after = [value for step, value in pairs if step >= peak_of_largest()]
    assert len(set(after)) == 1, after
    return after[0]


def peak_of_largest():
    return int(series(LARGEST, peak).text())


QUOTES = [
    Quote("``-inf`` at step {step} (that step's gradients overflowed)",
          step=shown(PAGE, r"gradient-headroom \['(\d+)', '-inf'")),
    Quote("the scale backs off from 8192 (at the end of the first window) to 1024 (at step "
          "{low}); measured growth then takes it up, past the 32768 a float16 loss could "
          "seed (the demo's loss is float32), to {top}, and an overflow in the window of "
          "steps {start}-{peak} brings it back to {last}, where it stays",
          low=first_step(SCALE, lambda v: v == 1024),
          top=series(LARGEST, lambda pairs: f"{max(v for _, v in pairs):g}"),
          start=series(LARGEST, lambda pairs: peak(pairs) - 9),
          peak=series(LARGEST, peak),
          last=series(SCALE, lambda pairs: f"{staying(pairs):g}")),
    Quote("from 8192 down to 1024 by the step-{low} window, then up to {last} by step {peak}",
          low=first_step(SCALE, lambda v: v == 1024),
          last=series(SCALE, lambda pairs: f"{staying(pairs):g}"),
          peak=series(LARGEST, peak)),
]

NOT_MEASURED = {
    "about 96 times the scale": "the example network's gradients at scale 1, fixed by its "
                                "input (8) and weights (0.5)",
    "at step 1234": "an example of the windows' arithmetic",
    "at step 1299": "an example of the windows' arithmetic",
    "a window of 66 steps": "an example of the windows' arithmetic",
    "an interval of 50 steps": "the demo's --monitor-interval default",
    "statistics every 50 steps": "the demo's --stats-every default",
    "a scale of ``2**20`` reads": "an example of the series' six digits",
    "the headroom every 10 steps": "the example run's --monitor-interval and --stats-every",
    "(nnabla 1.39 declares ``protobuf~=3.20``)": "versions: what nnabla's package declares",
    "TensorBoard 2.21 declares ``protobuf>=6.31.1`` and does not import with 3.20":
        "versions: what TensorBoard's package declares, and the protobuf nnabla's takes",
}
