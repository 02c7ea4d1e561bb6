"""Types of the IR: dtypes, dims (int or symbolic), layouts, tensor types.

A dim is a Python ``int`` or a sympy expression over named symbols (``seq``, ``s0``), as torch.export
gives them; a symbol's range lives on the graph. Everything here is immutable and hashable.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

import ml_dtypes
import numpy as np
import sympy


class DType(enum.Enum):
    """Element types. The value is the IR spelling."""

    f64 = "f64"
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    fp8 = "fp8"  # float8 e4m3 (fn: finite, no inf), the NPU's 8-bit float
    i64 = "i64"
    i32 = "i32"
    i16 = "i16"
    i8 = "i8"
    u64 = "u64"
    u32 = "u32"
    u16 = "u16"
    u8 = "u8"
    bool = "bool"

    def __repr__(self) -> str:
        return self.value

    __str__ = __repr__

    @property
    def numpy(self) -> np.dtype:
        return _NUMPY[self]

    @property
    def itemsize(self) -> int:
        return _NUMPY[self].itemsize

    @property
    def is_float(self) -> bool:
        return self in (DType.f64, DType.f32, DType.f16, DType.bf16, DType.fp8)

    @property
    def is_int(self) -> bool:
        return self.is_signed or self.is_unsigned

    @property
    def is_signed(self) -> bool:
        """A signed integer type (a float is not one)."""
        return self in (DType.i64, DType.i32, DType.i16, DType.i8)

    @property
    def is_unsigned(self) -> bool:
        return self in (DType.u64, DType.u32, DType.u16, DType.u8)

    @staticmethod
    def from_numpy(dt) -> "DType":
        dt = np.dtype(dt)
        for k, v in _NUMPY.items():
            if v == dt:
                return k
        raise TypeError(f"no IR dtype for numpy dtype {dt}")


_NUMPY = {
    DType.f64: np.dtype(np.float64),
    DType.f32: np.dtype(np.float32),
    DType.f16: np.dtype(np.float16),
    DType.bf16: np.dtype(ml_dtypes.bfloat16),
    DType.fp8: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.i64: np.dtype(np.int64),
    DType.i32: np.dtype(np.int32),
    DType.i16: np.dtype(np.int16),
    DType.i8: np.dtype(np.int8),
    DType.u64: np.dtype(np.uint64),
    DType.u32: np.dtype(np.uint32),
    DType.u16: np.dtype(np.uint16),
    DType.u8: np.dtype(np.uint8),
    DType.bool: np.dtype(np.bool_),
}

# Promotion order inside one category (torch's lattice, restricted to our dtypes).
_FLOAT_RANK = {DType.fp8: 0, DType.bf16: 1, DType.f16: 1, DType.f32: 3, DType.f64: 4}
_INT_RANK = {DType.bool: 0, DType.u8: 1, DType.i8: 1, DType.u16: 2, DType.i16: 2, DType.u32: 3,
             DType.i32: 3, DType.u64: 4, DType.i64: 4}
# A signed type that holds every value of an unsigned one and of a signed one of its width.
_SIGNED_ABOVE = {DType.u8: DType.i16, DType.u16: DType.i32, DType.u32: DType.i64}


def _category(d: DType) -> int:
    return 2 if d.is_float else (1 if d.is_int else 0)


def promote_pair(a: DType, b: DType) -> DType:
    """Promote two dtypes as torch does for tensors of equal standing."""
    if a == b:
        return a
    ca, cb = _category(a), _category(b)
    if ca != cb:
        return a if ca > cb else b
    if ca == 2:
        if {a, b} == {DType.bf16, DType.f16}:
            return DType.f32
        return a if _FLOAT_RANK[a] >= _FLOAT_RANK[b] else b
    if a.is_unsigned != b.is_unsigned and a != DType.bool and b != DType.bool:
        u, i = (a, b) if a.is_unsigned else (b, a)
        if _INT_RANK[i] > _INT_RANK[u]:
            return i
        if u in _SIGNED_ABOVE:   # neither holds the other's range: u8 with i8 is i16, as torch
            return _SIGNED_ABOVE[u]
        raise TypeError(f"no integer type holds both {u} and {i} (numpy makes them f64, torch "
                        "refuses): cast one of them first")
    return a if _INT_RANK[a] >= _INT_RANK[b] else b


def promote_types(types: "list[TensorType]") -> DType:
    """torch's result_type: dimensioned tensors outrank 0-d ones within the winning category, so
    ``x_f16 * 0.5`` stays f16 while ``x_i64 * 0.5`` becomes f32 (scalars are 0-d constants here)."""
    top = max(_category(t.dtype) for t in types)
    ranked = [t for t in types if t.rank > 0 and _category(t.dtype) == top]
    pool = ranked or [t for t in types if _category(t.dtype) == top]
    out = pool[0].dtype
    for t in pool[1:]:
        out = promote_pair(out, t.dtype)
    return out


Dim = Union[int, sympy.Expr]


def is_static(d: Dim) -> bool:
    return isinstance(d, int)


def names_a_symbol(attr) -> bool:
    """Whether an attribute value (a slice bound, a reshape target, a tuple of them) is an
    expression of symbolic dims, so only a size's specialization gives it a value."""
    if isinstance(attr, (tuple, list)):
        return any(names_a_symbol(a) for a in attr)
    return isinstance(attr, sympy.Basic) and bool(attr.free_symbols)


def canon_dim(d) -> Dim:
    """Normalize a dim: plain ints stay ints; sympy integers become ints; expressions stay exprs."""
    if isinstance(d, bool):
        raise TypeError("a dim cannot be a bool")
    if isinstance(d, (int, np.integer)):
        return int(d)
    if isinstance(d, sympy.Expr):
        if d.is_Integer:
            return int(d)
        return _flat_floors(d) if d.has(sympy.floor) else d
    raise TypeError(f"not a dim: {d!r}")


def _flat_floors(e: sympy.Expr) -> sympy.Expr:
    """floor(floor(X)/n + k/n) as floor(X/n + k/n) (n, k integers, n > 0): equal, since
    floor((floor(X) + k)/n) = floor((X + k)/n). Two stride-2 windows in a row (a conv, then a
    pool) give the nested form; torch's shape arithmetic gives the flat one, and each side must
    read the other's dim as the same."""
    def flat(arg):
        inner = [t for t in sympy.Add.make_args(arg) if t.has(sympy.floor)]
        if len(inner) != 1:
            return None
        coeff, rest = inner[0].as_coeff_Mul()
        const = arg - inner[0]
        if not (isinstance(rest, sympy.floor) and coeff.is_Rational and coeff > 0 and coeff.p == 1
                and const.is_Rational and (const * coeff.q).is_Integer):
            return None
        return sympy.floor(rest.args[0] * coeff + const)

    def rewrite(f):
        g = flat(f.args[0])
        return f if g is None else g
    for _ in range(8):   # each pass removes one level of nesting
        e2 = e.replace(lambda x: isinstance(x, sympy.floor), rewrite)
        if e2 == e:
            return e
        e = e2
    return e


def dim_str(d: Dim) -> str:
    return str(d) if isinstance(d, int) else sympy.sstr(d).replace(" ", "")


def dims_equal(a: Dim, b: Dim) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if a == b:
        return True
    return sympy.simplify(sympy.sympify(a) - sympy.sympify(b)) == 0


def numel(shape: tuple[Dim, ...]) -> Dim:
    n: Dim = 1
    for d in shape:
        n = n * d
    return canon_dim(sympy.sympify(n)) if not isinstance(n, int) else n


@dataclass(frozen=True)
class Layout:
    """How a tensor is laid out in memory: ``order`` lists dims from outermost to innermost
    (``(0, 2, 3, 1)`` is channels-last for NCHW); ``tile`` optionally tiles the innermost dims.
    ``None`` layout on a TensorType means the default row-major layout."""

    order: tuple[int, ...]
    tile: tuple[int, ...] = ()

    def __str__(self) -> str:
        s = ",".join(map(str, self.order))
        if self.tile:
            s += " tile " + "x".join(map(str, self.tile))
        return "{" + s + "}"


@dataclass(frozen=True)
class TensorType:
    shape: tuple[Dim, ...]
    dtype: DType
    layout: Layout | None = None

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(canon_dim(d) for d in self.shape))
        if self.layout is not None and len(self.layout.order) != len(self.shape):
            raise ValueError(f"layout {self.layout} does not match rank {len(self.shape)}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def numel(self) -> Dim:
        return numel(self.shape)

    def nbytes(self) -> Dim:
        return self.numel * self.dtype.itemsize

    def with_shape(self, shape) -> "TensorType":
        return TensorType(tuple(shape), self.dtype, None)

    def with_layout(self, layout: Layout | None) -> "TensorType":
        return TensorType(self.shape, self.dtype, layout)

    def with_dtype(self, dtype: DType) -> "TensorType":
        return TensorType(self.shape, dtype, self.layout)

    def same_as(self, other: "TensorType") -> bool:
        """Equality up to symbolic simplification of dims."""
        return (self.dtype == other.dtype and self.layout == other.layout
                and self.rank == other.rank
                and all(dims_equal(a, b) for a, b in zip(self.shape, other.shape)))

    def __str__(self) -> str:
        s = f"{self.dtype}[{', '.join(dim_str(d) for d in self.shape)}]"
        if self.layout is not None:
            s += str(self.layout)
        return s

    __repr__ = __str__


def concrete_shape(shape: tuple[Dim, ...], bindings: dict) -> tuple[int, ...]:
    """Evaluate a possibly symbolic shape under symbol bindings ``{sympy.Symbol: int}``."""
    return tuple(d if isinstance(d, int) else int(d.xreplace(bindings)) for d in shape)


def symbol(name: str) -> sympy.Symbol:
    """The one way symbols are made, so that equal names give equal symbols (sympy compares
    assumptions too)."""
    return sympy.Symbol(name, integer=True, positive=True)
