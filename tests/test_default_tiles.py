"""Default tile sizes: cut to fit SRAM, but no further than fitting needs.

A kernel's defaults decide how many ops its trace records (each one a Python object the lower and
schedule stages hold): tiles cut to their floors on `tiny` made a 12-layer, 1024-wide vision
transformer trace tens of millions of ops, and its compile ran out of memory. Each check below
fails on the old choice (the sizes it shrank to are passed explicitly and set against the default).
"""

from __future__ import annotations

import random

import numpy as np
import torch

import fexplore
from fexplore import lang as fl
from fexplore.lang.examples._tiling import shrink


def test_shrink_fits_and_gives_back_every_cut_it_did_not_need():
    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(1, 4)
        start = [rng.choice([1, 4, 9, 16, 64, 100, 512, 1024]) for _ in range(n)]
        floors = [min(s, rng.choice([1, 4, 8])) for s in start]
        # a footprint that grows with every size, some terms products of two (a tile's area)
        terms = [(rng.randrange(n), rng.randrange(n), rng.randint(1, 8)) for _ in range(rng.randint(1, 4))]
        budget = rng.randint(1, 4 * max(start) ** 2)

        def fits(*s, terms=terms, budget=budget):
            return sum(w * s[i] * (s[j] if j != i else 1) for i, j, w in terms) <= budget

        got = shrink(start, fits, floors)
        assert all(f <= g <= s for f, g, s in zip(floors, got, start)), (start, floors, got)
        if not fits(*got):   # only when nothing can shrink further
            assert got == floors, (start, floors, got)
            continue
        for i, g in enumerate(got):   # maximal: no size it cut doubles (to its start) and still fits
            if g < start[i]:
                grown = got[:i] + [min(start[i], 2 * g)] + got[i + 1:]
                assert not fits(*grown), (start, floors, got, i)


def _lowered(model, x):
    """The model's kernels on tiny in bf16, through `lower`: every stage so far verified against
    eager, each kernel against its region (what these checks are about ends there; scheduling the
    tens of thousands of commands of the old tiles would double the test's time)."""
    ex = fexplore.explore(model, (x,), target="tiny", precision="bf16")
    lowering = ex["lower"].lowering
    assert all(r.verification.ok for r in ex.records), [(r.name, r.verification) for r in ex.records]
    assert ex["lower"].verification.kernels is not None   # the kernels themselves were run
    kernels = lowering.kernels
    assert len(kernels) >= 1 and all(k.how == "generated" for k in kernels)
    return kernels


def _ops(kernel, node, **params) -> int:
    zeros = [np.zeros(tuple(v.type.shape), v.type.dtype.numpy) for v in node.inputs]
    k = kernel.kernel()
    return len(k.trace(*kernel.arguments(zeros), target=kernel.target, **params).ops)


def test_a_vision_transformers_projection_on_tiny_keeps_whole_panels_of_weights():
    # a 9-token, 1024-wide projection: the row slabs (rows x whole K) fill the budget, so only
    # the rows should shrink; the column and K tiles were cut to 8 x 8 first
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 1024).eval()
    kernels = _lowered(model, torch.randn(1, 9, 1024))
    k = next(k for k in kernels if k.kind == "contraction")
    default = _ops(k.kernel, k.node)
    old = _ops(k.kernel, k.node, tm=4, tn=8, tk=8)
    assert default * 8 < old, (default, old)


def test_a_convolution_of_many_channels_on_tiny_keeps_a_wide_output_tile():
    # 256 input channels: a patch of every channel does not fit, so the channels are tiled; the
    # rows and output channels had been cut (to 1 and 4) before that, and were never given back
    torch.manual_seed(0)
    model = torch.nn.Conv2d(256, 128, 3, padding=1).eval()
    kernels = _lowered(model, torch.randn(1, 256, 8, 8))
    k = next(k for k in kernels if k.kind == "convolution")
    default = _ops(k.kernel, k.node)
    old = _ops(k.kernel, k.node, rows=1, to=4, tc=64)
    assert default * 1.5 < old, (default, old)


def test_a_row_wise_kernel_takes_two_tiles_per_pe_only_when_each_amortizes_its_loads():
    """Two row tiles per PE let a PE's loads overlap its computes, but each tile's loads and store
    cost a whole DMA start-up: a tile of a few rows (a small GPT's embedding add, rows of 64) is
    faster as one tile per PE, a tile of many wide rows still splits."""
    from fexplore.lang.examples._tiling import amortizing_bytes, row_tiles
    from fexplore.models import ZOO
    from fexplore.npu import get_target
    from fexplore.pipeline.stages.tiles import tile_params

    cfg = get_target("rngd")
    small = row_tiles(16, 64 * 4 * 3, cfg, 2)
    assert -(-16 // small) == cfg.num_pes   # one tile per PE, not two of one row
    wide = 768 * 4 * 3   # a layer norm's 512 rows at width 768: tiles of 28 rows, 258 KB
    rows = row_tiles(512, wide, cfg, 2)
    assert -(-512 // rows) >= 2 * cfg.num_pes and rows * wide >= amortizing_bytes(cfg)
    rows = row_tiles(128, wide, cfg, 2)   # 128 of them: two tiles per PE would be 73 KB each
    assert -(-128 // rows) == cfg.num_pes

    torch.manual_seed(0)
    model, inputs = ZOO["gpt"]()
    cm = fexplore.compile(model, inputs, verify=False)
    k = next(k for k in cm.lowering.kernels if k.kernel.kind == "vector" and "rows" in tile_params(k.kernel.kernel()))
    kern = k.kernel.kernel()
    specs = [fl.spec(p.shape, k.node.inputs[p.index].type.dtype.name) for p in k.kernel.params]
    default = tile_params(kern)["rows"]

    def cycles(**tiles):
        return kern.trace(*specs, target="rngd", **tiles).program().simulate().cycles

    assert default > 1 and cycles() < cycles(rows=default // 2)
