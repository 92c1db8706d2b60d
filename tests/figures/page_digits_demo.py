"""The figures of examples/digits_demo.py: its docstring and its --help texts."""
from figures import MARGIN, Quote, grep

PAGE = "examples/digits_demo.py"

QUOTES = [
    Quote("the default run's scale reaches 32768 at step {step}",
          step=grep("demo.txt", r"\b(\d+):32768\b")),
]

NOT_MEASURED = {
    "8 times": MARGIN,
    "10 s": "the least time between two progress lines, the demo's setting",
    "90%": "the share of the steps in fp16 of the example schedule 'fast|step|0.9'",
    "1.4": "the least margin measured growth's history sets, the square root of 2",
    "0.9": "the example schedule's VALUE in --help",
    "1.05": "the example loss trigger's VALUE in --help",
}
