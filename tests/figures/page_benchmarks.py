"""The figures of docs/benchmarks.rst: the updater's overhead, the convergence run and the
measured_edge runs' times (the all-reduce's are on docs/distributed.rst)."""
from figures import (ANOTHER, DESIGN, HISTORY, PRONOUN, Quote, cell, date_of, date_of_all, derived,
                     grep, header, in_code, spelled, wall_time_of)

PAGE = "docs/benchmarks.rst"
OVERHEAD, CONVERGENCE = "updater_overhead_current.txt", "convergence_spike.txt"
FUSED = "allreduce_fused_run1.txt"
#: The convergence run's first line: the data set, the model and the training.
SETUP = r"^# digits \((\d+) train / (\d+) test\), MLP (\S+), batch (\d+),"


def ratio(model, column):
    """A ratio of updater_overhead.py's table: 8 ours/hand, 9 ours/check, 10 ours/nnabla,
    12 clip/ours."""
    return cell(OVERHEAD, model, column)


def added(model):
    """What clipping added to a step, in percent."""
    return derived("{:.1f}", lambda r: 100 * (r - 1), ratio(model, 12))


def before_spike(run):
    """The power of two of the run's scale before the convergence run's spike."""
    return grep(CONVERGENCE, rf"^spike_{run}: scale before the spike 2\^(\d+)")


def after_spike(run):
    """The power of two of the run's scale after its first growth point past the spike."""
    return grep(CONVERGENCE, r"first growth point after the spike, step \d+: 2\^\d+ -> "
                r"2\^(\d+)", after=rf"^spike_{run}:")


def cores(source):
    """The CPUs of a results file's machine (its header's ``2 CPUs (...)``)."""
    return header(source, "machine", convert=lambda text: text.split()[0])


def layout(name):
    """The arrays of an all-reduce layout, from its row of the first run's table."""
    return cell(FUSED, name, 1)


QUOTES = [
    Quote("They were measured on {date} on a {cores}-core machine (``nproc`` = {nproc},",
          date=date_of_all(OVERHEAD, CONVERGENCE, "measured_edge_teacher_run.txt",
                           "measured_edge_digits_run.txt", FUSED),
          cores=cores(OVERHEAD), nproc=cores(OVERHEAD)),
    Quote("after {warmup} warm-up rounds, {rounds} rounds give median step times",
          warmup=grep(OVERHEAD, r"; \d+ rounds \(\+(\d+) warm-up each\)"),
          rounds=grep(OVERHEAD, r"; (\d+) rounds \(\+\d+ warm-up each\)")),
    Quote("gradient arrays of at least {size} elements are checked for inf/NaN through "
          "their sum", size=in_code("nnabla_mpt/step/detector.py", "SUM_CHECK_MIN_SIZE")),
    Quote("packing the arrays into {width}-column matrices",
          width=in_code("nnabla_mpt/core/_gradsum.py", "_WIDTH")),
    Quote("The same {mlp} MLP trained on scikit-learn's digits three times, from the same "
          "initial parameters on the same batches ({batch}, summed loss,",
          mlp=grep(CONVERGENCE, SETUP, group=3), batch=grep(CONVERGENCE, SETUP, group=4)),
    Quote("All are evaluated in float32 on {test} held-out images.",
          test=grep(CONVERGENCE, SETUP, group=2)),
    Quote("and lost {lost} step, where probe also overflowed. Its watch, at the growth "
          "points, every {every}th step and the first {first} steps,",
          lost=grep(CONVERGENCE, r"^measured .*?\s\d+\s+(\d+) of \d+", convert=spelled),
          every=in_code(HISTORY, "WATCH_EVERY"),
          first=in_code(HISTORY, "MIN_SAMPLES", spelled)),
    Quote("on a {mlp} MLP whose labels come from a fixed random network",
          mlp=grep("measured_edge_teacher_report.txt", r"^# teacher MLP (\S+) float16")),
    Quote("{ranks} ranks reduce the float32 gradients of three layouts (an MLP with {mlp} "
          "arrays, a CNN with {cnn}, a CIFAR-style ResNet with {resnet})",
          ranks=grep(FUSED, r"^# (\d+) ranks,", convert=lambda n: spelled(n).capitalize()),
          mlp=layout("mlp-10"), cnn=layout("cnn-50"), resnet=layout("resnet-200")),
    Quote("Measured on {date} (``benchmarks/results/updater_overhead_current.txt``)",
          date=date_of(OVERHEAD)),
    Quote("at 1e6 parameters the updater took {h6} times the hand loop, {c6} times the loop "
          "with the same check and {n6} times nnabla's updater; at 1e5, {h5}, {c5} and "
          "{n5}. At 1e4 parameters (a {step} ms float step) it took {h4} times the hand "
          "loop, {c4} times the loop with the check and {n4} times nnabla's updater",
          h6=ratio("mlp-1e6", 8), c6=ratio("mlp-1e6", 9), n6=ratio("mlp-1e6", 10),
          h5=ratio("mlp-1e5", 8), c5=ratio("mlp-1e5", 9), n5=ratio("mlp-1e5", 10),
          h4=ratio("mlp-1e4", 8), c4=ratio("mlp-1e4", 9), n4=ratio("mlp-1e4", 10),
          step=cell(OVERHEAD, "mlp-1e4", 4)),
    Quote("Global-norm clipping added {k4}%, {k5}% and {k6}% at 1e4, 1e5 and 1e6 parameters "
          "and {deep}% with {arrays} small arrays.",
          k4=added("mlp-1e4"), k5=added("mlp-1e5"), k6=added("mlp-1e6"),
          deep=added("deep-narrow"), arrays=cell(OVERHEAD, "deep-narrow", 2)),
    Quote("Measured on {date}, in {seconds} s (``benchmarks/results/convergence_spike.txt``",
          date=date_of(CONVERGENCE),
          seconds=wall_time_of(CONVERGENCE)),
    Quote("``scale=\"auto\"`` skipped no step in its warm-up (probe: {probe_warm}); measured "
          "growth skipped {after} after it ({share}; probe: {probe_after});",
          probe_warm=grep(CONVERGENCE, r"^probe .*?\s(\d+)\s+\d+ of \d+"),
          after=grep(CONVERGENCE, r"^measured .*?\s\d+\s+(\d+ of \d+)"),
          share=grep(CONVERGENCE, r"^measured .*?\d+ of \d+ \(([\d.]+%)\)"),
          probe_after=grep(CONVERGENCE, r"^probe .*?\s\d+\s+(\d+ of \d+)")),
    Quote("cost +{run}% of the run's step time (its watched steps against its other "
          "steps; +{paired}% from the paired differences to probe's steps of the same "
          "index), each watched step {step}% more than an ordinary one.",
          run=grep(CONVERGENCE, r"per watched step\): \+([\d.]+)% of the run"),
          paired=grep(CONVERGENCE, r"same index: \+([\d.]+)%"),
          step=grep(CONVERGENCE, r"\(\+([\d.]+)% per watched step\)")),
    Quote("probe growth was at ``2**{probe_after}``, {probe_below} factors below its scale "
          "before the spike (``2**{probe_before}``), and measured growth at "
          "``2**{measured_after}``, {measured_above} factors above its own "
          "(``2**{measured_before}``).",
          probe_after=after_spike("probe"), probe_before=before_spike("probe"),
          probe_below=derived("{:.0f}", lambda a, b: b - a, after_spike("probe"),
                              before_spike("probe")),
          measured_after=after_spike("measured"), measured_before=before_spike("measured"),
          measured_above=derived("{:.0f}", lambda a, b: a - b, after_spike("measured"),
                                 before_spike("measured"))),
    Quote("random network (the default, {teacher} s) or on the digits MLP ({digits} s)",
          teacher=wall_time_of("measured_edge_teacher_run.txt"),
          digits=wall_time_of("measured_edge_digits_run.txt")),
]

NOT_MEASURED = {
    "about 40 ms of steps": "the length of each timed turn, the script's --block-ms",
    "at most 1.02 times the hand loop": "the target the step loop was built to meet",
    "at steps 300 to 303": "the convergence run's spike, its setting (--spike-at)",
    "Momentum 0.9": "the momentum of the convergence run's solver",
    "Momentum 0.9, 1500 steps": "the convergence run's length, its setting (--steps)",
    "(a one-minute average lags by about a minute)": "what Linux's one-minute load average "
                                                     "is, a fact of the kernel",
    "they take turns in one process": "how the benchmark runs its contenders, its design",
    "at 1e6 parameters the updater": "a model's size, the benchmark's setting (mlp-1e6)",
    "at 1e5, 1.021": "a model's size, the benchmark's setting (mlp-1e5)",
    "At 1e4 parameters (a": "a model's size, the benchmark's setting (mlp-1e4)",
    "no slower from 1e5 parameters up": "the models' sizes, the benchmark's settings",
    "at 1e4, 1e5 and 1e6 parameters": "the models' sizes, the benchmark's settings",
    "The ratios move by a percent or two between runs of the same code (where the models' "
    "memory lies, which one runs after which)": "the spread of the ratios between runs of "
                                               "the same code, which benchmarks/README.md "
                                               "keeps; a pronoun",
    "adds a second copy of ours": ANOTHER,
    "Three choices keep the cost down": "the three items that follow it",
    "computed by one prebuilt graph": DESIGN,
    "in one prebuilt graph and large ones with one NumPy dot each": DESIGN,
    "scales the gradients a second time": ANOTHER,
    "seeded with one ``NdArray`` of the scale": DESIGN,
    "a little less of an updater's step at 1e4 parameters": "a model's size, the "
                                                            "benchmark's setting",
    "digits three times, from the same": "the three runs the sentence names (float32, "
                                         "probe, measured)",
    "The two float16 runs' steps": "the probe and measured runs, named before",
    "``--spike`` adds two more float16 runs whose loss is multiplied by 1024": "the spike's "
        "runs and factor, the script's settings (--spike-factor 2**10)",
    "each watched step 9.8% more than an ordinary one": PRONOUN,
    "a spike that is skipped whole and one that trains": "the benchmark's two spikes, its "
                                                         "design",
    "the float32 gradients of three layouts": "the three layouts the sentence names",
    "The first of three runs": "the three results files it names",
    "The figures of the three runs": "the three results files named above",
    "why neither helps on one machine": "a condition: the ranks of a single machine",
}
