"""The architecture page tells the truth about the package, and the package stays readable:
every module is on the page, no function or class outgrows what a reader holds at once."""
import ast
import io
import re
import tokenize

import pytest

from doc_pages import ROOT

PACKAGE = ROOT / "nnabla_mpt"
PAGE = ROOT / "docs" / "architecture.rst"
MAX_FUNCTION_LINES = 45
MAX_CLASS_LINES = 240
MAX_MODULE_LINES = 450
#: Lines holding code: not blank, not only a comment, not part of a docstring.
MAX_MODULE_CODE_LINES = 300
#: Lines of code of the whole package outside ``report/`` (which reads a run back after
#: training): the step, its options and its parts.
MAX_PACKAGE_CODE_LINES = 5100


def page_modules():
    """The modules the page's module table names (``* - ``scale/policy.py````)."""
    text = PAGE.read_text(encoding="utf-8")
    table = text[text.index("Modules\n-------"):text.index("One ``update()``")]
    return re.findall(r"^   \* - ``([\w/]+\.py)``$", table, re.M)


def package_modules():
    """Every module of the package by its path in ``nnabla_mpt/`` (``scale/policy.py``)."""
    return sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))


def test_the_page_lists_every_module_once():
    listed = page_modules()
    assert len(listed) == len(set(listed)), sorted(listed)
    assert sorted(listed) == package_modules()


def sizes():
    for name in package_modules():
        tree = ast.parse((PACKAGE / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield name, node, node.end_lineno - node.lineno + 1


def test_functions_and_classes_fit_on_a_page():
    too_long = [f"{name}:{node.lineno} {node.name} ({lines} lines)"
                for name, node, lines in sizes()
                if lines > (MAX_CLASS_LINES if isinstance(node, ast.ClassDef)
                            else MAX_FUNCTION_LINES)]
    assert not too_long


def code_lines(source):
    """The lines of ``source`` that hold code: a token other than a comment, and not in a
    docstring (of the module, a class or a function)."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if ast.get_docstring(node, clean=False) is not None:
                first = node.body[0]
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    skipped = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
               tokenize.DEDENT, tokenize.ENDMARKER}
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skipped:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines - docstrings


#: Parameters (besides ``self``) an internal function takes at most: what travels together
#: is one object. The public classes' constructors (the updaters, the policy,
#: ``StepResult``) take the options they document.
MAX_PARAMETERS = 6


def parameter_counts(tree):
    """``(qualified name, parameters besides self or cls)`` of every function in ``tree``."""
    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            name = f"{prefix}{getattr(child, 'name', '')}"
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = child.args
                names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
                count = len(names) - (names[:1] in (["self"], ["cls"]))
                yield name, count + (args.vararg is not None) + (args.kwarg is not None)
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from visit(child, name + ".")
    return visit(tree, "")


def test_no_internal_function_takes_more_than_six_parameters():
    import nnabla_mpt
    public = {f"{name}.__init__" for name in nnabla_mpt.__all__}
    over = [f"{module}:{name} ({count})" for module in package_modules()
            for name, count in parameter_counts(ast.parse((PACKAGE / module).read_text("utf-8")))
            if count > MAX_PARAMETERS and name not in public]
    assert not over


def test_the_parameter_count_leaves_out_self_and_counts_the_rest():
    source = """
def f(a, b, *rest, c=1, **more): pass
class C:
    def m(self, a, /, b): pass
    def outer(self):
        def inner(x, y, z, t, u, v, w): pass
"""
    assert dict(parameter_counts(ast.parse(source))) == {
        "f": 5, "C.m": 2, "C.outer": 0, "C.outer.inner": 7}


def test_every_module_fits_on_a_few_pages():
    too_long = {}
    for name in package_modules():
        source = (PACKAGE / name).read_text(encoding="utf-8")
        lines, code = source.count("\n"), len(code_lines(source))
        if lines > MAX_MODULE_LINES or code > MAX_MODULE_CODE_LINES:
            too_long[name] = (lines, code)
    assert not too_long


def test_the_package_outside_the_report_stays_within_its_size():
    code = {name: len(code_lines((PACKAGE / name).read_text(encoding="utf-8")))
            for name in package_modules() if not name.startswith("report/")}
    assert len(code) > 50 and min(code.values()) == 0 < max(code.values())
    assert sum(code.values()) <= MAX_PACKAGE_CODE_LINES


def test_code_lines_leave_out_docstrings_comments_and_blank_lines():
    source = '''"""Module."""
import os  # a comment

# only a comment
def f(x):
    """Doc
    string."""
    return (x +
            1)
'''
    assert sorted(code_lines(source)) == [2, 5, 8, 9]


@pytest.mark.parametrize("name", ["updater.py", "step_loop.py", "distributed/agreement.py",
                                  "step/collapse.py", "files/checkpoint.py",
                                  "files/atomic_file.py", "step/unscale.py"])
def test_the_step_loop_has_no_file_io_outside_the_checkpoint_modules(name):
    source = (PACKAGE / name).read_text(encoding="utf-8")
    if name == "files/checkpoint.py":
        assert "zipfile" in source and not re.search(r"\b(tempfile|fsync)\b", source)
    elif name == "files/atomic_file.py":
        assert "fsync" in source and "flock" in source and "zipfile" not in source
    else:
        assert not re.search(r"\b(zipfile|tempfile|fsync|flock)\b", source), name


# -- the folders are layers ------------------------------------------------------------------

FOLDERS = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
STEP_LOOP = {"nnabla_mpt.updater", "nnabla_mpt.step_loop", "nnabla_mpt.settings"}


def declared_imports(folder):
    """The folders ``folder`` may import, as the one line of its ``__init__.py`` says:
    ``...; may import core, diagnosis.`` or ``...; imports no other folder.``"""
    doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text("utf-8")))
    assert doc and "\n" not in doc, f"{folder}/__init__.py: a one-line docstring"
    if doc.endswith("; imports no other folder."):
        return set()
    declared = re.search(r"; may import ([a-z_]+(?:, [a-z_]+)*)\.$", doc)
    assert declared, f"{folder}/__init__.py does not say which folders it may import: {doc}"
    return set(declared.group(1).split(", "))


def imported_modules(module, source):
    """The modules of the package that ``source`` (the module ``nnabla_mpt.<module>``)
    imports anywhere, in functions too: ``from ..core import graph`` is
    ``nnabla_mpt.core.graph``."""
    package = module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = ["nnabla_mpt"] + package[:len(package) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            found.update(f"{target}.{alias.name}" if not node.module else target
                         for alias in node.names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module] if isinstance(node, ast.ImportFrom) else \
                [alias.name for alias in node.names]
            found.update(n for n in names if n == "nnabla_mpt" or n.startswith("nnabla_mpt."))
    return found


def layering_errors(folder, module, source):
    """The imports of ``source`` (the module ``nnabla_mpt.<folder>.<module>``) that its
    folder may not make: the step loop, the top of the package, undeclared folders."""
    allowed = declared_imports(folder) | {folder}
    errors = []
    for target in sorted(imported_modules(f"{folder}.{module}", source)):
        parts = target.split(".")
        if target in STEP_LOOP or len(parts) < 3 and parts[-1] not in FOLDERS:
            errors.append(f"{folder}/{module}.py imports the top: {target}")
        elif parts[1] not in allowed:
            errors.append(f"{folder}/{module}.py imports {target}, not declared by {folder}")
    return errors


def dotted(path):
    """``scale/policy.py`` -> ``nnabla_mpt.scale.policy``; a folder's ``__init__.py`` is the
    folder."""
    parts = ["nnabla_mpt"] + path[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_imports(tree):
    """Every import statement of ``tree``, those under ``if TYPE_CHECKING:`` (for types
    only) and inside functions included."""
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def module_imports():
    """``module -> the package's modules it imports`` (``from .x import y`` imports ``x``,
    and ``x.y`` where that is a module), for types only and lazily too: a circle of
    imports is one however the imports run."""
    names = {dotted(p) for p in package_modules()}
    graph = {}
    for path in package_modules():
        module = dotted(path)
        package = module.split(".") if path.endswith("__init__.py") else \
            module.split(".")[:-1]
        found = set()
        for node in all_imports(ast.parse((PACKAGE / path).read_text("utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
                continue
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
        graph[module] = (found & names) - {module}
    return graph


def circles_in(graph):
    """The import circles of ``graph`` (``module -> modules it imports``), each as a path
    that ends where it starts."""
    done, circles = set(), []

    def visit(module, path):
        if module in path:
            circles.append(path[path.index(module):] + [module])
            return
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, path + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    return circles


def test_no_module_imports_itself_through_others():
    assert not circles_in(module_imports())


def test_the_circle_check_finds_a_circle_and_counts_type_checking_imports():
    assert circles_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert not circles_in({"a": {"b"}, "b": set()})
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from .updater import StepResult\nfrom . import options\n")
    assert [n.names[0].name for n in all_imports(tree)] == ["TYPE_CHECKING", "options",
                                                            "StepResult"]
    assert "nnabla_mpt.settings" in module_imports()["nnabla_mpt.updater"]
    # the monitor reads StepResult for types only, from below the loop
    assert "nnabla_mpt.step.decision" in module_imports()["nnabla_mpt.monitoring"]
    assert "nnabla_mpt.updater" not in module_imports()["nnabla_mpt.monitoring"]


def test_the_top_of_the_package_stays_small():
    # 13: the loop's five modules, __init__.py, and a folder for each part of the system; the
    # thirteenth is report/, which reads a run's series back after training (the summary,
    # the figure, the command): no part of the step, so in no folder the step uses.
    entries = [p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 13, sorted(entries)
    assert FOLDERS == ["core", "diagnosis", "distributed", "files", "report", "scale", "step"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_folder_imports_only_the_folders_it_declares(folder):
    errors = [error for path in sorted((PACKAGE / folder).glob("*.py"))
              for error in layering_errors(folder, path.stem, path.read_text("utf-8"))]
    assert not errors


def test_the_declared_layers_have_no_circle():
    declared = {folder: declared_imports(folder) for folder in FOLDERS}
    assert all(set(uses) <= set(FOLDERS) for uses in declared.values()), declared
    order = []                      # every folder after the folders it may import
    while len(order) < len(FOLDERS):
        ready = [f for f in FOLDERS if f not in order and declared[f] <= set(order)]
        assert ready, f"a circle among {sorted(set(FOLDERS) - set(order))}: {declared}"
        order += ready
    assert order.index("core") == 0


@pytest.mark.parametrize("folder,source", [
    ("core", "from ..scale import policy\n"),                 # an undeclared folder
    ("scale", "def f():\n    from ..updater import StepResult\n"),   # the loop, lazily
    ("scale", "from .. import settings\n"),                    # the loop's settings
    ("step", "from ..settings import UpdaterSettings\n"),
    ("files", "import nnabla_mpt.updater_state\n"),             # the top, by its full name
    ("diagnosis", "from nnabla_mpt.distributed import communicator\n"),
])
def test_the_layering_check_finds_a_forbidden_import(folder, source):
    assert layering_errors(folder, "added", source)


def test_the_layering_check_accepts_the_declared_imports():
    assert not layering_errors("scale", "added", "from ..core import graph\n"
                               "from ..diagnosis.watch import RangeWatch\nfrom . import seed\n")
