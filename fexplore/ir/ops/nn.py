"""Ops whose intent matters to an NPU and which ingestion keeps whole: contractions (matmul, linear,
conv2d), pooling, normalizations and scaled-dot-product attention."""

from __future__ import annotations

import math

import numpy as np

from ..opdef import AttrSpec, Category, Cost, OpDef, io_bytes
from ..opset import register
from ..types import DType, TensorType, dims_equal, numel
from .rules import TypeRuleError, broadcast_shapes, float_result


def _f(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind != "f" or x.dtype == np.float64:
        return x
    return x.astype(np.float32, copy=False)


# -- contractions -----------------------------------------------------------------------------

def _matmul_type(ins, a):
    x, y = ins
    if x.rank < 1 or y.rank < 1:
        raise TypeRuleError("matmul: operands must have rank >= 1")
    xs = (1,) + x.shape if x.rank == 1 else x.shape
    ys = y.shape + (1,) if y.rank == 1 else y.shape
    if not dims_equal(xs[-1], ys[-2]):
        raise TypeRuleError(f"matmul: contracted dims differ: {xs[-1]} vs {ys[-2]}")
    batch = broadcast_shapes(xs[:-2], ys[:-2])
    shape = batch + ((xs[-2],) if x.rank > 1 else ()) + ((ys[-1],) if y.rank > 1 else ())
    if x.dtype != y.dtype:
        raise TypeRuleError(f"matmul: operand dtypes differ: {x.dtype} vs {y.dtype}")
    return [TensorType(shape, a["out_dtype"] or x.dtype)]


def _matmul_cost(ins, outs, a) -> Cost:
    x = ins[0]
    k = x.shape[-1]
    return Cost(flops=2 * numel(outs[0].shape) * k, bytes=io_bytes(ins, outs))


# Contractions accumulate in f32 whatever their operands; ``out_dtype`` (default: the operands'
# dtype) says what they write, so bf16/fp8 operands can feed an f32 epilogue.
_OUT_DTYPE = AttrSpec("out_dtype", "dtype", None, optional=True)

register(OpDef("matmul", Category.contraction, _matmul_type,
               lambda xs, a: [np.matmul(_f(xs[0]), _f(xs[1]))], _matmul_cost, arity=2,
               attrs=(_OUT_DTYPE,),
               doc="torch.matmul semantics, batch dims broadcast"))


def _linear_type(ins, a):
    x, w = ins[0], ins[1]
    if w.rank != 2 or not dims_equal(x.shape[-1], w.shape[1]):
        raise TypeRuleError(f"linear: weight {w} does not fit input {x}")
    if len(ins) == 3 and (ins[2].rank != 1 or not dims_equal(ins[2].shape[0], w.shape[0])):
        raise TypeRuleError(f"linear: bias {ins[2]} does not fit weight {w}")
    return [TensorType(x.shape[:-1] + (w.shape[0],), a["out_dtype"] or x.dtype)]


def _linear_ref(xs, a):
    y = np.matmul(_f(xs[0]), _f(xs[1]).T)
    if len(xs) == 3:
        y += _f(xs[2])  # in place: the bias pass costs a third of the matmul otherwise
    return [y]


register(OpDef("linear", Category.contraction, _linear_type, _linear_ref, _matmul_cost,
               attrs=(_OUT_DTYPE,), arity=None, min_inputs=2,
               doc="y = x @ w.T (+ b); inputs (x, w) or (x, w, b)"))


def _grouped_matmul_type(ins, a):
    x, w, ends = ins
    if x.rank != 2 or w.rank != 3 or ends.rank != 1:
        raise TypeRuleError(f"grouped_matmul: rows (S, K), matrices (G, K, N) and ends (G,), got {x}, {w}, {ends}")
    k, n = (w.shape[2], w.shape[1]) if a["transpose_w"] else (w.shape[1], w.shape[2])
    if not dims_equal(x.shape[1], k):
        raise TypeRuleError(f"grouped_matmul: contracted dims differ: {x.shape[1]} vs {k}")
    if not dims_equal(ends.shape[0], w.shape[0]):
        raise TypeRuleError(f"grouped_matmul: {ends.shape[0]} group ends for {w.shape[0]} matrices")
    if ends.dtype not in (DType.i32, DType.i64):
        raise TypeRuleError(f"grouped_matmul: group ends must be integers, got {ends.dtype}")
    if x.dtype != w.dtype:
        raise TypeRuleError(f"grouped_matmul: operand dtypes differ: {x.dtype} vs {w.dtype}")
    return [TensorType((x.shape[0], n), a["out_dtype"] or x.dtype)]


def _grouped_matmul_ref(xs, a):
    x, w, ends = _f(xs[0]), _f(xs[1]), np.asarray(xs[2]).astype(np.int64)
    if a["transpose_w"]:
        w = w.transpose(0, 2, 1)
    if np.any(ends < 0) or np.any(np.diff(ends) < 0):
        raise ValueError(f"grouped_matmul: group ends {ends.tolist()} must be non-negative and must not "
                         "decrease (rows are sorted by group)")
    y = np.zeros((x.shape[0], w.shape[2]), np.result_type(x, w))
    start = 0
    for g, end in enumerate(np.minimum(ends, x.shape[0])):
        if end > start:
            y[start:end] = x[start:end] @ w[g]
        start = max(start, int(end))
    return [y]


def _grouped_matmul_cost(ins, outs, a) -> Cost:
    return Cost(flops=2 * numel(outs[0].shape) * ins[0].shape[1], bytes=io_bytes(ins, outs))


register(OpDef("grouped_matmul", Category.contraction, _grouped_matmul_type, _grouped_matmul_ref,
               _grouped_matmul_cost, arity=3,
               attrs=(AttrSpec("transpose_w", "bool", False), _OUT_DTYPE),
               doc="rows of x (S, K) sorted into groups, group g the rows ends[g-1]:ends[g] (from 0), "
                   "each times its group's matrix w[g] (K, N; w[g].T with transpose_w); rows past "
                   "the last end are zero. A mixture of experts' expert layer over tokens sorted by "
                   "expert (torch's grouped_mm). Ends must be non-negative and must not decrease"))


def _conv_out(size, k, stride, pad, dil):
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


_CONV_ATTRS = (AttrSpec("stride", "ints", (1, 1)), AttrSpec("padding", "ints", (0, 0)),
               AttrSpec("dilation", "ints", (1, 1)), AttrSpec("groups", "int", 1))


def _conv2d_type(ins, a):
    x, w = ins[0], ins[1]
    if x.rank != 4 or w.rank != 4:
        raise TypeRuleError("conv2d: input and weight must be 4-D (NCHW, OIHW)")
    g = a["groups"]
    if not dims_equal(x.shape[1], w.shape[1] * g):
        raise TypeRuleError(f"conv2d: {x.shape[1]} input channels vs weight {w.shape} x groups {g}")
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["padding"], a["dilation"]
    oh = _conv_out(x.shape[2], w.shape[2], sh, ph, dh)
    ow = _conv_out(x.shape[3], w.shape[3], sw, pw, dw)
    return [TensorType((x.shape[0], w.shape[0], oh, ow), a["out_dtype"] or x.dtype)]


def _windows(x: np.ndarray, kh, kw, stride, dilation) -> np.ndarray:
    """A strided view (N, C, OH, OW, KH, KW) of every kernel window of an already padded x."""
    n, c, h, w = x.shape
    (sh, sw), (dh, dw) = stride, dilation
    oh = (h - dh * (kh - 1) - 1) // sh + 1
    ow = (w - dw * (kw - 1) - 1) // sw + 1
    s = x.strides
    return np.lib.stride_tricks.as_strided(
        x, (n, c, oh, ow, kh, kw), (s[0], s[1], s[2] * sh, s[3] * sw, s[2] * dh, s[3] * dw),
        writeable=False)


def _conv2d_ref(xs, a):
    x, w = _f(xs[0]), _f(xs[1])
    ph, pw = a["padding"]
    x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    g = a["groups"]
    o, cg, kh, kw = w.shape
    win = _windows(np.ascontiguousarray(x), kh, kw, a["stride"], a["dilation"])
    n, c, oh, ow = win.shape[:4]
    win = win.reshape(n, g, cg, oh, ow, kh, kw)
    wg = w.reshape(g, o // g, cg, kh, kw)
    y = np.einsum("ngchwij,gocij->ngohw", win, wg, optimize=True).reshape(n, o, oh, ow)
    if len(xs) == 3:
        y = y + _f(xs[2]).reshape(1, -1, 1, 1)
    return [y]


def _conv2d_cost(ins, outs, a) -> Cost:
    w = ins[1]
    macs = numel(outs[0].shape) * w.shape[1] * w.shape[2] * w.shape[3]
    return Cost(flops=2 * macs, bytes=io_bytes(ins, outs))


register(OpDef("conv2d", Category.contraction, _conv2d_type, _conv2d_ref, _conv2d_cost,
               attrs=_CONV_ATTRS + (_OUT_DTYPE,), arity=None, min_inputs=2,
               doc="NCHW input, OIHW weight, optional bias"))


# -- pooling ----------------------------------------------------------------------------------

def _pool_out(size, k, s, p, d, ceil_mode):
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:  # the last window must start inside the input
        out -= 1
    return out


_POOL_ATTRS = (AttrSpec("kernel", "ints"), AttrSpec("stride", "ints"),
               AttrSpec("padding", "ints", (0, 0)), AttrSpec("ceil_mode", "bool", False))


def _pool_type_with(dilation_of):
    def infer(ins, a):
        (x,) = ins
        if x.rank != 4:
            raise TypeRuleError("pooling takes NCHW input")
        (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["padding"]
        dh, dw = dilation_of(a)
        if a["ceil_mode"] and not (isinstance(x.shape[2], int) and isinstance(x.shape[3], int)):
            # whether the last window starts inside the input depends on the size
            raise TypeRuleError("ceil_mode pooling needs static spatial dims")
        oh = _pool_out(x.shape[2], kh, sh, ph, dh, a["ceil_mode"])
        ow = _pool_out(x.shape[3], kw, sw, pw, dw, a["ceil_mode"])
        return [TensorType((x.shape[0], x.shape[1], oh, ow), x.dtype)]

    return infer


def _pool_windows(x, a, fill, dilation=(1, 1)):
    (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["padding"]
    oh, ow = _pool_type_with(lambda _: dilation)(
        [TensorType(x.shape, DType.f32)], a)[0].shape[2:]
    # taps past the padded input only ever see the fill, which no max or sum keeps: a window
    # larger than the input (EfficientNet's final AvgPool2d(2560, ceil_mode=True) on a 2x2 map)
    # is cut to the taps that can land inside instead of padding the input to the window's size
    kh = min(kh, (x.shape[2] + 2 * ph - 1) // dilation[0] + 1)
    kw = min(kw, (x.shape[3] + 2 * pw - 1) // dilation[1] + 1)
    # pad enough on the bottom/right for ceil_mode's partial windows
    need_h = (oh - 1) * sh + dilation[0] * (kh - 1) + 1
    need_w = (ow - 1) * sw + dilation[1] * (kw - 1) + 1
    xp = np.pad(x, ((0, 0), (0, 0), (ph, max(0, need_h - x.shape[2] - ph)),
                    (pw, max(0, need_w - x.shape[3] - pw))), constant_values=fill)
    win = _windows(np.ascontiguousarray(xp), kh, kw, (sh, sw), dilation)
    return win[:, :, :oh, :ow]


def _max_pool_ref(xs, a):
    x = _f(xs[0])
    fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    return [_pool_windows(x, a, fill, a["dilation"]).max(axis=(4, 5))]


register(OpDef("max_pool2d", Category.reduction, _pool_type_with(lambda a: a["dilation"]),
               _max_pool_ref,
               lambda ins, outs, a: Cost(numel(outs[0].shape) * a["kernel"][0] * a["kernel"][1],
                                         io_bytes(ins, outs)),
               attrs=_POOL_ATTRS + (AttrSpec("dilation", "ints", (1, 1)),), arity=1))


def _max_pool_indices_type(ins, a):
    (values,) = _pool_type_with(lambda a: a["dilation"])(ins, a)
    return [values, TensorType(values.shape, DType.i64)]


def _max_pool_indices_ref(xs, a):
    """torch's max_pool2d_with_indices: each window's max and where it is, as a flat index into
    its (H, W) plane; the first maximum in the window wins, except that a NaN is the maximum and
    the last NaN wins (torch's kernel takes a value that is greater or NaN)."""
    x = _f(xs[0])
    h, w = x.shape[2:]
    fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    win = _pool_windows(x, a, fill, a["dilation"])
    flat = win.reshape(win.shape[:4] + (-1,))
    pos = np.argmax(flat, axis=-1)
    if x.dtype.kind == "f":
        nan = np.isnan(flat)
        last_nan = flat.shape[-1] - 1 - np.argmax(nan[..., ::-1], axis=-1)
        pos = np.where(nan.any(axis=-1), last_nan, pos)
    pos = pos[..., None]
    plane = np.arange(h * w, dtype=np.int64).reshape(1, 1, h, w)
    where = _pool_windows(plane, a, -1, a["dilation"])
    where = np.broadcast_to(where.reshape(where.shape[:4] + (-1,)), flat.shape)
    return [np.take_along_axis(flat, pos, -1)[..., 0], np.take_along_axis(where, pos, -1)[..., 0]]


register(OpDef("max_pool2d_with_indices", Category.reduction, _max_pool_indices_type,
               _max_pool_indices_ref,
               lambda ins, outs, a: Cost(numel(outs[0].shape) * a["kernel"][0] * a["kernel"][1],
                                         io_bytes(ins, outs)),
               attrs=_POOL_ATTRS + (AttrSpec("dilation", "ints", (1, 1)),), arity=1,
               doc="(values, indices): max_pool2d and each maximum's flat index in its (H, W) "
                   "plane, as torch returns them"))


def _avg_pool_ref(xs, a):
    x = _f(xs[0]).astype(np.float64)
    s = _pool_windows(x, a, 0.0).sum(axis=(4, 5))
    if a["divisor"] is not None:
        return [s / a["divisor"]]
    # the divisor counts the window's cells inside the (padded, if count_include_pad) input
    ones = np.ones((1, 1) + x.shape[2:])
    if a["count_include_pad"]:
        ph, pw = a["padding"]
        ones = np.pad(ones, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=1.0)
        a2 = dict(a)
        a2["padding"] = (0, 0)
        ref = _pool_windows(ones, a2, 0.0)
        ref = ref[:, :, :s.shape[2], :s.shape[3]]
    else:
        ref = _pool_windows(ones, a, 0.0)
    return [s / ref.sum(axis=(4, 5))]


register(OpDef("avg_pool2d", Category.reduction, _pool_type_with(lambda a: (1, 1)),
               _avg_pool_ref,
               lambda ins, outs, a: Cost(numel(outs[0].shape) * a["kernel"][0] * a["kernel"][1],
                                         io_bytes(ins, outs)),
               attrs=_POOL_ATTRS + (AttrSpec("count_include_pad", "bool", True),
                                    AttrSpec("divisor", "int", None, optional=True)), arity=1))


def _adaptive_type(ins, a):
    (x,) = ins
    if x.rank != 4:
        raise TypeRuleError("adaptive_avg_pool2d takes NCHW input")
    return [TensorType(x.shape[:2] + tuple(a["output_size"]), x.dtype)]


def adaptive_bins(n: int, o: int) -> list[tuple[int, int]]:
    """torch's adaptive pooling windows of `o` outputs over `n` inputs: [floor(i*n/o), ceil((i+1)*n/o))."""
    return [((i * n) // o, -(-((i + 1) * n) // o)) for i in range(o)]


def _adaptive_ref(xs, a):
    x = _f(xs[0]).astype(np.float64)
    h, w = x.shape[2:]
    oh, ow = a["output_size"]
    out = np.empty(x.shape[:2] + (oh, ow))
    for i, (h0, h1) in enumerate(adaptive_bins(h, oh)):
        for j, (w0, w1) in enumerate(adaptive_bins(w, ow)):
            out[:, :, i, j] = x[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
    return [out]


register(OpDef("adaptive_avg_pool2d", Category.reduction, _adaptive_type, _adaptive_ref,
               lambda ins, outs, a: Cost(numel(ins[0].shape), io_bytes(ins, outs)),
               attrs=(AttrSpec("output_size", "ints"),), arity=1))


# -- normalizations ---------------------------------------------------------------------------

def _norm_cost(per_element):
    return lambda ins, outs, a: Cost(numel(ins[0].shape) * per_element, io_bytes(ins, outs))


def _batch_norm_type(ins, a):
    x = ins[0]
    for t in ins[1:]:
        if t.rank != 1 or not dims_equal(t.shape[0], x.shape[1]):
            raise TypeRuleError(f"batch_norm: per-channel operand {t} does not fit {x}")
    return [TensorType(x.shape, float_result(x.dtype))]


def _batch_norm_ref(xs, a):
    x, w, b, mean, var = (_f(t).astype(np.float64) for t in xs)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = 1.0 / np.sqrt(var + a["eps"])
    return [(x - mean.reshape(shape)) * (inv * w).reshape(shape) + b.reshape(shape)]


register(OpDef("batch_norm", Category.opaque, _batch_norm_type, _batch_norm_ref, _norm_cost(2),
               attrs=(AttrSpec("eps", "float", 1e-5),), arity=5,
               doc="inference batch norm: inputs (x, weight, bias, running_mean, running_var)"))


def _layer_norm_type(ins, a):
    x = ins[0]
    nd = a["ndim"]
    if not 1 <= nd <= x.rank:
        raise TypeRuleError(f"layer_norm: ndim {nd} outside rank {x.rank}")
    for t in ins[1:]:
        if t.rank != nd or not all(dims_equal(p, q) for p, q in zip(t.shape, x.shape[-nd:])):
            raise TypeRuleError(f"layer_norm: affine operand {t} does not fit {x}")
    return [TensorType(x.shape, float_result(x.dtype))]


def _layer_norm_ref(xs, a):
    x = _f(xs[0]).astype(np.float64)
    axes = tuple(range(x.ndim - a["ndim"], x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mu) / np.sqrt(var + a["eps"])
    if len(xs) > 1:
        y = y * _f(xs[1])
    if len(xs) > 2:
        y = y + _f(xs[2])
    return [y]


register(OpDef("layer_norm", Category.opaque, _layer_norm_type, _layer_norm_ref, _norm_cost(8),
               attrs=(AttrSpec("ndim", "int", 1), AttrSpec("eps", "float", 1e-5)),
               arity=None, min_inputs=1,
               doc="normalizes the last ndim axes; inputs (x), (x, weight) or (x, weight, bias)"))


def _rms_norm_ref(xs, a):
    x = _f(xs[0]).astype(np.float64)
    axes = tuple(range(x.ndim - a["ndim"], x.ndim))
    eps = a["eps"]
    if eps is None:  # torch's default: f32's machine epsilon (for bf16 and f16 inputs too)
        eps = float(np.finfo(np.float32).eps)
    y = x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + eps)
    if len(xs) > 1:
        y = y * _f(xs[1])
    return [y]


register(OpDef("rms_norm", Category.opaque, _layer_norm_type, _rms_norm_ref, _norm_cost(4),
               attrs=(AttrSpec("ndim", "int", 1), AttrSpec("eps", "float", None, optional=True)),
               arity=None, min_inputs=1, doc="inputs (x) or (x, weight)"))


# -- attention --------------------------------------------------------------------------------

def _sdpa_type(ins, a):
    q, k, v = ins[:3]
    if q.rank < 2 or k.rank != q.rank or v.rank != q.rank:
        raise TypeRuleError("attention: q, k, v must share a rank >= 2")
    if not dims_equal(q.shape[-1], k.shape[-1]) or not dims_equal(k.shape[-2], v.shape[-2]):
        raise TypeRuleError(f"attention: q {q}, k {k}, v {v} do not fit together")
    # batch and head axes: k and v match q's or broadcast from 1 (multi-query attention with
    # one shared key/value head is written that way), except gqa's grouped head axis
    for ax in range(-q.rank, -2):
        for t in (k, v):
            if dims_equal(t.shape[ax], q.shape[ax]) or t.shape[ax] == 1:
                continue
            if ax == -3 and a["gqa"]:
                continue
            raise TypeRuleError(f"attention: k {k} / v {v} do not broadcast to q {q} on axis "
                                f"{ax}" + ("; set gqa for grouped-query attention" if ax == -3
                                           else ""))
    return [TensorType(q.shape[:-1] + (v.shape[-1],), a["out_dtype"] or q.dtype)]


def _sdpa_ref(xs, a):
    q, k, v = (_f(t).astype(np.float64) for t in xs[:3])
    if a["gqa"] and q.ndim >= 3 and q.shape[-3] != k.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k = np.repeat(k, rep, axis=-3)
        v = np.repeat(v, rep, axis=-3)
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    L, S = q.shape[-2], k.shape[-2]
    if a["causal"]:
        s = np.where(np.tril(np.ones((L, S), dtype=bool)), s, -np.inf)
    if len(xs) == 4:
        m = xs[3]
        s = np.where(m, s, -np.inf) if m.dtype == np.bool_ else s + _f(m)
    mx = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(mx), mx, 0.0))
    den = e.sum(axis=-1, keepdims=True)
    # a query that may attend to nothing (a padding row) gets zeros, as torch's SDPA gives
    # (its safe softmax), not softmax's 0/0; a NaN score still propagates
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(den == 0, 0.0, e / den)
    return [np.matmul(p, v)]


def _sdpa_cost(ins, outs, a) -> Cost:
    q, k, v = ins[:3]
    scores = numel(q.shape[:-1]) * k.shape[-2]
    return Cost(flops=2 * scores * q.shape[-1] + 2 * scores * v.shape[-1] + 5 * scores,
                bytes=io_bytes(ins, outs))


register(OpDef("attention", Category.opaque, _sdpa_type, _sdpa_ref, _sdpa_cost,
               attrs=(AttrSpec("causal", "bool", False),
                      AttrSpec("scale", "float", None, optional=True),
                      AttrSpec("gqa", "bool", False), _OUT_DTYPE),
               arity=None, min_inputs=3,
               doc="scaled_dot_product_attention: (q, k, v) or (q, k, v, mask); a bool mask keeps "
                   "True, a float mask is added to the scores; a fully masked query row is zero"))
