"""No collective waits forever: a rank that leaves or stalls ends the whole job within
MPICommunicator's timeout (2 s here) and a few seconds, under real ``mpiexec -n 3``; a
rank that merely works longer than the timeout between collectives is no fault."""
import time

import pytest

from mpi_helpers import run_mpi

FAULTS = ["caught", "exit3", "exit0", "end", "stall"]


def _launch(mode, tmp_path):
    start = time.monotonic()
    result = run_mpi(3, "leave.py", tmp_path, mode, timeout=60)
    return result, time.monotonic() - start


@pytest.mark.parametrize("mode", FAULTS)
def test_a_rank_that_leaves_or_stalls_ends_the_job(tmp_path, mode):
    from support import assert_names
    result, elapsed = _launch(mode, tmp_path)
    assert result.returncode != 0
    assert elapsed < 30, f"the job took {elapsed:.1f} s to end"
    assert_names(result.stderr, "all_reduce", "waited more than 2 s", "timeout=2",
                 "MPICommunicator", "rank(s) 1", "did not arrive")
    # ranks 0 and 2 took the steps rank 1 took with them (all but the last when rank 1
    # caught its error and went on, one update() short), and no rank ended normally
    last = 6 if mode == "caught" else 2
    done = {p.name for p in tmp_path.iterdir()}
    assert {f"rank{r}_step{i}" for r in (0, 2) for i in range(last + 1)} <= done
    assert not {"done0", "done2", f"rank0_step{last + 1}", f"rank2_step{last + 1}"} & done


def test_a_rank_working_longer_than_the_timeout_between_collectives_is_no_fault(tmp_path):
    result, elapsed = _launch("evaluate", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert {p.name for p in tmp_path.iterdir()} >= {"done0", "done1", "done2"}
    assert "waited more than" not in result.stderr


def test_the_timeout_is_checked():
    from nnabla_mpt import MPICommunicator
    from support import raises_naming
    with raises_naming(ValueError, "timeout", "> 0", "-1"):
        MPICommunicator(timeout=-1)
    with raises_naming(TypeError, "timeout", "real number", "'10'", "str"):
        MPICommunicator(timeout="10")
