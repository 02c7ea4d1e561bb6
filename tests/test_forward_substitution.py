"""The inverse of a unit lower-triangular system, written as a loop of row updates (the gated delta
rule of Hugging Face's linear-attention layers under torch.export), is raised to a product of
matmuls; look-alikes that compute something else are left as written. Every case is checked
against eager."""

import math

import pytest
import torch
import transformers as T

import fexplore
from fexplore.testing.mutants import DeltaRuleChunks

RULE = "raise-forward-substitution"


class RowUpdates(torch.nn.Module):
    """The loop as Hugging Face writes it, over a strictly lower triangle, then applied to `v`.
    `lower`: take the strict lower triangle first (else the loop reads the upper one too);
    `rows`: the last row the loop updates; `sign`: how a row takes the sum."""

    def __init__(self, n: int, lower: bool = True, rows: int | None = None, sign: float = 1.0):
        super().__init__()
        self.n, self.lower, self.rows, self.sign = n, lower, n - 1 if rows is None else rows, sign

    def forward(self, u, v):
        system = -u.tril(-1) if self.lower else -u.clone()
        for i in range(1, self.rows + 1):
            row = system[..., i, :i].clone()
            sub = system[..., :i, :i].clone()
            system[..., i, :i] = row + self.sign * (row.unsqueeze(-1) * sub).sum(-2)
        return (system + torch.eye(self.n)) @ v


def _inputs(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, 3, n, n, generator=g) * 0.3, torch.randn(1, 2, 3, n, 8, generator=g)


def _check(model, inputs, **options):
    cm = fexplore.compile(model, inputs, **options)
    assert cm.verification["ok"].all()
    assert not cm.lowering.host_ops
    tol = {"rtol": 2e-2, "atol": 2e-2} if options.get("precision") == "bf16" else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(cm(*inputs), model(*[x.clone() for x in inputs]), **tol)
    return cm


@pytest.mark.parametrize("n", [3, 8, 64])
def test_the_loop_of_row_updates_becomes_a_product_of_matmuls(n):
    """(I - A)^-1 - I = (I + A)(I + A^2)...(I + A^(2^(K-1))) - I for A strictly lower (A^n = 0):
    2(K - 1) matmuls where the loop had about ten ops per row."""
    cm = _check(RowUpdates(n), _inputs(n))
    assert cm["simplify"].stats["rules_fired"].get(RULE) == 1
    ops = [node.op.name for node in cm["simplify"].after.nodes]
    assert "slice_scatter" not in ops and "select" not in ops
    assert ops.count("matmul") == 2 * (math.ceil(math.log2(n)) - 1) + 1   # and the user's own @ v
    assert len(cm.kernels) <= 2 * math.ceil(math.log2(n))


@pytest.mark.parametrize("variant", [
    {"lower": False},   # the loop reads an upper triangle too: not the inverse
    {"rows": 6},        # rows 1 to 6 of 8: the last row is left as it was
    {"sign": -1.0},     # another recurrence
])
def test_look_alikes_are_left_as_written(variant):
    cm = _check(RowUpdates(8, **variant), _inputs(8))
    assert RULE not in cm["simplify"].stats["rules_fired"]


@pytest.mark.parametrize("target,precision", [("rngd", "fp32"), ("tiny", "bf16")])
def test_the_chunked_delta_rule_runs_its_inverse_as_matmuls(target, precision, without_simplify_rule):
    """The whole chunked gated delta rule, against eager and against the same compile with the
    rule taken out: fewer kernels and fewer simulated cycles."""
    g = torch.Generator().manual_seed(0)
    model, x = DeltaRuleChunks(g).eval(), torch.randn(1, 32, 32, generator=g)
    cm = _check(model, (x,), target=target, precision=precision)
    assert cm["simplify"].stats["rules_fired"].get(RULE) == 1
    without_simplify_rule(RULE)
    loop = _check(model, (x,), target=target, precision=precision)
    assert RULE not in loop["simplify"].stats["rules_fired"]
    assert len(loop.kernels) - len(cm.kernels) >= 5 * (model.chunk - 1)   # about ten ops a row, unrolled
    assert cm.simulate(x).cycles < loop.simulate(x).cycles


def test_a_hugging_face_hybrid_with_gated_delta_rule_layers():
    """OLMo hybrid: a gated delta-rule layer (the loop runs under torch.export) and an attention one."""
    config = T.OlmoHybridConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                layer_types=["linear_attention", "full_attention"], use_cache=False,
                                pad_token_id=0)
    torch.manual_seed(0)
    lm = T.OlmoHybridForCausalLM(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = lm

        def forward(self, ids):
            return self.lm(ids).logits

    ids = torch.randint(1, 96, (1, 8), generator=torch.Generator().manual_seed(0))
    cm = fexplore.compile(Logits(), (ids,))
    assert cm.verification["ok"].all() and not cm.lowering.host_ops
    assert cm["simplify"].stats["rules_fired"].get(RULE) == 1
    with torch.no_grad():
        torch.testing.assert_close(cm(ids), Logits()(ids), rtol=1e-5, atol=2e-5)
