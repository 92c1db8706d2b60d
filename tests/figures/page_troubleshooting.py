"""The figures of docs/troubleshooting.rst: its reports are the examples' output, which
tests/test_troubleshooting_page.py checks; its prose quotes messages, not measurements."""

PAGE = "docs/troubleshooting.rst"

QUOTES = []

NOT_MEASURED = {
    "step 5": "the out-of-step message as it reads for an example of three ranks",
    "step 3": "the out-of-step message as it reads for an example of three ranks",
    "6 of 6": "the refused checkpoint's message as it reads for an example parameter",
    "3000.7": "an example of a scale float16 holds only rounded",
    "0.3": "an example backoff_factor",
    "1.5": "an example growth_factor",
}
