"""One updater runs one step at a time: a second ``update()`` while one runs, from another
thread or from inside the step, raises instead of corrupting nnabla's memory."""
import threading

from nnabla_mpt import DynamicLossScalingUpdater
from support import Net, assert_bitwise_equal, raises_naming

WAIT = 30  # seconds; a hang fails the test instead of blocking the run


def test_update_from_a_second_thread_while_one_runs_raises():
    net = Net()
    entered, release = threading.Event(), threading.Event()
    feeds = []

    def feeder():
        feeds.append(threading.current_thread().name)
        if len(feeds) == 1:              # the first step waits here, inside update()
            entered.set()
            assert release.wait(WAIT)
        net.feeder()

    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, feeder,
                                        scale=8.0)
    outcome = {}

    def first():
        try:
            outcome["result"] = updater.update()
        except BaseException as err:     # reported below, not lost in the thread
            outcome["error"] = err

    worker = threading.Thread(target=first, name="first")
    worker.start()
    try:
        assert entered.wait(WAIT)
        with raises_naming(RuntimeError, "DynamicLossScalingUpdater.update()",
                           "already running", "another thread", "one thread",
                           "an updater of its own"):
            updater.update()
    finally:
        release.set()
        worker.join(WAIT)
    assert not worker.is_alive() and "error" not in outcome
    assert outcome["result"].updated and feeds == ["first"]
    assert (updater.steps, updater.updates) == (1, 1)
    # the parameters are those of exactly one step, on the first batch
    ref = Net(scope="ref")
    DynamicLossScalingUpdater(ref.solver("Sgd", lr=0.1), ref.loss, ref.feeder,
                              scale=8.0).update()
    assert_bitwise_equal(net.snapshot(), ref.snapshot())
    assert updater.update().updated      # the lock is free again


def test_update_from_inside_a_step_raises():
    net = Net()
    calls = []

    def monitor(result):
        calls.append(result.step)
        if len(calls) == 1:
            updater.update()             # a hook that steps again

    updater = DynamicLossScalingUpdater(net.solver("Sgd", lr=0.1), net.loss, net.feeder,
                                        scale=8.0, monitor=monitor)
    with raises_naming(RuntimeError, "DynamicLossScalingUpdater.update()", "already running",
                       "from inside update()", "monitor hook", "data_feeder",
                       "after update() has returned"):
        updater.update()
    assert calls == [0] and updater.steps == 1
    assert updater.update().step == 1    # an exception leaves the updater usable
