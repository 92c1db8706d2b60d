"""The report on the monitoring page is the one of the committed example run: the
command's output the page shows and the committed PNG (whose Description holds the
summary it was drawn with) come from the committed series (the figures its prose quotes:
tests/figures/page_monitoring.py)."""
import re
import struct
import subprocess
import sys

import pytest

from doc_pages import ROOT

EXAMPLE = "docs/_static/report_example"
FIGURE = ROOT / "docs" / "_static" / "report_example.png"
PAGE = (ROOT / "docs" / "monitoring.rst").read_text(encoding="utf-8")


def png_text(path):
    """The tEXt chunks of a PNG: ``{keyword: text}``."""
    data, i, chunks = path.read_bytes(), 8, {}
    while i < len(data):
        (length,), kind = struct.unpack(">I", data[i:i + 4]), data[i + 4:i + 8]
        if kind == b"tEXt":
            key, _, text = data[i + 8:i + 8 + length].partition(b"\0")
            chunks[key.decode("latin-1")] = text.decode("latin-1")
        i += 12 + length
    return chunks


@pytest.fixture(scope="module")
def shown():
    """The command and its output as the page shows them."""
    block = PAGE.split(".. code-block:: console\n\n")[1].split("\n\n.. image::")[0]
    lines = [line[4:] for line in block.splitlines()]
    assert lines[0].startswith("$ ")
    return lines[0][2:], "\n".join(lines[1:]) + "\n"


def test_the_page_shows_what_the_command_prints_of_the_committed_series(shown, tmp_path):
    command, output = shown
    assert command == f"python -m nnabla_mpt.report {EXAMPLE} --out {EXAMPLE}.png"
    proc = subprocess.run([sys.executable, "-m", "nnabla_mpt.report", EXAMPLE, "--out",
                           str(tmp_path / "drawn.png")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.replace(str(tmp_path / "drawn.png"), f"{EXAMPLE}.png") == output
    # the committed figure was drawn from these series: its Description is the summary
    assert png_text(FIGURE)["Description"] == output.rsplit("  wrote", 1)[0].rstrip("\n")
    assert png_text(tmp_path / "drawn.png")["Description"] == png_text(FIGURE)["Description"]


def test_the_example_says_how_it_was_made():
    run = (ROOT / EXAMPLE / "run.txt").read_text(encoding="utf-8")
    assert re.search(r"^# \d{4}-\d\d-\d\dT[\d:]+[+-]\d{4}; nnabla_mpt at \w+", run, re.M)
    assert "load average before" in run
    demo = re.search(r"^# OMP_NUM_THREADS=1 python examples/digits_demo.py (.+)$", run, re.M)
    assert demo and demo.group(1) == ("--out OUT --scale 32768 --monitor-interval 10 "
                                      "--stats-every 10 --no-progress")
    assert f"# python -m nnabla_mpt.report {EXAMPLE} --out {EXAMPLE}.png" in run
    assert "--scale 32768\n--monitor-interval 10 --stats-every 10" in PAGE
