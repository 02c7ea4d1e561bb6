"""Ops that write into a copy of a tensor: index_put (x[i, j] = v), scatter (torch.scatter) and
slice_scatter (x[..., a:b] = v). Value semantics: the input is never changed, the result is a new
tensor. These are how in-place updates (a static KV cache, slice assignment) reach the IR."""

from __future__ import annotations

import numpy as np

from ..opdef import AttrSpec, Category, Cost, OpDef, io_bytes
from ..opset import register
from ..types import DType, TensorType, dims_equal
from .rules import TypeRuleError, norm_axis


def _write_cost(ins, outs, attrs) -> Cost:
    # the result is the input with some elements replaced: read the updates, write them
    return Cost(0, io_bytes(ins[1:], []) * 2)


def _index_put_type(ins, a):
    x, v, idxs = ins[0], ins[1], ins[2:]
    axes = a["axes"]
    if len(axes) != len(idxs) or not axes or list(axes) != sorted(set(axes)) or \
            axes[-1] >= x.rank:
        raise TypeRuleError(f"index_put: axes {list(axes)} do not match {len(idxs)} index tensors")
    for t in idxs:
        if t.dtype not in (DType.i64, DType.i32):
            raise TypeRuleError(f"index_put: index tensors must be integer, got {t.dtype}")
    if v.dtype != x.dtype:
        raise TypeRuleError(f"index_put: values are {v.dtype}, the tensor {x.dtype}")
    return [TensorType(x.shape, x.dtype)]


def _index_put_ref(xs, a):
    x, v, idxs = xs[0], xs[1], xs[2:]
    out = np.array(x, copy=True)
    key = [slice(None)] * x.ndim
    for ax, ix in zip(a["axes"], idxs):
        key[ax] = ix
    key = tuple(key)
    if a["accumulate"]:
        np.add.at(out, key, np.broadcast_to(v, out[key].shape))
    else:
        out[key] = v
    return [out]


register(OpDef("index_put", Category.movement, _index_put_type, _index_put_ref, _write_cost,
               attrs=(AttrSpec("axes", "ints"), AttrSpec("accumulate", "bool", False)),
               arity=None, min_inputs=3,
               doc="(x, values, index...) -> x with x[..., i, ..., j] = values (or += with "
                   "accumulate); indices on 'axes'"))


def _scatter_type(ins, a):
    x, idx, src = ins
    norm_axis(a["axis"], x.rank)
    if idx.rank != x.rank or idx.dtype not in (DType.i64, DType.i32):
        raise TypeRuleError("scatter: index must be an integer tensor of the input's rank")
    if src.dtype != x.dtype:
        raise TypeRuleError(f"scatter: source is {src.dtype}, the tensor {x.dtype}")
    return [TensorType(x.shape, x.dtype)]


_UFUNC = {"add": np.add, "mul": np.multiply, "amax": np.maximum, "amin": np.minimum,
          "mean": np.add}


def reduction_identity(reduce: str, dtype: np.dtype):
    """What a place a scatter reduces into starts from when it does not start from its own value
    (include_self=False): 0 for a sum or a mean, 1 for a product, and for a max (min) the lowest
    (highest) value of `dtype`; floats are every kind but ints and bools (ml_dtypes' bfloat16
    and fp8 have numpy kind 'V')."""
    if reduce in ("add", "mean"):
        return 0
    if reduce == "mul":
        return 1
    if dtype.kind == "b":
        return reduce == "amin"
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.min if reduce == "amax" else info.max
    return -np.inf if reduce == "amax" else np.inf


def _scatter_ref(xs, a):
    x, idx, src = xs
    out = np.array(x, copy=True)
    axis = norm_axis(a["axis"], x.ndim)
    src = np.broadcast_to(src, idx.shape) if src.ndim == 0 else \
        src[tuple(slice(0, s) for s in idx.shape)]
    grids = list(np.indices(idx.shape, sparse=True))
    grids[axis] = idx
    at, reduce = tuple(grids), a["reduce"]
    if reduce == "none":
        out[at] = src
        return [out]
    if not a["include_self"]:  # the written positions start from the reduction's identity
        out[at] = reduction_identity(reduce, out.dtype)
    _UFUNC[reduce].at(out, at, src)
    if reduce == "mean":
        count = np.full(out.shape, 1 if a["include_self"] else 0, np.int64)
        np.add.at(count, at, 1)
        hit = count > 0
        div = np.maximum(count, 1)
        mean = out / div if out.dtype.kind == "f" else np.floor_divide(out, div)
        out = np.where(hit, mean, x).astype(x.dtype)
    return [out]


register(OpDef("scatter", Category.movement, _scatter_type, _scatter_ref, _write_cost,
               attrs=(AttrSpec("axis", "int"), AttrSpec("reduce", "str", "none"),
                      AttrSpec("include_self", "bool", True)), arity=3,
               doc="torch.scatter/scatter_reduce: out[..., index[i, j], ...] = src[i, j] along "
                   "'axis'; reduce 'add', 'mul', 'amax', 'amin' or 'mean' combines the values "
                   "written to one place (with the input's own, if include_self)"))


def _slice_scatter_type(ins, a):
    x, v = ins
    axis = norm_axis(a["axis"], x.rank)
    start, end, step = a["start"], a["end"], a["step"]
    length = (end - start + step - 1) // step if isinstance(end - start, int) else None
    if v.rank != x.rank or v.dtype != x.dtype:
        raise TypeRuleError(f"slice_scatter: values {v} do not fit {x}")
    for i in range(x.rank):
        want = length if i == axis else x.shape[i]
        if want is not None and not dims_equal(v.shape[i], want):
            raise TypeRuleError(f"slice_scatter: values {v} do not fit slice of {x}")
    return [TensorType(x.shape, x.dtype)]


def _slice_scatter_ref(xs, a):
    x, v = xs
    out = np.array(x, copy=True)
    key = [slice(None)] * x.ndim
    key[norm_axis(a["axis"], x.ndim)] = slice(a["start"], a["end"], a["step"])
    out[tuple(key)] = v
    return [out]


register(OpDef("slice_scatter", Category.movement, _slice_scatter_type, _slice_scatter_ref,
               _write_cost,
               attrs=(AttrSpec("axis", "int"), AttrSpec("start", "dim"), AttrSpec("end", "dim"),
                      AttrSpec("step", "int", 1)), arity=2,
               doc="x with x[..., start:end:step, ...] = values (strict bounds, like slice)"))
