import pytest

import nnabla as nn
from nnabla.ext_utils import get_extension_context


@pytest.fixture(autouse=True)
def fresh_nnabla():
    """Each test starts with no parameters and the float context."""
    nn.clear_parameters()
    nn.set_default_context(get_extension_context("cpu", type_config="float"))
    yield
    nn.clear_parameters()
    nn.set_default_context(get_extension_context("cpu", type_config="float"))
