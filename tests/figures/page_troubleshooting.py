"""The figures of docs/troubleshooting.rst: its reports are the examples' output, which
tests/test_troubleshooting_page.py checks; its prose quotes messages, not measurements."""

PAGE = "docs/troubleshooting.rst"

QUOTES = []

NOT_MEASURED = {
    "paired rank 0 at step 5, rank 1 at step 5, rank 2 at step 3":
        "the out-of-step message as it reads for an example of three ranks",
    "(6 of 6 values)": "the refused checkpoint's message for an example parameter",
    "holds 3000.7 as 3000": "an example of a scale float16 holds only rounded",
    "``backoff_factor`` of 0.3": "an example setting",
    "``growth_factor`` of 1.5": "an example setting",
    "grown to ``2**20``": "an example of a float32 run's scale",
}
