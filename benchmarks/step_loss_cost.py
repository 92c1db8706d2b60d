"""What keeping the step's loss costs: the updater as it is against the same updater with
the loss's array taken out of the step, in one process.

Run::

    .venv/bin/python benchmarks/step_loss_cost.py [--rounds 300] [--model mlp-1e4]

Two copies of the model of ``updater_overhead.py``, each with its own
``DynamicLossScalingUpdater``, timed in interleaved blocks (the order reverses every
round):

* ``as_is``     each step takes its losses from the recorder's ring
                (``LossRecorder.start``) and each forward pass writes the loss into its
                own array of them, which the step's result keeps;
* ``no_array``  the recorder hands every step the same losses and runs the bare forward
                pass: the loss keeps its one array, and no result could give its loss
                (what the loop did before ``StepResult.loss``).

The table shows the median step time of each and the medians over rounds of the
per-round ratios to ``no_array``. Nothing here reads the loss.
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


def contenders(spec):
    def updater(scope):
        loss, params = overhead.build(scope, spec, 0)
        return DynamicLossScalingUpdater(overhead.make_solver(params), loss, overhead.feed,
                                         scale=8.0, N=10 ** 9)

    as_is, no_array = updater("as_is"), updater("no_array")
    recorder, _ = no_array._passes[id(no_array.loss)]
    fixed = recorder.start()      # one StepLosses for every step, never written

    def bare_forward(losses, micro_batch, clear_no_need_grad):
        no_array.loss.forward(clear_no_need_grad=clear_no_need_grad)

    recorder.start = lambda: fixed
    recorder.forward = bare_forward
    return {"as_is": as_is, "no_array": no_array}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=80, help="steps per block")
    parser.add_argument("--model", choices=list(overhead.MODELS), default="mlp-1e4")
    args = parser.parse_args()
    updaters = contenders(overhead.MODELS[args.model])
    overhead.clock = overhead.CLOCKS["wall"]
    times = overhead.interleaved({k: u.update for k, u in updaters.items()}, args.steps,
                                 args.rounds, args.warmup)
    print(f"# {args.model}, {args.rounds} rounds of {args.steps} steps, interleaved")
    for k, v in times.items():
        ratio = statistics.median(a / b for a, b in zip(v, times["no_array"]))
        print(f"{k:<10} {statistics.median(v) * 1e6:8.1f} us   {ratio:.4f} x no_array")


if __name__ == "__main__":
    main()
