"""Fixtures of the tests of training over ranks."""
import pytest


@pytest.fixture(scope="module")
def solo():
    """An MPICommunicator in the test's own process (MPI as a singleton, size 1) that ends
    no job on an exception; a callback the module's tests leave armed is cleared after."""
    from nnabla_mpt import MPICommunicator
    comm = MPICommunicator(abort_on_exception=False)
    yield comm
    comm.clear_all_reduce_callback()
