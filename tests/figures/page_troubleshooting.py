"""The figures of docs/troubleshooting.rst: its reports are the examples' output, which
tests/test_troubleshooting_page.py checks; its prose quotes messages, not measurements,
and the defaults it names are read from the code."""
from figures import ANOTHER, DESIGN, INDEX, NO_SCALE, PRONOUN, Quote, in_code, shown

PAGE = "docs/troubleshooting.rst"

QUOTES = [
    Quote("``diagnose_after`` consecutive overflowing steps (default {after})",
          after=in_code("nnabla_mpt/step/overflow_handling.py",
                        "OverflowHandling.diagnose_after")),
    Quote("so at scale {scale} the gradient flowing into ``Log``",
          scale=shown(PAGE, r"overflowed in backward at scale 2\*\*\d+ \((\d+)\)")),
]

NOT_MEASURED = {
    "paired rank 0 at step 5, rank 1 at step 5, rank 2 at step 3":
        "the out-of-step message as it reads for an example of three ranks",
    "(6 of 6 values)": "the refused checkpoint's message for an example parameter",
    "holds 3000.7 as 3000": "an example of a scale float16 holds only rounded",
    "``backoff_factor`` of 0.3": "an example setting",
    "``growth_factor`` of 1.5": "an example setting",
    "grown to ``2**20``": "an example of a float32 run's scale",
    "then one skipped step every ``N`` good ones": "probe growth's try at each growth "
                                                  "point, its definition",
    "``report.kind`` is one of": PRONOUN,
    "the batch is finite at scale 1": NO_SCALE,
    "or in backward even at scale 1": NO_SCALE,
    "one update with inf/NaN gradients destroys the weights": "a single update, no count",
    "at scale 1 they fit": NO_SCALE,
    "on one process, or call ``diagnose()``": "how to reproduce, a single process",
    "a ReLU maps NaN to 0": "what ReLU makes of NaN, zero",
    "would halve the scale one by one; a long run that meets a hundred of them":
        "an example: a hundred bad batches, each halving the scale",
    "When one of them holds inf/NaN": PRONOUN,
    "Each one is logged at debug level": PRONOUN,
    "the 1st, the 10th, the 100th and so on": "the bad batches the collapse watch warns at, "
                                              "its design (nnabla_mpt/step/collapse.py)",
    "a bad batch on one rank is a bad batch on every rank": "a batch of any single rank",
    "Two limits.": "the two limits the paragraph names",
    "a bad batch in an earlier one": PRONOUN,
    "the seed is 0, every gradient is 0": "float16's rounding of a seed below its smallest "
                                          "subnormal value: zero",
    "Between the two,": PRONOUN,
    "and 17496 as 17504": "float16's rounding of 17496 (its spacing there is 16), a fact of "
                          "the format",
    "with one warning naming": DESIGN,
    "(one warning names those it replaces)": DESIGN,
    "One written as a PyTorch loop": PRONOUN,
    "so that one forward pass computes both": DESIGN,
    "sets its inputs' gradients to 1": "what F.sink's backward sets, in nnabla's source",
    "A second ``error.forward()``": ANOTHER,
    "and a second move of the batch-normalization statistics": ANOTHER,
    "A leaf loss, or one that uses none": PRONOUN,
    "(with one, the step's loss": PRONOUN,
    "(one forward and up to two backward passes": DESIGN,
    "would otherwise move a second time": ANOTHER,
    "of rank(s) 1 differ from rank 0's": "the message as it reads for an example of two "
                                         "ranks; " + INDEX,
    "so two arrays of equal size swapped on one rank, or an array that is float16 on one "
    "rank": "an example of what the ranks do not compare",
    "(or one whose ``update()`` calls": PRONOUN,
    "runs one ``update()`` fewer": "the fault the sentence describes, a single step",
    "(say 3 or more)": "a rule of thumb for a headroom that is left, no measurement",
    "**Headroom 0 or 1 on some parameter**": "a headroom at the edge: no power of two left, "
                                             "or one",
    "(keep more than one for this reason)": PRONOUN,
}
