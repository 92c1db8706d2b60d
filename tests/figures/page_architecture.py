"""The figures of docs/architecture.rst: none is measured."""

PAGE = "docs/architecture.rst"

QUOTES = []

NOT_MEASURED = {}
