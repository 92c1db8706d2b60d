"""The figures of examples/nnabla_updater_collapse.py: its docstring and --help, all of
them the example's own inputs and nnabla's limits (its results are quoted in the README)."""
PAGE = "examples/nnabla_updater_collapse.py"

QUOTES = []

NOT_MEASURED = {
    "(4-8-1, ReLU, squared error)": "the example network's layer widths",
    "from its 20th batch on": "the example's input: where its outliers start",
    "300 times larger": "the example's input: how large its outliers are",
    "up to 100 times a call": "nnabla's updater's limit of recursive calls, in its source",
    "after 8 overflowing steps in a row": "the default diagnose_after",
}
