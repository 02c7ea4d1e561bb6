"""ONNX GridSample: each output position reads the input at a coordinate the grid holds at run
time, so it is a data-dependent gather. Per spatial axis the coordinate is un-normalized, split
into integer taps (nearest: the rounded one; linear: floor and floor + 1; cubic: four) with
weights computed from its fraction; each tap's index is padded the way ONNX says (zeros: masked
out; border: clamped; reflection: reflected at the borders) and all axes' taps are read with one
flat gather per tap combination, weighted and summed."""

from __future__ import annotations

import itertools

import numpy as np

from fexplore.ir import DType

from .elementwise import scalar_like
from .movement import _reshape_to, product
from .registry import OnnxContext, onnx_converter

_CUBIC_A = -0.75


class _Math:
    """Short arithmetic over IR values of one float dtype."""

    def __init__(self, ctx, like):
        self.ctx, self.like = ctx, like

    def c(self, v):
        return scalar_like(self.ctx, float(v), self.like)

    def __call__(self, op, *xs):
        return self.ctx.emit(op, [x if not isinstance(x, (int, float)) else self.c(x) for x in xs])


def _reflect(m: _Math, x, lo: float, hi: float):
    """ONNX's _gs_reflect on every element: fold x into [lo, hi] by its nearer border."""
    rng = hi - lo
    if rng <= 0:
        return m("mul", x, 0.0)

    def fold(dx, near, far, sign):
        n = m("floor", m("div", dx, rng))
        r = m("sub", dx, m("mul", n, rng))
        even = m("eq", m("remainder", n, 2.0), m.c(0.0))
        return m.ctx.emit("where", [even, m(sign, near, r), m("sub" if sign == "add" else "add",
                                                                far, r)])

    below = fold(m("sub", lo, x), lo, hi, "add")
    above = fold(m("sub", x, hi), hi, lo, "sub")
    y = m.ctx.emit("where", [m("lt", x, m.c(lo)), below, x])
    return m.ctx.emit("where", [m("gt", x, m.c(hi)), above, y])


def _cubic_weights(m: _Math, t):
    a = _CUBIC_A

    def far(u):   # |u| in [1, 2]
        return m("sub", m("mul", m("add", m("mul", m("sub", m("mul", u, a), 5 * a), u), 8 * a), u), 4 * a)

    def near(u):  # |u| in [0, 1]
        return m("add", m("mul", m("mul", m("sub", m("mul", u, a + 2), a + 3), u), u), 1.0)

    one_minus = m("sub", 1.0, t)
    return [far(m("add", t, 1.0)), near(t), near(one_minus), far(m("sub", 2.0, t))]


def _sample_taps(ctx, m: _Math, flat_x, spatial, axes_taps, pad_mode: str):
    """The image `flat_x` (N, C, prod(spatial)) read at every combination of the axes' taps
    (per axis: (index, weight or None, size, lo, hi), indices and weights shaped (N, *O)), each
    index padded as `pad_mode` says (zeros: masked out; border: clamped; reflection: reflected),
    weighted and summed: (N, C, prod(O))."""
    n, c = flat_x.type.shape[:2]
    strides = [product(spatial[i + 1:]) for i in range(len(spatial))]
    o_n = product(axes_taps[0][0][0].type.shape[1:])
    total = None
    for combo in itertools.product(*axes_taps):
        lin, ok, weight = None, None, None
        for i, (idx, w, size, lo, hi) in enumerate(combo):
            if pad_mode == "border":
                idx = ctx.emit("clamp", [idx], {"min": 0.0, "max": size - 1.0})
            elif pad_mode == "reflection":
                idx = ctx.emit("clamp", [_reflect(m, idx, lo, hi)], {"min": 0.0, "max": size - 1.0})
                idx = m("trunc", idx)
            else:
                inside = ctx.emit("logical_and", [m("ge", idx, m.c(0.0)), m("le", idx, m.c(size - 1.0))])
                ok = inside if ok is None else ctx.emit("logical_and", [ok, inside])
                idx = ctx.emit("clamp", [idx], {"min": 0.0, "max": size - 1.0})
            ii = ctx.emit("cast", [idx], {"dtype": DType.i64})
            term = ctx.emit("mul", [ii, ctx.scalar(strides[i], DType.i64)]) if strides[i] != 1 else ii
            lin = term if lin is None else ctx.emit("add", [lin, term])
            if w is not None:
                weight = w if weight is None else m("mul", weight, w)
        lin = _reshape_to(ctx, lin, (n, 1, o_n))
        lin = ctx.emit("expand", [lin], {"shape": (n, c, o_n)})
        vals = ctx.emit("gather", [flat_x, lin], {"axis": 2})          # (N, C, O)
        factor = weight
        if ok is not None:
            okf = ctx.emit("cast", [ok], {"dtype": flat_x.type.dtype})
            factor = okf if factor is None else m("mul", factor, okf)
        if factor is not None:
            factor = _reshape_to(ctx, factor, (n, 1, o_n))
            vals = ctx.emit("mul", [vals, factor])
        total = vals if total is None else ctx.emit("add", [total, vals])
    return total


@onnx_converter("GridSample", since=16)
def _grid_sample(ctx: OnnxContext):
    x, grid = ctx.input(0), ctx.input(1)
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(ctx.attr("mode", "linear"),
                                                          ctx.attr("mode", "linear"))
    pad_mode = ctx.attr("padding_mode", "zeros")
    align = bool(ctx.attr("align_corners", 0))
    spatial = x.type.shape[2:]
    k = len(spatial)
    if not all(isinstance(d, int) for d in spatial + grid.type.shape):
        raise NotImplementedError("GridSample with symbolic dims")
    if mode == "cubic" and k != 2:
        ctx.refuse("cubic GridSample over other than two spatial axes")
    n, c = x.type.shape[:2]
    out = grid.type.shape[1:-1]
    g = grid if grid.type.dtype == x.type.dtype else ctx.emit("cast", [grid], {"dtype": x.type.dtype})
    m = _Math(ctx, g)
    axes_taps = []
    for i, size in enumerate(spatial):
        coord = ctx.emit("select", [g], {"axis": g.type.rank - 1, "index": k - 1 - i})   # (N, *O)
        if align:
            pos = m("mul", m("add", coord, 1.0), (size - 1) / 2.0)
        else:
            pos = m("div", m("sub", m("mul", m("add", coord, 1.0), float(size)), 1.0), 2.0)
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if mode == "nearest":
            taps = [(m("round", pos), None)]
        else:
            base = m("floor", pos)
            t = m("sub", pos, base)
            if mode == "linear":
                taps = [(base, m("sub", 1.0, t)), (m("add", base, 1.0), t)]
            else:
                ws = _cubic_weights(m, t)
                taps = [(m("add", base, float(o)), w) for o, w in zip((-1, 0, 1, 2), ws)]
        axes_taps.append([(idx, w, size, lo, hi) for idx, w in taps])
    flat_x = _reshape_to(ctx, x, (n, c, product(spatial)))
    total = _sample_taps(ctx, m, flat_x, spatial, axes_taps, pad_mode)
    return _reshape_to(ctx, total, (n, c) + tuple(out))


@onnx_converter("DeformConv", since=19)
def _deform_conv(ctx: OnnxContext):
    """A convolution whose every kernel tap reads the input at its own place plus a learned
    offset (per output position, tap and offset group), bilinearly, zero outside the image, and
    scaled by a mask when there is one: the taps' samples gathered as a column tensor
    (N, C, taps, positions), then one batched contraction with the weights per group."""
    x, w, offset, bias, mask = (ctx.input(i) for i in range(5))
    dims = x.type.shape + w.type.shape + offset.type.shape + (mask.type.shape if mask is not None else ())
    if not all(isinstance(d, int) for d in dims):
        raise NotImplementedError("DeformConv with symbolic dims")
    if x.type.rank != 4:
        ctx.refuse(f"DeformConv over {x.type.rank - 2} spatial axes (two are supported)")
    n, c, h, wd = x.type.shape
    oc, cg, kh, kw = w.type.shape
    group, og = int(ctx.attr("group", 1)), int(ctx.attr("offset_group", 1))
    sh, sw = ctx.attr("strides", (1, 1))
    dh, dw = ctx.attr("dilations", (1, 1))
    top, left, _, _ = ctx.attr("pads", (0, 0, 0, 0))
    oh, ow = offset.type.shape[2:]
    taps_n, positions = kh * kw, oh * ow
    m = _Math(ctx, x)
    base = ctx._node_base()
    rows = np.arange(oh, dtype=np.float64).reshape(oh, 1) * sh - top
    cols = np.arange(ow, dtype=np.float64).reshape(1, ow) * sw - left
    flat_x = _reshape_to(ctx, x, (n, c, h * wd))
    per_tap = []
    for k in range(taps_n):
        i, j = divmod(k, kw)
        groups = []
        for g in range(og):   # the offsets (and mask) of one offset group move its channels alike
            dy = ctx.emit("select", [offset], {"axis": 1, "index": g * 2 * taps_n + 2 * k})       # (N, oH, oW)
            dx = ctx.emit("select", [offset], {"axis": 1, "index": g * 2 * taps_n + 2 * k + 1})
            y = m("add", dy, ctx.b.literal((rows + i * dh).astype(x.type.dtype.numpy), f"{base}.y{k}"))
            xx = m("add", dx, ctx.b.literal((cols + j * dw).astype(x.type.dtype.numpy), f"{base}.x{k}"))
            taps = []
            for pos, size in ((y, h), (xx, wd)):   # bilinear, zero outside the image
                below = m("floor", pos)
                t = m("sub", pos, below)
                taps.append([(below, m("sub", 1.0, t), size, 0.0, size - 1.0),
                             (m("add", below, 1.0), t, size, 0.0, size - 1.0)])
            channels = flat_x if og == 1 else ctx.emit(
                "slice", [flat_x], {"axis": 1, "start": g * (c // og), "end": (g + 1) * (c // og), "step": 1})
            total = _sample_taps(ctx, m, channels, (h, wd), taps, "zeros")             # (N, C/og, P)
            if mask is not None:
                scale = ctx.emit("select", [mask], {"axis": 1, "index": g * taps_n + k})
                total = m("mul", total, _reshape_to(ctx, scale, (n, 1, positions)))
            groups.append(total)
        tap = groups[0] if og == 1 else ctx.emit("concat", groups, {"axis": 1})            # (N, C, P)
        per_tap.append(_reshape_to(ctx, tap, (n, c, 1, positions)))
    columns = ctx.emit("concat", per_tap, {"axis": 2})                                    # (N, C, K, P)
    columns = _reshape_to(ctx, columns, (n, group, cg * taps_n, positions))
    weights = _reshape_to(ctx, w, (1, group, oc // group, cg * taps_n))
    out = ctx.emit("matmul", [ctx.emit("expand", [weights], {"shape": (n, group, oc // group, cg * taps_n)}),
                              columns])                                                   # (N, G, oC/G, P)
    out = _reshape_to(ctx, out, (n, oc, oh, ow))
    if bias is not None:
        out = m("add", out, _reshape_to(ctx, bias, (1, oc, 1, 1)))
    return out
