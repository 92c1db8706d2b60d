"""The figures of docs/measured.rst: the demo's run, the convergence benchmark's watch
cost, and measured_edge.py's runs. The section on the float32 loss is checked against
its results by tests/test_float32_loss_page.py."""
import re

from figures import MARGIN, Quote, date_of, grep, load_of, read

PAGE = "docs/measured.rst"
CHECKED_ELSEWHERE = {"Lifting the float16 seed ceiling": "tests/test_float32_loss_page.py"}
DEMO, REPORT, PROBE = "demo.txt", "demo_report.txt", "demo_probe.txt"
FLOAT16_LOSS = "demo_float16_loss.txt"


def changes(body):
    """The demo's scale changes, ``[(step, new scale), ...]``."""
    line = re.search(r"changes \(step:new scale\):\n\s+(.*)", body).group(1)
    return [tuple(int(v) for v in pair.split(":")) for pair in line.split()]


def backed_off(body):
    """The first change that halves the scale: ``(step, scale it ran with, the growth
    before it)``."""
    pairs = changes(body)
    k = next(k for k in range(1, len(pairs)) if pairs[k][1] < pairs[k - 1][1])
    return pairs[k][0], pairs[k - 1][1], pairs[k - 1][0]


def power(value) -> str:
    return f"2**{int(value).bit_length() - 1}"


QUOTES = [
    Quote("The calibration starts at ``{initial}``",
          initial=grep(DEMO, r"loss scale: initial (\d+)", convert=power)),
    Quote("Measured growth holds at {held} of its {points} growth points (the circles)",
          held=grep(DEMO, r"(\d+)\s+held\b"), points=grep(DEMO, r"(\d+) growth points")),
    Quote("up to ``{top}`` at step {step}: the float32 loss seeds",
          top=grep(DEMO, r"max (\d+), final", convert=power),
          step=read(DEMO, lambda body: changes(body)[-1][0])),
    Quote("the same run reaches the ceiling ``2**15`` at step {top} and stays there; the "
          "ceiling, not the gradients, held it at {ceiling} growth points",
          top=grep(FLOAT16_LOSS, r"\b(\d+):32768\b"),
          ceiling=grep(FLOAT16_LOSS, r"held;\s+(\d+) of them held by the largest scale")),
    Quote("It skipped {skipped} of the 1000 steps (step {step}, at ``{scale}``, {after} "
          "steps after the growth at step {grew},",
          skipped=grep(DEMO, r"skipped steps: (\d+) of 1000"),
          step=read(DEMO, lambda body: backed_off(body)[0]),
          scale=read(DEMO, lambda body: power(backed_off(body)[1])),
          after=read(DEMO, lambda body: backed_off(body)[0] - backed_off(body)[2]),
          grew=read(DEMO, lambda body: backed_off(body)[2])),
    Quote("(``--scale 32768 --growth-mode probe``) the same run skipped {skipped} of the "
          "1000 steps", skipped=grep(PROBE, r"skipped steps: (\d+) of 1000")),
    Quote("the headroom of the closest parameter ({headroom} powers of two at the last "
          "step) and at most {subnormal}% of the float16 gradient values subnormal (at "
          "step {where}). The {zero}% of values",
          headroom=grep(REPORT, r"subnormal, headroom (\d+) powers"),
          subnormal=grep(REPORT, r"the most subnormal ([\d.]+)% at step"),
          where=grep(REPORT, r"the most subnormal [\d.]+% at step (\d+)"),
          zero=grep(REPORT, r"last at step \d+: ([\d.]+)% zero")),
    Quote("``./run.sh demo`` on {date} with a load average of {load} before the run",
          date=date_of(DEMO),
          load=load_of(DEMO)),
]

NOT_MEASURED = {
    "8 times below float16's largest value: a later batch's may be 8 times": MARGIN,
    "8192 keeps the largest gradient at scale 1 8 times below": MARGIN,
    "steps 20 to 22 are 60 times larger": "the example's spike, its setting",
    "first growth point, step 4: its history then held steps 0 to 4":
        "the example's first growth point, N=5 (its setting)",
    "At steps 100 to 103": "measured_edge.py's spike, its setting (--spike-at 100)",
    "for 200 steps": "measured_edge.py's run length, its setting (--steps)",
    "every 25 steps": "measured growth's watch interval, WATCH_EVERY",
    "of the 1000 steps": "the demo's length, its --steps default",
    "statistics over 1000 steps": "the demo's length, its --steps default",
}

CONVERGENCE = "convergence_spike.txt"
WATCH = (r"watch \(measured, step 0 left out\): .*\(\+([\d.]+)% per watched step\): "
         r"\+([\d.]+)% of the run's step time; from the differences to probe's steps of "
         r"the same index: \+([\d.]+)%")
QUOTES += [
    Quote("(on the digits MLP each watched step took {step}% longer than the others, "
          "+{run}% of the run's step time: ``benchmarks/results/convergence_spike.txt``)",
          step=grep(CONVERGENCE, WATCH, group=1), run=grep(CONVERGENCE, WATCH, group=2)),
    Quote("on the digits run with ``N=200``, +{paired}% of the run's step time against "
          "probe's steps of the same index", paired=grep(CONVERGENCE, WATCH, group=3)),
]

#: A row of measured_edge.py's report: median, min, <held/2, <probe/2, skipped steps,
#: before, 1st growth, back in.
ROW = (r"^{}\s+(2\^\d+)\s+(2\^\d+)\s+(\d+)\s+(\d+)\s+\[([^\]]*)\]\s+(2\^\d+)\s+(2\^\d+)"
       r"\s+(\d+)")
MEDIAN, SKIPPED, FIRST_GROWTH, BACK_IN = 1, 5, 7, 8


def edge(model, scenario, run, group, convert=str):
    """A figure of run ``run``'s row in the ``scenario`` table of the model's report."""
    return grep(f"measured_edge_{model}_report.txt", ROW.format(run), group=group,
                convert=convert, after=rf"^## {scenario} spike")


def literal_power(text):
    return f"``{text.replace('^', '**')}``"


def held(model, scenario="skipped"):
    return grep(f"measured_edge_{model}_report.txt",
                r"highest scale probe holds without losing a step: (2\^\d+)",
                convert=literal_power, after=rf"^## {scenario} spike")


def beside_spike(model, scenario, run, say=len):
    """What ``say`` makes of the skipped steps of a report row that fall outside the
    spike (the steps the report's first line names)."""
    def steps(body):
        first, last = map(int, re.search(r"spike: steps (\d+)\.\.(\d+)", body).groups())
        row = re.search(ROW.format(run), body[body.index(f"## {scenario} spike"):], re.M)
        return say([int(step) for step in row.group(SKIPPED).split(",")
                    if not first <= int(step) <= last])
    return read(f"measured_edge_{model}_report.txt", steps)


def in_words(steps) -> str:
    """A count of steps as the prose says it: "no step", "one step", "k steps"."""
    return {0: "no step", 1: "one step"}.get(len(steps), f"{len(steps)} steps")


def subnormal(run):
    return grep("measured_edge_teacher_report.txt",
                rf"^  {run}\s+zeros [\d.]+  subnormals ([\d.]+)", after=r"^## skipped spike")


QUOTES += [
    Quote("of the runs of {date})",
          date=date_of("measured_edge_teacher_run.txt")),
    Quote("Probe holds {held} without losing a step, and loses {lost} steps besides the "
          "spike's at its tries above it. Measured growth watches every step until its "
          "history holds four, loses {measured_lost} besides the spike's and runs at a median "
          "scale of {median}, the highest probe holds, leaving a fraction of {sub} of the "
          "gradient values subnormal on the same gradients (probe: {probe_sub}). After the "
          "skipped spike it is back at {first} at the first growth point, in one move, "
          "within one factor {back} steps after the spike (probe: {probe_first}, and "
          "{probe_back} steps). After the trained spike the first growth point gives "
          "{trained_first}, within one factor, {trained_back} steps after the spike "
          "(probe: {probe_trained_back} steps).",
          held=held("teacher"),
          lost=beside_spike("teacher", "skipped", "probe"),
          measured_lost=beside_spike("teacher", "skipped", "measured", in_words),
          median=edge("teacher", "skipped", "measured", MEDIAN, literal_power),
          sub=subnormal("measured"), probe_sub=subnormal("probe"),
          first=edge("teacher", "skipped", "measured", FIRST_GROWTH, literal_power),
          back=edge("teacher", "skipped", "measured", BACK_IN),
          probe_first=edge("teacher", "skipped", "probe", FIRST_GROWTH, literal_power),
          probe_back=edge("teacher", "skipped", "probe", BACK_IN),
          trained_first=edge("teacher", "trained", "measured", FIRST_GROWTH, literal_power),
          trained_back=edge("teacher", "trained", "measured", BACK_IN),
          probe_trained_back=edge("teacher", "trained", "probe", BACK_IN)),
    Quote("probe holds {held} and loses {lost} steps besides the spike's. Measured growth "
          "lost {measured_lost}, {step}, where the gradients grow early in training faster "
          "than its first passes showed, and held a median of {median}; it too comes back "
          "within one factor at the first growth point after each spike, {back} and "
          "{trained_back} steps after it (probe: {probe_back} and {probe_trained_back})",
          held=held("digits"),
          lost=beside_spike("digits", "skipped", "probe"),
          measured_lost=beside_spike("digits", "skipped", "measured", in_words),
          step=beside_spike("digits", "skipped", "measured",
                            lambda steps: ", ".join(map(str, steps))),
          median=edge("digits", "skipped", "measured", MEDIAN, literal_power),
          back=edge("digits", "skipped", "measured", BACK_IN),
          trained_back=edge("digits", "trained", "measured", BACK_IN),
          probe_back=edge("digits", "skipped", "probe", BACK_IN),
          probe_trained_back=edge("digits", "trained", "probe", BACK_IN)),
]
