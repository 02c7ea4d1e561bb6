"""Element types as the NPU sees them: a name, a numpy dtype (bf16/fp8 via ml_dtypes), a size.

The names are the IR's spellings (``f32``, ``bf16``, ``fp8`` ...), so an ``fexplore.ir`` DType (an
enum whose ``.value`` is the name), a numpy dtype, or a plain string all resolve to the same thing.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from fexplore.npu.errors import ProgramError

NUMPY = {
    "f64": np.dtype(np.float64),
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "fp8": np.dtype(ml_dtypes.float8_e4m3fn),
    "i64": np.dtype(np.int64),
    "i32": np.dtype(np.int32),
    "i16": np.dtype(np.int16),
    "i8": np.dtype(np.int8),
    "u64": np.dtype(np.uint64),
    "u32": np.dtype(np.uint32),
    "u16": np.dtype(np.uint16),
    "u8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
}
_BY_NUMPY = {v: k for k, v in NUMPY.items()}
# numpy's default float: the kernel language takes f64 arrays as f32 (the chip computes in f32);
# a DRAM tensor the whole-model program declares "f64" by name keeps the model's f64 values.
_BY_NUMPY[np.dtype(np.float64)] = "f32"


def dtype_name(dt) -> str:
    """The NPU name of ``dt`` (a name, an IR DType, or anything numpy understands)."""
    if isinstance(dt, str) and dt in NUMPY:
        return dt
    value = getattr(dt, "value", None)  # fexplore.ir.DType
    if isinstance(value, str) and value in NUMPY:
        return value
    try:
        return _BY_NUMPY[np.dtype(dt)]
    except (TypeError, KeyError):
        raise ProgramError(f"unsupported dtype {dt!r}",
                           hint=f"use one of {', '.join(NUMPY)}") from None


def numpy_dtype(name: str) -> np.dtype:
    return NUMPY[name]


def itemsize(name: str) -> int:
    return NUMPY[name].itemsize


def is_float(name: str) -> bool:
    return name in ("f64", "f32", "f16", "bf16", "fp8")
