"""ONNX shape and data-movement ops: reshapes, transposes, slices, joins, gathers, scatters,
padding and tensor creation.

Shape-like operands (Reshape's shape, Slice's starts, Pad's pads...) must be known when
compiling (``ctx.const``); ONNX's lenient conventions (0 and -1 in shapes, negative axes and
indices, slice bounds past the end) are resolved here, since the IR's ops are strict.
"""

from __future__ import annotations

import numpy as np
import sympy

from fexplore.ir import DType
from fexplore.ir.ops.rules import broadcast_shapes

from ..convert.movement import _crop_negative_pads, _gather_axis, _reshape_to
from .registry import OnnxContext, onnx_converter

_INT_MAX = 2 ** 62


def axis(a: int, rank: int) -> int:
    if not -max(rank, 1) <= a < max(rank, 1):
        raise ValueError(f"axis {a} is out of range for rank {rank}")
    return a % rank if rank else 0


def product(dims):
    n = 1
    for d in dims:
        n = n * d
    return n


def reshape_target(shape_in, spec, allowzero: bool = False) -> tuple:
    """ONNX Reshape's shape: 0 copies the input's dim (unless allowzero), -1 takes the rest."""
    out = [shape_in[i] if (d == 0 and not allowzero) else d for i, d in enumerate(spec)]
    if -1 in out:
        k = out.index(-1)
        rest = product(d for i, d in enumerate(out) if i != k)
        total = product(shape_in)
        out[k] = total // rest if isinstance(total, int) and isinstance(rest, int) \
            else sympy.simplify(sympy.sympify(total) / rest)
    return tuple(int(d) if isinstance(d, (int, np.integer)) or (isinstance(d, sympy.Expr)
                                                                and d.is_Integer) else d
                 for d in out)


@onnx_converter("Reshape")
def _reshape(ctx: OnnxContext):
    x = ctx.input(0)
    spec = ctx.const_ints(1, "shape")
    return _reshape_to(ctx, x, reshape_target(x.type.shape, spec, bool(ctx.attr("allowzero", 0))))


@onnx_converter("Flatten")
def _flatten(ctx):
    x = ctx.input(0)
    ax = ctx.attr("axis", 1)
    ax = ax + x.type.rank if ax < 0 else ax   # axis in [-r, r]: the split point
    s = x.type.shape
    return _reshape_to(ctx, x, (product(s[:ax]), product(s[ax:])))


@onnx_converter("Squeeze")
def _squeeze(ctx):
    x = ctx.input(0)
    axes = ctx.const_ints(1, "axes")
    r = x.type.rank
    if axes is None:
        axes = [i for i, d in enumerate(x.type.shape) if d == 1]
    axes = {axis(a, r) for a in axes}
    for a in axes:
        if x.type.shape[a] != 1:
            raise ValueError(f"Squeeze of axis {a} of size {x.type.shape[a]}")
    return _reshape_to(ctx, x, tuple(d for i, d in enumerate(x.type.shape) if i not in axes))


@onnx_converter("Unsqueeze")
def _unsqueeze(ctx):
    x = ctx.input(0)
    axes = ctx.const_ints(1, "axes")
    r = x.type.rank + len(axes)
    axes = sorted(axis(a, r) for a in axes)
    shape = list(x.type.shape)
    for a in axes:
        shape.insert(a, 1)
    return _reshape_to(ctx, x, tuple(shape))


@onnx_converter("Transpose")
def _transpose(ctx):
    x = ctx.input(0)
    perm = ctx.attr("perm") or tuple(reversed(range(x.type.rank)))
    perm = tuple(int(p) % x.type.rank for p in perm)
    if perm == tuple(range(x.type.rank)):
        return x
    return ctx.emit("permute", [x], {"perm": perm})


@onnx_converter("Concat")
def _concat(ctx):
    xs = [x for x in ctx.inputs() if x is not None]
    ax = axis(ctx.attr("axis"), xs[0].type.rank)
    xs = [x for x in xs if x.type.shape[ax] != 0] or xs[:1]
    return xs[0] if len(xs) == 1 else ctx.emit("concat", xs, {"axis": ax})


@onnx_converter("Split")
def _split(ctx):
    x = ctx.input(0)
    ax = axis(ctx.attr("axis", 0), x.type.rank)
    size = x.type.shape[ax]
    sizes = ctx.const_ints(1, "split")
    n = len(ctx.onnx.output)
    if sizes is None:
        n = ctx.attr("num_outputs", n)
        if not isinstance(size, int):
            raise NotImplementedError("Split of a symbolic dim without sizes")
        chunk = -(-size // n)
        sizes = [chunk] * (size // chunk) + ([size % chunk] if size % chunk else [])
    if len(sizes) == 1:
        return (x,)
    return ctx.emit("split", [x], {"axis": ax, "sizes": tuple(sizes)}, n_results=len(sizes))


def _slice_bounds(start, end, step, size):
    """ONNX Slice's clamping for one axis, static size."""
    if start < 0:
        start += size
    if end < 0:
        end += size
    if step > 0:
        return min(max(start, 0), size), min(max(end, 0), size)
    return min(max(start, 0), size - 1), min(max(end, -1), size - 1)


@onnx_converter("Slice")
def _slice(ctx):
    x = ctx.input(0)
    starts, ends = ctx.const_ints(1, "starts"), ctx.const_ints(2, "ends")
    axes = ctx.const_ints(3, "axes") or tuple(range(len(starts)))
    steps = ctx.const_ints(4, "steps") or (1,) * len(starts)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = axis(a, x.type.rank)
        size = x.type.shape[a]
        if st == 0:
            raise ValueError("Slice step 0")
        symbolic_bound = isinstance(s, sympy.Expr) or isinstance(e, sympy.Expr)
        if isinstance(size, int) and symbolic_bound:
            # x[:T] of a static buffer with a symbolic T (a causal mask's corner): the bound is
            # taken as within the axis, as the exporter's own shape guards state
            if st != 1:
                raise NotImplementedError("a strided slice with symbolic bounds")
            s = (s + size if s < 0 else min(s, size)) if isinstance(s, int) else s
            e = (e + size if e < 0 else min(e, size)) if isinstance(e, int) else e
            x = ctx.emit("slice", [x], {"axis": a, "start": s, "end": e})
            continue
        if isinstance(size, int):
            s, e = _slice_bounds(s, e, st, size)
            if st > 0:
                e = max(e, s)
                if s == 0 and e == size and st == 1:
                    continue
                length = -(-(e - s) // st)
                x = ctx.emit("slice", [x], {"axis": a, "start": s,
                                            "end": s + max(length - 1, 0) * st + (1 if length else 0),
                                            "step": st})
            else:
                x = _gather_axis(ctx, x, a, np.arange(s, e, st))
            continue
        if st != 1:
            raise NotImplementedError("a strided slice of a symbolic dim")
        s = size + s if s < 0 else s
        e = size if e >= _INT_MAX // 2 else (size + e if e < 0 else e)
        x = ctx.emit("slice", [x], {"axis": a, "start": s, "end": e})
    return x


def nonneg_indices(ctx, idx, size):
    """Indices with negative ones counted from the end (the IR's gathers take 0..size-1)."""
    known = ctx.importer.lookup_known(ctx.onnx.input[1])
    if known is not None and isinstance(size, int):
        a = np.asarray(known).astype(np.int64)
        return ctx.b.literal(np.where(a < 0, a + size, a), f"{ctx._node_base()}.idx")
    return _wrap(ctx, idx, size)


@onnx_converter("Gather")
def _gather(ctx):
    x, idx = ctx.input(0), ctx.input(1)
    ax = axis(ctx.attr("axis", 0), x.type.rank)
    table = ctx.importer.lookup_known(ctx.onnx.input[0])
    if ax == 0 and x.type.rank == 2 and table is not None and x.type.dtype.is_float and \
            ctx.importer.lookup_known(ctx.onnx.input[1]) is None and \
            idx.type.dtype in (DType.i64, DType.i32):
        # rows of a weight table picked by run-time ids: an embedding lookup, the op the torch
        # door makes of nn.Embedding (its reference, np.take, counts negative ids from the end
        # as ONNX does)
        return ctx.emit("embedding", [x, idx])
    known = ctx.importer.lookup_known(ctx.onnx.input[1])
    size = x.type.shape[ax]
    if known is not None and np.asarray(known).ndim == 0 and known.dtype != object and \
            isinstance(size, int):
        # one known position: x[..., i, ...], the IR's select (as torch's x[:, 0] becomes)
        i = int(known)
        return ctx.emit("select", [x], {"axis": ax, "index": i + size if i < 0 else i})
    idx = nonneg_indices(ctx, idx, x.type.shape[ax])
    return ctx.emit("index", [x, idx], {"axes": (ax,)})


@onnx_converter("GatherElements")
def _gather_elements(ctx):
    x, idx = ctx.input(0), ctx.input(1)
    ax = axis(ctx.attr("axis", 0), x.type.rank)
    return ctx.emit("gather", [x, nonneg_indices(ctx, idx, x.type.shape[ax])], {"axis": ax})


@onnx_converter("GatherND")
def _gather_nd(ctx):
    """x[b..., idx[b..., i..., 0], ..., idx[b..., i..., k-1]]: the last index dim's k columns
    index x's axes after the ``batch_dims`` leading ones, which pair up with idx's (each batch
    axis indexed by its own position, an arange broadcast along the others)."""
    x, idx = ctx.input(0), ctx.input(1)
    b = ctx.attr("batch_dims", 0)
    k = idx.type.shape[-1]
    if not isinstance(k, int):
        raise NotImplementedError("GatherND with a symbolic index depth")
    batch = idx.type.shape[:b]
    if not all(isinstance(n, int) for n in batch):
        ctx.refuse(f"GatherND with batch_dims={b} over a symbolic dim")
    parts = ctx.emit("split", [idx], {"axis": idx.type.rank - 1, "sizes": (1,) * k},
                     n_results=k) if k > 1 else (idx,)
    cols = [_reshape_to(ctx, p, p.type.shape[:-1]) for p in parts]
    cols = [_wrap(ctx, c, x.type.shape[b + i]) for i, c in enumerate(cols)]
    depth = idx.type.rank - 1
    positions = [ctx.b.literal(np.arange(n, dtype=np.int64).reshape(
        (1,) * j + (n,) + (1,) * (depth - j - 1)), f"{ctx.node.name}.batch{j}")
        for j, n in enumerate(batch)]
    return ctx.emit("index", [x, *positions, *cols], {"axes": tuple(range(b + k))})


def _wrap(ctx, idx, size):
    """Run-time indices with negative ones counted from the end."""
    neg = ctx.emit("lt", [idx, ctx.scalar(0, idx.type.dtype)])
    return ctx.emit("where", [neg, ctx.emit("add", [idx, ctx.value(size, idx.type.dtype)]), idx])


_REDUCE = {"none": "none", "add": "add", "mul": "mul", "max": "amax", "min": "amin"}


@onnx_converter("ScatterElements")
def _scatter_elements(ctx):
    x, idx, src = ctx.input(0), ctx.input(1), ctx.input(2)
    ax = axis(ctx.attr("axis", 0), x.type.rank)
    reduce = _REDUCE[ctx.attr("reduction", "none")]
    return ctx.emit("scatter", [x, _wrap(ctx, idx, x.type.shape[ax]), src],
                    {"axis": ax, "reduce": reduce, "include_self": True})


@onnx_converter("ScatterND")
def _scatter_nd(ctx):
    x, idx, upd = ctx.input(0), ctx.input(1), ctx.input(2)
    reduction = ctx.attr("reduction", "none")
    if reduction not in ("none", "add"):
        return _scatter_nd_reduce(ctx, x, idx, upd, _REDUCE[reduction])
    k = idx.type.shape[-1]
    parts = ctx.emit("split", [idx], {"axis": idx.type.rank - 1, "sizes": (1,) * k},
                     n_results=k) if k > 1 else (idx,)
    cols = [_wrap(ctx, _reshape_to(ctx, p, p.type.shape[:-1]), x.type.shape[i])
            for i, p in enumerate(parts)]
    return ctx.emit("index_put", [x, upd, *cols], {"axes": tuple(range(k)),
                                                   "accumulate": reduction == "add"})


def _scatter_nd_reduce(ctx, x, idx, upd, reduce):
    """ScatterND with mul/max/min: the indexed leading dims flattened into one, each index
    tuple into one linear index, and a scatter along that axis with the reduction."""
    k = idx.type.shape[-1]
    lead, rest = x.type.shape[:k], x.type.shape[k:]
    if not all(isinstance(d, int) for d in lead):
        raise NotImplementedError("ScatterND over symbolic dims")
    strides = np.cumprod((1,) + lead[::-1][:-1])[::-1].astype(np.int64)
    lin = ctx.emit("sum", [ctx.emit("mul", [cast_int(ctx, idx),
                                            ctx.b.literal(strides, f"{ctx._node_base()}.strides")])],
                   {"axes": (idx.type.rank - 1,), "keepdim": False})
    m = product(lin.type.shape)
    flat = _reshape_to(ctx, x, (product(lead),) + rest)
    lin = _reshape_to(ctx, lin, (m,) + (1,) * len(rest))
    lin = ctx.emit("expand", [lin], {"shape": (m,) + rest}) if rest else lin
    upd = _reshape_to(ctx, upd, (m,) + rest)
    y = ctx.emit("scatter", [flat, lin, upd], {"axis": 0, "reduce": reduce, "include_self": True})
    return _reshape_to(ctx, y, x.type.shape)


@onnx_converter("ReverseSequence")
def _reverse_sequence(ctx):
    """Each batch row's first lens[b] steps reversed: a gather along the time axis with
    indices built from the lengths (known when compiling)."""
    x = ctx.input(0)
    lens = np.asarray(ctx.const(1, "sequence_lens")).astype(np.int64)
    t_ax, b_ax = ctx.attr("time_axis", 0), ctx.attr("batch_axis", 1)
    t_n, b_n = x.type.shape[t_ax], x.type.shape[b_ax]
    idx = np.tile(np.arange(t_n).reshape(t_n, 1), (1, b_n))
    for b, n in enumerate(lens):
        idx[:n, b] = np.arange(n - 1, -1, -1)
    if t_ax > b_ax:
        idx = idx.T
    shape = [1] * x.type.rank
    shape[t_ax], shape[b_ax] = t_n, b_n
    idx = np.broadcast_to(idx.reshape(shape), x.type.shape)
    return ctx.emit("gather", [x, ctx.b.literal(np.ascontiguousarray(idx), f"{ctx._node_base()}.rev")],
                    {"axis": t_ax})


@onnx_converter("TensorScatter", since=24)
def _tensor_scatter(ctx):
    """A KV-cache write: each batch row's update lands at its write index along the axis
    (wrapping around in circular mode), as a scatter with indices built from those positions."""
    cache, upd, where = ctx.input(0), ctx.input(1), ctx.input(2)
    r = cache.type.rank
    ax = axis(ctx.attr("axis", -2), r)
    length, new = cache.type.shape[ax], upd.type.shape[ax]
    shape = [1] * r
    shape[ax] = new
    steps = ctx.b.literal(np.arange(new, dtype=np.int64).reshape(shape), f"{ctx._node_base()}.steps")
    idx = steps
    if where is not None:
        start = _reshape_to(ctx, cast_int(ctx, where), (upd.type.shape[0],) + (1,) * (r - 1))
        idx = ctx.emit("add", [start, steps])
    if ctx.attr("mode", "linear") == "circular":
        idx = ctx.emit("remainder", [idx, ctx.scalar(length, DType.i64)])
    idx = ctx.emit("expand", [idx], {"shape": upd.type.shape})
    return ctx.emit("scatter", [cache, idx, upd], {"axis": ax, "reduce": "none", "include_self": True})


@onnx_converter("Expand")
def _expand(ctx):
    x = ctx.input(0)
    shape = ctx.const_ints(1, "shape")
    out = broadcast_shapes(x.type.shape, tuple(shape))
    if out == x.type.shape:
        return x
    return ctx.emit("expand", [x], {"shape": out})


@onnx_converter("Tile")
def _tile(ctx):
    x = ctx.input(0)
    reps = ctx.const_ints(1, "repeats")
    src = x.type.shape
    x = _reshape_to(ctx, x, tuple(d for s in src for d in (1, s)))
    x = ctx.emit("expand", [x], {"shape": tuple(d for r, s in zip(reps, src) for d in (r, s))})
    return _reshape_to(ctx, x, tuple(r * s for r, s in zip(reps, src)))


@onnx_converter("Pad")
def _pad(ctx):
    x = ctx.input(0)
    pads = ctx.const_ints(1, "pads")
    runtime_value = ctx.has_input(2) and ctx.importer.lookup_known(ctx.onnx.input[2]) is None \
        and ctx.onnx.input[2] not in ctx.importer.input_pos
    value = None if runtime_value else ctx.const(2, "constant_value")
    axes = ctx.const_ints(3, "axes")
    mode = ctx.attr("mode", "constant")
    r = x.type.rank
    axes = [axis(a, r) for a in axes] if axes is not None else list(range(r))
    n = len(axes)
    before = dict(zip(axes, pads[:n]))
    after = dict(zip(axes, pads[n:]))
    if mode != "constant":
        return _pad_by_gather(ctx, x, before, after, mode)
    # the IR's pad (torch's order): last axis first, (before, after)
    torch_pads = tuple(p for a in reversed(range(r)) for p in (before.get(a, 0), after.get(a, 0)))
    x, torch_pads = _crop_negative_pads(ctx, x, torch_pads)
    if not any(torch_pads):
        return x
    if runtime_value:  # a fill computed at run time: pad, then put it where the pad went
        inside = ctx.emit("full", [], {"shape": x.type.shape, "value": True, "dtype": DType.bool})
        inside = ctx.emit("pad", [inside], {"pads": torch_pads, "value": 0})
        fill = _reshape_to(ctx, ctx.input(2), ())
        return ctx.emit("where", [inside, ctx.emit("pad", [x], {"pads": torch_pads, "value": 0}),
                                  fill])
    v = 0 if value is None or np.asarray(value).size == 0 else np.asarray(value).reshape(-1)[0].item()
    v = int(v) if isinstance(v, bool) else v   # the pad op's value is a number
    return ctx.emit("pad", [x], {"pads": torch_pads, "value": v})


def _pad_by_gather(ctx, x, before, after, mode):
    """Reflect, edge and wrap padding: a gather of source positions per padded axis."""
    for a in sorted(before):
        b, e = before[a], after[a]
        if not (b or e):
            continue
        size = x.type.shape[a]
        if not isinstance(size, int):
            raise NotImplementedError(f"{mode} padding of a symbolic dim")
        pos = np.arange(-b, size + e)
        if mode == "edge":
            src = np.clip(pos, 0, size - 1)
        elif mode == "wrap":
            src = pos % size
        elif mode == "reflect":
            period = 2 * (size - 1) if size > 1 else 1
            m = np.abs(pos) % period
            src = np.where(m >= size, period - m, m)
        else:
            raise ValueError(f"Pad mode {mode!r}")
        x = _gather_axis(ctx, x, a, src)
    return x


@onnx_converter("ConstantOfShape")
def _constant_of_shape(ctx):
    shape = ctx.const_ints(0, "shape")
    value = ctx.attr("value")
    v = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    from fexplore.ir import DType as _D

    return ctx.emit("full", [], {"shape": tuple(shape), "value": v[0].item(),
                                 "dtype": _D.from_numpy(v.dtype)})


@onnx_converter("Range")
def _range(ctx):
    start, limit, delta = (np.asarray(ctx.const(i, "bound")).reshape(()).item() for i in range(3))
    dt = DType.from_numpy(np.asarray(ctx.const(0)).dtype) \
        if np.asarray(ctx.const(0)).dtype != object else DType.i64
    if any(isinstance(v, sympy.Expr) for v in (start, limit, delta)):
        # a symbolic length (torch.arange(T) over a dynamic T): the IR's arange takes it
        if delta != 1 or isinstance(start, sympy.Expr):
            raise NotImplementedError("Range with a symbolic step or start")
        return ctx.emit("arange", [], {"start": int(start), "end": limit, "step": 1, "dtype": dt})
    n = max(int(np.ceil((limit - start) / delta)), 0)
    return ctx.emit("arange", [], {"start": start, "end": start + n * delta, "step": delta,
                                   "dtype": dt}) if n else \
        ctx.emit("full", [], {"shape": (0,), "value": 0, "dtype": dt})


@onnx_converter("Trilu")
def _trilu(ctx):
    x = ctx.input(0)
    k = ctx.const_ints(1, "k")
    return ctx.emit("triu" if ctx.attr("upper", 1) else "tril", [x],
                    {"diagonal": k[0] if k else 0})


@onnx_converter("EyeLike")
def _eye_like(ctx):
    x = ctx.input(0)
    from .importer import onnx_dtype

    dt = onnx_dtype(ctx.attr("dtype")) if ctx.has_attr("dtype") else x.type.dtype
    n, m = x.type.shape
    eye = np.eye(n, m, ctx.attr("k", 0), dtype=dt.numpy)
    return ctx.b.literal(eye, f"{ctx._node_base()}.eye")


@onnx_converter("DepthToSpace")
def _depth_to_space(ctx):
    x = ctx.input(0)
    bs = ctx.attr("blocksize")
    n, c, h, w = x.type.shape
    if ctx.attr("mode", "DCR") == "DCR":
        y = _reshape_to(ctx, x, (n, bs, bs, c // (bs * bs), h, w))
        y = ctx.emit("permute", [y], {"perm": (0, 3, 4, 1, 5, 2)})
    else:
        y = _reshape_to(ctx, x, (n, c // (bs * bs), bs, bs, h, w))
        y = ctx.emit("permute", [y], {"perm": (0, 1, 4, 2, 5, 3)})
    return _reshape_to(ctx, y, (n, c // (bs * bs), h * bs, w * bs))


@onnx_converter("SpaceToDepth")
def _space_to_depth(ctx):
    x = ctx.input(0)
    bs = ctx.attr("blocksize")
    n, c, h, w = x.type.shape
    y = _reshape_to(ctx, x, (n, c, h // bs, bs, w // bs, bs))
    crd = ctx.attr("mode", "DCR") == "CRD"
    y = ctx.emit("permute", [y], {"perm": (0, 1, 3, 5, 2, 4) if crd else (0, 3, 5, 1, 2, 4)})
    return _reshape_to(ctx, y, (n, c * bs * bs, h // bs, w // bs))


@onnx_converter("OneHot")
def _one_hot(ctx):
    idx, values = ctx.input(0), ctx.input(2)
    depth = int(np.asarray(ctx.const(1, "depth")).reshape(-1)[0])
    r = idx.type.rank + 1
    ax = axis(ctx.attr("axis", -1), r)
    idx = cast_int(ctx, idx)
    idx = ctx.emit("where", [ctx.emit("lt", [idx, ctx.scalar(0, DType.i64)]),
                             ctx.emit("add", [idx, ctx.scalar(depth, DType.i64)]), idx])
    shape = list(idx.type.shape)
    shape.insert(ax, 1)
    idx = _reshape_to(ctx, idx, tuple(shape))
    ar_shape = [1] * r
    ar_shape[ax] = depth
    ar = ctx.b.literal(np.arange(depth, dtype=np.int64).reshape(ar_shape), f"{ctx._node_base()}.ar")
    hot = ctx.emit("eq", [idx, ar])
    off = ctx.emit("select", [values], {"axis": 0, "index": 0})
    on = ctx.emit("select", [values], {"axis": 0, "index": 1})
    return ctx.emit("where", [hot, on, off])


def cast_int(ctx, x):
    from .elementwise import cast

    return cast(ctx, x, DType.i64)
