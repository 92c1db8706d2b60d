"""The figures of docs/api.rst: none is measured."""

PAGE = "docs/api.rst"

QUOTES = []

NOT_MEASURED = {}
