"""The README's figures: the demo's time, and the quick start's shown output."""
from figures import MARGIN, VERSION, Quote, date_of, grep, load_of, machine_of, shown

PAGE = "README.md"
DEMO = "demo.txt"
COLLAPSE = "nnabla_updater_collapse.txt"

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
    Quote("the scale is 0 at call {call}, after {passes} backward passes",
          call=grep(COLLAPSE, r"call (\d+): scale 0, after"),
          passes=grep(COLLAPSE, r"scale 0, after (\d+) backward passes")),
    Quote("at step {step}, after {n} in a row, stops with `LossScaleCollapseError`: "
          "`{culprit}`",
          step=grep(COLLAPSE, r"step (\d+): LossScaleCollapseError"),
          n=grep(COLLAPSE, r"\((\d+) consecutive steps"),
          culprit=grep(COLLAPSE, r"non-finite\): (.*)$")),
    Quote("the weights as the good steps left them (largest {final})",
          final=grep(COLLAPSE, r"applied, scale \d+; largest weight ([\d.]+)")),
    Quote("At step {step} the history leaves room for two doublings at once",
          step=shown(PAGE, r"^step (\d+): scale 1024 -> 4096$")),
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
}
