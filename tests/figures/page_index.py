"""The figures of docs/index.rst: none is measured."""

PAGE = "docs/index.rst"

QUOTES = []

NOT_MEASURED = {}
