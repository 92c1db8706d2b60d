"""What seeding the backward pass with an array of the scale saves: the updater as it is
against the same updater seeding with the number, in one process.

Run::

    .venv/bin/python benchmarks/backward_seed.py [--rounds 300] [--model mlp-1e4]
                                                 [--reverse-build]

Two copies of the model of ``updater_overhead.py``, each with its own
``DynamicLossScalingUpdater``, timed in interleaved blocks (the order reverses every
round):

* ``array``   each backward pass is seeded with the updater's array of the scale
              (``BackwardSeed``), filled once;
* ``number``  each backward pass is seeded with the scale itself, ``loss.backward(scale)``:
              nnabla builds and fills a new array for every pass (what the loop did before
              ``BackwardSeed``).

The table shows the median step time of each and the medians over rounds of the
per-round ratios to ``number``. Both compute the same gradients, bit for bit. A model
built earlier can run at a different speed for where its memory lies: ``--reverse-build``
builds ``number`` first.
"""
import argparse
import os
import statistics
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import updater_overhead as overhead  # noqa: E402
from nnabla_mpt import DynamicLossScalingUpdater  # noqa: E402


class _Number:
    """Stands in for the updater's BackwardSeed: the seed is the scale itself."""

    @staticmethod
    def at(scale):
        return scale


def contenders(spec, reverse_build=False):
    def updater(scope):
        loss, params = overhead.build(scope, spec, 0)
        return DynamicLossScalingUpdater(overhead.make_solver(params), loss, overhead.feed,
                                         scale=8.0, N=10 ** 9)

    if reverse_build:
        number, array = updater("number"), updater("array")
    else:
        array, number = updater("array"), updater("number")
    recorder, _ = number._passes[id(number.loss)]
    number._passes[id(number.loss)] = (recorder, _Number())
    return {"array": array, "number": number}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40, help="steps per block")
    parser.add_argument("--model", choices=list(overhead.MODELS), default="mlp-1e4")
    parser.add_argument("--reverse-build", action="store_true",
                        help="build number's model first (the run order stays)")
    args = parser.parse_args()
    updaters = contenders(overhead.MODELS[args.model], args.reverse_build)
    times = overhead.interleaved({k: u.update for k, u in updaters.items()}, args.steps,
                                 args.rounds, args.warmup)
    print(f"# {args.model}, {args.rounds} rounds of {args.steps} steps, interleaved, cpu "
          f"clock, built {'number, array' if args.reverse_build else 'array, number'}")
    for k, v in times.items():
        ratio = statistics.median(a / b for a, b in zip(v, times["number"]))
        print(f"{k:<8} {statistics.median(v) * 1e6:8.1f} us   {ratio:.4f} x number")


if __name__ == "__main__":
    main()
