"""The figures of docs/accumulation.rst: its example's scales, which the example asserts
(tests/test_docs.py runs it)."""
from figures import DESIGN, PRONOUN

PAGE = "docs/accumulation.rst"

QUOTES = []

NOT_MEASURED = {
    "one call of ``update()`` runs ``k`` micro-batches": DESIGN,
    "once: 1. ``solver.zero_grad()``": "the first item of the list of a step's parts",
    "instead); 2. ``k`` times": "the second item of the list of a step's parts",
    "3. with a communicator, one all-reduce of the accumulated gradients; 4. one overflow "
    "check; 5. skip": "the last items of the list of a step's parts, each done once (its "
                      "design)",
    "without one, nothing writes": PRONOUN,
    "every step would sum one batch ``k`` times": "what a graph without a feeder sums: the "
                                                  "same batch in each of the k passes",
    "gets no warning; one that reads": PRONOUN,
    "step like one batch ``k`` times larger": "the equivalence of summed accumulation: k "
                                              "micro-batches as one batch k times larger",
    "the step equals one step on the large batch": "the equivalence of averaged "
                                                   "accumulation, by its definition",
    "the whole batch of 32 samples": "the example's batch, its input (``model(32)``)",
    "One ``solver.scale_grad`` pass": DESIGN,
    "A factor of exactly 1 skips the pass": "the factor that changes nothing, 1",
    "up to ``k`` times one micro-batch's": "the bound of a sum of k micro-batches' gradients",
    "accumulated four times": "the example's ``accum_grad=4``, its input",
    "the single one fits; the sum of four overflows": "the example's two updaters, "
                                                      "``accum_grad=1`` and ``accum_grad=4``",
    "One check per step": DESIGN,
    "so one check sees them all": DESIGN,
    "One all-reduce per step": DESIGN,
    "travel in one ``all_reduce`` call": DESIGN,
    "may take one more small all-reduce": DESIGN,
    "go into the one unscale pass": DESIGN,
    "for the cost of one exchange": DESIGN,
    "It runs as one process as shown": "how the example is run, one process",
}

CHECKED_BY = {
    "overflows at ``2**15`` and at ``2**14``, two steps are skipped": "tests/test_docs.py",
    "the third runs at ``2**13``": "tests/test_docs.py",
    "three steps of four micro-batches feed twelve batches and make three all-reduce calls":
        "tests/test_docs.py",
}
