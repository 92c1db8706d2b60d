"""The figures of docs/accumulation.rst: none is measured."""

PAGE = "docs/accumulation.rst"

QUOTES = []

NOT_MEASURED = {}
