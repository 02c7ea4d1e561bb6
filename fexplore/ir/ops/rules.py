"""Shared pieces of type rules and references: broadcasting, axis normalization, float upcasting."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import sympy

from ..types import DType, Dim, TensorType


class TypeRuleError(TypeError):
    """An op was given operands its type rule rejects; the verifier and ingestion report it."""


def norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise TypeRuleError(f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def norm_axes(axes: Sequence[int], rank: int) -> tuple[int, ...]:
    if not axes:  # empty means every axis
        return tuple(range(rank))
    out = tuple(sorted({norm_axis(a, rank) for a in axes}))
    return out


def broadcast_dims(dims: Sequence[Dim]) -> Dim:
    non_one = [d for d in dims if not (isinstance(d, int) and d == 1)]
    if not non_one:
        return 1
    static = {d for d in non_one if isinstance(d, int)}
    if len(static) > 1:
        raise TypeRuleError(f"cannot broadcast dims {list(dims)}")
    if static:
        return static.pop()
    return non_one[0]  # symbolic dims that meet are equal (torch guards on it at export)


def broadcast_shapes(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    rank = max((len(s) for s in shapes), default=0)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    return tuple(broadcast_dims([s[i] for s in padded]) for i in range(rank))


def float_result(d: DType) -> DType:
    """Math that is only defined on floats (exp, sqrt, true division) turns ints into f32."""
    return d if d.is_float else DType.f32


def as_compute(x: np.ndarray) -> np.ndarray:
    """Low-precision floats compute in f32 (as torch's CPU kernels do) and round at the end."""
    if x.dtype in (np.float16,) or x.dtype.name in ("bfloat16", "float8_e4m3fn"):
        return x.astype(np.float32)
    return x


def float_compute_type(dtype: DType):
    """The numpy type float math of ``dtype`` runs in: f64 in f64, every narrower float in f32
    (torch's CPU kernels do the same), rounded to the result dtype once at the end."""
    return np.float64 if dtype == DType.f64 else np.float32


def sym(d: Dim):
    return d if isinstance(d, int) else sympy.sympify(d)


def ceil_div(a: Dim, b: int) -> Dim:
    if isinstance(a, int):
        return -(-a // b)
    return sympy.ceiling(a / b)


def same(t: TensorType) -> list[TensorType]:
    return [TensorType(t.shape, t.dtype)]


def zero_d_as_vector(reference):
    """A reference that works along one ``axis``, taught torch's view of a 0-d tensor: it has one
    axis (dim 0 or -1) of length 1. The 0-d input runs as shape (1,) and the results are shaped
    back to ()."""

    def ref(xs, a):
        if xs[0].ndim:
            return reference(xs, a)
        a1 = dict(a)
        a1["axis"] = 0
        outs = reference([xs[0].reshape(1), *xs[1:]], a1)
        return [np.asarray(o).reshape(()) if np.asarray(o).size == 1 else np.asarray(o)
                for o in outs]

    return ref
