"""``tools/gpu_check.py``, the GPU check a user runs: without CUDA it says what it needs
and exits 3 (nothing checked); its pieces work; and its checks pass on the CPU with the suite's stand-ins for
what only a GPU does (``mpi_workers/standins.py``, the CPU contexts of
``core/test_contexts.py``), so the script keeps up with the package while no GPU runs it.
"""
import subprocess
import sys

import numpy as np
import nnabla as nn
import pytest

from doc_pages import ROOT
from mpi_workers.standins import NcclLikeCommunicator

sys.path.insert(0, str(ROOT / "tools"))
import gpu_check  # noqa: E402

SCRIPT = ROOT / "tools" / "gpu_check.py"


def _cuda_importable() -> bool:
    try:
        import nnabla_ext.cuda  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


no_cuda = pytest.mark.skipif(_cuda_importable(), reason="nnabla_ext.cuda is installed")


@no_cuda
def test_without_cuda_it_says_what_it_needs_and_exits_with_nothing_checked(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == gpu_check.NOTHING_CHECKED == 3, proc.stderr[-2000:]
    out = proc.stdout
    assert "SKIP gpu_check: nnabla_ext.cuda (or .cudnn) cannot be imported" in out
    assert f"nnabla-ext-cuda matching nnabla {nn.__version__}" in out
    assert "a CUDA device" in out and "Nothing was checked" in out
    assert "PASS" not in out and "FAIL" not in out


@no_cuda
def test_a_communicator_s_child_process_reports_each_of_its_checks():
    """Here nnabla's communicator cannot be made: every check of the child is a SKIP that
    says why, and the parent reads them from the child's output."""
    results = gpu_check.run_child("cudnn:half")
    assert [r.name for r in results] == ["communicator_dtype_cudnn_half",
                                         "communicator_model_check", "communicator_loss",
                                         "collectives"]
    for r in results:
        assert r.status == "SKIP" and "could not be made" in r.detail, r.line()


def _fine():
    return True, "all good"


def _wrong():
    return False, "not what was expected"


def _skipped():
    raise gpu_check.Skip("nothing to check here")


def _broken():
    raise ValueError("line one\nline two")


@pytest.mark.parametrize("check, line", [
    (_fine, "PASS name: all good"),
    (_wrong, "FAIL name: not what was expected"),
    (_skipped, "SKIP name: nothing to check here"),
    (_broken, "FAIL name: ValueError: line one line two"),
])
def test_a_check_s_outcome_is_one_line(check, line):
    result = gpu_check.run_check("name", check)
    assert result.line() == line
    assert gpu_check.parse_line(result.line()) == result


def test_lines_that_are_no_result_are_not_read_as_one():
    for line in ["# nnabla 1.39.0", "PASS", "PASS name", "OK name: fine", ""]:
        assert gpu_check.parse_line(line) is None


def test_the_float64_reference_clips_the_unscaled_norm_to_the_bound():
    scale = 2.0 ** 10
    scaled = [np.full(10000, 1000.0, np.float16), np.array([3000.0, 4000.0], np.float16)]
    assert sum(float(np.sum(g.astype(np.float32) ** 2)) for g in scaled) > 65504
    unscaled = [g.astype(np.float64) / scale for g in scaled]
    norm = np.sqrt(sum(np.sum(g ** 2) for g in unscaled))
    kept, got_norm = gpu_check.clipped_reference(scaled, scale, None)
    assert got_norm == pytest.approx(norm, rel=1e-15)
    for k, u in zip(kept, unscaled):
        np.testing.assert_array_equal(k, u)
    clipped, _ = gpu_check.clipped_reference(scaled, scale, 2.0)
    assert np.sqrt(sum(np.sum(g ** 2) for g in clipped)) == pytest.approx(2.0, rel=1e-12)
    np.testing.assert_allclose(clipped[1], unscaled[1] * 2.0 / norm, rtol=1e-15)
    below, _ = gpu_check.clipped_reference(scaled, scale, 2 * norm)
    np.testing.assert_array_equal(below[0], unscaled[0])


def test_the_proxy_records_calls_and_passes_everything_on():
    comm = NcclLikeCommunicator("float16")
    counted = gpu_check.Proxy(comm)
    array = nn.NdArray((3,))
    array.cast(np.float32)[...] = 1.0
    counted.all_reduce([array], division=False, inplace=True)
    assert (counted.size, counted.rank) == (1, 0)
    assert counted.take() == [("all_reduce", 1, {"division": False, "inplace": True})]
    assert counted.take() == [] and comm.n_calls == 1
    assert gpu_check.describe([("all_reduce", 2, {"inplace": True})]) == \
        "all_reduce(2 arrays, inplace=True)"


def _cpu(type_config="half", device=""):
    return gpu_check.make_context("cpu", type_config, device)


MIXED_HALF_AS_HALF = ["cpu:mixed_half", "cpu:half", "cpu:float"]   # cudnn's mixed_half
MIXED_HALF_AS_FLOAT = ["cpu:mixed_half", "cpu:float"]              # cuda's mixed_half

CPU_CHECKS = {
    "dtype_half": lambda: gpu_check.check_compute_dtype(_cpu(), "float16"),
    "dtype_mixed_half_as_half": lambda: gpu_check.check_compute_dtype(
        nn.Context(MIXED_HALF_AS_HALF, "CpuCachedArray", ""), "float16"),
    "dtype_mixed_half_as_float": lambda: gpu_check.check_compute_dtype(
        nn.Context(MIXED_HALF_AS_FLOAT, "CpuCachedArray", ""), "float32"),
    "reduction_device": lambda: gpu_check.check_reduction_device(_cpu(device="3")),
    "clipping": lambda: gpu_check.check_clipping(_cpu(), width=64),
    "host_reads": lambda: gpu_check.check_host_reads(_cpu(), lambda: None, False, steps=4,
                                                     widths=(16, 16, 4)),
    "training": lambda: gpu_check.check_training(_cpu(), steps=60),
    "communicator_dtype_float16": lambda: gpu_check.check_communicator_dtype(
        NcclLikeCommunicator("float16"), "float16"),
    "communicator_dtype_float32": lambda: gpu_check.check_communicator_dtype(
        NcclLikeCommunicator("float32"), "float32"),
    "communicator_model_check": lambda: gpu_check.check_communicator_model(
        NcclLikeCommunicator("float16"), _cpu(), "float16"),
    "communicator_loss": lambda: gpu_check.check_communicator_loss(
        NcclLikeCommunicator("float16"), _cpu()),
    "collectives": lambda: gpu_check.check_collectives(NcclLikeCommunicator("float16"),
                                                       _cpu()),
}


@pytest.mark.parametrize("name", sorted(CPU_CHECKS))
def test_each_check_passes_on_the_cpu_stand_ins(name):
    result = gpu_check.run_check(name, CPU_CHECKS[name])
    assert result.status == "PASS", result.line()


CPU_FAILURES = {
    # the CPU's half graph computes in float16, not float32
    "dtype": lambda: gpu_check.check_compute_dtype(_cpu(), "float32"),
    # on the CPU the solver's own inf/NaN check runs every step: on a GPU that is a FAIL
    "host_reads": lambda: gpu_check.check_host_reads(_cpu(), lambda: None, True, steps=2,
                                                     widths=(16, 4)),
    "communicator_dtype": lambda: gpu_check.check_communicator_dtype(
        NcclLikeCommunicator("float32"), "float16"),
    "communicator_model_check": lambda: gpu_check.check_communicator_model(
        NcclLikeCommunicator("float32"), _cpu(), "float16"),
}


@pytest.mark.parametrize("name", sorted(CPU_FAILURES))
def test_a_check_fails_where_the_device_would_differ(name):
    result = gpu_check.run_check(name, CPU_FAILURES[name])
    assert result.status == "FAIL", result.line()


def _fake_extension(name: str, backends) -> object:
    """A stand-in for ``nnabla_ext.<name>`` (cuda, cudnn) whose contexts are CPU contexts
    that compute as the GPU's are read to: ``backends`` maps a type configuration to
    them."""
    import types
    module = types.ModuleType(f"nnabla_ext.{name}")
    module.__version__ = nn.__version__
    module.__cuda_version__ = module.__cudnn_version__ = "(stand-in)"
    module.get_device_count = lambda: 2
    module.synchronize = lambda device_id=0, **kw: None
    module.context = lambda device_id="0", type_config="float", **kw: nn.Context(
        backends[type_config], "CpuCachedArray", str(device_id))
    return module


@no_cuda
def test_a_whole_run_reports_every_check_once(monkeypatch, capsys):
    """With stand-ins for nnabla_ext.cuda and .cudnn on the CPU: every check reports once;
    on the CPU the solver's own inf/NaN check runs each step, which on a device is the
    FAIL of host_reads; the communicator checks, in child processes without the stand-ins,
    are SKIPs."""
    import nnabla_ext
    half, as_half = ["cpu:half", "cpu:float"], ["cpu:mixed_half", "cpu:half", "cpu:float"]
    fakes = {"cudnn": {"half": half, "mixed_half": as_half, "float": ["cpu:float"]},
             "cuda": {"half": half, "mixed_half": MIXED_HALF_AS_FLOAT, "float": ["cpu:float"]}}
    for name, backends in fakes.items():
        module = _fake_extension(name, backends)
        monkeypatch.setitem(sys.modules, f"nnabla_ext.{name}", module)
        monkeypatch.setattr(nnabla_ext, name, module, raising=False)
    monkeypatch.setattr(gpu_check, "SIZES", {"train_steps": 60, "clip_width": 64,
                                             "reads_steps": 2, "reads_widths": (16, 4)})
    status = gpu_check.run_all("0")
    results = [r for r in map(gpu_check.parse_line, capsys.readouterr().out.splitlines())
               if r is not None]
    by_name = {r.name: r for r in results}
    assert len(by_name) == len(results) == 14
    assert status == 1 and by_name["host_reads"].status == "FAIL"
    local = ["dtype_cudnn_half", "dtype_cudnn_mixed_half", "dtype_cuda_half",
             "dtype_cuda_mixed_half", "reduction_device", "clipping", "training"]
    for name in local:
        assert by_name[name].status == "PASS", by_name[name].line()
    assert "device(s) ['1']" in by_name["reduction_device"].detail   # the last device
    for name in ["communicator_dtype_cudnn_half", "communicator_dtype_cudnn_mixed_half",
                 "communicator_dtype_cuda_mixed_half", "communicator_model_check",
                 "communicator_loss", "collectives"]:
        assert by_name[name].status == "SKIP", by_name[name].line()


def test_a_child_process_that_prints_nothing_is_a_fail(monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")     # ends at once, status 1
    results = gpu_check.run_child("cudnn:half")
    assert len(results) == 1 and results[0].status == "FAIL", results
    assert results[0].name == "communicator_cudnn_half"
    assert "ended with status 1" in results[0].detail


def test_the_exit_status_says_failed_nothing_checked_or_passed():
    R = gpu_check.Result
    assert gpu_check.exit_status([R("PASS", "a", ""), R("FAIL", "b", "")]) == 1
    assert gpu_check.exit_status([R("SKIP", "a", ""), R("SKIP", "b", "")]) == 3
    assert gpu_check.exit_status([]) == 3
    assert gpu_check.exit_status([R("SKIP", "a", ""), R("PASS", "b", "")]) == 0
