"""Ranks out of step are named, never paired silently: each step's all-reduce carries
every rank's step index (``exchange.StepFlags``), under real
``mpiexec -n 3``, with MPICommunicator and with the stand-in for nnabla's communicator
reducing in float16 (``mpi_workers/standins.py``)."""

import pytest

from mpi_helpers import check_ok, load_meta, run_mpi


@pytest.mark.parametrize("comm", ["mpi", "float16"])
def test_a_rank_out_of_step_is_named_on_every_rank(tmp_path, comm):
    from support import assert_names
    check_ok(run_mpi(3, "out_of_step.py", tmp_path, comm))
    ranks = load_meta(tmp_path, 3)
    errors = {meta["error"] for meta in ranks}
    assert len(errors) == 1, errors                      # the same error on every rank
    error = errors.pop()
    assert error is not None
    # each rank with the step it was at
    assert_names(error, "out of step", "all-reduce", "rank 0 at step 5", "rank 1 at step 5",
                 "rank 2 at step 3")
    assert [meta["steps"] for meta in ranks] == [5, 5, 3]   # no step was counted
