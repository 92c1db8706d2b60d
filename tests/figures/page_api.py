"""The figures of docs/api.rst and of the docstrings it renders: none is measured."""

PAGE = "docs/api.rst"

QUOTES = []

NOT_MEASURED = {
    "(3000.7 is 3000 in float16)": "an example of a scale float16 holds only rounded",
    "(3000.7 is 3000.0 in float16": "an example of a scale float16 holds only rounded",
    "``VALUE`` in [0.2, 0.9], default 0.9": "the range and default of a step trigger",
    "``VALUE`` in [1.01, 1.5], default 1.05": "the range and default of a loss trigger",
    '``"fast|step|0.9"``': "an example schedule",
}
