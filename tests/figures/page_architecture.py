"""The figures of docs/architecture.rst: none is measured; the counts of the package's
entries and of the reference cases are read from the repository."""
from figures import DESIGN, HALF, PRONOUN, Quote, in_code, in_repo

PAGE = "docs/architecture.rst"
MATRIX = "tests/test_reference_matrix.py"


def entries(root):
    """The entries of the top of the package, as ``tests/test_architecture.py`` counts
    them."""
    return len([p for p in (root / "nnabla_mpt").iterdir() if p.name != "__pycache__"])


QUOTES = [
    Quote("The top of the package holds {entries} entries", entries=in_repo(entries)),
    Quote("The suite runs {cases} such cases in one process and {mpi} under ``mpiexec -n 2``",
          cases=in_code(MATRIX, "SEEDS", len), mpi=in_code(MATRIX, "MPI_SEEDS", len)),
    Quote("one with batch normalization and one with a {wide} layer",
          wide=in_code("tests/reference_step.py", "Model.SHAPES",
                       lambda shapes: "{1}x{2}".format(*shapes["wide"]))),
]

NOT_MEASURED = {
    "one micro-batch's pass with the backward seed": "what the module covers, a pass per "
                                                     "micro-batch",
    "which changes one thing at a time": DESIGN,
    "On a change to one of these modules": PRONOUN,
    "and every listed one that no longer survives": PRONOUN,
    "one micro-batch's pass: the": "what the module covers, a pass per micro-batch",
    "the step loop itself fits on one page": "the step loop's module, a single page",
    "and one folder is no part of the step at all": "the folder ``report/``, named next",
    "says in one line what it holds": "the form of a folder's docstring",
    "the two public updaters": "DynamicLossScalingUpdater and FixedLossScalingUpdater",
    "the dynamic one's own settings": PRONOUN,
    "decide (in one place)": DESIGN,
    "keeps one step, setting change, load or save at a time": DESIGN,
    "status 2 naming the path of a bad directory": "the exit status the report command "
                                                   "sets for a bad directory (argparse's)",
    "a half-written last line left out": "a line cut off by an interrupted write, no count",
    "skipped steps per thousand": "the unit of the share, per thousand",
    "from one plain object of arrays": DESIGN,
    "the one divided out of the gradients": PRONOUN,
    "in one prebuilt graph": DESIGN,
    "the loss in half,": HALF,
    "the parts of one step": DESIGN,
    "what one ``update()`` did": DESIGN,
    "what one step comes to": DESIGN,
    "a ring of two steps' losses": "the length of LossRecorder's ring, a constant of its code",
    "a new one at every pass": PRONOUN,
    "the fused buffer of one all-reduce": DESIGN,
    "a shared-memory window on one machine": "a condition: the ranks of a single machine",
    "one copy per rank": DESIGN,
    "the ranks of one machine": "a condition: the ranks of a single machine",
    "from one rank to all": DESIGN,
    "when one rank raises": "a fault on any single rank",
    "flags as one buffer": DESIGN,
    "the flags in the step's one all-reduce": DESIGN,
    "one locked temporary per target": DESIGN,
    "One ``update()``": DESIGN,
    "(half and float graphs, a small model, one with batch normalization and one with":
        HALF + "; the reference cases' models, named",
    "or make a half loss non-finite": HALF,
    "on a half graph": HALF,
    "such cases in one process": "how the tests run the cases, in a single process",
    "A piece two folders need goes into the lower one": "the rule for shared code, no count",
    "belongs to one of the grouped options": PRONOUN,
    "(one ``all_reduce`` a step, a small one for each vote;": DESIGN,
    "The MPI one lives in": PRONOUN,
    "(one more reduction in the stacked row)": DESIGN,
}
