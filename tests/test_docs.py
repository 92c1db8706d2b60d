"""Every code example in the docs and the README runs, so the docs cannot drift.

Each page's ``.. code-block:: python`` blocks (or the README's ```python blocks) run in order
in one fresh interpreter, as a reader would paste them. Docstring examples run as doctests.
"""
import doctest
import importlib
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.rst")) + [ROOT / "README.md"]


def rst_blocks(text: str):
    """Bodies of ``.. code-block:: python`` directives (options skipped)."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if re.match(r"^\s*\.\. code-block:: python\s*$", lines[i]):
            indent = len(lines[i]) - len(lines[i].lstrip())
            i += 1
            body = []
            while i < len(lines):
                line = lines[i]
                if line.strip() and (len(line) - len(line.lstrip())) <= indent:
                    break
                body.append(line)
                i += 1
            body = [b for b in body if not re.match(r"^\s*:\w[\w-]*:", b)]
            blocks.append(textwrap.dedent("\n".join(body)).strip("\n"))
        else:
            i += 1
    return blocks


def md_blocks(text: str):
    return [m.group(1) for m in re.finditer(r"```python\n(.*?)```", text, re.S)]


def page_blocks(page: pathlib.Path):
    text = page.read_text(encoding="utf-8")
    return md_blocks(text) if page.suffix == ".md" else rst_blocks(text)


def test_block_extraction_sees_code():
    sample = (".. code-block:: python\n   :caption: x\n\n   a = 1\n   if a:\n\n"
              "       b = 2\n\nText\n")
    assert rst_blocks(sample) == ["a = 1\nif a:\n\n    b = 2"]
    assert md_blocks("```python\nx = 3\n```\n") == ["x = 3\n"]


@pytest.mark.parametrize("page", [p for p in PAGES if page_blocks(p)],
                         ids=lambda p: p.name)
def test_page_examples_run(page, tmp_path):
    script = "\n\n".join(page_blocks(page))
    path = tmp_path / (page.stem + "_examples.py")
    path.write_text(script, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (f"examples of {page.name} failed:\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-3000:]}")


MODULES = ["nnabla_mpt.policy", "nnabla_mpt.detector", "nnabla_mpt.updater",
           "nnabla_mpt.diagnosis", "nnabla_mpt.monitoring"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0, f"{name} has no docstring examples"
