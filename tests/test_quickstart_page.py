"""The output shown on docs/quickstart.rst is what its training loop prints today."""
from doc_pages import ROOT, rst_blocks, run_blocks

PAGE = ROOT / "docs" / "quickstart.rst"


def test_shown_output_is_what_the_training_loop_prints(tmp_path):
    text = PAGE.read_text(encoding="utf-8")
    code, shown = rst_blocks(text, "python"), rst_blocks(text, "text")
    assert len(code) == 2 and len(shown) == 1
    proc = run_blocks(code[:1], tmp_path, "quickstart_loop")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip("\n") == shown[0]
    # The prose explains these lines: a measured start, measured growth, nothing skipped.
    assert shown[0].startswith("step 0: scale 2048; next scale 2048")
    assert ", 0 skipped," in shown[0].splitlines()[-1]


def test_checkpoint_example_runs_alone_and_resumes_exactly(tmp_path):
    code = rst_blocks(PAGE.read_text(encoding="utf-8"), "python")[1]
    proc = run_blocks([code], tmp_path, "quickstart_resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed at step 15, scale" in proc.stdout
    assert "the resumed run ends exactly where the uninterrupted run ends" in proc.stdout
