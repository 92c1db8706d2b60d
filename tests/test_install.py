"""Installing says at once which Pythons serve, and a communicator without mpi4py says how to
install it."""
import shutil
import subprocess
import sys

import pytest

from doc_pages import ROOT

CANDIDATES = ["/usr/bin/python3.11", "python3.11", "python3.12", "python3.13", "python3.7",
              "python3"]


def _python_outside_the_range():
    """A CPython whose version nnabla publishes no wheel for, or None."""
    for name in CANDIDATES:
        path = shutil.which(name)
        if path is None:
            continue
        proc = subprocess.run([path, "-c", "import sys; print(sys.version_info[:2] >= (3, 11)"
                               " or sys.version_info[:2] < (3, 8))"],
                              capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip() == "True":
            return path
    return None


OUTSIDE = _python_outside_the_range()
needs_outside = pytest.mark.skipif(OUTSIDE is None,
                                   reason="no CPython outside 3.8-3.10 is installed")


@pytest.fixture
def checkout(tmp_path):
    """A copy of what a build reads from the checkout."""
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "nnabla_mpt", tmp_path / "nnabla_mpt")
    return tmp_path


def _says_which_pythons_serve(output):
    assert "cannot be installed into Python 3." in output, output
    assert "CPython 3.8, 3.9 and 3.10 only" in output, output
    assert "pyenv install 3.10" in output, output
    assert "No matching distribution" not in output, output


@needs_outside
def test_setup_py_refuses_a_python_without_nnabla_wheels_first(checkout):
    proc = subprocess.run([OUTSIDE, "setup.py", "--version"], cwd=checkout,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "0.1.0" not in proc.stdout
    _says_which_pythons_serve(proc.stderr)


@needs_outside
def test_pip_install_from_the_checkout_stops_with_the_message(checkout, tmp_path):
    has_pip = subprocess.run([OUTSIDE, "-c", "import setuptools, pip"],
                             capture_output=True).returncode == 0
    if not has_pip:
        pytest.skip(f"{OUTSIDE} has no pip or setuptools")
    proc = subprocess.run([OUTSIDE, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(tmp_path / "target"), str(checkout)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    _says_which_pythons_serve(proc.stdout + proc.stderr)
    assert not (tmp_path / "target" / "nnabla_mpt").exists()


def test_setup_py_accepts_the_python_of_the_environment(checkout):
    proc = subprocess.run([sys.executable, "setup.py", "--version"], cwd=checkout,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "0.1.0"


def test_pyproject_declares_the_setuptools_build_backend():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "[build-system]" in text
    assert 'build-backend = "setuptools.build_meta"' in text


HIDE_MPI4PY = """
import sys
sys.modules["mpi4py"] = None   # as if mpi4py were not installed
import nnabla_mpt
try:
    nnabla_mpt.MPICommunicator()
except ModuleNotFoundError as exc:
    print("NAME", exc.name)
    print(exc)
"""


def test_a_communicator_without_mpi4py_says_how_to_install_it():
    proc = subprocess.run([sys.executable, "-c", HIDE_MPI4PY], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "NAME mpi4py"
    message = " ".join(lines[1:])
    assert "MPICommunicator needs mpi4py" in message
    assert 'pip install ".[mpi]"' in message
    assert "pip install mpi4py mpich" in message
    assert "MPI library" in message
