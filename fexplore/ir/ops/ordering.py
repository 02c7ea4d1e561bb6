"""Ops whose result depends on the order of values: sort and topk (values and indices)."""

from __future__ import annotations

import numpy as np

from ..opdef import AttrSpec, Category, Cost, OpDef, io_bytes
from ..opset import register
from ..types import DType, TensorType, numel
from .rules import TypeRuleError, norm_axis, zero_d_as_vector


def _order(x: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    """Stable ordering; descending keeps equal values in their original order too. NaN is the
    largest value, as torch has it: last ascending, first descending."""
    key = _key(x)
    if not descending:
        return np.argsort(key, axis=axis, kind="stable")
    idx = np.argsort(-key, axis=axis, kind="stable")              # NaN last (-NaN is NaN)
    numbers_last = np.argsort(~np.isnan(np.take_along_axis(key, idx, axis)), axis=axis, kind="stable")
    return np.take_along_axis(idx, numbers_last, axis)


def _key(x: np.ndarray) -> np.ndarray:
    # bools sort as 0/1; NaN sorts last ascending, as torch's sort puts it
    return x.astype(np.float64) if x.dtype.kind in "bf" else x.astype(np.int64)


def _sort_type(ins, a):
    (t,) = ins
    norm_axis(a["axis"], t.rank)
    return [TensorType(t.shape, t.dtype), TensorType(t.shape, DType.i64)]


def _sort_ref(xs, a):
    x = xs[0]
    axis = norm_axis(a["axis"], x.ndim)
    idx = _order(x, axis, a["descending"])
    return [np.take_along_axis(x, idx, axis), idx]


def _sort_cost(ins, outs, a) -> Cost:
    n = numel(ins[0].shape)
    return Cost(flops=n * 8, bytes=io_bytes(ins, outs))  # ~n log n comparisons for small rows


register(OpDef("sort", Category.opaque, _sort_type, zero_d_as_vector(_sort_ref),
               _sort_cost,
               attrs=(AttrSpec("axis", "int", -1), AttrSpec("descending", "bool", False)),
               arity=1, doc="(values, indices) sorted along 'axis'; equal values keep their order"))


def _topk_type(ins, a):
    (t,) = ins
    axis = norm_axis(a["axis"], t.rank)
    k = a["k"]
    size = t.shape[axis] if t.rank else 1   # a 0-d tensor is one element
    if k < 0 or (isinstance(size, int) and k > size):
        raise TypeRuleError(f"topk: k={k} outside [0, {size}]")
    shape = t.shape[:axis] + (k,) + t.shape[axis + 1:] if t.rank else ()
    return [TensorType(shape, t.dtype), TensorType(shape, DType.i64)]


def _topk_ref(xs, a):
    x = xs[0]
    axis = norm_axis(a["axis"], x.ndim)
    idx = _order(x, axis, a["largest"])
    idx = np.take(idx, np.arange(a["k"]), axis=axis)
    return [np.take_along_axis(x, idx, axis), idx]


register(OpDef("topk", Category.opaque, _topk_type, zero_d_as_vector(_topk_ref),
               _sort_cost,
               attrs=(AttrSpec("k", "int"), AttrSpec("axis", "int", -1),
                      AttrSpec("largest", "bool", True)),
               arity=1, doc="(values, indices) of the k largest (or smallest) along 'axis', "
                            "in order"))
