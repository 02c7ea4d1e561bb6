"""ONNX elementwise ops: arithmetic, comparisons, logic, activations, casts.

ONNX broadcasts as numpy does and asks its operands to share one dtype, so most ops map one to
one onto the IR's elementwise ops; the activations ONNX names (Elu, Selu, HardSigmoid...) are
written as the same IR compositions the ATen converters build.
"""

from __future__ import annotations

import numpy as np

from fexplore.ir import DType

from .importer import onnx_dtype
from .registry import OnnxContext, onnx_converter


def scalar_like(ctx: OnnxContext, v, x):
    """A 0-d constant of x's dtype (ONNX attributes are f32; the tensor may be f16 or f64)."""
    return ctx.scalar(v, x.type.dtype)


def cast(ctx: OnnxContext, x, dt: DType):
    return x if x.type.dtype == dt else ctx.emit("cast", [x], {"dtype": dt})


_UNARY = {"Abs": "abs", "Neg": "neg", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
          "Sigmoid": "sigmoid", "Tanh": "tanh", "Relu": "relu",
          "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos",
          "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh",
          "Atanh": "atanh", "Erf": "erf", "Floor": "floor", "Ceil": "ceil", "Round": "round",
          "Sign": "sign", "Not": "logical_not", "IsNaN": "isnan"}

_BINARY = {"Add": "add", "Sub": "sub", "Equal": "eq", "Less": "lt",
           "Greater": "gt", "LessOrEqual": "le", "GreaterOrEqual": "ge", "And": "logical_and",
           "Or": "logical_or", "Xor": "logical_xor", "BitwiseAnd": "bitwise_and",
           "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor"}


def _unary(op):
    return lambda ctx: ctx.emit(op, [ctx.input(0)])


def _binary(op):
    return lambda ctx: ctx.emit(op, [ctx.input(0), ctx.input(1)])


def only_use_of(ctx: OnnxContext, name: str, op_type: str):
    """The node computing ``name`` when it is an ``op_type`` node whose one use is this node
    (so reading through it leaves it dead), else None."""
    imp = ctx.importer
    node = imp.producers.get(name)
    if node is None or node.op_type != op_type or name in imp.graph_outputs or \
            len(imp.consumers.get(name, [])) != 1:
        return None
    return node


def _scalar_value(ctx, name):
    k = ctx.importer.lookup_known(name)
    if k is None or k.dtype == object or np.asarray(k).size != 1:
        return None
    return float(np.asarray(k).reshape(-1)[0])


def _erf_gelu(ctx):
    """x * 0.5 * (1 + Erf(x / sqrt(2))), multiplied in any order, is GELU as exporters write
    it: the operand x, or None."""
    leaves = []
    for name in ctx.onnx.input:   # this Mul's factors, one single-use Mul deep
        inner = only_use_of(ctx, name, "Mul")
        leaves.extend(inner.input if inner is not None else [name])
    if len(leaves) != 3:
        return None
    half = [n for n in leaves if _scalar_value(ctx, n) is not None and
            abs(_scalar_value(ctx, n) - 0.5) < 1e-6]
    if len(half) != 1:
        return None
    rest = [n for n in leaves if n != half[0]]
    for one_plus, x in (rest, rest[::-1]):
        add = only_use_of(ctx, one_plus, "Add")
        if add is None:
            continue
        erf = next((only_use_of(ctx, n, "Erf") for n in add.input if only_use_of(ctx, n, "Erf")), None)
        one = [n for n in add.input if _scalar_value(ctx, n) is not None]
        if erf is None or len(one) != 1 or abs(_scalar_value(ctx, one[0]) - 1.0) > 1e-6:
            continue
        div = only_use_of(ctx, erf.input[0], "Div")
        if div is not None and div.input[0] == x and _scalar_value(ctx, div.input[1]) is not None \
                and abs(_scalar_value(ctx, div.input[1]) - np.sqrt(2.0)) < 1e-4:
            return x
    return None


@onnx_converter("Mul")
def _mul(ctx):
    gelu_of = _erf_gelu(ctx)
    if gelu_of is not None:   # the torch door keeps gelu; so does this one
        return ctx.emit("gelu", [ctx.importer.value(gelu_of, ctx)], {"approximate": "none"})
    # x * Sigmoid(x) is how exporters write SiLU: the IR's silu, as the torch door has it
    for i in (0, 1):
        sig = only_use_of(ctx, ctx.onnx.input[i], "Sigmoid")
        if sig is not None and sig.input[0] == ctx.onnx.input[1 - i]:
            return ctx.emit("silu", [ctx.input(1 - i)])
    return ctx.emit("mul", [ctx.input(0), ctx.input(1)])


@onnx_converter("Reciprocal")
def _reciprocal(ctx):
    # 1 / Sqrt(x) is rsqrt, the op the torch door's norms use
    root = only_use_of(ctx, ctx.onnx.input[0], "Sqrt")
    if root is not None:
        return ctx.emit("rsqrt", [ctx.importer.value(root.input[0], ctx)])
    return ctx.emit("reciprocal", [ctx.input(0)])


for _onnx, _ir in _UNARY.items():
    onnx_converter(_onnx)(_unary(_ir))
for _onnx, _ir in _BINARY.items():
    onnx_converter(_onnx)(_binary(_ir))


@onnx_converter("Identity")
def _identity(ctx):
    return ctx.input(0)


@onnx_converter("Div")
def _div(ctx):
    a, b = ctx.input(0), ctx.input(1)
    if a.type.dtype.is_float:
        return ctx.emit("div", [a, b])
    return ctx.emit("div", [a, b], {"rounding": "trunc"})  # C integer division


@onnx_converter("Mod")
def _mod(ctx):
    a, b = ctx.input(0), ctx.input(1)
    if ctx.attr("fmod", 0):
        return ctx.emit("fmod", [a, b])   # the dividend's sign, as C's fmod
    return ctx.emit("remainder", [a, b])  # the divisor's sign, as Python's %


@onnx_converter("Pow")
def _pow(ctx):
    x, y = ctx.input(0), ctx.input(1)
    return cast(ctx, ctx.emit("pow", [x, y]), x.type.dtype)  # ONNX: the base's dtype


@onnx_converter("BitwiseNot")
def _bitwise_not(ctx):
    x = ctx.input(0)
    return ctx.emit("bitwise_xor", [x, scalar_like(ctx, -1 if x.type.dtype != DType.u8 else 255, x)])


@onnx_converter("BitShift")
def _bit_shift(ctx):
    op = "bitwise_left_shift" if ctx.attr("direction") == "LEFT" else "bitwise_right_shift"
    return ctx.emit(op, [ctx.input(0), ctx.input(1)])


@onnx_converter("IsInf")
def _isinf(ctx):
    x = ctx.input(0)
    neg, pos = ctx.attr("detect_negative", 1), ctx.attr("detect_positive", 1)
    inf = ctx.emit("isinf", [x])
    if neg and pos:
        return inf
    if not neg and not pos:
        return ctx.emit("logical_and", [inf, ctx.scalar(False, DType.bool)])
    sign = ctx.emit("gt" if pos else "lt", [x, scalar_like(ctx, 0, x)])
    return ctx.emit("logical_and", [inf, sign])


@onnx_converter("Where")
def _where(ctx):
    return ctx.emit("where", [ctx.input(0), ctx.input(1), ctx.input(2)])


def _variadic(op):
    def conv(ctx):
        xs = [x for x in ctx.inputs() if x is not None]
        y = xs[0]
        for x in xs[1:]:
            y = ctx.emit(op, [y, x])
        return y

    return conv


onnx_converter("Max")(_variadic("maximum"))
onnx_converter("Min")(_variadic("minimum"))
onnx_converter("Sum")(_variadic("add"))


@onnx_converter("Mean")
def _mean(ctx):
    y = _variadic("add")(ctx)
    return ctx.emit("div", [y, scalar_like(ctx, float(ctx.n_inputs), y)])


@onnx_converter("Cast")
def _cast(ctx):
    x = ctx.input(0)
    dt = onnx_dtype(ctx.attr("to"))
    if ctx.attr("saturate", 1) == 0 and dt == DType.fp8:
        ctx.refuse("Cast to float8 with saturate=0")
    return cast(ctx, x, dt)


@onnx_converter("CastLike")
def _cast_like(ctx):
    return cast(ctx, ctx.input(0), ctx.input(1).type.dtype)


@onnx_converter("BitCast", since=26)
def _bitcast(ctx):
    x = ctx.input(0)
    dt = onnx_dtype(ctx.attr("to"))
    if dt == x.type.dtype:
        return x
    if dt.itemsize != x.type.dtype.itemsize or DType.bool in (dt, x.type.dtype):
        ctx.refuse(f"BitCast from {x.type.dtype} to {dt}: the bit widths differ or one is bool",
                   hint="BitCast keeps the bit pattern, so both types need the same width; "
                        "Cast converts values instead")
    return ctx.emit("bitcast", [x], {"dtype": dt})


@onnx_converter("Clip")
def _clip(ctx):
    x = ctx.input(0)
    lo, hi = ctx.input(1), ctx.input(2)   # absent bounds are None
    if lo is not None:
        x = ctx.emit("maximum", [x, lo])
    if hi is not None:
        x = ctx.emit("minimum", [x, hi])
    return x


# -- activations ------------------------------------------------------------------------------

@onnx_converter("LeakyRelu")
def _leaky_relu(ctx):
    x = ctx.input(0)
    alpha = ctx.attr("alpha", 0.01)
    neg = ctx.emit("mul", [x, scalar_like(ctx, alpha, x)])
    return ctx.emit("where", [ctx.emit("ge", [x, scalar_like(ctx, 0, x)]), x, neg])


@onnx_converter("PRelu")
def _prelu(ctx):
    x, slope = ctx.input(0), ctx.input(1)
    neg = ctx.emit("mul", [x, slope])
    return ctx.emit("where", [ctx.emit("lt", [x, scalar_like(ctx, 0, x)]), neg, x])


@onnx_converter("ThresholdedRelu")
def _thresholded_relu(ctx):
    x = ctx.input(0)
    keep = ctx.emit("gt", [x, scalar_like(ctx, ctx.attr("alpha", 1.0), x)])
    return ctx.emit("where", [keep, x, scalar_like(ctx, 0, x)])


def _elu_like(ctx, x, alpha, scale=1.0):
    em1 = ctx.emit("mul", [ctx.emit("expm1", [x]), scalar_like(ctx, alpha, x)])
    y = ctx.emit("where", [ctx.emit("gt", [x, scalar_like(ctx, 0, x)]), x, em1])
    return y if scale == 1.0 else ctx.emit("mul", [y, scalar_like(ctx, scale, x)])


@onnx_converter("Elu")
def _elu(ctx):
    return _elu_like(ctx, ctx.input(0), ctx.attr("alpha", 1.0))


@onnx_converter("Selu")
def _selu(ctx):
    return _elu_like(ctx, ctx.input(0), ctx.attr("alpha", 1.67326319217681884765625),
                     ctx.attr("gamma", 1.05070102214813232421875))


@onnx_converter("Celu")
def _celu(ctx):
    x = ctx.input(0)
    alpha = ctx.attr("alpha", 1.0)
    scaled = ctx.emit("div", [x, scalar_like(ctx, alpha, x)])
    em1 = ctx.emit("mul", [ctx.emit("expm1", [scaled]), scalar_like(ctx, alpha, x)])
    return ctx.emit("add", [ctx.emit("relu", [x]),
                            ctx.emit("minimum", [scalar_like(ctx, 0, x), em1])])


@onnx_converter("HardSigmoid")
def _hard_sigmoid(ctx):
    x = ctx.input(0)
    y = ctx.emit("add", [ctx.emit("mul", [x, scalar_like(ctx, ctx.attr("alpha", 0.2), x)]),
                         scalar_like(ctx, ctx.attr("beta", 0.5), x)])
    return ctx.emit("clamp", [y], {"min": 0.0, "max": 1.0})


@onnx_converter("HardSwish")
def _hard_swish(ctx):
    x = ctx.input(0)
    y = ctx.emit("add", [ctx.emit("mul", [x, scalar_like(ctx, 1 / 6, x)]),
                         scalar_like(ctx, 0.5, x)])
    return ctx.emit("mul", [x, ctx.emit("clamp", [y], {"min": 0.0, "max": 1.0})])


@onnx_converter("Softplus")
def _softplus(ctx):
    x = ctx.input(0)
    # log(1 + e^x) = max(x, 0) + log1p(e^-|x|): no overflow for large x
    tail = ctx.emit("log1p", [ctx.emit("exp", [ctx.emit("neg", [ctx.emit("abs", [x])])])])
    return ctx.emit("add", [ctx.emit("relu", [x]), tail])


@onnx_converter("Softsign")
def _softsign(ctx):
    x = ctx.input(0)
    return ctx.emit("div", [x, ctx.emit("add", [ctx.emit("abs", [x]), scalar_like(ctx, 1, x)])])


@onnx_converter("Mish")
def _mish(ctx):
    x = ctx.input(0)
    return ctx.emit("mul", [x, ctx.emit("tanh", [_softplus(ctx)])])


@onnx_converter("Gelu", since=20)
def _gelu(ctx):
    return ctx.emit("gelu", [ctx.input(0)], {"approximate": ctx.attr("approximate", "none")})


@onnx_converter("Swish", since=24)
def _swish(ctx):
    x = ctx.input(0)
    alpha = ctx.attr("alpha", 1.0)
    if alpha == 1.0:
        return ctx.emit("silu", [x])
    return ctx.emit("mul", [x, ctx.emit("sigmoid", [ctx.emit("mul", [x, scalar_like(ctx, alpha, x)])])])


@onnx_converter("Shrink")
def _shrink(ctx):
    x = ctx.input(0)
    lambd, bias = ctx.attr("lambd", 0.5), ctx.attr("bias", 0.0)
    lo = ctx.emit("add", [x, scalar_like(ctx, bias, x)])
    hi = ctx.emit("sub", [x, scalar_like(ctx, bias, x)])
    zero = scalar_like(ctx, 0, x)
    y = ctx.emit("where", [ctx.emit("gt", [x, scalar_like(ctx, lambd, x)]), hi, zero])
    return ctx.emit("where", [ctx.emit("lt", [x, scalar_like(ctx, -lambd, x)]), lo, y])
