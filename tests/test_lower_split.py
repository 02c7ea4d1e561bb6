"""The lower stage on hand-written regions: unusual epilogues, masks and shapes through the
generator; a region no generator takes whole is split into pieces that verify; a wrong piece is
named by check_lowering; Hugging Face-style grouped-query attention (repeat_kv, rotary, an
expanded mask) is one attention kernel."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import fexplore
from fexplore.ir import Constant, DType, Graph, run
from fexplore.pipeline.stages.lower import check_lowering, lower

from test_lang_codegen import Body

TARGETS = ["rngd", "tiny"]


@pytest.fixture(autouse=True)
def _no_user_kernels():
    fexplore.unregister_kernels()
    yield
    fexplore.unregister_kernels()


def _program(node, arrays):
    """A graph of the one region node, and an oracle (the IR interpreter's outputs on the region's
    inputs and on a second, random set) for check_lowering."""
    inputs = [v for v in node.inputs if not isinstance(v, Constant)]
    consts = [v for v in node.inputs if isinstance(v, Constant)]
    g = Graph("program", inputs, consts, [node], list(node.outputs), {})
    given = [a for v, a in zip(node.inputs, arrays) if not isinstance(v, Constant)]
    rng = np.random.default_rng(7)
    other = [a if a.dtype == np.bool_ else rng.standard_normal(a.shape).astype(a.dtype) for a in given]
    sets = [given, other]
    oracle = SimpleNamespace(input_sets=sets, expected=[run(g, s) for s in sets], noise=[[0.0] * len(node.outputs)] * 2)
    return g, oracle


def _lowered(node, arrays, target):
    g, oracle = _program(node, arrays)
    low = lower(g, SimpleNamespace(target=target)).lowering
    return low, check_lowering(g, low, oracle)


# ---- regions the generator takes whole ------------------------------------------------------------

def hf_gqa_attention(S=13, heads=4, kv_heads=2, D=8, batch=1):
    """Llama-style: q, k, v projections viewed as heads, rotary embedding on q and k (halves of D
    rotated), keys and values repeated to the query heads (repeat_kv: unsqueeze, expand,
    reshape), a bool mask expanded over the heads."""
    b = Body(21)
    rep = heads // kv_heads
    xq = b.input("q_proj", (batch, S, heads * D))
    xk = b.input("k_proj", (batch, S, kv_heads * D))
    xv = b.input("v_proj", (batch, S, kv_heads * D))
    cos = b.input("cos", (batch, 1, S, D))
    sin = b.input("sin", (batch, 1, S, D))
    keep = np.tril(np.ones((S, S), bool))[None, None].repeat(batch, 0)
    mask = b.input("keep", (batch, 1, S, S), DType.bool, data=keep)

    def heads_of(x, h):
        return b("permute", b("reshape", x, shape=(batch, S, h, D)), perm=(0, 2, 1, 3))

    def rotary(x):
        lo, hi = b("slice", x, axis=3, start=0, end=D // 2), b("slice", x, axis=3, start=D // 2, end=D)
        return b("add", b("mul", x, cos), b("mul", b("concat", b("neg", hi), lo, axis=3), sin))

    def repeat_kv(x):
        x = b("expand", b("reshape", x, shape=(batch, kv_heads, 1, S, D)), shape=(batch, kv_heads, rep, S, D))
        return b("reshape", x, shape=(batch, heads, S, D))

    q = rotary(heads_of(xq, heads))
    k = repeat_kv(rotary(heads_of(xk, kv_heads)))
    v = repeat_kv(heads_of(xv, kv_heads))
    m = b("expand", mask, shape=(batch, heads, S, S))
    return b.region(b("attention", q, k, v, m, scale=D ** -0.5), kind="attention"), b.arrays


def hf_gqa_attention_single_kv_head_odd():
    return hf_gqa_attention(S=37, heads=3, kv_heads=1, D=6, batch=2)


def written_out_gqa_attention_softcapped():
    """Gemma-2-style eager attention: rotary q and k, repeat_kv, kᵀ as a transpose of the repeated
    keys, scores scaled, soft-capped by tanh and masked additively, softmax, then · v."""
    b = Body(25)
    S, heads, kv_heads, D = 11, 4, 2, 8
    q = b.input("q", (1, heads, S, D))
    k = b.input("k", (1, kv_heads, S, D))
    v = b.input("v", (1, kv_heads, S, D))
    cos, sin = b.input("cos", (1, 1, S, D)), b.input("sin", (1, 1, S, D))
    bias = b.input("bias", (1, 1, S, S), data=np.triu(np.full((S, S), -1e9), 1)[None, None])

    def rotary(x):
        lo, hi = b("slice", x, axis=3, start=0, end=D // 2), b("slice", x, axis=3, start=D // 2, end=D)
        return b("add", b("mul", x, cos), b("mul", b("concat", b("neg", hi), lo, axis=3), sin))

    def repeat_kv(x):
        x = b("expand", b("reshape", x, shape=(1, kv_heads, 1, S, D)), shape=(1, kv_heads, 2, S, D))
        return b("reshape", x, shape=(1, heads, S, D))

    kt = b("permute", repeat_kv(rotary(k)), perm=(0, 1, 3, 2))
    s = b("mul", b("matmul", rotary(q), kt), b.const("scale", D ** -0.5))
    cap = b.const("cap", 50.0)
    s = b("add", b("mul", b("tanh", b("div", s, cap)), cap), bias)
    return b.region(b("matmul", b("softmax", s, axis=-1), repeat_kv(v)), kind="attention"), b.arrays


def heads_merged_batch1_dropped():
    """GPT-2's c_proj: attention heads (1, H, T, D) permuted and viewed as (T, H*D), the batch of 1
    dropped, into a matmul with a bias-free residual epilogue."""
    b = Body(26)
    attn = b.input("attn", (1, 3, 7, 5))
    w = b.input("c_proj.weight", (15, 11))
    res = b.input("res", (7, 11))
    x = b("reshape", b("permute", attn, perm=(0, 2, 1, 3)), shape=(7, 15))
    return b.region(b("add", b("matmul", x, w), res), kind="contraction"), b.arrays


def clip_head_batch1():
    """The pooled row of a batch-1 sequence, layer-normed and projected (CLIP/ViT heads)."""
    b = Body(22)
    x = b.input("hidden", (1, 17, 32))
    gamma, beta = b.input("ln.weight", (32,)), b.input("ln.bias", (32,))
    w = b.input("proj.weight", (15, 32))
    h = b("layer_norm", b("select", x, axis=1, index=0), gamma, beta)
    return b.region(b("linear", h, w), kind="contraction"), b.arrays


def linear_odd_sizes_masked_epilogue():
    b = Body(23)
    x = b.input("x", (1, 9, 19))
    w = b.input("fc.weight", (23, 19))
    keep = b.input("keep", (1, 9, 1), DType.bool, data=np.arange(9).reshape(1, 9, 1) % 3 > 0)
    y = b("where", keep, b("sigmoid", b("linear", x, w)), b.const("zero", 0.0))
    return b.region(b("mul", y, b.const("two", 2.0)), kind="contraction"), b.arrays


WHOLE = {f.__name__: f for f in (hf_gqa_attention, hf_gqa_attention_single_kv_head_odd, clip_head_batch1,
                                 written_out_gqa_attention_softcapped, heads_merged_batch1_dropped,
                                 linear_odd_sizes_masked_epilogue)}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(WHOLE))
def test_hand_written_regions_lower_whole_and_verify(case, target):
    node, arrays = WHOLE[case]()
    low, check = _lowered(node, arrays, target)
    (x,) = low.nodes
    assert x.how == "generated", x.reason
    assert check.ok and check.input_sets == 2 and check.kernels_run == 1, check.detail


def test_hf_gqa_attention_is_one_flash_attention_kernel():
    node, arrays = hf_gqa_attention()
    low, check = _lowered(node, arrays, "rngd")
    (k,) = low.kernels
    assert k.kind == "attention" and not low.host_ops and not low.splits
    assert "// 2" in k.source  # query head h reads key head h // 2
    assert "expand" not in k.source.split("@fl.kernel")[1]  # keys are not copied per query head


# ---- a region that must be split ------------------------------------------------------------------

def contraction_with_a_scan_in_its_epilogue():
    """linear -> gelu -> cumsum over the rows -> scale -> residual add: the scan is no epilogue
    op, so the region is a contraction piece, the scan, and an elementwise piece."""
    b = Body(24)
    x = b.input("x", (2, 11, 21))
    w = b.input("fc.weight", (13, 21))
    res = b.input("res", (2, 11, 13))
    y = b("gelu", b("linear", x, w))
    y = b("cumsum", y, axis=1)
    y = b("add", b("mul", y, b.const("scale", 0.25)), res)
    return b.region(b("tanh", y), kind="contraction"), b.arrays


@pytest.mark.parametrize("target", TARGETS)
def test_a_region_no_generator_takes_whole_lowers_as_pieces(target):
    node, arrays = contraction_with_a_scan_in_its_epilogue()
    low, check = _lowered(node, arrays, target)
    (x,) = low.nodes
    assert x.how == "split" and "cumsum" in x.reason and "through DRAM" in x.reason
    ops = [[n.op.name for n in (p.node.regions[0].nodes if p.node.op.name == "region" else [p.node])]
           for p in x.pieces]
    assert ops == [["linear", "gelu"], ["cumsum"], ["mul", "add", "tanh"]]
    assert [p.kind for p in x.pieces if p.kernel is not None][0] == "contraction"
    assert all(p.of == x.label for p in x.pieces)
    assert set(x.scratch) == {"gelu_1", "cumsum_1"}
    # what runs: the pieces, not the region
    assert low.kernels == [p for p in x.pieces if p.kernel is not None] and len(low.kernels) >= 2
    assert low.host_ops == [p for p in x.pieces if p.how == "host"]
    assert check.ok and check.kernels_run == len(low.kernels), check.detail
    assert low[x.pieces[0].name] is x.pieces[0]


def test_the_split_shows_in_the_stats_summary_and_view():
    from fexplore.pipeline.stages.lower import lowering_stats
    from fexplore.viz.lower_view import lowering_html

    node, arrays = contraction_with_a_scan_in_its_epilogue()
    g, _ = _program(node, arrays)
    res = lower(g, SimpleNamespace(target="rngd"))
    stats = lowering_stats(res.lowering)
    assert stats["split_regions"] == 1 and stats["split_pieces"] == 3
    assert "codegen_bugs" not in stats and res.lowering.codegen_bugs == []   # the split is codegen's clear refusal, not a bug
    assert stats["split"][0]["scratch"] == ["gelu_1", "cumsum_1"]
    assert "1 region(s) split into 3 pieces" in res.summary
    html = lowering_html(res.lowering)
    assert "split</span> into 3" in html and "↳" in html and "through DRAM" in html
    # the graph view marks the region and each op inside it by the piece that computes it
    from fexplore.viz.graph_view import lowering_marks

    marks = lowering_marks(res.lowering)
    (x,) = res.lowering.nodes
    assert marks[id(node)][1].startswith("split into 3 pieces")
    body = {n.op.name: n for n in node.regions[0].nodes}
    assert marks[id(body["linear"])] == marks[id(body["gelu"])] == ("kernel", f"kernel {x.pieces[0].name}")
    assert marks[id(body["cumsum"])][0] in ("host", "kernel")


def test_a_generator_bug_behind_the_fallback_is_recorded(monkeypatch):
    """A generator that raises (not a refusal) still leaves a working compile, a host op, but the
    lowering lists the bug instead of hiding it."""
    from fexplore.lang import codegen

    def broken(node, target="rngd", head_layout=None):
        raise IndexError("tuple index out of range")

    monkeypatch.setattr(codegen, "generate", broken)
    node, arrays = contraction_with_a_scan_in_its_epilogue()
    g, oracle = _program(node, arrays)
    res = lower(g, SimpleNamespace(target="rngd"))
    assert res.lowering.host_ops and not res.lowering.kernels
    bugs = res.stats["codegen_bugs"]
    assert bugs and all("codegen failed: IndexError: tuple index out of range" in b for b in bugs)
    assert bugs[0].startswith(f"region {node.regions[0].name}: ")
    assert check_lowering(g, res.lowering, oracle).ok   # the fallback itself computes right


def test_a_wrong_piece_is_named():
    node, arrays = contraction_with_a_scan_in_its_epilogue()
    # a user kernel for the last piece (the elementwise tail) that forgets the residual
    fexplore.register_kernel(lambda n: n.op.name == "region" and [m.op.name for m in n.regions[0].nodes]
                             == ["mul", "add", "tanh"], lambda y, scale, res: np.tanh(y * 0.25))
    low, check = _lowered(node, arrays, "rngd")
    (x,) = low.nodes
    assert x.how == "split" and x.pieces[-1].how == "user"
    assert not check.ok
    assert check.first_divergent == (f"kernel user_kernel (user, piece 3 of 3 of split {x.label}: "
                                     f"{x.pieces[-1].label})")


def test_a_region_split_in_a_compile_verifies_schedules_and_saves(tmp_path):
    """The zoo's Llama on tiny: its MLP regions (the RMSNorm as the gate projection's prologue,
    the up projection given back for SRAM, so the normed rows leave the region) split; the
    pieces verify, are scheduled and saved."""
    import os

    model, inputs = fexplore.models.ZOO["llama"]()
    cm = fexplore.compile(model, inputs, target="tiny", precision="bf16")
    low = cm.lowering
    assert low.splits and all(r.verification.ok for r in cm.stages)
    pieces = [p for x in low.splits for p in x.pieces if p.kernel is not None]
    assert pieces and {k.name for k in cm.kernels} >= {p.name for p in pieces}
    assert "split regions: " in cm.summary()
    if "schedule" in [r.name for r in cm.stages]:
        scheduled = {k.name for k in cm["schedule"].schedule.kernels}
        assert scheduled >= {p.name for p in pieces}
    cm.save(tmp_path, report=False)
    assert set(os.listdir(tmp_path / "kernels")) >= {f"{p.name}.py" for p in pieces}
