"""The output shown on docs/quickstart.rst is what its training loop prints today."""
import re

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


def test_the_probe_variant_skips_what_the_page_says(tmp_path):
    """"The same loop with ``scale=2.0 ** 16``" (probe growth) is run as the page says,
    and its figures, read from the page, hold: it starts at 2**15, skips the first step
    and one growth back to 2**15, and no other."""
    text = " ".join(PAGE.read_text(encoding="utf-8").split())
    said = re.search(r"The same loop with ``scale=2\.0 \*\* 16`` starts at ``2\*\*15`` "
                     r"instead .*? and skips (\d+) of the (\d+) steps: the first one, and "
                     r"one growth back to ``2\*\*15`` that went too far", text)
    assert said, "the page no longer describes the probe variant as this test reads it"
    skipped, steps = int(said.group(1)), int(said.group(2))
    loop = rst_blocks(PAGE.read_text(encoding="utf-8"), "python")[0]
    measured = 'scale="auto", N=10,\n' + " " * 36 + 'growth_mode="measured")'
    assert measured in loop and "range(40)" in loop
    variant = loop.replace(measured, "scale=2.0 ** 16, N=10)").replace(
        "range(40)", f"range({steps})")
    proc = run_blocks([variant], tmp_path, "quickstart_probe")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip("\n").splitlines()
    assert lines[0] == "step 0: scale 32768, skipped; next scale 16384", lines
    backs = [line for line in lines[1:-1] if "skipped" in line]
    assert len(backs) == skipped - 1 and all(" scale 32768, skipped" in b for b in backs)
    assert f", {skipped} skipped," in lines[-1]
