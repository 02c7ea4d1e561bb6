"""A generated kernel's tiling parameters (``rows``, ``to``, ``tm``, ``bq``, ...) change how the
work is cut, never what is computed: the schedule stage's tile search picks them by simulated time
alone, so a value that computed something else would reach the program unchecked until the
schedule's own check. Here every tiling parameter of every generated kernel of a few models is
tried at other values the search would try, each run in the kernel-language interpreter against
the same kernel at its defaults.

Found this way: a convolution whose stride does not divide the input (a 1x1, stride-2
convolution of a 7x7 image, as in BiT's downsampling) read one input row per band whatever
``rows`` said, so a search that widened the bands computed garbage.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fexplore
from fexplore.ir.interpreter import evaluate_node
from fexplore.models import ZOO
from fexplore.pipeline.stages.tiles import FACTORS, tile_params


class _Convs(torch.nn.Module):
    """Strides that do and do not divide the input, padding, groups and a depthwise convolution."""

    def __init__(self):
        super().__init__()
        self.down = torch.nn.Conv2d(8, 16, 1, stride=2, bias=False)              # 7x7 -> 4x4
        self.conv = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)               # 7x7 -> 4x4
        self.conv2 = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.dw = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.grouped = torch.nn.Conv2d(16, 16, 3, padding=2, dilation=2, groups=4)

    def forward(self, x):
        # BiT's downsampling: a residual branch's stride-1 convolution added to a 1x1 stride-2 one
        y = self.conv2(torch.relu(self.conv(x))) + self.down(x)
        return self.grouped(torch.nn.functional.gelu(self.dw(y)))


def _convs():
    return _Convs().eval(), (torch.randn(2, 8, 7, 7),)


MODELS = {"convs": _convs, "gpt": ZOO["gpt"], "cnn": ZOO["cnn"]}


def _node_inputs(graph, inputs):
    env = {v.name: np.asarray(a) for v, a in zip(graph.inputs, inputs)}
    env.update({c.name: c.payload for c in graph.constants})
    for node in graph.nodes:
        outs = evaluate_node(node, [env[v.name] for v in node.inputs])
        env.update({v.name: np.asarray(a) for v, a in zip(node.outputs, outs)})
        yield node, [env[v.name] for v in node.inputs]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_tiling_parameters_never_change_what_a_kernel_computes(name):
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    ex = fexplore.explore(model, inputs, target="tiny", verify=False)
    while ex.step().name != "lower":
        pass
    low, graph = ex["lower"].lowering, ex["lower"].graph()
    by_node = {id(x.node): x for x in low.nodes if x.how == "generated"}
    arrays = [x.numpy() for x in inputs]
    tried = 0
    for node, ins in _node_inputs(graph, arrays):
        x = by_node.get(id(node))
        if x is None:
            continue
        default = tile_params(x.traced)
        args = x.kernel.arguments(ins)
        want = x.traced(*args, target=x.kernel.target)
        want = want if isinstance(want, tuple) else (want,)
        for p, v in default.items():
            for value in sorted({max(1, int(v * f)) for f in FACTORS} | {1} - {v}):
                try:
                    got = x.traced(*args, target=x.kernel.target, **{p: value})
                except fexplore.errors.FexploreError:
                    continue   # does not fit or does not divide: not a candidate, and said so
                got = got if isinstance(got, tuple) else (got,)
                tried += 1
                for g, w in zip(got, want):
                    np.testing.assert_allclose(
                        np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=1e-5, atol=1e-5,
                        err_msg=f"{x.name}: {p}={value} (default {v}) computes something else")
    assert tried > 0


def test_kernels_of_identical_layers_share_one_tile_search():
    """Layer 0's and layer 1's kernels differ only in names: one canonical source, one search
    (a 12-layer model searched each layer's kernels anew, most of its compile time)."""
    from fexplore.lang.codegen.source import canonical_source

    torch.manual_seed(0)
    model, inputs = ZOO["gpt"]()
    cm = fexplore.compile(model, inputs, verify=False)
    by_name = {k.name: k for k in cm.kernels}
    for name in ("h_0_mlp_c_fc", "h_0_attn"):
        a, b = by_name[name], by_name[name.replace("h_0", "h_1")]
        assert a.source != b.source and canonical_source(a.source) == canonical_source(b.source)
        assert canonical_source(a.source.replace("1e-05", "1e-06")) != canonical_source(a.source) or \
            "1e-05" not in a.source
    tiles = {t.kernel: t for t in cm.schedule.tiles}
    assert tiles["h_1_mlp_c_fc"].chosen == tiles["h_0_mlp_c_fc"].chosen
    assert tiles["h_1_mlp_c_fc"].same_as == "h_0_mlp_c_fc" and not tiles["h_0_mlp_c_fc"].same_as


def test_a_tile_search_never_grows_a_buffer_past_the_programs_share(monkeypatch):
    """Alone, a kernel streams faster in fewer, bigger tiles; in a whole program, tiles over a
    sixteenth of a PE's SRAM fragment it until placement fails and the schedule stage rebuilds
    the program, step after step (a decode step's lm_head did that at every residency share).
    The search drops such candidates; without the rule it would have taken one."""
    from fexplore import lang as fl
    from fexplore.lang.examples._tiling import max_tile_bytes
    from fexplore.npu import get_target
    from fexplore.pipeline.stages import tiles

    cfg = get_target("tiny")
    cap = max_tile_bytes(cfg)

    @fl.kernel(target="tiny")
    def doubled(x: fl.f32[64, 2048], *, tn: int = 128):
        out = fl.output((64, 2048), fl.f32)
        for rs, cs in fl.parallel(fl.tiles(64, 8), fl.tiles(2048, tn), stages=2):
            fl.store(out[rs, cs], fl.load(x[rs, cs]) * 2.0)
        return out

    x = np.ones((64, 2048), np.float32)
    assert 8 * 128 * 4 <= cap < 8 * 512 * 4   # the default fits the share, 4x the default does not

    def search(key):
        tiles._MEASURED.clear()
        return tiles.TileSearch(cfg).trace("doubled", doubled, (x,), key)[1]

    choice = search("capped")
    assert 8 * choice.chosen["tn"] * 4 <= cap
    over = [c for p, c in choice.candidates if 8 * p["tn"] * 4 > cap]
    assert over and all(c is None for c in over)
    monkeypatch.setattr(tiles, "max_tile_bytes", lambda cfg: 1 << 40)
    unbounded = search("unbounded")
    assert 8 * unbounded.chosen["tn"] * 4 > cap, unbounded   # the rule is what stops it


def test_a_decode_steps_gemv_tiles_stay_within_the_share():
    """A GEMV (one row) takes wide weight tiles, whose loads amortize their start-up, but none
    over `max_tile_bytes`: a Llama-3-8B lm_head panel is 4 MB on rngd and 32 MB fused by 4."""
    from fexplore.lang.examples._tiling import amortizing_bytes, max_tile_bytes, panel_tiles
    from fexplore.npu import get_target

    for cfg in (get_target("rngd"), get_target("rngd").fused(4)):
        tm, tp, tn, tk = panel_tiles(1, 128256, 4096, 2, cfg, "bf16", 2)
        assert amortizing_bytes(cfg) <= tn * tk * 2 <= max_tile_bytes(cfg), (cfg.name, tn, tk)


def test_tile_extents_are_read_from_the_kernels_tiles_calls():
    """The search bounds each parameter by the axis it cuts: a literal, a name bound to literals,
    or another parameter's tiles; a shape it cannot read, or two axes of different extents, leave
    the parameter unbounded."""
    from fexplore import lang as fl
    from fexplore.pipeline.stages.tiles import tile_extents

    @fl.kernel(target="tiny")
    def cut(x: fl.f32[64, 96], *, rows: int = 16, cols: int = 32, tc: int = 8, free: int = 4, two: int = 8):
        R, C = 64, 96
        out = fl.output((64, 96), fl.f32)
        for rs, cs in fl.parallel(fl.tiles(R, rows), fl.tiles(C, cols), stages=2):
            for c2 in fl.range(fl.tiles(cs, tc)):
                fl.store(out[rs, c2], fl.load(x[rs, c2]) * 2.0)
        for _ in fl.range(fl.tiles(x.shape[0], free)):
            pass
        for _ in fl.range(fl.tiles(64, two)):
            pass
        for _ in fl.range(fl.tiles(32, two)):
            pass
        return out

    assert tile_extents(cut) == {"rows": 64, "cols": 96, "tc": 32}
    assert tile_extents(cut, {"cols": 48}) == {"rows": 64, "cols": 96, "tc": 48}
    x = np.arange(64 * 96, dtype=np.float32).reshape(64, 96)
    np.testing.assert_array_equal(cut(x), 2 * x)


def test_a_tile_search_traces_no_tile_past_its_axis():
    """A tile past the axis it cuts (tm = 1024 of 512 rows), or a panel's column tile past its panel
    (tn > tp), cuts what the whole axis does: the program of a candidate already timed, traced
    again. A third of a GPT-2 projection's candidates were such; now they take their slot
    untraced, so the search tries the same parameters and chooses the same tiles for less."""
    from fexplore.pipeline.stages.tiles import IN_PROGRAM_ONLY, tile_extents

    torch.manual_seed(0)
    model = torch.nn.Linear(3072, 768).eval()
    cm = fexplore.compile(model, (torch.randn(512, 3072),), target="rngd", precision="bf16")
    k = next(x for x in cm.kernels if x.kernel.kind == "contraction")
    choice = next(t for t in cm.schedule.tiles if t.kernel == k.name)
    assert {"tm", "tn", "tk"} <= set(tile_extents(k.traced))
    searched = [p for p in choice.default if p not in IN_PROGRAM_ONLY]
    assert len(choice.candidates) > 2
    for c, _ in choice.candidates:
        bounds = tile_extents(k.traced, c)
        assert all(c[p] <= bounds[p] for p in searched if p in bounds), c
    # the search still tries the rows and the panel at other sizes
    for p in ("tm", "tp"):
        assert {c[p] for c, _ in choice.candidates} != {choice.default[p]}, p
    assert choice.cycles <= choice.default_cycles
