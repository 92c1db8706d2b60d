"""Drop-in compatibility with nnabla's experimental DynamicLossScalingUpdater (float context)."""
import inspect

import numpy as np
import pytest
from nnabla.experimental.mixed_precision_training import \
    DynamicLossScalingUpdater as NnablaUpdater

from nnabla_mpt import DynamicLossScalingUpdater, FixedLossScalingUpdater, OverflowHandling
from support import Net

HP = {"Sgd": dict(lr=0.05), "Momentum": dict(lr=0.05, momentum=0.9),
      "Adam": dict(alpha=0.01)}


def _pair(kind, scope_suffix=""):
    """Two identical networks (same initial parameters, same data sequence)."""
    theirs = Net(hidden=5, scope="theirs" + scope_suffix)
    ours = Net(hidden=5, scope="ours" + scope_suffix)
    for name in theirs.params:
        assert theirs.params[name].d.tobytes() == ours.params[name].d.tobytes()
    return theirs, ours, theirs.solver(kind, **HP[kind]), ours.solver(kind, **HP[kind])


def test_growth_counting_differs_as_documented():
    theirs, ours, s_theirs, s_ours = _pair("Sgd")
    a = NnablaUpdater(s_theirs, theirs.loss, theirs.feeder, scale=8.0, N=3)
    b = DynamicLossScalingUpdater(s_ours, ours.loss, ours.feeder, scale=8.0, N=3)
    scales_a, scales_b = [], []
    for _ in range(13):
        a.update()
        b.update()
        scales_a.append(a.scale)
        scales_b.append(b.scale)
    # nnabla's grows after N + 2 good steps, then every N + 1; ours after exactly N each time.
    assert scales_a == [8, 8, 8, 8, 16, 16, 16, 16, 32, 32, 32, 32, 64]
    assert scales_b == [8, 8, 16, 16, 16, 32, 32, 32, 64, 64, 64, 128, 128]


@pytest.mark.parametrize("kind", sorted(HP))
@pytest.mark.parametrize("accum", [1, 2])
@pytest.mark.parametrize("wd", [None, 1e-2])
def test_parameter_trajectory_equals_nnabla_updater(kind, accum, wd):
    theirs, ours, s_theirs, s_ours = _pair(kind)
    # Power-of-two scales: in float32 scaling and unscaling by them is exact, so the
    # different growth schedules cannot change the unscaled gradients.
    a = NnablaUpdater(s_theirs, theirs.loss, theirs.feeder, scale=8.0, N=2,
                      accum_grad=accum, weight_decay=wd)
    b = DynamicLossScalingUpdater(s_ours, ours.loss, ours.feeder, scale=8.0, N=2,
                                  accum_grad=accum, weight_decay=wd)
    start = ours.snapshot()
    scales_differ = False
    for i in range(10):
        scale_a, scale_b = a.scale, b.scale
        scales_differ |= scale_a != scale_b
        a.update()
        r = b.update()
        assert (r.skipped, r.scale) == (False, scale_b)
        for name in theirs.params:
            assert theirs.params[name].d.tobytes() == ours.params[name].d.tobytes(), \
                f"{name} differs after step {i} (scales {scale_a} / {scale_b})"
    assert scales_differ
    assert theirs.calls == ours.calls == 10 * accum
    assert not np.allclose(ours.params["out/affine/W"].d, start["out/affine/W"])


@pytest.mark.parametrize("clear_buffer", [True, False])
def test_all_eleven_positional_arguments_run_unchanged(clear_buffer):
    theirs, ours, s_theirs, s_ours = _pair("Momentum")
    grads_a = [v.grad for v in theirs.params.values()]
    grads_b = [v.grad for v in ours.params.values()]
    a = NnablaUpdater(s_theirs, theirs.loss, theirs.feeder, 16.0, 2.0, 3, clear_buffer, 2,
                      1e-3, None, grads_a)
    b = DynamicLossScalingUpdater(s_ours, ours.loss, ours.feeder, 16.0, 2.0, 3, clear_buffer,
                                  2, 1e-3, None, grads_b)
    for name in ("scale", "scaling_factor", "N", "clear_buffer", "accum_grad",
                 "weight_decay", "comm"):
        assert getattr(b, name) == getattr(a, name), name
    assert b.solver is s_ours and b.loss is ours.loss and b.data_feeder == ours.feeder
    assert len(b.grads) == len(grads_b)
    assert all(x is y for x, y in zip(b.grads, grads_b))
    for _ in range(6):
        a.update()
        b.update()
    for name in theirs.params:
        assert theirs.params[name].d.tobytes() == ours.params[name].d.tobytes(), name


def test_keyword_arguments_with_nnabla_names_run_unchanged():
    theirs, ours, s_theirs, s_ours = _pair("Adam")
    kwargs = dict(scale=32.0, scaling_factor=2.0, N=4, clear_buffer=True, accum_grad=1,
                  weight_decay=None, comm=None)
    a = NnablaUpdater(solver=s_theirs, loss=theirs.loss, data_feeder=theirs.feeder, **kwargs)
    b = DynamicLossScalingUpdater(solver=s_ours, loss=ours.loss, data_feeder=ours.feeder,
                                  **kwargs)
    for _ in range(5):
        a.update()
        b.update()
    for name in theirs.params:
        assert theirs.params[name].d.tobytes() == ours.params[name].d.tobytes(), name


def test_scale_attribute_reads_and_writes_like_nnabla():
    _, ours, _, s_ours = _pair("Sgd")
    b = DynamicLossScalingUpdater(s_ours, ours.loss, ours.feeder, scale=8.0, N=100)
    b.scale = 64.0
    assert b.scale == 64.0
    assert b.update().scale == 64.0


def test_retry_mode_reproduces_nnabla_retry_on_overflow():
    """nnabla's updater retries an overflowing step on the next batch; so does max_retries."""
    theirs, ours, s_theirs, s_ours = _pair("Adam")
    # An inf in x: gradients not finite. nnabla's updater halves its scale on these; ours
    # keeps it (the loss itself is not finite), which cannot change the parameters since
    # both scales stay powers of two.
    theirs.bad = ours.bad = {2, 5, 6}
    a = NnablaUpdater(s_theirs, theirs.loss, theirs.feeder, scale=64.0, N=3)
    b = DynamicLossScalingUpdater(s_ours, ours.loss, ours.feeder, scale=64.0, N=3,
                                  overflow=OverflowHandling(max_retries=100))
    attempts = []
    for i in range(6):
        a.update()
        r = b.update()
        attempts.append(r.attempts)
        assert not r.skipped
        assert theirs.calls == ours.calls, f"call {i}"
        for name in theirs.params:
            assert theirs.params[name].d.tobytes() == ours.params[name].d.tobytes(), \
                f"{name} after call {i}"
    assert attempts == [1, 1, 2, 1, 3, 1]
    assert (b.steps, b.updates, b.skipped_steps) == (9, 6, 3)


def test_explicit_empty_grads_without_communicator_runs_unchanged():
    """nnabla's default ``grads=[]``, spelled out, means "nothing to exchange" here too."""
    theirs, ours, s_theirs, s_ours = _pair("Sgd")
    a = NnablaUpdater(s_theirs, theirs.loss, theirs.feeder, 8.0, 2.0, 5, True, 1, None,
                      None, [])
    b = DynamicLossScalingUpdater(s_ours, ours.loss, ours.feeder, 8.0, 2.0, 5, True, 1, None,
                                  None, [])
    assert b.grads is None
    for _ in range(4):
        a.update()
        b.update()
    for name in theirs.params:
        assert theirs.params[name].d.tobytes() == ours.params[name].d.tobytes(), name


def _positional(cls):
    return [(p.name, p.default) for p in inspect.signature(cls).parameters.values()
            if p.kind is p.POSITIONAL_OR_KEYWORD]


EMPTY = inspect.Parameter.empty


def test_positional_arguments_are_pinned():
    # nnabla's order and names, then our defaults (grads=None where nnabla has [], a
    # feeder None where nnabla has a lambda that raises).
    names = [name for name, _ in _positional(NnablaUpdater)]
    assert [name for name, _ in _positional(DynamicLossScalingUpdater)] == names
    assert _positional(DynamicLossScalingUpdater) == [
        ("solver", EMPTY), ("loss", EMPTY), ("data_feeder", None),
        ("scale", 8.0), ("scaling_factor", 2.0), ("N", 2000), ("clear_buffer", True),
        ("accum_grad", 1), ("weight_decay", None), ("comm", None), ("grads", None)]
    assert _positional(FixedLossScalingUpdater) == [
        ("solver", EMPTY), ("loss", EMPTY), ("data_feeder", None),
        ("scale", 128.0), ("enable_overflow_check", True), ("clear_buffer", True),
        ("accum_grad", 1), ("weight_decay", None), ("comm", None), ("grads", None)]


@pytest.mark.parametrize("cls", [DynamicLossScalingUpdater, FixedLossScalingUpdater])
def test_every_option_is_keyword_only_documented_and_known(cls):
    params = inspect.signature(cls).parameters
    keyword = [name for name, p in params.items() if p.kind is p.KEYWORD_ONLY]
    assert {"overflow", "reduction", "schedule", "clip_grad_norm"} <= set(keyword)
    assert len(params) == (22 if cls is DynamicLossScalingUpdater else 19)
    for name in list(params)[2:]:
        assert f"\n        {name}: " in cls.__doc__, f"{name} is not documented"
    net = Net()
    # Python's own errors: the constructor's parameters are written out
    with pytest.raises(TypeError, match=rf"^{cls.__name__}\.__init__\(\) got an unexpected "
                                        r"keyword argument 'scael'$"):
        cls(net.solver(), net.loss, scael=2.0)
    with pytest.raises(TypeError, match=r"got multiple values for argument 'scale'"):
        cls(net.solver(), net.loss, None, 2.0, scale=4.0)
    positional = len(params) - len(keyword)
    too_many = [None] * (positional - 1)          # solver and loss, and one more
    with pytest.raises(TypeError, match=rf"takes from 3 to {positional + 1} positional "
                                        rf"arguments but {positional + 2} were given"):
        cls(net.solver(), net.loss, *too_many)


def test_the_collapse_example_shows_nnabla_s_updater_sinking_and_ours_stopping():
    """examples/nnabla_updater_collapse.py, whose results the README quotes: nnabla's
    updater applies an outlier batch, its scale reaches 0 and it never raises; ours stops
    with the overflowing function named and the weights intact."""
    import subprocess
    import sys
    from doc_pages import ROOT
    proc = subprocess.run([sys.executable, "examples/nnabla_updater_collapse.py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ours = proc.stdout.split("nnabla_mpt's DynamicLossScalingUpdater")[1]
    theirs = proc.stdout.split("nnabla_mpt's DynamicLossScalingUpdater")[0]
    assert "an outlier batch applied: largest weight" in theirs
    assert ": scale 0, after " in theirs and "nothing raised" in theirs
    assert "LossScaleCollapseError: non-finite loss (8 consecutive steps" in ours
    assert "SquaredError (#3) after fc2/affine produced inf/NaN from finite inputs" in ours
    final = float(ours.rsplit("largest weight ", 1)[1].split()[0])
    start = float(ours.split("largest weight ", 1)[1].split()[0])
    assert final < 2 * start       # the outliers never reached the weights
