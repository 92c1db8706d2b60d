"""Every figure of the README, the documentation pages and the examples' docstrings and
``--help`` texts is quoted from a results file under ``benchmarks/results/`` that says
when, where, under what load and by what command it was measured (see ``figures.py``
for how a page lists its figures)."""
import importlib
import pathlib
import re

import pytest

from doc_pages import ROOT
from figures import FIGURE, Figure, Quote, prose, results, unquoted_figures

HERE = pathlib.Path(__file__).parent
MODULES = sorted(p.stem for p in HERE.glob("page_*.py"))
PAGES = {name: importlib.import_module(name) for name in MODULES}
#: The pages whose figures are listed here: the README, every documentation page and
#: every example.
IN_SCOPE = (["README.md"] + sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.rst"))
            + sorted(f"examples/{p.name}" for p in (ROOT / "examples").glob("*.py")))


def page_prose(module) -> str:
    return prose(module.PAGE, getattr(module, "CHECKED_ELSEWHERE", {}))


def sources(module):
    return {s for quote in module.QUOTES for f in quote.fields.values() for s in f.sources}


def test_every_page_has_its_list():
    listed = sorted(module.PAGE for module in PAGES.values())
    assert listed == sorted(IN_SCOPE), set(IN_SCOPE) ^ set(listed)


@pytest.mark.parametrize("name", MODULES)
def test_quotes_are_on_the_page(name):
    module = PAGES[name]
    text = page_prose(module)
    missing = [quote.text() for quote in module.QUOTES if quote.text() not in text]
    assert not missing, (f"{module.PAGE} does not say, as its results files make it:\n  "
                         + "\n  ".join(missing))


@pytest.mark.parametrize("name", MODULES)
def test_no_figure_without_its_results(name):
    module = PAGES[name]
    text = page_prose(module)
    allowed = {**module.NOT_MEASURED, **getattr(module, "CHECKED_BY", {})}
    loose = unquoted_figures(text, module.QUOTES, allowed)
    assert not loose, (f"{module.PAGE}: figures quoted from no results file: {loose}; list "
                       f"them in tests/figures/{name}.py")


@pytest.mark.parametrize("name", MODULES)
def test_listed_words_are_on_the_page(name):
    module = PAGES[name]
    text = page_prose(module)
    listed = {**module.NOT_MEASURED, **getattr(module, "CHECKED_BY", {})}
    stale = [word for word in listed if word not in text]
    assert not stale, f"{module.PAGE} no longer says {stale}: drop them from {name}.py"
    for word, test in getattr(module, "CHECKED_BY", {}).items():
        assert (ROOT / test).is_file(), (word, test)


def assert_facts(source: str) -> None:
    fields, _ = results(source)
    for key in ("date", "machine", "load before", "command"):
        assert fields[key], (source, key)


@pytest.mark.parametrize("name", MODULES)
def test_results_say_date_machine_load_and_command(name):
    for source in sorted(sources(PAGES[name])):
        assert_facts(source)


def with_value(quote: Quote, name: str, text: str) -> str:
    """The text of ``quote`` with its field ``name`` reading ``text``."""
    return Quote(quote.template, **{**quote.fields, name: Figure(lambda: text)}).text()


def test_a_figure_changed_by_hand_fails():
    """Every quoted figure, one digit changed on the page, makes its quote go missing
    there: the check above fails for each figure edited by hand."""
    checked = 0
    for module in PAGES.values():
        text = page_prose(module)
        for quote in module.QUOTES:
            for name, figure in quote.fields.items():
                value = figure.text()
                digit = re.search(r"\d(?!.*\d)", value)        # the last digit
                if digit is None:
                    continue
                new = value[:digit.start()] + str((int(digit.group(0)) + 1) % 10) \
                    + value[digit.end():]
                edited = text.replace(quote.text(), with_value(quote, name, new))
                assert edited != text and quote.text() not in edited, (module.PAGE, name)
                checked += 1
    assert checked >= 100, checked


def test_the_scan_finds_figures():
    text = ("took 61.4 s at load 0.11, 5.7–6.7× faster, +0.76% of a run, 1 of 1000 steps, "
            "reached at step 640, about 10 µs, 3 times, 2.0x, 21.63% zero, 8 per thousand, "
            "steps 100–103 on 2026-11-27 at 2**12 and 0.975. Not ``scale=0.5`` or "
            "nnabla-1.39.0; 2**15 is float16's")
    assert [m.group(0) for m in FIGURE.finditer(text)] == [
        "61.4 s", "0.11", "5.7–6.7×", "+0.76%", "1 of 1000", "step 640", "10 µs", "3 times",
        "2.0x", "21.63%", "8 per thousand", "steps 100–103", "2026-11-27", "2**12", "0.975",
        "2**15"]
    quote = Quote("took {t} s at load 0.11, {low}–6.7× faster", t=Figure(lambda: 61.4),
                  low=Figure(lambda: 5.7))
    # the digits of the quote's fields are covered, not those it writes itself; a phrase
    # listed as no measurement covers its own; 2**15 is a fact of float16
    assert unquoted_figures(text, [quote], {"3 times"}) == [
        "0.11", "5.7–6.7×", "+0.76%", "1 of 1000", "step 640", "10 µs", "2.0x", "21.63%",
        "8 per thousand", "steps 100–103", "2026-11-27", "2**12", "0.975"]


def test_the_scan_finds_bare_numbers_and_numbers_in_words():
    """Outside inline code, a number without a unit and a number in words are figures too;
    a number in a word, a path, an option or a version is not, nor one in inline code
    (where the kinds above still are)."""
    text = ("the 450 held-out images, a decay of 1e-4 on a 64-256-256-10 MLP of 8x8 inputs, "
            "every 25th step, -3 and 0.5, six a step, twenty-five ranks, Twice the half of a "
            "thousand, in an hour or a minute. Not ``N=200`` nor `32` (code), run1.txt, "
            "float16, fp16's, nnabla-1.39.0, scale=0.5, x_2, /dev/shm2, step_0, someone, "
            "often, one_hot; but ``2**12``, ``1024 steps`` and ``'fast|step|0.9'`` are.")
    assert [m.group(0) for m in FIGURE.finditer(text)] == [
        "450", "1e-4", "64-256-256-10", "8x8", "25th", "-3", "0.5", "six", "twenty-five",
        "Twice", "half", "thousand", "an hour", "a minute", "2**12", "1024 steps", "0.9"]
    quote = Quote("the {n} held-out images", n=Figure(lambda: 450))
    # a figure in words is covered by its letters, by a quote's field or a listed phrase
    assert unquoted_figures(text, [quote], {"six a step", "Twice the half"}) == [
        "1e-4", "64-256-256-10", "8x8", "25th", "-3", "0.5", "twenty-five", "thousand",
        "an hour", "a minute", "2**12", "1024 steps", "0.9"]


@pytest.mark.parametrize("name", MODULES)
def test_the_prose_pairs_its_backticks(name):
    """The scan tells inline code by the runs of backticks after a number (an even count
    follows a number outside code), so every page's prose must pair them."""
    runs = re.findall(r"`+", page_prose(PAGES[name]))
    assert len(runs) % 2 == 0, f"{PAGES[name].PAGE}: an odd number of backtick runs"


def problems(module, text: str) -> "list[str]":
    """What the figures tests find wrong on ``text`` read as the prose of ``module``'s
    page: its quotes missing from it, and its figures that no quote and no listed phrase
    covers."""
    allowed = {**module.NOT_MEASURED, **getattr(module, "CHECKED_BY", {})}
    return ([quote.text() for quote in module.QUOTES if quote.text() not in text]
            + unquoted_figures(text, module.QUOTES, allowed))


#: Edits by hand of figures without a unit or in words: (page module, the page's words, the
#: words edited, the figure the edit writes).
SILENT_EDITS = [
    ("page_benchmarks", "450 held-out images", "460 held-out images", "460"),
    ("page_distributed", "takes six a step", "takes four a step", "four"),
    ("page_quickstart", "about a minute", "about two minutes", "two"),
    ("page_benchmarks", "several times faster", "ten times faster", "ten"),
]


@pytest.mark.parametrize("name, before, after, figure", SILENT_EDITS)
def test_a_count_or_a_number_in_words_changed_by_hand_fails(name, before, after, figure):
    """A count or a number in words edited on the page makes a quote go missing or a
    figure appear that nothing quotes or lists, and the scan sees the figure the edit
    wrote."""
    module = PAGES[name]
    text = page_prose(module)
    assert text.count(before) == 1 and not problems(module, text), (module.PAGE, before)
    edited = text.replace(before, after)
    assert problems(module, edited), (module.PAGE, after)
    allowed = {**module.NOT_MEASURED, **getattr(module, "CHECKED_BY", {})}
    assert figure in unquoted_figures(edited, module.QUOTES, allowed), (module.PAGE, after)


def test_included_results_say_date_machine_load_and_command():
    """The results files the pages include whole are records too."""
    included = set()
    for page in (ROOT / "docs").glob("*.rst"):
        included |= set(re.findall(r"literalinclude:: \.\./benchmarks/results/(\S+)",
                                   page.read_text(encoding="utf-8")))
    assert included
    for source in sorted(included):
        assert_facts(source)
