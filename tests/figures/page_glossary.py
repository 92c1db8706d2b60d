"""The figures of docs/glossary.rst: none; its definitions state facts of float16 and the
margin's bounds, which the measured page's figures cover."""
PAGE = "docs/glossary.rst"

QUOTES = []

NOT_MEASURED = {}
