"""Converters for views, shape changes, slicing, joining, gathers and tensor creation.

torch is lenient (``-1`` in shapes, negative dims, slice ends past the size); the IR is strict, so
these converters resolve every such argument, using torch's own result type where it helps.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import sympy
import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from fexplore.ir import DType, Value

from .registry import ConvertContext, converter, ir_dtype


def _axis(d: int, rank: int) -> int:
    return d % rank if rank else 0


def _reshape_to(ctx: ConvertContext, x, shape):
    shape = tuple(shape)
    if shape == x.type.shape:
        return x
    return ctx.emit("reshape", [x], {"shape": shape})


@converter("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
           "aten.view_copy.default", "aten.unsqueeze.default", "aten.squeeze.dim",
           "aten.squeeze.dims", "aten.squeeze.default", "aten.flatten.using_ints",
           "aten.unflatten.int", "aten.unsqueeze_copy.default", "aten.squeeze_copy.dim")
def _reshape(ctx):
    # torch already computed the result shape (with -1 resolved): use it.
    return _reshape_to(ctx, ctx.args[0], ctx.out_type().shape)


@converter("aten.view.dtype")
def _view_dtype(ctx):
    x, dt = ctx.args[0], ir_dtype(ctx.args[1])
    if dt == x.type.dtype:
        return x
    if dt.itemsize != x.type.dtype.itemsize or DType.bool in (dt, x.type.dtype):
        raise NotImplementedError("view(dtype) between types of different widths (it changes the "
                                  "last dim's size) or to or from bool")
    return ctx.emit("bitcast", [x], {"dtype": dt})


@converter("aten.permute.default", "aten.permute_copy.default")
def _permute(ctx):
    x = ctx.args[0]
    perm = tuple(_axis(p, x.type.rank) for p in ctx.args[1])
    if perm == tuple(range(x.type.rank)):
        return x
    return ctx.emit("permute", [x], {"perm": perm})


@converter("aten.transpose.int", "aten.t.default", "aten.transpose_copy.int", "aten.swapaxes.default")
def _transpose(ctx):
    x = ctx.args[0]
    r = x.type.rank
    if r < 2:
        return x
    d0, d1 = (ctx.args[1], ctx.args[2]) if len(ctx.args) > 2 else (0, 1)
    perm = list(range(r))
    a, b = _axis(d0, r), _axis(d1, r)
    perm[a], perm[b] = perm[b], perm[a]
    return ctx.emit("permute", [x], {"perm": tuple(perm)})


@converter("aten.expand.default", "aten.expand_copy.default", "aten.expand_as.default",
           "aten.broadcast_to.default")
def _expand(ctx):
    x = ctx.args[0]
    shape = ctx.out_type().shape
    if shape == x.type.shape:
        return x
    return ctx.emit("expand", [x], {"shape": shape})


@converter("aten.repeat.default")
def _repeat(ctx):
    x, reps = ctx.args[0], tuple(ctx.args[1])
    out = ctx.out_type().shape
    src = (1,) * (len(reps) - x.type.rank) + x.type.shape
    # repeat = interleave a new unit axis before each dim, expand it, then merge the pairs
    x = _reshape_to(ctx, x, tuple(d for s in src for d in (1, s)))
    x = ctx.emit("expand", [x], {"shape": tuple(d for r, s in zip(reps, src) for d in (r, s))})
    return _reshape_to(ctx, x, out)


@converter("aten.repeat_interleave.self_int")
def _repeat_interleave(ctx):
    x, reps = ctx.args[0], ctx.args[1]
    dim = ctx.kwargs.get("dim", ctx.arg(2))
    if dim is None:
        raise NotImplementedError("repeat_interleave without dim")
    return repeat_interleave(ctx, x, reps, _axis(dim, x.type.rank), ctx.out_type().shape)


def repeat_interleave(ctx, x, reps, ax: int, shape=None):
    """Each slice of ``x`` along ``ax`` repeated ``reps`` times in place (torch's
    repeat_interleave; a key/value head for each query head of its group): a size-1 axis after
    ``ax``, expanded, merged back. ``shape``: the result's, when known."""
    dims = tuple(x.type.shape)
    x = _reshape_to(ctx, x, dims[:ax + 1] + (1,) + dims[ax + 1:])
    x = ctx.emit("expand", [x], {"shape": dims[:ax + 1] + (reps,) + dims[ax + 1:]})
    return _reshape_to(ctx, x, shape if shape is not None else dims[:ax] + (dims[ax] * reps,) + dims[ax + 1:])


def _clamp_index(v, size):
    """torch's slice bound rules: negative counts from the end, then clamp to [0, size]. A
    symbolic bound counts from the end when it is negative at every size (XLM's x[:, -n:] with
    n the sequence length: start -seq is 0, where it was kept as -seq and the slice was empty at
    sizes the verification had not tried)."""
    if v is None:
        return None
    if isinstance(v, int):
        if v >= sys.maxsize:
            return size
        if v < 0:
            v = v + size if isinstance(size, int) else size + v
        if isinstance(size, int):
            return max(0, min(v, size))
        return max(0, v) if isinstance(v, int) else v
    if isinstance(v, sympy.Expr) and v.is_negative:   # -seq (x[:, -n:] with n the length)
        v = sympy.simplify(size + v)
        if v.is_negative:
            return 0
        return v if v.is_nonnegative else sympy.Max(0, v)
    return v


@converter("aten.slice.Tensor", "aten.slice_copy.Tensor")
def _slice(ctx):
    x = ctx.args[0]
    ax = _axis(ctx.arg(1, "dim", 0), x.type.rank)
    size = x.type.shape[ax]
    fx_start = ctx.node.args[2] if len(ctx.node.args) > 2 else ctx.node.kwargs.get("start")
    start_at_run_time = read_position(ctx, fx_start)
    if start_at_run_time is not None:
        return _slice_from_a_position_read_from_data(ctx, x, ax, size, start_at_run_time)
    start = _clamp_index(ctx.arg(2, "start", 0), size) or 0
    end = _clamp_index(ctx.arg(3, "end", sys.maxsize), size)
    step = ctx.arg(4, "step", 1)
    length = ctx.out_type().shape[ax]
    # torch knows the result length; state the end exactly (start + length*step, within size)
    end = _slice_end(start, length, step)
    if isinstance(end, sympy.Expr):
        end = sympy.simplify(end)
    if start == 0 and step == 1 and _same(end, size):
        return x
    return ctx.emit("slice", [x], {"axis": ax, "start": start, "end": end, "step": step})


def read_position(ctx, fx_arg) -> Value | None:
    """An index argument torch read from a tensor's contents (``.item()``: its unbacked ``u0``,
    or ``u0 + c``) as an IR value computed when the program runs: the i64 vector [u0 + c].
    None for an argument known from the shapes (an int or a size expression)."""
    v = fx_arg.meta.get("val") if isinstance(fx_arg, torch.fx.Node) else None
    if not isinstance(v, torch.SymInt) or not free_unbacked_symbols(v):
        return None
    expr = v.node.expr
    read = [u for u in expr.free_symbols if u in ctx.b.symbols.read_from]
    offset = expr - read[0] if len(read) == 1 and len(expr.free_symbols) == 1 else None
    if offset is None or not offset.is_Integer:
        raise NotImplementedError(f"an index read from a tensor's contents as {expr}: only a value "
                                  "read (.item()) plus a constant is taken at run time")
    item = ctx.b.symbols.read_from[read[0]]
    item = item if item.type.dtype == DType.i64 else ctx.emit("cast", [item], {"dtype": DType.i64})
    item = _reshape_to(ctx, item, (1,))
    return item if offset == 0 else ctx.emit("add", [item, ctx.value(int(offset))])


def _slice_from_a_position_read_from_data(ctx, x, ax, size, start):
    """x[start:start + length] along ``ax``, with ``start`` known when the program runs (a
    position read from a cache's counter) and the length known now (torch's trace asserts it):
    the positions start + arange(length) gathered, each counted from the end when negative."""
    length = ctx.out_type().shape[ax]
    step = ctx.arg(4, "step", 1)
    if step != 1 or not isinstance(length, int):
        raise NotImplementedError("a slice from a position read from a tensor's contents (.item()) "
                                  "with a step or a symbolic length")
    at = ctx.emit("add", [positions(ctx, length, DType.i64), start])
    at = ctx.emit("where", [ctx.emit("lt", [at, ctx.value(0)]), ctx.emit("add", [at, ctx.value(size)]), at])
    return ctx.emit("index", [x, at], {"axes": (ax,)})


def _slice_end(start, length, step):
    """The tight exclusive end of `length` elements from `start`, `step` apart: just past the last
    one, or `start` itself when there are none (x[1::3] of a size-1 axis: not 1 - 3 + 1)."""
    if step > 1 and not (isinstance(length, int) and length == 0):
        return start + (length - 1) * step + 1
    return start + length


def _same(a, b) -> bool:
    return a == b or (not isinstance(a, int) or not isinstance(b, int)) and \
        sympy.simplify(sympy.sympify(a) - sympy.sympify(b)) == 0


@converter("aten.select.int", "aten.select_copy.int")
def _select(ctx):
    x, dim, index = ctx.args[0], ctx.args[1], ctx.args[2]
    ax = _axis(dim, x.type.rank)
    fx_index = ctx.node.args[2] if len(ctx.node.args) > 2 else ctx.node.kwargs.get("index")
    at_run_time = read_position(ctx, fx_index)
    if at_run_time is not None:   # x[i] with i read from a tensor (.item()): a slice of one, then dropped
        size = x.type.shape[ax]
        at = ctx.emit("where", [ctx.emit("lt", [at_run_time, ctx.value(0)]),
                                ctx.emit("add", [at_run_time, ctx.value(size)]), at_run_time])
        one = ctx.emit("index", [x, at], {"axes": (ax,)})
        return _reshape_to(ctx, one, x.type.shape[:ax] + x.type.shape[ax + 1:])
    if isinstance(index, int) and index < 0:
        index = x.type.shape[ax] + index
    return ctx.emit("select", [x], {"axis": ax, "index": index})


@converter("aten.narrow.default", "aten.narrow_copy.default")
def _narrow(ctx):
    x, dim, start, length = ctx.args[:4]
    ax = _axis(dim, x.type.rank)
    if isinstance(start, int) and start < 0:
        start = x.type.shape[ax] + start
    return ctx.emit("slice", [x], {"axis": ax, "start": start, "end": start + length})


@converter("aten.unfold.default", "aten.unfold_copy.default")
def _unfold(ctx):
    """``x.unfold(dim, size, step)``: windows of `size` along `dim`, `step` apart, in place of it,
    each window's elements a new last axis: out[..., i, ..., j] = x[..., i * step + j, ...]. Built
    from slices, whichever of two ways takes fewer: per window position j a strided slice (every
    window's j-th element), or per window i a contiguous slice moved to the last axis."""
    x, dim, size, step = ctx.args[:4]
    rank = x.type.rank
    ax = _axis(dim, rank)
    length = x.type.shape[ax] if rank else 1
    if not all(isinstance(d, int) for d in (length, size, step)):
        raise NotImplementedError("unfold over a dynamic size")
    if rank == 0:   # a 0-d tensor is one window of one element
        return _reshape_to(ctx, x, (1,))
    n = (length - size) // step + 1
    shape = x.type.shape
    if size <= n:
        parts = [ctx.emit("slice", [x], {"axis": ax, "start": j, "end": j + (n - 1) * step + 1, "step": step})
                 for j in range(size)]
        parts = [_reshape_to(ctx, p, p.type.shape + (1,)) for p in parts]
        return parts[0] if size == 1 else ctx.emit("concat", parts, {"axis": rank})
    perm = tuple(i for i in range(rank) if i != ax) + (ax,)
    windows = []
    for i in range(n):
        w = ctx.emit("slice", [x], {"axis": ax, "start": i * step, "end": i * step + size})
        w = w if ax == rank - 1 else ctx.emit("permute", [w], {"perm": perm})
        windows.append(_reshape_to(ctx, w, shape[:ax] + (1,) + shape[ax + 1:] + (size,)))
    return windows[0] if n == 1 else ctx.emit("concat", windows, {"axis": ax})


@converter("aten.as_strided.default", "aten.as_strided_copy.default")
def _as_strided(ctx):
    """``x.as_strided(size, stride, offset)``: out[i] = storage[offset + sum(i_k * stride_k)], for
    an x whose elements are its storage from its own offset: contiguous, or a permutation of a
    contiguous tensor (Longformer's overlapping attention chunks are such views). A row gather from the
    flattened x: the trailing output axes that are contiguous blocks of x (the largest one all the
    other steps are whole multiples of) are rows, and a constant index of the other axes picks
    them, so the index holds one entry per row, not per element."""
    x, size, stride = ctx.args[:3]
    offset = ctx.arg(3, "storage_offset")
    given = ctx.node.args[0].meta.get("val")
    size, stride = tuple(size), tuple(stride)
    if not all(isinstance(d, int) for d in size + stride + tuple(x.type.shape)) or \
            not isinstance(offset, (int, type(None))) or not isinstance(given, torch.Tensor):
        raise NotImplementedError("as_strided over dynamic sizes")
    # the storage's elements in order: x itself, or x's axes put back in the order of their
    # strides when x is a permutation of a contiguous tensor (a transpose nobody copied)
    order = sorted(range(x.type.rank), key=lambda d: -given.stride(d))
    if not given.permute(order).is_contiguous():
        raise NotImplementedError("as_strided of a tensor whose elements are not its storage (a strided "
                                  "slice or an expand)")
    if order != sorted(order):
        x = ctx.emit("permute", [x], {"perm": tuple(order)})
    start = (given.storage_offset() if offset is None else offset) - given.storage_offset()
    numel = math.prod(x.type.shape)
    if math.prod(size) == 0:
        return ctx.b.literal(np.zeros(size, x.type.dtype.numpy), f"{ctx.node.name}.empty")
    places = start + sum(np.arange(n).reshape((1,) * k + (n,) + (1,) * (len(size) - k - 1)) * st
                         for k, (n, st) in enumerate(zip(size, stride))) if size else np.array(start)
    if np.min(places) < 0 or np.max(places) >= numel:
        raise NotImplementedError("as_strided reaching outside its input's elements")
    m = 0   # trailing axes that are a contiguous block of x
    for k in range(len(size) - 1, -1, -1):
        block = math.prod(size[k:])
        whole = start % block == 0 and numel % block == 0 and all(st % block == 0 for st in stride[:k])
        if stride[k] != math.prod(size[k + 1:]) or not whole:
            break
        m = len(size) - k
    block = math.prod(size[len(size) - m:]) if m else 1
    rows = ctx.b.literal((places.reshape(-1)[::block] // block).reshape(size[:len(size) - m]).astype(np.int64),
                         f"{ctx.node.name}.rows")
    table = _reshape_to(ctx, x, (numel // block, block))
    picked = ctx.emit("index", [table, rows], {"axes": (0,)})
    return _reshape_to(ctx, picked, size)


@converter("aten.cat.default", "aten.concat.default", "aten.concatenate.default")
def _cat(ctx):
    xs = [x for x in ctx.args[0] if not (x.type.rank == 1 and x.type.shape[0] == 0)]
    dim = ctx.arg(1, "dim", 0)
    if not xs:   # every operand an empty (0,): torch's legacy rule leaves an empty result
        out = ctx.out_type()
        return ctx.b.literal(np.zeros(out.shape, out.dtype.numpy), f"{ctx.node.name}.empty")
    if len(xs) == 1:
        return xs[0]
    return ctx.emit("concat", xs, {"axis": _axis(dim, xs[0].type.rank)})


@converter("aten.stack.default")
def _stack(ctx):
    xs = ctx.args[0]
    rank = xs[0].type.rank + 1
    ax = _axis(ctx.arg(1, "dim", 0), rank)
    parts = [_reshape_to(ctx, x, x.type.shape[:ax] + (1,) + x.type.shape[ax:]) for x in xs]
    return parts[0] if len(parts) == 1 else ctx.emit("concat", parts, {"axis": ax})


def _split_sizes(ctx, x, ax):
    return tuple(ctx.out_type(i).shape[ax] for i in range(len(ctx.meta)))


@converter("aten.split_with_sizes.default", "aten.split.Tensor", "aten.split.sizes",
           "aten.chunk.default", "aten.tensor_split.sections", "aten.split_with_sizes_copy.default")
def _split(ctx):
    x = ctx.args[0]
    dim = ctx.arg(2, "dim", 0)
    ax = _axis(dim, x.type.rank)
    sizes = _split_sizes(ctx, x, ax)
    if len(sizes) == 1:
        return (x,)
    return ctx.emit("split", [x], {"axis": ax, "sizes": sizes}, n_results=len(sizes))


@converter("aten.unbind.int", "aten.unbind_copy.int")
def _unbind(ctx):
    x = ctx.args[0]
    ax = _axis(ctx.arg(1, "dim", 0), x.type.rank)
    n = x.type.shape[ax]
    parts = ctx.emit("split", [x], {"axis": ax, "sizes": (1,) * n}, n_results=n) if n > 1 else (x,)
    return tuple(_reshape_to(ctx, p, p.type.shape[:ax] + p.type.shape[ax + 1:]) for p in parts)


def constant_pad_value(ctx):
    """The fill of constant_pad_nd / pad (None: zero); other pad modes are refused."""
    is_pad = str(ctx.node.target) == "aten.pad.default"
    mode = ctx.kwargs.get("mode", ctx.arg(2) if is_pad else "constant")
    if mode not in (None, "constant"):
        raise NotImplementedError(f"pad mode {mode!r}")
    return ctx.kwargs.get("value", ctx.arg(3 if is_pad else 2))


@converter("aten.constant_pad_nd.default", "aten.pad.default")
def _pad(ctx):
    x, pads = ctx.args[0], tuple(ctx.args[1])
    value = constant_pad_value(ctx)
    value = 0.0 if value is None else int(value) if isinstance(value, bool) else value   # a bool image's True: 1
    x, pads = _crop_negative_pads(ctx, x, pads)
    if not any(pads):
        return x
    return ctx.emit("pad", [x], {"pads": pads, "value": float(value) if isinstance(
        value, float) else value})


def _crop_negative_pads(ctx, x, pads):
    """torch reads a negative pad as a crop (nn.ZeroPad2d((0, 0, 1, -1)) shifts a sequence by
    one); the IR's pad is non-negative, so crops become slices first."""
    pads = list(pads)
    for i in range(len(pads) // 2):
        before, after = pads[2 * i], pads[2 * i + 1]
        if not (isinstance(before, int) and before < 0 or isinstance(after, int) and after < 0):
            continue
        ax = x.type.rank - 1 - i
        size = x.type.shape[ax]
        start = -before if before < 0 else 0
        end = size + after if after < 0 else size
        x = ctx.emit("slice", [x], {"axis": ax, "start": start, "end": end})
        pads[2 * i], pads[2 * i + 1] = max(before, 0), max(after, 0)
    return x, tuple(pads)


@converter("aten.gather.default")
def _gather(ctx):
    x, dim, idx = ctx.args[0], ctx.args[1], ctx.args[2]
    shape = idx.type.shape
    if all(isinstance(d, int) for d in shape) and 0 in shape:   # torch checks no ranks then: nothing to read
        return ctx.b.literal(np.zeros(shape, x.type.dtype.numpy), f"{ctx.node.name}.empty")
    if x.type.rank == 0 or idx.type.rank == 0:   # torch takes a 0-d tensor as one of one element
        x1 = _reshape_to(ctx, x, (1,)) if x.type.rank == 0 else x
        idx1 = _reshape_to(ctx, idx, (1,) * x1.type.rank) if idx.type.rank == 0 else idx
        out = ctx.emit("gather", [x1, idx1], {"axis": _axis(dim, x1.type.rank)})
        return _reshape_to(ctx, out, shape)
    return ctx.emit("gather", [x, idx], {"axis": _axis(dim, x.type.rank)})


def _advanced_indices(indices) -> tuple[tuple[int, ...], list]:
    """torch's index list (None for a whole axis) as the IR's (axes, index tensors)."""
    axes, idx = [], []
    for ax, t in enumerate(indices):
        if t is not None:
            if t.type.dtype == DType.bool:
                raise NotImplementedError("boolean-mask indexing (its result size depends on data)")
            axes.append(ax)
            idx.append(t)
    return tuple(axes), idx


@converter("aten.index.Tensor", "aten._unsafe_index.Tensor")
def _index(ctx):
    axes, idx = _advanced_indices(ctx.args[1])
    return ctx.emit("index", [ctx.args[0], *idx], {"axes": axes})


@converter("aten.index_select.default")
def _index_select(ctx):
    x, dim, idx = ctx.args[0], ctx.args[1], ctx.args[2]
    if idx.type.rank == 0:  # index_select keeps the axis: a 0-d index selects a slab of one
        idx = _reshape_to(ctx, idx, (1,))
    if x.type.rank == 0:  # a 0-d input is a vector of one here
        x = _reshape_to(ctx, x, (1,))
    y = ctx.emit("index", [x, idx], {"axes": (_axis(dim, x.type.rank),)})
    return _reshape_to(ctx, y, ctx.out_type().shape)


@converter("aten.diagonal.default", "aten.diagonal_copy.default")
def _diagonal(ctx):
    """The diagonal of dims (dim1, dim2), moved last: those two dims go last, then an index
    with constant row and column numbers picks the diagonal out of them."""
    x = ctx.args[0]
    offset, d1, d2 = ctx.arg(1, "offset", 0), ctx.arg(2, "dim1", 0), ctx.arg(3, "dim2", 1)
    r = x.type.rank
    d1, d2 = _axis(d1, r), _axis(d2, r)
    n1, n2 = x.type.shape[d1], x.type.shape[d2]
    if not (isinstance(n1, int) and isinstance(n2, int)):
        raise NotImplementedError("diagonal of symbolic dims")
    n = max(0, min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2))
    rows = np.arange(n) + max(0, -offset)
    cols = np.arange(n) + max(0, offset)
    perm = tuple(i for i in range(r) if i not in (d1, d2)) + (d1, d2)
    if perm != tuple(range(r)):
        x = ctx.emit("permute", [x], {"perm": perm})
    lit = ctx.b.literal
    return ctx.emit("index", [x, lit(rows.astype(np.int64), f"{ctx.node.name}.rows"),
                              lit(cols.astype(np.int64), f"{ctx.node.name}.cols")],
                    {"axes": (r - 2, r - 1)})


@converter("aten.embedding.default")
def _embedding(ctx):
    return ctx.emit("embedding", [ctx.args[0], ctx.args[1]])


# -- creation ---------------------------------------------------------------------------------

def _created_dtype(ctx, default=None):
    dt = ctx.kwargs.get("dtype")
    if dt is not None:
        return ir_dtype(dt)
    return ctx.out_type().dtype if default is None else default


def _fill(ctx, value):
    t = ctx.out_type()
    if isinstance(value, Value):  # a 0-d tensor as the fill value (full_like(x, t), fill(x, t))
        return ctx.emit("expand", [_cast_to(ctx, value, t.dtype)], {"shape": t.shape})
    if t.dtype == DType.bool and isinstance(value, (int, float)):
        value = bool(value)  # a bool tensor's fill reads true/false in the IR text
    elif isinstance(value, bool):
        value = int(value)
    if t.dtype.is_float and isinstance(value, int):
        value = float(value)
    return ctx.emit("full", [], {"shape": t.shape, "value": value, "dtype": t.dtype})


def _cast_to(ctx, x, dtype):
    return x if x.type.dtype == dtype else ctx.emit("cast", [x], {"dtype": dtype})


@converter("aten.full.default", "aten.new_full.default")
def _full(ctx):
    return _fill(ctx, ctx.args[1] if "new_full" not in str(ctx.node.target) else ctx.args[2])


@converter("aten.full_like.default")
def _full_like(ctx):
    return _fill(ctx, ctx.args[1])


@converter("aten.zeros.default", "aten.zeros_like.default", "aten.new_zeros.default")
def _zeros(ctx):
    return _fill(ctx, 0)


# torch leaves empty tensors' contents unspecified and a model writes them before reading (DeepSeek
# assembles its keys with new_empty and two slice copies); zeros are one valid content, and a
# deterministic one, so a read of an unwritten element shows as a mismatch against eager. Its
# memory format (channels_last, say) is a layout, which the layout stage decides.
@converter("aten.empty.memory_format", "aten.empty_like.default", "aten.new_empty.default",
           "aten.empty_strided.default", "aten.empty_permuted.default")
def _empty(ctx):
    return _fill(ctx, 0)


@converter("aten.ones.default", "aten.ones_like.default", "aten.new_ones.default")
def _ones(ctx):
    return _fill(ctx, 1)


@converter("aten.scalar_tensor.default")
def _scalar_tensor(ctx):
    return _fill(ctx, ctx.args[0])


@converter("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def _arange(ctx):
    a = list(ctx.args)
    if len(a) == 1:
        start, end, step = 0, a[0], 1
    else:
        start, end, step = a[0], a[1], (a[2] if len(a) > 2 else 1)
    dt = _created_dtype(ctx)
    if dt.is_float:
        start, end, step = (float(v) if isinstance(v, int) else v for v in (start, end, step))
    return ctx.emit("arange", [], {"start": start, "end": end, "step": step, "dtype": dt})


@converter("aten.tril_indices.default", "aten.triu_indices.default")
def _tri_indices(ctx):
    """(2, N) row and column numbers of a triangle: known at compile time, so a constant."""
    row, col = ctx.args[0], ctx.args[1]
    offset = ctx.arg(2, "offset", 0)
    if not (isinstance(row, int) and isinstance(col, int)):
        raise NotImplementedError("triangle indices of symbolic size")
    pick = np.tril_indices if "tril" in str(ctx.node.target) else np.triu_indices
    rows, cols = pick(row, offset, col)
    t = ctx.out_type()
    value = np.stack([rows, cols]).astype(t.dtype.numpy).reshape(t.shape)
    return ctx.b.literal(value, f"{ctx.node.name}.indices")


@converter("aten.tril.default")
def _tril(ctx):
    return ctx.emit("tril", [ctx.args[0]], {"diagonal": ctx.arg(1, "diagonal", 0)})


@converter("aten.triu.default")
def _triu(ctx):
    return ctx.emit("triu", [ctx.args[0]], {"diagonal": ctx.arg(1, "diagonal", 0)})


# -- flips, rolls, nearest upsampling: gathers with constant indices ------------------------------

def _gather_axis(ctx, x, axis: int, indices) -> Value:
    idx = ctx.b.literal(np.asarray(indices, dtype=np.int64), f"{ctx.node.name}.idx{axis}")
    return ctx.emit("index", [x, idx], {"axes": (axis,)})


@converter("aten.flip.default")
def _flip(ctx):
    x = ctx.args[0]
    for d in ctx.args[1]:
        ax = _axis(d, x.type.rank)
        size = x.type.shape[ax]
        if isinstance(size, int):
            x = _gather_axis(ctx, x, ax, np.arange(size - 1, -1, -1))
        else:   # size - 1 - arange(size): a constant again once the size is known
            idx = ctx.emit("sub", [ctx.value(size - 1), positions(ctx, size, DType.i64)])
            x = ctx.emit("index", [x, idx], {"axes": (ax,)})
    return x


@converter("aten.roll.default")
def _roll(ctx):
    x, shifts = ctx.args[0], list(ctx.args[1])
    dims = list(ctx.arg(2, "dims", []))
    if not dims:  # roll of the flattened tensor
        raise NotImplementedError("roll without dims")
    for s, d in zip(shifts, dims):
        ax = _axis(d, x.type.rank)
        size = x.type.shape[ax]
        if isinstance(size, int):
            x = _gather_axis(ctx, x, ax, (np.arange(size) - s) % size)
        else:   # (arange(size) - shift) mod size
            moved = ctx.emit("sub", [positions(ctx, size, DType.i64), ctx.value(int(s))])
            idx = ctx.emit("remainder", [moved, ctx.value(size)])
            x = ctx.emit("index", [x, idx], {"axes": (ax,)})
    return x


def positions(ctx, n, dtype: DType) -> Value:
    """arange(n) of ``dtype``: the positions along a dim of size ``n`` (an int or a symbol)."""
    zero, one = (0.0, 1.0) if dtype.is_float else (0, 1)
    return ctx.emit("arange", [], {"start": zero, "end": n, "step": one, "dtype": dtype})


@converter("aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default")
def _upsample_nearest(ctx):
    x = ctx.args[0]
    oh, ow = ctx.out_type().shape[-2:]
    h, w = x.type.shape[-2:]
    if str(ctx.node.target).endswith(".vec"):   # (input, output_size, scale_factors)
        scales = ctx.arg(2, "scale_factors") or (None, None)
    else:                                      # (input, output_size, scales_h, scales_w)
        scales = (ctx.arg(2, "scales_h"), ctx.arg(3, "scales_w"))
    if all(isinstance(d, int) for d in (oh, ow, h, w)):
        ih, iw = _nearest_source(h, oh, scales[0]), _nearest_source(w, ow, scales[1])
        rows = ctx.b.literal(ih.reshape(oh, 1).astype(np.int64), f"{ctx.node.name}.rows")
        cols = ctx.b.literal(iw.reshape(1, ow).astype(np.int64), f"{ctx.node.name}.cols")
    else:
        rows = ctx.emit("reshape", [_nearest_source_ir(ctx, h, oh, scales[0])], {"shape": (oh, 1)})
        cols = ctx.emit("reshape", [_nearest_source_ir(ctx, w, ow, scales[1])], {"shape": (1, ow)})
    return ctx.emit("index", [x, rows, cols], {"axes": (x.type.rank - 2, x.type.rank - 1)})


def _nearest_source_ir(ctx, n_in, n_out, scale) -> Value:
    """``_nearest_source`` in IR ops, for sizes known only at run time (they fold to the same
    constant once the sizes are). Without a scale, in / out in float32 gives the two special
    cases by itself (1.0 and 0.5 are exact); with one, they are chosen where the sizes say."""
    ratio = ctx.scalar(np.float32(1.0 / scale), DType.f32) if scale else \
        ctx.emit("div", [ctx.value(n_in, DType.f32), ctx.value(n_out, DType.f32)])
    src = ctx.emit("floor", [ctx.emit("mul", [positions(ctx, n_out, DType.f32), ratio])])
    src = ctx.emit("minimum", [ctx.emit("cast", [src], {"dtype": DType.i64}), ctx.value(n_in - 1)])
    if scale:
        i = positions(ctx, n_out, DType.i64)
        halves = ctx.emit("div", [i, ctx.value(2)], {"rounding": "floor"})
        doubled = ctx.emit("eq", [ctx.value(n_out), ctx.value(2 * n_in)])
        same = ctx.emit("eq", [ctx.value(n_out), ctx.value(n_in)])
        src = ctx.emit("where", [same, i, ctx.emit("where", [doubled, halves, src])])
    return src


def _nearest_source(n_in: int, n_out: int, scale) -> np.ndarray:
    """torch's nearest source index of each output position: floor(dst * s) in float32, where s is
    1 / the caller's scale factor when one is given (a scale of 1.7 on 4 pixels: 6 out, each source
    dst / 1.7, not dst * 4 / 6) and in / out otherwise; never past the last input. As torch, an
    output as long as the input, or twice as long, ignores the scale (a copy; dst // 2)."""
    if n_out == n_in:
        return np.arange(n_out)
    if n_out == 2 * n_in:
        return np.arange(n_out) // 2
    s = np.float32(1.0 / scale) if scale else np.float32(n_in) / np.float32(n_out)
    src = np.floor(np.arange(n_out, dtype=np.float32) * s).astype(np.int64)
    return np.minimum(src, n_in - 1)


# -- in-place updates, as value-semantics writes into a copy -----------------------------------

@converter("aten.index_put.default", "aten._unsafe_index_put.default")
def _index_put(ctx):
    x, values = ctx.args[0], ctx.args[2]
    if any(t is not None and t.type.dtype == DType.bool for t in ctx.args[1]):
        return _masked_put(ctx, x, list(ctx.args[1]), ctx.value(values),
                           bool(ctx.arg(3, "accumulate", False)))
    axes, idx = _advanced_indices(ctx.args[1])
    if values.type.dtype != x.type.dtype:
        values = ctx.emit("cast", [values], {"dtype": x.type.dtype})
    return ctx.emit("index_put", [x, values, *idx],
                    {"axes": axes, "accumulate": bool(ctx.arg(3, "accumulate", False))})


def _masked_put(ctx, x, indices, values, accumulate: bool):
    """x[mask] = values (or +=) with a boolean mask over x's leading axes: the result keeps x's
    shape whatever the mask holds (a VLM writing image features over its image tokens,
    ``x[x > 0] = 0``). Values broadcast to (number of true positions, *rest): one value for
    every position is a where; one row per position reads row cumsum(mask) - 1, in order."""
    if len(indices) != 1:
        raise NotImplementedError("a boolean mask beside other indices in an assignment")
    (mask,) = indices
    m, shape = mask.type.rank, x.type.shape
    rest = shape[m:]
    if values.type.dtype != x.type.dtype:
        values = ctx.emit("cast", [values], {"dtype": x.type.dtype})
    full_mask = _reshape_to(ctx, mask, mask.type.shape + (1,) * len(rest))
    if full_mask.type.shape != shape:
        full_mask = ctx.emit("expand", [full_mask], {"shape": shape})
    r = len(rest)
    if values.type.rank > r and values.type.shape[-r - 1] != 1:
        # one row per true position, in order: row k of (rows, *rest) goes to the k-th position
        rows = values.type.shape[-r - 1]
        values = _reshape_to(ctx, values, values.type.shape[-r - 1:])  # leading 1s only
        if values.type.shape != (rows,) + tuple(rest):
            values = ctx.emit("expand", [values], {"shape": (rows,) + tuple(rest)})
        n = 1
        for d in mask.type.shape:
            n = n * d
        k = ctx.emit("sub", [ctx.emit("cumsum", [_reshape_to(ctx, mask, (n,))], {"axis": 0}), 1])
        k = ctx.emit("clamp", [k], {"min": 0, "max": rows - 1}) if isinstance(rows, int) else \
            ctx.emit("maximum", [k, 0])
        values = _reshape_to(ctx, ctx.emit("index", [values, k], {"axes": (0,)}), shape)
    new = ctx.emit("add", [x, values]) if accumulate else values
    return ctx.emit("where", [full_mask, new, x])


@converter("aten.index_copy.default")
def _index_copy(ctx):
    x, dim, index, src = ctx.args[:4]
    ax = _axis(dim, x.type.rank)
    # out[..., index[i], ...] = src[..., i, ...] along ax: numpy's rule for a single advanced
    # index keeps the indexed block in place, so src already has the shape x[..., index, ...] has
    return ctx.emit("index_put", [x, src, index], {"axes": (ax,)})


@converter("aten.scatter.src", "aten.scatter.value", "aten.scatter_add.default",
           "aten.scatter.reduce", "aten.scatter.value_reduce", "aten.scatter_reduce.two")
def _scatter(ctx):
    x, dim, index, src = ctx.args[:4]
    target = str(ctx.node.target)
    reduce = "add" if target == "aten.scatter_add.default" else ctx.kwargs.get("reduce", ctx.arg(4))
    reduce = _SCATTER_REDUCE.get(reduce, reduce)
    if reduce not in ("none", "add", "mul", "amax", "amin", "mean"):
        raise NotImplementedError(f"scatter with reduce={reduce!r}")
    include_self = bool(ctx.kwargs.get("include_self", ctx.arg(5, default=True)))
    if not isinstance(src, Value):
        src = ctx.scalar(src, x.type.dtype)
    elif src.type.dtype != x.type.dtype:
        src = ctx.emit("cast", [src], {"dtype": x.type.dtype})
    attrs = {"reduce": reduce, "include_self": include_self}
    if x.type.rank == 0 or index.type.rank == 0:   # torch takes a 0-d tensor as one of one element
        one = (1,) * max(x.type.rank, 1)
        out = ctx.emit("scatter", [_reshape_to(ctx, x, one), _reshape_to(ctx, index, one) if index.type.rank == 0
                                   else index, _reshape_to(ctx, src, one) if src.type.rank == 0 else src],
                       {"axis": _axis(dim, len(one)), **attrs})
        return _reshape_to(ctx, out, x.type.shape)
    return ctx.emit("scatter", [x, index, src], {"axis": _axis(dim, x.type.rank), **attrs})


# torch's names (scatter's reduce=, scatter_reduce's) for the IR scatter's reductions
_SCATTER_REDUCE = {None: "none", "sum": "add", "add": "add", "multiply": "mul", "prod": "mul",
                   "amax": "amax", "amin": "amin", "mean": "mean"}


@converter("aten.slice_scatter.default")
def _slice_scatter(ctx):
    x, src = ctx.args[0], ctx.args[1]
    ax = _axis(ctx.arg(2, "dim", 0), x.type.rank)
    size = x.type.shape[ax]
    start = _clamp_index(ctx.arg(3, "start", 0), size) or 0
    end = _clamp_index(ctx.arg(4, "end", sys.maxsize), size)
    step = ctx.arg(5, "step", 1)
    end = _slice_end(start, src.type.shape[ax], step)
    return ctx.emit("slice_scatter", [x, src], {"axis": ax, "start": start, "end": end,
                                               "step": step})


@converter("aten.select_scatter.default")
def _select_scatter(ctx):
    x, src, dim, index = ctx.args[:4]
    ax = _axis(dim, x.type.rank)
    if isinstance(index, int) and index < 0:
        index = x.type.shape[ax] + index
    src = ctx.emit("reshape", [src], {"shape": src.type.shape[:ax] + (1,) + src.type.shape[ax:]})
    return ctx.emit("slice_scatter", [x, src], {"axis": ax, "start": index, "end": index + 1})


@converter("aten.masked_scatter.default")
def _masked_scatter(ctx):
    # out[mask] = source's elements in order (how a VLM writes image features into the
    # placeholder tokens): the k-th true position of the flattened mask takes source.flat[k],
    # i.e. a gather at cumsum(mask) - 1, kept only where the mask is true.
    x, mask, src = ctx.args[0], ctx.args[1], ctx.args[2]
    shape = ctx.out_type().shape   # the input and the mask broadcast together
    n = 1
    for d in shape:
        n = n * d
    if x.type.shape != shape:
        x = ctx.emit("expand", [_reshape_to(ctx, x, (1,) * (len(shape) - x.type.rank) + x.type.shape)],
                     {"shape": shape})
    if mask.type.shape != shape:
        mask = ctx.emit("expand", [_reshape_to(ctx, mask, (1,) * (len(shape) - mask.type.rank) + mask.type.shape)],
                        {"shape": shape})
    flat_mask = _reshape_to(ctx, mask, (n,))
    pos = ctx.emit("sub", [ctx.emit("cumsum", [ctx.emit("cast", [flat_mask], {"dtype": DType.i64})],
                                    {"axis": 0}), 1])
    m = 1
    for d in src.type.shape:
        m = m * d
    # positions before the first true element are -1 and past the source's end are out of range;
    # neither is kept by the where, but the gather must stay in bounds
    pos = ctx.emit("clamp", [pos], {"min": 0, "max": m - 1}) if isinstance(m, int) else \
        ctx.emit("maximum", [pos, 0])
    if src.type.dtype != x.type.dtype:
        src = ctx.emit("cast", [src], {"dtype": x.type.dtype})
    taken = ctx.emit("index", [_reshape_to(ctx, src, (m,)), pos], {"axes": (0,)})
    out = ctx.emit("where", [flat_mask, taken, _reshape_to(ctx, x, (n,))])
    return _reshape_to(ctx, out, shape)
