"""The updaters against the reference step (tests/reference_step.py), over a sample of the
option matrix drawn from fixed seeds; see tests/reference_cases.py for what is drawn and
what is compared. A larger sweep: ``benchmarks/reference_sweep.py``."""
import collections
import functools

import pytest

import nnabla as nn

from mpi_helpers import run_mpi
from reference_cases import UPDATER_OPTIONS, run_case, sample_case

SEEDS = range(120)
#: Seeds 1000-1011, and 1055: saturation mode over MPICommunicator's float32 sums, where
#: only each rank's own gradients are compared with 65504 (the sums are checked for inf/NaN).
MPI_SEEDS = list(range(1000, 1012)) + [1055]


@functools.lru_cache(maxsize=None)
def outcomes(seed):
    """The kind of every step of the case of ``seed``, trained and checked once per run
    (a case that fails raises, and is not kept)."""
    nn.clear_parameters()
    return collections.Counter(run_case(sample_case(seed), scope=f"case{seed}"))


@pytest.mark.parametrize("seed", SEEDS)
def test_updater_matches_the_reference(seed):
    assert sum(outcomes(seed).values()) > 0


def test_the_sample_covers_every_option_and_outcome():
    # Alone, it trains the cases itself; after the matrix tests it reads their outcomes.
    cases = [sample_case(seed) for seed in SEEDS]
    for key in UPDATER_OPTIONS[:-1] + ("updater", "precision", "size", "solver"):
        values = {repr(c.get(key)) for c in cases}
        assert len(values) >= 2, f"the sample draws one value of {key}: {values}"
    events = {e for c in cases for ev in c["events"] for e in ev.values()}
    assert events == {"far", "huge", "big", "nan", "inf"}
    seen = sum((outcomes(seed) for seed in SEEDS), collections.Counter())
    assert {"updated", "skipped", "bad batch", "updated, loss not finite"} <= set(seen), seen


def test_ranks_match_the_reference_with_mpi_communicator():
    proc = run_mpi(2, "reference_matrix.py", None, *MPI_SEEDS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("rank")]
    assert len(lines) == 2 * len(MPI_SEEDS), proc.stdout
