"""Acceptance: torch.cond becomes a cond node whose two regions both run correctly (a condition on
a dynamic size too: a cond until the size is known, then the branch it takes); functorch's map
is unrolled; a torch.library custom op fails with UnsupportedOperatorError until registered,
then compiles. scan is unrolled like map; a while_loop is refused by name."""

import copy

import numpy as np
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


class SizeBranch(torch.nn.Module):
    """A branch on a size that torch.export keeps symbolic (a SymBool predicate)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x, y):
        return torch.cond(x.shape[0] > 2, lambda x, y: self.proj(x) + y, lambda x, y: x - y, (x, y))


def test_cond_on_a_dynamic_size_is_a_cond_until_the_size_is_known():
    from torch.export import Dim

    torch.manual_seed(0)
    model, y = SizeBranch().eval(), torch.randn(4)
    cm = fexplore.compile(model, (torch.randn(3, 4), y), dynamic_shapes={"x": {0: Dim("n", min=1, max=32)}, "y": None})
    (cond,) = [n for n in cm.graph.nodes if n.op.name == "cond"]
    assert cond.inputs[0].type.rank == 0 and cond.inputs[0].type.dtype == ir.DType.bool
    assert ir.parse(str(cm.graph)) == cm.graph
    for n, branch in ((1, "sub"), (2, "sub"), (3, "linear"), (9, "linear")):
        x = torch.randn(n, 4)
        with torch.no_grad():
            torch.testing.assert_close(cm(x, y), model(x, y))
        made = cm.schedules.for_inputs([x.numpy(), y.numpy()])
        ops = {m.op.name for nd in made.graph.nodes for m in ([nd] + [b for r in nd.regions for b in r.nodes])}
        assert "cond" not in ops and branch in ops, ops     # the branch taken, inlined, on the chip
        assert not [k.name for k in made.schedule.kernels if k.how == "host"]


def test_a_constant_predicate_inlines_the_branch_it_takes():
    """simplify's rule alone: the branch's constants and nodes come in renamed where their names
    are taken, and the other branch is gone."""
    from fexplore.pipeline.options import CompileOptions
    from fexplore.pipeline.stages.simplify import simplify

    model = Branchy().eval()
    g = fexplore.compile(model, (torch.ones(3, 6),)).stages[0].after
    (cond,) = [n for n in g.nodes if n.op.name == "cond"]
    for pick, want in ((True, "linear"), (False, "sigmoid")):
        pred = ir.Constant("pred", ir.TensorType((), ir.DType.bool), np.array(pick))
        nodes = [ir.Node(n.op, [pred, *n.inputs[1:]], n.attrs, n.outputs, n.loc, n.regions) if n is cond else n
                 for n in g.nodes]
        fixed = ir.Graph(g.name, g.inputs, list(g.constants) + [pred], nodes, g.outputs, dict(g.symbols))
        res = simplify(fixed, CompileOptions())
        ops = res.graph.op_counts()
        assert "cond" not in ops and want in ops, ops
        assert res.stats["rules_fired"].get("inline-cond-of-a-constant-predicate") == 1
        ir.verify(res.graph)
        x = torch.randn(3, 6)
        with torch.no_grad():
            want = model.proj(x).relu() * 2.0 if pick else torch.sigmoid(x) - 1.0
        (got,) = ir.run(res.graph, [x.numpy()])
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)


class MapsRows(torch.nn.Module):
    def forward(self, xs, y):
        from functorch.experimental.control_flow import map as fmap

        return fmap(lambda x, y: (x * y).sum() + x, xs, y)


def test_map_is_unrolled_over_a_static_leading_axis():
    xs, y = torch.randn(3, 5), torch.randn(5)
    cm = fexplore.compile(MapsRows(), (xs, y))
    assert cm.stages[0].after.op_counts()["sum"] == 3     # one copy of the body per row
    for _ in range(2):
        xs = torch.randn(3, 5)
        torch.testing.assert_close(cm(xs, y), MapsRows()(xs, y))


def test_map_over_a_dynamic_leading_axis_is_refused_clearly():
    from torch.export import Dim

    with pytest.raises(UnsupportedOperatorError, match="unrolled, one copy of the body per slice"):
        fexplore.compile(MapsRows(), (torch.randn(3, 5), torch.randn(5)),
                         dynamic_shapes={"xs": {0: Dim("n", max=16)}, "y": None})


class Scans(torch.nn.Module):
    """A recurrence as torch's scan: a carry and a stacked output per step, a weight read whole."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 4))

    def forward(self, init, xs):
        from torch._higher_order_ops.scan import scan

        def step(c, x):
            c = c * 0.5 + x @ self.w
            return c, c.sin()

        return scan(step, init, xs)


def test_scan_is_unrolled_with_its_carry():
    torch.manual_seed(0)
    model = Scans()
    cm = fexplore.compile(model, (torch.randn(4), torch.randn(5, 3)))
    assert cm.stages[0].after.op_counts()["sin"] == 5
    init, xs = torch.randn(4), torch.randn(5, 3)
    with torch.no_grad():
        want = model(init, xs)
    got = cm(init, xs)
    assert got[1].shape == (5, 4)
    torch.testing.assert_close(got, want)


def test_a_while_loop_is_refused_with_what_to_write_instead():
    class Loops(torch.nn.Module):
        def forward(self, x):
            from torch._higher_order_ops.while_loop import while_loop

            return while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x * 2 + 1),
                              (torch.zeros((), dtype=torch.int64), x))[1]

    with pytest.raises(UnsupportedOperatorError, match="no run-time loop"):
        fexplore.compile(Loops(), (torch.randn(4),))


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


# Custom ops that update arguments in place (a cache write, an accumulation), as kernel authors write.
@torch.library.custom_op("fexplore_test::add_into", mutates_args=("x",))
def add_into(x: torch.Tensor, y: torch.Tensor) -> None:
    x.add_(y)


@torch.library.custom_op("fexplore_test::accumulate_rows", mutates_args=("acc",))
def accumulate_rows(acc: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    acc.add_(y * scale)
    return acc.sum(0)


@accumulate_rows.register_fake
def _(acc, y, scale):
    return acc.new_empty(acc.shape[1:])


class UpdatesInPlace(torch.nn.Module):
    """Updates a copy, a slice of a buffer (state carried from call to call) and an input."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 3))

    def forward(self, x, y):
        z = x.clone()
        add_into(z, y)
        total = accumulate_rows(self.cache[1:3], y[:2].reshape(2, 1).expand(2, 3), 0.5)
        add_into(x, y)
        return z * 2, total


def test_custom_ops_that_update_their_arguments_compile_once_registered():
    model = UpdatesInPlace()
    x, y = torch.randn(4), torch.randn(4)
    with pytest.raises(UnsupportedOperatorError, match="updates its arguments in place"):
        fexplore.compile(copy.deepcopy(model), (x.clone(), y))
    fexplore.register_op(torch.ops.fexplore_test.add_into)
    fexplore.register_op(torch.ops.fexplore_test.accumulate_rows)
    cm = fexplore.compile(copy.deepcopy(model), (x.clone(), y))
    assert cm.verification["ok"].all(), cm.verification
    eager = copy.deepcopy(model)
    for _ in range(2):   # the buffer's slice accumulates from call to call, in both
        xs = torch.randn(4)
        mine, theirs = xs.clone(), xs.clone()
        got, want = cm(mine, y), eager(theirs, y)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(mine, theirs)            # the input updated in place, as eager's
        torch.testing.assert_close(cm.state["cache"], eager.cache)
    assert float(eager.cache.abs().sum()) > 0
