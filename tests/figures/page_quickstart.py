"""The figures of docs/quickstart.rst: the demo's time, and the training loop's output."""
from figures import MARGIN, VERSION, Quote, date_of, grep, load_of, shown

PAGE = "docs/quickstart.rst"
DEMO = "demo.txt"

QUOTES = [
    Quote("({total} s in all on {date}, with a load average of {load} before the run: "
          "``benchmarks/results/demo.txt``)",
          total=grep(DEMO, r"total time ([\d.]+) s"),
          date=date_of(DEMO),
          load=load_of(DEMO)),
    Quote("one doubling at step {first}, one at {second}, one at {third}",
          first=shown(PAGE, r"^step (\d+): scale 2048; next scale 4096$"),
          second=shown(PAGE, r"^step (\d+): scale 4096; next scale 8192$"),
          third=shown(PAGE, r"^step (\d+): scale 8192; next scale 16384$")),
]

NOT_MEASURED = {
    "gradients 8 times below": MARGIN,
    "Python 3.10 and nnabla 1.39": VERSION,
    '"every 100 updates"': "an example of a schedule a script keys on updates",
}

CHECKED_BY = {
    "2 of the 40": "tests/test_quickstart_page.py",
}
