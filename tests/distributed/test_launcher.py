"""Scripts started by a launcher: an updater without a communicator in a job of several
processes says that every rank trains alone; an MPICommunicator becomes the communicator
nnabla's own scripts ask for (``communicator_util.current_communicator()``), and offers or
refuses, by name, the rest of nnabla's Communicator API."""
import os
import subprocess
import sys

import numpy as np
import pytest

from mpi_helpers import TIMEOUT, WORKERS, bits, load_ranks, ranks_fixture, run_ranks, worker_env

ALONE = "every rank trains alone"
PAGE = " ".join((WORKERS.parents[1] / "docs" / "migration.rst").read_text().split())


def _alone(tmp_path, n):
    return run_ranks(n, "launched.py", tmp_path, "alone")


def test_updaters_without_comm_under_mpiexec_warn_once_on_each_rank(tmp_path):
    res = _alone(tmp_path, 2)
    for npz, meta in res:
        alone = [m for m in meta["warnings"] if ALONE in m]
        assert len(alone) == 1, meta["warnings"]   # two updaters, one warning
        assert "one of 2 started by" in alone[0]
        assert "PMI_SIZE=2" in alone[0]             # the variable MPICH's mpiexec sets
        assert "comm=MPICommunicator()" in alone[0]
        assert " ".join(alone[0].split()) in PAGE   # the migration page shows it as it is
    # and indeed they trained alone: each rank on its own batches
    assert not np.array_equal(res[0][0]["fc/affine/W"], res[1][0]["fc/affine/W"])


def test_one_process_under_mpiexec_is_not_warned(tmp_path):
    (_, meta), = _alone(tmp_path, 1)
    assert not [m for m in meta["warnings"] if ALONE in m], meta["warnings"]


def test_a_process_no_launcher_started_is_not_warned(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI", "OMPI_", "SLURM_", "MPI_", "HYDRA"))}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, str(WORKERS / "launched.py"), str(tmp_path),
                           "alone"], env=worker_env(env), capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (_, meta), = load_ranks(tmp_path, 1)
    assert not [m for m in meta["warnings"] if ALONE in m], meta["warnings"]


@pytest.mark.parametrize("environ,expected", [
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1"},
     ("OMPI_COMM_WORLD_SIZE", 4, "Open MPI")),
    ({"PMI_SIZE": "3", "PMI_RANK": "0"}, ("PMI_SIZE", 3, "MPICH")),
    ({"MV2_COMM_WORLD_SIZE": "2"}, ("MV2_COMM_WORLD_SIZE", 2, "MVAPICH2")),
    ({"PMIX_RANK": "2", "SLURM_STEP_NUM_TASKS": "8"}, ("SLURM_STEP_NUM_TASKS", 8, "srun")),
    ({"PMI_SIZE": "1"}, ("PMI_SIZE", 1, "MPICH")),
    ({"SLURM_NTASKS": "4"}, None),   # an allocation of 4 tasks, not a process of 4
    ({"PMI_SIZE": ""}, None),
    ({}, None),
])
def test_launched_ranks_reads_the_launchers_variable(environ, expected):
    from nnabla_mpt.distributed.launcher import launched_ranks
    found = launched_ranks(environ)
    if expected is None:
        assert found is None
    else:
        assert found[:2] == expected[:2] and expected[2] in found[2]


# ------------------------------------------------------------ nnabla's communicator

through_nnabla = ranks_fixture("launched.py", "nnabla", ranks=[2])


def test_set_current_communicator_is_what_nnabla_scripts_get(through_nnabla):
    for r, (npz, meta) in enumerate(through_nnabla[1]):
        assert meta["before_is_none"]      # under MPICH's mpiexec nnabla sees no communicator
        assert meta["returned_is_comm"]
        assert meta["current_is_comm"]
        assert (meta["rank"], meta["size"], meta["local_rank"]) == (r, 2, r)
        assert meta["name"] == "MPICommunicator"
        assert meta["single_or_rankzero"] == (r == 0)
        assert meta["cleared_returns_none"] and meta["after_clear_is_none"]
        assert npz["cost"].tolist() == [1.5 + 2.5]


def test_all_gather_copies_every_ranks_array_bit_for_bit(through_nnabla):
    for npz, meta in through_nnabla[1]:
        np.testing.assert_array_equal(npz["gathered"], [[0, 0, -1], [1, 10, -1]])
        assert meta["gathered16_dtypes"] == ["float16", "float16"]
        expected = np.array([[0.5, 65504], [1.5, 65504]], np.float16)
        np.testing.assert_array_equal(bits(npz["gathered16"]), bits(expected))


def test_all_gather_of_different_shapes_raises_on_every_rank(through_nnabla):
    from support import assert_names
    for _, meta in through_nnabla[1]:
        said = meta["mismatch"]
        assert_names(said, "all_gather", "rank 1", "(3,)", "float32", "rank 0", "(2,)",
                     "float32")
        # each rank with its own shape
        assert said.index("rank 1") < said.index("(3,)") < said.index("rank 0") < \
            said.index("(2,)"), said


def test_set_current_communicator_refuses_other_objects():
    from nnabla_mpt import set_current_communicator
    from support import raises_naming
    with raises_naming(TypeError, "comm", "MPICommunicator", "None", "str", "'world'"):
        set_current_communicator("world")


@pytest.mark.parametrize("method,args,advice", [
    ("reduce", ([], 0), "all_reduce(data, division=...)"),
    ("reduce_scatter", ([], None), "all_reduce(ndarray_list"),
    ("allreduce", (), "all_reduce([v.grad for v in params.values()]"),
    ("add_context_and_parameters", ((None, {}),), "pass comm= to an updater"),
    ("clear_context_parameters", (), "all_reduce("),
    ("new_group", (("node0", [0]),), "MPI.COMM_WORLD.Split(color)"),
    ("find_group", ("node0",), "one group, 'world'"),
    ("list_groups", (), "one group, 'world'"),
])
def test_the_rest_of_nnablas_api_is_refused_by_name(solo, method, args, advice):
    from support import raises_naming
    with raises_naming(NotImplementedError, f"MPICommunicator.{method}()", "not provided",
                       advice):
        getattr(solo, method)(*args)


def test_init_and_all_gather_in_one_process(solo):
    import nnabla as nn
    from support import raises_naming
    assert solo.init() is None
    a = nn.NdArray.from_numpy_array(np.array([3.0, -2.0], np.float32))
    out = [nn.NdArray((2,))]
    solo.all_gather(a, out)
    assert out[0].data.tolist() == [3.0, -2.0]
    with raises_naming(ValueError, "all_gather", "rank 0", "2 arrays", "ndarray_list",
                       "1 ranks"):
        solo.all_gather(a, [nn.NdArray((2,)), nn.NdArray((2,))])
    with raises_naming(TypeError, "ndarray", "nnabla.NdArray", "list", "[<NdArray((2,))"):
        solo.all_gather([a], out)


def test_sync_batch_normalization_needs_nnablas_communicator(solo):
    """The migration page's claim: nnabla's sync batch-norm takes its C++ communicator only."""
    import nnabla as nn
    import nnabla.parametric_functions as PF
    x = nn.Variable((4, 3, 2, 2))
    with pytest.raises(TypeError, match="expected nnabla.communicator.Communicator, got "
                                        "MPICommunicator"):
        PF.sync_batch_normalization(x, solo)
