"""Does fp16 with dynamic loss scaling learn as well as float? Digits, same seed, same batches.

Two runs of the same 64-64-64-10 MLP on scikit-learn's digits (8x8 images, 10 classes):

* ``float``: float32 graph, plain loop (zero_grad, forward, backward, update), no scaling.
* ``fp16``:  float16 graph (``type_config='half'``: activations and gradients are real fp16
  and overflow to inf), driven by ``nnabla_mpt.DynamicLossScalingUpdater``.

Both start from the same initial parameters and see the same batches in the same order.
The loss is the batch *sum* of the cross-entropies (learning rate divided by the batch
size), so the network's own gradients, not just the seed of the backward pass, bound the
scale. Both are evaluated on the held-out split with a float32 graph.

Prints the final test accuracy of both runs, the skipped steps during the warm-up (the
steps before the first applied update) and after it, and the loss-scale trajectory, as
collected by an ``nnabla_mpt.LossScaleCallback`` attached with ``monitor=``.

Usage:
    .venv/bin/python benchmarks/convergence.py [--steps 1500] [--seed 0]
"""
import argparse
import math
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import nnabla as nn  # noqa: E402
import nnabla.functions as F  # noqa: E402
import nnabla.parametric_functions as PF  # noqa: E402
import nnabla.solvers as S  # noqa: E402
from nnabla.ext_utils import get_extension_context  # noqa: E402
from nnabla.logger import logger  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from nnabla_mpt import DynamicLossScalingUpdater, LossScaleCallback  # noqa: E402

HIDDEN = (64, 64)
FLOAT = get_extension_context("cpu", type_config="float")
HALF = get_extension_context("cpu", type_config="half")


def digits(seed):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)[:, None]
    return train_test_split(x, y, test_size=0.25, random_state=seed, stratify=data.target)


def network(ctx, scope, batch, seed=None):
    """Inputs, logits and summed loss in ``scope``; a graph built again reuses the params."""
    with nn.context_scope(ctx), nn.parameter_scope(scope):
        x = nn.Variable((batch, 64))
        t = nn.Variable((batch, 1))
        h = x
        for i, width in enumerate(HIDDEN + (10,)):
            rng = None if seed is None else np.random.RandomState(seed + i)
            h = PF.affine(h, width, name=f"fc{i}", rng=rng)
            if i < len(HIDDEN):
                h = F.relu(h)
        loss = F.sum(F.softmax_cross_entropy(h, t))
    return x, t, h, loss


def batch_order(n, batch, steps, seed):
    rng = np.random.RandomState(seed)
    epochs = math.ceil(steps * batch / n) + 1
    order = np.concatenate([rng.permutation(n) for _ in range(epochs)])
    return [order[i * batch:(i + 1) * batch] for i in range(steps)]


def solver_for(ctx, scope, lr):
    with nn.context_scope(ctx), nn.parameter_scope(scope):
        solver = S.Momentum(lr, 0.9)
        solver.set_parameters(nn.get_parameters())
    return solver


def accuracy(scope, x_test, y_test):
    x, t, logits, _ = network(FLOAT, scope, len(x_test))
    x.d = x_test
    logits.forward(clear_buffer=True)
    return float(np.mean(logits.d.argmax(axis=1) == y_test[:, 0]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05, help="per-example learning rate")
    parser.add_argument("--scale", type=float, default=2.0 ** 15, help="initial loss scale")
    parser.add_argument("--interval", type=int, default=200,
                        help="N: good steps before the scale grows")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logger.setLevel("WARNING")

    x_train, x_test, y_train, y_test = digits(args.seed)
    batches = batch_order(len(x_train), args.batch, args.steps, args.seed)
    lr = args.lr / args.batch

    nn.clear_parameters()
    # The same initial parameters in both scopes.
    xf, tf, _, loss_f = network(FLOAT, "float", args.batch, seed=args.seed)
    xh, th, _, loss_h = network(HALF, "half", args.batch, seed=args.seed)
    with nn.parameter_scope("float"):
        init = {k: v.d.copy() for k, v in nn.get_parameters().items()}
    with nn.parameter_scope("half"):
        for k, v in nn.get_parameters().items():
            v.d = init[k]

    solver_f = solver_for(FLOAT, "float", lr)
    start = time.perf_counter()
    for idx in batches:
        xf.d, tf.d = x_train[idx], y_train[idx]
        solver_f.zero_grad()
        loss_f.forward(clear_no_need_grad=True)
        loss_f.backward(clear_buffer=True)
        solver_f.update()
    float_time = (time.perf_counter() - start) / args.steps
    float_loss = float(loss_f.d) / args.batch

    feed_index = iter(batches)

    def feed():
        idx = next(feed_index)
        xh.d, th.d = x_train[idx], y_train[idx]

    windows = []
    results = []
    window = max(1, args.steps // 10)
    summary = LossScaleCallback(windows.append, interval=window)

    def hook(result):
        results.append(result)
        summary(result)

    updater = DynamicLossScalingUpdater(solver_for(HALF, "half", lr), loss_h, feed,
                                        scale=args.scale, N=args.interval, monitor=hook)
    start = time.perf_counter()
    for _ in range(args.steps):
        updater.update()
    half_time = (time.perf_counter() - start) / args.steps
    half_loss = float(loss_h.d) / args.batch
    summary.flush()

    acc_f = accuracy("float", x_test, y_test)
    acc_h = accuracy("half", x_test, y_test)
    first_update = next((r.step for r in results if not r.skipped), args.steps)
    warm_skipped = sum(r.skipped for r in results if r.step < first_update)
    after = [r for r in results if r.step >= first_update]
    after_skipped = sum(r.skipped for r in after)
    after_rate = after_skipped / max(1, len(after))

    print(f"# digits ({len(x_train)} train / {len(x_test)} test), MLP 64-"
          f"{'-'.join(map(str, HIDDEN))}-10, batch {args.batch}, summed loss, Momentum 0.9, "
          f"lr {args.lr:g}/batch, {args.steps} steps, seed {args.seed}")
    print(f"# fp16: DynamicLossScalingUpdater(scale={args.scale:g}, N={args.interval}); "
          f"nnabla {nn.__version__}, {os.cpu_count()} CPUs, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS')}")
    print(f"{'run':<6} {'test accuracy':>13} {'final loss':>10} {'skipped':>7} "
          f"{'ms/step':>8}")
    print(f"{'float':<6} {acc_f:>13.4f} {float_loss:>10.4f} {'-':>7} {float_time * 1e3:>8.2f}")
    print(f"{'fp16':<6} {acc_h:>13.4f} {half_loss:>10.4f} {updater.skipped_steps:>7} "
          f"{half_time * 1e3:>8.2f}")
    print(f"accuracy difference (float - fp16): {100 * (acc_f - acc_h):+.2f} points "
          f"(target: within 1 point)")
    print(f"warm-up (steps before the first update): {first_update} steps, {warm_skipped} "
          f"skipped; after warm-up: {after_skipped} of {len(after)} skipped "
          f"({100 * after_rate:.2f}%, target <= 1%)")
    print(f"loss-scale windows of {window} steps (LossScaleCallback):")
    print(f"  {'last step':>9} {'scale':>9} {'min':>9} {'max':>9} {'skipped':>7} "
          f"{'overflow rate':>13}")
    for s in windows:
        print(f"  {s.step:>9} {s.scale:>9g} {s.min_scale:>9g} {s.max_scale:>9g} "
              f"{s.skipped:>7} {s.overflow_rate:>13.3f}")
    changes = [(r.step, r.next_scale) for r in results if r.next_scale != r.scale]
    print("scale changes (step: new scale as a power of 2): " + (", ".join(
        f"{i}: 2^{math.log2(s):g}" for i, s in changes) or "none"))
    skipped_steps = [r.step for r in results if r.skipped]
    print(f"skipped steps: {skipped_steps}")


if __name__ == "__main__":
    main()
