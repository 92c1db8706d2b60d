"""The figures the project's pages quote, each read from the results file it comes from.

A page's figures are listed in a module ``page_<name>.py`` of this folder:

* ``PAGE``: the page, relative to the repository root (an rst or Markdown page, or an
  example script, whose docstring and ``--help`` texts are its prose);
* ``QUOTES``: :class:`Quote` objects, each a sentence of the page with its figures as
  named fields, and for each field a :class:`Figure` that reads it from a results file
  under ``benchmarks/results/``, for a page's worked example from the output the page
  shows under it (:func:`shown`: ``tests/test_docs.py`` runs the example and requires
  that output), or, for a count or a constant that is a fact of the code or of the tests,
  from the repository file that sets it (:func:`in_code`, :func:`in_repo`);
* ``NOT_MEASURED``: the figure-like words of the page that are no measurement (a default,
  a constant, an example's setting, a pronoun "one"), each with the reason, as a phrase
  of the page wide enough to say which figure it means;
* ``CHECKED_ELSEWHERE`` (optional): the titles of sections whose figures another test
  checks against their results, with that test's name;
* ``CHECKED_BY`` (optional): figures of the page that a test reads from the page and
  reproduces by running what the page describes, with that test's path.

``test_figures.py`` renders every quote from the results and requires it on the page,
requires every figure-like word of the page's prose to lie inside a quote or be listed as
no measurement, and requires every results file it reads to say its date, machine, load
average and command. A figure edited by hand on a page, or a results file run again
without the page following it, fails there.
"""
import ast
import importlib.util
import json
import re
import string
from functools import lru_cache

from doc_pages import ROOT, directive_spans, page_blocks, section_span

RESULTS = ROOT / "benchmarks" / "results"

#: The digits of a figure: a number with ``,`` between its thousands and a decimal part.
_NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"
#: The number words: one to twenty, the tens (with their units: ``twenty-five``), and
#: the words of a count or a multiple.
_UNITS = "one|two|three|four|five|six|seven|eight|nine"
_WORDS = (rf"\b(?:{_UNITS}|ten|eleven|twelve|(?:thir|four|fif|six|seven|eigh|nine)teen"
          rf"|(?:twen|thir|for|fif|six|seven|eigh|nine)ty(?:-(?:{_UNITS}))?"
          r"|(?:hundred|thousand|million|billion|dozen)s?|twice|thrice|half)\b")
#: Outside inline code: an even number of runs of backticks follows to the end of the
#: text (the pages' prose pairs its backtick runs: ``code``, `code`, :role:`name`;
#: ``test_figures.py`` requires it).
_OUTSIDE_CODE = r"(?=[^`]*(?:`+(?!`)[^`]*`+(?!`)[^`]*)*\Z)"

#: Words that state a figure, searched in the page's prose with its whitespace collapsed.
#: Anywhere, inline code included: a number with a unit of time, a ratio or a share,
#: "k of n", "k steps" (or updates, all-reduces, growth points), "step k" (or a range of
#: steps), a date, a power of two (``2**k``), a speed-up, and any number with a decimal
#: point. Outside inline code, also: any other number (an integer, a range ``64-256``, a
#: size ``8x8``, an exponent ``1e-4``, an ordinal ``25th``) that is no part of a word, a
#: path, an option (``scale=0.5``) or a version (``nnabla-1.39.0``); a number in words
#: (``six``, ``twenty-five``, ``thousand``, ``twice``, ``half``); and a time said with "a"
#: (``a minute``, ``an hour``).
FIGURE = re.compile(
    r"(?<![\w.*/=-])[+−-]?\d[\d,]*(?:\.\d+)?(?:[–-]\d[\d,]*(?:\.\d+)?)?"
    r"(?:\s?(?:%|×|ms\b|µs\b|s\b|seconds?\b|minutes?\b|MB\b|times\b|per thousand\b)"
    r"|x\b| of (?:the |its )?\d[\d,]*\b"
    r"| (?:steps?|updates?|all-reduces?|growth points?|skipped)\b)"
    r"|\bsteps?[ -]\d[\d,]*(?:[–-]\d[\d,]*)?\b"
    r"|\b\d{4}-\d\d-\d\d\b"
    r"|\b2\*\*-?\d+"
    r"|(?<![\w.*/=-])\d+\.\d+(?!\w|\.\d)"
    rf"|(?:(?<![\w.*/=-])[+−-]?{_NUMBER}(?:e[+−-]?\d+)?(?:[x×–-]{_NUMBER})*"
    r"(?:st|nd|rd|th)?(?![\w/]|[.,:]\w|\*\*)"
    rf"|(?i:{_WORDS}|\ban? (?:(?:milli|micro)?second|minute|hour|day|week|month|year)\b))"
    + _OUTSIDE_CODE)


#: Figures that are facts of the number formats or of the updaters' defaults, no
#: measurement wherever a page names them.
FORMAT_CONSTANTS = {
    "65504": "float16's largest finite value",
    "3.4e38": "float32's largest finite value, rounded",
    "power of two": "the powers of two of a loss scale, no count",
    "powers of two": "the powers of two of a loss scale, no count",
    "2**15": "float16's largest power of two, the ceiling of a float16 loss's scale",
    "2**16": "the first power of two float16 cannot hold",
    "2**-14": "float16's smallest normal value",
    "2**-24": "float16's smallest subnormal value",
    "2**127": "float32's largest power of two",
    "2**-149": "float32's smallest subnormal value",
    "2**24": "the default max_scale",
}
#: Reasons for ``NOT_MEASURED`` that several pages give.
MARGIN = "measured growth's margin for one batch, a constant of the updater"
VERSION = "a version of Python, nnabla or CUDA"
DESIGN = "what the code does by design (one call, one array, one decision): no measurement"
PRONOUN = '"one" as a pronoun, for a thing named before it: no count'
HALF = "``half``, nnabla's name of float16 (``type_config='half'``): no number"
NO_SCALE = "scale 1, no scaling at all"
ANOTHER = '"a second" as "another": no time'
INDEX = "an index (a rank, a step, a device, an item of a list): no measurement"


def record_module():
    """``benchmarks/record.py``, which writes and reads the results files."""
    spec = importlib.util.spec_from_file_location(
        "record", ROOT / "benchmarks" / "record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@lru_cache(maxsize=None)
def results(name: str):
    """``(fields, body)`` of ``benchmarks/results/<name>``: a ``.txt`` file written by
    ``benchmarks/record.py`` (its header and its output), or a ``.json`` file of a
    benchmark that writes its own (the same four facts as keys, and the parsed JSON as
    the body). Raises ``ValueError`` naming the file when a fact is missing."""
    path = RESULTS / name
    if name.startswith("report_example/"):
        return report_example(name.split("/", 1)[1])
    if name.endswith(".json"):
        body = json.loads(path.read_text(encoding="utf-8"))
        fields = body.get("facts") or {
            "date": body.get("date"), "machine": body.get("machine"),
            "load before": body.get("load_before"), "command": body.get("command")}
        missing = [key for key, value in fields.items() if not value]
        if missing:
            raise ValueError(f"{path}: no {missing[0]!r}")
        return fields, body
    return record_module().read(path)


def report_example(series: str):
    """``(fields, body)`` of a series of the committed monitor directory
    ``docs/_static/report_example/``, whose ``run.txt`` says when, where, under what load
    and by what command the series were written; the body is the list of
    ``(step, value)`` pairs."""
    folder = ROOT / "docs" / "_static" / "report_example"
    run = (folder / "run.txt").read_text(encoding="utf-8").splitlines()
    date, _, rest = run[1][2:].partition("; ")
    fields = {"date": date, "machine": rest.split("; load average")[0],
              "load before": re.search(r"load average before ([\d., ]+?), after",
                                       run[1]).group(1),
              "command": run[2][2:]}
    pairs = [line.split() for line in (folder / series).read_text().splitlines()]
    return fields, [(int(step), float(value)) for step, value in pairs]


class Figure:
    """One figure a page quotes: ``value()`` reads it (from ``sources``, the results
    files it comes from), and ``fmt`` turns it into the text on the page."""

    def __init__(self, value, fmt: str = "{}", sources=()):
        self.value, self.fmt, self.sources = value, fmt, tuple(sources)

    def text(self) -> str:
        return self.fmt.format(self.value())


def read(source: str, function, fmt: str = "{}") -> Figure:
    """The figure ``function`` computes from the body of results file ``source``."""
    return Figure(lambda: function(results(source)[1]), fmt, [source])


def grep(source: str, pattern: str, fmt: str = "{}", convert=str, group: int = 1,
         after: str = None) -> Figure:
    """The ``group`` of ``pattern``'s first match in the file's output (after the first
    line matching ``after``, if given), through ``convert``; fails naming the file and
    the pattern when nothing matches."""
    def find(body):
        if after is not None:
            start = re.search(after, body, re.M)
            assert start, f"benchmarks/results/{source}: no line {after!r}"
            body = body[start.start():]
        found = re.search(pattern, body, re.M)
        assert found, f"benchmarks/results/{source}: nothing matches {pattern!r}"
        return convert(found.group(group))
    return read(source, find, fmt)


def shown(page: str, pattern: str, fmt: str = "{}", convert=str, group: int = 1) -> Figure:
    """A figure of the output ``page`` shows under its examples (its ``text`` and
    ``console`` blocks), which ``tests/test_docs.py`` (and, for the report's example,
    ``tests/test_report_example.py``) requires the examples to print when run."""
    def find():
        body = "\n".join(page_blocks(ROOT / page, "text")
                          + page_blocks(ROOT / page, "console"))
        found = re.search(pattern, body, re.M)
        assert found, f"{page}: no shown output matches {pattern!r}"
        return convert(found.group(group))
    return Figure(find, fmt)


def cell(source: str, row: str, column: int, after: str = None, fmt: str = "{}",
         convert=str) -> Figure:
    """Field ``column`` (0 is the row's label) of the first table row labelled ``row``
    after the first line matching ``after``: a Markdown row split at ``|``, any other
    split at runs of spaces; through ``convert`` (:func:`number` strips a ``x``)."""
    def find(body):
        lines = body.splitlines()
        if after is not None:
            start = next((i for i, line in enumerate(lines) if re.search(after, line)), None)
            assert start is not None, f"benchmarks/results/{source}: no line {after!r}"
            lines = lines[start:]
        for line in lines:
            fields = ([f.strip() for f in line.strip().strip("|").split("|")]
                      if line.lstrip().startswith("|") else line.split())
            if fields and fields[0] == row:
                return convert(fields[column])
        raise AssertionError(f"benchmarks/results/{source}: no row {row!r}")
    return read(source, find, fmt)


def number(text: str) -> float:
    """A table's number: ``1,045`` or ``3.6x`` read as 1045 and 3.6."""
    return float(text.replace(",", "").rstrip("x"))


def derived(fmt: str, function, *figures: Figure) -> Figure:
    """A figure computed by ``function`` from the numbers of other figures."""
    return Figure(lambda: function(*(float(f.text()) for f in figures)), fmt,
                  [s for f in figures for s in f.sources])


def header(source: str, key: str, fmt: str = "{}", convert=str) -> Figure:
    """A fact of the file's header (``date``, ``load before``, ``wall time``, ...),
    through ``convert``."""
    return Figure(lambda: convert(results(source)[0][key]), fmt, [source])


def date_of(source: str) -> Figure:
    """The day a results file was measured (its header's ``date``)."""
    return header(source, "date", convert=lambda stamp: stamp[:10])


def date_of_all(*sources: str) -> Figure:
    """The day every one of ``sources`` was measured; fails naming them where the days
    differ."""
    def day():
        days = {source: results(source)[0]["date"][:10] for source in sources}
        assert len(set(days.values())) == 1, f"measured on different days: {days}"
        return next(iter(days.values()))
    return Figure(day, "{}", sources)


def machine_of(source: str) -> Figure:
    """The machine of a results file as the prose names it: ``2-core Intel Xeon`` for the
    header's ``2 CPUs (Intel(R) Xeon(R) Processor), ...``."""
    def named(text):
        cores, model = re.match(r"(\d+) CPUs \((.*?)\), ", text).groups()
        model = re.sub(r"\((R|TM)\)|\bProcessor\b|\bCPU\b", "", model)
        return f"{cores}-core {' '.join(model.split())}"
    return header(source, "machine", convert=named)


def load_of(source: str) -> Figure:
    """The 1-minute load average before a results file's run (a text or a list)."""
    def first(loads):
        return f"{float(loads.split(',')[0] if isinstance(loads, str) else loads[0]):.2f}"
    return header(source, "load before", convert=first)


def wall_time_of(source: str) -> Figure:
    """The seconds a results file's run took (its footer's ``wall time``)."""
    return header(source, "wall time", convert=lambda text: text.split()[0])


def span(figures, fmt: str = "{:.1f}", sep: str = "–") -> Figure:
    """The smallest and largest of several figures' numbers, as ``low–high`` (one number
    when they agree to ``fmt``)."""
    def both():
        values = [float(f.text()) for f in figures]
        low, high = fmt.format(min(values)), fmt.format(max(values))
        return low if low == high else f"{low}{sep}{high}"
    return Figure(both, "{}", [s for f in figures for s in f.sources])


#: The builtins an assignment :func:`in_code` reads may call.
_CODE_BUILTINS = {"range": range, "list": list, "tuple": tuple, "len": len, "int": int,
                  "float": float, "min": min, "max": max, "sum": sum}


def code_value(path: str, name: str):
    """The value of ``name``, a top-level assignment of the repository file ``path`` (a
    constant, ``range(120)``, ``2 << 20``, ``list(range(1000, 1012)) + [1055]``, one name
    of ``A, B = 1.0, 2.0``) or, for ``Class.name``, one of a top-level class's body,
    evaluated from the file's syntax tree without importing it; the names it uses are the
    other assignments of the same body. Fails naming the file when it assigns no
    ``name``."""
    body = ast.parse((ROOT / path).read_text(encoding="utf-8")).body
    *owner, name = name.split(".")
    for part in owner:
        body = next((node.body for node in body
                     if isinstance(node, ast.ClassDef) and node.name == part), None)
        assert body is not None, f"{path}: no class {part} to read"
    assigned = {}
    for node in body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned[target.id] = node.value
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    assigned.update((t.id, v) for t, v in zip(target.elts, node.value.elts)
                                    if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            assigned[node.target.id] = node.value

    def evaluate(key, seen=()):
        assert key in assigned and key not in seen, f"{path}: no top-level {key} to read"
        expression = assigned[key]
        names = {n.id for n in ast.walk(expression) if isinstance(n, ast.Name)}
        scope = {n: evaluate(n, seen + (key,)) for n in names - set(_CODE_BUILTINS)}
        return eval(compile(ast.Expression(expression), path, "eval"),
                    {"__builtins__": _CODE_BUILTINS}, scope)
    return evaluate(name)


def in_code(path: str, name: str, function=lambda value: value, fmt: str = "{}") -> Figure:
    """A count or constant that is a fact of the code or of the tests, not a measurement:
    what ``function`` makes of :func:`code_value` of ``name`` in the repository file
    ``path`` (``len`` of a list of seeds, :func:`spelled` for a count said in words)."""
    return Figure(lambda: function(code_value(path, name)), fmt)


#: The module that sets when measured growth watches a step.
HISTORY = "nnabla_mpt/scale/scale_history.py"


def watch_schedule() -> "dict[str, Figure]":
    """The fields of a sentence saying when measured growth watches a step: every step
    until the history holds ``{samples}`` (in words) passes, ``{steps}`` (``0 to k``), then
    every ``{every}``-th: read from :data:`HISTORY`."""
    return {"samples": in_code(HISTORY, "MIN_SAMPLES", spelled),
            "steps": in_code(HISTORY, "MIN_SAMPLES", lambda n: f"0 to {n - 1}"),
            "every": in_code(HISTORY, "WATCH_EVERY")}


def in_repo(function, fmt: str = "{}") -> Figure:
    """A count that is a fact of the repository: what ``function`` makes of its root (a
    :class:`pathlib.Path`), e.g. the number of entries of a folder."""
    return Figure(lambda: function(ROOT), fmt)


_SPELLED = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
            "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()


def spelled(number) -> str:
    """A whole number below 100 in words, as the prose writes a count: ``4`` as
    ``four``, ``25`` as ``twenty-five``."""
    number = int(number)
    assert 0 <= number < 100, number
    if number < 20:
        return _SPELLED[number]
    tens, units = divmod(number, 10)
    return _TENS[tens - 2] + (f"-{_SPELLED[units]}" if units else "")


class Quote:
    """A sentence of a page whose ``{name}`` fields are figures."""

    def __init__(self, template: str, **fields: Figure):
        self.template, self.fields = template, fields

    def text(self) -> str:
        return self.rendered()[0]

    def rendered(self) -> "tuple[str, list]":
        """``(text, spans)``: the sentence with its fields filled in from the results,
        whitespace as one space, and where in it each field's text lies."""
        text, spans = "", []
        for literal, name, _, _ in string.Formatter().parse(self.template):
            text += literal
            if name is not None:
                value = self.fields[name].text()
                spans.append((len(text), len(text) + len(value)))
                text += value
        return collapse(text, spans)


def collapse(text: str, spans) -> "tuple[str, list]":
    """``text`` with each run of whitespace as one space (none at the ends), and
    ``spans`` moved along."""
    out, where = [], []
    for char in text:
        where.append(len(out))
        if not char.isspace():
            out.append(char)
        elif out and out[-1] != " ":
            out.append(" ")
    where.append(len(out))
    joined = "".join(out)
    stripped = joined.rstrip(" ")
    return stripped, [(where[a], min(where[b], len(stripped))) for a, b in spans]


# --------------------------------------------------------------------- the pages' prose

#: The rst directives whose content is the page's own text, read with its prose.
TEXT_DIRECTIVES = ("list-table", "csv-table", "table", "note", "warning")


def rst_prose(text: str, skip_sections=()) -> str:
    """The page without its directive blocks other than tables and admonitions (code,
    the printed output the examples' tests check, results included from their files,
    images), without the options of those it keeps (``:widths: 22 78``), without its
    literal blocks (:func:`literal_blocks`) and without the sections titled in
    ``skip_sections``."""
    lines = text.splitlines()
    drop = literal_blocks(lines)
    for a, b in directive_spans(lines):
        if re.match(r"^\s*\.\. (%s)::" % "|".join(TEXT_DIRECTIVES), lines[a]):
            drop.update(i for i in range(a + 1, b) if lines[i].strip()
                        and all(re.match(r"^\s+:[\w-]+:(\s|$)", lines[j])
                                for j in range(a + 1, i + 1)))
        else:
            drop.update(i for i in range(a, b) if i not in _alt_text(lines, a, b))
    for title in skip_sections:
        drop.update(range(*section_span(lines, title)))
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)


def literal_blocks(lines) -> "set[int]":
    """The indices of the lines of the rst literal blocks of ``lines``: the lines indented
    under a paragraph that ends with ``::`` (a command, code, a message as printed), which
    the page shows as code."""
    drop, i = set(), 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::") and not re.match(r"^\s*\.\. ", line):
            indent = len(line) - len(line.lstrip())
            j = i + 1
            while j < len(lines) and (not lines[j].strip()
                                      or len(lines[j]) - len(lines[j].lstrip()) > indent):
                j += 1
            drop.update(range(i + 1, j))
            i = j
        else:
            i += 1
    return drop


def docstring_prose(text: str) -> str:
    """A docstring without its literal blocks."""
    lines = text.splitlines()
    drop = literal_blocks(lines)
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)


def _alt_text(lines, first: int, last: int) -> "set[int]":
    """The lines of an image's ``:alt:`` text (read as prose: it describes the figure in
    words and numbers) within the directive of lines ``first`` to ``last``."""
    start = next((i for i in range(first, last) if lines[i].lstrip().startswith(":alt:")),
                 None)
    if start is None:
        return set()
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next((i for i in range(start + 1, last)
                if len(lines[i]) - len(lines[i].lstrip()) <= indent), last)
    return set(range(start, end))


def md_prose(text: str) -> str:
    """A Markdown page without its fenced blocks."""
    return re.sub(r"```.*?```", "", text, flags=re.S)


def script_prose(text: str) -> str:
    """An example script's prose: its docstring (without its literal blocks), and the
    ``help`` and ``description`` texts of its options."""
    tree = ast.parse(text)
    parts = [docstring_prose(ast.get_docstring(tree) or "")]
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in ("help", "description", "epilog"):
            parts.extend(n.value for n in ast.walk(node.value)
                         if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return "\n".join(parts).replace("%%", "%")


def autodoc_prose(text: str) -> str:
    """The docstrings an rst page renders through ``.. autoclass::`` and its kin (a class's
    with those of its public methods and properties; for ``.. autodata::``, the ``#:``
    comment above the assignment where its module has one, as Sphinx renders it), without
    their doctest examples, which the docs tests run, and without their literal blocks."""
    import inspect
    import nnabla_mpt

    parts = []
    for kind, name in re.findall(
            r"^\.\. auto(class|function|data|exception|module):: (\S+)", text, re.M):
        module, _, attribute = name.rpartition(".")
        if not module:
            owner = nnabla_mpt
        else:
            owner = importlib.import_module(module)
        obj = getattr(owner, attribute, None) or importlib.import_module(name)
        doc = (kind == "data" and _comment_doc(owner, attribute)) or inspect.getdoc(obj)
        parts.append(docstring_prose(doc or ""))
        if inspect.isclass(obj):
            parts += [docstring_prose(inspect.getdoc(member) or "")
                      for key, member in vars(obj).items()
                      if not key.startswith("_")
                      and (inspect.isfunction(member) or isinstance(member, property))]
    return "\n\n".join(re.sub(r"^\s*>>>.*?(?:\n\s*\n|\Z)", "\n", part, flags=re.M | re.S)
                       for part in parts)


def _comment_doc(module, attribute: str):
    """The ``#:`` comment lines right above the top-level assignment of ``attribute`` in
    ``module``'s source, or None."""
    import inspect

    lines = inspect.getsource(module).splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"{re.escape(attribute)}\s*[:=]", line):
            first = i
            while first > 0 and lines[first - 1].lstrip().startswith("#:"):
                first -= 1
            if first < i:
                return "\n".join(line.strip()[2:].strip() for line in lines[first:i])
    return None


def prose(page: str, skip_sections=()) -> str:
    """The prose of ``page`` (a path from the repository root), whitespace as one space:
    for an rst page, with the docstrings it renders (:func:`autodoc_prose`)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    if page.endswith(".rst"):
        text = rst_prose(text, skip_sections) + "\n\n" + autodoc_prose(text)
    elif page.endswith(".md"):
        text = md_prose(text)
    else:
        text = script_prose(text)
    return " ".join(text.split())


def unquoted_figures(text: str, quotes, phrases) -> "list[str]":
    """The figure-like words of ``text`` one of whose digits (of a figure in words, one
    of whose letters) lies outside every field of the ``quotes`` (:class:`Quote`) found in
    it, outside every one of ``phrases`` (words that are no measurement, each with the
    context that says so) and outside the :data:`FORMAT_CONSTANTS` (the base of a power of
    two, ``2**``, is no digit of its figure)."""
    covered = []
    for quote in quotes:
        quoted, spans = quote.rendered()
        for start in _occurrences(text, quoted):
            covered += [(start + a, start + b) for a, b in spans]
    for phrase in list(phrases) + list(FORMAT_CONSTANTS):
        covered += [(start, start + len(phrase)) for start in _occurrences(text, phrase)]
    return [m.group(0) for m in FIGURE.finditer(text)
            if not all(any(a <= i < b for a, b in covered) for i in _figure_chars(text, m))]


def _figure_chars(text: str, match) -> "list[int]":
    """Where the digits of a figure lie (not the base of ``2**``), or for a figure in
    words, its letters."""
    where = range(match.start(), match.end())
    digits = [i for i in where if text[i].isdigit() and text[i:i + 3] != "2**"]
    return digits or [i for i in where if text[i].isalpha()]


def _occurrences(text: str, part: str):
    start = text.find(part)
    while start >= 0:
        yield start
        start = text.find(part, start + 1)
