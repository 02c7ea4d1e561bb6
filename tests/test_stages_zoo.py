"""Acceptance for the graph stages on every zoo model: each verifies (structure and numbers
against eager), round-trips through text, and is idempotent; fusion makes the regions the
models call for."""

import pytest
import torch

from fexplore import ir
from fexplore.models import ZOO
from fexplore.pipeline import GRAPH_STAGES

STAGE_NAMES = ["ingest", "fold", "simplify", "shapes", "layout", "fusion", "precision", "lower",
               "schedule"]


def test_stage_order_is_designs():
    assert ["ingest"] + [s.name for s in GRAPH_STAGES] == STAGE_NAMES


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_stage_verifies_and_is_idempotent(name, zoo_compiled):
    _, _, cm = zoo_compiled(name)
    assert [r.name for r in cm.stages] == STAGE_NAMES
    by_name = {s.name: s for s in GRAPH_STAGES}
    for rec in cm.stages:
        assert rec.verification.ok, (rec.name, rec.verification)
        if rec.name == "ingest":
            continue
        again = by_name[rec.name].run(rec.after, cm.options).graph
        assert ir.graph_diff(rec.after, again) is None, f"{rec.name} is not idempotent"


def _regions(g, kind=None):
    return [n for n in g.nodes if n.op.name == "region" and (kind is None or
                                                              n.attrs["kind"] == kind)]


def _region_of(g):
    """value name -> the region node computing it (top-level values only)."""
    out = {}
    for n in _regions(g):
        for m in n.regions[0].nodes:
            for v in m.outputs:
                out[v.name] = n
    return out


@pytest.mark.parametrize("name, layers", [("gpt", 2), ("llama", 2), ("vit", 2), ("vla", 2)])
def test_one_attention_region_per_layer(name, layers, zoo_compiled):
    g = _stage(zoo_compiled, name, "fusion")
    att = _regions(g, "attention")
    assert len(att) == layers
    for r in att:
        body_ops = [n.op.name for n in r.regions[0].nodes]
        assert "softmax" in body_ops or "attention" in body_ops
    if name == "llama":  # rotary embedding on q and k rides inside the attention region
        for r in att:
            ops = [n.op.name for n in r.regions[0].nodes]
            assert ops.count("neg") == 2 and ops.count("concat") >= 2


def _stage(zoo_compiled, name, stage):
    cm = zoo_compiled(name)[2]
    return next(r for r in cm.stages if r.name == stage).after


@pytest.mark.parametrize("name", ["gpt", "llama", "vit", "vla", "cnn", "mlp"])
def test_contractions_carry_their_epilogues(name, zoo_compiled):
    """Every linear/conv whose result goes only to an elementwise op (bias, activation,
    residual add, gating) is fused with that op."""
    before = _stage(zoo_compiled, name, "layout")
    after = _stage(zoo_compiled, name, "fusion")
    users = before.users()
    where = _region_of(after)
    checked = 0
    for n in before.nodes:
        if n.op.name not in ("linear", "conv2d"):
            continue
        us = users.get(n.output.name, [])
        if len(us) == 1 and us[0].op.category == ir.Category.elementwise:
            assert n.output.name in where, f"{n.name} not fused"
            assert us[0].output.name in where and where[us[0].output.name] is \
                where[n.output.name], f"{n.name} and its epilogue {us[0].name} are apart"
            checked += 1
    assert checked >= 2


@pytest.mark.parametrize("name", ["gpt", "llama", "vit"])
def test_norms_are_fused(name, zoo_compiled):
    after = _stage(zoo_compiled, name, "fusion")
    top_ops = [n.op.name for n in after.nodes]
    assert "layer_norm" not in top_ops and "rms_norm" not in top_ops
    assert "mean" not in top_ops  # llama's written-out RMSNorm (pow, mean, rsqrt) included


def test_gpt_traffic_after_fusion_is_near_compulsory(zoo_compiled):
    stats = next(r for r in zoo_compiled("gpt")[2].stages if r.name == "fusion").stats
    assert stats["dram_bytes_after"] < stats["dram_bytes_before"]
    assert stats["dram_bytes_after"] <= 1.5 * stats["dram_bytes_compulsory"]


def test_cnn_batch_norms_fold_into_convolutions_and_layouts_propagate(zoo_compiled):
    cm = zoo_compiled("cnn")[2]
    fold = next(r for r in cm.stages if r.name == "fold")
    assert fold.stats["conv_batchnorm_folded"] >= 4
    assert "batch_norm" not in fold.after.op_counts()
    layout = next(r for r in cm.stages if r.name == "layout")
    assert layout.stats["layout_conversions"] < layout.stats["layout_conversions_naive"]
    assert layout.stats["layout_conversions"] <= 2  # into channels-last once, out once


class _DenseBlock(torch.nn.Module):
    """A DenseNet block (each convolution reads the concatenation of every feature map before it,
    along the channels) with a ShuffleNet split of the channels and a padded map on the way."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.one = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.two = torch.nn.Conv2d(16, 8, 3, padding=1)
        self.narrow = torch.nn.Conv2d(12, 4, 1)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        a = torch.relu(self.one(x))
        b = torch.relu(self.two(torch.nn.functional.pad(torch.cat([x, a], 1), (1, 1, 1, 1))[:, :, 1:-1, 1:-1]))
        left, right = torch.cat([x, a, b], 1).chunk(2, dim=1)
        y = torch.cat([left, torch.relu(self.narrow(right))], 1)
        return self.head(y.mean((2, 3)))


@pytest.mark.parametrize("target,precision", [("rngd", "fp32"), ("tiny", "bf16")])
def test_feature_maps_stay_channels_last_through_concat_split_slice_and_pad(target, precision):
    """Box copies (concat, split, slice, pad) take their operands' layout: the block converts into
    channels-last once, at its input, and out once, for the mean; it was 7 conversions when each
    of them read and wrote the default layout."""
    import fexplore

    torch.manual_seed(0)
    model, x = _DenseBlock().eval(), torch.randn(1, 3, 12, 12)
    cm = fexplore.compile(model, (x,), target=target, precision=precision)
    layout = next(r for r in cm.stages if r.name == "layout")
    boxes = [n for n in layout.after.nodes if n.op.name in ("concat", "split", "slice", "pad")]
    assert {n.op.name for n in boxes} == {"concat", "split", "slice", "pad"}
    for n in boxes:
        assert all(v.type.layout is not None for v in (*n.inputs, *n.outputs)), n
    assert layout.stats["layout_conversions"] == 2, layout.after
    assert cm.verification["ok"].all(), cm.verification
    with torch.no_grad():
        want = model(x)
    tol = dict(rtol=1e-5, atol=1e-5) if precision == "fp32" else dict(rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(cm(x), want, **tol)
