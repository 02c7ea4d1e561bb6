"""Data movement, reductions over any axes, scans, topk/sort and pooling as generated kernels
(`fexplore.lang.codegen` movement.py, reduce.py, pool.py): small models whose op stays a plain op
after fusion compile on both targets and precisions with no host op for it, a kernel of the right
kind, and a verification that passes every stage (the lower stage runs each kernel in the
kernel-language interpreter against the IR interpreter). Odd sizes, batch 1, size-1 axes and 0-d
results throughout; `tiny`'s SRAM forces real tiling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fexplore
from fexplore.lang import codegen
from fexplore.lang.codegen import UnsupportedRegionError
from variants import compile_variant, matrix_params

TARGETS = ["rngd", "tiny"]


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def r(*shape):
    return torch.randn(*shape)


# name: (function, inputs, op, kernel kind)
CASES = {
    # movement.py
    "slice": (lambda x: x[:, 3:8], (r(2, 11, 7),), "slice", "movement"),
    "slice_last": (lambda x: x[..., 1:6], (r(3, 1, 9),), "slice", "movement"),
    "slice_step_walked": (lambda x: x[:, 1:10:3], (r(2, 11, 7),), "slice", "movement"),
    "slice_step_view": (lambda x: x[..., 1::2], (r(3, 5, 8),), "slice", "movement"),
    "select": (lambda x: x[:, 4], (r(3, 11, 7),), "select", "movement"),
    "select_0d": (lambda x: x[4], (r(11),), "select", "movement"),
    "split": (lambda x: x.split([3, 5, 3], dim=1), (r(2, 11, 7),), "split", "movement"),
    "slice_scatter": (lambda x, v: torch.slice_scatter(x, v * 2, dim=1, start=2, end=5), (r(3, 7, 5), r(3, 3, 5)),
                      "slice_scatter", "movement"),
    "slice_scatter_edge": (lambda x, v: torch.slice_scatter(x, v, dim=-1, start=0, end=2), (r(4, 6), r(4, 2)),
                           "slice_scatter", "movement"),
    # a step: the axis as (12 / 4, 4), the values one column of it; then rows around the values
    "slice_scatter_step": (lambda x, v: torch.slice_scatter(x, v * 2, dim=1, start=1, step=4), (r(2, 12, 5), r(2, 3, 5)),
                           "slice_scatter", "movement"),
    "slice_scatter_step_rows": (lambda x, v: torch.slice_scatter(x, v, dim=1, start=4, end=10, step=3),
                                (r(3, 15, 4), r(3, 2, 4)), "slice_scatter", "movement"),
    # a step that does not divide the axis (an interleaved rotary embedding's x[..., 1:6:3] = v):
    # a box per position and per gap, the last position the axis's last element too
    "slice_scatter_step_uneven": (lambda x, v: torch.slice_scatter(x, v, dim=-1, start=1, end=6, step=3),
                                  (r(1, 8, 8), r(1, 8, 2)), "slice_scatter", "movement"),
    "slice_scatter_step_to_the_end": (lambda x, v: torch.slice_scatter(x, v - 1, dim=0, step=3), (r(7, 3), r(3, 3)),
                                      "slice_scatter", "movement"),
    "split_last": (lambda x: x.chunk(3, dim=-1), (r(1, 5, 9),), "split", "movement"),
    "concat": (lambda x, y: torch.cat([x, y], dim=1), (r(2, 3, 7), r(2, 5, 7)), "concat", "movement"),
    "concat_last": (lambda x, y: torch.cat([x, y, x], dim=-1), (r(5, 3), r(5, 1)), "concat", "movement"),
    "pad": (lambda x: F.pad(x, (1, 2, 3, 0), value=1.5), (r(2, 3, 5, 7),), "pad", "movement"),
    "pad_last": (lambda x: F.pad(x, (0, 5)), (r(1, 7),), "pad", "movement"),
    "expand": (lambda x: x.expand(3, 5, 7), (r(3, 1, 7),), "expand", "movement"),
    "expand_new_axes": (lambda x: x.expand(2, 5, 4, 9), (r(5, 1, 1),), "expand", "movement"),
    "expand_long_row": (lambda x: x.expand(3, 700), (r(3, 1),), "expand", "movement"),
    # reduce.py
    "sum_middle": (lambda x: x.sum(dim=1), (r(2, 11, 7),), "sum", "reduction"),
    "mean_hw": (lambda x: x.mean(dim=(2, 3), keepdim=True), (r(2, 3, 5, 7),), "mean", "reduction"),
    "amax_first": (lambda x: x.amax(dim=0), (r(5, 3, 7),), "amax", "reduction"),
    "sum_all_0d": (lambda x: x.sum(), (r(5, 3, 7),), "sum", "reduction"),
    "sum_long": (lambda x: x.sum(dim=0), (r(300, 9),), "sum", "reduction"),
    "var_middle": (lambda x: x.var(dim=1), (r(2, 11, 7),), "var", "reduction"),
    "var_all_long": (lambda x: x.var(), (r(4, 301),), "var", "reduction"),
    "prod": (lambda x: x.prod(dim=-1), (torch.rand(4, 6) + 0.5,), "prod", "reduction"),
    "argmax_last": (lambda x: x.argmax(dim=-1), (r(3, 37),), "argmax", "reduction"),
    "argmin_middle": (lambda x: x.argmin(dim=1), (r(3, 37, 5),), "argmin", "reduction"),
    "argmax_flat": (lambda x: x.argmax(), (r(3, 37, 5),), "argmax", "reduction"),
    "argmax_long": (lambda x: x.argmax(dim=-1), (r(2, 1000),), "argmax", "reduction"),
    "cumsum": (lambda x: x.cumsum(dim=-1), (r(3, 13),), "cumsum", "reduction"),
    "cumprod_first": (lambda x: x.cumprod(dim=0), (torch.rand(5, 3) + 0.5,), "cumprod", "reduction"),
    "logcumsumexp_wide": (lambda x: torch.logcumsumexp(x * 60, dim=1),
                          (torch.where(torch.arange(7) == 2, float("-inf"), r(3, 7, 4).transpose(1, 2)),),
                          "logcumsumexp", "reduction"),
    "cummax_with_nan": (lambda x: torch.cummax(x, dim=-1), (torch.tensor([[3.0, 2, 3, float("nan"), 4, 1],
                                                                         [1.0, 1, 0, 2, 2, 5]]),), "cummax", "reduction"),
    "cummin_first": (lambda x: torch.cummin(x, dim=0), (r(7, 3),), "cummin", "reduction"),
    "topk": (lambda x: x.topk(3, dim=-1), (r(5, 17),), "topk", "reduction"),
    "topk_with_infinities": (lambda x: x.topk(4, dim=-1), (torch.tensor([[1.0, float("-inf"), 2, float("-inf"), 0],
                                                                        [float("inf"), 3, float("-inf"), 1, 2]]),),
                             "topk", "reduction"),
    "topk_smallest_middle": (lambda x: x.topk(2, dim=1, largest=False), (r(5, 17, 3),), "topk", "reduction"),
    "sort_descending": (lambda x: x.sort(dim=-1, descending=True), (r(4, 9),), "sort", "reduction"),
    "sort_first_axis": (lambda x: torch.sort(x, dim=0), (r(9, 4),), "sort", "reduction"),
    # a rank sort: longer than one tile of comparisons on tiny, ties kept in order (stable), NaN
    # last ascending and first descending, integers
    "sort_long": (lambda x: x.sort(dim=-1), (r(2, 300),), "sort", "reduction"),
    "sort_ties_stable_middle": (lambda x: torch.sort(x, dim=1, stable=True),
                                (torch.randint(0, 4, (3, 50, 5)).float(),), "sort", "reduction"),
    "sort_nan_descending": (lambda x: torch.sort(x, dim=-1, descending=True, stable=True),
                            (torch.where(torch.arange(40) % 7 == 0, float("nan"), r(2, 40)),), "sort", "reduction"),
    "sort_nan_ascending": (lambda x: torch.sort(x, dim=-1, stable=True),
                           (torch.where(torch.arange(40) % 7 == 0, float("nan"), r(2, 40)),), "sort", "reduction"),
    "argsort_ints": (lambda x: torch.argsort(x, dim=-1, stable=True), (torch.randint(0, 8, (2, 300)),), "sort",
                     "reduction"),
    # softmax over an axis that is not the last (ConvBERT's span weights: (tokens, kernel, 1))
    "softmax_middle": (lambda x: x.softmax(dim=1), (r(4, 7, 5),), "softmax", "reduction"),
    "softmax_trailing_unit_axis": (lambda x: x.softmax(dim=1), (r(48, 3, 1),), "softmax", "reduction"),
    "log_softmax_first": (lambda x: F.log_softmax(x, dim=0), (r(6, 9),), "log_softmax", "reduction"),
    "global_avg_pool": (lambda x: F.adaptive_avg_pool2d(x, 1), (r(2, 5, 7, 7),), "adaptive_avg_pool2d",
                        "reduction"),
    # pool.py
    "max_pool_k3s2p1": (lambda x: F.max_pool2d(x, 3, 2, 1), (r(2, 3, 12, 10),), "max_pool2d", "pooling"),
    "max_pool_odd_rows": (lambda x: F.max_pool2d(x, 2), (r(1, 3, 7, 6),), "max_pool2d", "pooling"),
    "max_pool_ceil": (lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True), (r(1, 2, 8, 8),), "max_pool2d", "pooling"),
    "max_pool_dilated": (lambda x: F.max_pool2d(x, 2, 1, dilation=2), (r(1, 2, 7, 9),), "max_pool2d", "pooling"),
    "avg_pool": (lambda x: F.avg_pool2d(x, 2), (r(2, 3, 8, 6),), "avg_pool2d", "pooling"),
    "avg_pool_padded": (lambda x: F.avg_pool2d(x, 3, 1, 1), (r(2, 3, 5, 7),), "avg_pool2d", "pooling"),
    "adaptive_avg_pool": (lambda x: F.adaptive_avg_pool2d(x, (2, 3)), (r(2, 5, 6, 9),), "adaptive_avg_pool2d",
                          "pooling"),
    # PSPNet's and UperNet's pyramid pooling: bins that do not divide the map (16 into 3 and 6
    # overlapping bins), and a 1x1 map spread over 6x6 bins (once on the host, FK190)
    "adaptive_avg_pool_unequal_bins": (lambda x: F.adaptive_avg_pool2d(x, (3, 6)), (r(2, 5, 16, 16),),
                                       "adaptive_avg_pool2d", "pooling"),
    "adaptive_avg_pool_more_bins_than_rows": (lambda x: F.adaptive_avg_pool2d(x, (7, 3)) * 2,
                                              (r(1, 300, 5, 7),), "adaptive_avg_pool2d", "pooling"),
    "adaptive_avg_pool_from_one_cell": (lambda x: F.adaptive_avg_pool2d(x, 6), (r(1, 8, 1, 1),),
                                        "adaptive_avg_pool2d", "pooling"),
    # the indices read: by unpooling; returned, over small integers (ties: the first in the window
    # wins), dilated, padded and ceil_mode; and the 3-d pool's two passes
    "max_pool_indices_unpooled": (lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2),
                                  (r(2, 3, 8, 6),), "max_pool2d_with_indices", "pooling"),
    "max_pool_indices_ties_dilated": (lambda x: F.max_pool2d(x, 3, 2, 1, dilation=2, ceil_mode=True,
                                                             return_indices=True),
                                      (torch.randint(0, 3, (2, 3, 11, 9)).float(),),
                                      "max_pool2d_with_indices", "pooling"),
    "max_pool3d_indices": (lambda x: F.max_pool3d(x, (2, 3, 3), (2, 2, 2), (1, 1, 1), return_indices=True),
                           (r(1, 2, 5, 9, 7),), "max_pool2d_with_indices", "pooling"),
}


# each case on both targets and in both precisions: all four variants under `make test-full`, two
# under `make test` (`variants.matrix`)
PLAIN_OPS = matrix_params(sorted(CASES))


@pytest.mark.parametrize("case, target, precision", PLAIN_OPS)
def test_plain_op_becomes_a_kernel(case, target, precision):
    fn, inputs, op, kind = CASES[case]
    cm = compile_variant(("movement", case), lambda: fexplore.explore(Fn(fn), inputs),
                         target=target, precision=precision)
    low = cm.stages[-1].lowering
    assert not [(x.op, x.reason) for x in low.host_ops if x.op == op], low.host_ops
    made = [k for k in low.kernels if k.node.op.name == op]
    assert made and all(k.kind == kind for k in made), [(k.node.op.name, k.kind) for k in low.kernels]
    assert bool(cm.verification["ok"].all()), cm.verification


@pytest.mark.parametrize("target", TARGETS)
def test_max_pool_indices_of_nan_windows_are_torchs(target):
    """A NaN is a window's maximum, and torch's kernel keeps the last NaN it meets (it takes a value
    that is greater or NaN); among equal values the first. The kernel and the IR's reference both
    give eager's values and indices, NaNs in the example inputs included."""
    x = torch.randint(0, 3, (1, 2, 6, 7)).float()
    x[0, 0, 0, 1] = x[0, 0, 1, 0] = x[0, 1, 4, 4] = float("nan")   # two NaNs in one window, one alone
    fn = Fn(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True))
    cm = fexplore.compile(fn, (x,), target=target)
    assert not cm.lowering.host_ops and bool(cm.verification["ok"].all())
    (values, where), (want_values, want_where) = cm(x), fn(x)
    assert torch.equal(where, want_where) and torch.isnan(want_values).any()
    torch.testing.assert_close(values, want_values, equal_nan=True)


def _lowered(fn, inputs, op, target="tiny"):
    cm = fexplore.compile(Fn(fn), inputs, target=target, precision="fp32", verify=False)
    low = cm.stages[-1].lowering
    return next(x for x in low.nodes if x.node.op.name == op)


@pytest.mark.parametrize("case", ["slice_step_walked", "pad", "argmax_long", "topk", "max_pool_k3s2p1",
                                  "slice_scatter_step_rows", "slice_scatter_step_uneven"])
def test_check_kernel_on_fresh_inputs(case):
    """The generated kernel equals its node on inputs the compile never saw, and the source says
    where the op came from."""
    fn, inputs, op, _ = CASES[case]
    x = _lowered(fn, inputs, op)
    gk = x.kernel
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(tuple(v.type.shape)).astype(np.float32) for v in x.node.inputs]
    assert codegen.check_kernel(x.node, gk, arrays).ok
    assert "test_codegen_movement.py" in gk.source and "@fl.kernel" in gk.source


def test_a_rank_sort_that_breaks_ties_the_wrong_way_is_caught():
    """The stable tie-break (an equal element goes first only if it comes earlier) matters: with
    it reversed, sorting a row with repeated values gives wrong indices, and the check says so."""
    import dataclasses

    fn, inputs, op, _ = CASES["sort_ties_stable_middle"]
    x = _lowered(fn, inputs, op)
    arrays = [np.random.default_rng(3).integers(0, 4, (3, 50, 5)).astype(np.float32)]
    assert codegen.check_kernel(x.node, x.kernel, arrays).ok
    wrong = dataclasses.replace(x.kernel, source=x.kernel.source.replace("jrow < ii", "jrow > ii"))
    assert wrong.source != x.kernel.source and not codegen.check_kernel(x.node, wrong, arrays).ok


def test_a_sort_longer_than_a_row_of_comparisons_compares_in_chunks():
    """A (rows, tile, K) comparison against the whole axis overflowed the SRAM once K passed about
    800 elements on tiny (a codegen bug, fuzz seed 1731088, argsort of 1025): the axis is now
    compared against in chunks that fit, each chunk's count added into the place. Here on tiny
    with a quarter of its SRAM, so 300 elements (NaN, ties, descending, stable) take three chunks."""
    import dataclasses

    from fexplore.npu import get_target

    small = dataclasses.replace(get_target("tiny"), name="tiny-16k", sram_bytes_per_pe=16 * 1024)
    fn = lambda x: torch.sort(x, dim=-1, descending=True, stable=True)  # noqa: E731
    x = torch.where(torch.arange(300) % 11 == 0, float("nan"), torch.randint(0, 40, (2, 300)).float())
    node = _lowered(fn, (x,), "sort").node
    gk = codegen.generate(node, small)
    assert "for js in fl.range(fl.tiles(K, 102))" in gk.source
    assert codegen.check_kernel(node, gk, [x.numpy()]).ok


def test_a_wrong_kernel_is_caught():
    """check_kernel is not vacuous for these kernels: topk picking minima instead fails."""
    import dataclasses

    fn, inputs, op, _ = CASES["topk"]
    x = _lowered(fn, inputs, op)
    arrays = [np.random.default_rng(2).standard_normal((5, 17)).astype(np.float32)]
    wrong = dataclasses.replace(x.kernel, source=x.kernel.source.replace(".max(axis=1)", ".min(axis=1)"))
    assert not codegen.check_kernel(x.node, wrong, arrays).ok


@pytest.mark.parametrize("fn, inputs, op, why", [
    (lambda x: x.sum(dim=(0, 2)), (r(3, 4, 5),), "sum", "not neighbours"),
])
def test_refusals_say_why(fn, inputs, op, why):
    x = _lowered(fn, inputs, op)
    assert x.how == "host" and why in x.reason, x.reason
    with pytest.raises(UnsupportedRegionError):
        codegen.generate(x.node, "tiny")


def test_tiles_fit_tiny_sram():
    """A copy bigger than tiny's SRAM is walked in tiles, not loaded whole."""
    fn = lambda x: x[:, 1:]  # noqa: E731
    x = _lowered(fn, (r(64, 300),), "slice")
    assert "fl.tiles(R, 64)" not in x.kernel.source
    assert x.traced is not None


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op, diagonal, shape", [("tril", 0, (2, 5, 7)), ("triu", 1, (9, 4)),
                                                 ("tril", -2, (3, 40, 70)), ("triu", 0, (1, 130, 300))])
def test_tril_triu_plain_nodes(op, diagonal, shape, target):
    """Ingestion writes torch.tril as a where over a constant mask; a tril node built by hand (or by
    a future pass) is a masked copy with positions from index rows."""
    from fexplore.errors import SourceLoc
    from fexplore.ir import DType, Node, TensorType, Value

    x, y = Value("x", TensorType(shape, DType.f32)), Value("y", TensorType(shape, DType.f32))
    node = Node(op, [x], {"diagonal": diagonal}, [y], SourceLoc("m.py", 3, "mask"))
    gk = codegen.generate(node, target)
    arr = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert gk.kind == "movement" and codegen.check_kernel(node, gk, [arr]).ok


@pytest.mark.parametrize("case", ["concat", "pad", "expand_new_axes", "sum_middle", "argmax_long", "cumsum",
                                  "topk", "sort_first_axis", "max_pool_k3s2p1", "avg_pool_padded"])
def test_scheduled_program_runs_these_kernels(case):
    """The schedule stage links these kernels (DRAM scratch included) into one program; running it
    on the simulator gives torch's result."""
    fn, inputs, _, _ = CASES[case]
    cm = fexplore.compile(Fn(fn), inputs, target="tiny", precision="fp32")
    want = fn(*inputs)
    want = want if isinstance(want, (tuple, list)) else (want,)
    got = cm(*inputs)
    got = got if isinstance(got, (tuple, list)) else (got,)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float64), w.detach().double().numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn, shape, op", [
    (lambda x: F.max_pool2d(x, 2, 2), (1, 2, 8, 7), "max_pool2d"),                 # a stride not dividing W
    (lambda x: F.max_pool2d(x, 3, 2, 1, dilation=2), (2, 3, 17, 15), "max_pool2d"),
    (lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True), (1, 4, 10, 11), "max_pool2d"),
    (lambda x: F.avg_pool2d(x, 3, 1, 1), (1, 5, 9, 6), "avg_pool2d"),
    (lambda x: F.adaptive_avg_pool2d(x, (2, 3)), (2, 3, 8, 9), "adaptive_avg_pool2d"),
    (lambda x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False), (1, 4, 7, 9), "avg_pool2d"),   # PoolFormer
    (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), (1, 2, 10, 8), "avg_pool2d"),   # partial last windows
    (lambda x: F.avg_pool2d(x, 2, 2, 1, ceil_mode=True, count_include_pad=False), (1, 2, 9, 7), "avg_pool2d"),
])
def test_a_pool_loads_each_bands_input_rows_once_and_slices_the_windows(fn, shape, op, target):
    """Each item (planes x a band of output rows) loads its input rows in one DMA; the window
    offsets are stepped slices of them, and the kernel equals the node on fresh inputs."""
    x = _lowered(fn, (r(*shape),), op, target)
    gk = x.kernel
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(tuple(v.type.shape)).astype(np.float32) for v in x.node.inputs]
    assert codegen.check_kernel(x.node, gk, arrays).ok
    trace = x.traced.last_trace
    windows = [op_ for op_ in trace.ops if op_.kind == "load" and op_.dst.name == "win"]
    stores = [op_ for op_ in trace.ops if op_.kind == "store" and op_.dst.tensor.name == "OUT"]
    assert len(windows) == len(stores) > 0
    kh, kw = (x.node.attrs["kernel"] if op != "adaptive_avg_pool2d" else
              (shape[2] // x.node.outputs[0].type.shape[2], shape[3] // x.node.outputs[0].type.shape[3]))
    reads = sum(1 for op_ in trace.ops if op_.kind == "vector" and
                any(t.base is not None and t.base.name == "win" for t in op_.reads()))
    # every offset once per band, but near a border only those reaching inside the input
    oh, ow = x.node.outputs[0].type.shape[2:]
    sh, sw = x.node.attrs["stride"] if op != "adaptive_avg_pool2d" else (kh, kw)
    dh, dw = x.node.attrs["dilation"] if op == "max_pool2d" else (1, 1)
    overhang = (oh - 1) * sh + (kh - 1) * dh + 1 > shape[2] or (ow - 1) * sw + (kw - 1) * dw + 1 > shape[3]
    padded = op != "adaptive_avg_pool2d" and (any(x.node.attrs["padding"]) or overhang)
    assert len(windows) < reads <= kh * kw * len(windows) and (padded or reads == kh * kw * len(windows))


@pytest.mark.parametrize("target", TARGETS)
def test_a_permute_of_unit_axes_is_a_free_view_and_one_that_moves_data_a_kernel(target):
    """A decode step's heads, (B, H, 1, D) -> (B, 1, H, D): the axes that move are of size 1, the
    others keep their order, so every element stays where it was and lower makes it a free view
    (it was a relayout kernel, a DRAM round trip). Moving a size-1 axis past others does not make
    a permute of the others free: (B, H, 1, D) -> (B, D, 1, H) is a kernel."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 1, 7)
    model = Fn(lambda t: (torch.tanh(t).permute(0, 2, 1, 3), torch.tanh(t).permute(0, 3, 2, 1)))
    cm = fexplore.compile(model, (x,), target=target)
    how = {x_.node.attrs["perm"]: x_.how for x_ in cm.lowering.nodes if x_.node.op.name == "permute"}
    assert how == {(0, 2, 1, 3): "free view", (0, 3, 2, 1): "generated"}, how
    assert cm.verification["ok"].all()
    for g, w in zip(cm(x), model(x)):
        torch.testing.assert_close(g, w)
