"""Acceptance: torch.cond becomes a cond node whose two regions both run correctly; a
torch.library custom op fails with UnsupportedOperatorError until registered, then compiles."""

import pytest
import torch

import fexplore
from fexplore import ir
from fexplore.errors import UnsupportedOperatorError
from fexplore.pipeline.numeric import Oracle


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(6, 6)

    def forward(self, x):
        def positive(x):
            return self.proj(x).relu() * 2.0

        def negative(x):
            return torch.sigmoid(x) - 1.0

        return torch.cond(x.sum() > 0, positive, negative, (x,))


def test_cond_runs_both_branches_from_one_graph():
    torch.manual_seed(0)
    model = Branchy().eval()
    cm = fexplore.compile(model, (torch.ones(3, 6),))
    g = cm.graph
    (cond,) = [n for n in g.nodes if n.op.name == "cond"]
    assert len(cond.regions) == 2
    assert {n.op.name for n in cond.regions[0].nodes} >= {"linear", "relu"}
    assert "sigmoid" in {n.op.name for n in cond.regions[1].nodes}
    for x in (torch.ones(3, 6), -torch.ones(3, 6), torch.randn(3, 6) + 3, torch.randn(3, 6) - 3):
        with torch.no_grad():
            torch.testing.assert_close(cm(x), model(x))
    assert ir.parse(str(g)) == g


@pytest.mark.parametrize("how", ["bf16 policy", "f16 model"])
def test_cond_under_the_oracles_dispatch_modes_leaves_eager_working(how):
    """The oracle runs the model under dispatch modes: the precision policy's rounding, and for a
    model computing in f16 the f64 twin's exact narrow ops. torch.cond compiles itself with dynamo
    in eager; under a mode without a rule for it, it raised, the policy's yardstick was lost, and
    dynamo's cache was left so that the user's own eager calls of the model failed afterwards."""
    torch.manual_seed(0)
    model, x = Branchy().eval(), torch.ones(3, 6)
    precision = "fp32"
    if how == "bf16 policy":
        precision = "bf16"
    else:
        model, x = model.half(), x.half()
    oracle = Oracle(model, (x,), random_sets=0, precision=precision)
    if how == "bf16 policy":
        assert oracle.policy_note is None and oracle.policy_noise[0][0] > 0
    cm = fexplore.compile(model, (x,), precision=precision)
    assert cm.verification["ok"].all(), cm.verification
    for xx in (x, -x):
        with torch.no_grad():
            want = model(xx)                       # the user's eager call still works
        tol = 0.05 if how == "bf16 policy" else 2e-3
        torch.testing.assert_close(cm(xx), want, rtol=tol, atol=tol)


# A custom op of the kind users write: defined with torch.library, with a fake kernel for export.
@torch.library.custom_op("fexplore_test::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _(x, scale):
    return torch.empty_like(x)


class UsesCustomOp(torch.nn.Module):
    def forward(self, x):
        return torch.ops.fexplore_test.scaled_tanh(x + 1.0, 3.0)  # THE CUSTOM OP LINE


def test_custom_op_unsupported_until_registered_then_compiles():
    x = torch.randn(4, 5)
    from fexplore.pipeline.convert import CONVERTERS

    CONVERTERS.pop("fexplore_test.scaled_tanh.default", None)  # order-independent
    with pytest.raises(UnsupportedOperatorError) as info:
        fexplore.compile(UsesCustomOp(), (x,))
    err = info.value
    assert err.op == "fexplore_test.scaled_tanh.default"
    assert err.loc.file == __file__
    line = open(__file__).read().splitlines()[err.loc.line - 1]
    assert "THE CUSTOM OP LINE" in line
    assert "fexplore.register_op" in str(err)

    fexplore.register_op(torch.ops.fexplore_test.scaled_tanh)
    cm = fexplore.compile(UsesCustomOp(), (x,))
    assert "fexplore_test.scaled_tanh" in cm.graph.op_counts()
    y = torch.randn(4, 5)
    torch.testing.assert_close(cm(y), UsesCustomOp()(y))
    assert ir.parse(str(cm.graph)) == cm.graph


def test_custom_op_with_a_numpy_reference():
    import numpy as np

    calls = []

    def reference(x, scale):
        calls.append(x.shape)
        return np.tanh(x) * scale

    fexplore.register_op(torch.ops.fexplore_test.scaled_tanh, reference=reference)
    try:
        x = torch.randn(2, 3)
        cm = fexplore.compile(UsesCustomOp(), (x,))
        torch.testing.assert_close(cm(x), UsesCustomOp()(x))
        assert calls  # the IR's meaning really is the given reference
    finally:
        fexplore.register_op(torch.ops.fexplore_test.scaled_tanh)
