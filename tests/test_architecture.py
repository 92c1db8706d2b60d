"""The architecture page tells the truth about the package, and the package stays readable:
every module is on the page, no function or class outgrows what a reader holds at once."""
import ast
import re

import pytest

from doc_pages import ROOT

PACKAGE = ROOT / "nnabla_mpt"
PAGE = ROOT / "docs" / "architecture.rst"
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 300
MAX_UPDATER_LINES = 550


def page_modules():
    """The modules the page's module table names (``* - ``name.py````)."""
    text = PAGE.read_text(encoding="utf-8")
    table = text[text.index("Modules\n-------"):text.index("One ``update()``")]
    return re.findall(r"^   \* - ``([\w]+\.py)``$", table, re.M)


def test_the_page_lists_every_module_once():
    listed = page_modules()
    assert len(listed) == len(set(listed)), sorted(listed)
    assert sorted(listed) == sorted(p.name for p in PACKAGE.glob("*.py"))


def sizes():
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield path.name, node, node.end_lineno - node.lineno + 1


def test_functions_and_classes_fit_on_a_page():
    too_long = [f"{name}:{node.lineno} {node.name} ({lines} lines)"
                for name, node, lines in sizes()
                if lines > (MAX_CLASS_LINES if isinstance(node, ast.ClassDef)
                            else MAX_FUNCTION_LINES)]
    assert not too_long


def test_the_step_loop_module_stays_one_page_of_modules():
    lines = (PACKAGE / "updater.py").read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_UPDATER_LINES


@pytest.mark.parametrize("name", ["updater.py", "options.py", "agreement.py", "collapse.py",
                                  "checkpoint.py", "atomic_file.py", "unscale.py"])
def test_the_step_loop_has_no_file_io_outside_the_checkpoint_modules(name):
    source = (PACKAGE / name).read_text(encoding="utf-8")
    if name == "checkpoint.py":
        assert "zipfile" in source and not re.search(r"\b(tempfile|fsync)\b", source)
    elif name == "atomic_file.py":
        assert "fsync" in source and "flock" in source and "zipfile" not in source
    else:
        assert not re.search(r"\b(zipfile|tempfile|fsync|flock)\b", source), name
