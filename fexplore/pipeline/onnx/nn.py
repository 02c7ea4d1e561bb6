"""ONNX contractions, convolutions, pooling, normalizations, dropout and resizing.

Convolutions over 1, 2 or 3 spatial axes and transposed convolutions go through the same
helpers the ATen converters use, so both doors reach the IR's one conv2d the same way.
"""

from __future__ import annotations

import math

import numpy as np

from fexplore.ir import DType

from ..convert.nn import _conv_nd, _conv_transpose
from .elementwise import scalar_like
from .movement import _reshape_to, axis
from .registry import onnx_converter


@onnx_converter("MatMul")
def _matmul(ctx):
    from .attention import as_attention

    attn = as_attention(ctx)
    if attn is not None:
        return attn
    x = ctx.input(0)
    linear = _as_linear(ctx, x)
    if linear is not None:
        return linear
    return ctx.emit("matmul", [x, ctx.input(1)])


def _as_linear(ctx, x):
    """``MatMul(x, W) + b`` with a constant 2-D W (in, out) and a constant bias of size out is
    how exporters write nn.Linear; it becomes the IR's ``linear`` (weight (out, in), bias) as
    the torch door's is, so fusion sees the same contraction. The Add node is taken over: its
    output is this linear's."""
    imp = ctx.importer
    w_name, out = ctx.onnx.input[1], ctx.onnx.output[0]
    w = imp.lookup_known(w_name)
    users = imp.consumers.get(out, [])
    if w is None or np.asarray(w).ndim != 2 or w.dtype == object or x.type.rank < 2 or \
            not w.dtype.kind == "f":
        return None
    wt = ctx.emit("permute", [ctx.input(1)], {"perm": (1, 0)})
    add = users[0] if len(users) == 1 and out not in imp.graph_outputs else None
    if add is not None and add.op_type == "Add":
        other = add.input[1] if add.input[0] == out else add.input[0]
        b = imp.lookup_known(other)
        if b is not None and b.dtype == w.dtype and b.shape == (w.shape[1],):
            y = ctx.emit("linear", [x, wt, imp.value(other, ctx)])
            imp.taken_over[add.output[0]] = y
            return y
    return ctx.emit("linear", [x, wt])


@onnx_converter("Gemm")
def _gemm(ctx):
    a, b, c = ctx.input(0), ctx.input(1), ctx.input(2)
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    trans_a, trans_b = ctx.attr("transA", 0), ctx.attr("transB", 0)
    if trans_a:
        a = ctx.emit("permute", [a], {"perm": (1, 0)})
    if trans_b and alpha == 1.0 and c is not None and beta == 1.0 and c.type.rank == 1:
        return ctx.emit("linear", [a, b, c])   # nn.Linear's form: x @ W^T + b
    if trans_b:
        b = ctx.emit("permute", [b], {"perm": (1, 0)})
    y = ctx.emit("matmul", [a, b])
    if alpha != 1.0:
        y = ctx.emit("mul", [y, scalar_like(ctx, alpha, y)])
    if c is not None and beta != 0:
        y = ctx.emit("add", [y, c if beta == 1.0 else ctx.emit("mul", [c, scalar_like(ctx, beta, c)])])
    return y


def _spatial_pads(ctx, x_shape, kernel, strides, dilations):
    """(before, after) per spatial axis from pads or auto_pad."""
    k = len(kernel)
    auto = ctx.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for size, kk, s, d in zip(x_shape[2:], kernel, strides, dilations):
            if not isinstance(size, int):
                raise NotImplementedError("SAME padding of a symbolic dim")
            total = max((math.ceil(size / s) - 1) * s + (kk - 1) * d + 1 - size, 0)
            small = total // 2
            out.append((small, total - small) if auto == "SAME_UPPER" else (total - small, small))
        return out
    if auto == "VALID":
        return [(0, 0)] * k
    pads = ctx.attr("pads") or (0,) * (2 * k)
    return list(zip(pads[:k], pads[k:]))


def _explicit_pad(ctx, x, pads, value=0.0):
    """Pad asymmetric amounts with a pad op; returns (x, symmetric pads left to the op)."""
    if all(b == e for b, e in pads):
        return x, tuple(b for b, _ in pads)
    torch_pads = tuple(p for b, e in reversed(pads) for p in (b, e))
    return ctx.emit("pad", [x], {"pads": torch_pads, "value": value}), (0,) * len(pads)


@onnx_converter("Conv")
def _conv(ctx):
    x, w, b = ctx.input(0), ctx.input(1), ctx.input(2)
    k = w.type.rank - 2
    kernel = ctx.attr("kernel_shape") or w.type.shape[2:]
    strides = tuple(ctx.attr("strides") or (1,) * k)
    dilations = tuple(ctx.attr("dilations") or (1,) * k)
    pads = _spatial_pads(ctx, x.type.shape, kernel, strides, dilations)
    x, sym = _explicit_pad(ctx, x, pads)
    return _conv_nd(ctx, x, w, b, strides, tuple(sym), dilations, ctx.attr("group", 1))


@onnx_converter("ConvTranspose")
def _conv_transpose_onnx(ctx):
    x, w, b = ctx.input(0), ctx.input(1), ctx.input(2)
    k = w.type.rank - 2
    strides = tuple(ctx.attr("strides") or (1,) * k)
    dilations = tuple(ctx.attr("dilations") or (1,) * k)
    out_pad = list(ctx.attr("output_padding") or (0,) * k)
    kernel = tuple(ctx.attr("kernel_shape") or w.type.shape[2:])
    spatial = x.type.shape[2:]
    auto = ctx.attr("auto_pad", "NOTSET")
    full = [s * (n - 1) + op + (kk - 1) * d + 1
            for s, n, op, kk, d in zip(strides, spatial, out_pad, kernel, dilations)]
    if ctx.has_attr("output_shape") or auto in ("SAME_UPPER", "SAME_LOWER"):
        # ONNX's rule: the padding that gives the asked-for (or stride * input) size,
        # split evenly, the odd one at the end (SAME_LOWER: at the start)
        want = list(ctx.attr("output_shape") or [s * n for s, n in zip(strides, spatial)])[-k:]
        total = [f - o for f, o in zip(full, want)]
        lower = auto == "SAME_LOWER"
        begin = [t - t // 2 if lower else t // 2 for t in total]
        pads = begin + [t - bg for t, bg in zip(total, begin)]
    else:
        pads = list(ctx.attr("pads") or (0,) * (2 * k))
    if pads[:k] == pads[k:] and min(pads) >= 0:   # symmetric: the torch door's own path
        return _conv_transpose(ctx, x, w, b, strides, tuple(pads[:k]), dilations,
                               tuple(out_pad), ctx.attr("group", 1))
    # the transposed convolution without padding, then ONNX's pads cropped off each side
    # (a negative total means output_shape asks for more: zeros added at the end)
    extra = [max(-(pads[i] + pads[k + i]), 0) for i in range(k)]
    y = _conv_transpose(ctx, x, w, b, strides, (0,) * k, dilations, tuple(out_pad),
                        ctx.attr("group", 1))
    for i in range(k):
        ax = 2 + i
        size = y.type.shape[ax]
        start, end = max(pads[i], 0), size - max(pads[k + i], 0)
        if start or end != size:
            y = ctx.emit("slice", [y], {"axis": ax, "start": start, "end": end})
        if extra[i]:
            y = ctx.emit("pad", [y], {"pads": (0, 0) * (y.type.rank - 1 - ax) + (0, extra[i]),
                                      "value": 0.0})
    return y


def _pool_by_taps(ctx, x, kind, p=2.0):
    """A pool over any number of spatial axes, any dilation and padding, as the sum or
    maximum of the kernel's taps (one strided slice of the padded input per kernel position);
    an average divides by each window's count of positions, computed here (ONNX counts the
    explicit padding when count_include_pad, never the ceil_mode overhang)."""
    import itertools

    r = x.type.rank
    k = r - 2
    spatial = x.type.shape[2:]
    if not all(isinstance(d, int) for d in spatial):
        raise NotImplementedError("pooling over symbolic spatial dims")
    kernel = tuple(ctx.attr("kernel_shape"))
    strides = tuple(ctx.attr("strides") or (1,) * k)
    dil = tuple(ctx.attr("dilations") or (1,) * k)
    pads = _spatial_pads(ctx, x.type.shape, kernel, strides, dil)
    ceil = bool(ctx.attr("ceil_mode", 0))
    outs, extra = [], []
    for n, kk, st, d, (pb, pe) in zip(spatial, kernel, strides, dil, pads):
        span = (kk - 1) * d + 1
        num = n + pb + pe - span
        o = (-(-num // st) if ceil else num // st) + 1
        if ceil and (o - 1) * st >= n + pb:   # a last window starting in the end padding
            o -= 1
        outs.append(o)
        extra.append(max((o - 1) * st + span - (n + pb + pe), 0))
    if kind == "max":
        fill = float("-inf") if x.type.dtype.is_float else int(np.iinfo(x.type.dtype.numpy).min)
    else:
        fill = 0.0
    src = x
    if kind == "lp":
        src = ctx.emit("pow", [ctx.emit("abs", [x]), scalar_like(ctx, p, x)])
    torch_pads = tuple(v for i in reversed(range(k)) for v in (pads[i][0], pads[i][1] + extra[i]))
    if any(torch_pads):
        src = ctx.emit("pad", [src], {"pads": torch_pads, "value": fill})
    acc = None
    for taps in itertools.product(*(range(kk) for kk in kernel)):
        t = src
        for i, j in enumerate(taps):
            start = j * dil[i]
            t = ctx.emit("slice", [t], {"axis": 2 + i, "start": start,
                                        "end": start + (outs[i] - 1) * strides[i] + 1,
                                        "step": strides[i]})
        acc = t if acc is None else ctx.emit("maximum" if kind == "max" else "add", [acc, t])
    if kind == "max":
        return acc
    if kind == "lp":
        return ctx.emit("pow", [acc, scalar_like(ctx, 1.0 / p, acc)])
    include = bool(ctx.attr("count_include_pad", 0))
    count = np.ones((), dtype=np.float64)
    for i, (n, kk, st, d, (pb, pe)) in enumerate(zip(spatial, kernel, strides, dil, pads)):
        lo, hi = (-pb, n + pe) if include else (0, n)
        pos = np.arange(outs[i]).reshape(-1, 1) * st + np.arange(kk).reshape(1, -1) * d - pb
        c = ((pos >= lo) & (pos < hi)).sum(1).astype(np.float64)
        count = np.multiply.outer(count, c)
    den = ctx.b.literal(count.astype(x.type.dtype.numpy), f"{ctx._node_base()}.count")
    return ctx.emit("div", [acc, den])


def _as_2d(ctx, x):
    """A pool over one spatial axis runs as a 2-D pool over a unit height."""
    if x.type.rank == 3:
        return _reshape_to(ctx, x, x.type.shape[:2] + (1,) + x.type.shape[2:]), True
    if x.type.rank != 4:
        raise NotImplementedError(f"pooling over {x.type.rank - 2} spatial axes")
    return x, False


def _pool_params(ctx, x, one_d):
    kernel = tuple(ctx.attr("kernel_shape"))
    k = len(kernel)
    strides = tuple(ctx.attr("strides") or (1,) * k)
    dilations = tuple(ctx.attr("dilations") or (1,) * k)
    shape = x.type.shape if not one_d else x.type.shape[:2] + x.type.shape[3:]
    pads = _spatial_pads(ctx, shape, kernel, strides, dilations)
    if one_d:
        kernel, strides, dilations, pads = (1,) + kernel, (1,) + strides, (1,) + dilations, \
            [(0, 0)] + pads
    return kernel, strides, dilations, pads


@onnx_converter("MaxPool")
def _max_pool(ctx):
    if ctx.input(0).type.rank > 4 and not (len(ctx.onnx.output) > 1 and ctx.onnx.output[1]):
        return _pool_by_taps(ctx, ctx.input(0), "max")
    x, one_d = _as_2d(ctx, ctx.input(0))
    kernel, strides, dilations, pads = _pool_params(ctx, x, one_d)
    if len(ctx.onnx.output) > 1 and ctx.onnx.output[1]:
        return _max_pool_indices(ctx, x, one_d, kernel, strides, dilations, pads)
    x, sym = _explicit_pad(ctx, x, pads, value=float("-inf") if x.type.dtype.is_float else
                           int(np.iinfo(x.type.dtype.numpy).min))
    y = ctx.emit("max_pool2d", [x], {"kernel": kernel, "stride": strides, "padding": sym,
                                     "ceil_mode": bool(ctx.attr("ceil_mode", 0)),
                                     "dilation": dilations})
    return _reshape_to(ctx, y, y.type.shape[:2] + y.type.shape[3:]) if one_d else y


def _max_pool_indices(ctx, x, one_d, kernel, strides, dilations, pads):
    """MaxPool's Indices: each maximum's index into the whole tensor, flattened (row-major,
    or column-major within a plane for storage_order=1), from the IR's per-plane index."""
    if one_d or any(b != e for b, e in pads):
        ctx.refuse("MaxPool's Indices with one spatial axis or asymmetric pads")
    y, idx = ctx.emit("max_pool2d_with_indices", [x], {
        "kernel": kernel, "stride": strides, "padding": tuple(b for b, _ in pads),
        "ceil_mode": bool(ctx.attr("ceil_mode", 0)), "dilation": dilations}, n_results=2)
    n, c, h, w = x.type.shape
    if ctx.attr("storage_order", 0):
        row = ctx.emit("div", [idx, ctx.scalar(w, DType.i64)], {"rounding": "floor"})
        col = ctx.emit("remainder", [idx, ctx.scalar(w, DType.i64)])
        idx = ctx.emit("add", [ctx.emit("mul", [col, ctx.scalar(h, DType.i64)]), row])
    plane = np.arange(n * c, dtype=np.int64).reshape(n, c, 1, 1) * (h * w)
    idx = ctx.emit("add", [idx, ctx.b.literal(plane, f"{ctx._node_base()}.plane")])
    return (y, idx)


@onnx_converter("MaxUnpool")
def _max_unpool(ctx):
    """MaxPool's partial inverse: each value of X written at its flat index (MaxPool's Indices,
    into the whole tensor) of a zero tensor of the output's size: output_shape when given (the
    size of the input the indices were taken from), else the one kernel, strides and pads give.
    With output_shape, ONNX Runtime and torch's max_unpool do this; the ONNX reference instead
    unpools to the second size and pads it to the first, which moves every value of a row."""
    x, idx = ctx.input(0), ctx.input(1)
    if not all(isinstance(d, int) for d in x.type.shape):
        ctx.refuse("MaxUnpool of symbolic dims")
    kernel = tuple(ctx.attr("kernel_shape"))
    k = len(kernel)
    strides = tuple(ctx.attr("strides") or (1,) * k)
    pads = tuple(ctx.attr("pads") or (0,) * (2 * k))
    want = ctx.const_ints(2, "output shape")
    shape = tuple(want) if want is not None else x.type.shape[:2] + tuple(
        (d - 1) * s - (pads[i] + pads[k + i]) + kernel[i]
        for i, (d, s) in enumerate(zip(x.type.shape[2:], strides)))
    flat = ctx.emit("full", [], {"shape": (math.prod(shape),), "value": 0, "dtype": x.type.dtype})
    flat = ctx.emit("index_put", [flat, _reshape_to(ctx, x, (math.prod(x.type.shape),)),
                                  _reshape_to(ctx, idx, (math.prod(idx.type.shape),))],
                    {"axes": (0,), "accumulate": False})
    return _reshape_to(ctx, flat, shape)


@onnx_converter("LRN")
def _lrn(ctx):
    """x / (bias + alpha/size * sum of squares over a window of channels)^beta."""
    x = ctx.input(0)
    size = ctx.attr("size")
    alpha, beta, bias = ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75), ctx.attr("bias", 1.0)
    c = x.type.shape[1]
    sq = ctx.emit("mul", [x, x])
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    padded = ctx.emit("pad", [sq], {"pads": (0, 0) * (x.type.rank - 2) + (before, after),
                                    "value": 0.0})
    total = None
    for i in range(size):
        part = ctx.emit("slice", [padded], {"axis": 1, "start": i, "end": i + c})
        total = part if total is None else ctx.emit("add", [total, part])
    den = ctx.emit("add", [ctx.emit("mul", [total, scalar_like(ctx, alpha / size, x)]),
                           scalar_like(ctx, bias, x)])
    return ctx.emit("div", [x, ctx.emit("pow", [den, scalar_like(ctx, beta, x)])])


@onnx_converter("AveragePool")
def _avg_pool(ctx):
    if ctx.input(0).type.rank > 4:
        return _pool_by_taps(ctx, ctx.input(0), "avg")
    x, one_d = _as_2d(ctx, ctx.input(0))
    kernel, strides, dilations, pads = _pool_params(ctx, x, one_d)
    include = bool(ctx.attr("count_include_pad", 0))
    if any(d != 1 for d in dilations) or (any(b != e for b, e in pads) and not include):
        return _pool_by_taps(ctx, ctx.input(0), "avg")
    if any(b != e for b, e in pads):
        x, sym = _explicit_pad(ctx, x, pads)
    else:
        sym = tuple(b for b, _ in pads)
    y = ctx.emit("avg_pool2d", [x], {"kernel": kernel, "stride": strides, "padding": sym,
                                     "ceil_mode": bool(ctx.attr("ceil_mode", 0)),
                                     "count_include_pad": include})
    return _reshape_to(ctx, y, y.type.shape[:2] + y.type.shape[3:]) if one_d else y


@onnx_converter("LpPool")
def _lp_pool(ctx):
    """(sum of |x|^p over each window)^(1/p): an average pool counting the padding, times the
    window's size."""
    if ctx.input(0).type.rank > 4 or any(d != 1 for d in (ctx.attr("dilations") or ())):
        return _pool_by_taps(ctx, ctx.input(0), "lp", float(ctx.attr("p", 2)))
    x, one_d = _as_2d(ctx, ctx.input(0))
    kernel, strides, dilations, pads = _pool_params(ctx, x, one_d)
    p = float(ctx.attr("p", 2))
    x = ctx.emit("pow", [ctx.emit("abs", [x]), scalar_like(ctx, p, x)])
    x, sym = _explicit_pad(ctx, x, pads)
    y = ctx.emit("avg_pool2d", [x], {"kernel": kernel, "stride": strides, "padding": sym,
                                     "ceil_mode": bool(ctx.attr("ceil_mode", 0)),
                                     "count_include_pad": True})
    y = ctx.emit("mul", [y, scalar_like(ctx, float(kernel[0] * kernel[1]), y)])
    y = ctx.emit("pow", [y, scalar_like(ctx, 1.0 / p, y)])
    return _reshape_to(ctx, y, y.type.shape[:2] + y.type.shape[3:]) if one_d else y


def _global(op):
    def conv(ctx):
        x = ctx.input(0)
        return ctx.emit(op, [x], {"axes": tuple(range(2, x.type.rank)), "keepdim": True})

    return conv


@onnx_converter("GlobalAveragePool")
def _global_avg_pool(ctx):
    from .reduction import global_avg_pool

    x = ctx.input(0)
    if x.type.rank == 4 and x.type.dtype.is_float:
        return global_avg_pool(ctx, x)
    return _global("mean")(ctx)
onnx_converter("GlobalMaxPool")(_global("amax"))


@onnx_converter("GlobalLpPool")
def _global_lp_pool(ctx):
    x = ctx.input(0)
    p = float(ctx.attr("p", 2))
    s = ctx.emit("sum", [ctx.emit("pow", [ctx.emit("abs", [x]), scalar_like(ctx, p, x)])],
                 {"axes": tuple(range(2, x.type.rank)), "keepdim": True})
    return ctx.emit("pow", [s, scalar_like(ctx, 1.0 / p, s)])


@onnx_converter("BatchNormalization")
def _batch_norm(ctx):
    x, scale, bias, mean, var = ctx.inputs()[:5]
    if ctx.attr("training_mode", 0):
        return _batch_norm_training(ctx, x, scale, bias, mean, var)
    return ctx.emit("batch_norm", [x, scale, bias, mean, var], {"eps": float(ctx.attr("epsilon", 1e-5))})


def _batch_norm_training(ctx, x, scale, bias, mean, var):
    """Training mode: normalized by the batch's own mean and (population) variance per
    channel; the running statistics move toward them by 1 - momentum."""
    eps, momentum = float(ctx.attr("epsilon", 1e-5)), float(ctx.attr("momentum", 0.9))
    axes = tuple(i for i in range(x.type.rank) if i != 1)
    batch_mean = ctx.emit("mean", [x], {"axes": axes, "keepdim": False})
    batch_var = ctx.emit("var", [x], {"axes": axes, "keepdim": False, "correction": 0})
    y = ctx.emit("batch_norm", [x, scale, bias, batch_mean, batch_var], {"eps": eps})

    def moved(run, now):
        return ctx.emit("add", [ctx.emit("mul", [run, scalar_like(ctx, momentum, run)]),
                                ctx.emit("mul", [now, scalar_like(ctx, 1 - momentum, now)])])

    return (y, moved(mean, batch_mean), moved(var, batch_var))[:len(ctx.onnx.output)]


@onnx_converter("Col2Im")
def _col2im(ctx):
    """Column blocks summed back into an image: (N, C*prod(block), L) times a constant 0/1
    matrix sending each block element at each location to its pixel (padding dropped)."""
    import itertools

    x = ctx.input(0)
    image = ctx.const_ints(1, "image_shape")
    block = ctx.const_ints(2, "block_shape")
    k = len(image)
    dil = tuple(ctx.attr("dilations") or (1,) * k)
    strides = tuple(ctx.attr("strides") or (1,) * k)
    pads = tuple(ctx.attr("pads") or (0,) * (2 * k))
    outs = [(image[i] + pads[i] + pads[k + i] - (dil[i] * (block[i] - 1) + 1)) // strides[i] + 1
            for i in range(k)]
    n, cb, locs = x.type.shape
    nb = int(np.prod(block))
    m = np.zeros((nb * locs, int(np.prod(image))), dtype=x.type.dtype.numpy)
    for bi, b in enumerate(itertools.product(*(range(v) for v in block))):
        for li, loc in enumerate(itertools.product(*(range(v) for v in outs))):
            pos = [loc[i] * strides[i] + b[i] * dil[i] - pads[i] for i in range(k)]
            if all(0 <= p < image[i] for i, p in enumerate(pos)):
                m[bi * locs + li, int(np.ravel_multi_index(pos, image))] = 1
    y = _reshape_to(ctx, x, (n, cb // nb, nb * locs))
    y = ctx.emit("matmul", [y, ctx.b.literal(m, f"{ctx._node_base()}.fold")])
    return _reshape_to(ctx, y, (n, cb // nb) + tuple(image))


def _norm_last(ctx, op, x, ax, scale, bias, eps):
    """A norm over axes ax.. with an affine part: the IR op when it fits, else mul/add."""
    nd = x.type.rank - ax
    shape = x.type.shape[ax:]
    fits = all(t is None or t.type.shape == shape for t in (scale, bias))
    if fits and (scale is not None or bias is None):
        ins = [x] + [t for t in (scale, bias) if t is not None]
        return ctx.emit(op, ins, {"ndim": nd, "eps": float(eps)})
    y = ctx.emit(op, [x], {"ndim": nd, "eps": float(eps)})
    if scale is not None:
        y = ctx.emit("mul", [y, scale])
    return ctx.emit("add", [y, bias]) if bias is not None else y


@onnx_converter("LayerNormalization", since=17)
def _layer_norm(ctx):
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    ax = axis(ctx.attr("axis", -1), x.type.rank)
    eps = ctx.attr("epsilon", 1e-5)
    y = _norm_last(ctx, "layer_norm", x, ax, scale, bias, eps)
    extra = [o for o in ctx.onnx.output[1:] if o]
    if not extra:
        return y
    axes = tuple(range(ax, x.type.rank))
    return (y, ctx.emit("mean", [x], {"axes": axes, "keepdim": True}), inverse_deviation(ctx, x, axes, eps))


def inverse_deviation(ctx, x, axes, eps, *, centered: bool = True):
    """1 / sqrt(var + eps) over `axes` (kept): a layer norm's inverse standard deviation, or with
    `centered` False an RMS norm's inverse root mean square."""
    if centered:
        power = ctx.emit("var", [x], {"axes": axes, "keepdim": True, "correction": 0})
    else:
        power = ctx.emit("mean", [ctx.emit("mul", [x, x])], {"axes": axes, "keepdim": True})
    return ctx.emit("rsqrt", [ctx.emit("add", [power, scalar_like(ctx, eps, power)])])


@onnx_converter("RMSNormalization", since=23)
def _rms_norm(ctx):
    x, scale = ctx.input(0), ctx.input(1)
    ax = axis(ctx.attr("axis", -1), x.type.rank)
    return _norm_last(ctx, "rms_norm", x, ax, scale, None, ctx.attr("epsilon", 1e-5))


@onnx_converter("InstanceNormalization")
def _instance_norm(ctx):
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    eps = ctx.attr("epsilon", 1e-5)
    axes = tuple(range(2, x.type.rank))
    return _affine_channels(ctx, _standardize(ctx, x, axes, eps), scale, bias)


def _standardize(ctx, x, axes, eps):
    mean = ctx.emit("mean", [x], {"axes": axes, "keepdim": True})
    var = ctx.emit("var", [x], {"axes": axes, "keepdim": True, "correction": 0})
    inv = ctx.emit("rsqrt", [ctx.emit("add", [var, scalar_like(ctx, eps, var)])])
    return ctx.emit("mul", [ctx.emit("sub", [x, mean]), inv])


def _affine_channels(ctx, y, scale, bias):
    shape = (1, scale.type.shape[0]) + (1,) * (y.type.rank - 2)
    y = ctx.emit("mul", [y, _reshape_to(ctx, scale, shape)])
    return ctx.emit("add", [y, _reshape_to(ctx, bias, shape)])


@onnx_converter("GroupNormalization", since=21)
def _group_norm(ctx):
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    g = ctx.attr("num_groups")
    eps = ctx.attr("epsilon", 1e-5)
    n, c = x.type.shape[:2]
    rest = x.type.shape[2:]
    xg = _reshape_to(ctx, x, (n, g, c // g) + rest)
    y = _standardize(ctx, xg, tuple(range(2, xg.type.rank)), eps)
    return _affine_channels(ctx, _reshape_to(ctx, y, x.type.shape), scale, bias)


@onnx_converter("LpNormalization")
def _lp_norm(ctx):
    x = ctx.input(0)
    ax = axis(ctx.attr("axis", -1), x.type.rank)
    p = ctx.attr("p", 2)
    if p == 2:
        n = ctx.emit("sqrt", [ctx.emit("sum", [ctx.emit("mul", [x, x])], {"axes": (ax,), "keepdim": True})])
    else:
        n = ctx.emit("sum", [ctx.emit("abs", [x])], {"axes": (ax,), "keepdim": True})
    zero = ctx.emit("eq", [n, scalar_like(ctx, 0, n)])
    return ctx.emit("where", [zero, scalar_like(ctx, 0, x), ctx.emit("div", [x, n])])


@onnx_converter("MeanVarianceNormalization")
def _mvn(ctx):
    x = ctx.input(0)
    axes = tuple(axis(a, x.type.rank) for a in (ctx.attr("axes") or (0, 2, 3)))
    return _standardize(ctx, x, tuple(sorted(axes)), 1e-9)


@onnx_converter("Dropout")
def _dropout(ctx):
    x = ctx.input(0)
    training = ctx.const(2, "training_mode")
    if training is not None and bool(np.asarray(training).reshape(-1)[0]):
        ctx.refuse("Dropout in training mode", hint="export the model in eval mode")
    if len(ctx.onnx.output) > 1 and ctx.onnx.output[1]:
        mask = ctx.emit("full", [], {"shape": x.type.shape, "value": True, "dtype": DType.bool})
        return (x, mask)
    return x
