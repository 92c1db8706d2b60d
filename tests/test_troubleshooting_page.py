"""The reports shown on docs/troubleshooting.rst are what its code prints today."""
import pathlib
import re
import subprocess
import sys
import textwrap

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.rst"


def blocks(text, language):
    """Bodies of the page's ``.. code-block:: <language>`` directives."""
    found = []
    pattern = re.compile(r"^\.\. code-block:: " + language + r"\n\n((?:    .*\n|\n)+)", re.M)
    for m in pattern.finditer(text):
        found.append(textwrap.dedent(m.group(1)).strip("\n"))
    return found


def test_shown_reports_match_the_output_of_the_page_code(tmp_path):
    text = PAGE.read_text(encoding="utf-8")
    code, shown = blocks(text, "python"), blocks(text, "text")
    assert len(code) >= 5 and len(shown) == 2
    script = tmp_path / "troubleshooting.py"
    script.write_text("\n\n".join(code), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for report in shown:
        assert report.startswith("Loss-scale diagnosis: ")
        assert report in proc.stdout, ("the page shows a report the code no longer "
                                       f"prints:\n{report}")
    assert "nnabla_mpt: loss scale collapse (4 consecutive overflowing steps)" in proc.stderr
