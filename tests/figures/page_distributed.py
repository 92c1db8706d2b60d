"""The figures of docs/distributed.rst: the all-reduce, data-parallel, callback and fault
benchmarks."""
import math

from figures import (ANOTHER, DESIGN, HALF, INDEX, PRONOUN, Quote, cell, date_of, date_of_all,
                     derived, grep, header, in_code, number, shown, span, spelled)

PAGE = "docs/distributed.rst"
FUSED = [f"allreduce_fused_run{i}.txt" for i in (1, 2, 3)]
PARALLEL = [f"dataparallel_run{i}.txt" for i in (1, 2, 3)]
CALLBACK, FAULTS = "all_reduce_callback_run.txt", "fault_times_run.txt"
LAYOUTS = ("mlp-10", "cnn-50", "resnet-200")
#: The timeout fault_times.py gives MPICommunicator, as the page says ("timeout=2").
TIMEOUT = 2
SCHEMES = "by scheme"
SHM = "nnabla_mpt/distributed/shared_memory_reduction.py"
CALLBACK_SCRIPT = "benchmarks/all_reduce_callback.py"
#: The size of the page's example float16 model, which its fused buffer holds in float32.
EXAMPLE_PARAMETERS = 1.1e6


def area_mib():
    """The largest area of the shared-memory window per rank, in MiB."""
    return in_code(SHM, "SHM_AREA_MAX_BYTES", lambda size: size >> 20)


def barriers(area):
    """The barriers of one all-reduce of the example model's float32 buffer: two a chunk
    of one area (SharedMemoryReduction's design)."""
    return spelled(2 * math.ceil(EXAMPLE_PARAMETERS * 4 / area))


def deep_narrow(count):
    """A count of the deep narrow MLP of all_reduce_callback.py, from its hidden layers:
    an affine layer (two arrays) and a ReLU each, then the output layer, the cross-entropy
    and the mean."""
    return in_code(CALLBACK_SCRIPT, "MODELS", lambda models: count(len(models["deep-narrow"][1])))


def status(name):
    """The exit status of a fault's row of fault_times.py's table."""
    return cell(FAULTS, name, 1)


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
    Quote("exit status {status} - {raised} * - raises, caught by the script",
          status=status("raise"), raised=fault("raise")),
    Quote("ranks in step up to there - {caught} *", caught=fault("caught")),
    Quote("exit status {status} - {left} (the timeout + about {extra} s)",
          status=status("stall"),
          left=span([fault(n) for n in ("exit3", "exit0", "end", "stall")]),
          extra=derived("{:.0f}", lambda stall: stall - TIMEOUT, fault("stall"))),
    Quote("the exit status is the signal's ({kill9}, {sigterm}) - {killed} *",
          kill9=status("kill9"), sigterm=status("sigterm"),
          killed=span([fault("kill9"), fault("sigterm")])),
    Quote("then the abort of a rank that raised - {model} *", model=fault("model")),
    Quote("nothing; exit status {status} - {evaluate}",
          status=status("evaluate"), evaluate=fault("evaluate")),
    Quote("What each fault on one of {ranks} ranks does",
          ranks=grep(FAULTS, r"^\| fault on rank \d+ of (\d+) \|", convert=spelled)),
    Quote("two barriers per {area} MiB of buffer", area=area_mib()),
    Quote("a float16 model of 1.1 million parameters takes {barriers} a step",
          barriers=in_code(SHM, "SHM_AREA_MAX_BYTES", barriers)),
    Quote("The window takes one {area} MiB area per rank plus one in the machine's shared "
          "memory (``/dev/shm`` with MPICH); with more than {ranks} ranks the areas shrink "
          "to keep the window near {budget} MiB.",
          area=area_mib(),
          ranks=in_code(SHM, "SHM_NODE_BUDGET_BYTES",
                        lambda budget: budget // (2 << 20) - 1),
          budget=in_code(SHM, "SHM_NODE_BUDGET_BYTES", lambda budget: budget >> 20)),
    Quote("in {share} of the memory the processes can still get",
          share=in_code("nnabla_mpt/distributed/memory_room.py", "SHARED_SHARE",
                        lambda share: {0.5: "half"}.get(share, share))),
    Quote("the other {share} is left for the parameters",
          share=in_code("nnabla_mpt/distributed/memory_room.py", "SHARED_SHARE",
                        lambda share: {0.5: "half"}.get(1 - share, 1 - share))),
    Quote("``timeout`` seconds ({timeout} by default,",
          timeout=in_code("nnabla_mpt/distributed/collective_timeout.py", "DEFAULT_TIMEOUT",
                          fmt="{:g}")),
    Quote("(+{deep}% step time for a deep narrow MLP of {functions} functions a pass",
          deep=derived("{:.1f}", lambda r: 100 * (r - 1), cell(CALLBACK, "deep-narrow", 5)),
          functions=deep_narrow(lambda hidden: 2 * hidden + 3)),
    Quote("for a deep narrow one with {arrays} parameter arrays",
          arrays=deep_narrow(lambda hidden: 2 * (hidden + 1))),
    Quote("while its history holds fewer than {samples} reaches (``MIN_SAMPLES`` in "
          "``nnabla_mpt.scale.scale_history``: the first {samples} steps when none is "
          "skipped), every {every}th step (``WATCH_EVERY``)",
          samples=in_code("nnabla_mpt/scale/scale_history.py", "MIN_SAMPLES", spelled),
          every=in_code("nnabla_mpt/scale/scale_history.py", "WATCH_EVERY")),
    Quote("On the {cores}-core machine of the test suite",
          cores=header(FUSED[0], "machine", convert=lambda text: text.split()[0])),
    Quote("With {ranks} ranks: * The fused call",
          ranks=grep(FUSED[0], r"^# (\d+) ranks,")),
    Quote("by 3.6–4.5× ({mlp} arrays), 6.7× ({cnn} arrays) and 9.7–9.8× ({resnet} arrays)",
          mlp=cell(FUSED[0], "mlp-10", 1), cnn=cell(FUSED[0], "cnn-50", 1),
          resnet=cell(FUSED[0], "resnet-200", 1)),
    Quote("The target of 3× from {cnn} arrays on is met", cnn=cell(FUSED[0], "cnn-50", 1)),
    Quote("the single-process samples/s with {ranks} ranks (one thread each",
          ranks=cell(PARALLEL[0], "2", 0)),
]

NOT_MEASURED = {
    "waited more than 600 s": "the default timeout of MPICommunicator",
    "rank 0 of 3": "the timeout message as it reads for rank 0 of an example of three ranks",
    "rank 1 of 3": "the abort message as it reads for rank 1 of three (fault_times.py's fault)",
    "waited more than 2 s": "the timeout message as it reads with fault_times.py's timeout=2",
    "2× ideal": "the ideal speed-up of two ranks",
    "The target of 3×": "the target the fused all-reduce was built to meet",
    "1.1 million parameters": "the size of an example model, 1.1 million parameters",
    "the communicator, one call that copies rank 0's initial parameters": DESIGN + "; "
                                                                          + INDEX,
    "(the all-reduce of one rank is a no-op)": "a job of a single rank",
    "one a step and one when the updater is built": DESIGN,
    "Launching --------- On one machine": "a condition: the ranks of a single machine",
    "reach one another by": PRONOUN,
    "(one ``host:ranks`` per line)": "the form of a hosts file",
    "(0 to ``local_size - 1``)": INDEX,
    "What one step exchanges": DESIGN,
    "in **one** call": DESIGN,
    "as one buffer laid end to end": DESIGN,
    "(on one machine two barriers per": "a condition (a single machine) and "
                                        "SharedMemoryReduction's two barriers a chunk",
    "float32 graphs only, take two whatever their size": "the two barriers of a call on "
                                                        "shared gradients, its design",
    '"one all-reduce per step"': DESIGN,
    "packed into one array of the updater's own": DESIGN,
    "hold exactly the gradients of one process": "a single process, the comparison",
    "(a test runs two ranks on the same batches beside one process": "the setting of "
        "tests/distributed, two ranks against a single process",
    "``log2(N)`` factors of 2 lower than one process's": "the growth factor 2, and a "
                                                        "single process",
    "or a cuda ``half`` one,": PRONOUN,
    "- one ``all_reduce`` (gradients and flags fused: on one machine two barriers per": DESIGN,
    "two in all over shared float32 gradients; three MPI collectives across machines) - one "
    "more ``all_reduce`` of two values (the votes)": DESIGN + " (three: the signatures' "
                                                     "allgather, Reduce_scatter_block, "
                                                     "Allgather)",
    "- one ``all_reduce`` of one packed array: one MPI check and one NCCL call - one more "
    "(the votes): one MPI check and one NCCL call": DESIGN,
    "then one ``all_reduce`` of the flags - one more (the votes)": DESIGN,
    "Rarer collectives: one ``all_reduce`` when the updater is built": DESIGN,
    "one small ``all_reduce`` when ``scale=\"auto\"`` calibrates": DESIGN,
    "one small ``all_reduce`` on every good step": DESIGN,
    "one more when a collapse is diagnosed": DESIGN,
    "That one check suffices": DESIGN,
    "One case also checks each rank's own gradients": DESIGN,
    "a cudnn half or mixed_half context": HALF,
    "thus take one process's steps and scales": "a single process, the comparison",
    "every one of the solver's parameters": PRONOUN,
    "in one small all-reduce: a mismatch": DESIGN,
    "in a two-element all-reduce, whether": DESIGN,
    "(one read per input)": DESIGN,
    "(one small host read through NumPy)": DESIGN,
    "a good step keeps its one collective": DESIGN,
    "and a two-element all-reduce combines the findings": DESIGN,
    "two ranks holding 40000 each give 80000": "an example of a float16 sum that "
                                               "overflows, its arithmetic",
    "integers wider than 16 bits": "the width of an integer type, a fact of the dtypes",
    "until it was fixed in 2023: pmodels/mpich#6538": "the year of MPICH's fix and its "
                                                      "issue's number",
    "(With exactly two ranks any all-reduce agrees, since IEEE addition of two operands is "
    "commutative": "a fact of IEEE addition, two operands",
    "with three or more it need not": "a fact of IEEE addition, three operands or more",
    "computed once, on one rank, and only copied": DESIGN,
    "* when all ranks run on one machine": "a condition: the ranks of a single machine",
    "a call costs two barriers per": "SharedMemoryReduction's two barriers a chunk, its "
                                     "design",
    "copied into one contiguous buffer": DESIGN,
    "``Reduce`` to rank 0 then ``Bcast``": INDEX,
    "Gradients in shared memory On one machine the updaters go one step further":
        "a condition: the ranks of a single machine; an idiom, no count",
    "a second barrier ends the call": ANOTHER,
    "of a half-precision graph": HALF,
    "more than one rank": "a condition: several ranks",
    "(64 MiB in a Docker container unless ``--shm-size`` says otherwise)":
        "Docker's default size of /dev/shm",
    "(one process here, where the all-reduce has nothing to": "how the example runs, a "
                                                              "single process",
    "copies rank 0's values to every rank, bit for bit, in one buffer": DESIGN + "; "
                                                                        + INDEX,
    "If one rank raises": "a fault on any single rank",
    "within a fraction of a second": "an estimate of an abort's delay, which the fault "
                                     "table below measures (0.6 s)",
    "also one that the backward pass did not reach": PRONOUN,
    "A communicator holds one armed reduction": DESIGN,
    "the arrays of an earlier one": PRONOUN,
    "as one made for each backward pass does": PRONOUN,
    "+0.1% for a wide one": PRONOUN,
    "Two networks trained with callbacks made once": "the test's two networks, its design",
    "a pass of any graph makes one due": DESIGN,
    "the updater refuses one)": PRONOUN,
    "(the gradients would be reduced twice)": "a reduction done in the callback and by the "
                                              "updater, two",
    "the all-reduce of ranks on one machine": "a condition: the ranks of a single machine",
    "the wait of one rank is the work of another: while rank 0 evaluates or saves a "
    "checkpoint between two steps": "an example of a pause; " + INDEX,
    "The window takes one": DESIGN,
    "area per rank plus one in the machine's shared memory": DESIGN,
    "What each fault on one of": "a fault on a single rank, the table's setting",
    "fault on one rank": "a fault on a single rank, the table's setting",
    "(one ``update()`` fewer)": "the fault of fault_times.py, its setting",
    "none: rank 0 evaluates for three times the timeout": "the fault of fault_times.py, "
                                                          "its setting",
    "nothing else running: three runs of ``benchmarks/allreduce_bench.py --reps 100`` and of "
    "``benchmarks/dataparallel_bench.py``, one of": "the results files it names, three "
                                                    "and one",
    "beats one call of the same communicator per array": DESIGN,
    "and one call per array of the shared gradients": DESIGN,
    "the shared-memory one was the fastest": PRONOUN,
    "faster than one plain ``Allreduce``": DESIGN,
    "(one thread each": "the benchmark's setting, OMP_NUM_THREADS=1",
    "for a deep narrow one with": PRONOUN,
}

QUOTES += [
    Quote("each rank prints its line with the same count: {calls} all-reduces in {steps} "
          "steps,",
          calls=shown(PAGE, r"(\d+) all-reduces in \d+ steps"),
          steps=shown(PAGE, r"\d+ all-reduces in (\d+) steps")),
]
