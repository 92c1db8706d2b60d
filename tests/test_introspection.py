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
# The submodules the API page documents, by the short names a script imports them by
# (``nnabla_mpt.policy``): the modules of its ``automodule`` and of the functions and data
# it shows by full name.
DOCUMENTED_SUBMODULES = sorted(set(
    re.findall(r"^\.\. auto(?:function|data):: nnabla_mpt\.([\w.]+)\.\w+$", API, re.M)
    + re.findall(r"^\.\. automodule:: nnabla_mpt\.([\w.]+)$", API, re.M)))
# ... and where they live in the package's folders.
DOCUMENTED_PATHS = {"launcher": "distributed.launcher", "nnabla_api": "distributed.nnabla_api",
                    "monitoring": "monitoring", "gradient_stats": "scale.gradient_stats",
                    "measured": "scale.measured", "policy": "scale.policy",
                    "precision": "scale.precision", "seed": "scale.seed"}


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


def test_dir_of_the_package_shows_the_public_api_and_the_documented_submodules():
    proc = subprocess.run([sys.executable, "-c", DIR], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    same, names = proc.stdout.splitlines()
    assert same == "True"           # loading names does not add the modules behind them
    names = names.split()
    import nnabla_mpt
    public = [n for n in names if not n.startswith("__")]
    assert sorted(public) == sorted(set(nnabla_mpt.__all__) | set(DOCUMENTED_SUBMODULES))
    assert "Any" not in names and "importlib" not in names
    assert {"updater", "communicator", "dtypes"}.isdisjoint(names)
    assert "__version__" in names
    for name, path in DOCUMENTED_PATHS.items():
        assert getattr(nnabla_mpt, name).__name__ == f"nnabla_mpt.{path}"


def test_documented_submodules_are_found_in_the_api_page():
    assert DOCUMENTED_SUBMODULES == sorted(DOCUMENTED_PATHS)


SHORT_PATHS = """
import sys
import nnabla_mpt.policy
from nnabla_mpt.policy import SCALE_LIMIT
assert "nnabla" not in sys.modules            # the short path loads what the module needs
import nnabla_mpt.measured, nnabla_mpt.launcher as launcher
from nnabla_mpt.seed import held_scale
for short, path in [("policy", "scale.policy"), ("measured", "scale.measured"),
                    ("launcher", "distributed.launcher"), ("seed", "scale.seed")]:
    module = sys.modules[f"nnabla_mpt.{path}"]
    assert sys.modules[f"nnabla_mpt.{short}"] is module is getattr(nnabla_mpt, short)
    assert module.__name__ == module.__spec__.name == f"nnabla_mpt.{path}"
assert SCALE_LIMIT is nnabla_mpt.scale.policy.SCALE_LIMIT
assert held_scale is nnabla_mpt.scale.seed.held_scale and launcher is nnabla_mpt.launcher
from nnabla_mpt.diagnosis import diagnose, OverflowReport   # the diagnosis was one module
assert diagnose is nnabla_mpt.diagnose and OverflowReport is nnabla_mpt.OverflowReport
import importlib
importlib.reload(nnabla_mpt)
assert sum(type(f).__name__ == "_DocumentedPaths" for f in sys.meta_path) == 1
"""


def test_documented_submodules_import_by_their_short_paths_as_the_same_modules():
    """``import nnabla_mpt.policy`` and ``from nnabla_mpt.policy import ...`` of a documented
    submodule that lives in a folder give the module of the folder, not a copy."""
    proc = subprocess.run([sys.executable, "-c", SHORT_PATHS], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
