#!/usr/bin/env python
"""What nnabla's own loss-scaling updater does with a stretch of outlier batches, and what
nnabla_mpt's does with the same script.

A small float16 regression network (4-8-1, ReLU, squared error) trains with SGD; from
its 20th batch on, for a long stretch, the inputs are 300 times larger, so that the
squared error overflows float16 whatever the loss scale. The same network, the same
initial weights and the same batches run twice, once with each updater, swapped by the
import as the migration page describes, with the arguments nnabla's takes
(``scale=2**15``, ``N=2000``):

* ``nnabla.experimental.mixed_precision_training.DynamicLossScalingUpdater`` halves the
  scale on each overflowing backward pass and calls itself again on the next batch, up to
  100 times a call, then returns without a word. On the way down it reaches a scale at
  which an outlier batch does not overflow, and applies it: the weights blow up, every
  later batch overflows, and the scale sinks to 0 while ``update()`` goes on returning;
* ``nnabla_mpt.DynamicLossScalingUpdater`` skips each overflowing step and backs the scale
  off; after 8 overflowing steps in a row it replays the batch, finds the function that
  overflows and stops the run with a ``LossScaleCollapseError`` that names it, the
  weights as they were before the outliers.

It prints what each did at the calls where something changed. Run it from the checkout::

    .venv/bin/python examples/nnabla_updater_collapse.py
"""
import argparse

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context

#: The batches (counted from 1, as fed) whose inputs are 300 times larger.
OUTLIERS = range(20, 1400)


def build():
    """The network, its solver and a feeder of its batches; the weights from seed 0."""
    nn.clear_parameters()
    nn.seed(0)
    with nn.context_scope(get_extension_context("cpu", type_config="half")):
        x, t = nn.Variable((16, 4)), nn.Variable((16, 1))
        y = PF.affine(F.relu(PF.affine(x, 8, name="fc1")), 1, name="fc2")
        loss = F.mean(F.squared_error(y, t))
        solver = S.Sgd(0.01)
    solver.set_parameters(nn.get_parameters())
    rng = np.random.RandomState(0)
    fed = [0]

    def feed():
        fed[0] += 1
        batch = rng.randn(16, 4)
        if fed[0] in OUTLIERS:
            batch = batch * 300.0
        x.d, t.d = batch, batch.sum(axis=1, keepdims=True)

    return loss, solver, feed, fed


def largest_weight() -> float:
    return max(float(np.abs(v.d).max()) for v in nn.get_parameters().values())


def run_nnabla(calls: int) -> None:
    from nnabla.experimental.mixed_precision_training import DynamicLossScalingUpdater
    loss, solver, feed, fed = build()
    updater = DynamicLossScalingUpdater(solver, loss, feed, scale=2.0 ** 15, N=2000)
    start = largest_weight()
    print(f"nnabla's DynamicLossScalingUpdater: largest weight {start:.3g} at the start")
    said_blow_up = said_zero = False
    for call in range(calls):
        updater.update()                   # returns None, whatever happened
        weight = largest_weight()
        if not said_blow_up and weight > 100 * start:
            said_blow_up = True
            print(f"  call {call}: scale {updater.scale:g}, {fed[0]} batches fed so far; "
                  f"an outlier batch applied: largest weight {weight:.4g}")
        if not said_zero and updater.scale == 0:
            said_zero = True
            print(f"  call {call}: scale 0, after {fed[0]} backward passes; nothing said")
    print(f"  call {calls - 1}: scale {updater.scale:g}, loss {float(loss.d)}, largest "
          f"weight {largest_weight():.4g}; update() returned every time, nothing raised")


def run_nnabla_mpt(calls: int) -> None:
    from nnabla_mpt import DynamicLossScalingUpdater, LossScaleCollapseError
    loss, solver, feed, fed = build()
    updater = DynamicLossScalingUpdater(solver, loss, feed, scale=2.0 ** 15, N=2000)
    print(f"nnabla_mpt's DynamicLossScalingUpdater: largest weight {largest_weight():.3g} "
          f"at the start")
    try:
        for _ in range(calls):
            updater.update()
    except LossScaleCollapseError as err:
        print(f"  step {updater.steps - 1}: LossScaleCollapseError: "
              f"{str(err).splitlines()[0]}")
        print(f"  {updater.skipped_steps} steps skipped, {updater.updates} applied, scale "
              f"{updater.scale:g}; largest weight {largest_weight():.3g}")
        return
    print(f"  {calls} calls without an error")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=40, help="update() calls of each run")
    args = p.parse_args(argv)
    run_nnabla(args.calls)
    run_nnabla_mpt(args.calls)


if __name__ == "__main__":
    main()
