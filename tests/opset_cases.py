"""The opset conformance table: for every built-in op (but the region ops) a few cases, each with
numpy inputs, IR attributes and the equivalent torch call. torch is the oracle; ``test_opset.py``
runs both and compares shape, dtype and values.

Inputs come from one seeded generator, so the table is the same on every run. Where the IR is
strict on purpose (slice bounds clamped and non-negative, reshape with a full shape, gather and
index with integer tensors) the cases speak the IR's form and the torch call says the same thing
in torch's words.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F

from fexplore.ir import DType

bf16 = ml_dtypes.bfloat16
fp8 = ml_dtypes.float8_e4m3fn
NAN, INF = float("nan"), float("inf")

_rng = np.random.default_rng(20240917)


@dataclass
class Case:
    op: str
    name: str
    inputs: tuple
    torch_fn: Callable[..., Any]  # torch tensors in, a tensor or a sequence of tensors out
    attrs: dict = field(default_factory=dict)
    rtol: float | None = None  # None: the output dtype's default tolerance
    atol: float | None = None

    @property
    def id(self) -> str:
        return f"{self.op}-{self.name}"


CASES: list[Case] = []


def case(op, name, inputs, torch_fn, *, rtol=None, atol=None, **attrs):
    CASES.append(Case(op, name, tuple(np.ascontiguousarray(x) for x in inputs), torch_fn,
                      attrs, rtol, atol))


# -- inputs ---------------------------------------------------------------------------------------

def randn(*shape, dtype=np.float32, scale=1.0):
    return (_rng.standard_normal(shape) * scale).astype(dtype)


def positive(*shape, dtype=np.float32, lo=0.05, hi=4.0):
    return _rng.uniform(lo, hi, size=shape).astype(dtype)


def randint(lo, hi, *shape, dtype=np.int64):
    return _rng.integers(lo, hi, size=shape).astype(dtype)


def nonzero_int(lo, hi, *shape, dtype=np.int64):
    x = randint(lo, hi - 1, *shape, dtype=dtype)
    return np.where(x >= 0, x + 1, x).astype(dtype)  # lo..hi without 0


def randbool(*shape):
    return _rng.random(shape) < 0.5


def arr(values, dtype=np.float32):
    return np.asarray(values, dtype=dtype)


def scalar(v, dtype=np.float32):
    return np.asarray(v, dtype=dtype)  # a 0-d operand, as ingestion makes of Python scalars


# -- elementwise, unary ---------------------------------------------------------------------------

for name in ("exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "erf", "sigmoid",
             "silu"):
    tfn = F.silu if name == "silu" else getattr(torch, name)
    if name in ("log", "sqrt", "rsqrt"):
        domain = positive
    else:
        domain = (lambda *s, **k: randn(*s, **k, scale=3.0))
    case(name, "f32", [domain(3, 4)], tfn)
    case(name, "bf16", [domain(2, 5, dtype=bf16)], tfn)
    case(name, "f16", [domain(7, dtype=np.float16)], tfn)
    case(name, "0d", [scalar(0.75)], tfn)

# ints become f32 for math defined on floats only (torch promotes to the default float dtype)
case("exp", "i32", [randint(-5, 6, 2, 3, dtype=np.int32)], torch.exp)
case("log", "i64", [randint(1, 100, 5)], torch.log)
case("sqrt", "i32", [randint(0, 50, 5, dtype=np.int32)], torch.sqrt)
case("reciprocal", "i32-with-zero", [arr([-3, -1, 0, 2, 7], np.int32)], torch.reciprocal)
case("erf", "i64", [randint(-3, 4, 6)], torch.erf)
case("sigmoid", "i64", [randint(-40, 40, 6)], torch.sigmoid)

# special values: overflow, domain edges, NaN propagation
case("exp", "special", [arr([-INF, -104.0, -100.0, 0.0, 88.0, 89.0, INF, NAN])], torch.exp)
case("log", "special", [arr([0.0, -1.0, 1e-30, 1.0, INF, NAN, -0.0])], torch.log)
case("sqrt", "special", [arr([-1.0, 0.0, 1e-30, INF, NAN])], torch.sqrt)
case("rsqrt", "special", [arr([0.0, -1.0, 1e-30, INF, 4.0])], torch.rsqrt)
case("reciprocal", "special", [arr([0.0, -0.0, INF, -INF, NAN, 1e-30, 3.0])], torch.reciprocal)
case("tanh", "large", [arr([-100.0, -20.0, -9.0, 9.0, 20.0, 100.0, INF, -INF])], torch.tanh)
case("sin", "wide", [randn(4, 5, scale=40.0)], torch.sin)
case("cos", "wide", [randn(4, 5, scale=40.0)], torch.cos)
case("erf", "large", [arr([-1e30, -10.0, -5.0, -3.5, -2.0, 2.0, 3.5, 5.0, 10.0, INF, -INF, NAN])],
     torch.erf)
# tiny |x|: erf(x) ~ 2x/sqrt(pi); check relative accuracy (no atol to hide behind)
case("erf", "tiny", [arr([1e-30, -1e-20, 1e-10, 3e-8, -1e-6, 1e-4, -0.01, 0.3, 0.49, 0.51])],
     torch.erf, atol=0.0)
_large = arr([-1e30, -1000.0, -100.0, -88.0, -30.0, -17.0, 17.0, 30.0, 88.0, 100.0, 1000.0, 1e30,
              INF, -INF])
case("sigmoid", "large", [_large], torch.sigmoid)
case("silu", "large", [_large], F.silu)

for approx in ("none", "tanh"):
    g = (lambda a: lambda x: F.gelu(x, approximate=a))(approx)
    case("gelu", f"{approx}-f32", [randn(3, 7, scale=3.0)], g, approximate=approx)
    case("gelu", f"{approx}-bf16", [randn(4, 5, dtype=bf16, scale=3.0)], g, approximate=approx)
    case("gelu", f"{approx}-large", [arr([-1e4, -100.0, -12.0, -6.0, 6.0, 12.0, 100.0, 1e4])], g,
         approximate=approx)

# the ops that keep ints
case("neg", "f32", [randn(3, 4)], torch.neg)
case("neg", "i32", [randint(-100, 100, 3, 4, dtype=np.int32)], torch.neg)
case("neg", "i8-wrap", [arr([-128, -1, 0, 127], np.int8)], torch.neg)
case("neg", "0d-i64", [scalar(5, np.int64)], torch.neg)
case("abs", "i64", [randint(-100, 100, 2, 5)], torch.abs)
case("abs", "i8-min", [arr([-128, -7, 0, 7, 127], np.int8)], torch.abs)
case("abs", "f16", [randn(6, dtype=np.float16)], torch.abs)
case("relu", "f32", [randn(3, 4)], torch.relu)
case("relu", "i32", [randint(-10, 10, 3, 4, dtype=np.int32)], torch.relu)
case("relu", "bf16", [randn(8, dtype=bf16)], torch.relu)
case("relu", "i8", [arr([-128, -1, 0, 1, 127], np.int8)], torch.relu)
_halves = arr([-2.5, -1.5, -0.5, -0.49999997, -0.0, 0.5, 1.5, 2.5, 3.7, -3.7, INF, NAN])
for name in ("floor", "ceil", "round"):
    case(name, "f32", [randn(3, 4, scale=5.0)], getattr(torch, name))
    case(name, "halves", [_halves], getattr(torch, name))
    case(name, "i64", [randint(-50, 50, 5)], getattr(torch, name))
    case(name, "i32", [randint(-50, 50, 5, dtype=np.int32)], getattr(torch, name))
case("floor", "f16", [randn(6, dtype=np.float16, scale=4.0)], torch.floor)
case("round", "bf16", [randn(6, dtype=bf16, scale=4.0)], torch.round)
case("sign", "f32", [arr([-3.0, -0.0, 0.0, 2.0, -INF, INF, 1e-30, NAN])], torch.sign)
case("sign", "i32", [randint(-3, 4, 7, dtype=np.int32)], torch.sign)
case("sign", "bool", [randbool(6)], torch.sign)
case("logical_not", "f32", [arr([0.0, -0.0, 1.5, NAN, -INF])], torch.logical_not)
case("logical_not", "i32", [randint(-2, 3, 3, 3, dtype=np.int32)], torch.logical_not)
case("logical_not", "bool", [randbool(2, 3)], torch.logical_not)

# -- elementwise, binary --------------------------------------------------------------------------

# broadcasting and torch's promotion (dimensioned tensors outrank 0-d ones within a category)
for name in ("add", "sub", "mul", "maximum", "minimum"):
    tfn = getattr(torch, name)
    case(name, "broadcast", [randn(3, 1, 5), randn(4, 5)], tfn)
    case(name, "f16-0d-f32", [randn(2, 3, dtype=np.float16), scalar(0.1)], tfn)
    case(name, "i64-0d-f32", [randint(-9, 9, 2, 3), scalar(-1.5)], tfn)
    case(name, "i32-0d-i64", [randint(-99, 99, 2, 3, dtype=np.int32), scalar(7, np.int64)], tfn)
    case(name, "bf16-f16", [randn(2, 3, dtype=bf16), randn(1, 3, dtype=np.float16)], tfn)
    case(name, "i8-i32", [randint(-9, 9, 4, dtype=np.int8), randint(-9, 9, 4, dtype=np.int32)], tfn)
    case(name, "0d-0d", [scalar(2.5, np.float16), scalar(3, np.int64)], tfn)
    case(name, "0d-f32-i32", [scalar(0.5), randint(-5, 5, 3, dtype=np.int32)], tfn)
case("add", "bool-i8", [randbool(2, 3), randint(-5, 5, 2, 3, dtype=np.int8)], torch.add)
case("add", "bool-bool", [randbool(2, 3), randbool(3)], torch.add)
case("add", "i8-wrap", [arr([100, -100, 127], np.int8), arr([100, -100, 1], np.int8)], torch.add)
case("mul", "i8-wrap", [arr([100, -100, 127], np.int8), arr([3, 3, 2], np.int8)], torch.mul)
case("add", "inf-nan", [arr([INF, -INF, NAN, 1.0]), arr([-INF, -INF, 1.0, INF])], torch.add)
case("maximum", "nan", [arr([NAN, 1.0, -INF, 2.0]), arr([0.0, NAN, 3.0, -0.0])], torch.maximum)
case("minimum", "nan", [arr([NAN, 1.0, -INF, 2.0]), arr([0.0, NAN, 3.0, -0.0])], torch.minimum)
case("maximum", "bool", [randbool(5), randbool(5)], torch.maximum)

case("pow", "f32", [positive(3, 4), randn(3, 4)], torch.pow)
case("pow", "neg-base-int-exp", [randn(2, 6, scale=3.0), arr([0, 1, 2, 3, -1, -2], np.float32)],
     torch.pow)
case("pow", "neg-base-frac-exp", [arr([-2.0, -0.5, 0.0, 0.0]), arr([0.5, 1.5, -1.0, 0.0])],
     torch.pow)
case("pow", "i64", [randint(-4, 5, 3, 4), randint(0, 5, 4)], torch.pow)
case("pow", "f32-0d", [randn(5), scalar(2.0)], torch.pow)
case("pow", "i32-0d-f32", [randint(0, 20, 5, dtype=np.int32), scalar(0.5)], torch.pow)
case("pow", "bf16", [positive(6, dtype=bf16), scalar(3.0)], torch.pow)

case("remainder", "f32-signs", [randn(3, 4, scale=10.0), randn(4, scale=3.0)], torch.remainder)
case("remainder", "f32-exact", [arr([-7.0, 7.0, -7.0, 7.0, -7.5, 6.0, -6.0]),
                                arr([2.0, -2.0, -2.0, 2.0, 2.0, -3.0, 3.0])], torch.remainder)
case("remainder", "i32-signs", [randint(-20, 20, 3, 4, dtype=np.int32),
                                nonzero_int(-6, 6, 4, dtype=np.int32)], torch.remainder)
case("remainder", "i64-0d-neg", [randint(-20, 20, 6), scalar(-4, np.int64)], torch.remainder)
case("remainder", "i64-0d-f32", [randint(-20, 20, 6), scalar(2.5)], torch.remainder)
case("remainder", "f32-special", [arr([1.0, -1.0, INF, 3.0, -3.0, NAN]),
                                  arr([0.0, 0.0, 2.0, INF, INF, 1.0])], torch.remainder)

for rounding in ("none", "trunc", "floor"):
    mode = None if rounding == "none" else rounding
    d = (lambda m: lambda x, y: torch.div(x, y, rounding_mode=m))(mode)
    case("div", f"{rounding}-f32", [randn(3, 1, 5, scale=10.0), randn(4, 5)], d, rounding=rounding)
    case("div", f"{rounding}-f32-zero", [arr([1.0, -1.0, 0.0, -7.0, 7.0]),
                                         arr([0.0, 0.0, 0.0, 2.0, -2.0])], d, rounding=rounding)
    case("div", f"{rounding}-i64-neg", [randint(-50, 50, 4, 5), nonzero_int(-7, 7, 5)], d,
         rounding=rounding)
    case("div", f"{rounding}-i32-exact", [arr([-7, 7, -7, 7, -8, 8, 0], np.int32),
                                          arr([2, -2, -2, 2, 2, -2, -3], np.int32)], d,
         rounding=rounding)
    case("div", f"{rounding}-i32-0d-i64", [randint(-50, 50, 6, dtype=np.int32),
                                           scalar(-3, np.int64)], d, rounding=rounding)
    case("div", f"{rounding}-bf16", [randn(6, dtype=bf16, scale=8.0), positive(6, dtype=bf16)], d,
         rounding=rounding)

for name in ("eq", "ne", "lt", "le", "gt", "ge"):
    tfn = getattr(torch, name)
    ties = randint(-2, 3, 3, 1, 4).astype(np.float32)
    case(name, "f32-broadcast", [ties, randint(-2, 3, 5, 4).astype(np.float32)], tfn)
    case(name, "nan", [arr([NAN, 1.0, NAN, -INF]), arr([NAN, NAN, 1.0, -INF])], tfn)
    case(name, "i32-0d-f32", [randint(-3, 4, 6, dtype=np.int32), scalar(0.5)], tfn)
    case(name, "i64-i8", [randint(-3, 4, 6), randint(-3, 4, 6, dtype=np.int8)], tfn)
    case(name, "bool", [randbool(2, 3), randbool(3)], tfn)

for name in ("logical_and", "logical_or", "logical_xor"):
    tfn = getattr(torch, name)
    case(name, "bool", [randbool(3, 1), randbool(4)], tfn)
    case(name, "f32-i32", [arr([0.0, 1.5, NAN, -0.0]), arr([0, 0, 3, 2], np.int32)], tfn)
    case(name, "i64-0d", [randint(-1, 2, 5), scalar(0, np.int64)], tfn)

for name in ("bitwise_and", "bitwise_or"):
    tfn = getattr(torch, name)
    case(name, "i32", [randint(-100, 100, 3, 4, dtype=np.int32),
                       randint(-100, 100, 4, dtype=np.int32)], tfn)
    case(name, "i64-0d", [randint(-100, 100, 5), scalar(-6, np.int64)], tfn)
    case(name, "i8-i32", [randint(-100, 100, 5, dtype=np.int8),
                          randint(-1000, 1000, 5, dtype=np.int32)], tfn)
    case(name, "bool", [randbool(2, 3), randbool(2, 3)], tfn)

# -- where, clamp, cast, tril/triu ----------------------------------------------------------------

case("where", "broadcast", [randbool(4, 1), randn(1, 5), scalar(-2.0)], torch.where)
case("where", "f16-0d-f32", [randbool(2, 3), randn(2, 3, dtype=np.float16), scalar(0.1)],
     torch.where)
case("where", "i32-i64", [randbool(3), randint(-9, 9, 2, 3, dtype=np.int32), randint(-9, 9, 3)],
     torch.where)
case("where", "i32-0d-f32", [randbool(5), randint(-9, 9, 5, dtype=np.int32), scalar(0.5)],
     torch.where)
case("where", "bool-values", [randbool(2, 2), randbool(2, 2), randbool(2)], torch.where)
case("where", "0d-cond", [scalar(True, np.bool_), randn(2, 3), randn(3)], torch.where)

case("clamp", "min-only", [randn(3, 4)], lambda x: torch.clamp(x, min=-0.5), min=-0.5)
case("clamp", "max-only", [randn(3, 4)], lambda x: torch.clamp(x, max=0.25), max=0.25)
case("clamp", "both", [randn(3, 4)], lambda x: torch.clamp(x, -0.5, 0.5), min=-0.5, max=0.5)
case("clamp", "min-gt-max", [randn(6)], lambda x: torch.clamp(x, 1.0, -1.0), min=1.0, max=-1.0)
case("clamp", "nan", [arr([NAN, -INF, INF, 0.3])], lambda x: torch.clamp(x, -1.0, 1.0),
     min=-1.0, max=1.0)
case("clamp", "i32-int", [randint(-10, 10, 6, dtype=np.int32)], lambda x: torch.clamp(x, -3, 4),
     min=-3, max=4)
case("clamp", "i64-float-min", [randint(-3, 4, 7)], lambda x: torch.clamp(x, min=0.5), min=0.5)
case("clamp", "i32-float-max", [randint(-3, 4, 7, dtype=np.int32)],
     lambda x: torch.clamp(x, max=-1.5), max=-1.5)
case("clamp", "bf16", [randn(8, dtype=bf16)], lambda x: torch.clamp(x, min=-0.3, max=0.7),
     min=-0.3, max=0.7)
case("clamp", "f16-int-bounds", [randn(8, dtype=np.float16, scale=4.0)],
     lambda x: torch.clamp(x, -2, 3), min=-2, max=3)


def _cast(dtype):
    return lambda x: x.to(dtype)


case("cast", "f32-i32-trunc", [randn(3, 4, scale=10.0)], _cast(torch.int32), dtype=DType.i32)
case("cast", "f32-i64-halves", [arr([-2.5, -1.5, -0.5, 0.5, 1.5, 2.99, -2.99])],
     _cast(torch.int64), dtype=DType.i64)
case("cast", "f32-i8", [arr([-100.7, -1.2, 0.0, 1.9, 100.7])], _cast(torch.int8), dtype=DType.i8)
case("cast", "f32-bf16", [randn(3, 5, scale=100.0)], _cast(torch.bfloat16), dtype=DType.bf16)
case("cast", "f32-bf16-special", [arr([INF, -INF, NAN, 3.4e38, 1e-40, -0.0])],
     _cast(torch.bfloat16), dtype=DType.bf16)
case("cast", "f32-f16", [arr([70000.0, -70000.0, 1e-8, 0.1, NAN])], _cast(torch.float16),
     dtype=DType.f16)
case("cast", "f32-fp8", [randn(4, 6, scale=20.0)], _cast(torch.float8_e4m3fn), dtype=DType.fp8)
case("cast", "f32-fp8-edges", [arr([448.0, -448.0, 0.001953125, 1e-3, 0.0009, -0.0, NAN])],
     _cast(torch.float8_e4m3fn), dtype=DType.fp8)
# torch (2.13) saturates out-of-range values to +-448 (e4m3fn has no inf); so does the IR
case("cast", "f32-fp8-saturate", [arr([464.0, 500.0, -1000.0, 1e6, INF, -INF])],
     _cast(torch.float8_e4m3fn), dtype=DType.fp8)
case("cast", "bf16-f32", [randn(5, dtype=bf16)], _cast(torch.float32), dtype=DType.f32)
case("cast", "bf16-fp8", [randn(5, dtype=bf16, scale=10.0)], _cast(torch.float8_e4m3fn),
     dtype=DType.fp8)
case("cast", "fp8-f32", [randn(6, scale=10.0).astype(fp8)], _cast(torch.float32), dtype=DType.f32)
case("cast", "i64-f16", [randint(-3000, 3000, 6)], _cast(torch.float16), dtype=DType.f16)
case("cast", "i64-i8-wrap", [arr([200, -200, 127, 128, -129, 1000], np.int64)], _cast(torch.int8),
     dtype=DType.i8)
case("cast", "bool-f32", [randbool(5)], _cast(torch.float32), dtype=DType.f32)
case("cast", "f32-bool", [arr([0.0, -0.0, 0.1, -3.0, NAN, INF])], _cast(torch.bool),
     dtype=DType.bool)
case("cast", "i32-bool", [randint(-2, 3, 6, dtype=np.int32)], _cast(torch.bool), dtype=DType.bool)
case("cast", "0d-f32-i64", [scalar(-3.7)], _cast(torch.int64), dtype=DType.i64)

for name in ("tril", "triu"):
    tfn = getattr(torch, name)
    case(name, "f32", [randn(4, 5)], tfn)
    case(name, "diag+1", [randn(4, 5)], lambda x, f=tfn: f(x, diagonal=1), diagonal=1)
    case(name, "batched-diag-2", [randn(2, 4, 5)], lambda x, f=tfn: f(x, diagonal=-2), diagonal=-2)
    case(name, "i64-wide", [randint(-9, 9, 3, 6)], lambda x, f=tfn: f(x, diagonal=4), diagonal=4)
    case(name, "bool", [randbool(4, 4)], tfn)

# -- reductions -----------------------------------------------------------------------------------

x345 = randn(3, 4, 5)
for keep in (False, True):
    k = "keep" if keep else "drop"
    case("sum", f"axes-1-2-{k}", [x345], lambda x, kd=keep: torch.sum(x, (-1, -2), keepdim=kd),
         axes=(-1, -2), keepdim=keep)
    case("mean", f"axis-1-{k}", [x345], lambda x, kd=keep: torch.mean(x, -1, keepdim=kd),
         axes=(-1,), keepdim=keep)
    case("amax", f"axes0-1-{k}", [x345], lambda x, kd=keep: torch.amax(x, (0, -1), keepdim=kd),
         axes=(0, -1), keepdim=keep)
    case("amin", f"axis-2-{k}", [x345], lambda x, kd=keep: torch.amin(x, -2, keepdim=kd),
         axes=(-2,), keepdim=keep)
    case("any", f"axis-1-{k}", [randint(0, 2, 3, 4).astype(np.float32)],
         lambda x, kd=keep: torch.any(x, -1, keepdim=kd), axes=(-1,), keepdim=keep)
    case("var", f"axis-1-{k}", [x345], lambda x, kd=keep: torch.var(x, -1, keepdim=kd),
         axes=(-1,), keepdim=keep)
    case("argmax", f"axis-1-{k}", [x345], lambda x, kd=keep: torch.argmax(x, -1, keepdim=kd),
         axis=-1, keepdim=keep)
    case("argmax", f"none-{k}", [x345], lambda x, kd=keep: torch.argmax(x, None, keepdim=kd),
         keepdim=keep)

case("sum", "all", [randn(3, 4)], torch.sum)
case("sum", "all-keep", [randn(3, 4)], lambda x: torch.sum(x, (0, 1), keepdim=True), keepdim=True)
case("sum", "axis0", [x345], lambda x: torch.sum(x, 0), axes=(0,))
case("sum", "bool-to-i64", [randbool(3, 4)], lambda x: torch.sum(x, -1), axes=(-1,))
case("sum", "i32-to-i64", [randint(-99, 99, 3, 4, dtype=np.int32)], lambda x: torch.sum(x, 0),
     axes=(0,))
case("sum", "i8-to-i64", [randint(-128, 127, 40, dtype=np.int8)], torch.sum)
case("sum", "f16", [randn(4, 6, dtype=np.float16)], lambda x: torch.sum(x, -1), axes=(-1,))
case("sum", "bf16", [randn(4, 6, dtype=bf16)], lambda x: torch.sum(x, -1), axes=(-1,))
case("sum", "0d", [scalar(1.5)], torch.sum)
case("mean", "axes0-2", [x345], lambda x: torch.mean(x, (0, 2)), axes=(0, 2))
case("mean", "all", [randn(3, 4)], torch.mean)
case("mean", "bf16", [randn(4, 6, dtype=bf16)], lambda x: torch.mean(x, -1), axes=(-1,))
case("mean", "f16", [randn(4, 6, dtype=np.float16)], lambda x: torch.mean(x, 0), axes=(0,))
case("amax", "i32", [randint(-50, 50, 3, 4, dtype=np.int32)], lambda x: torch.amax(x, -1),
     axes=(-1,))
case("amax", "nan", [arr([[1.0, NAN, 3.0], [-INF, -1.0, 2.0]])], lambda x: torch.amax(x, -1),
     axes=(-1,))
case("amax", "all", [randn(3, 4)], lambda x: torch.amax(x, (0, 1)))
case("amax", "bool", [randbool(3, 4)], lambda x: torch.amax(x, -1), axes=(-1,))
case("amin", "i8", [randint(-128, 127, 3, 4, dtype=np.int8)], lambda x: torch.amin(x, 0),
     axes=(0,))
case("amin", "nan", [arr([[1.0, NAN, 3.0], [INF, -1.0, 2.0]])], lambda x: torch.amin(x, -1),
     axes=(-1,))
case("amin", "bf16", [randn(3, 4, dtype=bf16)], lambda x: torch.amin(x, (-1, 0)), axes=(-1, 0))
case("any", "i32-all", [randint(0, 2, 3, 4, dtype=np.int32)], torch.any)
case("any", "zeros", [np.zeros((2, 3), np.float32)], lambda x: torch.any(x, -1), axes=(-1,))
case("any", "bool-axes", [randbool(2, 3, 4) & randbool(2, 3, 4)],
     lambda x: torch.any(x, (0, -1), keepdim=True), axes=(0, -1), keepdim=True)
case("any", "nan", [arr([[0.0, NAN], [0.0, -0.0]])], lambda x: torch.any(x, -1), axes=(-1,))
case("var", "correction0", [x345], lambda x: torch.var(x, (0, -1), correction=0, keepdim=True),
     axes=(0, -1), keepdim=True, correction=0)
case("var", "correction1-all", [randn(4, 5)], lambda x: torch.var(x, correction=1), correction=1)
case("var", "correction2", [randn(3, 6)], lambda x: torch.var(x, -1, correction=2), axes=(-1,),
     correction=2)
case("var", "bf16", [randn(3, 8, dtype=bf16)], lambda x: torch.var(x, -1), axes=(-1,))
case("argmax", "axis-2-keep", [x345], lambda x: torch.argmax(x, -2, keepdim=True), axis=-2,
     keepdim=True)
case("argmax", "i32-ties", [arr([[3, 1, 3, 0], [2, 2, 2, 2], [-5, -1, -1, -9]], np.int32)],
     lambda x: torch.argmax(x, -1), axis=-1)
case("argmax", "nan", [arr([[1.0, NAN, 3.0, NAN], [INF, 1.0, INF, 2.0]])],
     lambda x: torch.argmax(x, 1), axis=1)
case("argmax", "bf16", [randn(3, 5, dtype=bf16)], lambda x: torch.argmax(x, 0), axis=0)

_masked = randn(3, 5, scale=3.0)
_masked[0, 1:3] = -INF
_masked[1, :] = -INF  # a fully masked row: NaN in torch
for name, tfn in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
    case(name, "axis-1", [randn(3, 4, 5, scale=3.0)], lambda x, f=tfn: f(x, -1), axis=-1)
    case(name, "axis0", [randn(3, 4, 5, scale=3.0)], lambda x, f=tfn: f(x, 0), axis=0)
    case(name, "axis-2", [randn(2, 4, 3, scale=3.0)], lambda x, f=tfn: f(x, -2), axis=-2)
    case(name, "large", [randn(2, 6, scale=300.0)], lambda x, f=tfn: f(x, -1), axis=-1)
    case(name, "masked", [_masked], lambda x, f=tfn: f(x, -1), axis=-1)
    case(name, "bf16", [randn(3, 7, dtype=bf16, scale=3.0)], lambda x, f=tfn: f(x, -1), axis=-1)
    # torch's f16 kernel rounds intermediates to f16: its log_softmax is off by up to an f16 ulp
    # of the inputs' magnitude (~8, ulp 2**-7) where the result is near 0
    case(name, "f16", [randn(3, 7, dtype=np.float16, scale=3.0)], lambda x, f=tfn: f(x, -1),
         axis=-1, atol=2.0 ** -7)

case("cumsum", "f32-axis-1", [randn(3, 6)], lambda x: torch.cumsum(x, -1), axis=-1)
case("cumsum", "f32-axis0", [x345], lambda x: torch.cumsum(x, 0), axis=0)
case("cumsum", "i32-to-i64", [randint(-99, 99, 3, 4, dtype=np.int32)],
     lambda x: torch.cumsum(x, -2), axis=-2)
case("cumsum", "bool-to-i64", [randbool(2, 5)], lambda x: torch.cumsum(x, -1), axis=-1)
case("cumsum", "bf16", [randn(2, 6, dtype=bf16)], lambda x: torch.cumsum(x, -1), axis=-1)
case("cumsum", "1d", [randn(7)], lambda x: torch.cumsum(x, -1), axis=-1)

# -- data movement --------------------------------------------------------------------------------

case("reshape", "merge", [randn(2, 3, 4)], lambda x: x.reshape(4, 6), shape=(4, 6))
case("reshape", "split", [randint(0, 9, 6)], lambda x: x.reshape(1, 2, 3), shape=(1, 2, 3))
case("reshape", "to-0d", [randn(1)], lambda x: x.reshape(()), shape=())
case("reshape", "from-0d", [scalar(3.0)], lambda x: x.reshape(1, 1), shape=(1, 1))
case("reshape", "bf16", [randn(4, 2, dtype=bf16)], lambda x: x.reshape(2, 2, 2), shape=(2, 2, 2))

case("permute", "3d", [randn(2, 3, 4)], lambda x: x.permute(2, 0, 1), perm=(2, 0, 1))
case("permute", "bool-4d", [randbool(2, 1, 3, 2)], lambda x: x.permute(0, 3, 1, 2),
     perm=(0, 3, 1, 2))
case("permute", "identity", [randint(0, 5, 2, 3)], lambda x: x.permute(0, 1), perm=(0, 1))

case("expand", "rank-up", [randn(3, 1)], lambda x: x.expand(2, 3, 4), shape=(2, 3, 4))
case("expand", "0d", [scalar(1.5)], lambda x: x.expand(2, 3), shape=(2, 3))
case("expand", "i32", [randint(0, 9, 1, 4, dtype=np.int32)], lambda x: x.expand(3, 4),
     shape=(3, 4))


def _aten_slice(dim, start, end, step=1):
    return lambda x: torch.ops.aten.slice.Tensor(x, dim, start, end, step)


case("slice", "axis-1-step2", [randn(3, 5)], _aten_slice(-1, 1, 4, 2), axis=-1, start=1, end=4,
     step=2)
case("slice", "axis0", [randn(4, 3)], _aten_slice(0, 1, 3), axis=0, start=1, end=3)
case("slice", "empty", [randn(3, 5)], _aten_slice(-1, 2, 2), axis=-1, start=2, end=2)
case("slice", "step3-full", [randint(0, 9, 2, 7)], _aten_slice(1, 0, 7, 3), axis=1, start=0,
     end=7, step=3)
case("slice", "axis-2-3d", [randn(2, 6, 3)], _aten_slice(-2, 3, 6), axis=-2, start=3, end=6)

case("select", "axis-2", [randn(3, 4, 5)], lambda x: torch.select(x, -2, 1), axis=-2, index=1)
case("select", "axis0", [randint(0, 9, 3, 4)], lambda x: torch.select(x, 0, 2), axis=0, index=2)
case("select", "axis-1-last", [randn(2, 3)], lambda x: torch.select(x, -1, 2), axis=-1, index=2)
case("select", "1d-to-0d", [randn(5)], lambda x: torch.select(x, 0, 4), axis=0, index=4)

case("concat", "axis-1", [randn(2, 3), randn(2, 1), randn(2, 4)],
     lambda *xs: torch.cat(xs, -1), axis=-1)
case("concat", "axis0", [randn(1, 3), randn(2, 3)], lambda *xs: torch.cat(xs, 0), axis=0)
case("concat", "axis-2-3d", [randn(2, 1, 3), randn(2, 2, 3)], lambda *xs: torch.cat(xs, -2),
     axis=-2)
case("concat", "single", [randn(2, 3)], lambda *xs: torch.cat(xs, -1), axis=-1)
case("concat", "empty-operand", [randn(2, 0), randn(2, 3)], lambda *xs: torch.cat(xs, -1),
     axis=-1)
case("concat", "i32-f16", [randint(-9, 9, 2, 2, dtype=np.int32), randn(2, 3, dtype=np.float16)],
     lambda *xs: torch.cat(xs, -1), axis=-1)
case("concat", "bf16-f16", [randn(1, 2, dtype=bf16), randn(2, 2, dtype=np.float16)],
     lambda *xs: torch.cat(xs, 0), axis=0)
case("concat", "bool-i8", [randbool(3), randint(-9, 9, 2, dtype=np.int8)],
     lambda *xs: torch.cat(xs, 0), axis=0)
case("concat", "i64-i32", [randint(-9, 9, 2), randint(-9, 9, 3, dtype=np.int32)],
     lambda *xs: torch.cat(xs, -1), axis=-1)

case("split", "axis-1", [randn(3, 5)], lambda x: torch.split(x, [2, 3], -1), axis=-1, sizes=(2, 3))
case("split", "axis0-three", [randint(0, 9, 4, 3)], lambda x: torch.split(x, [1, 1, 2], 0),
     axis=0, sizes=(1, 1, 2))
case("split", "axis-2-with-empty", [randn(2, 4, 2)], lambda x: torch.split(x, [0, 4], -2),
     axis=-2, sizes=(0, 4))
case("split", "one", [randn(2, 3)], lambda x: torch.split(x, [3], -1), axis=-1, sizes=(3,))

case("pad", "last", [randn(3, 4)], lambda x: F.pad(x, (1, 2)), pads=(1, 2))
case("pad", "last-two-value", [randn(2, 3, 4)], lambda x: F.pad(x, (1, 0, 2, 1), value=-1.5),
     pads=(1, 0, 2, 1), value=-1.5)
case("pad", "all-axes", [randn(2, 2, 2)], lambda x: F.pad(x, (1, 1, 0, 2, 1, 0)),
     pads=(1, 1, 0, 2, 1, 0))
case("pad", "i32-value", [randint(-9, 9, 2, 3, dtype=np.int32)],
     lambda x: F.pad(x, (2, 1), value=7), pads=(2, 1), value=7)
case("pad", "bf16", [randn(2, 3, dtype=bf16)], lambda x: F.pad(x, (0, 1, 1, 0), value=0.1),
     pads=(0, 1, 1, 0), value=0.1)
case("pad", "zero", [randn(2, 3)], lambda x: F.pad(x, (0, 0)), pads=(0, 0))

case("gather", "axis-1", [randn(3, 4), randint(0, 4, 3, 6)],
     lambda x, i: torch.gather(x, -1, i), axis=-1)
case("gather", "axis0", [randn(3, 4), randint(0, 3, 2, 4)], lambda x, i: torch.gather(x, 0, i),
     axis=0)
# torch lets the index be smaller than the input in the non-gathered dims
case("gather", "axis-1-small-index", [randn(3, 4, 5), randint(0, 5, 2, 3, 2)],
     lambda x, i: torch.gather(x, -1, i), axis=-1)
case("gather", "axis1-small-index", [randn(3, 4, 5), randint(0, 4, 2, 6, 5)],
     lambda x, i: torch.gather(x, 1, i), axis=1)
case("gather", "i32-index", [randint(-9, 9, 3, 4), randint(0, 4, 3, 2, dtype=np.int32)],
     lambda x, i: torch.gather(x, -1, i.long()), axis=-1)

x456 = randn(4, 5, 6)
case("index", "one-axis", [x456, randint(-5, 5, 2, 2)], lambda x, i: x[:, i], axes=(1,))
case("index", "first-axis", [x456, randint(-4, 4, 3)], lambda x, i: x[i], axes=(0,))
case("index", "0d-index", [x456, scalar(-2, np.int64)], lambda x, i: x[:, i], axes=(1,))
case("index", "last-axis", [x456, randint(0, 6, 3)], lambda x, i: x[:, :, i], axes=(2,))
case("index", "adjacent-broadcast", [x456, randint(0, 5, 2, 1), randint(-6, 6, 3)],
     lambda x, i, j: x[:, i, j], axes=(1, 2))
case("index", "non-adjacent", [x456, randint(0, 4, 3), randint(0, 6, 3)],
     lambda x, i, k: x[i, :, k], axes=(0, 2))
case("index", "non-adjacent-broadcast", [x456, randint(0, 4, 2, 1), randint(-6, 6, 1, 3)],
     lambda x, i, k: x[i, :, k], axes=(0, 2))
case("index", "all-axes", [x456, randint(0, 4, 5), randint(0, 5, 5), randint(0, 6, 5)],
     lambda x, i, j, k: x[i, j, k], axes=(0, 1, 2))
case("index", "i32", [randint(-9, 9, 4, 3, dtype=np.int32), randint(0, 4, 2, dtype=np.int32)],
     lambda x, i: x[i.long()], axes=(0,))

case("embedding", "i64", [randn(10, 4), randint(0, 10, 2, 3)],
     lambda w, i: F.embedding(i, w))
case("embedding", "i32", [randn(6, 3), randint(0, 6, 5, dtype=np.int32)],
     lambda w, i: F.embedding(i, w))
case("embedding", "bf16", [randn(6, 3, dtype=bf16), randint(0, 6, 4)],
     lambda w, i: F.embedding(i, w))
case("embedding", "0d-index", [randn(6, 3), scalar(4, np.int64)], lambda w, i: F.embedding(i, w))

case("full", "f32", [], lambda: torch.full((2, 3), 1.5, dtype=torch.float32), shape=(2, 3),
     value=1.5, dtype=DType.f32)
case("full", "i32", [], lambda: torch.full((4,), 7, dtype=torch.int32), shape=(4,), value=7,
     dtype=DType.i32)
case("full", "bf16-0d", [], lambda: torch.full((), 0.1, dtype=torch.bfloat16), shape=(),
     value=0.1, dtype=DType.bf16)
case("full", "bool", [], lambda: torch.full((2, 2), 1, dtype=torch.bool), shape=(2, 2), value=1,
     dtype=DType.bool)
case("full", "bool-true", [], lambda: torch.full((2, 3), True), shape=(2, 3), value=True,
     dtype=DType.bool)
case("full", "i8-neg", [], lambda: torch.full((3,), -3, dtype=torch.int8), shape=(3,), value=-3,
     dtype=DType.i8)
case("full", "f16-neg-inf", [], lambda: torch.full((2,), -INF, dtype=torch.float16), shape=(2,),
     value=-INF, dtype=DType.f16)
case("full", "bool-true-mask", [], lambda: torch.full((2, 3), True), shape=(2, 3), value=True,
     dtype=DType.bool)
case("full", "bool-false-0d", [], lambda: torch.full((), False), shape=(), value=False,
     dtype=DType.bool)
case("full", "true-into-f32", [], lambda: torch.full((2,), True, dtype=torch.float32), shape=(2,),
     value=True, dtype=DType.f32)
case("full", "f64", [], lambda: torch.full((2,), 0.1, dtype=torch.float64), shape=(2,),
     value=0.1, dtype=DType.f64)
case("full", "u8-empty", [], lambda: torch.full((0, 2), 200, dtype=torch.uint8), shape=(0, 2),
     value=200, dtype=DType.u8)
case("full", "i16", [], lambda: torch.full((3,), -300, dtype=torch.int16), shape=(3,),
     value=-300, dtype=DType.i16)
case("full", "float-value-i32", [], lambda: torch.full((2,), -2.7, dtype=torch.int32), shape=(2,),
     value=-2.7, dtype=DType.i32)

case("arange", "int", [], lambda: torch.arange(0, 10, 3), start=0, end=10, step=3)
case("arange", "int-end-only", [], lambda: torch.arange(5), end=5)
case("arange", "int-neg-step", [], lambda: torch.arange(5, -5, -2), start=5, end=-5, step=-2)
case("arange", "int-empty", [], lambda: torch.arange(3, 3), start=3, end=3)
case("arange", "i32", [], lambda: torch.arange(-4, 4, dtype=torch.int32), start=-4, end=4,
     dtype=DType.i32)
case("arange", "float", [], lambda: torch.arange(0.0, 1.0, 0.1, dtype=torch.float32),
     start=0.0, end=1.0, step=0.1, dtype=DType.f32)
case("arange", "float-neg-step", [], lambda: torch.arange(1.0, -1.0, -0.25, dtype=torch.float32),
     start=1.0, end=-1.0, step=-0.25, dtype=DType.f32)
case("arange", "int-bounds-f32", [], lambda: torch.arange(0, 5, dtype=torch.float32), start=0,
     end=5, dtype=DType.f32)
case("arange", "float-frac-count", [], lambda: torch.arange(0.5, 3.2, 0.7, dtype=torch.float32),
     start=0.5, end=3.2, step=0.7, dtype=DType.f32)

# -- contractions ---------------------------------------------------------------------------------

case("matmul", "2d", [randn(3, 4), randn(4, 5)], torch.matmul)
case("matmul", "batch-broadcast", [randn(2, 1, 3, 4), randn(5, 4, 2)], torch.matmul)
case("matmul", "1d-2d", [randn(4), randn(4, 3)], torch.matmul)
case("matmul", "2d-1d", [randn(3, 4), randn(4)], torch.matmul)
case("matmul", "1d-1d", [randn(4), randn(4)], torch.matmul)
case("matmul", "1d-3d", [randn(4), randn(2, 4, 3)], torch.matmul)
case("matmul", "3d-1d", [randn(2, 3, 4), randn(4)], torch.matmul)
case("matmul", "i64", [randint(-5, 5, 2, 3), randint(-5, 5, 3, 2)], torch.matmul)
case("matmul", "bf16", [randn(3, 8, dtype=bf16), randn(8, 2, dtype=bf16)], torch.matmul)
case("matmul", "f16", [randn(3, 8, dtype=np.float16), randn(8, 2, dtype=np.float16)],
     torch.matmul)

# rows sorted into groups (ends cover every row: torch leaves rows past the last end unset)
case("grouped_matmul", "empty-group", [randn(8, 16, dtype=bf16), randn(3, 16, 8, dtype=bf16),
                                       np.array([3, 3, 8], np.int32)],
     lambda x, w, o: F.grouped_mm(x, w, offs=o))
case("grouped_matmul", "transposed", [randn(7, 8, dtype=bf16), randn(2, 5, 8, dtype=bf16),
                                      np.array([0, 7], np.int32)],
     lambda x, w, o: F.grouped_mm(x, w.transpose(1, 2), offs=o), transpose_w=True)

case("linear", "bias", [randn(2, 3, 4), randn(5, 4), randn(5)], F.linear)
case("linear", "no-bias", [randn(3, 4), randn(5, 4)], F.linear)
case("linear", "1d-input", [randn(4), randn(2, 4), randn(2)], F.linear)
case("linear", "bf16", [randn(2, 8, dtype=bf16), randn(3, 8, dtype=bf16), randn(3, dtype=bf16)],
     F.linear)


def _conv(stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    return lambda *xs: F.conv2d(*xs, stride=stride, padding=padding, dilation=dilation,
                                groups=groups)


case("conv2d", "plain", [randn(1, 3, 6, 6), randn(4, 3, 3, 3)], _conv())
case("conv2d", "bias-stride-pad", [randn(2, 3, 7, 6), randn(4, 3, 3, 2), randn(4)],
     _conv((2, 1), (1, 2)), stride=(2, 1), padding=(1, 2))
case("conv2d", "dilation", [randn(1, 2, 9, 8), randn(3, 2, 3, 3), randn(3)],
     _conv((1, 2), (2, 0), (2, 3)), stride=(1, 2), padding=(2, 0), dilation=(2, 3))
case("conv2d", "groups", [randn(2, 4, 5, 5), randn(6, 2, 3, 3), randn(6)],
     _conv((1, 1), (1, 1), groups=2), padding=(1, 1), groups=2)
case("conv2d", "depthwise", [randn(1, 3, 6, 5), randn(3, 1, 3, 3)],
     _conv((2, 2), (1, 1), groups=3), stride=(2, 2), padding=(1, 1), groups=3)
case("conv2d", "1x1", [randn(2, 5, 3, 3), randn(4, 5, 1, 1), randn(4)], _conv())
case("conv2d", "bf16", [randn(1, 2, 5, 5, dtype=bf16), randn(3, 2, 3, 3, dtype=bf16)],
     _conv((1, 1), (1, 1)), padding=(1, 1))


# -- pooling --------------------------------------------------------------------------------------

def _maxpool(kernel, stride, padding=(0, 0), dilation=(1, 1), ceil_mode=False):
    return lambda x: F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode)


case("max_pool2d", "2x2", [randn(2, 3, 6, 6)], _maxpool((2, 2), (2, 2)), kernel=(2, 2),
     stride=(2, 2))
case("max_pool2d", "padding", [randn(1, 2, 7, 6)], _maxpool((3, 3), (2, 2), (1, 1)),
     kernel=(3, 3), stride=(2, 2), padding=(1, 1))
case("max_pool2d", "dilation", [randn(1, 2, 9, 8)], _maxpool((3, 2), (1, 2), (1, 1), (2, 3)),
     kernel=(3, 2), stride=(1, 2), padding=(1, 1), dilation=(2, 3))
case("max_pool2d", "ceil", [randn(1, 2, 7, 8)], _maxpool((3, 3), (2, 3), ceil_mode=True),
     kernel=(3, 3), stride=(2, 3), ceil_mode=True)
case("max_pool2d", "ceil-pad-dil", [randn(1, 1, 8, 7)],
     _maxpool((2, 3), (3, 2), (1, 1), (2, 1), ceil_mode=True),
     kernel=(2, 3), stride=(3, 2), padding=(1, 1), dilation=(2, 1), ceil_mode=True)
case("max_pool2d", "window-beyond-input", [randn(1, 3, 2, 3)],
     _maxpool((1 << 15, 1 << 15), (1 << 15, 1 << 15), ceil_mode=True),
     kernel=(1 << 15, 1 << 15), stride=(1 << 15, 1 << 15), ceil_mode=True)
case("max_pool2d", "negative-values", [-positive(1, 1, 5, 5)], _maxpool((2, 2), (2, 2), (1, 1)),
     kernel=(2, 2), stride=(2, 2), padding=(1, 1))
case("max_pool2d", "bf16", [randn(1, 2, 6, 6, dtype=bf16)], _maxpool((3, 3), (2, 2), (1, 1)),
     kernel=(3, 3), stride=(2, 2), padding=(1, 1))
case("max_pool2d", "i64-padding", [randint(-99, 0, 1, 2, 5, 5)], _maxpool((2, 2), (2, 2), (1, 1)),
     kernel=(2, 2), stride=(2, 2), padding=(1, 1))



def _avgpool(kernel, stride, padding=(0, 0), ceil_mode=False, count_include_pad=True,
             divisor=None):
    return lambda x: F.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad,
                                  divisor)


case("avg_pool2d", "2x2", [randn(2, 3, 6, 6)], _avgpool((2, 2), (2, 2)), kernel=(2, 2),
     stride=(2, 2))
for cip in (True, False):
    tag = "incl" if cip else "excl"
    case("avg_pool2d", f"pad-{tag}", [randn(1, 2, 7, 6)], _avgpool((3, 3), (2, 2), (1, 1),
                                                                   count_include_pad=cip),
         kernel=(3, 3), stride=(2, 2), padding=(1, 1), count_include_pad=cip)
    case("avg_pool2d", f"ceil-{tag}", [randn(1, 2, 7, 8)],
         _avgpool((3, 3), (2, 3), ceil_mode=True, count_include_pad=cip),
         kernel=(3, 3), stride=(2, 3), ceil_mode=True, count_include_pad=cip)
    case("avg_pool2d", f"ceil-pad-{tag}", [randn(1, 2, 6, 7)],
         _avgpool((3, 2), (2, 2), (1, 1), ceil_mode=True, count_include_pad=cip),
         kernel=(3, 2), stride=(2, 2), padding=(1, 1), ceil_mode=True, count_include_pad=cip)
    case("avg_pool2d", f"ceil-pad-s3-{tag}", [randn(1, 1, 8, 8)],
         _avgpool((4, 4), (3, 3), (2, 2), ceil_mode=True, count_include_pad=cip),
         kernel=(4, 4), stride=(3, 3), padding=(2, 2), ceil_mode=True, count_include_pad=cip)
# a window far larger than the input (EfficientNet's AvgPool2d(hidden_dim, ceil_mode=True) over a
# 2x2 map): one partial window; the reference must not pad the input out to the window's size
BIG = 1 << 15
for cip in (True, False):
    case("avg_pool2d", f"window-beyond-input-{'incl' if cip else 'excl'}", [randn(1, 3, 2, 3)],
         _avgpool((BIG, BIG), (BIG, BIG), (1, 1), ceil_mode=True, count_include_pad=cip),
         kernel=(BIG, BIG), stride=(BIG, BIG), padding=(1, 1), ceil_mode=True, count_include_pad=cip)
case("avg_pool2d", "divisor", [randn(1, 2, 6, 6)], _avgpool((3, 3), (2, 2), (1, 1), divisor=5),
     kernel=(3, 3), stride=(2, 2), padding=(1, 1), divisor=5)
case("avg_pool2d", "divisor-ceil", [randn(1, 2, 7, 7)],
     _avgpool((2, 2), (2, 2), ceil_mode=True, divisor=3),
     kernel=(2, 2), stride=(2, 2), ceil_mode=True, divisor=3)
case("avg_pool2d", "bf16", [randn(1, 2, 6, 6, dtype=bf16)], _avgpool((2, 2), (2, 2)),
     kernel=(2, 2), stride=(2, 2))
case("avg_pool2d", "i64-trunc", [randint(-50, 50, 1, 2, 6, 6)], _avgpool((2, 2), (2, 2)),
     kernel=(2, 2), stride=(2, 2))

for (h, w), out in (((7, 7), (3, 3)), ((5, 7), (2, 4)), ((4, 4), (4, 4)), ((4, 6), (1, 1)),
                    ((3, 5), (5, 7))):
    case("adaptive_avg_pool2d", f"{h}x{w}-to-{out[0]}x{out[1]}", [randn(2, 3, h, w)],
         lambda x, o=out: F.adaptive_avg_pool2d(x, o), output_size=out)
case("adaptive_avg_pool2d", "bf16", [randn(1, 2, 7, 5, dtype=bf16)],
     lambda x: F.adaptive_avg_pool2d(x, (3, 2)), output_size=(3, 2))

# -- normalizations -------------------------------------------------------------------------------

def _bn(eps=1e-5):
    return lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, training=False, eps=eps)


case("batch_norm", "nchw", [randn(2, 3, 4, 4), randn(3), randn(3), randn(3), positive(3)], _bn())
case("batch_norm", "nc-eps", [randn(4, 3), randn(3), randn(3), randn(3), positive(3)], _bn(1e-3),
     eps=1e-3)
case("batch_norm", "ncl", [randn(2, 3, 5), randn(3), randn(3), randn(3), positive(3, lo=0.0,
                                                                                 hi=1e-3)],
     _bn(0.1), eps=0.1)
case("batch_norm", "bf16", [randn(1, 2, 3, 3, dtype=bf16)] + [randn(2, dtype=bf16)] * 3
     + [positive(2, dtype=bf16)], _bn())

case("layer_norm", "affine", [randn(2, 3, 8), randn(8), randn(8)],
     lambda x, w, b: F.layer_norm(x, (8,), w, b))
case("layer_norm", "no-affine", [randn(2, 3, 8)], lambda x: F.layer_norm(x, (8,)))
case("layer_norm", "weight-only", [randn(4, 6), randn(6)], lambda x, w: F.layer_norm(x, (6,), w))
case("layer_norm", "ndim2", [randn(2, 3, 4), randn(3, 4), randn(3, 4)],
     lambda x, w, b: F.layer_norm(x, (3, 4), w, b), ndim=2)
case("layer_norm", "ndim2-no-affine-eps", [randn(2, 3, 4)],
     lambda x: F.layer_norm(x, (3, 4), eps=0.5), ndim=2, eps=0.5)
case("layer_norm", "constant-row", [np.full((2, 5), 3.0, np.float32)],
     lambda x: F.layer_norm(x, (5,)))
case("layer_norm", "bf16", [randn(3, 8, dtype=bf16), randn(8, dtype=bf16), randn(8, dtype=bf16)],
     lambda x, w, b: F.layer_norm(x, (8,), w, b))

case("rms_norm", "weight", [randn(2, 3, 8), randn(8)], lambda x, w: F.rms_norm(x, (8,), w))
case("rms_norm", "no-weight", [randn(3, 8)], lambda x: F.rms_norm(x, (8,)))
case("rms_norm", "eps-given", [randn(3, 8), randn(8)], lambda x, w: F.rms_norm(x, (8,), w, 0.1),
     eps=0.1)
case("rms_norm", "ndim2", [randn(2, 3, 4), randn(3, 4)], lambda x, w: F.rms_norm(x, (3, 4), w),
     ndim=2)
# small inputs make the default eps visible: the mean square is ~1e-6
case("rms_norm", "tiny-default-eps", [randn(3, 8, scale=1e-3)], lambda x: F.rms_norm(x, (8,)))
case("rms_norm", "bf16-tiny-default-eps", [randn(3, 8, dtype=bf16, scale=0.01),
                                           randn(8, dtype=bf16)],
     lambda x, w: F.rms_norm(x, (8,), w))
case("rms_norm", "f16-tiny-default-eps", [randn(3, 8, dtype=np.float16, scale=0.01)],
     lambda x: F.rms_norm(x, (8,)))

# -- attention ------------------------------------------------------------------------------------

def _sdpa(**kw):
    def fn(q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)

    return fn


q, k, v = randn(2, 3, 4, 8), randn(2, 3, 5, 8), randn(2, 3, 5, 6)
case("attention", "plain", [q, k, v], _sdpa())
case("attention", "causal-square", [randn(1, 2, 5, 4), randn(1, 2, 5, 4), randn(1, 2, 5, 4)],
     _sdpa(is_causal=True), causal=True)
case("attention", "causal-rect", [q, k, v], _sdpa(is_causal=True), causal=True)
_bool_mask = randbool(4, 5)
_bool_mask[:, 0] = True  # no fully masked rows
case("attention", "bool-mask", [q, k, v, _bool_mask], _sdpa())
case("attention", "float-mask", [q, k, v, randn(2, 1, 4, 5)], _sdpa())
case("attention", "float-mask-inf", [q, k, v, np.where(_bool_mask, 0.0, -INF).astype(np.float32)],
     _sdpa())
case("attention", "scale", [q, k, v], _sdpa(scale=0.3), scale=0.3)
case("attention", "gqa", [randn(1, 4, 3, 8), randn(1, 2, 5, 8), randn(1, 2, 5, 8)],
     _sdpa(enable_gqa=True), gqa=True)
case("attention", "gqa-causal", [randn(2, 6, 4, 4), randn(2, 2, 4, 4), randn(2, 2, 4, 4)],
     _sdpa(enable_gqa=True, is_causal=True), gqa=True, causal=True)
case("attention", "shared-kv-head", [randn(2, 4, 3, 8), randn(2, 1, 5, 8), randn(2, 1, 5, 8)],
     _sdpa())
_padding_mask = randbool(4, 5)
_padding_mask[0, :] = False  # a query that may attend to nothing: zeros in torch's SDPA
_padding_mask[1:, 0] = True
case("attention", "fully-masked-row", [q, k, v, _padding_mask], _sdpa())
case("attention", "fully-masked-row-float",
     [q, k, v, np.where(_padding_mask, 0.0, -INF).astype(np.float32)], _sdpa())
case("attention", "3d", [randn(2, 4, 8), randn(2, 6, 8), randn(2, 6, 8)], _sdpa())
# torch rounds the bf16 probabilities before multiplying by v: an output near 0 (a sum that
# cancels) is off by up to a bf16 ulp of v's magnitude (~1, ulp 2**-7), not of itself
case("attention", "bf16", [randn(1, 2, 4, 8, dtype=bf16), randn(1, 2, 4, 8, dtype=bf16),
                           randn(1, 2, 4, 8, dtype=bf16)], _sdpa(), atol=2.0 ** -7)



# -- relayout: a physical layout change; the values (what torch sees) are unchanged ---------------
case("relayout", "nhwc", [randn(2, 3, 4, 5)], lambda x: x.clone(), order=(0, 2, 3, 1))
case("relayout", "tiled", [randn(32, 48)], lambda x: x.clone(), order=(0, 1), tile=(16, 16))
case("relayout", "back-to-default", [randint(0, 9, 3, 4)], lambda x: x.clone(), order=(0, 1))


# -- log1p, expm1, fmod ---------------------------------------------------------------------------
case("log1p", "small-and-large", [arr([1e-8, -0.5, 0.0, 3.0, 1e6])], torch.log1p)
case("expm1", "small-and-large", [arr([1e-8, -0.5, 0.0, 3.0, -20.0])], torch.expm1)
case("fmod", "signs-follow-dividend", [arr([5.5, -5.5, 5.5, -5.5]), arr([2.0, 2.0, -2.0, -2.0])],
     torch.fmod)
case("fmod", "int-by-scalar", [randint(-9, 9, 6), scalar(4, np.int64)], torch.fmod)

# -- prod -----------------------------------------------------------------------------------------
case("prod", "axis-neg", [randn(3, 4)], lambda x: torch.prod(x, -1), axes=(-1,))
case("prod", "int-keepdim", [randint(-3, 4, 2, 3)], lambda x: torch.prod(x, 0, keepdim=True),
     axes=(0,), keepdim=True)

# -- sort, topk (distinct values: indices are then unambiguous) ------------------------------------
_distinct = (_rng.permutation(20).reshape(4, 5) - 7.5).astype(np.float32)
case("sort", "ascending", [_distinct], lambda x: tuple(torch.sort(x, -1)))
case("sort", "descending-axis0", [_distinct], lambda x: tuple(torch.sort(x, 0, descending=True)),
     axis=0, descending=True)
case("topk", "largest", [_distinct], lambda x: tuple(torch.topk(x, 3, -1)), k=3)
case("topk", "smallest-axis0", [_distinct], lambda x: tuple(torch.topk(x, 2, 0, largest=False)),
     k=2, axis=0, largest=False)

# -- writes into a copy: index_put, scatter, slice_scatter -----------------------------------------
case("index_put", "rows", [np.zeros((5, 3), np.float32), randn(2, 3), arr([1, 3], np.int64)],
     lambda x, v, i: x.index_put((i,), v), axes=(0,))
case("index_put", "accumulate-dup", [randn(4, 2), randn(3, 2), arr([0, 2, 0], np.int64)],
     lambda x, v, i: x.index_put((i,), v, accumulate=True), axes=(0,), accumulate=True)
case("index_put", "two-axes", [randn(3, 4, 2), randn(2, 2), arr([0, 2], np.int64),
                               arr([1, 3], np.int64)],
     lambda x, v, i, j: x.index_put((i, j), v), axes=(0, 1))
case("scatter", "axis1", [np.zeros((3, 5), np.float32), arr([[0, 4], [2, 1], [3, 3]], np.int64),
                          randn(3, 2)],
     lambda x, i, s: torch.scatter(x, 1, i, s), axis=1)
case("scatter", "add", [randn(3, 4), arr([[0, 0, 1], [3, 3, 3], [2, 1, 0]], np.int64), randn(3, 3)],
     lambda x, i, s: torch.scatter_add(x, 1, i, s), axis=1, reduce="add")
case("slice_scatter", "middle", [randn(4, 6), randn(4, 2)],
     lambda x, v: torch.slice_scatter(x, v, 1, 2, 4), axis=1, start=2, end=4)
case("slice_scatter", "strided", [randn(6, 3), randn(3, 3)],
     lambda x, v: torch.slice_scatter(x, v, 0, 0, 6, 2), axis=0, start=0, end=5, step=2)


# -- added with the OpInfo conformance run: new ops, 0-d and empty operands --------------------
# (at the end, so that the seeded inputs of the cases above stay what they were)

# the rest of torch's unary float math: f32, a 0-d operand, an empty one, ints promoted to f32
_unit = (lambda *s, **k: _rng.uniform(-0.95, 0.95, size=s).astype(k.get("dtype", np.float32)))
_DOMAINS = {"exp2": lambda *s, **k: randn(*s, **k, scale=3.0), "log2": positive, "log10": positive,
            "tan": randn, "asin": _unit, "acos": _unit,
            "atan": lambda *s, **k: randn(*s, **k, scale=4.0),
            "sinh": lambda *s, **k: randn(*s, **k, scale=3.0),
            "cosh": lambda *s, **k: randn(*s, **k, scale=3.0),
            "asinh": lambda *s, **k: randn(*s, **k, scale=5.0),
            "acosh": lambda *s, **k: positive(*s, **k, lo=1.0, hi=9.0), "atanh": _unit}
for name, domain in _DOMAINS.items():
    tfn = getattr(torch, name)
    case(name, "f32", [domain(3, 4)], tfn)
    case(name, "bf16", [domain(2, 5, dtype=bf16)], tfn)
    case(name, "0d", [domain().reshape(())], tfn)
    case(name, "empty", [domain(0, 3)], tfn)
    case(name, "i32", [randint(1, 3, 5, dtype=np.int32)], tfn)
case("trunc", "f32", [_halves], torch.trunc)
case("trunc", "i32", [randint(-50, 50, 5, dtype=np.int32)], torch.trunc)
case("trunc", "0d-f16", [scalar(-2.7, np.float16)], torch.trunc)
case("atan2", "broadcast", [randn(3, 1, 5), randn(4, 5)], torch.atan2)
case("atan2", "signs-zeros", [arr([0.0, -0.0, 0.0, -0.0, 1.0, -1.0, INF, NAN]),
                              arr([0.0, 0.0, -0.0, -0.0, -INF, INF, INF, 1.0])], torch.atan2)
case("atan2", "i64-0d-f32", [randint(-9, 9, 2, 3), scalar(-1.5)], torch.atan2)
case("atan2", "i32-i32", [randint(-9, 9, 4, dtype=np.int32), randint(-9, 9, 4, dtype=np.int32)],
     torch.atan2)

for name in ("bitwise_xor", "bitwise_left_shift", "bitwise_right_shift"):
    tfn = getattr(torch, name)
    case(name, "i64", [randint(-100, 100, 3, 4), randint(0, 8, 4)], tfn)
    case(name, "i32-wide-shifts", [randint(-100, 100, 5, dtype=np.int32),
                                   arr([0, 31, 32, 40, 3], np.int32)], tfn)
    case(name, "u8-0d", [randint(0, 255, 4, dtype=np.uint8), scalar(3, np.int64)], tfn)
case("bitwise_xor", "bool", [randbool(2, 3), randbool(3)], torch.bitwise_xor)
case("copysign", "f32", [randn(3, 4), arr([1.0, -1.0, 0.0, -0.0])], torch.copysign)
case("copysign", "i64-f32", [randint(-9, 9, 4), randn(4)], torch.copysign)
for name in ("fmax", "fmin"):
    case(name, "nan", [arr([NAN, 1.0, NAN, -INF]), arr([0.0, NAN, NAN, 2.0])], getattr(torch, name))
    case(name, "i32-i64", [randint(-9, 9, 4, dtype=np.int32), randint(-9, 9, 3, 1)],
         getattr(torch, name))

case("cumsum", "0d", [scalar(2.5)], lambda x: torch.cumsum(x, 0), axis=0)
case("cumsum", "empty", [randn(0)], lambda x: torch.cumsum(x, 0), axis=0)
case("softmax", "0d", [scalar(2.5)], lambda x: torch.softmax(x, -1), axis=-1)
case("softmax", "empty-rows", [randn(0, 3)], lambda x: torch.softmax(x, -1), axis=-1)
case("log_softmax", "empty-axis", [randn(2, 0)], lambda x: torch.log_softmax(x, -1), axis=-1)
case("argmax", "0d", [scalar(2.5)], lambda x: torch.argmax(x, 0), axis=0)
case("sort", "0d", [scalar(2.5)], lambda x: torch.sort(x, 0), axis=0)
case("topk", "0d", [scalar(2.5)], lambda x: torch.topk(x, 1, 0), k=1, axis=0)
case("cumprod", "f32", [randn(3, 6)], lambda x: torch.cumprod(x, -1), axis=-1)
case("cumprod", "i32-to-i64", [randint(-5, 5, 3, 4, dtype=np.int32)],
     lambda x: torch.cumprod(x, 0), axis=0)
case("cumprod", "bool-0d", [np.asarray(True)], lambda x: torch.cumprod(x, 0), axis=0)
# a running log-add-exp: rows spanning more than exp's range keep their small terms; -inf, +inf, NaN
case("logcumsumexp", "wide-range", [arr([[-300.0, 10.0, -INF, 0.0, 200.0], [-INF, -INF, 3.0, INF, 1.0],
                                         [1.0, NAN, 2.0, 3.0, 4.0]])], lambda x: torch.logcumsumexp(x, 1), axis=1)
case("logcumsumexp", "f32-axis0", [randn(5, 3)], lambda x: torch.logcumsumexp(x, 0), axis=0)
case("logcumsumexp", "0d", [scalar(2.5)], lambda x: torch.logcumsumexp(x, 0), axis=0)
case("logcumsumexp", "empty", [randn(0, 2)], lambda x: torch.logcumsumexp(x, 0), axis=0)
_ties = arr([[1.0, 3.0, 3.0, 2.0, 5.0, 5.0], [NAN, 1.0, 2.0, NAN, 0.0, 9.0]])
for name in ("cummax", "cummin"):
    tfn = getattr(torch, name)
    case(name, "ties-nan", [_ties], lambda x, f=tfn: f(x, 1), axis=1)
    case(name, "f32-axis0", [randn(4, 3)], lambda x, f=tfn: f(x, 0), axis=0)
    case(name, "i64", [randint(-3, 3, 2, 7)], lambda x, f=tfn: f(x, -1), axis=-1)
    case(name, "bool", [randbool(9)], lambda x, f=tfn: f(x, 0), axis=0)
    case(name, "0d", [scalar(1.5)], lambda x, f=tfn: f(x, 0), axis=0)
    case(name, "empty", [randn(0, 2)], lambda x, f=tfn: f(x, 0), axis=0)

def _maxpool_idx(kernel, stride, padding=(0, 0), dilation=(1, 1), ceil_mode=False):
    return lambda x: F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode,
                                  return_indices=True)


case("max_pool2d_with_indices", "2x2", [randn(2, 3, 6, 6)], _maxpool_idx((2, 2), (2, 2)),
     kernel=(2, 2), stride=(2, 2))
case("max_pool2d_with_indices", "pad-dil-ceil", [randn(1, 2, 8, 7)],
     _maxpool_idx((2, 3), (3, 2), (1, 1), (2, 1), ceil_mode=True),
     kernel=(2, 3), stride=(3, 2), padding=(1, 1), dilation=(2, 1), ceil_mode=True)
case("max_pool2d_with_indices", "ties-i64", [randint(0, 2, 1, 2, 5, 5)],
     _maxpool_idx((3, 3), (2, 2), (1, 1)), kernel=(3, 3), stride=(2, 2), padding=(1, 1))
for name, tfn in (("argmax", torch.argmax), ("argmin", torch.argmin)):
    case(name, "u8-ties", [arr([[3, 0, 255, 255], [7, 7, 1, 0]], np.uint8)],
         lambda x, f=tfn: f(x, 1), axis=1)
    case(name, "nan-first", [arr([[1.0, NAN, 3.0, NAN], [-INF, 2.0, -INF, 0.0]])],
         lambda x, f=tfn: f(x, 1, keepdim=True), axis=1, keepdim=True)
    case(name, "flat", [randn(3, 4)], lambda x, f=tfn: f(x))
for name in ("isnan", "isinf"):
    tfn = getattr(torch, name)
    case(name, "special", [arr([0.0, NAN, INF, -INF, -0.0, 1e38])], tfn)
    case(name, "bf16-0d", [scalar(INF, bf16)], tfn)
    case(name, "i32", [randint(-5, 5, 4, dtype=np.int32)], tfn)
    case(name, "bool-empty", [np.zeros((0, 2), bool)], tfn)
case("signbit", "f32", [arr([-1.0, -0.0, 0.0, 2.0, -INF, NAN])], torch.signbit)
case("signbit", "i64-0d", [scalar(-3, np.int64)], torch.signbit)
case("signbit", "bool", [randbool(4)], torch.signbit)
case("pow", "i64-negative-exponents", [arr([1, -1, -1, 2, -3, 5], np.int64),
                                       arr([-2, -3, -4, -1, -2, 2], np.int64)], torch.pow)
_sx, _si = randn(3, 4), arr([[0, 0, 1], [3, 3, 3], [2, 1, 0]], np.int64)
for _red, _ir in (("sum", "add"), ("prod", "mul"), ("amax", "amax"), ("amin", "amin"),
                  ("mean", "mean")):
    for _incl in (True, False):
        case("scatter", f"reduce-{_red}-{'self' if _incl else 'noself'}", [_sx, _si, randn(3, 3)],
             lambda x, i, s, r=_red, inc=_incl: x.scatter_reduce(1, i, s, r, include_self=inc),
             axis=1, reduce=_ir, include_self=_incl)
case("scatter", "reduce-mean-i64-floor", [arr([5, -5, 7], np.int64), arr([0, 1, 1, 2], np.int64),
                                          arr([2, -4, 1, 0], np.int64)],
     lambda x, i, s: x.scatter_reduce(0, i, s, "mean"), axis=0, reduce="mean")
case("scatter", "reduce-amax-i32-noself", [randint(-9, 9, 5, dtype=np.int32),
                                          arr([0, 0, 4], np.int64),
                                          randint(-9, 9, 3, dtype=np.int32)],
     lambda x, i, s: x.scatter_reduce(0, i, s, "amax", include_self=False), axis=0,
     reduce="amax", include_self=False)
case("hypot", "f32", [randn(3, 4), randn(4)], torch.hypot)
case("hypot", "inf-nan", [arr([INF, NAN, 3.0, -0.0]), arr([NAN, INF, -4.0, 0.0])], torch.hypot)
case("erfc", "f32", [randn(3, 4, scale=3.0)], torch.erfc)
case("erfc", "tails", [arr([-30.0, -5.0, -0.6, -0.4, 0.0, 0.3, 0.49, 0.51, 2.0, 9.0, 26.0, INF, NAN])],
     torch.erfc, rtol=1e-5)
case("erfc", "i64-0d", [scalar(1, np.int64)], torch.erfc)

# bitcast: the same bits read as another type (torch's Tensor.view(dtype) between equal widths)
case("bitcast", "f32-i32", [arr([[1.0, -0.0, INF], [NAN, 1e-45, -3.5]])],
     lambda x: x.view(torch.int32), dtype=DType.i32)
case("bitcast", "i64-f64-0d", [scalar(4614253070214989087, np.int64)],
     lambda x: x.view(torch.float64), dtype=DType.f64)
case("bitcast", "u8-i8", [arr([0, 127, 128, 255], np.uint8)], lambda x: x.view(torch.int8),
     dtype=DType.i8)
case("bitcast", "bf16-i16", [arr([1.0, -2.5, 0.0], bf16)], lambda x: x.view(torch.int16),
     dtype=DType.i16)

COVERED = {c.op for c in CASES}
