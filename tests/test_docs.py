"""Every code example in the docs and the README runs, so the docs cannot drift.

Each page's ``.. code-block:: python`` blocks (or the README's ```python blocks) run in order
in one fresh interpreter, as a reader would paste them. Docstring examples run as doctests.
"""
import doctest
import importlib

import pytest

from doc_pages import ROOT, md_blocks, page_blocks, rst_blocks, run_blocks

PAGES = sorted((ROOT / "docs").glob("*.rst")) + [ROOT / "README.md"]


def test_block_extraction_sees_code():
    sample = (".. code-block:: python\n   :caption: x\n\n   a = 1\n   if a:\n\n"
              "       b = 2\n\nText\n")
    assert rst_blocks(sample) == ["a = 1\nif a:\n\n    b = 2"]
    assert md_blocks("```python\nx = 3\n```\n") == ["x = 3\n"]


@pytest.mark.parametrize("page", [p for p in PAGES if page_blocks(p)],
                         ids=lambda p: p.name)
def test_page_examples_run(page, tmp_path):
    blocks = page_blocks(page)
    script = "\n\n".join(blocks)
    proc = run_blocks(blocks, tmp_path, page.stem + "_examples")
    assert proc.returncode == 0, (f"examples of {page.name} failed:\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-3000:]}")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    if "print(" in script:
        assert proc.stdout.strip(), f"the examples of {page.name} print nothing"
    # What the page shows as output (its text blocks) is what the examples print today.
    for shown in page_blocks(page, "text"):
        if shown.startswith("Loss-scale diagnosis") or "print(" in script:
            assert shown in proc.stdout, (f"{page.name} shows output its examples no "
                                          f"longer print:\n{shown}\n--- they print:\n"
                                          f"{proc.stdout[-3000:]}")


MODULES = ["nnabla_mpt.scale.policy", "nnabla_mpt.step.detector", "nnabla_mpt.updater",
           "nnabla_mpt.scale.scale_history",
           "nnabla_mpt.diagnosis.diagnosis", "nnabla_mpt.monitoring", "nnabla_mpt.core.dtypes",
           "nnabla_mpt.report.run_report"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0, f"{name} has no docstring examples"
