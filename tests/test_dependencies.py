"""The nnabla versions the package declares are the ones its suite runs on: setup.py
accepts a range, tox.ini runs the suite on its oldest and its newest version, and the
project's own environment (tools/env.sh, which the README's commands and CI use) installs
the newest."""
import ast
import configparser
import re

from packaging.requirements import Requirement
from packaging.version import Version

from doc_pages import ROOT


def install_requires():
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            return [Requirement(r) for r in ast.literal_eval(node.value)]
    raise AssertionError("setup.py has no install_requires")


def tox_versions():
    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini", encoding="utf-8")
    pins = dict(re.findall(r"^\s*(nnabla\d+): nnabla==([\d.]+)\s*$", tox["testenv"]["deps"],
                           re.M))
    envs = [e.strip() for e in tox["tox"]["envlist"].split(",")]
    assert all(any(e.endswith(factor) for e in envs) for factor in pins), (pins, envs)
    return sorted((Version(v) for v in pins.values()))


def test_nnabla_is_a_range_of_tested_versions_below_2():
    nnabla, = [r for r in install_requires() if r.name == "nnabla"]
    versions = tox_versions()
    assert len(versions) >= 2, "tox.ini runs the suite on the oldest and the newest nnabla"
    oldest, newest = versions[0], versions[-1]
    assert oldest < newest
    assert all(v in nnabla.specifier for v in versions), (str(nnabla.specifier), versions)
    # the oldest version tested is the oldest accepted, and nnabla 2 is not accepted
    assert Version(f"{oldest.major}.{oldest.minor - 1}.99") not in nnabla.specifier
    assert Version("2.0.0") not in nnabla.specifier
    assert Version(f"{newest.major}.{newest.minor + 1}.0") in nnabla.specifier


def test_the_projects_environment_installs_the_newest_tested_nnabla():
    env_sh = (ROOT / "tools" / "env.sh").read_text(encoding="utf-8")
    pinned, = re.findall(r"^_nnabla_version=([\d.]+)", env_sh, re.M)
    assert Version(pinned) == tox_versions()[-1]
    assert '"nnabla==$_nnabla_version"' in env_sh
