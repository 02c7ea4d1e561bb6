"""ONNX contractions, convolutions, pooling, normalizations, dropout and resizing.

Convolutions over 1, 2 or 3 spatial axes and transposed convolutions go through the same
helpers the ATen converters use, so both doors reach the IR's one conv2d the same way.
"""

from __future__ import annotations

import math

import numpy as np

from fexplore.ir import DType

from ..convert.nn import _conv_nd, _conv_transpose
from .elementwise import cast, scalar_like
from .movement import _reshape_to, axis
from .registry import OnnxContext, onnx_converter


@onnx_converter("MatMul")
def _matmul(ctx):
    attn = _as_attention(ctx)
    if attn is not None:
        return attn
    x = ctx.input(0)
    linear = _as_linear(ctx, x)
    if linear is not None:
        return linear
    return ctx.emit("matmul", [x, ctx.input(1)])


def _scalar_factor(ctx, name):
    """(the other operand, the factor) of a single-use Mul by a known one-element constant,
    else (name, 1.0)."""
    from .elementwise import only_use_of

    mul = only_use_of(ctx, name, "Mul")
    if mul is not None:
        for i in (0, 1):
            c = ctx.importer.lookup_known(mul.input[i])
            if c is not None and c.dtype != object and np.asarray(c).size == 1:
                return mul.input[1 - i], float(np.asarray(c).reshape(-1)[0])
    return name, 1.0


def _as_attention(ctx):
    """``Softmax((q * a) @ (kT * b) [+ mask]) @ v`` is how exporters write
    scaled_dot_product_attention: it becomes the IR's attention (scale a*b, k the transpose of
    kT, the mask added to the scores), the op the torch door keeps, so fusion forms the same
    attention region from both doors."""
    from .elementwise import only_use_of

    imp = ctx.importer
    soft = only_use_of(ctx, ctx.onnx.input[0], "Softmax") or _safe_softmax(ctx, ctx.onnx.input[0])
    if soft is None:
        return None
    scores, mask = soft.input[0], None
    add = only_use_of(ctx, scores, "Add")
    if add is not None:
        for i in (0, 1):
            if imp.producers.get(add.input[i]) is not None and \
                    imp.producers[add.input[i]].op_type == "MatMul":
                scores, mask = add.input[i], add.input[1 - i]
                break
        else:
            return None
    qk = only_use_of(ctx, scores, "MatMul")
    if qk is None:
        return None
    q_name, a = _scalar_factor(ctx, qk.input[0])
    kt_name, b = _scalar_factor(ctx, qk.input[1])
    q, kt, v = imp.value(q_name, ctx), imp.value(kt_name, ctx), ctx.input(1)
    r = q.type.rank
    if r < 3 or kt.type.rank != r or v.type.rank != r or \
            not q.type.dtype.is_float or soft_axis(soft, r) != r - 1:
        return None
    k, k_heads = _untransposed(ctx, kt_name, kt)
    if k is None:
        k = ctx.emit("permute", [kt], {"perm": tuple(range(r - 2)) + (r - 1, r - 2)})
    k_heads = k_heads if k_heads is not None else _unrepeated(ctx, k)
    v_heads = _unrepeated(ctx, v)
    gqa = False
    if k_heads is not None and v_heads is not None and \
            k_heads.type.shape[-3] == v_heads.type.shape[-3]:
        k, v, gqa = k_heads, v_heads, True   # grouped-query attention, as the torch door has it
    elif k is None or k.type.rank != r:   # only the grouped k was found: repeat it as given
        k = ctx.emit("permute", [kt], {"perm": tuple(range(r - 2)) + (r - 1, r - 2)})
    ins = [q, k, v] + ([imp.value(mask, ctx)] if mask is not None else [])
    return ctx.emit("attention", ins, {"causal": False, "scale": a * b, "gqa": gqa})


def _producer_value(ctx, v, op_type):
    """(the ONNX node of op_type computing IR value v, its first input's IR value), or None."""
    node = ctx.importer.producers.get(v.name)
    if node is None or node.op_type != op_type or node.input[0] not in ctx.importer.env:
        return None
    return node, ctx.importer.env[node.input[0]]


def _untransposed(ctx, kt_name, kt):
    """(k, its heads before repeat_kv or None) when kT is k with its last two axes swapped
    the way exporters write it for 4-D attention: Reshape (B*H, S, D) -> Transpose (0, 2, 1)
    -> Reshape (B, H, D, S), the first Reshape possibly flattening repeat_kv's
    (B, Hkv, n, S, D) directly; else (None, None)."""
    outer = _producer_value(ctx, kt, "Reshape")
    if outer is None:
        return None, None
    mid = _producer_value(ctx, outer[1], "Transpose")
    if mid is None or list(ctx_attr(mid[0], "perm") or ()) != [0, 2, 1]:
        return None, None
    inner = _producer_value(ctx, mid[1], "Reshape")
    if inner is None:
        return None, None
    k = inner[1]
    ks, kts = k.type.shape, kt.type.shape
    if k.type.rank == kt.type.rank + 1 == 5:   # repeat_kv's expanded heads, flattened
        b, h, n, s, d = ks
        src = _expanded_source(ctx, k)
        if src is None or tuple(kts) != (b, h * n, d, s):
            return None, None
        return None, src
    if k.type.rank != kt.type.rank or ks[:-2] != kts[:-2] or ks[-2:] != kts[-2:][::-1]:
        return None, None
    return k, None


def _expanded_source(ctx, t5):
    """The (B, Hkv, S, D) heads an Expand to (B, Hkv, n, S, D) repeats, or None."""
    exp = _producer_value(ctx, t5, "Expand")
    if exp is None or exp[1].type.rank != 5:
        return None
    b, h, one, s, d = exp[1].type.shape
    if one != 1 or (b, h, s, d) != tuple(t5.type.shape[:2]) + tuple(t5.type.shape[3:]):
        return None
    inner = _producer_value(ctx, exp[1], "Unsqueeze") or _producer_value(ctx, exp[1], "Reshape")
    if inner is None or tuple(inner[1].type.shape) != (b, h, s, d):
        return None
    return inner[1]


def _unrepeated(ctx, t):
    """The key/value heads before repeat_kv (Reshape (B, Hkv, 1, S, D) -> Expand
    (B, Hkv, n, S, D) -> Reshape (B, Hkv*n, S, D)), or None."""
    if t.type.rank != 4:
        return None
    outer = _producer_value(ctx, t, "Reshape")
    if outer is None or outer[1].type.rank != 5:
        return None
    src = _expanded_source(ctx, outer[1])
    if src is None:
        return None
    b, h, n, s, d = outer[1].type.shape
    return src if tuple(t.type.shape) == (b, h * n, s, d) else None


def ctx_attr(node, name):
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)


def _safe_softmax(ctx, name):
    """The Softmax under ``Where(IsNaN(p), 0, p)`` (a fully masked row's NaNs made zeros, as
    the IR's attention gives them), or None."""
    from .elementwise import only_use_of

    imp = ctx.importer
    where = only_use_of(ctx, name, "Where")
    if where is None or len(where.input) != 3:
        return None
    isnan = imp.producers.get(where.input[0])
    p = where.input[2]
    zero = imp.lookup_known(where.input[1])
    soft = imp.producers.get(p)
    if isnan is None or isnan.op_type != "IsNaN" or isnan.input[0] != p or zero is None or \
            zero.dtype == object or np.any(np.asarray(zero) != 0) or soft is None or \
            soft.op_type != "Softmax" or p in imp.graph_outputs or \
            len(imp.consumers.get(p, [])) != 2 or len(imp.consumers.get(where.input[0], [])) != 1:
        return None
    return soft


def soft_axis(node, rank: int) -> int:
    from onnx import helper

    ax = next((helper.get_attribute_value(x) for x in node.attribute if x.name == "axis"), -1)
    return ax % rank


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
    mean = ctx.emit("mean", [x], {"axes": axes, "keepdim": True})
    var = ctx.emit("var", [x], {"axes": axes, "keepdim": True, "correction": 0})
    inv = ctx.emit("rsqrt", [ctx.emit("add", [var, scalar_like(ctx, eps, var)])])
    return (y, mean, inv)


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


# -- Resize -----------------------------------------------------------------------------------
#
# Resize is separable and, along each axis, linear in its input (for the nearest, linear and
# cubic modes, antialiased or not): output line = M @ input line. M is taken from onnx's own
# reference Resize, run on inputs that are one-hot along the axis and constant along the others,
# so every coordinate mode, rounding rule, cubic coefficient, exclude_outside, antialias filter
# and keep_aspect_ratio policy means exactly what ONNX says. Nearest becomes a gather; the
# others a matmul with M. tf_crop_and_resize's extrapolated positions get their value last.


def _reference_resize(node, x, roi, scales, sizes, opset):
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = ["x", "roi" if roi is not None else "", "scales" if scales is not None else "",
             "sizes" if sizes is not None else ""]
    while names and not names[-1]:
        names.pop()
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs["extrapolation_value"] = float("nan")   # marks the positions extrapolated
    n = helper.make_node("Resize", names, ["y"], **attrs)
    feeds = {"x": x}
    for k, v in (("roi", roi), ("scales", scales), ("sizes", sizes)):
        if v is not None:
            feeds[k] = v
    return ReferenceEvaluator(n, opsets={"": opset}).run(None, feeds)[0]


@onnx_converter("Resize")
def _resize(ctx):
    from ..convert.movement import _gather_axis

    x = ctx.input(0)
    roi, scales, sizes = (ctx.const(i, what) for i, what in ((1, "roi"), (2, "scales"), (3, "sizes")))
    roi, scales, sizes = ((None if v is None or np.asarray(v).size == 0 else np.asarray(v))
                          for v in (roi, scales, sizes))
    shape = x.type.shape
    if not all(isinstance(d, int) for d in shape):
        raise NotImplementedError("Resize of a tensor with symbolic dims")
    mode = ctx.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        ctx.refuse(f"Resize mode {mode!r}")
    work = np.float64 if mode != "nearest" else np.float32
    ones = _reference_resize(ctx.onnx, np.ones(shape, work), roi, scales, sizes, ctx.opset)
    out_shape = ones.shape
    extrapolated = np.isnan(ones)
    # Each axis on its own, the others of size 1, when nothing couples them (no aspect-ratio
    # policy, no per-axis roi, no axes subset): the reference then runs on lines, not images.
    alone = ctx.attr("keep_aspect_ratio_policy", "stretch") == "stretch" and roi is None and \
        not ctx.has_attr("axes")
    y = x
    for a in range(len(shape)):
        n_in, n_out = shape[a], out_shape[a]
        m = np.zeros((n_out, n_in))
        b_shape, b_scales, b_sizes = shape, scales, sizes
        if alone:
            b_shape = tuple(n_in if j == a else 1 for j in range(len(shape)))
            if sizes is not None:
                b_sizes = np.array([n_out if j == a else 1 for j in range(len(shape))], np.int64)
            else:
                b_scales = np.array([scales[j] if j == a else 1.0 for j in range(len(shape))],
                                    np.asarray(scales).dtype)
        for i in range(n_in):
            basis = np.zeros(b_shape, work)
            idx = [slice(None)] * len(shape)
            idx[a] = i
            basis[tuple(idx)] = 1
            line = _reference_resize(ctx.onnx, basis, roi, b_scales, b_sizes, ctx.opset)
            pick = [0] * len(shape)
            pick[a] = slice(None)
            m[:, i] = np.nan_to_num(line[tuple(pick)], nan=0.0)
        if n_in == n_out and np.allclose(m, np.eye(n_in)):
            continue
        if mode == "nearest":
            if not np.all((m == 0) | (m == 1)) or not np.all(m.sum(1) <= 1):
                ctx.refuse("a nearest Resize that mixes inputs")
            y = _gather_axis(ctx, y, a, m.argmax(1))
            continue
        if not y.type.dtype.is_float:
            ctx.refuse(f"{mode} Resize of an integer tensor")
        mt = ctx.b.literal(m.T.astype(y.type.dtype.numpy), f"{ctx._node_base()}.interp{a}")
        r = y.type.rank
        perm = tuple(j for j in range(r) if j != a) + (a,)
        z = ctx.emit("permute", [y], {"perm": perm}) if a != r - 1 else y
        z = ctx.emit("matmul", [z, mt])
        if a != r - 1:
            z = ctx.emit("permute", [z], {"perm": tuple(int(p) for p in np.argsort(perm))})
        y = z
    if extrapolated.any():
        mask = ctx.b.literal(extrapolated, f"{ctx._node_base()}.outside")
        y = ctx.emit("where", [mask, scalar_like(ctx, ctx.attr("extrapolation_value", 0.0), y), y])
    return y
