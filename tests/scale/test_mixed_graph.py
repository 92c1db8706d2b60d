"""A float16 network under a loss built in float32 (how nnabla lifts the ``2**15`` seed
ceiling): its gradients are float16 ones, bounded by float16, whatever the loss's dtype."""
import logging

import numpy as np
import pytest

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context

from nnabla_mpt import DynamicLossScalingUpdater
from nnabla_mpt.core import graph
from support import assert_names

HALF = get_extension_context("cpu", type_config="half")
FLOAT = get_extension_context("cpu", type_config="float")


def teacher_run(loss_in: str, steps: int = 40):
    """:func:`teacher_updater`'s updater and the results of its first ``steps`` steps."""
    updater = teacher_updater(loss_in)
    return updater, [updater.update() for _ in range(steps)]


def teacher_updater(loss_in: str):
    """A 32-64-64-64-10 ReLU network in float16 on random inputs labelled by a fixed
    ReLU teacher, batch 64, mean cross-entropy built under ``loss_in``'s context (in
    float32 over ``F.identity(logits)``), Momentum 0.1, ``scale="auto"``, measured growth
    every 10 good steps: the updater."""
    rng = np.random.RandomState(0)
    inputs = rng.randn(1024, 32).astype(np.float32)
    labels = np.argmax(np.maximum(inputs @ rng.randn(32, 10), 0), 1).reshape(-1, 1)
    with nn.context_scope(HALF), nn.parameter_scope(f"mixed_{loss_in}"):
        x, t = nn.Variable((64, 32)), nn.Variable((64, 1))
        h = x
        for i in range(3):
            h = F.relu(PF.affine(h, 64, name=f"fc{i}", rng=np.random.RandomState(i)))
        logits = PF.affine(h, 10, name="out", rng=np.random.RandomState(9))
        solver = S.Momentum(0.1, 0.9)
        solver.set_parameters(nn.get_parameters())
    with nn.context_scope(FLOAT if loss_in == "float" else HALF):
        top = F.identity(logits) if loss_in == "float" else logits
        loss = F.mean(F.softmax_cross_entropy(top, t))
    order = np.random.RandomState(1)

    def feed():
        idx = order.randint(0, len(inputs), 64)
        x.d, t.d = inputs[idx], labels[idx]

    return DynamicLossScalingUpdater(solver, loss, feed, scale="auto",
                                     growth_mode="measured", N=10)


def test_the_gradients_of_a_float16_network_are_float16_under_a_float32_loss():
    with nn.context_scope(HALF), nn.parameter_scope("dtypes"):
        x = nn.Variable((4, 3))
        y = PF.affine(F.relu(PF.affine(x, 5, name="a")), 2, name="b")
    with nn.context_scope(FLOAT), nn.parameter_scope("dtypes"):
        loss = F.mean(F.identity(y) ** 2)
        extra = nn.parameter.get_parameter_or_create("unused", (1,))
    params = dict(nn.get_parameters(), unused=extra)
    params = {name: v for name, v in params.items() if name.startswith("dtypes/")
              or name == "unused"}
    assert graph.loss_dtype(loss) == "float32" and graph.type_config_of(loss) == "float"
    assert graph.gradient_dtypes(loss, params) == {
        "dtypes/a/affine/W": "float16", "dtypes/a/affine/b": "float16",
        "dtypes/b/affine/W": "float16", "dtypes/b/affine/b": "float16"}
    assert graph.gradient_precision(loss, params) == "half"


@pytest.mark.parametrize("loss_in", ["float", "half"])
def test_a_float32_loss_lifts_the_ceiling_and_the_gradients_still_hold_the_scale(loss_in):
    updater, results = teacher_run(loss_in)
    skipped = [r.step for r in results if r.skipped]
    assert {r.precision for r in results} == {"half"} and updater.precision == "half"
    if loss_in == "half":
        # the float16 seed holds the scale at 2**15 however much room the gradients leave
        assert skipped == [] and {r.scale for r in results} == {2.0 ** 15}
    else:
        # the float32 seed lets the scale pass 2**15; the float16 gradients still bound
        # it, so measured growth loses at most one step (bounded by float32, ten)
        assert len(skipped) <= 1, skipped
        assert results[-1].next_scale > 2.0 ** 15
        assert max(r.scale for r in results) <= 2.0 ** 18


@pytest.mark.parametrize("loss_in", ["half", "float"])
def test_what_held_the_scale_is_said_once_when_the_ceiling_holds_it(loss_in, caplog):
    caplog.set_level(logging.WARNING, logger="nnabla")
    updater, results = teacher_run(loss_in)
    said = [r.getMessage() for r in caplog.records if "held at" in r.getMessage()]
    held = {r.step: r.held_by for r in results if r.held_by is not None}
    if loss_in == "half":
        # every growth point (steps 9, 19, ...) sits at 2**15 with room to spare
        assert held == {i: "ceiling" for i in (9, 19, 29, 39)}
        assert len(said) == 1
        assert_names(said[0], "nnabla_mpt", "held at 32768", "largest power of two",
                     "float16", "not by the gradients", "room for",
                     "A loss built in float32 lifts the ceiling", "F.identity(logits)")
    else:
        assert said == [] and "ceiling" not in held.values()
        assert set(held.values()) <= {"gradients"}


def test_the_ceiling_warning_names_the_margin_measured_growth_kept(caplog):
    # The warning comes at step 9, the first growth point; the margin it names is the one
    # of the history the step left, read back from the updater's state.
    from nnabla_mpt.scale.scale_history import ScaleHistory
    caplog.set_level(logging.WARNING, logger="nnabla")
    updater = teacher_updater("half")
    results = [updater.update() for _ in range(10)]
    assert results[-1].held_by == "ceiling"
    said = [r.getMessage() for r in caplog.records if "held at" in r.getMessage()]
    history = ScaleHistory()
    history.load(updater.state_dict()["scale_history"])
    assert len(history) >= 4
    assert len(said) == 1
    assert_names(said[0], "margin", "measured growth", f"{history.margin():.3g} times",
                 "between 1.41 and 8", "spread")


def test_a_growth_point_with_unbounded_room_is_held_by_the_ceiling_without_failing(caplog):
    # every gradient is zero (x = 0, the targets equal to the bias): nothing bounds the
    # room, the scale grows to the float16 ceiling at once and stays there
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from support import Net
    caplog.set_level(logging.WARNING, logger="nnabla")
    net = Net("half", scope="unbounded")

    def feed():
        net.x.d = 0.0
        net.t.d = np.broadcast_to(net.params["out/affine/b"].d, net.t.shape)

    updater = DynamicLossScalingUpdater(net.solver(), net.loss, feed, scale=2.0 ** 12, N=1,
                                        growth_mode="measured")
    results = [updater.update() for _ in range(3)]
    assert [(r.skipped, r.next_scale, r.held_by) for r in results] == [
        (False, 2.0 ** 15, "ceiling")] * 3
    said = [r.getMessage() for r in caplog.records if "held at" in r.getMessage()]
    assert len(said) == 1, said
    assert_names(said[0], "held at 32768", "unbounded room", "every gradient is zero")


def test_a_max_scale_asked_for_at_the_ceiling_holds_the_scale_not_the_ceiling(caplog):
    caplog.set_level(logging.WARNING, logger="nnabla")
    from nnabla_mpt import DynamicLossScale
    import nnabla_mpt.scale.scale_history as ceiling
    from nnabla_mpt.core.dtypes import float_type
    policy = DynamicLossScale(init_scale=2.0 ** 15, max_scale=2.0 ** 15,
                              growth_mode="measured")
    asked = ceiling.GrowthLimit(policy, float_type("float16"), max_scale=2.0 ** 15)
    free = ceiling.GrowthLimit(policy, float_type("float16"), max_scale=2.0 ** 24)
    assert asked.held_by(2.0 ** 15, 2.0 ** 15, 64.0, 64.0, 8.0) == "max_scale"
    assert free.held_by(2.0 ** 15, 2.0 ** 15, 64.0, 64.0, 8.0) == "ceiling"
    # just below a power of two the growth counted is the policy's (2**3 > 7.999...)
    assert free.held_by(1024.0, 4096.0, 7.999999999999999, 1.0, 8.0) is None
