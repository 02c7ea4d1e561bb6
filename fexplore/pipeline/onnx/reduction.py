"""ONNX reductions, arg-reductions, softmax, cumulative sums and TopK."""

from __future__ import annotations

import numpy as np

from fexplore.ir import DType

from .elementwise import cast, scalar_like
from .movement import axis
from .registry import OnnxContext, onnx_converter


def _axes(ctx: OnnxContext, x):
    """(axes, keepdims) of a reduction; axes None means 'return x' (noop_with_empty_axes)."""
    axes = ctx.const_ints(1, "axes") if ctx.n_inputs > 1 else ctx.attr("axes")
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return None, True
        axes = range(x.type.rank)
    return tuple(sorted({axis(a, x.type.rank) for a in axes})), bool(ctx.attr("keepdims", 1))


def _reduce(op, pre=None, post=None):
    def conv(ctx: OnnxContext):
        x = ctx.input(0)
        axes, keep = _axes(ctx, x)
        v = pre(ctx, x) if pre else x
        if axes is None:
            return post(ctx, v) if post else v
        if any(x.type.shape[a] == 0 for a in axes):
            return _empty_reduction(ctx, op, x, axes, keep, post)
        y = ctx.emit(op, [v], {"axes": axes, "keepdim": keep})
        y = post(ctx, y) if post else y
        return cast(ctx, y, x.type.dtype)  # the IR's sum widens ints; ONNX keeps the dtype

    return conv


# What a reduction over nothing gives (ONNX's definition): the operation's identity.
_EMPTY = {"sum": 0, "prod": 1, "amax": -np.inf, "amin": np.inf, "mean": np.nan}


def _empty_reduction(ctx, op, x, axes, keep, post):
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.type.shape) if keep or i not in axes)
    value = _EMPTY[op]
    dt = x.type.dtype
    if not dt.is_float and not np.isfinite(value):
        info = np.iinfo(dt.numpy) if dt.is_int else None
        value = (info.min if value < 0 else info.max) if info else bool(value > 0)
    y = ctx.emit("full", [], {"shape": shape, "value": value if not isinstance(value, float) or
                              np.isfinite(value) else float(value), "dtype": dt})
    return post(ctx, y) if post else y


def _square(ctx, x):
    return ctx.emit("mul", [x, x])


onnx_converter("ReduceSum")(_reduce("sum"))
_reduce_mean = _reduce("mean")


@onnx_converter("ReduceMean", since=13)
def _mean(ctx):
    x = ctx.input(0)
    axes, keep = _axes(ctx, x)
    if is_global_pool(x, axes, keep):
        return global_avg_pool(ctx, x)
    return _reduce_mean(ctx)


def is_global_pool(x, axes, keep) -> bool:
    """A mean over H and W of an NCHW float tensor, kept 4-D: global average pooling."""
    return x.type.rank == 4 and axes == (2, 3) and keep and x.type.dtype.is_float


def global_avg_pool(ctx, x):
    # the op the torch door makes of nn.AdaptiveAvgPool2d(1), so both doors lay it out alike
    return ctx.emit("adaptive_avg_pool2d", [x], {"output_size": (1, 1)})
onnx_converter("ReduceMax")(_reduce("amax"))
onnx_converter("ReduceMin")(_reduce("amin"))
onnx_converter("ReduceProd")(_reduce("prod"))
onnx_converter("ReduceSumSquare")(_reduce("sum", pre=_square))
onnx_converter("ReduceL1")(_reduce("sum", pre=lambda ctx, x: ctx.emit("abs", [x])))
onnx_converter("ReduceL2")(_reduce("sum", pre=_square, post=lambda ctx, y: ctx.emit("sqrt", [y])))
onnx_converter("ReduceLogSum")(_reduce("sum", post=lambda ctx, y: ctx.emit("log", [y])))


@onnx_converter("ReduceLogSumExp")
def _reduce_log_sum_exp(ctx):
    x = ctx.input(0)
    axes, keep = _axes(ctx, x)
    if axes is None:
        return x
    if any(x.type.shape[a] == 0 for a in axes):
        return _empty_reduction(ctx, "amax", x, axes, keep, None)
    # max + log(sum(exp(x - max))): no overflow; an all -inf slice gives -inf, as ONNX's does
    m = ctx.emit("amax", [x], {"axes": axes, "keepdim": True})
    m = ctx.emit("where", [ctx.emit("isinf", [m]), scalar_like(ctx, 0, m), m])
    s = ctx.emit("sum", [ctx.emit("exp", [ctx.emit("sub", [x, m])])], {"axes": axes, "keepdim": keep})
    if not keep:
        m = ctx.emit("reshape", [m], {"shape": s.type.shape})
    return cast(ctx, ctx.emit("add", [ctx.emit("log", [s]), m]), x.type.dtype)


def _arg(op):
    def conv(ctx):
        x = ctx.input(0)
        if ctx.attr("select_last_index", 0):
            # the last of equal extremes: the first one of the reversed axis, mirrored
            ax = axis(ctx.attr("axis", 0), x.type.rank)
            n = x.type.shape[ax]
            if not isinstance(n, int):
                raise NotImplementedError("select_last_index along a symbolic dim")
            from ..convert.movement import _gather_axis

            rev = _gather_axis(ctx, x, ax, np.arange(n - 1, -1, -1))
            i = ctx.emit(op, [rev], {"axis": ax, "keepdim": bool(ctx.attr("keepdims", 1))})
            return ctx.emit("sub", [ctx.scalar(n - 1, DType.i64), i])
        return ctx.emit(op, [x], {"axis": axis(ctx.attr("axis", 0), x.type.rank),
                                  "keepdim": bool(ctx.attr("keepdims", 1))})

    return conv


onnx_converter("ArgMax")(_arg("argmax"))
onnx_converter("ArgMin")(_arg("argmin"))


def _softmax(op):
    def conv(ctx):
        x = ctx.input(0)
        return ctx.emit(op, [x], {"axis": axis(ctx.attr("axis", -1), x.type.rank)})

    return conv


onnx_converter("Softmax")(_softmax("softmax"))
onnx_converter("LogSoftmax")(_softmax("log_softmax"))


@onnx_converter("Hardmax")
def _hardmax(ctx):
    x = ctx.input(0)
    ax = axis(ctx.attr("axis", -1), x.type.rank)
    i = ctx.emit("argmax", [x], {"axis": ax, "keepdim": True})
    n = x.type.shape[ax]
    shape = [1] * x.type.rank
    shape[ax] = n
    ar = ctx.b.literal(np.arange(n, dtype=np.int64).reshape(shape), f"{ctx._node_base()}.ar")
    return ctx.emit("cast", [ctx.emit("eq", [i, ar])], {"dtype": x.type.dtype})


def _scan(op):
    """CumSum/CumProd with ONNX's exclusive (each element leaves itself out: the input shifted
    by one, the operation's identity first) and reverse (from the end)."""

    def conv(ctx):
        x = ctx.input(0)
        ax = axis(int(np.asarray(ctx.const(1, "axis")).reshape(-1)[0]), x.type.rank)
        n = x.type.shape[ax]
        if not isinstance(n, int):
            raise NotImplementedError(f"{ctx.onnx.op_type} along a symbolic dim")
        from ..convert.movement import _gather_axis

        reverse = ctx.attr("reverse", 0)
        if reverse:
            x = _gather_axis(ctx, x, ax, np.arange(n - 1, -1, -1))
        src = x
        if ctx.attr("exclusive", 0) and n:
            first = list(x.type.shape)
            first[ax] = 1
            ident = ctx.emit("full", [], {"shape": tuple(first), "value": 0 if op == "cumsum" else 1,
                                          "dtype": x.type.dtype})
            parts = [ident] + ([ctx.emit("slice", [x], {"axis": ax, "start": 0, "end": n - 1})]
                               if n > 1 else [])
            src = parts[0] if len(parts) == 1 else ctx.emit("concat", parts, {"axis": ax})
        y = cast(ctx, ctx.emit(op, [src], {"axis": ax}), x.type.dtype)
        if reverse:
            y = _gather_axis(ctx, y, ax, np.arange(n - 1, -1, -1))
        return y

    return conv


onnx_converter("CumSum")(_scan("cumsum"))
onnx_converter("CumProd", since=26)(_scan("cumprod"))


@onnx_converter("TopK")
def _topk(ctx):
    x = ctx.input(0)
    k = int(np.asarray(ctx.const(1, "k")).reshape(-1)[0])
    ax = axis(ctx.attr("axis", -1), x.type.rank)
    if not ctx.attr("sorted", 1):
        ctx.refuse("TopK with sorted=0 (its order is unspecified)")
    return ctx.emit("topk", [x], {"k": k, "axis": ax, "largest": bool(ctx.attr("largest", 1))},
                    n_results=2)
