"""LossScaleTensorBoard: the series of LossScaleMonitor as TensorBoard scalars, read back
from the event files a real float16 run wrote; a resumed run's curves go on."""
import math
import pathlib
import struct
import sys

import pytest
from nnabla.monitor import Monitor

from nnabla_mpt import LossScaleMonitor, LossScaleTensorBoard, StepResult
from report_runs import LARGE, fp16_updater, series
from support import Net, raises_naming

KEYS = ("scale", "skipped-steps", "overflow-rate", "gradient-zero-fraction",
        "gradient-subnormal-fraction", "gradient-headroom")


def events(path):
    """The Event protos of an event file (TFRecord: length, its CRC, the data, its CRC)."""
    from tensorboardX.proto.event_pb2 import Event
    data, i, out = pathlib.Path(path).read_bytes(), 0, []
    while i < len(data):
        (length,) = struct.unpack("<Q", data[i:i + 8])
        out.append(Event.FromString(data[i + 12:i + 12 + length]))
        i += 12 + length + 4
    return out


def scalars(logdir):
    """``{tag: {step: value}}`` as TensorBoard shows them: the event files in the order they
    were written, a session START after the first dropping the points from its step on."""
    shown, started = {}, False
    for path in sorted(pathlib.Path(logdir).glob("events.out.tfevents.*")):
        for event in events(path):
            if event.HasField("session_log") and event.session_log.status == 1:   # START
                if started:
                    for points in shown.values():
                        for step in [s for s in points if s >= event.step]:
                            del points[step]
                started = True
            for value in event.summary.value:
                shown.setdefault(value.tag, {})[event.step] = value.simple_value
    return shown


def same(a, b):
    return a == b if math.isinf(a) or math.isinf(b) else a == pytest.approx(b, rel=1e-5)


def assert_series_shown(shown, monitor_dir, steps):
    """Every series the LossScaleMonitor wrote to ``monitor_dir`` is a scalar of
    ``shown`` at the same ``steps``, with the same values."""
    for key in KEYS:
        written = series(monitor_dir, key)
        assert sorted(shown[f"loss-scale/{key}"]) == sorted(written) == steps
        for step, value in written.items():
            assert same(shown[f"loss-scale/{key}"][step], value), (key, step)


def test_the_scalars_are_the_monitor_series_at_the_same_steps(tmp_path):
    net = Net("half", hidden=3)
    net.large = set(LARGE)
    monitor = LossScaleMonitor(Monitor(str(tmp_path / "monitor")), interval=5)
    board = LossScaleTensorBoard(str(tmp_path / "tb"), interval=5)
    results = []

    def hook(result):
        monitor(result)
        board(result)
        results.append(result)

    updater = fp16_updater(net, hook, gradient_stats_every=5)
    for _ in range(30):
        updater.update()
    board.close()
    shown = scalars(tmp_path / "tb")
    assert_series_shown(shown, tmp_path / "monitor", list(range(4, 30, 5)))
    # each parameter's statistics, grouped by parameter, at the windows' last steps
    names = sorted(results[4].gradient_stats)
    assert names == sorted(net.params)
    per_parameter = {t for t in shown if t.startswith("loss-scale/gradients/")}
    assert per_parameter == {f"loss-scale/gradients/{n}/{k}" for n in names
                             for k in ("zero-fraction", "subnormal-fraction", "headroom")}
    for r in results[4::5]:
        for name, stats in r.gradient_stats.items():
            tag = f"loss-scale/gradients/{name}"
            assert same(shown[f"{tag}/headroom"][r.step], stats.headroom)
            assert same(shown[f"{tag}/subnormal-fraction"][r.step], stats.subnormal_fraction)
            assert same(shown[f"{tag}/zero-fraction"][r.step], stats.zero_fraction)
    for first in range(0, 30, 5):             # and the rates are the steps'
        window = results[first:first + 5]
        assert same(shown["loss-scale/overflow-rate"][first + 4],
                    sum(r.skipped for r in window) / 5)
    assert 0 < sum(r.skipped for r in results) < 30


@pytest.mark.parametrize("how", ["same hook", "new hook"])
def test_a_resumed_run_continues_its_curves(tmp_path, how):
    """Steps 0-31 with a checkpoint after step 19, then a new updater resumed from it runs
    steps 20-34 (with the same hooks, or with new ones as a new process would make):
    TensorBoard drops the points of the steps 20-31 that went before, and its curves are the
    monitor's series read with the last value of each index."""
    net = Net("half", hidden=3)
    net.large = set(LARGE)
    hooks = [LossScaleMonitor(Monitor(str(tmp_path / "monitor")), interval=5),
             LossScaleTensorBoard(str(tmp_path / "tb"), interval=5)]

    def hook(result):
        for h in hooks:
            h(result)

    checkpoint = str(tmp_path / "checkpoint.npz")
    first = fp16_updater(net, hook, gradient_stats_every=5)
    for _ in range(20):
        first.update()
    first.save_checkpoint(checkpoint)
    net.bad = set(range(20, 32))
    for _ in range(12):
        first.update()              # steps 20-31, all skipped: lines at 24 and 29, replaced
    net.bad = set()
    if how == "new hook":
        hooks[1].close()
        hooks[:] = [LossScaleMonitor(Monitor(str(tmp_path / "monitor")), interval=5,
                                     append=True),
                    LossScaleTensorBoard(tmp_path / "tb", interval=5)]
    resumed = fp16_updater(net, hook, gradient_stats_every=5)
    resumed.load_checkpoint(checkpoint)
    for _ in range(15):
        resumed.update()
    hooks[1].close()

    files = sorted((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(files) == 2
    starts = [[e.step for e in events(f) if e.HasField("session_log")] for f in files]
    assert starts == [[0], [20]]            # the resumed writer's purge step
    assert_series_shown(scalars(tmp_path / "tb"), tmp_path / "monitor",
                        list(range(4, 35, 5)))


class Writer:
    """A writer of one's own: anything with add_scalar(tag, value, global_step=)."""

    def __init__(self):
        self.scalars, self.flushed, self.closed = [], 0, False

    def add_scalar(self, tag, value, global_step=None):
        self.scalars.append((tag, value, global_step))

    def flush(self):
        self.flushed += 1

    def close(self):
        self.closed = True


def test_a_writer_given_is_written_to_and_left_open():
    writer = Writer()
    board = LossScaleTensorBoard(writer, interval=2, prefix="amp")
    for i in range(3):
        board(StepResult(step=i, skipped=i == 0, scale=8.0, next_scale=8.0,
                         held_by="ceiling" if i == 2 else None))
    def window(float32_steps, step):   # results made by hand say precision "float"
        return [("amp/scale-first", 8.0, step), ("amp/scale-min", 8.0, step),
                ("amp/scale-max", 8.0, step), ("amp/float32-steps", float32_steps, step)]
    assert writer.scalars == [("amp/scale", 8.0, 1), ("amp/skipped-steps", 1, 1),
                              ("amp/overflow-rate", 0.5, 1)] + window(2, 1)
    last = board.close()                     # the unfinished window: step 2
    assert last.step == 2 and writer.scalars[7:] == [
        ("amp/scale", 8.0, 2), ("amp/skipped-steps", 1, 2), ("amp/overflow-rate", 0.0, 2)] + \
        window(1, 2) + [("amp/growth-held-by-ceiling", 1, 2)]
    assert writer.flushed == 1 and not writer.closed
    assert repr(board).startswith("LossScaleTensorBoard(<") and "prefix='amp'" in repr(board)


def test_without_tensorboardx_the_message_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with raises_naming(ImportError, "LossScaleTensorBoard", "tensorboardX", "not installed",
                       "pip install tensorboardX", 'pip install ".[tensorboard]"'):
        LossScaleTensorBoard(str(tmp_path))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("kwargs, error, facts", [
    ({"logdir": 3}, TypeError,
     ("logdir", "directory", "tensorboardX.SummaryWriter", "3", "int")),
    ({"prefix": "a/b"}, ValueError, ("prefix", "non-empty file name", "path separators",
                                     "'a/b'")),
    ({"interval": 0}, ValueError, ("interval", ">= 1", "0")),
])
def test_arguments_are_checked(tmp_path, kwargs, error, facts):
    args = {"logdir": str(tmp_path), **kwargs}
    with raises_naming(error, *facts):
        LossScaleTensorBoard(**args)


@pytest.mark.parametrize("where", ["under a file", "/proc"])
def test_a_folder_that_cannot_be_written_is_refused_when_the_hook_is_made(tmp_path, where):
    (tmp_path / "a_file").write_text("")
    logdir = tmp_path / "a_file" / "tb" if where == "under a file" else "/proc/tb"
    with raises_naming(OSError, "logdir", repr(str(logdir)), "made", "written to"):
        LossScaleTensorBoard(logdir, interval=2)
    board = LossScaleTensorBoard(tmp_path / "new" / "tb", interval=2)   # made for it
    assert (tmp_path / "new" / "tb").is_dir() and board.writer is None
