"""The figures that docs/measured.rst quotes in "Lifting the float16 seed ceiling" are
those of ``benchmarks/results/float32_loss.json`` (written by
``benchmarks/float32_loss.py``): its table cell by cell, the warning it quotes, and
every number of its prose. A figure edited by hand on the page, or a results file run
again without the page following it, fails here.

The cells are formatted here from the raw values of the results file as the benchmark
formats them (percentages of fractions: subnormals with 3 decimals, accuracy with 2;
scales as powers of two), and the benchmark's own printed rows (``table`` in the JSON,
and the ``.txt``) must agree.
"""
import json
import math
import re

import pytest

from doc_pages import ROOT, directive_spans, section_span

PAGE = ROOT / "docs" / "measured.rst"
RESULTS = ROOT / "benchmarks" / "results" / "float32_loss.json"
TEXT = ROOT / "benchmarks" / "results" / "float32_loss.txt"
TITLE = "Lifting the float16 seed ceiling"
STATS_AFTER = (100, 200, 300, 400)           # the table's subnormal columns: after K steps
HEADER = ["run", "scales", "subnormal % after 100 steps", "after 200", "after 300",
          "after 400", "skipped", "held by the ceiling", "accuracy %"]
#: Numbers the prose may state that are no measurement: float32's largest power of two,
#: the default max_scale's (2**24), float16's largest value, the momentum, the batch of
#: 64 as a power of two.
CONSTANTS = {"127", "24", "65504", "0.9", "6"}


def section(text: str) -> str:
    """The text of the section titled TITLE, up to the next title of its level or above."""
    lines = text.splitlines()
    start, end = section_span(lines, TITLE)
    return "\n".join(lines[start:end])


def list_table(text: str):
    """The rows (lists of cell texts, literals' backquotes removed) of the section's
    list-table."""
    lines = text.splitlines()
    first, last = next((a, b) for a, b in directive_spans(text.splitlines())
                       if "list-table::" in lines[a])
    rows = []
    for line in lines[first + 1:last]:
        cell = re.match(r"^\s+(\* )?- (.*)$", line)
        if cell is None:
            continue
        if cell.group(1):
            rows.append([])
        rows[-1].append(cell.group(2).replace("``", "").strip())
    return rows


def prose(text: str) -> str:
    """The section without its directive blocks (code, its printed output, the table)."""
    lines = text.splitlines()
    drop = {i for a, b in directive_spans(text.splitlines()) for i in range(a, b)}
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)


def quoted_warning(text: str) -> str:
    lines = text.splitlines()
    first, last = next((a, b) for a, b in directive_spans(text.splitlines())
                       if lines[a].strip() == ".. code-block:: none")
    return " ".join(" ".join(lines[first + 1:last]).split())


# ------------------------------------------------------ the cells, from the raw values

def power(scale: float) -> str:
    k = math.log2(scale)
    assert k == int(k), scale
    return f"2**{int(k)}"


def percent(fraction: float, decimals: int) -> str:
    return f"{100 * fraction:.{decimals}f}"


def steps(count: int, where) -> str:
    return f"{count}" + (f" ({', '.join(map(str, where))})" if where else "")


def expected_rows(results):
    rows = []
    for run in results["runs"]:
        stats = {s["step"] + 1: s for s in run["gradient_stats"]}
        assert sorted(stats) == list(STATS_AFTER), sorted(stats)
        ceiling = [g["step"] for g in run["growth_points"] if g["held_by"] == "ceiling"]
        assert ceiling == run["held_by_ceiling"]
        rows.append([run["label"], ", ".join(power(s) for s in run["scale"]["distinct"])]
                    + [percent(stats[k]["subnormal_fraction"], 3)
                       + (" (skipped)" if stats[k]["skipped"] else "") for k in STATS_AFTER]
                    + [steps(run["skipped"]["count"], run["skipped"]["steps"]),
                       f"{len(ceiling)} of {len(run['growth_points'])}"
                       + (f" ({', '.join(map(str, ceiling))})" if ceiling else ""),
                       percent(run["accuracy"]["float_inference"], 2)])
    return rows


def run_of(results, label):
    return next(r for r in results["runs"] if r["label"] == label)


def claims(results):
    """The sentences of the prose that state measured figures, as the results make them
    (whitespace as one space)."""
    f16, f32 = run_of(results, "float16 loss, mean"), run_of(results, "float32 loss, mean")
    sums = [run_of(results, "float16 loss, sum"), run_of(results, "float32 loss, sum")]
    sub = {r["label"]: percent(r["gradient_stats"][-1]["subnormal_fraction"], 3)
           for r in (f16, f32)}
    changes = f32["scale_changes"]
    initial = set(f32["scale"]["distinct"]) - {new for _, new in changes}
    accuracies = {percent(r["accuracy"]["float_inference"], 2) for r in results["runs"]}
    seconds = {r["run"]: r["s"] for r in results["table"]}
    assert len(initial) == 1 and len(changes) == 3 and len(accuracies) == 1
    assert all(r["scale_changes"] == sums[0]["scale_changes"] for r in sums)
    assert all(r["skipped"]["count"] == 0 for r in results["runs"])
    assert f16["held_by_ceiling"] == [g["step"] for g in f16["growth_points"]]
    assert f16["scale"]["distinct"] == [2.0 ** 15]
    assert not any(r["held_by_ceiling"] for r in results["runs"][1:])
    assert changes[0][0] == f32["growth_points"][0]["step"]
    return [
        f"run on {results['date'][:10]}",
        f"load average {results['load_before'][0]:.2f} before the run, "
        f"{results['load_after'][0]:.2f} after it",
        f"trains the digits MLP of the demo "
        f"(64-{'-'.join(map(str, results['args']['hidden']))}-10, ReLU, batch "
        f"{results['args']['batch']}, Momentum({results['args']['lr']:g}, 0.9)",
        f"in float16 for {results['args']['steps']} steps",
        f"``N={results['args']['interval']}``",
        f"``gradient_stats_every={results['args']['stats_every']}``",
        f"the {results['args']['test']} test images",
        f"grow to {sub['float16 loss, mean']}% after {results['args']['steps']} steps",
        f"the calibration starts at ``{power(initial.pop())}``, the first growth point "
        f"takes the scale to ``{power(changes[0][1])}``, where the gradients hold it until "
        f"the growth point of step {changes[1][0]} takes it to ``{power(changes[1][1])}`` "
        f"and that of step {changes[2][0]} to ``{power(changes[2][1])}``",
        f"after {results['args']['steps']} steps {sub['float32 loss, mean']}% of the "
        f"gradient values are subnormal",
        f"they reach ``{power(sums[0]['scale_changes'][-1][1])}`` at the growth point of "
        f"step {sums[0]['scale_changes'][-1][0]} too",
        f"all reach {accuracies.pop()}% test accuracy",
        f"took {seconds['float16 loss, mean']} s and {seconds['float32 loss, mean']} s of "
        f"wall time",
    ]


def numbers_in(value):
    """Every integer of a JSON value, and the numbers inside its strings (the printed
    rows, the date, the warning)."""
    if isinstance(value, dict):
        return set().union(set(), *(numbers_in(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(set(), *(numbers_in(v) for v in value))
    if isinstance(value, bool) or value is None:
        return set()
    if isinstance(value, (int, float)):
        return {str(int(value))} if float(value).is_integer() else set()
    return set(re.findall(r"\d+(?:\.\d+)?", str(value)))


def problems(page_text: str, results) -> list:
    """What on the page does not agree with the results: [] when everything does."""
    found = []
    text = section(page_text)
    table = list_table(text)
    if table[0] != HEADER:
        found.append(f"header {table[0]} != {HEADER}")
    want = expected_rows(results)
    if len(table) - 1 != len(want):
        found.append(f"{len(table) - 1} rows on the page, {len(want)} runs in the results")
    for got, row in zip(table[1:], want):
        if got != row:
            found.append(f"row {got} != the results' {row}")
    # the quoted warning is the one the float16 mean run logged, at the step it says
    run = next(r for r in results["runs"] if r["label"] == "float16 loss, mean")
    if quoted_warning(text) != run["warnings"][0]["message"]:
        found.append(f"quoted warning != the results' {run['warnings'][0]['message']!r}")
    if f"at step {run['warnings'][0]['step']} (the first growth point)" not in text:
        found.append("the step of the warning")
    # "a float16 graph gives the same figures"
    for r in results["runs"]:
        if (percent(r["accuracy"]["half_inference"], 2)
                != percent(r["accuracy"]["float_inference"], 2)):
            found.append(f"{r['label']}: float16 inference differs from float32 inference")
    # the figures of the prose: those it states in so many words, and every other
    # number is one of the results'
    words = " ".join(prose(text).split())
    for claim in claims(results):
        if claim not in words:
            found.append(f"the prose does not say {claim!r}")
    allowed = numbers_in(results) | CONSTANTS | {f"{results['args']['lr']:g}"}
    allowed |= {f"{v:.2f}" for v in results["load_before"] + results["load_after"]}
    scales = {s for r in results["runs"] for s in r["scale"]["distinct"]}
    for k in re.findall(r"2\*\*(\d+)", words):
        if 2.0 ** int(k) not in scales and k not in CONSTANTS:
            found.append(f"2**{k} in the prose is no scale of the results")
    for number in re.findall(r"(?<![\w.*])\d+(?:\.\d+)?(?![\w*])",
                             re.sub(r"2\*\*\d+", "", words)):
        if "." not in number and int(number) <= 10:
            continue                # small counts ("2-core", "step 3" of the example)
        if number not in allowed:
            found.append(f"{number} in the prose is in no results")
    return found


@pytest.fixture(scope="module")
def results():
    return json.loads(RESULTS.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def page():
    return PAGE.read_text(encoding="utf-8")


def test_the_section_quotes_the_results(page, results):
    assert problems(page, results) == []


def test_the_benchmark_printed_the_same_cells(results):
    """The JSON's printed rows and the .txt show what the test derives from the raw
    values."""
    text = TEXT.read_text(encoding="utf-8")
    for row, printed in zip(expected_rows(results), results["table"]):
        scales = row[1]
        assert [printed["run"], printed["scales"]] == row[:2]
        assert [printed[f"subnormal % @{k}"] for k in STATS_AFTER] == row[2:6]
        assert [printed["skipped"], printed["held by ceiling"],
                printed["accuracy %"]] == row[6:]
        line = next(line for line in text.splitlines() if line.startswith(row[0] + "  "))
        assert re.split(r"\s{2,}", line)[:len(row)] == row, (line, scales)


@pytest.mark.parametrize("edit", [
    ("     - 4.113\n", "     - 4.114\n"),                        # a table cell
    ("     - ``2**16``, ``2**17``", "     - ``2**16``, ``2**18``"),  # a scale
    ("- 8 of 8 (49, 99,", "- 8 of 8 (49, 98,"),                    # a growth point
    ("4.113% after 400 steps", "4.13% after 400 steps"),          # a prose figure
    ("load average 0.57 before", "load average 0.75 before"),     # the load
    ("took 32.1 s and 31.5 s", "took 32.1 s and 31.6 s"),         # a wall time
    ("leave room for 2 more", "leave room for 3 more"),           # the quoted warning
    ("reach 97.22% test", "reach 97.23% test"),                   # the accuracy
    ("step 299 takes it", "step 249 takes it"),                   # a growth point
    ("the 360 test images", "the 359 test images"),               # the test split
])
def test_an_edited_figure_fails(page, results, edit):
    old, new = edit
    if page.count(old) == 1:
        edited = page.replace(old, new)
    else:                                   # a phrase wrapped over lines
        pattern = r"\s+".join(map(re.escape, old.split()))
        assert len(re.findall(pattern, page)) == 1, old
        edited = re.sub(pattern, new, page)
    assert edited != page
    assert problems(edited, results) != []
