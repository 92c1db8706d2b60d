"""Saturation decided where values saturate: each rank's own gradients are checked against
65504 before the exchange, the reduced ones again only where the reduction sums in
float16. With identical batches on every rank (learning rate 0, sums, not averages) the
ranks take exactly the steps and scales of one process."""
import pytest

from mpi_helpers import check_ok, load_meta, run_mpi

STEPS = 12


def run_ranks_json(n, worker, outdir, *args):
    """The JSON each of ``n`` ranks of ``worker`` wrote, once the job ended cleanly."""
    check_ok(run_mpi(n, worker, outdir, *args))
    return load_meta(outdir, n)


def one_process(tmp_path, precision):
    out = tmp_path / "alone"
    out.mkdir()
    return run_ranks_json(1, "saturation.py", out, "none", precision, STEPS)[0]


@pytest.mark.parametrize("comm, precision, n", [
    ("standin", "half", 2), ("standin", "half", 3),    # a float32 reduction of float16
    ("mpi", "float", 2)])                              # MPICommunicator, float32 graph
def test_ranks_with_one_batch_follow_one_process(tmp_path, comm, precision, n):
    alone = one_process(tmp_path, precision)
    # the scale grows until the step's own gradients saturate (at 16384), then alternates
    assert max(alone["scales"]) == 8192.0 and alone["skipped"] == [5, 7, 9, 11]
    for rank, meta in enumerate(run_ranks_json(n, "saturation.py", tmp_path, comm,
                                               precision, STEPS)):
        assert meta == alone, f"rank {rank} of {n}"
