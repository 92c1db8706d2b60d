"""The result of the last mutation run (``tools/mutation.sh``): a line per module mutated,
read from mutmut's records in ``mutants/``.

Each module's line gives its mutants, those killed (a test failed, timed out or crashed
on them), those that survived, and of these the ones ``tools/mutation_equivalent.txt``
lists with why they cannot change what the code does; the share killed counts the
listed ones as killed. The survivors no line explains are printed by name, and a listed
name that no longer survives is said to be stale.

Usage: .venv/bin/python tools/mutation_summary.py [--survivors | --mpi] [MODULE ...]
(e.g. scale/policy); ``--survivors`` prints only the names of the surviving mutants, one
a line, for ``mutmut run`` to try again; ``--mpi``, those listed as killed by a test run
under ``mpiexec`` (which mutmut's runner cannot reach), each with that test's file, for
``tools/mutation.sh`` to run them.
"""
import json
import pathlib
import sys
from collections import Counter

from mutmut.stats import status_by_exit_code

ROOT = pathlib.Path(__file__).resolve().parent.parent
EQUIVALENT = ROOT / "tools" / "mutation_equivalent.txt"
KILLED = {"killed", "timeout", "segfault"}


def explained():
    """``mutant name -> why it is equivalent`` from :data:`EQUIVALENT` (lines ``NAME  WHY``;
    ``#`` starts a comment)."""
    listed = {}
    for line in EQUIVALENT.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, why = line.partition(" ")
            listed[name] = why.strip()
    return listed


def under_mpi(listed, survivors):
    """``(name, test file)`` of the ``survivors`` that ``listed`` says a test run under
    ``mpiexec`` kills (a reason ``mpi: killed by FILE, ...``)."""
    for name in survivors:
        why = listed.get(name, "")
        if why.startswith("mpi: killed by "):
            yield name, why[len("mpi: killed by "):].split(",", 1)[0]


def records(wanted):
    """``(module, {mutant name: status})`` of each module mutated (of ``wanted`` only,
    when given), from mutmut's records."""
    for meta in sorted((ROOT / "mutants").rglob("*.py.meta")):
        module = meta.relative_to(ROOT / "mutants" / "nnabla_mpt").as_posix()[:-len(".py.meta")]
        if not wanted or module in wanted:
            codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
            yield module, {name: status_by_exit_code[code] for name, code in codes.items()}


def main(wanted):
    listed = explained()
    print(f"{'module':24} {'mutants':>7} {'killed':>6} {'survived':>8} {'listed':>6} "
          f"{'killed or listed':>16}")
    unexplained, survivors = [], set()
    for module, status in records(wanted):
        counts = Counter("killed" if s in KILLED else s for s in status.values())
        alive = sorted(name for name, s in status.items() if s == "survived")
        survivors.update(alive)
        equivalent = [name for name in alive if name in listed]
        unexplained += [name for name in alive if name not in listed]
        other = {k: v for k, v in counts.items() if k not in ("killed", "survived")}
        share = 100.0 * (counts["killed"] + len(equivalent)) / max(len(status), 1)
        print(f"{module + '.py':24} {len(status):7d} {counts['killed']:6d} "
              f"{counts['survived']:8d} {len(equivalent):6d} {share:15.1f}%"
              + (f"  {dict(other)}" if other else ""))
    for name in unexplained:
        print(f"survived, not explained: {name}")
    for name in sorted(set(listed) - survivors):
        if not wanted or any(name.startswith(f"nnabla_mpt.{m.replace('/', '.')}.") for m in wanted):
            print(f"listed but no longer surviving (stale): {name}")


if __name__ == "__main__":
    args = sys.argv[1:]
    modules = {m[:-3] if m.endswith(".py") else m for m in args
               if m not in ("--survivors", "--mpi")}
    alive = sorted(name for _, status in records(modules)
                   for name, s in status.items() if s == "survived")
    if "--survivors" in args:
        for name in alive:      # none: no line at all (tools/mutation.sh reads the lines)
            print(name)
    elif "--mpi" in args:
        for name, test in under_mpi(explained(), alive):
            print(name, test)
    else:
        main(modules)
