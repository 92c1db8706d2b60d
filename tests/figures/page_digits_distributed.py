"""The figures of examples/digits_distributed.py: its docstring and its --help texts."""

PAGE = "examples/digits_distributed.py"

QUOTES = []

NOT_MEASURED = {}
