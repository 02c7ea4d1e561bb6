"""Converters for elementwise ATen ops: arithmetic, comparisons, activations, where, casts."""

from __future__ import annotations

from fexplore.ir import DType, TensorType, Value
from fexplore.ir.types import promote_types

from .registry import ConvertContext, converter, ir_dtype

_BINARY = {
    "mul": "mul", "maximum": "maximum", "minimum": "minimum", "pow": "pow",
    "remainder": "remainder", "fmod": "fmod", "atan2": "atan2", "hypot": "hypot", "logical_and": "logical_and",
    "logical_or": "logical_or",
    "logical_xor": "logical_xor", "bitwise_and": "bitwise_and", "bitwise_or": "bitwise_or",
    "bitwise_xor": "bitwise_xor", "bitwise_left_shift": "bitwise_left_shift",
    "bitwise_right_shift": "bitwise_right_shift", "__lshift__": "bitwise_left_shift",
    "__rshift__": "bitwise_right_shift", "copysign": "copysign", "fmax": "fmax", "fmin": "fmin",
}

for _aten, _ir in _BINARY.items():
    def _binary(ctx: ConvertContext, _ir=_ir):
        return ctx.emit(_ir, [ctx.args[0], ctx.args[1]])

    converter(f"aten.{_aten}.Tensor", f"aten.{_aten}.Scalar", f"aten.{_aten}.default",
              f"aten.{_aten}.Tensor_Tensor", f"aten.{_aten}.Tensor_Scalar",
              f"aten.{_aten}.Scalar_Tensor")(_binary)


def _compare(ctx: ConvertContext, _ir: str):
    """torch compares in its operands' common dtype: a wider operand is rounded to it first, so
    bf16 ``x <= 0.3`` compares with 0.30078125, not 0.3 (arithmetic, by contrast, keeps a
    Python scalar's own precision in torch's CPU kernels, and the IR does the same)."""
    a, b = ctx.args[0], ctx.args[1]
    common = promote_types([_operand_type(a), _operand_type(b)])
    return ctx.emit(_ir, [_rounded_to(ctx, x, common) for x in (a, b)])


def _operand_type(x) -> TensorType:
    """A Python number as the 0-d tensor of its weak type (bool, i64, f32), as ctx.value makes it."""
    if isinstance(x, Value):
        return x.type
    dtype = DType.bool if isinstance(x, bool) else DType.f32 if isinstance(x, float) else DType.i64
    return TensorType((), dtype)


def _rounded_to(ctx: ConvertContext, x, common: DType):
    if not common.is_float:
        return x
    if isinstance(x, Value):
        wider = x.type.dtype.is_float and x.type.dtype.numpy.itemsize > common.numpy.itemsize
        return ctx.emit("cast", [x], {"dtype": common}) if wider else x
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return ctx.value(x, common)
    return x


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    def _comparison(ctx: ConvertContext, _ir=_name):
        return _compare(ctx, _ir)

    converter(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar", f"aten.{_name}.default")(_comparison)


def _with_alpha(ctx: ConvertContext, op: str):
    a, b = ctx.args[0], ctx.args[1]
    alpha = ctx.kwargs.get("alpha", ctx.arg(2, default=1))
    if alpha != 1:
        b = ctx.emit("mul", [b, alpha])
    return ctx.emit(op, [a, b])


@converter("aten.add.Tensor", "aten.add.Scalar")
def _add(ctx):
    return _with_alpha(ctx, "add")


@converter("aten.sub.Tensor", "aten.sub.Scalar")
def _sub(ctx):
    return _with_alpha(ctx, "sub")


@converter("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(ctx):
    a, b = ctx.args[0], ctx.args[1]
    alpha = ctx.kwargs.get("alpha", 1)
    if alpha != 1:
        a = ctx.emit("mul", [a, alpha])
    return ctx.emit("sub", [b, a])


@converter("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div(ctx):
    mode = ctx.kwargs.get("rounding_mode", ctx.arg(2))
    return ctx.emit("div", [ctx.args[0], ctx.args[1]], {"rounding": mode or "none"})


@converter("aten.floor_divide.default", "aten.floor_divide.Scalar")
def _floor_divide(ctx):
    return ctx.emit("div", [ctx.args[0], ctx.args[1]], {"rounding": "floor"})


_UNARY = ["exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "sqrt", "rsqrt", "reciprocal",
          "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
          "atanh", "erf", "erfc", "sigmoid", "silu", "neg", "abs", "relu", "floor", "ceil", "round",
          "trunc", "sign", "logical_not", "isnan", "isinf", "signbit"]

for _name in _UNARY:
    def _unary(ctx: ConvertContext, _name=_name):
        return ctx.emit(_name, [ctx.args[0]])

    converter(f"aten.{_name}.default")(_unary)


@converter("aten.round.decimals")
def _round_decimals(ctx):
    """torch's round(x, decimals=d): round(x * 10^d) / 10^d, or round(x / 10^-d) * 10^-d for
    negative d, in the tensor's own float arithmetic."""
    x, d = ctx.args[0], ctx.kwargs.get("decimals", ctx.arg(1, default=0))
    scale = float(10 ** abs(d))
    if d >= 0:
        return ctx.emit("div", [ctx.emit("round", [ctx.emit("mul", [x, scale])]), scale])
    return ctx.emit("mul", [ctx.emit("round", [ctx.emit("div", [x, scale])]), scale])


@converter("aten.gelu.default")
def _gelu(ctx):
    return ctx.emit("gelu", [ctx.args[0]],
                    {"approximate": ctx.kwargs.get("approximate", ctx.arg(1, default="none"))})


@converter("aten.bitwise_not.default")
def _bitwise_not(ctx):
    x = ctx.args[0]
    if x.type.dtype == DType.bool:
        return ctx.emit("logical_not", [x])
    return ctx.emit("sub", [ctx.emit("neg", [x]), 1])  # ~x == -x - 1 in two's complement


@converter("aten.where.self", "aten.where.ScalarOther", "aten.where.ScalarSelf",
           "aten.where.Scalar")
def _where(ctx):
    return ctx.emit("where", [ctx.args[0], ctx.args[1], ctx.args[2]])


@converter("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(ctx):
    x, mask, value = ctx.args[0], ctx.args[1], ctx.args[2]
    if not isinstance(value, (int, float, bool)):
        value = ctx.emit("cast", [value], {"dtype": x.type.dtype})
    else:
        value = ctx.scalar(value, x.type.dtype)
    return ctx.emit("where", [mask, value, x])


def _number(v):
    return None if v is None else (float(v) if isinstance(v, float) else v)


@converter("aten.clamp.default", "aten.clip.default")
def _clamp(ctx):
    lo = ctx.kwargs.get("min", ctx.arg(1))
    hi = ctx.kwargs.get("max", ctx.arg(2))
    return ctx.emit("clamp", [ctx.args[0]], {"min": _number(lo), "max": _number(hi)})


@converter("aten.clamp_min.default")
def _clamp_min(ctx):
    return ctx.emit("clamp", [ctx.args[0]], {"min": _number(ctx.args[1])})


@converter("aten.clamp_max.default")
def _clamp_max(ctx):
    return ctx.emit("clamp", [ctx.args[0]], {"max": _number(ctx.args[1])})


@converter("aten.hardtanh.default")
def _hardtanh(ctx):
    x = ctx.args[0]
    lo, hi = ctx.arg(1, "min_val", -1.0), ctx.arg(2, "max_val", 1.0)
    # hardtanh keeps an integer tensor's dtype: its bounds are that dtype's numbers then
    bound = float if x.type.dtype.is_float else (lambda v: int(v))
    return ctx.emit("clamp", [x], {"min": bound(lo), "max": bound(hi)})


@converter("aten.clamp.Tensor")
def _clamp_tensor(ctx):
    x = ctx.args[0]
    lo, hi = ctx.kwargs.get("min", ctx.arg(1)), ctx.kwargs.get("max", ctx.arg(2))
    if lo is not None:
        x = ctx.emit("maximum", [x, lo])
    if hi is not None:
        x = ctx.emit("minimum", [x, hi])
    return x


@converter("aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout",
           "aten._to_dtype.default", "aten.type_as.default")
def _to_copy(ctx):
    x = ctx.args[0]
    dt = ctx.kwargs.get("dtype")
    if dt is None and len(ctx.args) > 1 and not isinstance(ctx.args[1], bool):
        dt = ctx.args[1]
    target = ir_dtype(dt) if dt is not None else ctx.out_type().dtype
    if target == x.type.dtype:
        return x  # a device/layout/memory-format copy: no value change
    return ctx.emit("cast", [x], {"dtype": target})


@converter("aten.dropout.default", "aten.feature_dropout.default",
           "aten.alpha_dropout.default", "aten.feature_alpha_dropout.default")
def _dropout(ctx):
    p, train = ctx.arg(1, "p", 0.5), ctx.arg(2, "train", True)
    if train and p > 0:
        from .out_of_scope import _RANDOM, refuse

        refuse(ctx, f"dropout with p={p} in training mode: {_RANDOM}")
    return ctx.args[0]  # dropout off (eval, or p == 0) is the identity


@converter("aten.clone.default", "aten.alias.default", "aten.detach.default",
           "aten.contiguous.default", "aten.lift_fresh_copy.default",
           "aten.copy.default", "aten.alias_copy.default", "aten.detach_copy.default")
def _identity(ctx):
    # Value semantics: a copy is the same value. (copy(dst, src) is src's value in dst's shape.)
    if str(ctx.node.target).startswith("aten.copy"):
        src, dst = ctx.args[1], ctx.args[0]
        if src.type.dtype != dst.type.dtype:
            src = ctx.emit("cast", [src], {"dtype": dst.type.dtype})
        if src.type.shape != dst.type.shape:
            src = ctx.emit("expand", [src], {"shape": dst.type.shape})
        return src
    return ctx.args[0]


# -- activations torch keeps as core ATen ops, written with IR elementwise ops -------------------

@converter("aten.elu.default")
def _elu(ctx):
    # scale * (x if x > 0 else alpha * (exp(x * input_scale) - 1))
    x = ctx.args[0]
    alpha, scale, in_scale = (float(ctx.arg(i, n, d)) for i, n, d in
                              ((1, "alpha", 1.0), (2, "scale", 1.0), (3, "input_scale", 1.0)))
    inner = ctx.emit("exp", [ctx.emit("mul", [x, in_scale]) if in_scale != 1 else x])
    neg = ctx.emit("mul", [ctx.emit("sub", [inner, 1.0]), alpha])
    y = ctx.emit("where", [ctx.emit("gt", [x, 0.0]), x, neg])
    return ctx.emit("mul", [y, scale]) if scale != 1 else y


@converter("aten.leaky_relu.default")
def _leaky_relu(ctx):
    x = ctx.args[0]
    slope = float(ctx.arg(1, "negative_slope", 0.01))
    return ctx.emit("where", [ctx.emit("gt", [x, 0.0]), x, ctx.emit("mul", [x, slope])])


@converter("aten.softplus.default")
def _softplus(ctx):
    # log(1 + exp(beta x)) / beta, linear past the threshold (as torch, for overflow's sake)
    x = ctx.args[0]
    beta, threshold = float(ctx.arg(1, "beta", 1.0)), float(ctx.arg(2, "threshold", 20.0))
    bx = ctx.emit("mul", [x, beta]) if beta != 1 else x
    soft = ctx.emit("log", [ctx.emit("add", [ctx.emit("exp", [bx]), 1.0])])
    if beta != 1:
        soft = ctx.emit("div", [soft, beta])
    return ctx.emit("where", [ctx.emit("gt", [bx, threshold]), x, soft])


@converter("aten.hardsigmoid.default")
def _hardsigmoid(ctx):
    x = ctx.args[0]
    return ctx.emit("div", [ctx.emit("clamp", [ctx.emit("add", [x, 3.0])],
                                     {"min": 0.0, "max": 6.0}), 6.0])


@converter("aten.hardswish.default")
def _hardswish(ctx):
    x = ctx.args[0]
    gate = ctx.emit("div", [ctx.emit("clamp", [ctx.emit("add", [x, 3.0])],
                                     {"min": 0.0, "max": 6.0}), 6.0])
    return ctx.emit("mul", [x, gate])
