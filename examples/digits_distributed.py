"""Data-parallel mixed-precision training on the digits data set with MPI.

Every rank trains on its own shard of the training set; the gradients are averaged over
the ranks once per step by MPICommunicator, and the loss-scaling updater skips a step on
every rank when any rank's float16 gradients overflow. All ranks therefore hold the same
parameters and report the same test accuracy.

Run::

    .venv/bin/mpiexec -n 2 .venv/bin/python examples/digits_distributed.py

Options: ``--precision float`` for a full-precision run, ``--steps``, ``--batch-size``
(global batch, split over the ranks), ``--lr``, ``--seed``.
"""
import argparse
import time

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context
from nnabla.logger import logger

from nnabla_mpt import DynamicLossScalingUpdater, GradientReduction, MPICommunicator


def load_data(seed):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32).reshape(-1, 1)
    return train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)


def mlp(x, hidden=64):
    h = F.relu(PF.affine(x, hidden, name="fc1"))
    h = F.relu(PF.affine(h, hidden, name="fc2"))
    return PF.affine(h, 10, name="fc3")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--precision", choices=["half", "float"], default="half",
                        help="the network's precision: float16 with loss scaling, or "
                             "float32")
    parser.add_argument("--steps", type=int, default=300, help="training steps")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="global batch size, split evenly over the ranks")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the data split and of the batches each rank draws")
    args = parser.parse_args()

    comm = MPICommunicator()  # a rank that raises aborts the whole job
    rank, size = comm.rank, comm.size
    if args.batch_size % size:
        raise SystemExit(f"--batch-size {args.batch_size} must be divisible by the "
                         f"number of ranks {size}")
    local_batch = args.batch_size // size

    x_train, x_test, y_train, y_test = load_data(args.seed)
    shard_x, shard_y = x_train[rank::size], y_train[rank::size]  # this rank's data

    nn.set_default_context(get_extension_context("cpu", type_config=args.precision))
    x, t = nn.Variable((local_batch, 64)), nn.Variable((local_batch, 1))
    loss = F.mean(F.softmax_cross_entropy(mlp(x), t))
    solver = S.Adam(args.lr)
    solver.set_parameters(nn.get_parameters())
    comm.broadcast_parameters(nn.get_parameters())  # every rank starts from rank 0's values

    rng = np.random.RandomState(args.seed + rank)

    def feed():
        idx = rng.randint(0, len(shard_x), local_batch)
        x.d, t.d = shard_x[idx], shard_y[idx]

    updater = DynamicLossScalingUpdater(solver, loss, feed, scale=2.0 ** 15, N=100, comm=comm,
                                        reduction=GradientReduction(average_ranks=True))
    start = time.perf_counter()
    for i in range(args.steps):
        step = updater.update()
        if rank == 0 and (i + 1) % 100 == 0:
            logger.info(f"step {i + 1}: loss scale {step.next_scale:g}, "
                        f"skipped so far {updater.skipped_steps}")
    elapsed = time.perf_counter() - start

    # Evaluate in float, sharing the trained parameters by name.
    nn.set_default_context(get_extension_context("cpu", type_config="float"))
    xe = nn.Variable.from_numpy_array(x_test)
    pred = mlp(xe)
    pred.forward(clear_buffer=True)
    accuracy = float((pred.d.argmax(axis=1) == y_test.ravel()).mean())

    everyone = comm.comm.gather(accuracy, root=0)  # each rank evaluated on its own
    if rank == 0:
        for r, acc in enumerate(everyone):
            print(f"rank {r}/{size}: final test accuracy {acc:.4f}")
        agree = all(a == everyone[0] for a in everyone)
        print(f"{size} ranks, {args.precision}, {args.steps} steps of global batch "
              f"{args.batch_size}: {updater.skipped_steps} skipped, final loss scale "
              f"{updater.scale:g}, {args.steps * args.batch_size / elapsed:.0f} samples/s; "
              f"accuracy identical on every rank: {'yes' if agree else 'NO'}", flush=True)


if __name__ == "__main__":
    main()
