"""Stage behaviour beyond the golden rules: a broken simplify rule is caught by verification;
regions that do not fit a PE's SRAM are split; symbolic graphs specialize to static buckets."""

import importlib

import numpy as np
import pytest
import torch

import fexplore
from fexplore import ir
from fexplore.errors import NumericMismatchError
from fexplore.models import DYNAMIC_SEQ, ZOO
from fexplore.pipeline.stages import specialize, specialize_buckets


simplify_module = importlib.import_module("fexplore.pipeline.stages.simplify")


def test_a_wrong_simplify_rule_is_caught_by_the_stage_check(monkeypatch):
    def drop_gelu(rw, n, ins, made):  # "gelu is the identity": wrong, and well typed
        return ins[0] if n.op.name == "gelu" else None

    monkeypatch.setattr(simplify_module, "RULES",
                        simplify_module.RULES + [("drop-gelu", drop_gelu)])
    model, inputs = ZOO["mlp"](activation="gelu")
    ex = fexplore.explore(model, inputs)
    with pytest.raises(NumericMismatchError, match="stage 'simplify'") as info:
        ex.result
    rec = ex["simplify"]
    assert rec.verification.structural_ok and not rec.verification.numeric.ok
    assert any(r.rule == "drop-gelu" for r in rec.rewrites)
    assert "first divergent node" in str(info.value)
    assert ex["fold"].verification.ok  # the stages before it are fine


def test_regions_too_big_for_the_tiny_target_are_split():
    model, inputs = ZOO["gpt"]()
    cm = fexplore.compile(model, inputs, target="tiny")
    fusion = next(r for r in cm.stages if r.name == "fusion")
    sram = fusion.stats["sram_bytes_per_pe"]
    assert sram == fexplore.npu.get_target("tiny").sram_bytes_per_pe
    assert fusion.stats["split_for_sram"], "tiny's SRAM should force splits"
    for split in fusion.stats["split_for_sram"]:
        assert split["working_set_bytes"] > sram or split["given_back"]
    # every region that remains fits: one tile step of it (a block of rows of every value but an
    # operand read only through in-place views, which is loaded as the views' boxes, and the views
    # made in the region, which are their sources' tiles read another way)
    from fexplore.pipeline.stages.fusion import _IN_PLACE_VIEWS, _tile_bytes

    for n in fusion.after.nodes:
        if n.op.name == "region":
            body = n.regions[0]
            touched = {v.name: v for m in body.nodes for v in list(m.inputs) + list(m.outputs)}
            made = {v.name for m in body.nodes for v in m.outputs}
            viewed = {name for name in touched if name not in made and
                      all(m.op.name in _IN_PLACE_VIEWS for m in body.nodes if name in {x.name for x in m.inputs})}
            views = {v.name for m in body.nodes if m.op.name in _IN_PLACE_VIEWS | {"expand"} for v in m.outputs}
            assert sum(_tile_bytes(v, {}) for k, v in touched.items() if k not in viewed | views) <= sram
    rng = fexplore.compile(model, inputs)  # the default target fuses more
    rng_fusion = next(r for r in rng.stages if r.name == "fusion")
    assert rng_fusion.stats["nodes_fused"] > fusion.stats["nodes_fused"]
    assert all(r.verification.ok for r in cm.stages)


def test_specialize_binds_symbolic_dims_to_static_buckets():
    model, (ids,) = ZOO["llama"](layers=1)
    cm = fexplore.compile(model, (ids,), dynamic_shapes=DYNAMIC_SEQ["llama"](model))
    g = cm.graph
    assert "seq" in g.symbols
    buckets = specialize_buckets(g, {"seq": [8, 12]})
    assert [k for k in buckets] == [(("seq", 8),), (("seq", 12),)]
    for (key,), static in buckets.items():
        length = key[1]
        ir.verify(static)
        assert static.symbols == {}
        assert all(n.outputs[0].type.is_static for n in static.walk())
        x = np.random.default_rng(length).integers(0, 100, (1, length))
        (got,) = ir.run(static, [x])
        (want,) = ir.run(g, [x])
        np.testing.assert_array_equal(got, want)
        with torch.no_grad():
            np.testing.assert_allclose(got, model(torch.from_numpy(x)).numpy(),
                                       rtol=1.3e-6, atol=2e-5)
    with pytest.raises(fexplore.errors.ConfigError, match="outside its range"):
        specialize(g, seq=10_000)


@pytest.mark.parametrize("sram_kib", [8, 16, 24])
@pytest.mark.parametrize("name", ["llama", "gpt", "llama_decode"])
def test_fusion_stays_acyclic_and_correct_whatever_the_sram(name, sram_kib):
    """Small SRAM forces splits; regions that are each convex could still feed each other in a
    cycle, which the fusion stage must refuse (a 24 KiB chip once produced one on Llama)."""
    model, inputs = ZOO[name]()
    chip = fexplore.npu.get_target("rngd").replace(sram_bytes_per_pe=sram_kib * 1024)
    ex = fexplore.explore(model, inputs, target=chip)
    ex["lower"]   # its kernels run against the regions fusion made (scheduling them is not at issue)
    assert all(r.verification.ok for r in ex.records)
    fusion = ex["fusion"]
    ir.verify(fusion.after)
    assert fusion.stats["split_for_sram"]


class TwoLayersOneTable(torch.nn.Module):
    """Each layer rotates its input by one shared table (as rotary embeddings read one cos and
    sin table in every layer), with a matmul between the layers: the elementwise ops of both
    layers read the tables, so grouping siblings joins them, and that group a path leaves
    (through the matmul) and re-enters is not a region."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8) / 3)
        self.register_buffer("cos_table", torch.rand(16, 8))
        self.register_buffer("sin_table", torch.rand(16, 8))

    def forward(self, x, at):
        cos, sin = self.cos_table[at], self.sin_table[at]   # rows gathered by position, as GQA does
        y = x * cos - x.flip(-1) * sin
        y = y @ self.w
        return y * cos - y.flip(-1) * sin


def test_an_elementwise_group_that_is_not_convex_is_fused_in_convex_parts():
    torch.manual_seed(0)
    model, x, at = TwoLayersOneTable(), torch.randn(4, 8), torch.tensor([3, 1, 4, 1])
    cm = fexplore.compile(model, (x, at))
    fusion = cm["fusion"]
    assert not [r for r in fusion.rewrites if r.rule == "fuse-elementwise" and len(r.nodes) < 2]
    regions = [n for n in fusion.after.nodes if n.op.name == "region" and n.attrs["kind"] == "elementwise"]
    assert len(regions) == 2 and all(len(n.regions[0].nodes) == 3 for n in regions)   # one per layer
    assert bool(cm.verification["ok"].all())
    torch.testing.assert_close(cm(x, at), model(x, at).detach())


@pytest.mark.parametrize("bias", ["read", "made from inputs", "made with a contraction"])
def test_written_out_attention_is_a_region_only_with_scores_the_kernel_can_run(bias):
    """q kᵀ plus a bias, softmax, times v: one attention region when the bias is read as it is
    (its kernel adds it to each block of scores), or made from inputs alone, no contraction
    upstream (Gemma 2's sliding-window mask of a decode step, made from the cache position: here
    tanh of an input, halved): those nodes stay out of the region, a kernel of their own whose
    result the attention kernel loads. DeBERTa adds position scores it computes with projections
    (here tanh of q times v as keys): the kernel runs no such second contraction per block,
    so fusion leaves the scores to kernels of their own rather than form a region that lower
    would split apart."""
    import torch

    class Scores(torch.nn.Module):
        def forward(self, q, k, v, b):
            extra = {"read": lambda: b, "made from inputs": lambda: torch.tanh(b) * 0.5,
                     "made with a contraction": lambda: torch.tanh(q @ v.transpose(-1, -2))}[bias]()
            return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + extra, dim=-1) @ v

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    b = torch.randn(1, 2, 16, 16)
    model = Scores()
    cm = fexplore.compile(model, (q, k, v, b), target="rngd")
    regions = {n.attrs["kind"]: [m.op.name for m in n.regions[0].nodes] for n in cm["fusion"].after.nodes if n.regions}
    assert ("attention" in regions) is (bias != "made with a contraction"), regions
    if bias == "made from inputs":
        assert "tanh" not in regions["attention"] and any("tanh" in ops for ops in regions.values()), regions
    assert not cm["lower"].stats.get("split_regions") and not cm.lowering.host_ops
    assert cm.verification["ok"].all()
    torch.testing.assert_close(cm(q, k, v, b), model(q, k, v, b), rtol=1e-5, atol=1e-5)


class _RowScaledProduct(torch.nn.Module):
    """A chunked scan's read of its state: each query row scaled (by its decay), times the state."""

    def forward(self, q, decay, state):
        return (q * decay.unsqueeze(-1)) @ state


@pytest.mark.parametrize("target", ["rngd", "tiny"])
def test_a_row_scale_of_a_matmul_operand_is_the_contractions_epilogue(target):
    """The scale per row moves to the product (scale-rows-after-the-matmul), so the scaled queries
    are never written out: one contraction kernel, where there were a vector kernel and a
    contraction reading its result."""
    q, decay, state = torch.randn(2, 32, 16), torch.rand(2, 32), torch.randn(2, 16, 24)   # fits tiny whole
    cm = fexplore.compile(_RowScaledProduct(), (q, decay, state), target=target)
    assert cm.verification["ok"].all()
    assert cm["simplify"].stats["rules_fired"].get("scale-rows-after-the-matmul") == 1
    assert [k.kind for k in cm.kernels] == ["contraction"]
    torch.testing.assert_close(cm(q, decay, state), _RowScaledProduct()(q, decay, state), rtol=1e-5, atol=1e-5)


class _ResidualThenNormInF32(torch.nn.Module):
    """A block of a model in bf16 as Hugging Face writes it: the residual add of a projection, and
    the next norm computed in f32 from the sum (``hidden.to(torch.float32)``), the sum itself going
    on to the next residual add."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64, bias=False)
        self.up = torch.nn.Linear(64, 64, bias=False)
        self.weight = torch.nn.Parameter(1 + 0.2 * torch.randn(64))

    def forward(self, x, h):
        x = x + self.proj(h)
        wide = x.to(torch.float32)
        normed = (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
        return x + self.up(self.weight * normed)


@pytest.mark.parametrize("target", ["rngd", "tiny"])
def test_a_sum_widened_for_a_norm_is_written_narrow_and_widened_by_the_norm(target):
    """The residual add's kernel writes the bf16 sum the next add reads, and not an f32 copy of it
    for the norm too: the widening cast is the norm's prologue, which reads the bf16 sum."""
    torch.manual_seed(0)
    model = _ResidualThenNormInF32().to(torch.bfloat16)
    x, h = torch.randn(8, 64).bfloat16(), torch.randn(8, 64).bfloat16()
    cm = fexplore.compile(model, (x, h), target=target)
    assert cm.verification["ok"].all(), cm.verification
    regions = [n for n in cm["fusion"].after.nodes if n.op.name == "region"]
    made = [(n.attrs["kind"], [v.type.dtype.name for v in n.outputs]) for n in regions]
    assert all(dtypes == ["bf16"] for _, dtypes in made), made   # the sum, and no f32 copy beside it
    norm = next(n for n in regions if n.attrs["kind"] == "norm")
    assert [v.type.dtype.name for v in norm.inputs if v.type.rank == 2] == ["bf16"], norm.inputs
    assert "cast" in {b.op.name for b in norm.regions[0].nodes}
    want = model(x, h)
    got = cm(x, h)
    assert got.dtype == torch.bfloat16
    assert float((got.float() - want.float()).abs().max()) <= 0.02 * max(1.0, float(want.float().abs().max()))
