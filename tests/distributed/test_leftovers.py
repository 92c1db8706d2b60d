"""The MPI tests' clean-up after an aborted job (``mpi_helpers._remove_leftovers``)
removes the shared-memory segments the job left behind, and only those: a segment that
a live process holds belongs to another job running beside it, whose ranks would hang
waiting to attach to a segment removed under them."""
import mmap
import os

import pytest

from mpi_helpers import (RANKS, SHM, _held_in_shm, _mpich_segments, _remove_leftovers,
                         run_mpi)


@pytest.fixture
def segments():
    """Makes segments named as MPICH names its own; removes what is left of them."""
    made = []

    def make(tag):
        path = SHM / f"mpich_shm_leftover_test_{os.getpid()}_{tag}"
        path.write_bytes(b"\0" * mmap.PAGESIZE)
        made.append(path)
        return path
    yield make
    for path in made:
        if path.exists():
            path.unlink()


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this machine")
def test_a_segment_no_process_holds_is_removed_and_a_held_one_kept(segments):
    before = _mpich_segments()
    left = segments("left")
    opened = segments("opened")
    mapped = segments("mapped")
    with open(opened, "rb"), open(mapped, "r+b") as f:
        view = mmap.mmap(f.fileno(), 0)
        f.close()                         # held by the mapping alone from here
        _remove_leftovers(before, settle=0.2)
        assert opened.exists() and mapped.exists()
        view.close()
    assert not left.exists()


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this machine")
@pytest.mark.parametrize("n", RANKS, ids=lambda n: f"np{n}")
def test_a_job_that_aborts_leaves_no_segment_behind(tmp_path, n):
    # a rank raises at step 3: MPI_Abort ends the job while its segments are mapped, and
    # a rank may outlive mpiexec by a moment; the segments of another job running beside
    # this one are held by its processes and are not counted
    before = _mpich_segments()
    result = run_mpi(n, "train.py", tmp_path, "raise", 3)
    assert result.returncode != 0 and f"data loader failed on rank {n - 1}" in result.stderr
    assert not _mpich_segments() - before - _held_in_shm()
