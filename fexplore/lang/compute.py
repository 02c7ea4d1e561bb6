"""The semantic layer for the compute units: contractions on the tensor unit, vector ops (elementwise,
reductions along named axes, where, cast, broadcast). Checked and recorded like everything else in
`semantics.py`, whose operand checks these share."""

from __future__ import annotations

import re
from numbers import Integral, Number

import numpy as np

from fexplore.errors import ConfigError
from fexplore.lang import ir
from fexplore.lang.errors import AxisError, ContractionError, DTypeError, ShapeError, TraceError
from fexplore.lang.semantics import (describe, destination_tile, mark_written, operand_tile, parse_axes,
                                     parse_dtype, parse_shape)
from fexplore.lang.tracer import current
from fexplore.lang.types import ACC, SRAM, bool_, f32, i32, shape_text
from fexplore.lang.values import DramSlice, DramTensor, Tile
from fexplore.npu.builder import einsum_groups
from fexplore.npu.vector_ops import VECTOR_OPS

_SPEC = re.compile(r"^([a-zA-Z]+),([a-zA-Z]+)->([a-zA-Z]*)$")


# ---- tensor unit ----------------------------------------------------------------------------------
def contract(spec: str, a, b, acc=None) -> Tile:
    tr = current("contract")
    loc, site = tr.where()
    if not isinstance(spec, str) or not _SPEC.match(spec.replace(" ", "")):
        raise ContractionError(f"fl.contract: spec {spec!r} is not an einsum of two operands",
                               expected="'<a letters>,<b letters>-><result letters>', e.g. 'mk,kn->mn'",
                               given=repr(spec), loc=loc)
    spec = spec.replace(" ", "")
    la, lb, lo = _SPEC.match(spec).groups()
    ta = operand_tile(tr, a, "fl.contract", loc, spaces=(SRAM,))
    tb = operand_tile(tr, b, "fl.contract", loc, spaces=(SRAM,))
    if ta.dtype != tb.dtype:
        raise DTypeError(f"fl.contract {spec}: the operands' dtypes differ",
                         expected="two operands of one dtype", given=f"{describe(ta)} and {describe(tb)}",
                         loc=loc, hint=f"cast one on the vector unit first, e.g. {tb.name}.astype(fl.{ta.dtype})")
    try:
        tr.target.tensor_rate(ta.dtype.name)
    except ConfigError:
        modes = ", ".join(d for d, _ in tr.target.tensor_dtype_rates)
        raise DTypeError(f"fl.contract: the tensor unit of {tr.target.name!r} has no {ta.dtype} mode",
                         expected=f"operands in one of: {modes}", given=f"{ta.dtype} operands", loc=loc,
                         hint="cast the operands, e.g. x.astype(fl.bf16)") from None
    sizes, names = _bind_letters(spec, la, lb, ta, tb, loc)
    if len(set(lo)) != len(lo) or not set(lo) <= set(sizes):
        raise ContractionError(f"fl.contract {spec}: result letters must be distinct and appear in an operand",
                               expected=f"letters from '{la}' and '{lb}', each once", given=f"'{lo}'", loc=loc)
    shape = tuple(sizes[ch] for ch in lo)
    axes = tuple(names[ch][0] for ch in lo)
    acc_dtype = f32 if ta.dtype.is_float else i32
    if acc is None:
        out = tr.new_tile(shape, acc_dtype, axes, ACC, loc=loc, site=site,
                          name=tr.assigned_name(site, "acc"), origin=f"fl.contract at line {loc.line if loc else '?'}")
        accumulate = False
    else:
        out = operand_tile(tr, acc, "fl.contract(acc=)", loc, spaces=(ACC,))
        if out.shape != shape:
            raise ContractionError(f"fl.contract {spec}: the accumulator does not fit the result",
                                   expected=f"an accumulator of shape {shape}", given=describe(out), loc=loc)
        if out.dtype != acc_dtype:
            raise DTypeError(f"fl.contract: the tensor unit accumulates {ta.dtype} products in {acc_dtype}",
                             expected=f"a {acc_dtype} accumulator", given=describe(out), loc=loc)
        accumulate = True
    tr.record(ir.Contract(out, spec, ta, tb, accumulate, einsum_groups(sizes, la, lb, lo), tr.pe, loc))
    return mark_written(out)


def _bind_letters(spec, la, lb, ta: Tile, tb: Tile, loc) -> tuple[dict, dict]:
    """Each spec letter's extent, and the named axis it binds (with the tile that named it). A letter
    must have one extent, and where both operands name its axis (of size > 1), one name."""
    sizes: dict[str, int] = {}
    names: dict[str, tuple[str | None, str]] = {}
    for letters, t in ((la, ta), (lb, tb)):
        if len(letters) != t.ndim:
            raise ContractionError(
                f"fl.contract {spec}: '{letters}' names {len(letters)} axes but {t.name!r} has {t.ndim}",
                expected=f"one letter per axis of {t.name!r} ({shape_text(t.shape, t.axes)})",
                given=f"'{letters}'", loc=loc)
        if len(set(letters)) != len(letters):
            raise ContractionError(f"fl.contract {spec}: a letter repeats in '{letters}'",
                                   expected="distinct letters per operand", given=f"'{letters}'", loc=loc)
        for ch, d, ax in zip(letters, t.shape, t.axes):
            if ch in sizes and sizes[ch] != d:
                raise ContractionError(
                    f"fl.contract {spec}: index '{ch}' has two sizes",
                    expected=f"'{ch}' = {sizes[ch]} in both operands ({names[ch][1]} has {sizes[ch]})",
                    given=f"{describe(ta)} and {describe(tb)}", loc=loc)
            if ch in names and ax and names[ch][0] and ax != names[ch][0] and d > 1:
                raise AxisError(
                    f"fl.contract {spec}: index '{ch}' binds axis {names[ch][0]} of {names[ch][1]!r} "
                    f"and axis {ax} of {t.name!r}",
                    expected=f"'{ch}' on the same named axis in both operands",
                    given=f"{names[ch][1]!r}: {names[ch][0]}, {t.name!r}: {ax}", loc=loc,
                    hint="the letters may be in the wrong order: for q @ k.T with q (S, D) and k (T, D), "
                         "write 'sd,td->st'")
            sizes.setdefault(ch, d)
            if ch not in names or (names[ch][0] is None and ax):
                names[ch] = (ax, t.name)
    return sizes, names


# ---- vector unit ----------------------------------------------------------------------------------
# ops on the bits of integers: a float operand has no bits to give them (the unit does not reinterpret)
_BIT_OPS = {"bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift"}


def vector(op: str, operands, *, dtype=None, out=None, axis=None, keepdims: bool = True) -> Tile:
    tr = current(op)
    loc, site = tr.where()
    opdef = VECTOR_OPS[op]
    if len(operands) != opdef.arity:
        raise TraceError(f"fl.{op} takes {opdef.arity} operand(s)", expected=f"{opdef.arity} operand(s)",
                         given=f"{len(operands)}", loc=loc)
    args, tiles = [], []
    for x in operands:
        if isinstance(x, bool) or not isinstance(x, (Number, Tile, DramTensor, DramSlice)):
            raise TraceError(f"fl.{op}: an operand is neither a tile nor a number",
                             expected="tiles and Python numbers", given=describe(x), loc=loc)
        if isinstance(x, Number):   # an integer stays one: the unit's integer lanes take it whole
            args.append(int(x) if isinstance(x, Integral) else float(x))
        else:
            t = operand_tile(tr, x, f"fl.{op}", loc)
            args.append(t)
            tiles.append(t)
    if not tiles:
        raise TraceError(f"fl.{op} on numbers only", expected="at least one tile operand",
                         given=", ".join(map(repr, operands)), loc=loc, hint="compute it in Python")
    if opdef.kind == "reduction":
        (t,) = tiles
        k = _axis_index(t, -1 if axis is None else axis, f"fl.{op}", loc)
        shape = tuple(1 if i == k else d for i, d in enumerate(t.shape)) if keepdims else \
            tuple(d for i, d in enumerate(t.shape) if i != k)
        # a kept reduced axis has size 1 and broadcasts against anything: it keeps no name
        axes = tuple(None if i == k else a for i, a in enumerate(t.axes)) if keepdims else \
            tuple(a for i, a in enumerate(t.axes) if i != k)
        axis_arg = k
    else:
        if axis is not None:
            raise TraceError(f"fl.{op} is elementwise and takes no axis", given=f"axis={axis!r}", loc=loc)
        shape, axes = _broadcast(tiles, f"fl.{op}", loc)
        axis_arg = None
    if op == "where" and not (isinstance(args[0], Tile) and args[0].dtype == bool_):
        raise DTypeError("fl.where: the condition must be a mask", expected="a bool tile (from a comparison, "
                         "e.g. x > 0)", given=describe(args[0]), loc=loc)
    if op in _BIT_OPS and any(isinstance(a, float) or isinstance(a, Tile) and a.dtype.is_float for a in args):
        raise DTypeError(f"fl.{op} acts on the bits of integers", expected="integer or bool tiles and int immediates",
                         given=", ".join(describe(a) if isinstance(a, Tile) else repr(a) for a in args), loc=loc,
                         hint="cast a float tile first: x.astype(fl.i32)")
    default = bool_ if opdef.kind == "compare" else tiles[0].dtype if op == "copy" else f32
    dt = parse_dtype(dtype, f"fl.{op}", loc) if dtype is not None else None
    if out is not None:
        res = destination_tile(tr, out, f"fl.{op}(out=)", loc, shape)
        if dt is not None and dt != res.dtype:
            raise DTypeError(f"fl.{op}: dtype= and out= disagree", expected=f"dtype {res.dtype} (out's)",
                             given=f"dtype={dt}", loc=loc)
    else:
        res = tr.new_tile(shape, dt or default, axes, SRAM, loc=loc, site=site,
                          name=tr.assigned_name(site, op), origin=f"fl.{op} at line {loc.line if loc else '?'}")
    tr.record(ir.Vector(res, op, tuple(args), axis_arg, keepdims, tr.pe, loc))
    return mark_written(res)


def _axis_index(t: Tile, axis, what: str, loc) -> int:
    if isinstance(axis, str):
        if axis not in t.axes:
            raise AxisError(f"{what}: tile {t.name!r} has no axis {axis!r}",
                            expected=f"one of its axes {[a for a in t.axes if a]} or an int",
                            given=f"axis={axis!r}", loc=loc)
        return t.axes.index(axis)
    if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool) and -t.ndim <= axis < t.ndim:
        return int(axis) % t.ndim
    raise AxisError(f"{what}: no axis {axis!r} in a {t.ndim}-d tile",
                    expected=f"an axis name {[a for a in t.axes if a]} or an int in [-{t.ndim}, {t.ndim})",
                    given=f"axis={axis!r}", loc=loc)


def _broadcast(tiles: list[Tile], what: str, loc) -> tuple[tuple[int, ...], tuple]:
    """numpy broadcasting, plus: where two operands both name an axis of size > 1, the names agree;
    an axis of size 1 in the result keeps its name where the operands give it one."""
    try:
        shape = tuple(np.broadcast_shapes(*(t.shape for t in tiles)))
    except ValueError:
        raise ShapeError(f"{what}: the operands' shapes do not broadcast",
                         expected="shapes equal axis by axis from the right, or 1 where they differ",
                         given=" and ".join(describe(t) for t in tiles), loc=loc,
                         hint="reduce with keepdims (the default) so a row statistic has shape (rows, 1)") from None
    axes: list = [None] * len(shape)
    owner: list = [None] * len(shape)
    size1: list = [set() for _ in shape]   # names operands give an axis of size 1
    for t in tiles:
        off = len(shape) - t.ndim
        for i, (d, a) in enumerate(zip(t.shape, t.axes)):
            j = off + i
            if d == 1 and a is not None:
                size1[j].add(a)
            if d == 1 or a is None:
                continue
            if axes[j] is not None and axes[j] != a:
                raise AxisError(f"{what}: axis {j} is {axes[j]} in {owner[j]!r} but {a} in {t.name!r}",
                                expected="operands whose named axes line up",
                                given=" and ".join(describe(x) for x in tiles), loc=loc,
                                hint="the sizes agree but the axes do not: one operand is probably "
                                     "transposed; compute it with its axes in the other's order")
            axes[j], owner[j] = a, t.name
    # an axis of size 1 in the result keeps the one name its operands give it (K of size 1 is still
    # K: a reduction along it by name finds it)
    for j, names in enumerate(size1):
        if shape[j] == 1 and axes[j] is None and len(names) == 1:
            axes[j] = next(iter(names))
    return shape, tuple(axes)


def cast(x, dtype) -> Tile:
    tr = current("cast")
    loc, _ = tr.where()
    dt = parse_dtype(dtype, "astype", loc)
    t = operand_tile(tr, x, "astype", loc)
    if t.dtype == dt:
        return t   # nothing to do: the tile already has that dtype (no copy)
    return vector("cast", (t,), dtype=dt)


def broadcast_to(x, shape, axes=None) -> Tile:
    tr = current("broadcast_to")
    loc, site = tr.where()
    t = operand_tile(tr, x, "fl.broadcast_to", loc)
    shape = parse_shape(shape, "fl.broadcast_to", loc)
    try:
        ok = tuple(np.broadcast_shapes(t.shape, shape)) == shape
    except ValueError:
        ok = False
    if not ok:
        raise ShapeError("fl.broadcast_to: the tile does not broadcast to the shape",
                         expected=f"a tile broadcastable to {shape}", given=describe(t), loc=loc)
    if axes is None:
        off = len(shape) - t.ndim
        axes = tuple(None if i < off or t.shape[i - off] == 1 else t.axes[i - off] for i in range(len(shape)))
    res = tr.new_tile(shape, t.dtype, parse_axes(axes, len(shape), "fl.broadcast_to", loc), SRAM, loc=loc,
                      site=site, name=tr.assigned_name(site, "bcast"), origin="fl.broadcast_to")
    tr.record(ir.Broadcast(res, t, tr.pe, loc))
    return mark_written(res)
