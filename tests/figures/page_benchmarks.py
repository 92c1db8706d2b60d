"""The figures of docs/benchmarks.rst: the updater's overhead, the convergence run and the
measured_edge runs' times (the all-reduce's are on docs/distributed.rst)."""
from figures import Quote, cell, date_of, date_of_all, derived, grep, wall_time_of

PAGE = "docs/benchmarks.rst"
OVERHEAD, CONVERGENCE = "updater_overhead_current.txt", "convergence_spike.txt"


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


QUOTES = [
    Quote("They were measured on {date} on a 2-core machine",
          date=date_of_all(OVERHEAD, CONVERGENCE, "measured_edge_teacher_run.txt",
                           "measured_edge_digits_run.txt", "allreduce_fused_run1.txt")),
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
          "and {deep}% with 200 small arrays.",
          k4=added("mlp-1e4"), k5=added("mlp-1e5"), k6=added("mlp-1e6"),
          deep=added("deep-narrow")),
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
}
