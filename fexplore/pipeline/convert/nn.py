"""Converters for the ops whose intent ingestion keeps: contractions, convolutions, pooling,
normalizations and attention."""

from __future__ import annotations

import numpy as np

from fexplore.ir import DType

from .registry import ConvertContext, converter


@converter("aten.linear.default")
def _linear(ctx):
    x, w = ctx.args[0], ctx.args[1]
    b = ctx.arg(2, "bias")
    return ctx.emit("linear", [x, w] + ([b] if b is not None else []))


@converter("aten.addmm.default")
def _addmm(ctx):
    bias, x, w = ctx.args[0], ctx.args[1], ctx.args[2]
    beta, alpha = ctx.kwargs.get("beta", 1), ctx.kwargs.get("alpha", 1)
    y = ctx.emit("matmul", [x, w])
    if alpha != 1:
        y = ctx.emit("mul", [y, alpha])
    if beta != 1:
        bias = ctx.emit("mul", [bias, beta])
    return ctx.emit("add", [y, bias]) if beta != 0 else y


@converter("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def _matmul(ctx):
    return ctx.emit("matmul", [ctx.args[0], ctx.args[1]])


@converter("aten._grouped_mm.default", "transformers.grouped_mm_fallback.default")
def _grouped_mm(ctx):
    """Rows of x (S, K) sorted into groups, group g ending before row offs[g]; each row times its
    group's matrix w[g] (K, N). (A MoE layer's experts over tokens sorted by expert; the second
    name is transformers' own op for the same product where torch's kernel does not apply.)
    Written as a per-row gather of the group's matrix and a batched matmul; rows past the last
    offset (no group) are zero."""
    x, w = ctx.args[0], ctx.args[1]
    offs = ctx.kwargs.get("offs", ctx.arg(2))
    if ctx.kwargs.get("bias", ctx.arg(3)) is not None:
        raise NotImplementedError("grouped_mm with a bias")
    if offs is None or x.type.rank != 2 or w.type.rank != 3:
        raise NotImplementedError("grouped_mm other than rows (S, K) by groups (G, K, N) at offs")
    (s, k), g = x.type.shape, w.type.shape[0]
    rows = ctx.emit("arange", [], {"start": 0, "end": s, "step": 1, "dtype": DType.i64})
    rows = ctx.emit("reshape", [rows], {"shape": (s, 1)})
    ends = ctx.emit("cast", [offs], {"dtype": DType.i64})
    # a row's group is the number of groups that end at or before it
    ended = ctx.emit("cast", [ctx.emit("le", [ends, rows])], {"dtype": DType.i64})
    group = ctx.emit("sum", [ended], {"axes": (1,), "keepdim": False})
    group = ctx.emit("minimum", [group, g - 1])
    mats = ctx.emit("index", [w, group], {"axes": (0,)})                        # (S, K, N)
    y = ctx.emit("matmul", [ctx.emit("reshape", [x], {"shape": (s, 1, k)}), mats])
    y = ctx.emit("reshape", [y], {"shape": (s, w.type.shape[2])})
    grouped = ctx.emit("lt", [rows, ctx.emit("select", [ends], {"axis": 0, "index": g - 1})])
    y = ctx.emit("where", [grouped, y, ctx.scalar(0, y.type.dtype)])
    want = ctx.out_type().dtype
    return y if y.type.dtype == want else ctx.emit("cast", [y], {"dtype": want})


def _pair(v):
    v = tuple(v)
    return v * 2 if len(v) == 1 else v


@converter("aten.conv2d.default", "aten.conv1d.default", "aten.convolution.default")
def _conv(ctx):
    target = str(ctx.node.target)
    x, w = ctx.args[0], ctx.args[1]
    b = ctx.arg(2, "bias")
    if target == "aten.convolution.default":
        stride, padding, dilation, transposed, out_pad, groups = ctx.args[3:9]
        if transposed:
            return _conv_transpose(ctx, x, w, b, stride, padding, dilation, out_pad, groups)
    else:
        stride = ctx.arg(3, "stride", (1,))
        padding = ctx.arg(4, "padding", (0,))
        dilation = ctx.arg(5, "dilation", (1,))
        groups = ctx.arg(6, "groups", 1)
    if isinstance(padding, str):
        raise NotImplementedError(f"string padding {padding!r}; export gives explicit padding "
                                  "for most models")
    one_d = x.type.rank == 3
    if one_d:  # conv1d is conv2d over a unit height
        x = ctx.emit("reshape", [x], {"shape": x.type.shape[:2] + (1,) + x.type.shape[2:]})
        w = ctx.emit("reshape", [w], {"shape": w.type.shape[:2] + (1,) + w.type.shape[2:]})
        stride, padding, dilation = ((1,) + tuple(stride), (0,) + tuple(padding),
                                     (1,) + tuple(dilation))
    y = ctx.emit("conv2d", [x, w] + ([b] if b is not None else []),
                 {"stride": _pair(stride), "padding": _pair(padding),
                  "dilation": _pair(dilation), "groups": groups})
    if one_d:
        y = ctx.emit("reshape", [y], {"shape": y.type.shape[:2] + y.type.shape[3:]})
    return y


def _conv_transpose(ctx, x, w, b, stride, padding, dilation, out_pad, groups):
    """A transposed convolution is a plain one over the input with zeros between its pixels,
    with the kernel flipped and its in/out channels swapped (per group), and the padding
    mirrored. Built from IR ops; the weight rearrangement folds away at compile time."""
    if x.type.rank != 4:
        raise NotImplementedError("transposed convolution other than 2-D")
    n, c, h, wd = x.type.shape
    cin, cout_g, kh, kw = w.type.shape
    (sh, sw), (ph, pw), (dh, dw), (oph, opw) = (_pair(stride), _pair(padding), _pair(dilation),
                                                _pair(out_pad))
    pad_h, pad_w = dh * (kh - 1) - ph, dw * (kw - 1) - pw
    if pad_h < 0 or pad_w < 0:
        raise NotImplementedError("transposed convolution with padding beyond the kernel")
    if sh > 1 or sw > 1:  # zeros between pixels: (N,C,H,1,W,1) padded to (N,C,H,sh,W,sw)
        x = ctx.emit("reshape", [x], {"shape": (n, c, h, 1, wd, 1)})
        x = ctx.emit("pad", [x], {"pads": (0, sw - 1, 0, 0, 0, sh - 1), "value": 0.0})
        x = ctx.emit("reshape", [x], {"shape": (n, c, h * sh, wd * sw)})
        x = ctx.emit("slice", [x], {"axis": 2, "start": 0, "end": (h - 1) * sh + 1})
        x = ctx.emit("slice", [x], {"axis": 3, "start": 0, "end": (wd - 1) * sw + 1})
    x = ctx.emit("pad", [x], {"pads": (pad_w, pad_w + opw, pad_h, pad_h + oph), "value": 0.0})
    flip_h = ctx.b.literal(np.arange(kh - 1, -1, -1, dtype=np.int64), f"{ctx.node.name}.fliph")
    flip_w = ctx.b.literal(np.arange(kw - 1, -1, -1, dtype=np.int64), f"{ctx.node.name}.flipw")
    w = ctx.emit("index", [w, flip_h], {"axes": (2,)})
    w = ctx.emit("index", [w, flip_w], {"axes": (3,)})
    # (Cin, Cout/g, k, k) -> (g, Cin/g, Cout/g, k, k) -> (g, Cout/g, Cin/g, k, k) -> (Cout, Cin/g..)
    w = ctx.emit("reshape", [w], {"shape": (groups, cin // groups, cout_g, kh, kw)})
    w = ctx.emit("permute", [w], {"perm": (0, 2, 1, 3, 4)})
    w = ctx.emit("reshape", [w], {"shape": (groups * cout_g, cin // groups, kh, kw)})
    return ctx.emit("conv2d", [x, w] + ([b] if b is not None else []),
                    {"stride": (1, 1), "padding": (0, 0), "dilation": (dh, dw), "groups": groups})


@converter("aten.batch_norm.default", "aten._native_batch_norm_legit_no_training.default",
           "aten._native_batch_norm_legit_functional.default",
           "aten.native_batch_norm.default")
def _batch_norm(ctx):
    target = str(ctx.node.target)
    x, w, b, mean, var = ctx.args[:5]
    if target == "aten.batch_norm.default":
        training, eps = ctx.args[5], ctx.args[7]
    elif target.endswith("no_training.default"):
        training, eps = False, ctx.args[6]
    else:
        training, eps = ctx.args[5], ctx.args[7]
    if training and mean is None and var is None:
        y = _batch_statistics_norm(ctx, x, w, b, eps)
        return y if target == "aten.batch_norm.default" else (y, None, None)
    if training:
        raise NotImplementedError("batch norm in training mode (call model.eval() first)")
    c = x.type.shape[1]
    dt = x.type.dtype
    if w is None:
        w = ctx.emit("full", [], {"shape": (c,), "value": 1.0, "dtype": dt})
    if b is None:
        b = ctx.emit("full", [], {"shape": (c,), "value": 0.0, "dtype": dt})
    y = ctx.emit("batch_norm", [x, w, b, mean, var], {"eps": float(eps)})
    return y if target == "aten.batch_norm.default" else (y, None, None)


@converter("aten._native_batch_norm_legit.no_stats")
def _batch_norm_no_stats(ctx):
    x, w, b, training, _momentum, eps = ctx.args[:6]
    if not training:
        raise NotImplementedError("batch norm without statistics outside training mode")
    return _batch_statistics_norm(ctx, x, w, b, eps), None, None


def _batch_statistics_norm(ctx, x, w, b, eps):
    """Batch norm over the input's own statistics (no running ones): a function of the input, not
    a training-time update, e.g. the weight standardization of BiT's convolutions. Per channel
    (axis 1): (x - mean) / sqrt(biased var + eps), then the affine."""
    axes = tuple(a for a in range(x.type.rank) if a != 1)
    mean = ctx.emit("mean", [x], {"axes": axes, "keepdim": True})
    centered = ctx.emit("sub", [x, mean])
    var = ctx.emit("mean", [ctx.emit("mul", [centered, centered])], {"axes": axes, "keepdim": True})
    y = ctx.emit("mul", [centered, ctx.emit("rsqrt", [ctx.emit("add", [var, float(eps)])])])
    per_channel = (x.type.shape[1],) + (1,) * (x.type.rank - 2)
    if w is not None:
        y = ctx.emit("mul", [y, ctx.emit("reshape", [w], {"shape": per_channel})])
    if b is not None:
        y = ctx.emit("add", [y, ctx.emit("reshape", [b], {"shape": per_channel})])
    return y


@converter("aten.layer_norm.default", "aten.native_layer_norm.default")
def _layer_norm(ctx):
    x, shape = ctx.args[0], ctx.args[1]
    w, b = ctx.arg(2, "weight"), ctx.arg(3, "bias")
    eps = ctx.arg(4, "eps", 1e-5)
    if w is None and b is not None:
        w = ctx.emit("full", [], {"shape": b.type.shape, "value": 1.0, "dtype": b.type.dtype})
    ins = [x] + [t for t in (w, b) if t is not None]
    y = ctx.emit("layer_norm", ins, {"ndim": len(shape), "eps": float(eps)})
    return y if str(ctx.node.target) == "aten.layer_norm.default" else (y, None, None)


@converter("aten.rms_norm.default")
def _rms_norm(ctx):
    x, shape = ctx.args[0], ctx.args[1]
    w = ctx.arg(2, "weight")
    eps = ctx.arg(3, "eps")
    return ctx.emit("rms_norm", [x] + ([w] if w is not None else []),
                    {"ndim": len(shape), "eps": None if eps is None else float(eps)})


@converter("aten.max_pool2d.default", "aten.max_pool2d_with_indices.default")
def _max_pool(ctx):
    x = ctx.args[0]
    k = _pair(ctx.arg(1, "kernel_size"))
    stride = ctx.arg(2, "stride") or k
    attrs = {"kernel": k, "stride": _pair(stride), "padding": _pair(ctx.arg(3, "padding", (0,))),
             "dilation": _pair(ctx.arg(4, "dilation", (1,))),
             "ceil_mode": bool(ctx.arg(5, "ceil_mode", False))}
    y = ctx.emit("max_pool2d", [x], attrs)
    return y if str(ctx.node.target) == "aten.max_pool2d.default" else (y, None)


@converter("aten.avg_pool2d.default")
def _avg_pool(ctx):
    x = ctx.args[0]
    k = _pair(ctx.arg(1, "kernel_size"))
    stride = ctx.arg(2, "stride") or k
    return ctx.emit("avg_pool2d", [x], {
        "kernel": k, "stride": _pair(stride), "padding": _pair(ctx.arg(3, "padding", (0,))),
        "ceil_mode": bool(ctx.arg(4, "ceil_mode", False)),
        "count_include_pad": bool(ctx.arg(5, "count_include_pad", True)),
        "divisor": ctx.arg(6, "divisor_override")})


@converter("aten.adaptive_avg_pool2d.default", "aten._adaptive_avg_pool2d.default")
def _adaptive_avg_pool(ctx):
    x = ctx.args[0]
    out = ctx.out_type().shape[-2:]
    return ctx.emit("adaptive_avg_pool2d", [x], {"output_size": tuple(out)})


@converter("aten.scaled_dot_product_attention.default")
def _sdpa(ctx: ConvertContext):
    q, k, v = ctx.args[:3]
    mask = ctx.arg(3, "attn_mask")
    dropout = ctx.arg(4, "dropout_p", 0.0)
    if dropout:
        raise NotImplementedError("attention dropout (call model.eval() first)")
    attrs = {"causal": bool(ctx.arg(5, "is_causal", False)),
             "scale": ctx.kwargs.get("scale", ctx.arg(6)),
             "gqa": bool(ctx.kwargs.get("enable_gqa", ctx.arg(7, default=False)))}
    if attrs["scale"] is not None:
        attrs["scale"] = float(attrs["scale"])
    return ctx.emit("attention", [q, k, v] + ([mask] if mask is not None else []), attrs)


@converter("aten.native_group_norm.default", "aten.group_norm.default")
def _group_norm(ctx):
    """Group norm is a layer norm over (channels of a group x spatial): reshape to
    (N, G, C/G * HW), normalize the last axis, reshape back, then the per-channel affine."""
    target = str(ctx.node.target)
    x = ctx.args[0]
    if target == "aten.group_norm.default":
        groups, w, b, eps = ctx.args[1], ctx.arg(2, "weight"), ctx.arg(3, "bias"), \
            ctx.arg(4, "eps", 1e-5)
    else:
        w, b, groups, eps = ctx.args[1], ctx.args[2], ctx.args[6], ctx.args[7]
    shape = x.type.shape
    n, c = shape[0], shape[1]
    flat = ctx.emit("reshape", [x], {"shape": (n, groups, _numel(shape[1:]) // groups)})
    y = ctx.emit("layer_norm", [flat], {"ndim": 1, "eps": float(eps)})
    y = ctx.emit("reshape", [y], {"shape": shape})
    per_channel = (c,) + (1,) * (len(shape) - 2)
    if w is not None:
        y = ctx.emit("mul", [y, ctx.emit("reshape", [w], {"shape": per_channel})])
    if b is not None:
        y = ctx.emit("add", [y, ctx.emit("reshape", [b], {"shape": per_channel})])
    return y if target == "aten.group_norm.default" else (y, None, None)


def _numel(dims):
    n = 1
    for d in dims:
        n = n * d
    return n


@converter("aten.upsample_bilinear2d.vec", "aten.upsample_bilinear2d.default")
def _upsample_bilinear(ctx):
    """Bilinear resizing is two small contractions with constant interpolation matrices,
    rows then columns: y = A_h @ x @ A_w^T. On a contraction NPU that is the natural form."""
    x = ctx.args[0]
    align = bool(ctx.arg(2, "align_corners", False))
    scales = ctx.arg(3, "scale_factors") if str(ctx.node.target).endswith(".vec") else None
    oh, ow = ctx.out_type().shape[-2:]
    h, w = x.type.shape[-2:]
    if not all(isinstance(d, int) for d in (oh, ow, h, w)):
        raise NotImplementedError("bilinear upsampling with symbolic sizes")
    sh = sw = None
    if scales:
        sh, sw = scales
    a_h = _interp_matrix(h, oh, align, sh)
    a_w = _interp_matrix(w, ow, align, sw)
    dt = x.type.dtype.numpy
    rows = ctx.b.literal(a_h.astype(dt), f"{ctx.node.name}.rows")
    cols = ctx.b.literal(np.ascontiguousarray(a_w.T).astype(dt), f"{ctx.node.name}.cols")
    y = ctx.emit("matmul", [rows, x])
    return ctx.emit("matmul", [y, cols])


def _interp_matrix(size: int, out: int, align_corners: bool, scale) -> np.ndarray:
    """(out, size) weights of torch's linear interpolation along one axis."""
    m = np.zeros((out, size), dtype=np.float64)
    for i in range(out):
        if align_corners:
            src = i * (size - 1) / (out - 1) if out > 1 else 0.0
        else:
            ratio = 1.0 / scale if scale else size / out
            src = max((i + 0.5) * ratio - 0.5, 0.0)
        lo = min(int(np.floor(src)), size - 1)
        hi = min(lo + 1, size - 1)
        frac = src - lo
        m[i, lo] += 1.0 - frac
        m[i, hi] += frac
    return m
