"""The semantic layer: every builtin comes through here, is checked, and is recorded as an op.

One checker for all back ends. Shapes, named axes, dtypes, memory spaces, PEs, DRAM bounds and
initialization are checked at trace time, on the author's line; the interpreter and the lowering
never check anything and never see an ill-formed op. This file holds the operand checks every op
shares, DRAM and DMA, tiles made from nothing, and the end of a trace; `compute.py` the tensor and
vector units. (SRAM capacity needs the whole trace, so `plan.py` checks it when tracing ends.)
"""

from __future__ import annotations

import math
from numbers import Number

import numpy as np

from fexplore.lang import ir
from fexplore.lang.errors import (AxisError, DTypeError, MemorySpaceError,
                                  OutOfBoundsError, OutputError, ShapeError, TraceError,
                                  UninitializedReadError)
from fexplore.lang.tracer import Tracer, current, user_loc
from fexplore.lang.types import ACC, SRAM, DType, TensorSpec, as_dtype, f32, i32, shape_text
from fexplore.lang.values import DMA, DramSlice, DramTensor, Tile
from fexplore.npu.commands import SCATTER_REDUCES, compose_index


def describe(x) -> str:
    if isinstance(x, Tile):
        return f"tile {x.name!r} ({x.space} {x.dtype}[{shape_text(x.shape, x.axes)}])"
    if isinstance(x, DramTensor):
        return f"DRAM tensor {x.name!r} ({x.dtype}[{shape_text(x.shape, x.axes)}])"
    if isinstance(x, DramSlice):
        return f"DRAM box {x} ({x.dtype}[{shape_text(x.shape, x.axes)}])"
    return f"{type(x).__name__} {x!r}"


# ---- operands -----------------------------------------------------------------------------------
def operand_tile(tr: Tracer, x, what: str, loc, *, spaces=(SRAM, ACC), read: bool = True) -> Tile:
    """Check that `x` is a tile of this trace, on the current PE, in one of `spaces`, and (if it is
    read) written before."""
    if isinstance(x, (DramTensor, DramSlice)):
        raise MemorySpaceError(
            f"{what} needs a tile in {' or '.join(s.upper() for s in spaces)}, not a DRAM value",
            expected=f"a tile in {' or '.join(spaces)}", given=describe(x), loc=loc,
            hint="DRAM is reached only by DMA: load the box into SRAM first, e.g. "
                 "t = fl.load(A[rows, cols])")
    if not isinstance(x, Tile):
        raise TraceError(f"{what} needs a tile", expected="a tile", given=describe(x), loc=loc)
    if x.trace is not tr.trace:
        raise TraceError(f"{what}: tile {x.name!r} belongs to another trace of a kernel",
                         expected="a tile made in this run of the kernel", given=describe(x), loc=loc,
                         hint="tiles live only while their kernel is traced; do not keep them across calls")
    if x.space not in spaces:
        hint = ("the tensor unit cannot read its accumulator: move the tile to SRAM on the vector unit "
                "first, e.g. p = s.astype(fl.bf16)" if x.space == ACC else
                "make an accumulator with fl.contract(..., acc=None) or fl.zeros(shape, space=fl.ACC)")
        raise MemorySpaceError(f"{what} needs a tile in {' or '.join(s.upper() for s in spaces)}",
                               expected=f"space {' or '.join(spaces)}", given=describe(x), loc=loc, hint=hint)
    if x.pe != tr.pe:
        raise MemorySpaceError(
            f"{what}: tile {x.name!r} lives in the SRAM of PE {x.pe}, but this code runs on PE {tr.pe}",
            expected=f"a tile on PE {tr.pe}", given=describe(x) + f" on PE {x.pe}", loc=loc,
            hint="each PE has its own SRAM: load the data inside the fl.parallel loop that uses it")
    if read and not x.storage.written:
        raise UninitializedReadError(
            f"{what} reads tile {x.name!r} before anything was written to it",
            expected="a tile that was loaded (fl.load), computed, or filled (fl.zeros / fl.full)",
            given=f"tile {x.name!r}, made by {x.origin}, never written", loc=loc,
            hint="fresh SRAM holds garbage (the interpreter fills it with NaN to show it)")
    return x


def destination_tile(tr: Tracer, out, what: str, loc, shape, *, spaces=(SRAM, ACC)) -> Tile:
    """`out=` / `into=`: a tile of this trace and PE of exactly `shape` (it is written, not read)."""
    t = operand_tile(tr, out, what, loc, spaces=spaces, read=False)
    if t.shape != tuple(shape):
        raise ShapeError(f"{what}: the result does not fit the destination tile {t.name!r}",
                         expected=f"a destination of shape {tuple(shape)}", given=describe(t), loc=loc)
    return t


def mark_written(t: Tile) -> Tile:
    t.storage.written = True   # a write into a slice writes its base
    return t


def tile_value(t: Tile):
    tr = current("Tile.numpy")
    if tr.interp is None:
        raise TraceError("a tile has a value only when the numpy interpreter runs the kernel",
                         expected="a kernel called on arrays, e.g. k(a, b)",
                         given="tile.numpy() while tracing for the simulator (values are not computed)",
                         loc=tr.where()[0], hint="use the interpreter to look at values: k(a, b)")
    operand_tile(tr, t, "Tile.numpy", tr.where()[0])
    return tr.interp.value(t).copy()


def no_value(t: Tile, how: str):
    raise TraceError(
        f"tile {t.name!r} was {how}, but tiles have no value while the kernel is traced",
        expected="Python control flow on trace-time values only (ints, shapes, loop indices)",
        given=describe(t), loc=user_loc(),
        hint="pick values on the vector unit with fl.where(mask, a, b); loop bounds come from shapes")


def sram_slice(t: Tile, index) -> Tile:
    """``t[...]``: a view of a box of tile `t` (ints, and slices with a positive step), read and
    written in place. A view of a view is a view of the first tile; the view's axes are the kept
    axes' names."""
    tr = current("tile[...]")
    loc, site = tr.where()
    operand_tile(tr, t, f"slicing tile {t.name!r}", loc)
    offsets, sizes, kept, steps = _box_index(t.name, t.shape, t.axes, index, loc, stepped=True)
    own = [slice(o, o + (n - 1) * st + 1, st) if k else o for o, n, k, st in zip(offsets, sizes, kept, steps)]
    base, at = (t, tuple(own)) if t.base is None else (t.base, compose_index(t.index, own))
    shape = tuple(n for n, k in zip(sizes, kept) if k)
    axes = tuple(a for a, k in zip(t.axes, kept) if k)
    view = Tile(tr.trace, len(tr.trace.tiles), shape, t.dtype, axes, t.space, t.pe, base.name, loc, base.site,
                base.stamps, f"a slice of {base.origin}", base=base, index=at)
    view.written = True   # reads are checked against the base (operand_tile)
    tr.trace.tiles.append(view)
    return view


# ---- DRAM -----------------------------------------------------------------------------------------
def dram_slice(tensor: DramTensor, index) -> DramSlice:
    tr = current("DramTensor[...]")
    loc = tr.where()[0]
    if tensor.trace is not tr.trace:
        raise TraceError(f"DRAM tensor {tensor.name!r} belongs to another trace", given=describe(tensor), loc=loc)
    offsets, sizes, kept = _box_index(tensor.name, tensor.shape, tensor.axes, index, loc)
    return DramSlice(tensor, offsets, sizes, kept)


def _box_index(name: str, shape, axes, index, loc, *, stepped: bool = False):
    """Per dim of `shape`: the offset, the extent, whether the dim is kept (a slice) or dropped (an
    int) by `index`, numpy's basic indexing; trailing dims are whole. DMA boxes have unit stride;
    with `stepped` (a tile's slice, read in SRAM) a slice may step, and its steps come back too."""
    if not isinstance(index, tuple):
        index = (index,)
    if len(index) > len(shape):
        raise OutOfBoundsError(f"{name} has {len(shape)} axes but is indexed with {len(index)}",
                               expected=f"at most {len(shape)} indices ({', '.join(map(str, axes))})",
                               given=f"{len(index)} indices", loc=loc)
    offsets, sizes, kept, steps = [], [], [], []
    for dim in range(len(shape)):
        ix = index[dim] if dim < len(index) else slice(None)
        n = shape[dim]
        axis = axes[dim] or f"dim {dim}"
        if isinstance(ix, Tile):
            raise TraceError(f"{name} is indexed by tile {ix.name!r}: boxes are fixed at trace time",
                             expected="ints or slices of ints", given=describe(ix), loc=loc)
        if isinstance(ix, slice):
            step = _int_or(ix.step, 1, loc)
            if step != 1 and not (stepped and step > 1):
                raise OutOfBoundsError(f"{name}: a slice has a positive step along {axis}" if stepped else
                                       f"{name}: a DMA box has unit stride along {axis}",
                                       expected="a slice with step 1" if not stepped else "a step of 1 or more",
                                       given=f"step {ix.step}", loc=loc,
                                       hint="a DMA moves unit-stride boxes: load the box, then slice the tile "
                                            "with a step" if not stepped else None)
            start, stop = _int_or(ix.start, 0, loc), _int_or(ix.stop, n, loc)
            start, stop = start + n if start < 0 else start, stop + n if stop < 0 else stop
            stop = min(stop, n) if stepped and step > 1 else stop   # numpy clips a stepped slice's end
            if not 0 <= start < stop <= n:
                raise OutOfBoundsError(
                    f"{name}: the box {start}:{stop} leaves axis {axis} (size {n})",
                    expected=f"0 <= start < stop <= {n} along {axis} (dim {dim})",
                    given=f"{ix.start}:{ix.stop}" + (f" (= {start}:{stop})" if (start, stop) !=
                                                      (ix.start, ix.stop) else ""), loc=loc)
            offsets.append(start), sizes.append(len(range(start, stop, step))), kept.append(True)
            steps.append(step)
        elif isinstance(ix, (int, np.integer)) and not isinstance(ix, bool):
            i = int(ix) + n if ix < 0 else int(ix)
            if not 0 <= i < n:
                raise OutOfBoundsError(f"{name}: index {ix} is outside axis {axis} (size {n})",
                                       expected=f"-{n} <= index < {n} along {axis} (dim {dim})",
                                       given=f"index {ix}", loc=loc)
            offsets.append(i), sizes.append(1), kept.append(False), steps.append(1)
        else:
            raise TraceError(f"{name} indexed with {ix!r}", expected="ints and slices",
                             given=describe(ix), loc=loc, hint="fl.tiles(n, size) gives slices that tile an axis")
    return (offsets, sizes, kept, steps) if stepped else (offsets, sizes, kept)


def _int_or(v, default: int, loc) -> int:
    if v is None:
        return default
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v)
    raise TraceError("a slice bound is not an int", expected="int slice bounds", given=describe(v), loc=loc)


def _as_box(x, what: str, loc) -> DramSlice:
    if isinstance(x, DramTensor):
        return x.full()
    if isinstance(x, DramSlice):
        return x
    if isinstance(x, Tile):
        raise MemorySpaceError(f"{what} moves data between DRAM and SRAM; this side must be DRAM",
                               expected="a DRAM tensor or a box of one, e.g. X[rows, :]", given=describe(x),
                               loc=loc, hint="a tile is already in SRAM: use it directly")
    raise TraceError(f"{what} needs a DRAM tensor or a box of one", given=describe(x), loc=loc)


def output(spec, dtype=None, *, axes=None, name=None, kind="output", init=None) -> DramTensor:
    tr = current("output" if kind == "output" else "scratch")
    loc, site = tr.where()
    if isinstance(spec, TensorSpec):
        try:
            shape = spec.resolve(tr.trace.axes)
        except KeyError as e:
            raise AxisError(f"fl.{kind}: axis {e.args[0]!r} is not bound by any parameter",
                            expected=f"axes among {sorted(tr.trace.axes)} (or an int size)",
                            given=repr(spec), loc=loc) from None
        dt = spec.dtype or (as_dtype(dtype) if dtype is not None else None)
        axes = spec.axes
        if dt is None:
            raise DTypeError(f"fl.{kind}: no dtype", expected="fl.bf16['M', 'N'] or a dtype= argument",
                             given=repr(spec), loc=loc)
    else:
        shape = parse_shape(spec, f"fl.{kind}", loc)
        dt = parse_dtype(dtype if dtype is not None else f32, f"fl.{kind}", loc)
        axes = parse_axes(axes, len(shape), f"fl.{kind}", loc)
    name = name or tr.assigned_name(site, f"out{len(tr.trace.outputs)}")
    taken = {t.name for t in tr.trace.tensors}
    base, k = name, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    if init is not None:
        _check_initial(tr, init, shape, dt, loc)
    t = DramTensor(tr.trace, name, shape, dt, axes, kind, loc)
    tr.trace.tensors.append(t)
    tr.coverage[name] = np.zeros(shape, dtype=bool)
    if init is not None:
        tr.trace.initial[name] = (init.name, _initial_copy(tr, t, init, loc, site))
    return t


def _check_initial(tr: Tracer, init, shape, dt, loc) -> None:
    """`fl.output(init=)` takes a whole parameter of this kernel with the output's shape and dtype."""
    if not isinstance(init, DramTensor) or init.trace is not tr.trace or init.kind != "input":
        raise OutputError("fl.output(init=) takes a parameter of the kernel, whole",
                          expected="a DRAM tensor the kernel was called with, e.g. init=cache",
                          given=describe(init), loc=loc,
                          hint="to start from part of a parameter, declare the output and store that part")
    if tuple(init.shape) != tuple(shape) or init.dtype != dt:
        raise ShapeError(f"fl.output(init={init.name}): the output starts as {init.name}, so it has its shape "
                         "and dtype",
                         expected=f"{dt}[{shape_text(shape)}] (the output declared)", given=describe(init),
                         loc=loc, hint=f"declare the output as {init.dtype}[{shape_text(init.shape)}]")


# A block of the initial copy: at most this share of a PE's SRAM (the load's buffer, reused by
# the next block on the PE: its DMA engine runs the loads and stores in order anyway), and cut
# smaller to give every PE some only while blocks keep this many bytes: a smaller one is mostly
# its DMA start-up, and a buffer on every PE for a few bytes fragments each PE's SRAM.
_INITIAL_BLOCK_SHARE = 16
_INITIAL_BLOCK_MIN_BYTES = 64 << 10


def _initial_copy(tr: Tracer, out: DramTensor, src: DramTensor, loc, site) -> list[int]:
    """Record the copy of `src` into `out`, the ops' indices returned: blocks of single indices
    of the leading axes, a run of one axis and the axes after it whole, as big as fit the block
    budget but enough of them for every PE where they stay big enough; dealt to the PEs round
    robin."""
    shape, item = out.shape, out.dtype.itemsize
    if 0 in shape:
        return []
    pes, budget = tr.target.num_pes, max(item, tr.target.sram_bytes_per_pe // _INITIAL_BLOCK_SHARE)
    if shape:
        # the first axis the rest of which fits a block (past leading axes of size 1: there is
        # nothing of theirs to cut)
        axis = next((a for a in range(len(shape)) if shape[a] > 1 and math.prod(shape[a + 1:]) * item <= budget),
                    len(shape) - 1)
        run = max(1, min(shape[axis], budget // (math.prod(shape[axis + 1:]) * item)))
        row = math.prod(shape[axis + 1:]) * item
        while run > 1 and math.prod(shape[:axis]) * -(-shape[axis] // run) < pes and \
                -(-run // 2) * row >= min(_INITIAL_BLOCK_MIN_BYTES, budget):
            run = -(-run // 2)
        blocks = [lead + (slice(s, min(s + run, shape[axis])),)
                  for lead in np.ndindex(*shape[:axis]) for s in range(0, shape[axis], run)]
    else:
        blocks = [()]
    ops, pe = [], tr.pe
    name = f"{out.name.lower()}_initial"
    for i, index in enumerate(blocks):
        tr.pe = i % pes
        box, dst = dram_slice(src, index), dram_slice(out, index)
        t = tr.new_tile(box.shape, box.dtype, box.axes, SRAM, loc=loc, site=site, name=name,
                        origin=f"fl.output(init={src.name}) at line {loc.line if loc else '?'}")
        ops.append(tr.record(ir.Load(t, box, tr.pe, loc)).index)
        mark_written(t)
        ops.append(tr.record(ir.Store(dst, t, tr.pe, loc)).index)
    tr.pe = pe
    tr.coverage[out.name][...] = True
    return ops


# ---- DMA ------------------------------------------------------------------------------------------
def load(src, into=None) -> Tile:
    tr = current("load")
    loc, site = tr.where()
    box = _as_box(src, "fl.load", loc)
    if box.tensor.trace is not tr.trace:
        raise TraceError("fl.load from a DRAM tensor of another trace", given=describe(box), loc=loc)
    mask = tr.coverage.get(box.tensor.name)
    if mask is not None and not mask[box.slices].all():
        raise UninitializedReadError(
            f"fl.load reads {box} before all of it was stored",
            expected=f"a box of {box.tensor.kind} {box.tensor.name!r} that earlier stores covered",
            given=f"{int((~mask[box.slices]).sum())} of {mask[box.slices].size} elements never stored",
            loc=loc, hint="store the data first (outputs and scratch start out uninitialized)")
    if into is None:
        dst = tr.new_tile(box.shape, box.dtype, box.axes, SRAM, loc=loc, site=site,
                          name=tr.assigned_name(site, box.tensor.name.lower()),
                          origin=f"fl.load at line {loc.line if loc else '?'}")
    else:
        dst = destination_tile(tr, into, "fl.load(into=)", loc, box.shape, spaces=(SRAM,))
        if dst.dtype != box.dtype:
            raise DTypeError("fl.load(into=): DMA copies bytes, so the tile's dtype must be the tensor's",
                             expected=f"a {box.dtype} tile", given=describe(dst), loc=loc,
                             hint="load into a tile of the tensor's dtype, then cast it: t.astype(...)")
    tr.record(ir.Load(dst, box, tr.pe, loc))
    return mark_written(dst)


def store(dst, src) -> DMA:
    tr = current("store")
    loc, _ = tr.where()
    box = _as_box(dst, "fl.store", loc)
    if box.tensor.kind == "input":
        raise OutputError(f"fl.store into parameter {box.tensor.name!r}: parameters are read-only",
                          expected="a box of a tensor made with fl.output(...) or fl.scratch(...)",
                          given=describe(box), loc=loc, hint="declare an output: C = fl.output(fl.f32['M', 'N'])")
    t = operand_tile(tr, src, "fl.store", loc)
    if t.shape != box.shape:
        raise ShapeError(f"fl.store: the tile does not fit the box {box}",
                         expected=f"a tile of shape {box.shape} (the box's)", given=describe(t), loc=loc,
                         hint="store the tile into a box of its own shape")
    if t.dtype != box.dtype:
        raise DTypeError(f"fl.store: DMA copies bytes, so the tile's dtype must be {box.tensor.name}'s",
                         expected=f"a {box.dtype} tile", given=describe(t), loc=loc,
                         hint=f"cast it first: fl.store(..., {t.name}.astype(fl.{box.dtype}))")
    op = tr.record(ir.Store(box, t, tr.pe, loc))
    tr.coverage[box.tensor.name][box.slices] = True
    return DMA(tr.trace, op)


def _index_axis(x, axis, ndim: int, axes, what: str, loc) -> int:
    """An axis given as an int (negative counts from the end) or as a named axis, checked."""
    if isinstance(axis, str) and axis in axes:
        return axes.index(axis)
    if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool) and -ndim <= axis < ndim:
        return int(axis) % ndim
    raise AxisError(f"{what}: axis {axis!r} is not an axis of {describe(x)}",
                    expected=f"an int in [-{ndim}, {ndim}) or one of the names {[a for a in axes if a]}",
                    given=f"axis={axis!r}", loc=loc)


def _index_tiles(tr: Tracer, idx, what: str, loc) -> tuple[Tile, ...]:
    """One index tile, or a tuple of them of one shape (picking along consecutive axes)."""
    tiles = tuple(idx) if isinstance(idx, (tuple, list)) else (idx,)
    if not tiles:
        raise TraceError(f"{what}: no index tile", given="()", loc=loc)
    for x in tiles:
        t = operand_tile(tr, x, f"{what} (its index)", loc, spaces=(SRAM,))
        if t.dtype not in ("i32", "i64"):
            raise DTypeError(f"{what}: the index tile holds {t.dtype}, not integers",
                             expected="an i32 or i64 tile of row numbers", given=describe(t), loc=loc,
                             hint="load the indices from an integer tensor (an i64 parameter loads as i64)")
        if t.shape != tiles[0].shape:
            raise ShapeError(f"{what}: index tiles of different shapes", expected=f"every index of shape "
                             f"{tiles[0].shape}", given=describe(t), loc=loc,
                             hint="broadcast them to one shape first: fl.broadcast_to(i, shape)")
    return tiles


def _index_axes(box: DramSlice, idx: tuple, axis, mode: str, what: str, loc) -> int:
    """The first of the consecutive box axes `idx` picks along (`axis`: one axis, or a tuple of them)."""
    k = len(idx)
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    first = _index_axis(box, axes[0], len(box.shape), box.axes, what, loc)
    picked = tuple(_index_axis(box, a, len(box.shape), box.axes, what, loc) for a in axes)
    if len(axes) == 1 and k > 1:
        picked = tuple(range(first, first + k))
    dims = [d for d, kept in enumerate(box.kept) if kept]
    if len(picked) != k or picked != tuple(range(first, first + k)) or picked[-1] >= len(box.shape) or \
            (k > 1 and (mode != "rows" or dims[picked[-1]] - dims[first] != k - 1)):
        raise AxisError(f"{what}: {k} index tiles pick along {k} consecutive axes of the box",
                        expected=f"axis= the first of {k} consecutive axes of {box} (rows mode)",
                        given=f"axis={axis!r}, mode={mode!r}", loc=loc)
    return first


def _indexed_shape(box: DramSlice, idxs: tuple, axis: int, mode: str, what: str, loc) -> tuple:
    """The SRAM side's shape and axes: the box with its indexed axes replaced by the index's shape
    (rows), or the index's own shape (elements)."""
    idx, k = idxs[0], len(idxs)
    if mode == "rows":
        return (box.shape[:axis] + idx.shape + box.shape[axis + k:],
                box.axes[:axis] + idx.axes + box.axes[axis + k:])
    if mode != "elements":
        raise TraceError(f"{what}: mode must be 'rows' or 'elements'", given=f"mode={mode!r}", loc=loc)
    if not all(box.kept):
        raise OutOfBoundsError(f"{what}(mode='elements') needs a box that keeps every axis of {box.tensor.name}",
                               expected="slices on every axis, e.g. X[0:1, :, :]", given=str(box), loc=loc)
    if idx.ndim != len(box.shape) or any(i > n for d, (i, n) in enumerate(zip(idx.shape, box.shape))
                                         if d != axis):
        raise ShapeError(f"{what}(mode='elements'): the index picks one element per position, so it has "
                         f"the box's rank and is no larger than the box off the axis",
                         expected=f"an index of rank {len(box.shape)} within {box.shape} off axis {axis}",
                         given=describe(idx), loc=loc)
    return idx.shape, box.axes


def _check_covered(tr: Tracer, box: DramSlice, what: str, loc) -> None:
    mask = tr.coverage.get(box.tensor.name)
    if mask is not None and not mask[box.slices].all():
        raise UninitializedReadError(
            f"{what} reads {box} before all of it was stored",
            expected=f"a box of {box.tensor.kind} {box.tensor.name!r} that earlier stores covered",
            given=f"{int((~mask[box.slices]).sum())} of {mask[box.slices].size} elements never stored",
            loc=loc, hint="store the data first (outputs and scratch start out uninitialized)")


def gather(table, idx, axis=0, mode: str = "rows") -> Tile:
    tr = current("gather")
    loc, site = tr.where()
    box = _as_box(table, "fl.gather", loc)
    if box.tensor.trace is not tr.trace:
        raise TraceError("fl.gather from a DRAM tensor of another trace", given=describe(box), loc=loc)
    t = _index_tiles(tr, idx, "fl.gather", loc)
    ax = _index_axes(box, t, axis, mode, "fl.gather", loc)
    shape, axes = _indexed_shape(box, t, ax, mode, "fl.gather", loc)
    _check_covered(tr, box, "fl.gather", loc)
    dst = tr.new_tile(shape, box.dtype, axes, SRAM, loc=loc, site=site,
                      name=tr.assigned_name(site, box.tensor.name.lower()),
                      origin=f"fl.gather at line {loc.line if loc else '?'}")
    tr.record(ir.Gather(dst, box, t, ax, mode, tr.pe, loc))
    return mark_written(dst)


def scatter(dst, idx, src, axis=0, reduce=None, mode: str = "rows") -> DMA:
    tr = current("scatter")
    loc, _ = tr.where()
    box = _as_box(dst, "fl.scatter", loc)
    if box.tensor.kind == "input":
        raise OutputError(f"fl.scatter into parameter {box.tensor.name!r}: parameters are read-only",
                          expected="a box of a tensor made with fl.output(...) or fl.scratch(...)",
                          given=describe(box), loc=loc,
                          hint="copy the parameter into an output first, then scatter into the output")
    if reduce is not None and reduce not in SCATTER_REDUCES:
        raise TraceError("fl.scatter: reduce is None (overwrite; of duplicate indices the last wins) or a "
                         "reduction the DMA engine applies on write",
                         expected=f"reduce=None or one of {', '.join(map(repr, SCATTER_REDUCES))}",
                         given=f"reduce={reduce!r}", loc=loc)
    t = _index_tiles(tr, idx, "fl.scatter", loc)
    ax = _index_axes(box, t, axis, mode, "fl.scatter", loc)
    shape, _ = _indexed_shape(box, t, ax, mode, "fl.scatter", loc)
    s = operand_tile(tr, src, "fl.scatter", loc, spaces=(SRAM,))
    if s.shape != tuple(shape):
        raise ShapeError(f"fl.scatter: the tile does not fit the rows of {box} the index picks",
                         expected=f"a tile of shape {tuple(shape)}", given=describe(s), loc=loc)
    if s.dtype != box.dtype:
        raise DTypeError(f"fl.scatter: DMA copies bytes, so the tile's dtype must be {box.tensor.name}'s",
                         expected=f"a {box.dtype} tile", given=describe(s), loc=loc,
                         hint=f"cast it first: {s.name}.astype(fl.{box.dtype})")
    if reduce is not None:   # the rows it combines with are read
        _check_covered(tr, box, f"fl.scatter(reduce={reduce!r})", loc)
    op = tr.record(ir.Scatter(box, t, s, ax, mode, reduce, tr.pe, loc))
    return DMA(tr.trace, op)   # which elements it writes is data: coverage is not marked


def transpose(x, perm) -> Tile:
    tr = current("transpose")
    loc, site = tr.where()
    t = operand_tile(tr, x, "fl.transpose", loc, spaces=(SRAM,))
    try:
        perm = tuple(_index_axis(t, p, t.ndim, t.axes, "fl.transpose", loc) for p in perm)
    except TypeError:
        raise AxisError("fl.transpose: perm is a sequence of axes", given=repr(perm), loc=loc) from None
    if sorted(perm) != list(range(t.ndim)):
        raise AxisError(f"fl.transpose: {list(perm)} is not a permutation of the tile's {t.ndim} axes",
                        expected=f"each of 0..{t.ndim - 1} once", given=f"perm={list(perm)}", loc=loc)
    out = tr.new_tile(tuple(t.shape[p] for p in perm), t.dtype, tuple(t.axes[p] for p in perm), SRAM,
                      loc=loc, site=site, name=tr.assigned_name(site, "transpose"),
                      origin=f"fl.transpose at line {loc.line if loc else '?'}")
    tr.record(ir.Transpose(out, t, perm, tr.pe, loc))
    return mark_written(out)


def wait(handle) -> None:
    tr = current("wait")
    loc, _ = tr.where()
    if isinstance(handle, DMA):
        target = handle.op
    elif isinstance(handle, Tile):
        operand_tile(tr, handle, "fl.wait", loc, spaces=(SRAM,))
        target = next((op for op in reversed(tr.trace.ops)
                       if isinstance(op, ir.Load) and op.dst is handle), None)
        if target is None:
            raise TraceError(f"fl.wait: nothing was loaded into tile {handle.name!r}",
                             expected="a tile made by fl.load, or a store's handle", given=describe(handle), loc=loc)
    else:
        raise TraceError("fl.wait takes a DMA handle or a loaded tile", given=describe(handle), loc=loc)
    if handle.trace is not tr.trace:
        raise TraceError("fl.wait on a DMA of another trace", given=repr(handle), loc=loc)
    tr.record(ir.Wait(target, tr.pe, loc))


# ---- tiles made from nothing -------------------------------------------------------------------
def fill(shape, value, dtype, axes, space: str, *, what: str) -> Tile:
    tr = current(what)
    loc, site = tr.where()
    t = empty(shape, dtype, axes, space, what=what, _where=(loc, site))
    if not isinstance(value, Number) or isinstance(value, bool):
        raise TraceError(f"fl.{what}: the fill value is not a number", given=describe(value), loc=loc)
    # an integer tile keeps an integer value whole (as a float, 2^24 + 1 would lose its last bit)
    exact = int(value) if not t.dtype.is_float and float(value).is_integer() else float(value)
    tr.record(ir.Fill(t, exact, tr.pe, loc))
    return mark_written(t)


def empty(shape, dtype, axes, space: str, *, what: str = "empty", _where=None) -> Tile:
    tr = current(what)
    loc, site = _where or tr.where()
    shape = parse_shape(shape, f"fl.{what}", loc)
    dt = parse_dtype(dtype, f"fl.{what}", loc)
    if space not in (SRAM, ACC):
        raise MemorySpaceError(f"fl.{what}: tiles live in SRAM or in the accumulator",
                               expected="space=fl.SRAM or fl.ACC", given=f"space={space!r}", loc=loc)
    if space == ACC and dt not in (f32, i32):
        raise DTypeError(f"fl.{what}: accumulators hold f32 (or i32 for integer contractions)",
                         expected="dtype f32", given=f"dtype {dt}", loc=loc)
    return tr.new_tile(shape, dt, parse_axes(axes, len(shape), f"fl.{what}", loc), space, loc=loc, site=site,
                       name=tr.assigned_name(site, what),
                       origin=f"fl.{what} at line {loc.line if loc else '?'}")


# ---- small parsers ----------------------------------------------------------------------------------
def parse_shape(shape, what: str, loc) -> tuple[int, ...]:
    """A shape of ints; a slice counts as its extent (``fl.zeros((rows, 1))`` with rows a slice)."""
    if isinstance(shape, (int, np.integer, slice)):
        shape = (shape,)
    out = []
    for d in shape if isinstance(shape, (tuple, list)) else [shape]:
        if isinstance(d, slice) and isinstance(d.start, int) and isinstance(d.stop, int):
            d = d.stop - d.start
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d <= 0:
            raise ShapeError(f"{what}: {shape!r} is not a shape", expected="a tuple of positive ints (or slices)",
                             given=repr(shape), loc=loc)
        out.append(int(d))
    return tuple(out)


def parse_dtype(dt, what: str, loc) -> DType:
    try:
        return as_dtype(dt)
    except ValueError as e:
        raise DTypeError(f"{what}: {e}", expected="fl.bf16, fl.f32, ... or their names",
                         given=repr(dt), loc=loc) from None


def parse_axes(axes, ndim: int, what: str, loc) -> tuple:
    if axes is None:
        return (None,) * ndim
    if isinstance(axes, str):
        axes = axes.replace(",", " ").split()
    axes = tuple(None if a in (None, "_") else a for a in axes)
    if len(axes) != ndim or not all(a is None or (isinstance(a, str) and a.isidentifier()) for a in axes):
        raise AxisError(f"{what}: axes {axes!r} do not name the tile's {ndim} axes",
                        expected=f"{ndim} names (or None)", given=repr(axes), loc=loc)
    return axes


# ---- the end of a trace -----------------------------------------------------------------------------
def finish(tr: Tracer, returned, fn_loc) -> None:
    """Check what the kernel returned, and that every output element was stored."""
    trace = tr.trace
    values = returned if isinstance(returned, tuple) else (returned,)
    trace.returns_tuple = isinstance(returned, tuple)
    outs = []
    for v in values:
        if not (isinstance(v, DramTensor) and v.kind == "output" and v.trace is trace):
            raise OutputError("a kernel returns the outputs it declared",
                              expected="the DRAM tensors made with fl.output(...), e.g. `return C`",
                              given=f"return {describe(v) if v is not None else 'None'}", loc=fn_loc)
        outs.append(v)
    declared = [t for t in trace.tensors if t.kind == "output"]
    missing = [t.name for t in declared if all(t is not o for o in outs)]
    if missing:
        raise OutputError(f"output(s) {', '.join(missing)} are declared but not returned",
                          expected=f"return {', '.join(t.name for t in declared)}",
                          given=f"return {', '.join(t.name for t in outs)}", loc=fn_loc)
    for t in outs:
        mask = tr.coverage[t.name]
        if not mask.all():
            first = tuple(int(i) for i in np.argwhere(~mask)[0])
            raise OutputError(
                f"output {t.name!r}: {int((~mask).sum()):,} of {mask.size:,} elements are never stored",
                expected="stores that cover the whole output",
                given=f"first element never stored: {t.name}{list(first)}", loc=t.loc,
                hint="check the tiling loops' bounds: fl.tiles(n, size) covers [0, n) including a short "
                     "last tile")
    trace.outputs = outs
