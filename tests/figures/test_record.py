"""benchmarks/record.py keeps a command's output under the facts of its run, written whole
and only when the command succeeds."""
import subprocess
import sys

from doc_pages import ROOT
from figures import record_module

RECORD = ROOT / "benchmarks" / "record.py"


def record(out, *command):
    return subprocess.run([sys.executable, str(RECORD), str(out), "--", *command],
                          capture_output=True, text=True, timeout=60)


def read(path):
    return record_module().read(path)


def test_a_run_is_kept_with_its_facts(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "run.txt"
    done = record(out, sys.executable, "-c",
                  "import sys; print('table 1.5', flush=True); print('note', file=sys.stderr)")
    # the child flushes its stdout before it writes to stderr, so the order of the two
    # streams in the file is the same whether or not PYTHONUNBUFFERED is set
    assert done.returncode == 0, done.stderr
    lines = out.read_text().splitlines()
    assert [line.split(":")[0] for line in lines[:5]] == [
        "# date", "# machine", "# load before", "# command", "# revision"]
    assert lines[3].startswith("# command: OMP_NUM_THREADS=1 ")
    assert lines[5:7] == ["table 1.5", "note"]
    assert lines[7].startswith("# load after: ") and lines[8].startswith("# wall time: ")
    fields, body = read(out)
    assert body == "table 1.5\nnote" and fields["wall time"].endswith(" s")
    assert "CPUs" in fields["machine"] and len(fields["load before"].split(", ")) == 3


def test_a_failed_run_leaves_the_previous_results_and_nothing_else(tmp_path):
    out = tmp_path / "run.txt"
    out.write_text("the previous results\n")
    done = record(out, sys.executable, "-c", "print('half'); raise SystemExit(3)")
    assert done.returncode == 3
    assert "exited with 3" in done.stderr and str(out) in done.stderr
    assert out.read_text() == "the previous results\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.txt"]


def test_a_file_without_its_facts_is_refused_naming_it(tmp_path):
    out = tmp_path / "bare.txt"
    out.write_text("model ms\nmlp 1.0\n")
    try:
        read(out)
    except ValueError as error:
        assert str(out) in str(error) and "'date'" in str(error)
    else:
        raise AssertionError("a file without a header was read")


def test_usage_is_said_without_the_separator():
    done = subprocess.run([sys.executable, str(RECORD), "out.txt", "echo"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "record.py benchmarks/results/NAME.txt --" in done.stderr
