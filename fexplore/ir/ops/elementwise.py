"""Elementwise ops: unary math and activations, binary arithmetic and comparisons, where, clamp, cast."""

from __future__ import annotations

import math

import numpy as np

from ..opdef import AttrSpec, Category, Cost, OpDef, elementwise_cost, io_bytes
from ..opset import register
from ..types import DType, TensorType, promote_types
from .rules import TypeRuleError, broadcast_shapes, float_compute_type, float_result


def _erfc_chebyshev(z: np.ndarray) -> np.ndarray:
    """erfc(z) for z >= 0 by Numerical Recipes' Chebyshev fit (fractional error < 1.2e-7
    everywhere, so relative accuracy holds where erfc is tiny)."""
    t = 1.0 / (1.0 + 0.5 * z)
    poly = (-1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277)))))))))
    return t * np.exp(-z * z + poly)


def erf(x: np.ndarray) -> np.ndarray:
    """erf in float64: a Taylor series near zero (relative accuracy where erf is small) and
    1 - the Chebyshev erfc elsewhere, since numpy has none."""
    x = np.asarray(x, dtype=np.float64)
    z = np.abs(x)
    far = np.sign(x) * (1.0 - _erfc_chebyshev(z))
    # Taylor: 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)); 12 terms reach 1e-16 for |x| < 0.5.
    x2 = x * x
    term = x.copy()
    near = x.copy()
    for n in range(1, 12):
        term = term * (-x2) / n
        near = near + term / (2 * n + 1)
    near *= 2.0 / math.sqrt(math.pi)
    return np.where(z < 0.5, near, far)


def erfc(x: np.ndarray) -> np.ndarray:
    """1 - erf(x) without the cancellation: the Chebyshev erfc directly for x >= 0.5 (relative
    accuracy where erfc is tiny), 2 - that for x <= -0.5, and 1 - the Taylor erf in between."""
    x = np.asarray(x, dtype=np.float64)
    z = np.abs(x)
    tail = _erfc_chebyshev(z)
    return np.where(z < 0.5, 1.0 - erf(x), np.where(x > 0, tail, 2.0 - tail))


def _f64(fn):
    # Transcendentals are evaluated in f64 and rounded once, so the reference is the exact result
    # rounded to the output dtype (torch's CPU kernels are within an ulp or two of that).
    return lambda x: fn(np.asarray(x, dtype=np.float64))


def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free form of 1 / (1 + exp(-x))


def gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _sign(x):
    # torch's sign: a bool is its own sign (numpy has no bool loop), and sign(NaN) is 0
    if x.dtype == np.bool_:
        return x
    return np.where(np.isnan(x), 0, np.sign(x)) if x.dtype.kind == "f" else np.sign(x)


def _unary_type(float_only: bool):
    def infer(ins, attrs):
        (t,) = ins
        return [TensorType(t.shape, float_result(t.dtype) if float_only else t.dtype)]

    return infer


def unary(name: str, fn, *, float_only: bool = True, flops: int = 1, attrs=(), doc: str = ""):
    """Define a one-input elementwise op; ``fn(x, **attrs)`` computes it on an f32/f64/int array."""

    def reference(inputs, a):
        (x,) = inputs
        if float_only:
            x = x.astype(np.float64)
        return [fn(x, **dict(a))]

    return register(OpDef(name, Category.elementwise, _unary_type(float_only), reference,
                          elementwise_cost(flops), attrs=tuple(attrs), arity=1, doc=doc))


unary("exp", np.exp, flops=4)
unary("log", np.log, flops=4)
unary("log1p", np.log1p, flops=4)
unary("expm1", np.expm1, flops=4)
unary("sqrt", np.sqrt, flops=2)
unary("rsqrt", lambda x: 1.0 / np.sqrt(x), flops=2)
unary("reciprocal", lambda x: 1.0 / x)
unary("exp2", np.exp2, flops=4)
unary("log2", np.log2, flops=4)
unary("log10", np.log10, flops=4)
unary("sin", np.sin, flops=4)
unary("cos", np.cos, flops=4)
unary("tanh", np.tanh, flops=4)
unary("tan", np.tan, flops=4)
unary("asin", np.arcsin, flops=4)
unary("acos", np.arccos, flops=4)
unary("atan", np.arctan, flops=4)
unary("sinh", np.sinh, flops=4)
unary("cosh", np.cosh, flops=4)
unary("asinh", np.arcsinh, flops=4)
unary("acosh", np.arccosh, flops=4)
unary("atanh", np.arctanh, flops=4)
unary("erf", erf, flops=8)
unary("erfc", erfc, flops=8)
unary("sigmoid", sigmoid, flops=4)
unary("silu", lambda x: x * sigmoid(x), flops=5)
unary("gelu", gelu, flops=8, attrs=[AttrSpec("approximate", "str", "none")],
      doc="approximate is 'none' (exact, erf) or 'tanh' (GPT-2's)")
unary("neg", np.negative, float_only=False)
unary("abs", np.abs, float_only=False)
unary("relu", lambda x: np.maximum(x, np.zeros((), x.dtype)), float_only=False)
unary("floor", np.floor, float_only=False)
unary("ceil", np.ceil, float_only=False)
unary("round", np.round, float_only=False)
unary("trunc", np.trunc, float_only=False)
unary("sign", _sign, float_only=False)
register(OpDef("signbit", Category.elementwise,
               lambda ins, a: [TensorType(ins[0].shape, DType.bool)],
               lambda xs, a: [np.signbit(xs[0]) if xs[0].dtype.kind != "b"
                              else np.zeros(xs[0].shape, bool)], elementwise_cost(1)))
register(OpDef("isnan", Category.elementwise,
               lambda ins, a: [TensorType(ins[0].shape, DType.bool)],
               lambda xs, a: [np.isnan(xs[0]) if xs[0].dtype.kind == "f"
                              else np.zeros(xs[0].shape, bool)], elementwise_cost(1)))
register(OpDef("isinf", Category.elementwise,
               lambda ins, a: [TensorType(ins[0].shape, DType.bool)],
               lambda xs, a: [np.isinf(xs[0]) if xs[0].dtype.kind == "f"
                              else np.zeros(xs[0].shape, bool)], elementwise_cost(1)))
register(OpDef("logical_not", Category.elementwise,
               lambda ins, a: [TensorType(ins[0].shape, DType.bool)],
               lambda xs, a: [np.logical_not(xs[0])], elementwise_cost(1)))


# -- binary ---------------------------------------------------------------------------------

def _binary_type(result: str):
    def infer(ins, attrs):
        a, b = ins
        shape = broadcast_shapes(a.shape, b.shape)
        dt = promote_types([a, b])
        if result == "bool":
            dt = DType.bool
        elif result == "float":
            dt = float_result(dt)
        return [TensorType(shape, dt)]

    return infer


def binary(name: str, fn, *, result: str = "promote", flops: int = 1, attrs=(), doc=""):
    """Define a broadcasting two-input op. Operands are first converted to the promoted dtype (or,
    for comparisons, to their common dtype), as torch does."""
    infer = _binary_type(result)

    def reference(inputs, a):
        x, y = inputs
        common = _common_dtype(x, y)
        if result == "float":
            common = float_result(common)
        ct = float_compute_type(common) if common.is_float else common.numpy
        return [fn(x.astype(ct, copy=False), y.astype(ct, copy=False), **dict(a))]

    return register(OpDef(name, Category.elementwise, infer, reference, elementwise_cost(flops),
                          attrs=tuple(attrs), arity=2, doc=doc))


def _div(x, y, rounding):
    if rounding == "none":
        return np.true_divide(x, y)
    if np.issubdtype(x.dtype, np.integer):
        q = np.floor_divide(x, np.where(y == 0, 1, y))
        if rounding == "trunc":
            q = np.where((q < 0) & (q * y != x), q + 1, q)
        return q
    q = np.true_divide(x, y)
    return np.floor(q) if rounding == "floor" else np.trunc(q)


def _div_type(ins, attrs):
    a, b = ins
    t = _binary_type("promote")(ins, attrs)[0]
    if attrs["rounding"] == "none":
        t = TensorType(t.shape, float_result(t.dtype))
    return [t]


register(OpDef("div", Category.elementwise, _div_type,
               lambda xs, a: [_div(*_div_operands(xs, a), a["rounding"])], elementwise_cost(1),
               attrs=(AttrSpec("rounding", "str", "none"),), arity=2,
               doc="rounding is 'none' (true division), 'trunc' or 'floor'"))


def _common_dtype(*arrays: np.ndarray) -> DType:
    return promote_types([TensorType(x.shape, DType.from_numpy(x.dtype)) for x in arrays])


def _div_operands(xs, a):
    common = _common_dtype(*xs)
    ct = float_compute_type(common) if a["rounding"] == "none" or common.is_float \
        else common.numpy
    return [x.astype(ct, copy=False) for x in xs]


binary("add", np.add)
binary("sub", np.subtract)
binary("mul", np.multiply)
binary("maximum", np.maximum)
binary("minimum", np.minimum)
def power(x, y):
    if x.dtype.kind not in "iu":
        return np.power(x, y)
    # integer powers with a negative exponent: torch gives 1 and +-1 for bases 1 and -1, 0 for
    # the rest (numpy refuses them)
    neg = y < 0
    p = np.power(x, np.where(neg, 0, y))
    if not np.any(neg):
        return p
    odd = (y % 2) != 0
    small = np.where(x == 1, 1, np.where(x == -1, np.where(odd, -1, 1), 0)).astype(p.dtype)
    return np.where(neg, small, p)


binary("pow", power, flops=4)
binary("atan2", np.arctan2, result="float", flops=8)
binary("hypot", np.hypot, result="float", flops=4)
binary("remainder", np.mod)  # Python's (and torch's) sign convention: follows the divisor
binary("fmod", np.fmod)  # C's convention: the sign follows the dividend
binary("eq", np.equal, result="bool")
binary("ne", np.not_equal, result="bool")
binary("lt", np.less, result="bool")
binary("le", np.less_equal, result="bool")
binary("gt", np.greater, result="bool")
binary("ge", np.greater_equal, result="bool")
binary("logical_and", np.logical_and, result="bool")
binary("logical_or", np.logical_or, result="bool")
binary("logical_xor", np.logical_xor, result="bool")
binary("bitwise_and", np.bitwise_and)
binary("bitwise_or", np.bitwise_or)
binary("bitwise_xor", np.bitwise_xor)
# shifts by the bit width or more give 0 (or -1 shifting a negative right), in torch and numpy alike
binary("bitwise_left_shift", np.left_shift)
binary("bitwise_right_shift", np.right_shift)
binary("copysign", np.copysign, result="float")
binary("fmax", np.fmax)  # maximum that ignores a NaN beside a number
binary("fmin", np.fmin)


# -- where, clamp, cast -----------------------------------------------------------------------

def _where_type(ins, attrs):
    c, a, b = ins
    if c.dtype != DType.bool:
        raise TypeRuleError(f"where: condition must be bool, got {c.dtype}")
    return [TensorType(broadcast_shapes(c.shape, a.shape, b.shape), promote_types([a, b]))]


def _where_ref(xs, attrs):
    c, a, b = xs
    dt = _common_dtype(a, b).numpy
    return [np.where(c, a.astype(dt, copy=False), b.astype(dt, copy=False))]


register(OpDef("where", Category.elementwise, _where_type, _where_ref, elementwise_cost(1),
               arity=3))


def _clamp_ref(xs, a):
    (x,) = xs
    if x.dtype.kind != "f" and any(isinstance(a[k], float) for k in ("min", "max")):
        x = x.astype(np.float32)  # a float bound promotes the ints first (see _clamp_type)
    if a["min"] is not None:
        x = np.maximum(x, np.asarray(a["min"]).astype(x.dtype))
    if a["max"] is not None:
        x = np.minimum(x, np.asarray(a["max"]).astype(x.dtype))
    return [x]


def _clamp_type(ins, attrs):
    (t,) = ins
    dt = t.dtype
    if not dt.is_float and any(isinstance(attrs[k], float) for k in ("min", "max")):
        dt = DType.f32
    return [TensorType(t.shape, dt)]


register(OpDef("clamp", Category.elementwise, _clamp_type, _clamp_ref, elementwise_cost(2),
               attrs=(AttrSpec("min", "number", None, optional=True),
                      AttrSpec("max", "number", None, optional=True)), arity=1))


def _cast_ref(xs, a):
    (x,) = xs
    target = a["dtype"]
    if x.dtype.kind == "f" and target.is_int:
        x = np.trunc(x)  # torch truncates toward zero; numpy's astype does too, but NaN/inf vary
    if x.dtype.kind == "f" and target == DType.fp8:
        x = np.clip(x, -448.0, 448.0)  # torch saturates to e4m3fn's max (ml_dtypes gives NaN)
    return [x.astype(target.numpy)]


register(OpDef("cast", Category.elementwise,
               lambda ins, a: [TensorType(ins[0].shape, a["dtype"])], _cast_ref, elementwise_cost(1),
               attrs=(AttrSpec("dtype", "dtype"),), arity=1))


def _bytes_only(ins, outs, attrs) -> Cost:
    return Cost(0, io_bytes(ins, outs))


def _tri_type(ins, attrs):
    (t,) = ins
    if t.rank < 2:
        raise TypeRuleError("tril/triu need rank >= 2")
    return [TensorType(t.shape, t.dtype)]


register(OpDef("tril", Category.elementwise, _tri_type,
               lambda xs, a: [np.tril(xs[0], a["diagonal"])], _bytes_only,
               attrs=(AttrSpec("diagonal", "int", 0),), arity=1))
register(OpDef("triu", Category.elementwise, _tri_type,
               lambda xs, a: [np.triu(xs[0], a["diagonal"])], _bytes_only,
               attrs=(AttrSpec("diagonal", "int", 0),), arity=1))
