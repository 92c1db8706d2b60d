"""The figures of examples/digits_demo.py: its docstring and its --help texts."""
from figures import MARGIN, Quote, grep

PAGE = "examples/digits_demo.py"

QUOTES = [
    Quote("the default run's scale reaches {top} ({power}) at step {step}",
          top=grep("demo.txt", r"max (\d+), final"),
          power=grep("demo.txt", r"max (\d+), final",
                     convert=lambda v: f"2**{int(v).bit_length() - 1}"),
          step=grep("demo.txt", r"\b(\d+):131072\b")),
    Quote("measured growth lets reach the seed's ceiling, 32768 at step {step}",
          step=grep("demo_float16_loss.txt", r"\b(\d+):32768\b")),
]

NOT_MEASURED = {
    "keeps every gradient 8 times": MARGIN,
    "between 1.4 and 8 times": "the bounds of the margin measured growth's history sets "
                               "(the square root of 2, and 8)",
    "at least 10 s after": "the least time between two progress lines, the demo's setting",
    "once 10 s have passed": "the least time between two progress lines, the demo's setting",
    "'fast|step|0.9': fp16 for the first 90%": "the example schedule of --help",
    "'fast|loss|1.05'": "the example loss trigger of --help",
}
