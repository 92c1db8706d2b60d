"""The reports shown on docs/troubleshooting.rst are what its code prints today."""
from doc_pages import ROOT, rst_blocks, run_blocks

PAGE = ROOT / "docs" / "troubleshooting.rst"


def test_shown_reports_match_the_output_of_the_page_code(tmp_path):
    text = PAGE.read_text(encoding="utf-8")
    code, shown = rst_blocks(text, "python"), rst_blocks(text, "text")
    assert len(code) >= 5 and len(shown) == 2
    proc = run_blocks(code, tmp_path, "troubleshooting")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for report in shown:
        assert report.startswith("Loss-scale diagnosis: ")
        assert report in proc.stdout, ("the page shows a report the code no longer "
                                       f"prints:\n{report}")
    assert ("nnabla_mpt: the loss is non-finite (4 consecutive steps whose loss itself is "
            "non-finite): the forward pass produced inf/NaN before any loss scaling, so a "
            "smaller scale cannot help and the scale stays at 4096") in proc.stderr
    assert "loss scale collapse" not in proc.stderr
