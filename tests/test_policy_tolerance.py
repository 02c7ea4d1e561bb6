"""A reduced-precision compile is held to eager's own error under the same cast policy
(``fexplore.pipeline.policy_noise``), not to a fixed bf16 tolerance: an ill-conditioned output
(a LayerNorm over three nearly equal values) passes with the policy's honest error, while weights
rounded coarser than the policy says (fp8 for bf16) fail even where a fixed bound is loose."""

import pytest
import torch

import fexplore
from fexplore.errors import NumericMismatchError
from fexplore.ir import DType
from fexplore.pipeline.numeric import (POLICY_MULTIPLE, TOLERANCES, Oracle, narrowed_outputs, policy_noise_of,
                                      tolerance_of, tolerances_of)
from fexplore.pipeline.policy_noise import policy_error
from fexplore.testing.mutants import MUTANTS


class NarrowSpreadNorm(torch.nn.Module):
    """A linear whose three outputs are nearly equal (its weight rows differ by ~1%), normalized
    over them: the LayerNorm divides the bf16 rounding of the weights by a tiny spread."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 3, bias=False)
        self.norm = torch.nn.LayerNorm(3)
        with torch.no_grad():
            self.fc.weight.copy_(0.3 + 0.002 * torch.randn(3, 8))

    def forward(self, x):
        return self.norm(self.fc(x))


def _narrow_norm():
    torch.manual_seed(0)
    model = NarrowSpreadNorm().eval()
    return model, (3.0 + 0.1 * torch.randn(4, 8),)


def test_the_policy_error_is_eager_with_narrowed_contraction_operands():
    model, (x,) = _narrow_norm()
    with torch.no_grad():
        want = model(x)
    errors, own = policy_error(model, (x,), [want], "bf16")
    with torch.no_grad():   # the same by hand: the linear's input and weight rounded to bf16
        by_hand = model.norm(x.bfloat16().float() @ model.fc.weight.bfloat16().float().T)
    assert errors[0] == pytest.approx(float((by_hand - want).abs().max()), rel=1e-6)
    assert errors[0] > 10 * TOLERANCES[DType.bf16].atol   # ill-conditioned: far past a fixed bound
    assert own == [DType.f32]


def test_the_model_own_narrow_dtype_is_noted():
    class CastsItself(torch.nn.Module):
        def forward(self, x):
            return (x.half() * 2).float()

    errors, own = policy_error(CastsItself(), (torch.randn(4),), [torch.randn(4)], "bf16")
    assert own == [DType.f16]


class CastsOneOutput(torch.nn.Module):
    """The ill-conditioned norm (its policy error far past bf16's fixed bound) beside a value the
    model casts to f16 itself, once as an output and once dead (fuzz seed 1280423: a dead
    ``.to(bfloat16)`` held every output to bf16's fixed bound, with no allowance for the policy)."""

    def __init__(self):
        super().__init__()
        self.inner = NarrowSpreadNorm()

    def forward(self, x):
        x.to(torch.bfloat16) * 2    # computed and dropped, as in the fuzz seed
        return self.inner(x), (x.half() * 2).float()


def test_the_model_own_dtype_is_per_output_and_ignores_dead_values():
    torch.manual_seed(0)
    model = CastsOneOutput().eval()
    x = 3.0 + 0.1 * torch.randn(4, 8)
    with torch.no_grad():
        want = model(x)
    errors, own = policy_error(model, (x,), list(want), "bf16")
    assert own == [DType.f32, DType.f16]
    assert errors[0] > 10 * TOLERANCES[DType.bf16].atol and errors[1] == 0.0


def test_an_output_the_policy_narrowed_gets_its_allowance_beside_a_narrow_output():
    torch.manual_seed(0)
    model = CastsOneOutput().eval()
    inputs = (3.0 + 0.1 * torch.randn(4, 8),)
    cm = fexplore.compile(model, inputs, precision="bf16")
    oracle = Oracle(model, inputs, random_sets=0, precision="bf16")
    assert narrowed_outputs(cm.graph, oracle) == [True, False]
    # the norm's output: f32's bound plus the policy's error; the f16 output: f16's, no allowance
    assert tolerances_of(cm.graph, oracle) == [TOLERANCES[DType.f32], TOLERANCES[DType.f16]]
    assert policy_noise_of(oracle, 0, cm.graph)[1] is None
    ingest = cm.stages[0].after
    assert narrowed_outputs(ingest, oracle) == [False, False]
    assert tolerances_of(ingest, oracle) == [TOLERANCES[DType.f32], TOLERANCES[DType.f16]]
    with torch.no_grad():
        got, want = cm(*inputs), model(*inputs)
    assert float((got[0] - want[0]).abs().max()) > 2 * TOLERANCES[DType.bf16].atol
    assert torch.equal(got[1], want[1])


def test_an_ill_conditioned_output_passes_at_the_policy_own_error():
    model, inputs = _narrow_norm()
    cm = fexplore.compile(model, inputs, precision="bf16")
    precision = next(r for r in cm.stages if r.name == "precision")
    assert precision.verification.numeric.ok
    with torch.no_grad():
        err = float((cm(*inputs) - model(*inputs)).abs().max())
    assert err > 2 * TOLERANCES[DType.bf16].atol   # the fixed bf16 bound would have failed it
    oracle = Oracle(model, inputs, random_sets=0, precision="bf16")
    assert err <= POLICY_MULTIPLE * oracle.policy_noise[0][0]


def test_weights_rounded_coarser_than_the_policy_fail_the_precision_check():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 32)).eval()
    x = torch.randn(4, 64)
    fexplore.compile(model, (x,), precision="bf16")   # the policy itself passes
    mutant = next(m for m in MUTANTS if m.name == "precision-weights-at-fp8")
    with mutant.active(), pytest.raises(NumericMismatchError) as e:
        fexplore.compile(model, (x,), precision="bf16")
    assert "precision" in e.value.message and "bf16 error" in e.value.message


def test_fp32_compiles_keep_the_dtype_tolerance():
    model, inputs = _narrow_norm()
    oracle = Oracle(model, inputs, random_sets=0)
    assert oracle.policy_noise is None
    cm = fexplore.compile(model, inputs)
    assert tolerance_of(cm.graph, oracle) == TOLERANCES[DType.f32]


def test_only_graphs_the_policy_narrowed_get_its_allowance():
    model, inputs = _narrow_norm()
    cm = fexplore.compile(model, inputs, precision="bf16")
    described = {r.name: r.verification.numeric.tolerance for r in cm.stages
                 if r.verification is not None and r.verification.numeric is not None}
    assert "bf16 error" in described["precision"]
    for before in ("ingest", "fold", "simplify"):
        assert "bf16 error" not in described[before], (before, described[before])


class AppendsToItsState(torch.nn.Module):
    """A decode step in miniature: it writes the new position into the state it is given."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, state):
        state.add_(x)
        return self.fc(state)


def test_the_policy_run_sees_the_inputs_eager_saw_not_the_state_eager_left():
    """The oracle runs eager, then eager under the policy: on the same argument objects, the
    second run would see the state the first one wrote, and its difference would be the state's,
    not the policy's (a decode step's cache one position longer: a zero or a huge allowance)."""
    torch.manual_seed(0)
    model = AppendsToItsState().eval()
    x, state = torch.randn(4, 8), torch.randn(4, 8)
    oracle = Oracle(model, (x, state.clone()), precision="bf16", random_sets=0)
    (noise,) = oracle.policy_noise[0]
    with torch.no_grad():
        plain = model.fc(state + x)
    assert 0 < noise < 0.05 * float(plain.abs().max()), noise   # bf16 operand rounding, not a step


class Attend(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize("rank", [3, 4])
def test_attention_under_the_policy_rounds_q_k_v_and_nothing_else_whichever_kernel_eager_picks(rank):
    """Eager's 3-d attention is its math path (a scaling and two bmm), the 4-d one a fused CPU
    kernel; under the policy both are the IR's attention (q, k, v rounded, the rest wide) and the
    chip's (the exponentials rounded too, and normalized by their rounded sum), the larger error
    of the two. Rounding the math path's
    bmm operands instead rounds ``q * scale`` (seed 720379)."""
    g = torch.Generator().manual_seed(0)
    shape = (1,) * (rank - 3) + (2, 6, 5)
    q, k, v = (4 * torch.randn(shape, generator=g) for _ in range(3))
    want = Attend()(q, k, v)
    errors, own = policy_error(Attend(), (q, k, v), [want], "bf16")
    assert own == [DType.f32]  # the policy's own rounding is not a dtype the model computes in
    r = [t.bfloat16().double() for t in (q, k, v)]
    p = torch.softmax(r[0] @ r[1].transpose(-1, -2) / 5 ** 0.5, -1)
    ir_way = float(((p @ r[2]) - want.double()).abs().max())
    # the chip's kernel also rounds the probabilities, the second product's operand (seed 1270235):
    # the exponentials less the row maximum, then divided by their rounded sum (seed 1740735)
    s = r[0] @ r[1].transpose(-1, -2) / 5 ** 0.5
    e = torch.exp(s - s.amax(-1, keepdim=True)).bfloat16().double()
    chip_way = float(((e @ r[2]) / e.sum(-1, keepdim=True) - want.double()).abs().max())
    assert errors[0] == pytest.approx(max(ir_way, chip_way), rel=1e-3)


class _ExactInBf16(torch.nn.Module):
    """A linear whose weights and inputs are exact in bf16: round-to-nearest under the policy
    changes nothing, though the output is as sensitive to the policy's rounding as any."""

    def __init__(self, pick: bool = False):
        super().__init__()
        self.fc = torch.nn.Linear(16, 4, bias=False)
        self.pick = pick
        with torch.no_grad():
            self.fc.weight.copy_(torch.randint(-8, 8, (4, 16)) / 8)
            if pick:   # rows 0 and 1 the same and the largest on positive inputs: a tie to break
                self.fc.weight[:2] = torch.randint(1, 8, (16,)) / 8
                self.fc.weight[2:] = -1.0

    def forward(self, x):
        y = self.fc(x)
        # pick: a decision on the product (its largest entry per row), which an ulp can flip
        return torch.nn.functional.one_hot(y.argmax(-1), 4).float() if self.pick else y


def test_a_lucky_round_to_nearest_is_not_the_policy_error():
    # fuzz seed 2490141: eager under the policy can be off by far less than the policy's rounding
    # moves the output; the error is at least a share of a run one ulp off nearest at random
    from fexplore.pipeline.policy_noise import JITTER_SHARE

    torch.manual_seed(0)
    model = _ExactInBf16().eval()
    x = torch.randint(-8, 8, (3, 16)) / 4 + 1 / 3   # a third: not exact in bf16
    exact = torch.randint(-8, 8, (3, 16)) / 4
    for inputs, lucky in ((exact, True), (x, False)):
        with torch.no_grad():
            want = model(inputs)
        errors, _ = policy_error(model, (inputs,), [want], "bf16")
        if lucky:   # nothing rounded: nearest is exact, the jittered run is not
            with torch.no_grad():
                assert float((model.fc(inputs.bfloat16().float()) - want).abs().max()) == 0
            assert 0 < errors[0] < JITTER_SHARE * 4 * float(want.abs().max()) * 2 ** -7
        assert errors[0] == policy_error(model, (inputs,), [want], "bf16")[0][0]   # seeded
    # a decision the jitter flips (the tie of rows 0 and 1) moves the output by 1: not rounding,
    # not counted
    import torch.utils._pytree as pytree

    from fexplore.pipeline.policy_noise import _errors_of_one_run, _NarrowContractions

    picked = _ExactInBf16(pick=True).eval()
    positive = torch.randint(1, 8, (16, 16)) / 4   # 16 rows: 16 ties, one flipped at the least
    with torch.no_grad():
        want = picked(positive)
    flat, spec = pytree.tree_flatten((positive,))
    jittered = _NarrowContractions(torch.bfloat16, jitter=torch.Generator().manual_seed(0))
    assert _errors_of_one_run(picked, flat, spec, [want], jittered, round_probabilities=False)[0] == [1.0]
    assert policy_error(picked, (positive,), [want], "bf16")[0] == [0.0]
