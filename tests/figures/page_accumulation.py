"""The figures of docs/accumulation.rst: its example's scales, which the example asserts
(tests/test_docs.py runs it)."""

PAGE = "docs/accumulation.rst"

QUOTES = []

NOT_MEASURED = {}

CHECKED_BY = {
    "overflows at ``2**15`` and at ``2**14``, two steps are skipped": "tests/test_docs.py",
    "the third runs at ``2**13``": "tests/test_docs.py",
}
