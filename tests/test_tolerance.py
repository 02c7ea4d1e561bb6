"""The f32 tolerance is derived from the model: eager's own f32 error (its distance from an f64 run)
times a small multiple, over a floor. Rounding noise of a deep network never fails a stage; a real
bug still does, even a small one."""

import numpy as np
import pytest
import torch

import fexplore
from fexplore.ir import Constant, Graph
from fexplore.pipeline import Exploration, Stage, StageResult
from fexplore.pipeline.numeric import (NARROW_MULTIPLE, NOISE_MULTIPLE, TOLERANCES, Oracle, compare, output_dtypes,
                                        tolerances_of)
from fexplore.ir import DType


class DeepResidualCNN(torch.nn.Module):
    """ResNet-style: a stem and 16 bottleneck-free residual blocks (conv-BN-ReLU twice); deep
    enough that eager f32 drifts from f64 by far more than the fixed f32 tolerance allows."""

    def __init__(self, width=24, blocks=16):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, width, 3, padding=1)
        self.blocks = torch.nn.ModuleList()
        for _ in range(blocks):
            self.blocks.append(torch.nn.Sequential(
                torch.nn.Conv2d(width, width, 3, padding=1, bias=False),
                torch.nn.BatchNorm2d(width), torch.nn.ReLU(),
                torch.nn.Conv2d(width, width, 3, padding=1, bias=False),
                torch.nn.BatchNorm2d(width)))

    def forward(self, x):
        x = torch.relu(self.stem(x))
        for b in self.blocks:
            x = torch.relu(x + b(x))
        return x  # the feature map: pooling would average the rounding noise away


def _deep_cnn():
    torch.manual_seed(0)
    model = DeepResidualCNN().eval()
    with torch.no_grad():  # running statistics as after training, so activations stay O(1)
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.0)
    return model, (torch.randn(1, 3, 12, 12),)


@pytest.fixture(scope="module")
def deep():
    return _deep_cnn()


class OnePassNorm(torch.nn.Module):
    """A hand-written norm with the one-pass variance E[h^2] - E[h]^2: on activations with a large
    common offset it cancels catastrophically, in eager f32 as in any f32 evaluation."""

    def __init__(self, width=512):
        super().__init__()
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x):
        h = self.proj(x)
        mean = h.mean(-1, keepdim=True)
        var = (h * h).mean(-1, keepdim=True) - mean * mean
        return (h - mean) * torch.rsqrt(var + 1e-5)


def test_eager_rounding_noise_above_the_fixed_floor_does_not_fail_a_stage():
    torch.manual_seed(0)
    model = OnePassNorm().eval()
    with torch.no_grad():
        model.proj.bias.add_(30.0)
    inputs = (torch.randn(8, 512),)
    oracle = Oracle(model, inputs)
    out = oracle.expected[0][0]
    assert np.abs(out).max() > 1.0  # a real signal, not near-zero outputs that pass any check
    floor = TOLERANCES[DType.f32].atol * np.abs(out).max()
    assert oracle.noise[0][0] > 5 * floor  # eager itself is this far from the exact result
    assert oracle.f64_note is None
    cm = fexplore.compile(model, inputs)
    assert cm.verification["ok"].all()
    # the fixed floor alone would have refused fexplore's (equally rounded) result
    assert cm.verification["max_abs_err"].max() > floor


def test_deep_network_compiles_and_every_stage_passes(deep):
    model, inputs = deep
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cm = fexplore.compile(model, inputs)
    assert cm.verification["ok"].all()
    assert "eager's f32 noise" in cm.verification["tolerance"].iloc[0]
    got, want = cm(*inputs), model(*inputs).detach()
    oracle = Oracle(model, inputs, random_sets=0)
    allowed = TOLERANCES[DType.f32].atol * want.abs().max() + NOISE_MULTIPLE * oracle.noise[0][0]
    assert (got - want).abs().max() <= allowed
    # the f64 twin is a copy: the user's model keeps its dtype and values
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert next(model.parameters()).dtype == torch.float32


def _perturb_one_weight(scale):
    """A deliberately wrong stage: one mid-network conv weight off by a relative ``scale``."""

    def run(graph: Graph, options) -> StageResult:
        convs = [c for c in graph.constants if c.type.rank == 4]
        victim = convs[len(convs) // 2]
        consts = [Constant(c.name, c.type, c.payload * np.float32(1 + scale), source=c.source)
                  if c is victim else c for c in graph.constants]
        return StageResult(Graph(graph.name, graph.inputs, consts, graph.nodes, graph.outputs,
                                 graph.symbols))

    return run


@pytest.mark.parametrize("scale", [1e-2, -3e-2])
def test_a_small_real_bug_in_a_deep_network_still_fails(deep, scale):
    model, inputs = deep
    ex = Exploration(model, inputs, fexplore.pipeline.options.CompileOptions(),
                     stages=[Stage("off_by_a_percent", _perturb_one_weight(scale))])
    ex.run_all(progress=False)
    ingest, broken = ex.records
    assert ingest.verification.ok
    assert not broken.verification.numeric.ok
    assert "eager's f32 noise" in broken.verification.numeric.detail


def test_models_that_refuse_f64_fall_back_to_the_rerounded_estimate():
    from fexplore.pipeline.numeric import REROUNDED_SHARE
    from fexplore.pipeline.rerounding import rerounding_distance

    class InsistsOnF32(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            return (x @ self.w) @ torch.eye(4, dtype=torch.float32)  # f64 @ f32 raises

    model, x = InsistsOnF32(), torch.randn(3, 4)
    oracle = Oracle(model, (x,), random_sets=0)
    spec = torch.utils._pytree.tree_structure((x,))
    moved = rerounding_distance(model, [x], spec, [model(x)], seed=0)
    assert oracle.noise == [[REROUNDED_SHARE * moved[0]]] and moved[0] > 0
    assert "does not run in f64" in oracle.f64_note
    assert fexplore.compile(model, (torch.randn(3, 4),)).verification["ok"].all()


class F16LogSumExp(torch.nn.Module):
    """logsumexp of a log-softmax over the same axis: log(1) = 0 up to rounding. Eager's CPU kernel
    sums the exponentials in f16, so its result is off by about an f16 ulp of 1."""

    def __init__(self, bug: float = 0.0):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((6, 6), 2.5))
        self.bug = bug

    def forward(self, x):
        y = torch.logsumexp(torch.log_softmax(x.half(), dim=1), 1) * self.w
        return y + self.bug * x[:, 0]


def test_eager_rounding_inside_its_own_f16_ops_is_its_noise():
    torch.manual_seed(0)
    model = F16LogSumExp().eval()
    x = torch.randn(1, 4, 6, 6)
    oracle = Oracle(model, (x,))
    exact = torch.logsumexp(torch.log_softmax(x.half(), dim=1).double(), 1) * 2.5
    eager_error = float((model(x).detach().double() - exact).abs().max())
    assert eager_error > 1e-4                       # eager's f16 sum: well past f32 noise
    # the twin summed wide: its distance from eager is eager's own error
    assert oracle.noise[0][0] == pytest.approx(eager_error, rel=0.05)
    # the compile sums wide too, and passes every stage within that noise
    assert fexplore.compile(model, (x,)).verification["ok"].all()


def test_a_real_error_in_an_f16_model_still_fails():
    torch.manual_seed(0)
    x = torch.randn(1, 4, 6, 6)
    model = F16LogSumExp().eval()
    oracle = Oracle(model, (x,))
    wrong = F16LogSumExp(bug=0.05).eval()     # the error a wrong rewrite of the model would make
    from fexplore.pipeline.numeric import compare
    got = [wrong(x).detach().numpy()]
    ok = compare(got, oracle.expected[0], TOLERANCES[DType.f16], oracle.noise[0])[2]
    assert not ok


class OneOutputInF16(torch.nn.Module):
    """Three outputs of one fused region; only the middle one goes through f16."""

    def forward(self, x):
        return x * 2, (x.half() * 3).float(), x + 1


def test_each_output_is_held_to_the_tolerance_of_what_it_is_computed_through():
    """Before, the narrowest float anywhere in the graph set one tolerance for every output: an
    f16 value beside f32 ones let the f32 outputs drift by f16's 1e-3."""
    x = torch.randn(64)
    cm = fexplore.compile(OneOutputInF16(), (x,))
    fused = cm["fusion"].after
    assert len(fused.nodes) == 1 and fused.nodes[0].regions   # one region holds all three
    assert output_dtypes(fused) == [DType.f32, DType.f16, DType.f32]
    oracle = Oracle(OneOutputInF16(), (x,), random_sets=0)
    tols = tolerances_of(fused, oracle)
    assert tols == [TOLERANCES[DType.f32], TOLERANCES[DType.f16], TOLERANCES[DType.f32]]
    want = oracle.expected[0]
    off = [w + np.float32(1e-4) * np.abs(w).max() for w in want]   # an f16-sized error
    assert not compare([off[0], want[1], want[2]], want, tols, oracle.noise[0])[2]
    assert compare([want[0], off[1], want[2]], want, tols, oracle.noise[0])[2]
    assert "outputs 0, 2: atol 1e-05" in cm["fusion"].verification.numeric.tolerance


class F16Chain(torch.nn.Module):
    """f16 layers behind the model's own cast: a linear whose bias eager's CPU kernel adds after
    rounding the product, then a chain that grows a one-ulp difference (fuzz seed 1880729)."""

    def __init__(self, bug: float = 0.0):
        super().__init__()
        torch.manual_seed(1)
        self.proj = torch.nn.Linear(8, 8, dtype=torch.float16)
        self.out = torch.nn.Linear(6, 8, dtype=torch.float16)
        self.bug = bug

    def forward(self, x):
        h = self.proj((x * 2.0).half())
        h = torch.cumsum(h @ h.transpose(-1, -2), -1)
        return torch.tanh(self.out(h / 16)) + self.bug


def test_f16_layers_behind_a_cast_get_an_f64_reference_and_the_chains_rounding():
    """The f64 twin used to widen the model's f16 layers too: the f16 linear behind the cast
    raised on an f64 weight and the model got no reference. Now only f32 widens, and for a
    model that computes in f16 by itself the oracle also measures eager's distance from the
    model's exact arithmetic."""
    torch.manual_seed(0)
    x = torch.randn(2, 6, 8)
    oracle = Oracle(F16Chain(), (x,))
    assert oracle.f64_note is None
    assert oracle.narrow_noise is not None and len(oracle.narrow_noise) == len(oracle.noise) == 2
    with torch.no_grad():
        exact = F16Chain().double()
        h = exact.proj((x * 2.0).half().double())   # the model's own cast rounds; nothing else
        h = torch.cumsum(h @ h.transpose(-1, -2), -1)
        want = torch.tanh(exact.out(h / 16))
        eager = F16Chain()(x).double()
    assert oracle.narrow_noise[0][0] == pytest.approx(float((eager - want).abs().max()), rel=1e-6)
    assert oracle.narrow_noise[0][0] > 2e-4          # f16's rounding along the chain, not f32's
    assert fexplore.compile(F16Chain(), (x,), target="tiny").verification["ok"].all()
    # a model of no narrow floats measures none: its f32 tolerance stays as tight as it was
    assert Oracle(torch.nn.Linear(8, 8), (x,)).narrow_noise is None


def test_a_real_error_in_an_f16_chain_still_fails():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 8)
    oracle = Oracle(F16Chain(), (x,))
    chain = oracle.narrow_noise[0][0]
    tol = TOLERANCES[DType.f16]
    for bug in (0.02, -0.05):   # the error a wrong rewrite of the chain would make
        got = [F16Chain(bug=bug)(x).detach().numpy()]
        assert abs(bug) > tol.atol * 2 + NARROW_MULTIPLE * chain
        assert not compare(got, oracle.expected[0], tol, oracle.noise[0], narrow_noise=oracle.narrow_noise[0])[2]
    # off by f16's rounding of the chain, beyond f16's fixed tolerance: allowed
    want = oracle.expected[0][0].astype(np.float64)
    within = [want + 0.9 * (tol.atol * max(1.0, np.abs(want).max()) + tol.rtol * np.abs(want)
                            + NARROW_MULTIPLE * chain)]
    assert not compare(within, oracle.expected[0], tol, oracle.noise[0])[2]
    assert compare(within, oracle.expected[0], tol, oracle.noise[0], narrow_noise=oracle.narrow_noise[0])[2]


def test_the_exact_copy_of_a_narrow_model_keeps_within_the_twins_size_limit(monkeypatch):
    """The all-f64 copy of a bf16 model is four times its size: past the f64 twin's limit it is
    not made, and the round-once noise alone applies."""
    from fexplore.pipeline import numeric

    x = torch.randn(2, 6, 8)
    model = F16Chain()
    size = sum(t.numel() for t in model.parameters())
    monkeypatch.setattr(numeric, "F64_TWIN_LIMIT_BYTES", 4 * size)   # the f16 twin fits, f64 does not
    oracle = Oracle(model, (x,))
    assert oracle.f64_note is None and oracle.narrow_noise is None


class MeansEqualInExactArithmetic(torch.nn.Module):
    """Fuzz seed 2020216, shrunk: the column means of eye(4) + x are equal in exact arithmetic,
    and eager's summation order happens to make them equal too, so the norm gives exactly 0 and
    eager's distance from f64 is 0. Another summation order leaves them an ulp apart, and the
    norm's 1/sqrt(eps) turns that ulp into ~1e-5."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(4, elementwise_affine=False)

    def forward(self, x):
        return self.norm((torch.eye(4) + x).mean(-2))


def test_an_output_sensitive_to_rounding_has_noise_where_eagers_own_rounding_was_exact():
    from fexplore.pipeline.numeric import REROUNDED_SHARE, _f32_noise, _f64_twin
    from fexplore.pipeline.rerounding import rerounding_distance

    model, x = MeansEqualInExactArithmetic().eval(), torch.tensor(0.7358745336532593)
    out = model(x)
    spec = torch.utils._pytree.tree_structure((x,))
    twin, _ = _f64_twin(model)
    assert _f32_noise(twin, [x], spec, [out])[0] == [0.0] and torch.equal(out, torch.zeros(4))
    oracle = Oracle(model, (x,), random_sets=0)
    moved = rerounding_distance(model, [x], spec, [out], seed=0)
    assert oracle.noise[0][0] == REROUNDED_SHARE * moved[0] > 2e-6   # what an ulp does, not 0
    cm = fexplore.compile(model, (x,))
    assert cm.verification["ok"].all()
    # the fixed tolerance alone refused this correct compile (another summation order)
    assert cm.verification["max_abs_err"].max() > TOLERANCES[DType.f32].atol
    # a real error still fails
    tol = TOLERANCES[DType.f32]
    assert not compare([out.numpy() + 1e-3], [out.numpy()], tol, noise=oracle.noise[0])[2]


class ExactOpsAndAFlippedFloor(torch.nn.Module):
    def forward(self, x):
        return torch.cat([torch.relu(x), x.amax(0, keepdim=True)]), torch.floor(x * 3)


def test_rerounding_leaves_exact_ops_alone_and_drops_a_flipped_decision():
    from fexplore.pipeline.rerounding import rerounding_distance

    model, x = ExactOpsAndAFlippedFloor(), torch.tensor([1.0, 2.0, -0.5])
    outs = list(model(x))
    spec = torch.utils._pytree.tree_structure((x,))
    distances = [rerounding_distance(model, [x], spec, outs, seed=s) for s in range(8)]
    assert all(d[0] == 0.0 for d in distances)   # data movement, ReLU, max: exact everywhere
    # x * 3 an ulp below 3.0 floors to 2.0: a decision, not rounding, so no estimate from it
    assert all(d[1] == 0.0 for d in distances)


class IndexPuts(torch.nn.Module):
    def forward(self, x, i, v):
        return x.index_put((i,), v), x.index_put((i,), v, accumulate=True)


def test_rerounding_moves_what_an_accumulating_index_put_adds_but_not_what_it_copies():
    from fexplore.pipeline.rerounding import rerounding_distance

    x, i, v = torch.randn(5), torch.tensor([0, 2, 2]), torch.randn(3)
    outs = list(IndexPuts()(x, i, v))
    spec = torch.utils._pytree.tree_structure((x, i, v))
    copied, added = rerounding_distance(IndexPuts(), [x, i, v], spec, outs, seed=0)
    assert copied == 0.0 and added > 0.0
