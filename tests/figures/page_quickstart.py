"""The figures of docs/quickstart.rst: the demo's time, and the training loop's output."""
from figures import (DESIGN, HALF, INDEX, MARGIN, NO_SCALE, PRONOUN, VERSION, Quote, date_of,
                     grep, header, in_code, load_of, shown, watch_schedule)

PAGE = "docs/quickstart.rst"
DEMO = "demo.txt"


def minutes(seconds: str) -> str:
    """A run's time as the prose rounds it: "a minute or two" from 60 s to 120 s."""
    seconds = float(seconds)
    if seconds < 60:
        return "less than a minute"
    return "a minute or two" if seconds < 120 else f"{seconds / 60:.0f} minutes"


QUOTES = [
    Quote("({total} s in all on {date}, with a load average of {load} before the run: "
          "``benchmarks/results/demo.txt``)",
          total=grep(DEMO, r"total time ([\d.]+) s"),
          date=date_of(DEMO),
          load=load_of(DEMO)),
    Quote("It takes {time} on a {cores}-core CPU",
          time=grep(DEMO, r"total time ([\d.]+) s", convert=minutes),
          cores=header(DEMO, "machine", convert=lambda text: text.split()[0])),
    Quote("one doubling at step {first}, one at {second}, one at {third}",
          first=shown(PAGE, r"^step (\d+): scale 2048; next scale 4096$"),
          second=shown(PAGE, r"^step (\d+): scale 4096; next scale 8192$"),
          third=shown(PAGE, r"^step (\d+): scale 8192; next scale 16384$")),
    Quote("8 times below the float16 maximum, {start} (an info line says so)",
          start=shown(PAGE, r"^step 0: scale (\d+);")),
    Quote("every step until it holds {samples} ({steps}), then each step where growth is due "
          "(every ``N=10`` good steps) and every {every}th.",
          **watch_schedule()),
    Quote("(defaults {min_scale} and ``2**24``;",
          min_scale=in_code("nnabla_mpt/scale/policy.py", "DEFAULT_MIN_SCALE", fmt="{:g}")),
]

NOT_MEASURED = {
    "gradients 8 times below": MARGIN,
    "Python 3.10 and nnabla 1.39": VERSION,
    '"every 100 updates"': "an example of a schedule a script keys on updates",
    "two commands do everything; each one builds": "the two commands the page names "
                                                   "(./run.sh test, ./run.sh demo); a "
                                                   "pronoun",
    "about a minute the first time": "the time of the environment's first build, not "
                                     "measured: it depends on the network and the caches",
    "digits data set twice": "the demo's two runs, in fp16 and in float",
    "under a half-precision context": HALF,
    "Each ``update()`` runs one step": DESIGN,
    "the backward pass at scale 1": NO_SCALE,
    "one doubling at step 9, one at 19, one at 29": "a doubling at each growth line of "
                                                    "the shown output (quoted above)",
    "none at 39": "the loop's last growth point (N=10, 40 steps), where the shown output "
                  "has no doubling",
    "one factor every ``N`` good steps": "probe growth by one factor, its definition",
    "where 65536 is already ``inf``": "2**16, the first power of two float16 cannot hold",
    "counted from 0 over the updater's life": INDEX,
    "Steps run by this call: 1, or more": "the least steps one call runs, one",
    "into one file, atomically": DESIGN,
    "an existing one keeps its own": PRONOUN,
    "restores all three into a freshly built model, solver and updater": "the three things "
                                                                          "the sentence names",
    "a damaged or crafted one, or one holding inf or NaN": PRONOUN,
    "one warning names each value": DESIGN,
}

CHECKED_BY = {
    "skips 2 of the 40 steps: the first one, and one growth back to ``2**15`` that went too "
    "far": "tests/test_quickstart_page.py",
}
