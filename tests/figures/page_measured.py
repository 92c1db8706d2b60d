"""The figures of docs/measured.rst: the demo's run, the convergence benchmark's watch
cost, and measured_edge.py's runs. The section on the float32 loss is checked against
its results by tests/test_float32_loss_page.py."""
import re

from figures import (ANOTHER, DESIGN, HISTORY, MARGIN, PRONOUN, Quote, date_of, grep, in_code,
                     load_of, read, shown, spelled)

PAGE = "docs/measured.rst"
CHECKED_ELSEWHERE = {"Lifting the float16 seed ceiling": "tests/test_float32_loss_page.py"}
DEMO, REPORT, PROBE = "demo.txt", "demo_report.txt", "demo_probe.txt"
FLOAT16_LOSS = "demo_float16_loss.txt"


def history(name, function=lambda value: value, fmt="{}"):
    """A constant of measured growth's history (``nnabla_mpt/scale/scale_history.py``)."""
    return in_code(HISTORY, name, function, fmt)


def spike_example(run, pattern, convert=str):
    """A figure of the shown output of the spike example, the line of ``run``."""
    return shown(PAGE, rf"^\s*{run}: .*{pattern}", convert=convert)


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
          "history holds {samples}, loses {measured_lost} besides the spike's and runs at a "
          "median "
          "scale of {median}, the highest probe holds, leaving a fraction of {sub} of the "
          "gradient values subnormal on the same gradients (probe: {probe_sub}). After the "
          "skipped spike it is back at {first} at the first growth point, in one move, "
          "within one factor {back} steps after the spike (probe: {probe_first}, and "
          "{probe_back} steps). After the trained spike the first growth point gives "
          "{trained_first}, within one factor, {trained_back} steps after the spike "
          "(probe: {probe_trained_back} steps).",
          held=held("teacher"), samples=history("MIN_SAMPLES", spelled),
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

EDGE_SETUP = (r"^# teacher MLP (\S+) float16, summed loss, batch (\d+), N=\d+, \d+ steps, "
              r"scale='auto'; spike: .* multiplied by (\d+) \(skipped\) or (\d+) \(trained\)")
QUOTES += [
    Quote("The last {length} reaches are kept", length=history("LENGTH")),
    Quote("and on every {every}th step (``WATCH_EVERY``)", every=history("WATCH_EVERY")),
    Quote("by as far as {spreads} standard deviations below the mean reach",
          spreads=history("SPREADS", lambda spreads: spelled(spreads))),
    Quote("A steady stream keeps :math:`M = \\sqrt 2`; a noisy one up to {margin}. Until the "
          "history holds {samples} reaches",
          margin=history("MARGIN", fmt="{:g}"), samples=history("MIN_SAMPLES")),
    Quote("the worst of its {recent} newest reaches", recent=history("RECENT", spelled)),
    Quote("``N`` steps apart ({n} by default)",
          n=in_code("nnabla_mpt/scale/bounded_policy.py", "NNABLA_DEFAULTS",
                    lambda defaults: defaults["N"])),
    Quote("while the history holds fewer than {samples} reaches (``MIN_SAMPLES``",
          samples=history("MIN_SAMPLES")),
    Quote("Why {margin} for one batch", margin=history("MARGIN", fmt="{:g}")),
    Quote("would keep such a loss {powers} powers of two below the ceiling",
          powers=history("MARGIN", lambda margin: int(margin).bit_length() - 1)),
    Quote("The history's arithmetic runs over {length} numbers", length=history("LENGTH")),
    Quote("that is one step in ``N``, one in {every} and the first {samples}",
          every=history("WATCH_EVERY"), samples=history("MIN_SAMPLES", spelled)),
    Quote("(every step is measured until it holds {samples})",
          samples=history("MIN_SAMPLES", spelled)),
    Quote("with one batch and a margin of {margin}. The history costs a watched step every "
          "{every} steps besides the growth points, and the first {samples}:",
          margin=history("MARGIN", fmt="{:g}"), every=history("WATCH_EVERY"),
          samples=history("MIN_SAMPLES", spelled)),
    Quote("so their gradients overflow and the scale backs off {backoffs} times",
          backoffs=spike_example("probe", r"; (\d+) skipped$", spelled)),
    Quote("Both start at the measured {start}",
          start=spike_example("probe", r"start (\d+),")),
    Quote("cost each {backoffs} back-offs",
          backoffs=spike_example("measured", r"; (\d+) skipped$", spelled)),
    Quote("({later} ten steps later", later=spike_example("probe", r"10 steps later (\d+);")),
    Quote("trains a float16 MLP (a summed loss, batches of {batch},",
          batch=grep("measured_edge_teacher_report.txt", EDGE_SETUP, group=2)),
    Quote("a quarter of the batch is multiplied by {skipped} (left:",
          skipped=grep("measured_edge_teacher_report.txt", EDGE_SETUP, group=3)),
    Quote("or by {trained} (right:",
          trained=grep("measured_edge_teacher_report.txt", EDGE_SETUP, group=4)),
    Quote("The model here, {mlp} on random inputs",
          mlp=grep("measured_edge_teacher_report.txt", EDGE_SETUP, group=1)),
    Quote("as the next section shows, batches of {batch}, ``N=50``",
          batch=grep(DEMO, r"\d+ steps of batch (\d+),")),
]

NOT_MEASURED.update({
    "Three options use the measurement": "the three options the page names next",
    "the scale comes back in one move": "a single growth point: measured growth grows by as "
                                        "many factors as its history leaves room for",
    "And one rule needs no option": "the single rule the page names next, the ceiling",
    "the fixed updater refuses one": PRONOUN,
    "in ways one batch cannot bound": DESIGN,
    "in one small all-reduce": DESIGN,
    "cannot be measured on one rank": "a batch of any single rank",
    "(1, or :math:`2^8` times higher": "the first probe scale, no scaling",
    "the margin covers the next one": PRONOUN,
    "a noisy one up to": PRONOUN,
    "the margin of one batch": DESIGN,
    "for one batch, and where One batch says nothing": DESIGN,
    "the measured one's": PRONOUN,
    "Back in one move": "a single growth point, its design",
    "the history is the one before the spike": PRONOUN,
    "each function adds two nnabla reductions": DESIGN + " (a maximum and a sum, named next)",
    "read back once, as one array": DESIGN,
    "that is one step in ``N``, one in": DESIGN,
    "adds one or a few backward passes": DESIGN,
    "would be a second pass over them": ANOTHER,
    "loads with an empty one": PRONOUN,
    "regression twice on the same data": "the example's two runs, probe and measured",
    "one factor at a time": "probe growth by one factor, its definition",
    "there in one move": "a single growth point, the shown output's jump to 2**15",
    "at its first growth point, in one move": "a single growth point, its design",
    "probe growth needs one growth point per factor": "probe growth by one factor, its "
                                                      "definition",
    "ten steps later": "the example's setting, the scale 10 steps after the spike "
                       "(scales[33])",
    "only after one more interval": "probe growth's next growth point, N=5 steps on: one "
                                    "factor a growth point, its definition",
    "in one move, within one factor": "the report's 'back in': within one factor of the "
                                      "scale before the spike, at a single growth point",
    "gives ``2**11``, within one factor": "the report's 'back in': within one factor of the "
                                          "scale before the spike",
    "comes back within one factor": "the report's 'back in': within one factor of the "
                                    "scale before the spike",
    "200 steps, twice from the same start": "measured_edge.py's two runs, probe and measured",
    "The same two runs on the digits MLP": "measured_edge.py's two runs, probe and measured",
    "with one batch and a margin of": "the margin of a single batch, as measured growth was",
})
