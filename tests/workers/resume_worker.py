"""Resumes the float16 run of ``support.resume_setup`` from a checkpoint, in a new process.

Usage: python resume_worker.py CHECKPOINT STEPS OUTPUT

Loads CHECKPOINT, runs STEPS updates and writes the parameters, the solver states, the
updater's state_dict and the step results to OUTPUT (an ``.npz`` file).
"""
import json
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [TESTS, os.path.dirname(TESTS)]     # this checkout's nnabla_mpt, not another

import numpy as np  # noqa: E402

from support import resume_setup, run_steps, solver_states  # noqa: E402


def main(checkpoint: str, steps: int, output: str) -> None:
    net, solver, updater = resume_setup()
    updater.load_checkpoint(checkpoint)
    results = run_steps(updater, steps)
    arrays = {f"param/{k}": v for k, v in net.snapshot().items()}
    meta = {"state": updater.state_dict(), "results": results, "t": {}}
    for name, (t, pstate) in solver_states(solver).items():
        meta["t"][name] = t
        for key, value in pstate.items():
            arrays[f"solver/{name}/{key}"] = value
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    np.savez(output, **arrays)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
