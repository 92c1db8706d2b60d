"""What ``help()`` and ``dir()`` show a user: the counters of an updater, and the public API
of the package only."""
import pydoc
import re
import subprocess
import sys

import pytest

from doc_pages import ROOT
from nnabla_mpt import DynamicLossScalingUpdater, FixedLossScalingUpdater
from support import Net

COUNTERS = ("steps", "updates", "skipped_steps")
API = (ROOT / "docs" / "api.rst").read_text(encoding="utf-8")
# The submodules the API page documents, by their paths in the package
# (``nnabla_mpt.scale.policy``): the modules of its ``automodule`` and of the functions and
# data it shows by full name.
DOCUMENTED_SUBMODULES = sorted(set(
    re.findall(r"^\.\. auto(?:function|data):: nnabla_mpt\.([\w.]+)\.\w+$", API, re.M)
    + re.findall(r"^\.\. automodule:: nnabla_mpt\.([\w.]+)$", API, re.M)))


@pytest.mark.parametrize("cls", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
def test_help_of_an_updater_lists_the_counters_with_what_they_count(cls):
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    for name in COUNTERS:
        match = re.search(rf"\n \|  {name}\n \|      (.+)\n", text)
        assert match, f"help({cls.__name__}) does not list {name}"
    assert "updates + skipped_steps" in text
    assert "Steps that updated the parameters" in text


def test_the_documented_counters_count_the_steps():
    net = Net("half")
    net.large = {0, 1}
    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.01), net.loss, net.feeder,
                                        scale=2.0 ** 15, N=1000)
    results = [updater.update() for _ in range(5)]
    skipped = sum(r.skipped for r in results)
    assert skipped >= 1
    assert (updater.steps, updater.updates, updater.skipped_steps) == (5, 5 - skipped, skipped)
    state = updater.state_dict()
    assert (state["steps"], state["updates"], state["skipped_steps"]) == (5, 5 - skipped,
                                                                          skipped)


DIR = """
import nnabla_mpt
first = dir(nnabla_mpt)
nnabla_mpt.DynamicLossScalingUpdater, nnabla_mpt.MPICommunicator   # loads submodules
print(first == dir(nnabla_mpt))
print(" ".join(first))
"""


def test_dir_of_the_package_shows_the_public_api():
    proc = subprocess.run([sys.executable, "-c", DIR], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    same, names = proc.stdout.splitlines()
    assert same == "True"           # loading names does not add the modules behind them
    names = names.split()
    import nnabla_mpt
    public = [n for n in names if not n.startswith("__")]
    assert sorted(public) == sorted(nnabla_mpt.__all__)
    assert "Any" not in names and "importlib" not in names
    assert {"updater", "communicator", "dtypes"}.isdisjoint(names)
    assert "__version__" in names


@pytest.mark.parametrize("path", DOCUMENTED_SUBMODULES)
def test_documented_submodules_import_by_their_paths(path):
    """The API page documents modules that exist where it says."""
    import importlib
    assert importlib.import_module(f"nnabla_mpt.{path}").__name__ == f"nnabla_mpt.{path}"


PLAIN = """
import sys
import nnabla_mpt.scale.policy
from nnabla_mpt.scale.policy import SCALE_LIMIT
assert "nnabla" not in sys.modules            # the policy needs no nnabla
assert not [f for f in sys.meta_path if type(f).__module__.startswith("nnabla_mpt")]
for short in ("policy", "measured", "launcher", "seed", "precision"):
    try:
        __import__(f"nnabla_mpt.{short}")
    except ModuleNotFoundError:
        continue
    raise AssertionError(f"nnabla_mpt.{short} imports: a short path came back")
from nnabla_mpt.diagnosis.diagnosis import diagnose
from nnabla_mpt.diagnosis.report import OverflowReport
assert diagnose is nnabla_mpt.diagnose and OverflowReport is nnabla_mpt.OverflowReport
"""


def test_the_package_installs_no_import_hook_and_has_no_short_paths():
    proc = subprocess.run([sys.executable, "-c", PLAIN], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_package_walks_no_frames_and_hooks_no_imports():
    sources = "\n".join(p.read_text(encoding="utf-8")
                        for p in (ROOT / "nnabla_mpt").rglob("*.py"))
    assert "_getframe" not in sources and "meta_path" not in sources


@pytest.mark.parametrize("cls", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
def test_help_of_an_updater_says_the_essentials_first(cls):
    lines = pydoc.render_doc(cls, renderer=pydoc.plaintext).splitlines()
    head = " ".join(" ".join(lines[:20]).replace("``", "").replace("|", "").split())
    assert "step = updater.update() runs one step" in head
    assert "step.skipped, step.scale and step.loss" in head
    assert "updater.steps, updater.updates and updater.skipped_steps" in head
    if cls is DynamicLossScalingUpdater:
        assert 'Recommended: scale="auto", growth_mode="measured"' in head


def test_every_option_of_the_distributed_example_says_what_it_is_and_its_default():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "digits_distributed.py"),
                           "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    usage, _, entries = proc.stdout.partition("show this help message and exit")
    options = re.findall(r"\[(--[\w-]+)", usage)
    assert options == ["--precision", "--steps", "--batch-size", "--lr", "--seed"]
    # one entry per option, each with a text of its own and its default
    blocks = re.split(r"\n  (?=--)", entries)[1:]
    assert [b.split()[0] for b in blocks] == options
    for block in blocks:
        words = " ".join(block.split())
        assert re.search(r" [a-z][a-z ,':]+", words) and "(default: " in words, words


@pytest.mark.parametrize("cls", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
def test_help_of_an_updater_shows_no_lock_and_no_mixin(cls):
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    assert [c.__name__ for c in cls.__mro__] == [cls.__name__, "_LossScalingUpdater",
                                                 "object"]
    for member in ("enter", "leave", "between_steps", "held"):         # no lock's methods
        assert not re.search(rf"\n \|  {member}(\(|\n)", text), member
    for mixin in ("StepLock", "Resumable", "CollapseAttributes", "OneAtATime", "StepCounters"):
        assert mixin not in text, mixin
    public = [n for n in dir(cls) if not n.startswith("_")]
    assert len(public) <= 42, public
