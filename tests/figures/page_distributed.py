"""The figures of docs/distributed.rst: the all-reduce, data-parallel, callback and fault
benchmarks."""
from figures import Quote, cell, date_of, date_of_all, derived, number, shown, span

PAGE = "docs/distributed.rst"
FUSED = [f"allreduce_fused_run{i}.txt" for i in (1, 2, 3)]
PARALLEL = [f"dataparallel_run{i}.txt" for i in (1, 2, 3)]
CALLBACK, FAULTS = "all_reduce_callback_run.txt", "fault_times_run.txt"
LAYOUTS = ("mlp-10", "cnn-50", "resnet-200")
#: The timeout fault_times.py gives MPICommunicator, as the page says ("timeout=2").
TIMEOUT = 2
SCHEMES = "by scheme"


def over_runs(column, layout, fmt="{:.1f}"):
    """A ratio column of allreduce_bench.py's first table, lowest–highest over the runs."""
    return span([cell(run, layout, column, convert=number) for run in FUSED], fmt)


def quotient(top, bottom, after, layout):
    """Cell ``top`` over cell ``bottom`` of a layout's row, lowest–highest over the runs."""
    return span([derived("{:.2f}", lambda a, b: a / b,
                         cell(run, layout, top, after, convert=number),
                         cell(run, layout, bottom, after, convert=number))
                 for run in FUSED])


def three(prefix, function, *args):
    """The figure for each layout, named prefix0, prefix1, prefix2."""
    return {f"{prefix}{i}": function(*args, layout) for i, layout in enumerate(LAYOUTS)}


def fault(name):
    return cell(FAULTS, name, 2, convert=number)


QUOTES = [
    Quote("(AMD EPYC, MPICH 5.0.2) on {date}, nothing else running",
          date=date_of_all(*FUSED, *PARALLEL, CALLBACK)),
    Quote("beats one call of the same communicator per array of ordinary nnabla gradients "
          "by {c0}× (10 arrays), {c1}× (50 arrays) and {c2}× (200 arrays), and one call per "
          "array of the shared gradients (fusion alone, nothing copied on either side) by "
          "{s0}×, {s1}× and {s2}×.",
          **three("c", over_runs, 5), **three("s", over_runs, 9)),
    Quote("the fused call on shared gradients is {r0}×, {r1}× and {r2}× faster.",
          **three("r", over_runs, 7)),
    Quote("still beats the same communicator per array by {c0}×, {c1}× and {c2}×, and the "
          "raw MPI loop by {r0}×, {r1}× and {r2}×. Of the copying schemes the "
          "shared-memory one was the fastest in every run: {g0}×, {g1}× and {g2}× faster "
          "than reduce-scatter + allgather with the same copies, and {p0}×, {p1}× and "
          "{p2}× faster than one plain ``Allreduce``.",
          **three("c", quotient, 4, 10, None), **three("r", quotient, 6, 10, None),
          **three("g", quotient, 2, 1, SCHEMES), **three("p", quotient, 4, 1, SCHEMES)),
    Quote("ran at {speedup}× the single-process samples/s with 2 ranks (one thread each, "
          "2× ideal); the all-reduce took {reduce} ms of a {step} ms step",
          speedup=span([cell(r, "2", 4, convert=number) for r in PARALLEL], "{:.2f}"),
          reduce=span([cell(r, "2", 3, convert=number) for r in PARALLEL]),
          step=span([cell(r, "2", 2, convert=number) for r in PARALLEL])),
    Quote("made for each backward pass took {wide}× the time of ``all_reduce`` after it "
          "for a wide MLP and {deep}× for a deep narrow one with 202 parameter arrays "
          "(nnabla's solver hook, called per array); made once before the loop, "
          "{wide_once}× and {deep_once}×",
          wide=cell(CALLBACK, "wide", 4), deep=cell(CALLBACK, "deep-narrow", 4),
          wide_once=cell(CALLBACK, "wide", 5), deep_once=cell(CALLBACK, "deep-narrow", 5)),
    Quote("(+{deep}% step time for a deep narrow MLP of 203 functions a pass, +{wide}% for "
          "a wide one;",
          deep=derived("{:.1f}", lambda r: 100 * (r - 1), cell(CALLBACK, "deep-narrow", 5)),
          wide=derived("{:.1f}", lambda r: 100 * (r - 1), cell(CALLBACK, "wide", 5))),
    Quote("``.venv/bin/python benchmarks/fault_times.py`` on {date} (raw output in "
          "``benchmarks/results/fault_times_run.txt``)",
          date=date_of(FAULTS)),
    Quote("exit status 1 - {raised} * - raises, caught by the script",
          raised=fault("raise")),
    Quote("ranks in step up to there - {caught} *", caught=fault("caught")),
    Quote("exit status 1 - {left} (the timeout + about {extra} s)",
          left=span([fault(n) for n in ("exit3", "exit0", "end", "stall")]),
          extra=derived("{:.0f}", lambda stall: stall - TIMEOUT, fault("stall"))),
    Quote("the exit status is the signal's (9, 15) - {killed} *",
          killed=span([fault("kill9"), fault("sigterm")])),
    Quote("then the abort of a rank that raised - {model} *", model=fault("model")),
    Quote("nothing; exit status 0 - {evaluate}", evaluate=fault("evaluate")),
]

NOT_MEASURED = {
    "waited more than 600 s": "the default timeout of MPICommunicator",
    "rank 0 of 3": "the timeout message as it reads for rank 0 of an example of three ranks",
    "rank 1 of 3": "the abort message as it reads for rank 1 of three (fault_times.py's fault)",
    "waited more than 2 s": "the timeout message as it reads with fault_times.py's timeout=2",
    "2× ideal": "the ideal speed-up of two ranks",
    "The target of 3×": "the target the fused all-reduce was built to meet",
    "1.1 million parameters": "the size of an example model, 1.1 million parameters",
}

QUOTES += [
    Quote("each rank prints its line with the same count: {calls} all-reduces in {steps} "
          "steps,",
          calls=shown(PAGE, r"(\d+) all-reduces in \d+ steps"),
          steps=shown(PAGE, r"\d+ all-reduces in (\d+) steps")),
]
