"""The figures of examples/digits_demo.py: its docstring and its --help texts."""
from figures import HALF, MARGIN, PRONOUN, Quote, derived, grep

IMAGES = r"digits: (\d+) training and (\d+) test images"

PAGE = "examples/digits_demo.py"

QUOTES = [
    Quote("handwritten digits ({images} images, no download needed)",
          images=derived("{:.0f}", lambda train, test: train + test,
                         grep("demo.txt", IMAGES, group=1), grep("demo.txt", IMAGES, group=2))),
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
    "perceptron twice on": "the demo's two runs, in half precision and in float",
    "bundled 8x8 handwritten digits": "the size of scikit-learn's digits images",
    "* in half precision": HALF,
    "The ceiling case is one flag away": "the single option, --loss-dtype float16, named next",
    "the seed's ceiling, 32768 at step": "2**15, the largest power of two float16 holds",
    "above 32768 it is lowered to 32768, the largest fp16 can seed": "2**15, the largest "
                                                                     "power of two float16 "
                                                                     "holds",
    "the subnormal fraction is the one that shows": PRONOUN,
    "'probe' by one doubling": "probe growth by one factor, its definition",
    "one at an epoch's end": "the demo's progress lines, at most one an epoch (its design)",
}
