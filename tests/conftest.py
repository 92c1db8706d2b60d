"""Shared fixtures: every test starts and ends with a clean nnabla global state; the
nnabla logger's info lines, for the tests that read them (``info_log``)."""
import logging
import sys

import pytest


def _reset_nnabla() -> None:
    # Only touch nnabla when some test has loaded it: the pure policy tests never need it.
    if "nnabla" not in sys.modules:
        return
    import nnabla as nn
    from nnabla.ext_utils import get_extension_context

    nn.clear_parameters()
    nn.set_default_context(get_extension_context("cpu", type_config="float"))
    nn.set_auto_forward(False)


@pytest.fixture(autouse=True)
def fresh_nnabla():
    """Each test starts with no parameters, the float context and auto-forward off."""
    _reset_nnabla()
    yield
    _reset_nnabla()


@pytest.fixture
def info_log(caplog):
    """``caplog`` with the nnabla logger's info lines kept."""
    caplog.set_level(logging.INFO, logger="nnabla")
    return caplog
