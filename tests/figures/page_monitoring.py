"""The figures of docs/monitoring.rst: its examples' output, and the committed report
example's series."""
from figures import Figure, Quote, read, shown

PAGE = "docs/monitoring.rst"


SCALE, HELD = "scale", "growth-held-by-ceiling"


def series(name: str, function) -> Figure:
    """What ``function`` makes of a report example series, ``[(step, value), ...]``."""
    return read(f"report_example/loss-scale-{name}.series.txt", function)


def first_step(name: str, test) -> Figure:
    """The first step of a series whose value passes ``test``."""
    return series(name, lambda pairs: next(step for step, value in pairs if test(value)))


def window_start(name: str, test) -> Figure:
    """The first step of the window whose last step is :func:`first_step`: one after the
    step the series wrote before it."""
    return series(name, lambda pairs: next(pairs[k - 1][0] + 1 for k in range(1, len(pairs))
                                           if test(pairs[k][1])))


def top(value):
    return value == 32768


QUOTES = [
    Quote("``-inf`` at step {step} (that step's gradients overflowed)",
          step=shown(PAGE, r"gradient-headroom \['(\d+)', '-inf'")),
    Quote("the scale backs off from 8192 (at the end of the first window) to 1024 (at step "
          "{low}); measured growth then takes it up to 32768 in the window of steps "
          "{top_first}-{top}, and from step {held} on the ceiling of a float16 loss holds it",
          low=first_step(SCALE, lambda v: v == 1024), top_first=window_start(SCALE, top),
          top=first_step(SCALE, top), held=first_step(HELD, lambda v: v > 0)),
    Quote("from 8192 down to 1024 by the step-{low} window, then up to 32768 from step {top} "
          "on", low=first_step(SCALE, lambda v: v == 1024), top=first_step(SCALE, top)),
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
