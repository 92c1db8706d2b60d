"""The README's commands run as written on a clean checkout, and it says where the time
goes."""
import re
import shlex
import subprocess

from doc_pages import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_mpiexec_of_the_readme_is_the_one_in_the_environment():
    # A bare `mpiexec` is not on the PATH of a fresh machine; .venv/bin/mpiexec is.
    uses = re.findall(r"([^\s`(]*)mpiexec", README)
    assert uses and all(prefix.endswith(".venv/bin/") for prefix in uses), uses


def test_the_distributed_example_runs_as_the_readme_writes_it():
    [command] = re.findall(r"`(\.venv/bin/mpiexec [^`]+)`", README)
    proc = subprocess.run(shlex.split(command) + ["--steps", "4", "--precision", "float"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "accuracy" in proc.stdout


def test_the_readme_says_where_the_time_goes():
    text = " ".join(README.split())
    assert "about 60 times slower than float" in text
    assert "the speed of float16 is a GPU matter" in text
