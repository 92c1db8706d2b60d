"""The code blocks of the documentation pages, as the tests that run them read them."""
import os
import pathlib
import re
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]


def rst_blocks(text: str, language: str = "python"):
    """Bodies of the ``.. code-block:: <language>`` directives of an rst text, in order
    (directive options such as ``:caption:`` skipped)."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if re.match(r"^\s*\.\. code-block:: " + re.escape(language) + r"\s*$", lines[i]):
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


def directive_spans(lines):
    """``(first, last)`` line indices (last exclusive) of every rst directive block
    (``.. code-block::``, ``.. list-table::``, ...) of a page's ``lines``."""
    spans, i = [], 0
    while i < len(lines):
        if re.match(r"^\s*\.\. [\w-]+::", lines[i]):
            indent = len(lines[i]) - len(lines[i].lstrip())
            j = i + 1
            while j < len(lines) and (not lines[j].strip()
                                      or len(lines[j]) - len(lines[j].lstrip()) > indent):
                j += 1
            spans.append((i, j))
            i = j
        else:
            i += 1
    return spans


def section_span(lines, title: str):
    """``(first, last)`` line indices (last exclusive) of the rst section titled ``title``
    (underlined with ``-``), up to the next title of its level or above. Raises
    ``ValueError`` naming the title when the page has no such section."""
    start = next((i for i, line in enumerate(lines[:-1])
                  if line == title and set(lines[i + 1]) == {"-"}), None)
    if start is None:
        raise ValueError(f"no section titled {title!r}")
    end = next((i for i in range(start + 2, len(lines) - 1)
                if lines[i].strip() and not lines[i].startswith(" ")
                and lines[i + 1][:1] in ("-", "=") and set(lines[i + 1]) == {lines[i + 1][0]}
                and len(lines[i + 1]) >= len(lines[i])), len(lines))
    return start, end


def md_blocks(text: str, language: str = "python"):
    """Bodies of the fenced ```<language> blocks of a Markdown text, in order."""
    return [m.group(1) for m in re.finditer(r"```" + re.escape(language) + r"\n(.*?)```",
                                            text, re.S)]


def page_blocks(page: pathlib.Path, language: str = "python"):
    """The ``language`` blocks of a docs page (``.rst``) or of the README (``.md``)."""
    text = page.read_text(encoding="utf-8")
    return md_blocks(text, language) if page.suffix == ".md" else rst_blocks(text, language)


def run_blocks(blocks, folder: pathlib.Path, name: str):
    """Run code blocks in order as one script ``<folder>/<name>.py``, in a fresh
    interpreter started in ``folder`` with this checkout's package first on the path, as
    a reader would paste them; the CompletedProcess (``stdout`` and ``stderr`` as text)."""
    script = folder / f"{name}.py"
    script.write_text("\n\n".join(blocks), encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, str(script)], cwd=folder, capture_output=True,
                          text=True, timeout=300, env=env)
