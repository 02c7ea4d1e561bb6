"""The vector unit's operations: one table, one entry per op, everything about the op in its entry.

Each `VectorOpDef` holds its arity, kind (elementwise, reduction, compare), numpy meaning, and cost
in vector-unit passes per element. The simulator's timing and functional modes, and the builder's
shape checks, all read this table; nothing else knows about individual vector ops.

Semantics: operands are SRAM buffers or Python scalars (immediates); they broadcast like numpy.
The unit computes in f32 (bf16/fp8 inputs are widened) and the result is cast to the output
buffer's dtype on write, so ``cast`` is simply ``copy`` into a buffer of another dtype. An op that
maps integers to integers (``ints=True``: add, bit operations, comparisons, sums ...) whose
operands are all integers or masks runs on integer lanes instead, 64 bits wide, so it is exact:
f32 holds integers exactly only up to 2^24, and an i32 bit pattern through it loses its low bits.
Writing the 64-bit result into a narrower integer buffer keeps its low bits, which is the
wraparound the narrower type computes itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from fexplore.ir.ops import elementwise as ir_elementwise


@dataclass(frozen=True)
class VectorOpDef:
    name: str
    arity: int
    kind: str                 # "elementwise" | "reduction" | "compare"
    fn: Callable              # numpy meaning, on f32 arrays or, for `ints`, 64-bit integer ones
                              # (reductions also take axis, keepdims)
    passes: int = 1           # [ASSUMPTION] vector-unit passes per element; transcendentals take 2
    flops: int = 1            # flops per element, for reports
    # integers in, integers out: on integer operands it runs on integer lanes ([ASSUMPTION] the
    # unit has them at the f32 rate; the chip's public figures give only f32 and bf16 rates)
    ints: bool = False


# The math of each op is the IR's (fexplore.ir.ops.elementwise): one meaning, not two.
def _gelu(x):
    return ir_elementwise.gelu(x.astype(np.float64)).astype(np.float32)


def _gelu_tanh(x):
    return ir_elementwise.gelu(x.astype(np.float64), "tanh").astype(np.float32)


def _sigmoid(x):
    return ir_elementwise.sigmoid(x)


def _erf(x):
    return ir_elementwise.erf(x).astype(np.float32)


def _erfc(x):
    return ir_elementwise.erfc(x).astype(np.float32)


def _sign(x):
    return np.where(np.isnan(x), np.float32(0), np.sign(x))   # torch's sign(NaN) is 0


def _logical(fn):
    return lambda a, b: fn(a != 0, b != 0)


def _ew(name, arity, fn, passes=1, flops=1, ints=False):
    return VectorOpDef(name, arity, "elementwise", fn, passes, flops, ints)


def _int(name, arity, fn, passes=1, flops=1):
    """An elementwise op that maps integers to integers (exact on integer lanes)."""
    return _ew(name, arity, fn, passes, flops, ints=True)


def _red(name, fn, ints):
    return VectorOpDef(name, 1, "reduction", fn, 1, 1, ints)


def _cmp(name, fn):
    return VectorOpDef(name, 2, "compare", fn, 1, 1, ints=True)


VECTOR_OPS: dict[str, VectorOpDef] = {d.name: d for d in [
    # data movement inside SRAM; into a buffer of another dtype this is the cast
    _int("fill", 1, lambda x: x, flops=0),   # out[...] = scalar; the one op whose result is out's shape
    _int("copy", 1, lambda x: x, flops=0),
    _int("cast", 1, lambda x: x, flops=0),
    # unary
    _int("neg", 1, np.negative),
    _int("abs", 1, np.abs),
    _int("relu", 1, lambda x: np.maximum(x, 0)),
    _ew("exp", 1, np.exp, passes=2, flops=4),
    _ew("log", 1, np.log, passes=2, flops=4),
    _ew("sqrt", 1, np.sqrt, passes=2, flops=4),
    _ew("rsqrt", 1, lambda x: 1.0 / np.sqrt(x), passes=2, flops=4),
    _ew("reciprocal", 1, lambda x: 1.0 / x, passes=2, flops=4),
    _ew("tanh", 1, np.tanh, passes=2, flops=8),
    _ew("sigmoid", 1, _sigmoid, passes=2, flops=8),
    _ew("silu", 1, lambda x: x * _sigmoid(x), passes=2, flops=9),
    _ew("gelu", 1, _gelu, passes=2, flops=12),            # erf form, torch's default
    _ew("gelu_tanh", 1, _gelu_tanh, passes=2, flops=12),  # torch's approximate="tanh"
    _ew("log1p", 1, np.log1p, passes=2, flops=4),
    _ew("expm1", 1, np.expm1, passes=2, flops=4),
    _ew("sin", 1, np.sin, passes=2, flops=4),
    _ew("cos", 1, np.cos, passes=2, flops=4),
    _ew("erf", 1, _erf, passes=2, flops=8),
    _ew("erfc", 1, _erfc, passes=2, flops=8),
    _ew("floor", 1, np.floor),
    _ew("ceil", 1, np.ceil),
    _ew("round", 1, np.round),                           # half to even, as torch.round
    _ew("trunc", 1, np.trunc),
    _int("sign", 1, _sign),
    _ew("exp2", 1, np.exp2, passes=2, flops=4),
    _ew("log2", 1, np.log2, passes=2, flops=4),
    _ew("log10", 1, np.log10, passes=2, flops=4),
    _ew("tan", 1, np.tan, passes=2, flops=8),
    _ew("asin", 1, np.arcsin, passes=2, flops=8),
    _ew("acos", 1, np.arccos, passes=2, flops=8),
    _ew("atan", 1, np.arctan, passes=2, flops=8),
    _ew("sinh", 1, np.sinh, passes=2, flops=8),
    _ew("cosh", 1, np.cosh, passes=2, flops=8),
    _ew("asinh", 1, np.arcsinh, passes=2, flops=8),
    _ew("acosh", 1, np.arccosh, passes=2, flops=8),
    _ew("atanh", 1, np.arctanh, passes=2, flops=8),
    # binary
    _int("add", 2, np.add),
    _int("sub", 2, np.subtract),
    _int("mul", 2, np.multiply),
    # a * b + c in one pass, as a vector unit's multiply-add does ([ASSUMPTION] one pass, like add)
    _int("fma", 3, lambda a, b, c: a * b + c, flops=2),
    _ew("div", 2, np.divide, passes=2, flops=4),
    _int("maximum", 2, np.maximum),
    _int("minimum", 2, np.minimum),
    # integer powers exact on integer lanes, with torch's meaning of a negative exponent (the IR's)
    _int("pow", 2, ir_elementwise.power, passes=2, flops=8),
    _int("remainder", 2, np.mod, passes=2, flops=4),     # the sign follows the divisor (Python's)
    _int("fmod", 2, np.fmod, passes=2, flops=4),         # the sign follows the dividend (C's)
    _ew("atan2", 2, np.arctan2, passes=2, flops=8),
    _ew("hypot", 2, np.hypot, passes=2, flops=4),
    _ew("copysign", 2, np.copysign),
    _ew("fmax", 2, np.fmax),                            # a NaN beside a number gives the number
    _ew("fmin", 2, np.fmin),
    _int("bitwise_and", 2, np.bitwise_and),
    _int("bitwise_or", 2, np.bitwise_or),
    _int("bitwise_xor", 2, np.bitwise_xor),
    _int("bitwise_left_shift", 2, np.left_shift),
    _int("bitwise_right_shift", 2, np.right_shift),
    # select: where(cond, a, b)
    _int("where", 3, lambda c, a, b: np.where(c != 0, a, b)),
    # comparisons produce masks (write them into bool or numeric buffers)
    _cmp("eq", np.equal),
    _cmp("ne", np.not_equal),
    _cmp("lt", np.less),
    _cmp("le", np.less_equal),
    _cmp("gt", np.greater),
    _cmp("ge", np.greater_equal),
    _cmp("logical_and", _logical(np.logical_and)),
    _cmp("logical_or", _logical(np.logical_or)),
    _cmp("logical_xor", _logical(np.logical_xor)),
    VectorOpDef("logical_not", 1, "compare", lambda x: x == 0, ints=True),
    VectorOpDef("signbit", 1, "compare", np.signbit),
    VectorOpDef("isnan", 1, "compare", np.isnan),
    VectorOpDef("isinf", 1, "compare", np.isinf),
    # reductions over `axis` (default -1), keepdims by default so results broadcast back
    _red("sum", np.sum, ints=True),
    _red("max", np.max, ints=True),
    _red("min", np.min, ints=True),
    _red("mean", np.mean, ints=False)   # a mean of integers is a fraction,
]}


def result_shape(op: VectorOpDef, shapes: list[tuple[int, ...]], axis, keepdims: bool) -> tuple[int, ...]:
    """Shape of `op` applied to operands of `shapes` (a scalar operand has shape ()).
    Raises ValueError with a readable reason on a mismatch."""
    if op.kind == "reduction":
        (shape,) = shapes
        axes = _norm_axes(axis, len(shape))
        if keepdims:
            return tuple(1 if i in axes else d for i, d in enumerate(shape))
        return tuple(d for i, d in enumerate(shape) if i not in axes)
    distinct = {s for s in shapes if s}
    if len(distinct) <= 1:   # operands of one shape and scalars (most commands): nothing to broadcast
        return next(iter(distinct), ())
    return tuple(np.broadcast_shapes(*shapes))


def _norm_axes(axis, ndim: int) -> tuple[int, ...]:
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} out of range for a {ndim}-d operand")
        out.append(a % ndim)
    return tuple(sorted(set(out)))


def apply(op: VectorOpDef, args: list, axis, keepdims: bool) -> np.ndarray:
    """Run `op` on numpy arrays / scalars: in f32, or for an integer op on integer operands in
    64-bit integers (unsigned when an operand is u64, whose values an i64 cannot hold)."""
    lane = _integer_lane(op, args)
    if lane is None:
        lane = np.dtype(np.float32)
        vals = [np.float32(a) if not isinstance(a, np.ndarray) else a for a in args]
    else:
        vals = [np.asarray(a).astype(lane) if not isinstance(a, np.ndarray) else a for a in args]
    vals = [a.astype(lane) if a.dtype != lane else a for a in vals]
    with np.errstate(all="ignore"):  # NaN/inf propagate like on the chip; reads of fresh SRAM are NaN
        if op.kind == "reduction":
            return op.fn(vals[0], axis=_norm_axes(axis, vals[0].ndim), keepdims=keepdims)
        return op.fn(*vals)


def _integer_lane(op: VectorOpDef, args: list) -> np.dtype | None:
    """The integer dtype `op` computes in on `args`, or None when it computes in f32: an op that
    maps integers to integers, every operand an integer or mask (an array of kind b/i/u, a
    Python or numpy int)."""
    if not op.ints:
        return None
    wide_unsigned = False
    for a in args:
        if isinstance(a, np.ndarray):
            if a.dtype.kind not in "biu":
                return None
            wide_unsigned |= a.dtype == np.uint64
        elif not isinstance(a, (int, np.integer)):   # bool is an int
            return None
    return np.dtype(np.uint64 if wide_unsigned else np.int64)
