"""Converters for the ops whose intent ingestion keeps: contractions, convolutions, pooling,
normalizations and attention."""

from __future__ import annotations

import operator

import numpy as np

from fexplore.ir import DType
from fexplore.ir.ops.nn import adaptive_bins

from .registry import ConvertContext, converter


@converter("aten.linear.default")
def _linear(ctx):
    x, w = ctx.args[0], ctx.args[1]
    b = ctx.arg(2, "bias")
    return ctx.emit("linear", [x, w] + ([b] if b is not None else []))


@converter("aten.addmm.default")
def _addmm(ctx):
    bias, x, w = ctx.args[0], ctx.args[1], ctx.args[2]
    return _scaled_add(ctx, bias, ctx.emit("matmul", [x, w]), ctx.kwargs.get("beta", 1),
                       ctx.kwargs.get("alpha", 1))


def _scaled_add(ctx, input, product, beta, alpha):
    """beta * input + alpha * product, as torch's add{mm,mv,bmm} compute it; beta == 0 ignores
    the input entirely (NaN in it does not propagate). On integer tensors torch takes beta and
    alpha as integers (truncated: 2.6 is 2), and the result stays integer."""
    if not product.type.dtype.is_float:
        beta, alpha = int(beta), int(alpha)
    y = product if alpha == 1 else ctx.emit("mul", [product, alpha])
    if beta == 0:
        return y
    return ctx.emit("add", [input if beta == 1 else ctx.emit("mul", [input, beta]), y])


@converter("aten.addmv.default")
def _addmv(ctx):
    input, mat, vec = ctx.args[:3]
    return _scaled_add(ctx, input, ctx.emit("matmul", [mat, vec]), ctx.kwargs.get("beta", 1),
                       ctx.kwargs.get("alpha", 1))


@converter("aten.addbmm.default")
def _addbmm(ctx):
    input, b1, b2 = ctx.args[:3]
    product = ctx.emit("sum", [ctx.emit("matmul", [b1, b2])], {"axes": (0,)})
    if product.type.dtype != b1.type.dtype:  # sum widens ints to i64; addbmm keeps their dtype
        product = ctx.emit("cast", [product], {"dtype": b1.type.dtype})
    return _scaled_add(ctx, input, product, ctx.kwargs.get("beta", 1), ctx.kwargs.get("alpha", 1))


@converter("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def _matmul(ctx):
    return ctx.emit("matmul", [ctx.args[0], ctx.args[1]])


@converter("aten._grouped_mm.default", "transformers.grouped_mm_fallback.default")
def _grouped_mm(ctx):
    """Rows of x (S, K) sorted into groups, group g ending before row offs[g]; each row times its
    group's matrix w[g] (K, N). (A MoE layer's experts over tokens sorted by expert; the second
    name is transformers' own op for the same product where torch's kernel does not apply.)
    The IR's grouped_matmul, whose rows past the last offset are zero (torch leaves them unset)."""
    x, w = ctx.args[0], ctx.args[1]
    offs = ctx.kwargs.get("offs", ctx.arg(2))
    if ctx.kwargs.get("bias", ctx.arg(3)) is not None:
        raise NotImplementedError("grouped_mm with a bias")
    if offs is None or x.type.rank != 2 or w.type.rank != 3:
        raise NotImplementedError("grouped_mm other than rows (S, K) by groups (G, K, N) at offs")
    want = ctx.out_type().dtype
    return ctx.emit("grouped_matmul", [x, w, offs], {"out_dtype": want if want != x.type.dtype else None})


def _pair(v):
    v = tuple(v)
    return v * 2 if len(v) == 1 else v


def _ntuple(v, k: int) -> tuple:
    v = (v,) if isinstance(v, int) else tuple(v)
    return v * k if len(v) == 1 else v


@converter("aten.conv2d.default", "aten.conv1d.default", "aten.conv3d.default",
           "aten.convolution.default")
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
    k = w.type.rank - 2  # spatial axes: the weight's say, whether or not x has a batch axis
    args = (_ntuple(stride, k), _ntuple(padding, k), _ntuple(dilation, k), groups)
    if x.type.rank == k + 1:  # unbatched (C, *S): a batch of one
        x = ctx.emit("reshape", [x], {"shape": (1,) + x.type.shape})
        y = _conv_nd(ctx, x, w, b, *args)
        return ctx.emit("reshape", [y], {"shape": y.type.shape[1:]})
    return _conv_nd(ctx, x, w, b, *args)


def _conv_nd(ctx, x, w, b, stride, padding, dilation, groups):
    """A convolution over any number of spatial axes as the IR's one conv2d: 1-D over a unit
    height; 3-D (video) and up by folding the first spatial axis away, recursively."""
    k = x.type.rank - 2
    bias = [b] if b is not None else []
    if k == 2:
        return ctx.emit("conv2d", [x, w] + bias, {"stride": stride, "padding": padding,
                                                 "dilation": dilation, "groups": groups})
    if k == 1:  # conv1d is conv2d over a unit height
        x = ctx.emit("reshape", [x], {"shape": x.type.shape[:2] + (1,) + x.type.shape[2:]})
        w = ctx.emit("reshape", [w], {"shape": w.type.shape[:2] + (1,) + w.type.shape[2:]})
        y = _conv_nd(ctx, x, w, b, (1,) + stride, (0,) + padding, (1,) + dilation, groups)
        return ctx.emit("reshape", [y], {"shape": y.type.shape[:2] + y.type.shape[3:]})
    if k < 1:
        raise NotImplementedError(f"convolution of a rank-{x.type.rank} input")
    return _conv_fold_first_axis(ctx, x, w, b, stride, padding, dilation, groups)


def _conv_fold_first_axis(ctx, x, w, b, stride, padding, dilation, groups):
    """Convolution over (D, *S) as one over S: the KD depth taps become input channels (each
    tap's depth-strided slice of the padded input, stacked group by group as grouped
    convolution wants them) and the output depths join the batch. One contraction; the input
    is read KD times, as im2col does along that axis."""
    n, c, d = x.type.shape[:3]
    rest = x.type.shape[3:]
    o, cg, kd = w.type.shape[:3]
    krest = w.type.shape[3:]
    (sd, *ss), (pd, *ps), (dd, *ds) = stride, padding, dilation
    if not isinstance(d, int):
        raise NotImplementedError("convolution along a symbolic leading spatial dim")
    if pd:
        x = ctx.emit("pad", [x], {"pads": (0, 0) * len(rest) + (pd, pd), "value": 0.0})
    dp = d + 2 * pd
    do = (dp - dd * (kd - 1) - 1) // sd + 1
    taps = []
    for j in range(kd):  # tap j sees input depths j*dd, j*dd + sd, ...
        t = x
        if not (j * dd == 0 and sd == 1 and do == dp):
            t = ctx.emit("slice", [x], {"axis": 2, "start": j * dd,
                                        "end": j * dd + sd * (do - 1) + 1, "step": sd})
        taps.append(ctx.emit("reshape", [t], {"shape": (n, c, 1, do) + rest}))
    x = taps[0] if kd == 1 else ctx.emit("concat", taps, {"axis": 2})
    # (N, C, KD, Do, *S) -> (N, G, C/G, KD, Do, *S) -> (N, Do, G, KD, C/G, *S)
    #   -> (N*Do, G*KD*C/G, *S)
    x = ctx.emit("reshape", [x], {"shape": (n, groups, cg, kd, do) + rest})
    r = len(rest)
    x = ctx.emit("permute", [x], {"perm": (0, 4, 1, 3, 2) + tuple(range(5, 5 + r))})
    x = ctx.emit("reshape", [x], {"shape": (n * do, groups * kd * cg) + rest})
    # (O, C/G, KD, *K) -> (O, KD, C/G, *K) -> (O, KD*C/G, *K)
    w = ctx.emit("permute", [w], {"perm": (0, 2, 1) + tuple(range(3, 3 + r))})
    w = ctx.emit("reshape", [w], {"shape": (o, kd * cg) + krest})
    y = _conv_nd(ctx, x, w, b, tuple(ss), tuple(ps), tuple(ds), groups)
    y = ctx.emit("reshape", [y], {"shape": (n, do, o) + y.type.shape[2:]})
    return ctx.emit("permute", [y], {"perm": (0, 2, 1) + tuple(range(3, 3 + r))})


def _conv_transpose(ctx, x, w, b, stride, padding, dilation, out_pad, groups):
    """A transposed convolution is a plain one over the input with zeros between its elements,
    with the kernel flipped and its in/out channels swapped (per group), and the padding
    mirrored; any number of spatial axes (1-d for audio decoders, 3-d for video ones), each
    handled the same way. Built from IR ops; the weight rearrangement folds away at compile
    time."""
    k = w.type.rank - 2
    if x.type.rank == k + 1:  # unbatched (C, *S): a batch of one
        x = ctx.emit("reshape", [x], {"shape": (1,) + x.type.shape})
        y = _conv_transpose(ctx, x, w, b, stride, padding, dilation, out_pad, groups)
        return ctx.emit("reshape", [y], {"shape": y.type.shape[1:]})
    stride, padding, dilation, out_pad = (_ntuple(v, k) for v in (stride, padding, dilation,
                                                                 out_pad))
    cin, cout_g = w.type.shape[:2]
    ksize = w.type.shape[2:]
    for i in range(k):
        ax, s = 2 + i, stride[i]
        size = x.type.shape[ax]
        if s > 1:  # zeros between elements: (.., L, 1, ..) padded to (.., L, s, ..), merged
            shape = x.type.shape
            x = ctx.emit("reshape", [x], {"shape": shape[:ax + 1] + (1,) + shape[ax + 1:]})
            x = ctx.emit("pad", [x], {"pads": _axis_pads(x.type.rank, ax + 1, 0, s - 1),
                                      "value": 0.0})
            x = ctx.emit("reshape", [x], {"shape": shape[:ax] + (size * s,) + shape[ax + 1:]})
            x = ctx.emit("slice", [x], {"axis": ax, "start": 0, "end": (size - 1) * s + 1})
        # the mirrored padding: dilation*(k-1) - padding each side, plus output_padding after;
        # a negative amount crops instead
        before = dilation[i] * (ksize[i] - 1) - padding[i]
        after = before + out_pad[i]
        if before > 0 or after > 0:
            x = ctx.emit("pad", [x], {"pads": _axis_pads(x.type.rank, ax, max(before, 0),
                                                         max(after, 0)), "value": 0.0})
        if before < 0 or after < 0:
            full = x.type.shape[ax]
            x = ctx.emit("slice", [x], {"axis": ax, "start": max(-before, 0),
                                        "end": full - max(-after, 0)})
        flip = ctx.b.literal(np.arange(ksize[i] - 1, -1, -1, dtype=np.int64),
                             f"{ctx.node.name}.flip{i}")
        w = ctx.emit("index", [w, flip], {"axes": (ax,)})
    # (Cin, Cout/g, *K) -> (g, Cin/g, Cout/g, *K) -> (g, Cout/g, Cin/g, *K) -> (Cout, Cin/g, *K)
    w = ctx.emit("reshape", [w], {"shape": (groups, cin // groups, cout_g) + ksize})
    w = ctx.emit("permute", [w], {"perm": (0, 2, 1) + tuple(range(3, 3 + k))})
    w = ctx.emit("reshape", [w], {"shape": (groups * cout_g, cin // groups) + ksize})
    return _conv_nd(ctx, x, w, b, (1,) * k, (0,) * k, tuple(dilation), groups)


def _axis_pads(rank: int, axis: int, before: int, after: int) -> tuple:
    """The pad op's pads (torch's order, last axis first) padding one axis."""
    return (0, 0) * (rank - 1 - axis) + (before, after)


@converter("aten.batch_norm.default", "aten._native_batch_norm_legit_no_training.default",
           "aten._native_batch_norm_legit_functional.default",
           "aten.native_batch_norm.default", "aten._native_batch_norm_legit.no_stats")
def _batch_norm(ctx):
    target = str(ctx.node.target)
    x, w, b = ctx.args[:3]
    if target.endswith("no_stats"):
        mean = var = None
        training, momentum, eps = ctx.args[3:6]
    elif target.endswith("no_training.default"):
        mean, var = ctx.args[3:5]
        training, momentum, eps = False, ctx.args[5], ctx.args[6]
    else:
        mean, var = ctx.args[3:5]
        training, momentum, eps = ctx.args[5:8]
    c = x.type.shape[1]
    dt = x.type.dtype
    if training or mean is None:
        return _batch_norm_training(ctx, target, x, w, b, mean, var, momentum, eps)
    if w is None:
        w = ctx.emit("full", [], {"shape": (c,), "value": 1.0, "dtype": dt})
    if b is None:
        b = ctx.emit("full", [], {"shape": (c,), "value": 0.0, "dtype": dt})
    y = ctx.emit("batch_norm", [x, w, b, mean, var], {"eps": float(eps)})
    if target == "aten.batch_norm.default":
        return y
    # in eval mode nothing is saved: torch returns empty tensors for the mean and 1/std (and
    # the functional form the running statistics, unchanged but f32 when they came in half)
    saved = (_empty_result(ctx, 1), _empty_result(ctx, 2))
    if target == "aten._native_batch_norm_legit_functional.default":
        return (y, *saved, _as_result(ctx, mean, 3), _as_result(ctx, var, 4))
    return (y, *saved)


def _empty_result(ctx, i):
    t = ctx.out_type(i)
    return ctx.emit("full", [], {"shape": t.shape, "value": 0, "dtype": t.dtype})


def _as_result(ctx, v, i):
    """`v` in the dtype torch gives result i."""
    dt = ctx.out_type(i).dtype
    return v if v.type.dtype == dt else ctx.emit("cast", [v], {"dtype": dt})


def _batch_norm_training(ctx, target, x, w, b, running_mean, running_var, momentum, eps):
    """Training-mode batch norm normalizes with the batch's own statistics (mean and biased
    variance over every axis but the channels); the functional forms also return the saved
    mean and 1/std and the updated running statistics, whose variance is the unbiased one.

    A half-precision input is normalized in f32, as torch's decomposition does; each result is
    then rounded to the dtype torch gives it: the output and the saved statistics to the input's,
    the functional form's updated running statistics stay f32."""
    rank, c = x.type.rank, x.type.shape[1]
    axes = (0,) + tuple(range(2, rank))
    per_channel = (1, c) + (1,) * (rank - 2)
    out_dtype = x.type.dtype
    if out_dtype in (DType.f16, DType.bf16):
        x = ctx.emit("cast", [x], {"dtype": DType.f32})
    mean = ctx.emit("mean", [x], {"axes": axes, "keepdim": True})
    var = ctx.emit("var", [x], {"axes": axes, "keepdim": True, "correction": 0})
    invstd = ctx.emit("rsqrt", [ctx.emit("add", [var, float(eps)])])
    y = ctx.emit("mul", [ctx.emit("sub", [x, mean]), invstd])
    if w is not None:
        y = ctx.emit("mul", [y, ctx.emit("reshape", [w], {"shape": per_channel})])
    if b is not None:
        y = ctx.emit("add", [y, ctx.emit("reshape", [b], {"shape": per_channel})])
    if y.type.dtype != out_dtype:
        y = ctx.emit("cast", [y], {"dtype": out_dtype})
    if target == "aten.batch_norm.default":
        return y
    save_mean = ctx.emit("reshape", [mean], {"shape": (c,)})
    save_invstd = ctx.emit("reshape", [invstd], {"shape": (c,)})
    saved = (_as_result(ctx, save_mean, 1), _as_result(ctx, save_invstd, 2))
    if target != "aten._native_batch_norm_legit_functional.default":
        return (y, *saved)
    n = 1
    for ax in axes:
        n = n * x.type.shape[ax]
    unbiased = ctx.emit("mul", [ctx.emit("reshape", [var], {"shape": (c,)}),
                                float(n) / max(float(n) - 1.0, 1.0) if isinstance(n, int)
                                else ctx.emit("div", [n, n - 1])])
    m = float(momentum)
    if running_mean.type.dtype != mean.type.dtype:   # half running statistics, updated in f32
        running_mean, running_var = (ctx.emit("cast", [r], {"dtype": mean.type.dtype})
                                     for r in (running_mean, running_var))
    new_mean = ctx.emit("add", [ctx.emit("mul", [running_mean, 1.0 - m]),
                                ctx.emit("mul", [save_mean, m])])
    new_var = ctx.emit("add", [ctx.emit("mul", [running_var, 1.0 - m]),
                               ctx.emit("mul", [unbiased, m])])
    return (y, *saved, _as_result(ctx, new_mean, 3), _as_result(ctx, new_var, 4))


@converter("aten.layer_norm.default", "aten.native_layer_norm.default")
def _layer_norm(ctx):
    x, shape = ctx.args[0], ctx.args[1]
    w, b = ctx.arg(2, "weight"), ctx.arg(3, "bias")
    eps = ctx.arg(4, "eps", 1e-5)
    if w is None and b is not None:
        w = ctx.emit("full", [], {"shape": b.type.shape, "value": 1.0, "dtype": b.type.dtype})
    ins = [x] + [t for t in (w, b) if t is not None]
    y = ctx.emit("layer_norm", ins, {"ndim": len(shape), "eps": float(eps)})
    if str(ctx.node.target) == "aten.layer_norm.default":
        return y
    axes = tuple(range(x.type.rank - len(shape), x.type.rank))
    return (y, *_mean_rstd(ctx, x, axes, eps))


def _mean_rstd(ctx, x, axes, eps):
    """The statistics torch's native norms also return: the mean and 1/sqrt(biased var + eps)
    over ``axes`` (kept as size-1 dims); unused, they are dropped as dead code."""
    mean = ctx.emit("mean", [x], {"axes": axes, "keepdim": True})
    var = ctx.emit("var", [x], {"axes": axes, "keepdim": True, "correction": 0})
    return mean, ctx.emit("rsqrt", [ctx.emit("add", [var, float(eps)])])


@converter("aten.rms_norm.default")
def _rms_norm(ctx):
    x, shape = ctx.args[0], ctx.args[1]
    w = ctx.arg(2, "weight")
    eps = ctx.arg(3, "eps")
    return ctx.emit("rms_norm", [x] + ([w] if w is not None else []),
                    {"ndim": len(shape), "eps": None if eps is None else float(eps)})


def _add_batch(ctx, x):
    return ctx.emit("reshape", [x], {"shape": (1,) + x.type.shape})


def _drop_batch(ctx, y):
    return ctx.emit("reshape", [y], {"shape": y.type.shape[1:]})


def _unbatched_pool(conv, spatial: int = 2):
    """Pooling converters take unbatched (C, *spatial) inputs as a batch of one, as torch does."""

    def wrapped(ctx):
        x = ctx.args[0]
        if x.type.rank != spatial + 1:
            return conv(ctx, x)
        out = conv(ctx, _add_batch(ctx, x))
        if isinstance(out, tuple):
            return tuple(None if y is None else _drop_batch(ctx, y) for y in out)   # None: unread
        return _drop_batch(ctx, out)

    return wrapped


def _static_if_ceil_mode(x, ceil_mode: bool) -> None:
    """A ceil_mode window count over a symbolic size is not one expression (whether the last
    window starts inside the input depends on the size): such a pool is refused, not mistyped."""
    if ceil_mode and not all(isinstance(d, int) for d in x.type.shape[2:]):
        raise NotImplementedError("ceil_mode pooling over a symbolic spatial dim (its last window "
                                  "depends on the size); export that dim static, or ceil_mode=False")


@converter("aten.max_pool2d.default", "aten.max_pool2d_with_indices.default")
@_unbatched_pool
def _max_pool(ctx, x):
    k = _pair(ctx.arg(1, "kernel_size"))
    stride = ctx.arg(2, "stride") or k
    attrs = {"kernel": k, "stride": _pair(stride), "padding": _pair(ctx.arg(3, "padding", (0,))),
             "dilation": _pair(ctx.arg(4, "dilation", (1,))),
             "ceil_mode": bool(ctx.arg(5, "ceil_mode", False))}
    _static_if_ceil_mode(x, attrs["ceil_mode"])
    if str(ctx.node.target) == "aten.max_pool2d.default":
        return ctx.emit("max_pool2d", [x], attrs)
    return ctx.emit("max_pool2d_with_indices", [x], attrs, n_results=2)


@converter("aten.avg_pool2d.default")
@_unbatched_pool
def _avg_pool(ctx, x):
    k = _pair(ctx.arg(1, "kernel_size"))
    stride = ctx.arg(2, "stride") or k
    ceil_mode = bool(ctx.arg(4, "ceil_mode", False))
    _static_if_ceil_mode(x, ceil_mode)
    return ctx.emit("avg_pool2d", [x], {
        "kernel": k, "stride": _pair(stride), "padding": _pair(ctx.arg(3, "padding", (0,))),
        "ceil_mode": ceil_mode,
        "count_include_pad": bool(ctx.arg(5, "count_include_pad", True)),
        "divisor": ctx.arg(6, "divisor_override")})


@converter("aten.adaptive_avg_pool2d.default", "aten._adaptive_avg_pool2d.default")
@_unbatched_pool
def _adaptive_avg_pool(ctx, x):
    out = ctx.out_type().shape[-2:]
    return ctx.emit("adaptive_avg_pool2d", [x], {"output_size": tuple(out)})


# -- adaptive max pooling (1-, 2- and 3-D): torch's adaptive windows per axis --------------------

def _adaptive_max_pool(spatial: int):
    """Max over a box is max over its axes one at a time. With every axis divisible the windows
    are a max pool's (kernel = stride = n / o); otherwise each axis is pooled window by window (a
    slice and a max each, concatenated). Only when the caller reads the indices, each axis also
    takes the argmax of its windows, innermost axis first: the flat index of a window's max is its
    position on this axis times the inner axes' sizes plus the index the inner passes found at that
    position (gathered), so ties go to the first cell in torch's row-major scan."""

    def conv(ctx, x):
        sizes = tuple(x.type.shape[2:])
        outs = tuple(ctx.out_type(0).shape[-spatial:])
        if not all(isinstance(d, int) for d in sizes + outs):
            raise NotImplementedError("adaptive max pooling over a dynamic size")
        wants_index = any(u.target is operator.getitem and u.args[1] == 1 for u in ctx.node.users)
        if not wants_index and all(n % o == 0 for n, o in zip(sizes, outs)):
            k = tuple(n // o for n, o in zip(sizes, outs))
            pool = {"padding": (0, 0), "dilation": (1, 1), "ceil_mode": False}
            if spatial == 3:
                return _pool3d(ctx, x, "max_pool2d", {"kernel": k[1:], "stride": k[1:], **pool},
                               {"kernel": (k[0], 1), "stride": (k[0], 1), **pool}), None
            if spatial == 1:   # (N, C, L) as (N, C, 1, L)
                y = ctx.emit("reshape", [x], {"shape": x.type.shape[:2] + (1, sizes[0])})
                y = ctx.emit("max_pool2d", [y], {"kernel": (1, k[0]), "stride": (1, k[0]), **pool})
                return ctx.emit("reshape", [y], {"shape": x.type.shape[:2] + outs}), None
            return ctx.emit("max_pool2d", [x], {"kernel": k, "stride": k, **pool}), None
        values, index, inner = x, None, 1
        for ax in reversed(range(2, 2 + spatial)):
            n, o = sizes[ax - 2], outs[ax - 2]
            vs, ids = [], []
            for lo, hi in adaptive_bins(n, o):
                window = ctx.emit("slice", [values], {"axis": ax, "start": lo, "end": hi})
                vs.append(ctx.emit("amax", [window], {"axes": (ax,), "keepdim": True}))
                if wants_index:
                    at = ctx.emit("argmax", [window], {"axis": ax, "keepdim": True})
                    flat = ctx.emit("mul", [ctx.emit("add", [at, lo]), inner])
                    if index is not None:
                        cells = ctx.emit("slice", [index], {"axis": ax, "start": lo, "end": hi})
                        flat = ctx.emit("add", [flat, ctx.emit("gather", [cells, at], {"axis": ax})])
                    ids.append(flat)
            values = vs[0] if o == 1 else ctx.emit("concat", vs, {"axis": ax})
            if wants_index:
                index = ids[0] if o == 1 else ctx.emit("concat", ids, {"axis": ax})
            inner *= n
        return values, index

    return conv


converter("aten.adaptive_max_pool1d.default")(_unbatched_pool(_adaptive_max_pool(1), spatial=1))
converter("aten.adaptive_max_pool2d.default")(_unbatched_pool(_adaptive_max_pool(2)))
converter("aten.adaptive_max_pool3d.default")(_unbatched_pool(_adaptive_max_pool(3), spatial=3))


# -- 3-D (video) pooling: separable, a 2-D pool over (H, W), then one over D ------------------

def _pool3d(ctx, x, op, inner: dict, outer: dict):
    """Pool (N, C, D, H, W) over (H, W) with ``inner`` attrs on (N, C*D, H, W), then over D with
    ``outer`` attrs on (N, C, D, Ho*Wo). Max and mean over a box are max and mean over its
    axes one at a time, and torch's window sizes (padding, ceil_mode) are per-axis products."""
    n, c, d, h, w = x.type.shape
    y = ctx.emit("reshape", [x], {"shape": (n, c * d, h, w)})
    y = ctx.emit(op, [y], inner)
    ho, wo = y.type.shape[2:]
    y = ctx.emit("reshape", [y], {"shape": (n, c, d, ho * wo)})
    y = ctx.emit(op, [y], outer)
    return ctx.emit("reshape", [y], {"shape": (n, c, y.type.shape[2], ho, wo)})


def _split_hw_d(v, k=3):
    v = _ntuple(v, k)
    return tuple(v[1:]), v[0]


def _unbatched_pool3d(conv):
    return _unbatched_pool(conv, spatial=3)


@converter("aten.max_pool3d_with_indices.default", "aten.max_pool3d.default")
@_unbatched_pool3d
def _max_pool3d(ctx, x):
    (k, kd), (s, sd) = _split_hw_d(ctx.arg(1, "kernel_size")), \
        _split_hw_d(ctx.arg(2, "stride") or ctx.arg(1, "kernel_size"))
    (p, pd), (dl, dd) = _split_hw_d(ctx.arg(3, "padding", (0,))), \
        _split_hw_d(ctx.arg(4, "dilation", (1,)))
    ceil = bool(ctx.arg(5, "ceil_mode", False))
    inner = {"kernel": k, "stride": s, "padding": p, "dilation": dl, "ceil_mode": ceil}
    outer = {"kernel": (kd, 1), "stride": (sd, 1), "padding": (pd, 0), "dilation": (dd, 1),
             "ceil_mode": ceil}
    if str(ctx.node.target) == "aten.max_pool3d.default":
        return _pool3d(ctx, x, "max_pool2d", inner, outer)
    return _max_pool3d_indices(ctx, x, inner, outer)


def _max_pool3d_indices(ctx, x, inner, outer):
    """Separable max pooling that also says where each maximum is, as a flat index into the
    (D, H, W) volume: the (H, W) pass gives each depth's winner, the depth pass which depth won;
    its winner's (H, W) index is gathered. Ties go to the first depth, then the first (H, W)
    cell, which is torch's scan order."""
    n, c, d, h, w = x.type.shape
    y = ctx.emit("reshape", [x], {"shape": (n, c * d, h, w)})
    y, hw = ctx.emit("max_pool2d_with_indices", [y], inner, n_results=2)
    ho, wo = y.type.shape[2:]
    y = ctx.emit("reshape", [y], {"shape": (n, c, d, ho * wo)})
    y, at = ctx.emit("max_pool2d_with_indices", [y], outer, n_results=2)
    do = y.type.shape[2]
    depth = ctx.emit("div", [at, ho * wo], {"rounding": "floor"})  # (depth, column) -> depth
    hw = ctx.emit("gather", [ctx.emit("reshape", [hw], {"shape": (n, c, d, ho * wo)}), depth],
                  {"axis": 2})
    index = ctx.emit("add", [ctx.emit("mul", [depth, h * w]), hw])
    shape = (n, c, do, ho, wo)
    return (ctx.emit("reshape", [y], {"shape": shape}),
            ctx.emit("reshape", [index], {"shape": shape}))


@converter("aten.avg_pool3d.default")
@_unbatched_pool3d
def _avg_pool3d(ctx, x):
    (k, kd) = _split_hw_d(ctx.arg(1, "kernel_size"))
    (s, sd) = _split_hw_d(ctx.arg(2, "stride") or ctx.arg(1, "kernel_size"))
    (p, pd) = _split_hw_d(ctx.arg(3, "padding", (0,)))
    ceil = bool(ctx.arg(4, "ceil_mode", False))
    include = bool(ctx.arg(5, "count_include_pad", True))
    override = ctx.arg(6, "divisor_override")
    common = {"ceil_mode": ceil, "count_include_pad": include,
              "divisor": 1 if override is not None else None}  # an override: sums, then divide
    dt = x.type.dtype
    if not dt.is_float:  # a mean of means is the mean only without rounding in between
        x = ctx.emit("cast", [x], {"dtype": DType.f64})
    y = _pool3d(ctx, x, "avg_pool2d", {"kernel": k, "stride": s, "padding": p, **common},
                {"kernel": (kd, 1), "stride": (sd, 1), "padding": (pd, 0), **common})
    y = ctx.emit("div", [y, float(override)]) if override is not None else y
    return y if dt.is_float else ctx.emit("cast", [y], {"dtype": dt})  # truncates, as torch


@converter("aten.adaptive_avg_pool3d.default", "aten._adaptive_avg_pool3d.default")
@_unbatched_pool3d
def _adaptive_avg_pool3d(ctx, x):
    od, oh, ow = ctx.out_type().shape[-3:]
    return _pool3d(ctx, x, "adaptive_avg_pool2d", {"output_size": (oh, ow)},
                   {"output_size": (od, oh * ow)})


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
    if target == "aten.group_norm.default":
        return y
    mean, rstd = _mean_rstd(ctx, flat, (2,), eps)
    return (y, ctx.emit("reshape", [mean], {"shape": (n, groups)}),
            ctx.emit("reshape", [rstd], {"shape": (n, groups)}))


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
    if not x.type.dtype.is_float:
        raise NotImplementedError(f"bilinear upsampling of a {x.type.dtype} image (torch "
                                  "interpolates integer images in its own fixed-point arithmetic)")
    sh = sw = None
    if scales:
        sh, sw = scales
    if all(isinstance(d, int) for d in (oh, ow, h, w)):
        return _resized(ctx, x, _interp_matrix(h, oh, align, sh), _interp_matrix(w, ow, align, sw))
    # an image size known at run time: the same matrices, built by IR ops from the sizes
    rows = _interp_matrix_ir(ctx, h, oh, align, sh, x.type.dtype)
    cols = ctx.emit("permute", [_interp_matrix_ir(ctx, w, ow, align, sw, x.type.dtype)], {"perm": (1, 0)})
    y = ctx.emit("matmul", [rows, x])
    return ctx.emit("matmul", [y, cols])


def _resized(ctx, x, rows: np.ndarray, cols: np.ndarray):
    """``rows @ x @ cols^T`` with the (out, size) weight matrices of each axis as constants in
    x's dtype: a separable resize as two contractions."""
    dt = x.type.dtype.numpy
    r = ctx.b.literal(rows.astype(dt), f"{ctx.node.name}.rows")
    c = ctx.b.literal(np.ascontiguousarray(cols.T).astype(dt), f"{ctx.node.name}.cols")
    return ctx.emit("matmul", [ctx.emit("matmul", [r, x]), c])


@converter("aten._upsample_bilinear2d_aa.default", "aten._upsample_bilinear2d_aa.vec",
           "aten._upsample_bicubic2d_aa.default", "aten._upsample_bicubic2d_aa.vec")
def _upsample_antialiased(ctx):
    """Antialiased resizing (``F.interpolate(..., antialias=True)``, how vision models resize
    position embeddings and images): like bilinear, two contractions with constant matrices, whose
    rows are torch's antialiasing filter stretched over the input cells an output cell covers
    when it shrinks the image (``_antialias_matrix``)."""
    x = ctx.args[0]
    cubic = "bicubic" in str(ctx.node.target)
    align = bool(ctx.arg(2, "align_corners", False))
    if str(ctx.node.target).endswith(".vec"):
        sh, sw = ctx.arg(3, "scale_factors") or (None, None)
    else:
        sh, sw = ctx.arg(3, "scales_h"), ctx.arg(4, "scales_w")
    oh, ow = ctx.out_type().shape[-2:]
    h, w = x.type.shape[-2:]
    if not x.type.dtype.is_float:
        raise NotImplementedError(f"antialiased resizing of a {x.type.dtype} image (torch resizes "
                                  "integer images in its own fixed-point arithmetic)")
    if not all(isinstance(d, int) for d in (oh, ow, h, w)):
        raise NotImplementedError("antialiased resizing of an image whose size is known only at run "
                                  "time (its filter's width depends on the sizes)")
    return _resized(ctx, x, _antialias_matrix(h, oh, align, sh, cubic), _antialias_matrix(w, ow, align, sw, cubic))


def _antialias_matrix(size: int, out: int, align_corners: bool, scale, cubic: bool) -> np.ndarray:
    """(out, size) weights of torch's antialiased interpolation along one axis (its CPU kernel's
    rule, in float32 as torch computes it for float images): output i is centred at
    ratio * (i + 0.5) of the input; when the image shrinks (ratio > 1) the filter (a triangle, or
    Keys' cubic with a = -0.5) is stretched by the ratio, so each output averages every input cell
    it covers; the weights of a row are normalized to sum to one."""
    f32 = np.float32
    if align_corners:
        ratio = f32((size - 1) / (out - 1)) if out > 1 else f32(0.0)
    else:
        ratio = f32(1.0 / scale) if scale else f32(size / out)
    half = f32(2.0 if cubic else 1.0)            # the filter's half width, in input cells at ratio 1
    support = half * ratio if ratio >= 1 else half
    widest = int(np.ceil(support)) * 2 + 1
    invscale = f32(1.0) / ratio if ratio >= 1 else f32(1.0)

    def filt(t):
        t = abs(t)
        if cubic:
            a = f32(-0.5)
            if t < 1:
                return ((a + 2) * t - (a + 3)) * t * t + 1
            return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a if t < 2 else f32(0.0)
        return f32(1.0) - t if t < 1 else f32(0.0)

    m = np.zeros((out, size), dtype=np.float32)
    for i in range(out):
        centre = ratio * f32(i + 0.5)
        lo = max(int(centre - support + f32(0.5)), 0)
        n = min(max(min(int(centre + support + f32(0.5)), size) - lo, 0), widest)
        wts = np.array([filt(f32(j + lo - centre + f32(0.5)) * invscale) for j in range(n)], dtype=np.float32)
        total = wts.sum(dtype=np.float32)
        if total != 0:
            wts = wts / total
        m[i, lo:lo + n] = wts
    return m


def _interp_matrix_ir(ctx, size, out, align_corners: bool, scale, dtype):
    """``_interp_matrix`` in IR ops, for sizes that are symbols: each output row's source position
    from arange(out), its two neighbours and weights, and a one-hot of each against arange(size).
    Once the sizes are known the whole of it folds to the constant ``_interp_matrix`` gives."""
    from .movement import positions

    def f32(n):   # a number or a size as an f32 scalar
        return ctx.value(n, DType.f32)
    i = positions(ctx, out, DType.f32)
    if align_corners:
        ratio = ctx.emit("div", [f32(size - 1), ctx.emit("maximum", [f32(out - 1), f32(1.0)])])
        src = ctx.emit("mul", [i, ratio])
    else:
        ratio = f32(1.0 / scale) if scale else ctx.emit("div", [f32(size), f32(out)])
        centre = ctx.emit("mul", [ctx.emit("add", [i, f32(0.5)]), ratio])
        src = ctx.emit("maximum", [ctx.emit("sub", [centre, f32(0.5)]), f32(0.0)])
    last = f32(size - 1)
    lo = ctx.emit("minimum", [ctx.emit("floor", [src]), last])
    hi = ctx.emit("minimum", [ctx.emit("add", [lo, f32(1.0)]), last])
    frac = ctx.emit("sub", [src, lo])
    column = ctx.emit("reshape", [positions(ctx, size, DType.f32)], {"shape": (1, size)})

    def weight(at, w):   # w[i] where column j is at[i], else 0
        hit = ctx.emit("eq", [column, ctx.emit("reshape", [at], {"shape": (out, 1)})])
        return ctx.emit("where", [hit, ctx.emit("reshape", [w], {"shape": (out, 1)}), f32(0.0)])
    m = ctx.emit("add", [weight(lo, ctx.emit("sub", [f32(1.0), frac])), weight(hi, frac)])
    return m if dtype == DType.f32 else ctx.emit("cast", [m], {"dtype": dtype})


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
