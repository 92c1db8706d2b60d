"""The figures of docs/monitoring.rst: its examples' output, and the committed report
example's series."""
from figures import (DESIGN, NO_SCALE, PRONOUN, Figure, Quote, in_code, read, shown,
                     spelled)

PAGE = "docs/monitoring.rst"


SCALE, LARGEST = "scale", "scale-max"


def series(name: str, function) -> Figure:
    """What ``function`` makes of a report example series, ``[(step, value), ...]``."""
    return read(f"report_example/loss-scale-{name}.series.txt", function)


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


def first_value(name: str) -> Figure:
    """The first value of a report example series, as the prose writes a scale."""
    return series(name, lambda pairs: f"{pairs[0][1]:g}")


def lowest(name: str) -> Figure:
    """The smallest value of a report example series."""
    return series(name, lambda pairs: f"{min(v for _, v in pairs):g}")


def lowest_step(pairs):
    """The first step of the window where the scale is at its lowest."""
    low = min(v for _, v in pairs)
    return next(step for step, value in pairs if value == low)


QUOTES = [
    Quote("``-inf`` at step {step} (that step's gradients overflowed), and {zero} afterwards: "
          "at 512",
          step=shown(PAGE, r"gradient-headroom \['(\d+)', '-inf'"),
          zero=shown(PAGE, r"gradient-headroom \['\d+', '-inf', '\d+', '(\d+)'")),
    Quote("the first {six} steps are skipped",
          six=shown(PAGE, r"skipped-steps \['\d+', '\d+', '\d+', '(\d+)'", convert=spelled)),
    Quote("and writes {window} ``MonitorSeries`` files there",
          window=in_code("nnabla_mpt/report/series.py", "WINDOW",
                         lambda series: spelled(len(series)))),
    Quote("(``MAX_BINS`` of ``nnabla_mpt.report.run_report``, {bins})",
          bins=in_code("nnabla_mpt/report/run_report.py", "MAX_BINS")),
    Quote("{first} at the first step; at the windows' last steps it goes from {start} down to "
          "{low} by the step-",
          first=first_value("scale-first"), start=first_value(SCALE), low=lowest(SCALE)),
    Quote("The first steps overflow from {first} on, and the scale backs off from {start} (at "
          "the end of the first window) to {low} (at step",
          first=first_value("scale-first"), start=first_value(SCALE), low=lowest(SCALE)),
    Quote("the scale backs off from 8192 (at the end of the first window) to 1024 (at step "
          "{low}); measured growth then takes it up, past the 32768 a float16 loss could "
          "seed (the demo's loss is float32), to {top}, and an overflow in the window of "
          "steps {start}-{peak} brings it back to {last}, where it stays",
          low=series(SCALE, lowest_step),
          top=series(LARGEST, lambda pairs: f"{max(v for _, v in pairs):g}"),
          start=series(LARGEST, lambda pairs: peak(pairs) - 9),
          peak=series(LARGEST, peak),
          last=series(SCALE, lambda pairs: f"{staying(pairs):g}")),
    Quote("from 8192 down to 1024 by the step-{low} window, then up to {last} by step {peak}",
          low=series(SCALE, lowest_step),
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
    "can always look at one step": DESIGN,
    "any callable taking one argument": "a hook's signature, one argument",
    "one ``update()`` call can run several steps": DESIGN,
    "the step pays one attribute test": DESIGN,
    "Three ready-made hooks": "the three hooks the page names next",
    "one line ``<step> <value>`` per ``interval`` steps": DESIGN,
    "the steps run at scale 1, which is no loss scale": NO_SCALE,
    "instead of drawing a fall to 1": NO_SCALE,
    "held the scale (measured growth, see :doc:`measured`), one more": "the series the "
                                                                      "table below names",
    "the monitor adds three series": "the three series the table below names",
    "values that are exactly 0": "zero, the value a zero fraction counts",
    "``MonitorSeries`` writes six significant digits": "what ``%g`` writes, a fact of Python",
    "every scale above 682 overflows": "65504 / 96, the example's arithmetic",
    "halves down to 512": "2**15 halved six times, the example's arithmetic",
    "tries 1024 again": "twice 512, the example's arithmetic",
    "at 512 the largest gradient": "the scale after six halvings, the example's arithmetic",
    "the largest gradient is less than one doubling away": "the example's arithmetic: "
                                                           "96 x 512 and twice that",
    "every growth to 1024 fails": "twice 512, the example's arithmetic",
    "The command ends with status 2": "the exit status argparse gives an error",
    "(a rate or a fraction outside 0 to 1, a scale that is not above 0": "the bounds of the "
                                                                         "values read",
    "the figure draws one by one": "windows drawn singly, no count",
    "past the 32768 a float16 loss could seed": "2**15, the largest power of two float16 "
                                                "holds",
    "(the rate is ``k / n`` to six digits)": "what ``%g`` writes, a fact of Python",
    "per thousand steps, and the windows": "the unit of the share, per thousand",
    "the last headroom is one power of two or less": "the report's threshold (``room <= 1`` "
                                                     "in nnabla_mpt/report/summary.py)",
    "the last values of the three gradient series": "the three gradient series named above",
    "(or one above it:": PRONOUN,
    "every two minutes": "tensorboardX's default flush interval, 120 s",
    "http://localhost:6006": "TensorBoard's default port",
    "with one nnabla does not take": PRONOUN,
    "then at 1399, 1499": "an example of the windows' arithmetic",
    "left half written is dropped": "a line cut off by an interrupted write, no count",
    "so the three gradient series are there too": "the three gradient series named next",
}
