"""The figures of examples/nnabla_updater_collapse.py: its docstring and --help, all of
them the example's own inputs and nnabla's limits (its results are quoted in the README),
but for the scale nnabla's updater ends at, read from its results."""
from figures import Quote, grep

PAGE = "examples/nnabla_updater_collapse.py"

QUOTES = [
    Quote("the scale sinks to {zero} while ``update()`` goes on returning",
          zero=grep("nnabla_updater_collapse.txt", r"call \d+: scale (0), after")),
]

NOT_MEASURED = {
    "(4-8-1, ReLU, squared error)": "the example network's layer widths",
    "from its 20th batch on": "the example's input: where its outliers start",
    "300 times larger": "the example's input: how large its outliers are",
    "up to 100 times a call": "nnabla's updater's limit of recursive calls, in its source",
    "after 8 overflowing steps in a row": "the default diagnose_after",
    "the same batches run twice, once with each updater": "the example's two runs, one "
                                                          "with each updater",
}
