"""Types of the kernel language: element types, parameter specs with named axes, memory spaces.

    a: fl.bf16["M", "K"]       # a bf16 DRAM tensor with axes M and K (sizes bound at call time)
    x: fl.Tensor["R", "C"]     # any float dtype, taken from the argument (dtype-generic kernels)
    g: "f32[D]"                # the same as a string
    w: fl.f32["C", 3]          # an int is a fixed size, an unnamed axis

An axis name binds to a size the first time it is seen (parameters in order) and must agree
everywhere after; inside the kernel, names travel with tiles so a transposed operand or a reduction
over the wrong axis is caught even when the sizes happen to agree.
"""

from __future__ import annotations

import re

import numpy as np

from fexplore.npu import dtypes as npu_dtypes

# Memory spaces. DRAM holds kernel parameters and outputs; SRAM holds tiles; ACC holds the tensor
# unit's f32 accumulators (a region of SRAM on this chip, kept distinct because the tensor unit
# cannot read its own accumulator as an operand: results go through the vector unit first).
DRAM, SRAM, ACC = "dram", "sram", "acc"
SPACES = (DRAM, SRAM, ACC)


class DType:
    """An element type. ``fl.bf16["M", "K"]`` makes a parameter spec; compares equal to its name."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    @property
    def numpy(self) -> np.dtype:
        return npu_dtypes.numpy_dtype(self.name)

    @property
    def itemsize(self) -> int:
        return npu_dtypes.itemsize(self.name)

    @property
    def is_float(self) -> bool:
        return npu_dtypes.is_float(self.name)

    def __getitem__(self, dims) -> "TensorSpec":
        return TensorSpec(_dims(dims), self)

    def __eq__(self, other) -> bool:
        if isinstance(other, DType):
            return other.name == self.name
        return isinstance(other, str) and other == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__


DTYPES = {name: DType(name) for name in npu_dtypes.NUMPY}
bf16, f16, f32, fp8 = DTYPES["bf16"], DTYPES["f16"], DTYPES["f32"], DTYPES["fp8"]
i8, i16, i32, i64, bool_ = DTYPES["i8"], DTYPES["i16"], DTYPES["i32"], DTYPES["i64"], DTYPES["bool"]
u8, u16, u32, u64 = DTYPES["u8"], DTYPES["u16"], DTYPES["u32"], DTYPES["u64"]


def as_dtype(dt) -> DType:
    """A DType from a DType, a name (``"bf16"``), a numpy dtype or an IR DType. Raises ValueError."""
    if isinstance(dt, DType):
        return dt
    try:
        return DTYPES[npu_dtypes.dtype_name(dt)]
    except Exception:
        raise ValueError(f"unsupported dtype {dt!r}; use one of {', '.join(DTYPES)}") from None


class _AnyDType:
    """``fl.Tensor["M", "K"]``: a spec whose dtype comes from the argument."""

    def __getitem__(self, dims) -> "TensorSpec":
        return TensorSpec(_dims(dims), None)

    def __repr__(self) -> str:
        return "fl.Tensor"


Tensor = _AnyDType()


class TensorSpec:
    """The declared type of a tensor parameter: axes (names or fixed sizes) and dtype (None = any)."""

    __slots__ = ("dims", "dtype")

    def __init__(self, dims: tuple, dtype: DType | None):
        self.dims = dims
        self.dtype = dtype

    @property
    def axes(self) -> tuple[str | None, ...]:
        return tuple(d if isinstance(d, str) else None for d in self.dims)

    def resolve(self, sizes: dict[str, int]) -> tuple[int, ...]:
        """The concrete shape, given the sizes the axis names are bound to. Raises KeyError(name)."""
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.dims)

    def __eq__(self, other) -> bool:
        return isinstance(other, TensorSpec) and (self.dims, self.dtype) == (other.dims, other.dtype)

    def __hash__(self) -> int:
        return hash((self.dims, self.dtype))

    def __repr__(self) -> str:
        return f"{self.dtype or 'Tensor'}[{', '.join(map(str, self.dims))}]"


def _dims(dims) -> tuple:
    if not isinstance(dims, tuple):
        dims = (dims,)
    out = []
    for d in dims:
        if isinstance(d, str) and d.isidentifier():
            out.append(d)
        elif isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0:
            out.append(int(d))
        else:
            raise ValueError(f"axis {d!r} is neither a name nor a positive int")
    return tuple(out)


_SPEC_TEXT = re.compile(r"^\s*(?:fl\.)?(\w+)\s*\[(.*)\]\s*$")


def parse_spec(text: str) -> TensorSpec:
    """``"bf16[M, K]"`` (or ``"Tensor[M, K]"``) -> TensorSpec. Raises ValueError."""
    m = _SPEC_TEXT.match(text)
    if not m:
        raise ValueError(f"{text!r} is not of the form 'dtype[A, B, ...]'")
    name, inner = m.groups()
    dims = []
    for part in (p.strip().strip("'\"") for p in inner.split(",")):
        dims.append(int(part) if part.isdigit() else part)
    dtype = None if name == "Tensor" else as_dtype(name)
    return TensorSpec(_dims(tuple(dims)), dtype)


def shape_text(shape, axes=None) -> str:
    """``M:64, K:32`` when axes are named, else ``64x32``."""
    if axes and any(a is not None for a in axes):
        return ", ".join(f"{a}:{d}" if a else str(d) for d, a in zip(shape, axes))
    return "x".join(map(str, shape)) if shape else "scalar"
