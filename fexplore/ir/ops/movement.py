"""Data movement and creation: reshape, permute, expand, slice, select, concat, split, pad, gather,
index, embedding, full, arange.

IR movement ops are strict where torch is lenient: shapes are fully given (no -1), slice bounds are
already clamped and non-negative, axes may be negative only where the attr says so. Ingestion does
the normalizing, with torch's own shape facts in hand, so the IR means exactly one thing.
"""

from __future__ import annotations

import numpy as np
import sympy

from ..opdef import AttrSpec, Category, Cost, OpDef, io_bytes, movement_cost
from ..opset import register
from ..types import DType, Layout, TensorType, dims_equal, numel
from .rules import TypeRuleError, broadcast_shapes, ceil_div, norm_axis


def _free(ins, outs, attrs) -> Cost:
    """Views cost nothing on their own; what they cost is decided by layout and fusion."""
    return Cost(0, 0)


# -- reshape / permute / expand ---------------------------------------------------------------

def _reshape_type(ins, a):
    (t,) = ins
    shape = a["shape"]
    n_in, n_out = numel(t.shape), numel(shape)
    if isinstance(n_in, int) and isinstance(n_out, int) and n_in != n_out:
        raise TypeRuleError(f"reshape: {n_in} elements cannot take shape {list(shape)}")
    return [TensorType(shape, t.dtype)]


register(OpDef("reshape", Category.movement, _reshape_type,
               lambda xs, a: [xs[0].reshape(a["shape"])], _free,
               attrs=(AttrSpec("shape", "dims"),), arity=1))


def _permute_type(ins, a):
    (t,) = ins
    perm = a["perm"]
    if sorted(perm) != list(range(t.rank)):
        raise TypeRuleError(f"permute: {list(perm)} is not a permutation of rank {t.rank}")
    return [TensorType(tuple(t.shape[p] for p in perm), t.dtype)]


register(OpDef("permute", Category.movement, _permute_type,
               lambda xs, a: [np.transpose(xs[0], a["perm"])], movement_cost,
               attrs=(AttrSpec("perm", "ints"),), arity=1))


def _expand_type(ins, a):
    (t,) = ins
    shape = a["shape"]
    if len(shape) < t.rank:
        raise TypeRuleError(f"expand: target rank {len(shape)} < input rank {t.rank}")
    src = (1,) * (len(shape) - t.rank) + t.shape
    for s, d in zip(src, shape):
        if not (s == 1 or dims_equal(s, d)):
            raise TypeRuleError(f"expand: cannot expand {list(t.shape)} to {list(shape)}")
    return [TensorType(shape, t.dtype)]


register(OpDef("expand", Category.broadcast, _expand_type,
               lambda xs, a: [np.broadcast_to(xs[0], a["shape"])], _free,
               attrs=(AttrSpec("shape", "dims"),), arity=1))


# -- slicing ----------------------------------------------------------------------------------

def _slice_type(ins, a):
    (t,) = ins
    axis = norm_axis(a["axis"], t.rank)
    start, end, step = a["start"], a["end"], a["step"]
    if step < 1:
        raise TypeRuleError("slice: step must be >= 1")
    if isinstance(start, int) and isinstance(end, int):
        size = t.shape[axis]
        if start < 0 or end < start or (isinstance(size, int) and end > size):
            raise TypeRuleError(f"slice: bounds [{start}:{end}] outside [0:{size}]")
    length = ceil_div(end - start, step) if step > 1 else end - start
    shape = t.shape[:axis] + (length,) + t.shape[axis + 1:]
    return [TensorType(shape, t.dtype)]


def _slice_ref(xs, a):
    x = xs[0]
    axis = norm_axis(a["axis"], x.ndim)
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(a["start"], a["end"], a["step"])
    return [x[tuple(idx)]]


register(OpDef("slice", Category.movement, _slice_type, _slice_ref, movement_cost,
               attrs=(AttrSpec("axis", "int"), AttrSpec("start", "dim"), AttrSpec("end", "dim"),
                      AttrSpec("step", "int", 1)), arity=1,
               doc="strict: 0 <= start <= end <= size"))


def _select_type(ins, a):
    (t,) = ins
    axis = norm_axis(a["axis"], t.rank)
    return [TensorType(t.shape[:axis] + t.shape[axis + 1:], t.dtype)]


def _select_ref(xs, a):
    x = xs[0]
    return [np.take(x, a["index"], axis=norm_axis(a["axis"], x.ndim))]


register(OpDef("select", Category.movement, _select_type, _select_ref, movement_cost,
               attrs=(AttrSpec("axis", "int"), AttrSpec("index", "dim")), arity=1,
               doc="index is non-negative"))


# -- concat / split / pad ---------------------------------------------------------------------

def _concat_type(ins, a):
    first = ins[0]
    axis = norm_axis(a["axis"], first.rank)
    total = 0
    for t in ins:
        if t.rank != first.rank:
            raise TypeRuleError("concat: operands differ in rank")
        for i in range(t.rank):
            if i != axis and not dims_equal(t.shape[i], first.shape[i]):
                raise TypeRuleError(f"concat: dim {i} differs: {t.shape[i]} vs {first.shape[i]}")
        total = total + t.shape[axis]
    dtype = first.dtype
    for t in ins[1:]:
        from ..types import promote_pair

        dtype = promote_pair(dtype, t.dtype)
    total = total if isinstance(total, int) else sympy.simplify(total)
    return [TensorType(first.shape[:axis] + (total,) + first.shape[axis + 1:], dtype)]


register(OpDef("concat", Category.movement, _concat_type,
               lambda xs, a: [np.concatenate(
                   [x.astype(np.result_type(*xs), copy=False) for x in xs],
                   axis=norm_axis(a["axis"], xs[0].ndim))],
               movement_cost, attrs=(AttrSpec("axis", "int"),), arity=None, min_inputs=1))


def _split_type(ins, a):
    (t,) = ins
    axis = norm_axis(a["axis"], t.rank)
    sizes = a["sizes"]
    total = sum(sizes)
    if isinstance(total, int) and isinstance(t.shape[axis], int) and total != t.shape[axis]:
        raise TypeRuleError(f"split: sizes {list(sizes)} do not add up to {t.shape[axis]}")
    return [TensorType(t.shape[:axis] + (s,) + t.shape[axis + 1:], t.dtype) for s in sizes]


def _split_ref(xs, a):
    x = xs[0]
    axis = norm_axis(a["axis"], x.ndim)
    cuts = np.cumsum(a["sizes"])[:-1]
    return list(np.split(x, cuts, axis=axis))


register(OpDef("split", Category.movement, _split_type, _split_ref, movement_cost,
               attrs=(AttrSpec("axis", "int"), AttrSpec("sizes", "dims")), arity=1))


def _pad_type(ins, a):
    (t,) = ins
    pads = a["pads"]  # (before, after) per axis, for the last len(pads)//2 axes, innermost first
    if len(pads) % 2 or len(pads) // 2 > t.rank:
        raise TypeRuleError(f"pad: bad pads {list(pads)} for rank {t.rank}")
    if any(p < 0 for p in pads):
        raise TypeRuleError(f"pad: negative padding {list(pads)} is not supported")
    shape = list(t.shape)
    for i in range(len(pads) // 2):
        ax = t.rank - 1 - i
        shape[ax] = shape[ax] + pads[2 * i] + pads[2 * i + 1]
    return [TensorType(tuple(shape), t.dtype)]


def _pad_ref(xs, a):
    x = xs[0]
    pads = a["pads"]
    width = [(0, 0)] * x.ndim
    for i in range(len(pads) // 2):
        width[x.ndim - 1 - i] = (pads[2 * i], pads[2 * i + 1])
    if any(p < 0 for pair in width for p in pair):
        raise ValueError("negative padding is not supported")
    return [np.pad(x, width, constant_values=np.asarray(a["value"]).astype(x.dtype))]


register(OpDef("pad", Category.movement, _pad_type, _pad_ref, movement_cost,
               attrs=(AttrSpec("pads", "ints"), AttrSpec("value", "number", 0.0)), arity=1,
               doc="torch.nn.functional.pad's order: last axis first, (before, after)"))


# -- gathers ----------------------------------------------------------------------------------

def _gather_type(ins, a):
    x, idx = ins
    axis = norm_axis(a["axis"], x.rank)
    if idx.dtype not in (DType.i64, DType.i32) or idx.rank != x.rank:
        raise TypeRuleError("gather: index must be an integer tensor of the input's rank")
    for i, (n, m) in enumerate(zip(idx.shape, x.shape)):
        if i != axis and isinstance(n, int) and isinstance(m, int) and n > m:
            raise TypeRuleError(f"gather: index {idx} is larger than input {x} in dim {i}")
    return [TensorType(idx.shape, x.dtype)]


def _gather_ref(xs, a):
    x, idx = xs
    axis = norm_axis(a["axis"], x.ndim)
    # torch lets the index be smaller than x in the other dims; take_along_axis wants them equal
    x = x[tuple(slice(None) if i == axis else slice(0, n) for i, n in enumerate(idx.shape))]
    return [np.take_along_axis(x, idx, axis=axis)]


register(OpDef("gather", Category.movement, _gather_type, _gather_ref,
               movement_cost, attrs=(AttrSpec("axis", "int"),), arity=2))


def _index_type(ins, a):
    x, idxs = ins[0], ins[1:]
    axes = a["axes"]
    if len(axes) != len(idxs) or list(axes) != sorted(set(axes)) or (axes and axes[-1] >= x.rank):
        raise TypeRuleError(f"index: axes {list(axes)} do not match {len(idxs)} index tensors")
    for t in idxs:
        if t.dtype not in (DType.i64, DType.i32, DType.bool):
            raise TypeRuleError(f"index: index tensors must be integer, got {t.dtype}")
        if t.dtype == DType.bool:
            raise TypeRuleError("index: boolean masks have data-dependent shapes; not supported")
    bshape = broadcast_shapes(*(t.shape for t in idxs))
    adjacent = list(axes) == list(range(axes[0], axes[0] + len(axes)))
    rest = [d for i, d in enumerate(x.shape) if i not in axes]
    if adjacent:  # numpy/torch: the indexed block stays in place
        shape = tuple(x.shape[:axes[0]]) + bshape + tuple(x.shape[axes[-1] + 1:])
    else:  # separated index axes move to the front
        shape = bshape + tuple(rest)
    return [TensorType(shape, x.dtype)]


def _index_ref(xs, a):
    x, idxs = xs[0], xs[1:]
    key = [slice(None)] * x.ndim
    for ax, ix in zip(a["axes"], idxs):
        key[ax] = ix
    return [x[tuple(key)]]


register(OpDef("index", Category.movement, _index_type, _index_ref, movement_cost,
               attrs=(AttrSpec("axes", "ints"),), arity=None, min_inputs=2,
               doc="advanced indexing (x[..., i, ..., j]) with integer index tensors on 'axes'"))


def _embedding_type(ins, a):
    w, idx = ins
    if w.rank != 2 or idx.dtype not in (DType.i64, DType.i32):
        raise TypeRuleError("embedding: weight must be 2-D and indices integer")
    return [TensorType(idx.shape + (w.shape[1],), w.dtype)]


def _embedding_cost(ins, outs, attrs) -> Cost:
    # Only the gathered rows move, not the whole table.
    return Cost(0, ins[1].nbytes() + 2 * outs[0].nbytes())


register(OpDef("embedding", Category.movement, _embedding_type,
               lambda xs, a: [np.take(xs[0], xs[1], axis=0)], _embedding_cost, arity=2))


# -- creation ---------------------------------------------------------------------------------

def _creation_cost(ins, outs, attrs) -> Cost:
    return Cost(0, io_bytes([], outs))


register(OpDef("full", Category.broadcast,
               lambda ins, a: [TensorType(a["shape"], a["dtype"])],
               lambda xs, a: [np.full(a["shape"],
                                      np.asarray(a["value"]).astype(a["dtype"].numpy))],
               _creation_cost,
               attrs=(AttrSpec("shape", "dims"), AttrSpec("value", "literal"),
                      AttrSpec("dtype", "dtype")), arity=0,
               doc="a tensor of 'shape' filled with 'value' (a number, a bool or a size), "
                   "converted to 'dtype' as torch.full converts it"))


def _whole(v):
    """An integral float as an int (a size's arithmetic needs ints); anything else as it is."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _arange_type(ins, a):
    start, end, step = a["start"], a["end"], a["step"]
    if step == 0:
        raise TypeRuleError("arange: step is zero")
    if all(isinstance(v, int) for v in (start, end, step)):
        n = max(0, -(-(end - start) // step))
        return [TensorType((n,), a["dtype"])]
    # a float arange over a symbolic size (torch.arange(x.shape[0], dtype=torch.float32)) has
    # start 0.0 and step 1.0: whole numbers, so its length is the same size expression as an
    # integer arange's
    start, end, step = (_whole(v) for v in (start, end, step))
    if isinstance(step, int) and not isinstance(start, float) and not isinstance(end, float):
        n = ceil_div(end - start, step) if step != 1 else end - start
    else:
        n = max(0, int(np.ceil((float(end) - float(start)) / float(step))))
    return [TensorType((n,), a["dtype"])]


def _arange_ref(xs, a):
    # Integer arange is exact; float arange computes start + i*step in f64 like torch.
    n = _arange_type([], a)[0].shape[0]
    i = np.arange(n, dtype=np.float64 if a["dtype"].is_float else np.int64)
    return [a["start"] + i * a["step"]]


register(OpDef("arange", Category.broadcast, _arange_type, _arange_ref, _creation_cost,
               attrs=(AttrSpec("start", "scalar", 0), AttrSpec("end", "scalar"),
                      AttrSpec("step", "scalar", 1), AttrSpec("dtype", "dtype", DType.i64)),
               arity=0))


# -- bitcast --------------------------------------------------------------------------------

def _bitcast_type(ins, a):
    (t,) = ins
    to = a["dtype"]
    if to.itemsize != t.dtype.itemsize:
        raise TypeRuleError(f"bitcast: {t.dtype} has {8 * t.dtype.itemsize} bits, {to} has "
                            f"{8 * to.itemsize}; the bits are reinterpreted, so the widths match")
    if DType.bool in (t.dtype, to) and to != t.dtype:
        raise TypeRuleError(f"bitcast {t.dtype} to {to}: a bool holds 0 or 1, not any bit pattern")
    return [TensorType(t.shape, to)]


def _bitcast_ref(xs, a):
    # the same bytes read as another type (little-endian, as numpy on every host we run on)
    return [np.array(xs[0], order="C").view(a["dtype"].numpy)]


register(OpDef("bitcast", Category.movement, _bitcast_type, _bitcast_ref, movement_cost,
               attrs=(AttrSpec("dtype", "dtype"),), arity=1, stored_inputs=True,
               doc="the same bits read as another dtype of the same width (cast converts values; "
                   "bitcast keeps the bit pattern)"))


# -- layout ---------------------------------------------------------------------------------

def _relayout_type(ins, a):
    (t,) = ins
    order, tile = tuple(a["order"]), tuple(a["tile"])
    if sorted(order) != list(range(t.rank)):
        raise TypeRuleError(f"relayout: order {list(order)} is not a permutation of rank {t.rank}")
    if len(tile) > t.rank:
        raise TypeRuleError(f"relayout: tile {list(tile)} has more dims than rank {t.rank}")
    default = order == tuple(range(t.rank)) and not tile
    return [TensorType(t.shape, t.dtype, None if default else Layout(order, tile))]


register(OpDef("relayout", Category.movement, _relayout_type, lambda xs, a: [xs[0]],
               movement_cost,
               attrs=(AttrSpec("order", "ints"), AttrSpec("tile", "ints", ())), arity=1,
               doc="changes only the physical layout (dims outermost to innermost, optional "
                   "tiling of the innermost dims); the values are the same"))
