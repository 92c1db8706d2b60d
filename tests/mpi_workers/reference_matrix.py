"""MPI worker: sampled cases of the option matrix against the reference step, every rank
with its own batches, the updater with an MPICommunicator.

Usage: mpiexec -n N python reference_matrix.py SEED [SEED ...]

Each rank runs :func:`reference_cases.run_case` for each seed (the reference sums the
ranks' gradients with mpi4py in float64) and prints one line per case; an assertion
error ends the job with the case, step and values in the message.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/

import nnabla as nn                                  # noqa: E402
from mpi4py import MPI                               # noqa: E402

from nnabla_mpt import MPICommunicator               # noqa: E402
from reference_cases import run_case, sample_case    # noqa: E402

comm = MPICommunicator()
for seed in map(int, sys.argv[1:]):
    nn.clear_parameters()
    case = sample_case(seed, ranks=comm.size)
    kinds = run_case(case, scope=f"case{seed}", mpi=MPI.COMM_WORLD, comm=comm)
    sys.stdout.write(f"rank {comm.rank} case {seed}: {' '.join(kinds)}\n")
