"""The README's figures: the demo's time, and the quick start's shown output."""
import math

from figures import (DESIGN, MARGIN, NO_SCALE, PRONOUN, VERSION, Quote, date_of, grep,
                     load_of, machine_of, shown, spelled, watch_schedule)

PAGE = "README.md"
DEMO = "demo.txt"
COLLAPSE = "nnabla_updater_collapse.txt"


def doublings(line: str) -> str:
    """The doublings of a shown line ``step k: scale a -> b``, in words."""
    before, after = map(int, line.rsplit(" ", 3)[1::2])
    return spelled(math.log2(after / before))

QUOTES = [
    Quote("In the demo's 1000 steps fp16 training took {fp16} s and float training {flt} s: "
          "{ratio} times slower, by the demo's unrounded times (`./run.sh demo` on {date}, "
          "on a {machine} with a load average of {load} before the run: "
          "`benchmarks/results/demo.txt`)",
          fp16=grep(DEMO, r"training time\s+([\d.]+) s"),
          flt=grep(DEMO, r"training time\s+[\d.]+ s\s+([\d.]+) s"),
          ratio=grep(DEMO, r"here (\d+) times slower than float"),
          date=date_of(DEMO),
          machine=machine_of(DEMO),
          load=load_of(DEMO)),
    Quote("whose loss overflows float16 at any scale (run on {date}:", date=date_of(COLLAPSE)),
    Quote("at call {call}, at scale {scale}, applies one: the largest weight goes from {start} "
          "to {blown}",
          call=grep(COLLAPSE, r"call (\d+): scale [\d.]+, \d+ batches fed"),
          scale=grep(COLLAPSE, r"call \d+: scale ([\d.]+), \d+ batches fed"),
          start=grep(COLLAPSE, r"largest weight ([\d.]+) at the start"),
          blown=grep(COLLAPSE, r"an outlier batch applied: largest weight ([\d.]+)")),
    Quote("the scale is {zero} at call {call}, after {passes} backward passes",
          zero=grep(COLLAPSE, r"call \d+: scale (0), after"),
          call=grep(COLLAPSE, r"call (\d+): scale 0, after"),
          passes=grep(COLLAPSE, r"scale 0, after (\d+) backward passes")),
    Quote("at step {step}, after {n} in a row, stops with `LossScaleCollapseError`: "
          "`{culprit}`",
          step=grep(COLLAPSE, r"step (\d+): LossScaleCollapseError"),
          n=grep(COLLAPSE, r"\((\d+) consecutive steps"),
          culprit=grep(COLLAPSE, r"non-finite\): (.*)$")),
    Quote("the weights as the good steps left them (largest {final})",
          final=grep(COLLAPSE, r"applied, scale \d+; largest weight ([\d.]+)")),
    Quote("At step {step} the history leaves room for {doublings} doublings at once",
          step=shown(PAGE, r"^step (\d+): scale 1024 -> 4096$"),
          doublings=shown(PAGE, r"^step \d+: scale \d+ -> \d+$", group=0,
                          convert=doublings)),
    Quote("at scale 1 sets the start: {start} is the largest power of two",
          start=shown(PAGE, r"^start scale (\d+)$")),
    Quote("every step until it holds {samples} ({steps}), then every step where growth is due "
          "and every {every}th.",
          **watch_schedule()),
]

NOT_MEASURED = {
    "up to 100 times": "nnabla's updater's limit of recursive calls, in its source",
    "gradients 8 times below": MARGIN,
    "at steps 19 and 29": "the quick start's growth points after step 9, every N=10 steps "
                          "(its setting); its shown output says the scale held there",
    "the demo's 1000 steps": "the demo's length, its --steps default",
    "3.8": VERSION,
    "3.9": VERSION,
    "3.10": VERSION,
    "1.36": VERSION,
    "1.39": VERSION,
    "CUDA 11.0, 11.6, 12.0": VERSION,
    "grows one step late": "nnabla's updater, in its source: it grows the scale after "
                           "N + 1 good steps (``_counter > N``)",
    "from an applied one": PRONOUN,
    "trains one small float16 network with each updater": "the example's network, its design",
    "applies one: the largest weight": "the outlier batch the results' line names ('an "
                                       "outlier batch applied')",
    "in one `update()` a step": DESIGN,
    "take one decision on every rank": DESIGN,
    "both owning one training step": DESIGN,
    "equals the uninterrupted one": PRONOUN,
    "one fused all-reduce a step (on one machine,": DESIGN + "; a single machine",
    "one skip/update decision on every process": DESIGN,
    "(`pyenv install 3.10` gets one)": PRONOUN,
    "installed into this one": PRONOUN,
    "largest gradient at scale 1": NO_SCALE,
    "comes back from a spike in one move": "a single growth point: measured growth grows by "
                                           "as many factors as its history leaves room for "
                                           "(docs/measured.rst quotes the runs)",
    "growth by one factor every `N` steps": "probe growth by one factor, its definition",
    "the package, one module per concern": DESIGN,
}
