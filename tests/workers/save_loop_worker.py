"""Saves a large checkpoint to one path over and over, until it is killed.

Usage: python save_loop_worker.py CHECKPOINT

The network has a few million parameters, so each save spends most of its time writing:
a kill lands in the middle of a write.
"""
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [TESTS, os.path.dirname(TESTS)]     # this checkout's nnabla_mpt, not another

from support import Net  # noqa: E402

from nnabla_mpt import DynamicLossScalingUpdater  # noqa: E402


def main(checkpoint: str) -> None:
    net = Net(d_in=512, hidden=4096)
    updater = DynamicLossScalingUpdater(net.solver("Adam", alpha=1e-2), net.loss, net.feeder)
    while True:
        updater.save_checkpoint(checkpoint)


if __name__ == "__main__":
    main(sys.argv[1])
