"""Projections fused across modules: a written-out RMSNorm is the rms_norm op (so the projection
after it takes it as its prologue), and the q, k and v projections reading one input are one
linear over their weights side by side, whose slices the attention kernel reads in place."""

from __future__ import annotations

import copy
import importlib

import ml_dtypes
import numpy as np
import pytest
import torch
from torch import nn

import fexplore
from fexplore.models import ZOO

# the module (the package's name `fold` is the stage function)
fold_stage = importlib.import_module("fexplore.pipeline.stages.fold")


class WrittenOutRMSNorm(nn.Module):
    """Llama's and T5's spelling; `square` picks x.pow(2) or x * x."""

    def __init__(self, width, square="pow", axes=(-1,)):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(width) + 0.5)
        self.square, self.axes = square, axes

    def forward(self, x, other=None):
        y = x if other is None else other
        sq = y.pow(2) if self.square == "pow" else y * y
        return self.weight * (x * torch.rsqrt(sq.mean(self.axes, keepdim=True) + 1e-5))


def _ops(cm, stage):
    return [n.op.name for n in cm[stage].after.nodes]


@pytest.mark.parametrize("square", ["pow", "mul"])
def test_a_written_out_rms_norm_is_the_rms_norm_op_with_its_weight(square):
    torch.manual_seed(0)
    m, x = WrittenOutRMSNorm(24, square).eval(), torch.randn(2, 5, 24) * 3
    cm = fexplore.compile(m, (x,))
    assert _ops(cm, "simplify") == ["rms_norm"]
    (norm,) = cm["simplify"].after.nodes
    assert len(norm.inputs) == 2 and norm.attrs["eps"] == pytest.approx(1e-5) and norm.attrs["ndim"] == 1
    fired = {r.rule for r in cm["simplify"].rewrites}
    assert {"raise-written-out-rms-norm", "fold-weight-into-rms-norm"} <= fired
    assert cm.verification["ok"].all()
    torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["not-the-last-axis", "another-value"])
def test_what_only_looks_like_an_rms_norm_stays_written_out(case):
    torch.manual_seed(0)
    m = WrittenOutRMSNorm(24, axes=(1,) if case == "not-the-last-axis" else (-1,)).eval()
    args = (torch.randn(2, 5, 24),) + ((torch.randn(2, 5, 24),) if case == "another-value" else ())
    cm = fexplore.compile(m, args)
    assert "rms_norm" not in _ops(cm, "simplify")
    torch.testing.assert_close(cm(*args), m(*args), rtol=1e-5, atol=1e-5)


def _without_merging(monkeypatch):
    monkeypatch.setattr(fold_stage, "merge_parallel_linears", lambda g: (g, []))


@pytest.mark.parametrize("target, precision", [("rngd", "fp32"), ("tiny", "bf16")])
def test_q_k_v_are_one_kernel_with_the_norm_as_its_prologue(target, precision, monkeypatch):
    model, inputs = ZOO["llama"]()
    cm = fexplore.compile(model, inputs, target=target, precision=precision)
    merged = [r for r in cm["fold"].rewrites if r.rule == "merge-parallel-linears"]
    assert [len(r.nodes) for r in merged] == [3] * len(model.layers)
    names = [k.kernel.name for k in cm.kernels if k.kernel is not None]
    for i in range(len(model.layers)):
        qkv = next(k.kernel for k in cm.kernels
                   if k.kernel is not None and k.kernel.name == f"layers_{i}_self_attn_q_proj_k_proj_v_proj")
        assert qkv.parts[:2] == ("norm", "contraction"), qkv.parts
        assert f"layers_{i}_input_layernorm" not in names
    assert not cm.lowering.host_ops
    assert cm.verification["ok"].all()
    with torch.no_grad():
        want = model(*inputs)
    got = cm(*inputs)
    if precision == "fp32":
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        assert float((got - want).abs().max()) <= 0.05 * float(want.abs().max())

    # what it bought, on the simulated chip: fewer kernels than the same compile with the
    # projections apart (the norm then a kernel of its own, its result through DRAM), and on rngd
    # fewer cycles (11,828 against 15,327 in bf16). On tiny the two programs are within 2% either
    # way, which of them keeps more intermediates in its fragmented SRAM deciding (23,252 merged
    # and 23,263 apart before the norm's weight folded into the projections; 23,491 and 22,980
    # after): only the kernels are counted there
    _without_merging(monkeypatch)
    apart = fexplore.compile(model, inputs, target=target, precision=precision, verify=False)
    assert not [r for r in apart["fold"].rewrites if r.rule == "merge-parallel-linears"]
    assert len(cm.schedule.kernels) < len(apart.schedule.kernels)
    if target == "rngd":
        assert cm.simulate(*inputs).cycles < apart.simulate(*inputs).cycles


class TwoHeads(nn.Module):
    """Linears on one input whose results do not go into attention: two returned heads, and
    SwiGLU's gate and up projections (which fusion makes sibling contractions of one kernel)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(32, 16), nn.Linear(32, 8)
        self.gate, self.up = nn.Linear(32, 24, bias=False), nn.Linear(32, 24, bias=False)

    def forward(self, x):
        return self.a(x), torch.relu(self.b(x)), nn.functional.silu(self.gate(x)) * self.up(x)


def test_linears_not_feeding_attention_stay_apart():
    torch.manual_seed(0)
    m, x = TwoHeads().eval(), torch.randn(2, 5, 32)
    cm = fexplore.compile(m, (x,))
    assert not [r for r in cm["fold"].rewrites if r.rule == "merge-parallel-linears"]
    assert _ops(cm, "fold").count("linear") == 4
    swiglu = [k.kernel for k in cm.kernels if k.kernel is not None and k.kernel.name == "gate"]
    assert len(swiglu) == 1   # gate and up: one kernel, as sibling contractions
    for g, w in zip(cm(x), m(x)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_a_decode_steps_cache_update_reads_the_merged_projections():
    """The new keys and values a decode step appends to its cache are slices of the merged
    result, exported by the attention kernel as before."""
    model, inputs = ZOO["llama_decode"]()
    cm = fexplore.compile(model, inputs, target="tiny", precision="bf16")
    assert [len(r.nodes) for r in cm["fold"].rewrites if r.rule == "merge-parallel-linears"] == [3, 3]
    assert not cm.lowering.host_ops and cm.verification["ok"].all()
    with torch.no_grad():
        want = model(*inputs)
    for g, w in zip(cm(*inputs), want):
        assert float((g - w).abs().max()) <= 0.05 * max(1.0, float(w.abs().max()))


def test_on_the_meta_device_the_merged_weight_is_narrowed_at_compile_time():
    """A real-size model is compiled on the meta device (no weights), where the merged weight is
    made by structure. It must still be a weight the precision stage narrows to bf16 as it
    compiles, as the weights it was made of are, not a cast that runs every call: also for a
    merged linear left outside a region (precision then narrows the bare node's operands)."""
    from fexplore.pipeline.options import CompileOptions
    from fexplore.pipeline.stages.precision import precision

    model, inputs = ZOO["llama"]()
    meta = fexplore.compile(model.to("meta"), tuple(x.to("meta") for x in inputs), precision="bf16")
    assert [len(r.nodes) for r in meta["fold"].rewrites if r.rule == "merge-parallel-linears"] == \
        [3] * len(model.layers)
    assert meta.simulate().cycles > 0
    # the fold stage's graph, no regions yet: each merged linear is a bare node
    narrowed = precision(meta["fold"].after, CompileOptions(precision="bf16")).graph
    merged = [n for n in narrowed.nodes if n.op.name == "linear" and "merged" in n.inputs[1].name]
    assert len(merged) == len(model.layers)
    constants = {c.name: c for c in narrowed.constants}
    for n in merged:   # the weight: a bf16 constant of the graph, not a cast's result
        assert n.inputs[1].name in constants and constants[n.inputs[1].name].type.dtype.value == "bf16"
    assert not [n for n in narrowed.nodes if n.op.name == "cast" and "merged_weight" in n.inputs[0].name]


class FusedGateUp(nn.Module):
    """Phi-3's MLP: one linear for gate and up, chunked in two that meet in SwiGLU's product; and
    a fused linear whose chunks are returned apart (they never meet)."""

    def __init__(self, bias):
        super().__init__()
        self.gate_up = nn.Linear(32, 2 * 24, bias=bias)
        self.down = nn.Linear(24, 32, bias=False)
        self.heads = nn.Linear(32, 16 + 8)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        a, b = self.heads(x).split([16, 8], dim=-1)
        return self.down(up * nn.functional.silu(gate)), a, b


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("target, precision", [("rngd", "fp32"), ("tiny", "bf16")])
def test_a_fused_linear_whose_chunks_meet_again_is_split_into_sibling_contractions(bias, target, precision):
    torch.manual_seed(0)
    m, x = FusedGateUp(bias).eval(), torch.randn(2, 5, 32)
    cm = fexplore.compile(m, (x,), target=target, precision=precision)
    (cut,) = [r for r in cm["fold"].rewrites if r.rule == "split-fused-linear"]
    assert cut.nodes == ("linear",) and len(cut.result) == 2
    assert cm["fold"].stats["fused_linears_split"] == 1
    # gate and up: one kernel, the SwiGLU product its epilogue; no copy kernel of the chunks
    gate_up = [k.kernel for k in cm.kernels if k.kernel is not None and k.kernel.name == "gate_up"]
    assert len(gate_up) == 1 and "epilogue" in gate_up[0].parts
    assert cm.verification["ok"].all() and not cm.lowering.host_ops
    with torch.no_grad():
        want = m(x)
    for g, w in zip(cm(x), want):
        tol = 1e-5 if precision == "fp32" else 0.05 * max(1.0, float(w.abs().max()))
        assert float((g - w).abs().max()) <= tol


def test_a_fused_linear_split_on_the_meta_device_cuts_its_weight_by_structure():
    """Without weights (a real-size model on the meta device) the parts' weights are made by
    structure, and narrowed at compile time as the weights are."""
    m = FusedGateUp(True).eval().to("meta")
    cm = fexplore.compile(m, (torch.randn(2, 5, 32, device="meta"),), precision="bf16")
    assert cm["fold"].stats["fused_linears_split"] == 1
    weight_casts = [k.name for k in cm.schedule.kernels if k.name.startswith("cast_") and "rows" in k.name]
    assert not weight_casts and cm.simulate().cycles > 0


class NormThenLinears(nn.Module):
    """A norm whose rows two linears read (an MLP's input projection beside a head), as every
    pre-norm transformer block has; `reader` adds a third reader of the normed rows: another
    linear's input through a residual add, or a linear whose weight is tied to the first's."""

    def __init__(self, norm="layer", bias=True, reader=None):
        super().__init__()
        self.norm = {"layer": lambda: nn.LayerNorm(32), "layer-no-bias": lambda: nn.LayerNorm(32, bias=False),
                     "rms": lambda: nn.RMSNorm(32, eps=1e-6)}[norm]()
        with torch.no_grad():   # not the identity a fresh norm is: the fold must be seen to scale
            self.norm.weight.copy_(torch.rand(32) + 0.5)
            if getattr(self.norm, "bias", None) is not None:
                self.norm.bias.copy_(torch.randn(32))
        self.up, self.head = nn.Linear(32, 48, bias=bias), nn.Linear(32, 16)
        self.tied = nn.Linear(32, 48, bias=False) if reader == "tied" else None
        if self.tied is not None:
            self.tied.weight = self.up.weight
        self.reader = reader

    def forward(self, x):
        y = self.norm(x)
        out = (nn.functional.gelu(self.up(y)), self.head(y))
        if self.reader == "residual":
            return out + (x + y,)
        if self.reader == "tied":
            return out + (self.tied(x),)
        return out


@pytest.mark.parametrize("norm, bias", [("layer", True), ("layer-no-bias", False), ("layer-no-bias", True),
                                        ("rms", False)])
def test_a_norms_weight_and_bias_fold_into_the_linears_reading_its_rows(norm, bias, without_simplify_rule):
    """linear(norm(x, g, b0), W, b) = linear(norm(x), W * g, b + W @ b0): every reader of the rows
    is such a linear, so the norm keeps no operand of its own and its kernel loads none."""
    torch.manual_seed(0)
    m, x = NormThenLinears(norm, bias).eval(), torch.randn(2, 7, 32)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    cm = fexplore.compile(m, (x,))
    assert sum(r.rule == "fold-norm-affine-into-linear" for r in cm["simplify"].rewrites) == 2
    g = cm["simplify"].after
    (normed,) = [n for n in g.nodes if n.op.name in ("layer_norm", "rms_norm")]
    assert len(normed.inputs) == 1
    consts = {c.name: c.payload.astype(np.float64) for c in g.constants if c.payload is not None}
    gamma = m.norm.weight.detach().double().numpy()
    beta = m.norm.bias.detach().double().numpy() if getattr(m.norm, "bias", None) is not None else np.zeros(32)
    for lin in (m.up, m.head):
        (node,) = [n for n in g.nodes if n.op.name == "linear" and n.outputs[0].type.shape[-1] == lin.out_features]
        W = lin.weight.detach().double().numpy()
        np.testing.assert_allclose(consts[node.inputs[1].name], W * gamma, rtol=1e-6)
        b = lin.bias.detach().double().numpy() if lin.bias is not None else np.zeros(lin.out_features)
        if len(node.inputs) == 3:
            np.testing.assert_allclose(consts[node.inputs[2].name], b + W @ beta, rtol=1e-5, atol=1e-6)
        else:   # nothing to add: a norm without a bias into a linear without one
            assert norm in ("rms", "layer-no-bias") and lin.bias is None
    assert cm.verification["ok"].all() and not cm.lowering.host_ops
    with torch.no_grad():
        want = m(x)
    for got, w in zip(cm(x), want):
        torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())   # the user's model: untouched
    # the kernels read the norm's weight and bias no more: fewer loads, fewer cycles on the chip
    kernel_params = [p.name for k in cm.kernels if k.kernel is not None for p in k.kernel.params]
    assert not [p for p in kernel_params if p.startswith("norm_")], kernel_params
    without_simplify_rule("fold-norm-affine-into-linear")
    apart = fexplore.compile(m, (x,), verify=False)
    assert not [r for r in apart["simplify"].rewrites if r.rule == "fold-norm-affine-into-linear"]
    assert cm.simulate(x).cycles < apart.simulate(x).cycles


@pytest.mark.parametrize("reader", ["residual", "tied", "a linear without a bias"])
def test_a_norm_read_by_more_than_its_linears_keeps_its_weight_and_bias(reader):
    """Rows a residual add reads too would need the norm twice (with and without its affine
    part), a weight tied to another linear would be copied, and the norm's bias folded into a
    linear without one would make it a bias to load (the program measured slower: 3,827 cycles
    against 3,455 on rngd): none of them folds."""
    torch.manual_seed(0)
    bias = reader != "a linear without a bias"
    m, x = NormThenLinears("layer", bias, reader if bias else None).eval(), torch.randn(2, 7, 32)
    cm = fexplore.compile(m, (x,))
    assert not [r for r in cm["simplify"].rewrites if r.rule == "fold-norm-affine-into-linear"]
    (normed,) = [n for n in cm["simplify"].after.nodes if n.op.name == "layer_norm"]
    assert len(normed.inputs) == 3
    with torch.no_grad():
        want = m(x)
    for got, w in zip(cm(x), want):
        torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["rngd", "tiny"])
def test_the_folded_norm_verifies_in_bf16_and_on_the_meta_device(target):
    """In bf16 the scaled weight is rounded once more than the model's; the compile verifies
    against eager within bf16's tolerance. On the meta device the fold is made by structure: the
    same rewrites, the same kernels."""
    torch.manual_seed(0)
    m, x = NormThenLinears("layer", True).eval(), torch.randn(2, 7, 32)
    mb, xb = copy.deepcopy(m).to(torch.bfloat16), x.to(torch.bfloat16)
    cm = fexplore.compile(mb, (xb,), target=target)
    assert sum(r.rule == "fold-norm-affine-into-linear" for r in cm["simplify"].rewrites) == 2
    assert cm.verification["ok"].all() and not cm.lowering.host_ops
    with torch.no_grad():
        want = mb(xb)
    for got, w in zip(cm(xb), want):
        assert float((got.float() - w.float()).abs().max()) <= 0.05 * float(w.float().abs().max())
    meta = fexplore.compile(copy.deepcopy(mb).to("meta"), (xb.to("meta"),), target=target)
    assert [r.rule for r in meta["simplify"].rewrites] == [r.rule for r in cm["simplify"].rewrites]
    assert [k.name for k in meta.schedule.kernels] == [k.name for k in cm.schedule.kernels]


class CastBackNormThenLinears(nn.Module):
    """Hugging Face's Llama RMSNorm (its own class: rows normalized in f32, cast back to the input's
    dtype, then times the weight) read by two bias-less linears, as a Llama block's attention and
    MLP inputs are; `reader` "residual" also adds the normed rows to the input, "unweighted" returns
    the rows cast back before the weight's multiply too."""

    def __init__(self, reader=None):
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        super().__init__()
        self.norm = LlamaRMSNorm(32, eps=1e-6)
        with torch.no_grad():
            self.norm.weight.copy_(torch.rand(32) + 0.5)
        self.up, self.head = nn.Linear(32, 48, bias=False), nn.Linear(32, 16, bias=False)
        self.reader = reader

    def forward(self, x):
        if self.reader == "unweighted":   # the norm's own lines, its rows cast back returned too
            h = x.to(torch.float32)
            rows = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.norm.variance_epsilon)).to(x.dtype)
            y = self.norm.weight * rows
        else:
            y = self.norm(x)
        out = (nn.functional.silu(self.up(y)), self.head(y))
        if self.reader == "residual":
            return out + (x + y,)
        return out + (rows,) if self.reader == "unweighted" else out


def _bf16(t):
    return t.detach().float().numpy().astype(ml_dtypes.bfloat16).astype(np.float64)


@pytest.mark.parametrize("target", ["rngd", "tiny"])
def test_a_cast_back_norms_weight_folds_through_the_cast_into_the_linears(target, without_simplify_rule):
    """A model in bf16: w * cast(rms_norm(x)) = cast(rms_norm(x, w)), and then linear(cast(rms_norm(x,
    w)), W) = linear(cast(rms_norm(x)), W * w): neither the norm's weight multiply (an elementwise
    pass) nor the weight's loads are left. One rounding fewer than eager; within bf16's tolerance."""
    torch.manual_seed(0)
    m = CastBackNormThenLinears().eval().to(torch.bfloat16)
    x = torch.randn(2, 7, 32).to(torch.bfloat16)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    cm = fexplore.compile(m, (x,), target=target)
    fired = [r.rule for r in cm["simplify"].rewrites]
    assert fired.count("fold-weight-into-rms-norm-through-cast") == 1
    assert fired.count("fold-norm-affine-into-linear") == 2
    g = cm["simplify"].after
    (norm,) = [n for n in g.nodes if n.op.name == "rms_norm"]
    assert len(norm.inputs) == 1 and "mul" not in [n.op.name for n in g.nodes]
    consts = {c.name: c.payload.astype(np.float64) for c in g.constants if c.payload is not None}
    gamma = _bf16(m.norm.weight)
    for lin in (m.up, m.head):
        (node,) = [n for n in g.nodes if n.op.name == "linear" and n.outputs[0].type.shape[-1] == lin.out_features]
        assert node.inputs[0].type.dtype.name == "bf16"   # the rows the cast rounded, as eager's
        np.testing.assert_array_equal(consts[node.inputs[1].name], _bf16(torch.tensor(_bf16(lin.weight) * gamma)))
    assert cm.verification["ok"].all() and not cm.lowering.host_ops
    with torch.no_grad():
        want = m(x)
    for got, w in zip(cm(x), want):
        assert float((got.float() - w.float()).abs().max()) <= 0.02 * float(w.float().abs().max())
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())   # the user's model: untouched
    kernel_params = [p.name for k in cm.kernels if k.kernel is not None for p in k.kernel.params]
    assert not [p for p in kernel_params if p.startswith("norm_")], kernel_params
    meta = fexplore.compile(copy.deepcopy(m).to("meta"), (x.to("meta"),), target=target)
    assert [r.rule for r in meta["simplify"].rewrites] == fired
    without_simplify_rule("fold-weight-into-rms-norm-through-cast")
    apart = fexplore.compile(m, (x,), target=target, verify=False)
    assert not [r for r in apart["simplify"].rewrites if r.rule.startswith("fold-")]
    assert cm.simulate(x).cycles < apart.simulate(x).cycles


@pytest.mark.parametrize("reader", ["residual", "unweighted"])
def test_cast_back_rows_read_by_more_than_the_linears_keep_what_they_need(reader):
    """Rows read by a residual add too: the weight still moves into the norm (the add reads the
    product, which the norm now makes), but not on into the linears (the norm would run twice).
    Rows cast back that something besides the weight's multiply reads: the multiply stays (the
    unweighted rows are needed anyway), so the linears read a product, not a norm."""
    torch.manual_seed(0)
    m = CastBackNormThenLinears(reader).eval().to(torch.bfloat16)
    x = torch.randn(2, 7, 32).to(torch.bfloat16)
    cm = fexplore.compile(m, (x,))
    fired = [r.rule for r in cm["simplify"].rewrites]
    assert "fold-norm-affine-into-linear" not in fired
    (norm,) = [n for n in cm["simplify"].after.nodes if n.op.name == "rms_norm"]
    if reader == "residual":
        assert fired.count("fold-weight-into-rms-norm-through-cast") == 1 and len(norm.inputs) == 2
    else:
        assert "fold-weight-into-rms-norm-through-cast" not in fired and len(norm.inputs) == 1
        assert "mul" in [n.op.name for n in cm["simplify"].after.nodes]
    assert cm.verification["ok"].all()
    with torch.no_grad():
        want = m(x)
    for got, w in zip(cm(x), want):
        assert float((got.float() - w.float()).abs().max()) <= 0.02 * float(w.float().abs().max())
