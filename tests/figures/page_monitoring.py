"""The figures of docs/monitoring.rst: its examples' output, and the committed report
example's series."""
from figures import Figure, Quote, read, shown

PAGE = "docs/monitoring.rst"


def first_step(series: str, test) -> Figure:
    """The first step of a report example series whose value passes ``test``."""
    return read(f"report_example/loss-scale-{series}.series.txt",
                lambda pairs: next(step for step, value in pairs if test(value)))


QUOTES = [
    Quote("``-inf`` at step {step} (that step's gradients overflowed)",
          step=shown(PAGE, r"gradient-headroom \['(\d+)', '-inf'")),
    Quote("the scale backs off from 8192 (at the end of the first window) to 1024 (at step "
          "{low}); measured growth then takes it up to 32768 in the window of steps "
          "{top_first}-{top}, and from step {held} on the ceiling of a float16 loss holds it",
          low=first_step("scale", lambda v: v == 1024),
          top_first=read("report_example/loss-scale-scale.series.txt",
                         lambda pairs: next(s for s, v in pairs if v == 32768) - 9),
          top=first_step("scale", lambda v: v == 32768),
          held=first_step("growth-held-by-ceiling", lambda v: v > 0)),
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
}
