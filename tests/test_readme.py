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
    # its figures are the demo's, checked by tests/figures/page_readme.py
    text = " ".join(README.split())
    assert "`benchmarks/results/demo.txt`" in text
    assert "the speed of float16 is a GPU matter" in text


def test_the_install_section_names_what_setup_py_declares():
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    section = README.split("## Install into your own environment")[1].split("\n## ")[0]
    extras = re.findall(r'^\s+"(\w+)": \[', setup.split("extras_require=")[1], re.M)
    assert extras == ["mpi", "demo", "test", "docs", "plot", "tensorboard"]
    for extra in extras:
        assert f"| `{extra}` |" in section, extra
    assert "CPython 3.8, 3.9 or 3.10" in section and 'python_requires=">=3.8,<3.11"' in setup
    assert re.search(r"nnabla-ext-cuda\d+", section) and "untested here" in section
    # every pip command of the section is run from the checkout, with extras setup.py has
    for command in re.findall(r"`(python -m pip install [^`]+)`", section):
        target = shlex.split(command)[-1]
        assert target == "." or re.fullmatch(r"\.\[[\w,]+\]", target), command
        for extra in re.findall(r"\w+", target):
            assert extra in extras, command
