"""The data-movement kernel: slice, select, split, concat, pad and expand as DMA box copies.

Each op moves boxes: every operand is seen through a free view that puts the op's axis between
two merged runs (``x: (B, T, D)``, ``x[:, 3:8]`` -> ``x`` as (R, J, C) = (B, T, D), the box
``[:, 3:8, :]``), and the kernel copies each box DRAM -> SRAM -> DRAM a tile at a time:

    slice    one box of the input (a step s > 1: the axis viewed as (J/s, s), one unit-stride box of
             that view; when s does not divide the axis, one index at a time)
    slice_scatter  the input around the slice, the values into it (a step s > 1: one column of
             the (J/s, s) view, or when s does not divide the axis, one box per position)
    select   one box with the axis fixed; split: one box per result; concat: one box per operand
    pad      the input into the middle of the output, ``fl.full`` tiles into the border boxes
    expand   the input box (size 1 on broadcast axes) broadcast on the vector unit, then stored
    tril     (and triu) a copy through a mask of column - row <= diagonal, the positions loaded from
             index rows in DRAM scratch

A copy never passes through the vector unit unless the data changes dtype (concat of mixed
dtypes) or is broadcast (expand).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fexplore.ir import Node

from .boxes import STAGES, Loops, around, index_row, spec, tile_sizes
from .common import Inputs, Signature, body_of, header, kernel_name, region_label
from .errors import UnsupportedRegionError
from .generated import GeneratedKernel, Result
from .source import Names, Writer, astype, fl_dtype, literal

MOVEMENT = {"slice", "select", "split", "concat", "pad", "expand", "tril", "triu", "slice_scatter"}


@dataclass
class View:
    """An operand (a node input, or output number `index`) seen with `shape`; axes labelled."""

    labels: list[str]
    shape: tuple[int, ...]


@dataclass
class Piece:
    """One box copy. The box has `extents` (axes `labels`) and is written at `dst_off` of output
    `out`. It is read from parameter `src` (None: filled with `fill`) where each axis of the
    source view is (box axis, offset, step): box axis None fixes the index at `offset`; a step
    > 1 walks that box axis one index at a time; a source axis of size 1 under a longer box axis
    is broadcast."""

    labels: list[str]
    extents: tuple[int, ...]
    out: int
    dst_off: tuple[int, ...]
    src: int | None = None
    src_map: list = field(default_factory=list)
    fill: str = "0.0"


def generate_movement(node: Node, cfg) -> GeneratedKernel:
    body = body_of(node)
    label = region_label(node)
    if node.op.name == "region" or len(body.nodes) != 1:
        raise UnsupportedRegionError(body.nodes[0].op.name, label, "data movement inside a fused region")
    n = body.nodes[0]
    for v in list(body.inputs) + list(body.outputs):
        if any(not isinstance(d, int) for d in v.type.shape):
            raise UnsupportedRegionError(n.op.name, label, "symbolic sizes (specialize the shapes first)", loc=n.loc)
        if math.prod(v.type.shape) == 0:
            raise UnsupportedRegionError(n.op.name, label, "an empty tensor: nothing to move", loc=n.loc)
    if n.op.name in ("tril", "triu"):
        return _triangle(node, body, n, cfg)
    params, outs, pieces = _PLANS[n.op.name](n)
    return _write(node, body, n, cfg, params, outs, pieces)


# -- what each op moves -------------------------------------------------------------------------

def _slice_plan(n: Node):
    x, y = n.inputs[0], n.outputs[0]
    axis = n.attrs["axis"] % x.type.rank
    O, A, I = around(x.type.shape, axis)
    start, step, L = n.attrs["start"], n.attrs["step"], y.type.shape[axis]
    out = View(["R", "J", "C"], (O, L, I))
    if step == 1:
        src = View(["R", "J", "C"], (O, A, I))
        smap = [(0, 0, 1), (1, start, 1), (2, 0, 1)]
    elif A % step == 0:   # the axis as (A / step, step): element start + j * step is [start // step + j, start % step]
        src = View(["R", "Q", "S", "C"], (O, A // step, step, I))
        smap = [(0, 0, 1), (1, start // step, 1), (None, start % step, 1), (2, 0, 1)]
    else:
        src = View(["R", "J", "C"], (O, A, I))
        smap = [(0, 0, 1), (1, start, step), (2, 0, 1)]
    return [src], [out], [Piece(["R", "J", "C"], (O, L, I), 0, (0, 0, 0), 0, smap)]


def _select_plan(n: Node):
    x = n.inputs[0]
    axis = n.attrs["axis"] % x.type.rank
    O, A, I = around(x.type.shape, axis)
    src = View(["R", "J", "C"], (O, A, I))
    out = View(["R", "C"], (O, I))
    smap = [(0, 0, 1), (None, n.attrs["index"], 1), (1, 0, 1)]
    return [src], [out], [Piece(["R", "C"], (O, I), 0, (0, 0), 0, smap)]


def _split_plan(n: Node):
    x = n.inputs[0]
    axis = n.attrs["axis"] % x.type.rank
    O, A, I = around(x.type.shape, axis)
    outs, pieces, start = [], [], 0
    for k, y in enumerate(n.outputs):
        L = y.type.shape[axis]
        outs.append(View(["R", "J", "C"], (O, L, I)))
        if L:
            pieces.append(Piece(["R", "J", "C"], (O, L, I), k, (0, 0, 0), 0, [(0, 0, 1), (1, start, 1), (2, 0, 1)]))
        start += L
    return [View(["R", "J", "C"], (O, A, I))], outs, pieces


def _concat_plan(n: Node):
    y = n.outputs[0]
    axis = n.attrs["axis"] % y.type.rank
    O, T, I = around(y.type.shape, axis)
    params, pieces, off = [], [], 0
    for k, x in enumerate(n.inputs):
        L = x.type.shape[axis]
        params.append(View(["R", "J", "C"], (O, L, I)))
        if L:
            pieces.append(Piece(["R", "J", "C"], (O, L, I), 0, (0, off, 0), k, [(0, 0, 1), (1, 0, 1), (2, 0, 1)]))
        off += L
    return params, [View(["R", "J", "C"], (O, T, I))], pieces


def _slice_scatter_plan(n: Node):
    """x with x[..., start:end] along the axis replaced by v: the parts of x before and after the
    slice, and v between them, each copied once (no byte written twice)."""
    x, v = n.inputs[0], n.inputs[1]
    axis = n.attrs["axis"] % x.type.rank
    O, A, I = around(x.type.shape, axis)
    step, L = n.attrs["step"], v.type.shape[axis]
    start = n.attrs["start"]
    start = start + A if start < 0 else min(start, A)
    if step != 1 and L:
        return _strided_scatter_plan(n, O, A, I, start, step, L)
    labels = ["R", "J", "C"]
    ident = [(0, 0, 1), (1, 0, 1), (2, 0, 1)]
    pieces = []
    if start:
        pieces.append(Piece(labels, (O, start, I), 0, (0, 0, 0), 0, ident))
    if L:
        pieces.append(Piece(labels, (O, L, I), 0, (0, start, 0), 1, ident))
    if start + L < A:
        pieces.append(Piece(labels, (O, A - start - L, I), 0, (0, start + L, 0), 0,
                            [(0, 0, 1), (1, start + L, 1), (2, 0, 1)]))
    return [View(labels, (O, A, I)), View(labels, (O, L, I))], [View(labels, (O, A, I))], pieces


# A strided slice_scatter whose step does not divide the axis is copied a position at a time: at
# most this many positions (an interleaved rotary embedding writes a third of a head's dims).
_MAX_STRIDED_POSITIONS = 64


def _strided_scatter_plan(n: Node, O: int, A: int, I: int, start: int, step: int, L: int):
    """x with positions start, start + step, ... (L of them) along the axis replaced by v. When
    the step divides the axis, the axis is viewed as (A / step, step): the positions are one
    column s0 of rows q0 .. q0 + L, and x fills the rows around them and the columns beside
    them, each byte written once. Otherwise each position and each gap between two is a box."""
    if A % step == 0:
        Q, q0, s0 = A // step, start // step, start % step
        labels = ["R", "Q", "S", "C"]
        x_view, v_view = View(labels, (O, Q, step, I)), View(labels, (O, L, 1, I))

        def x_box(rows, row0, cols, col0):
            return Piece(labels, (O, rows, cols, I), 0, (0, row0, col0, 0), 0,
                         [(0, 0, 1), (1, row0, 1), (2, col0, 1), (3, 0, 1)])

        pieces = [x_box(q0, 0, step, 0)] if q0 else []
        if s0:
            pieces.append(x_box(L, q0, s0, 0))
        pieces.append(Piece(labels, (O, L, 1, I), 0, (0, q0, s0, 0), 1, [(i, 0, 1) for i in range(4)]))
        if s0 + 1 < step:
            pieces.append(x_box(L, q0, step - s0 - 1, s0 + 1))
        if q0 + L < Q:
            pieces.append(x_box(Q - q0 - L, q0 + L, step, 0))
        return [x_view, v_view], [x_view], pieces
    if L > _MAX_STRIDED_POSITIONS:
        raise UnsupportedRegionError("slice_scatter", f"op %{n.name}",
                                     f"a slice_scatter of {L} positions with step {step}, which does not divide "
                                     f"the axis ({A}): copied a position at a time, at most "
                                     f"{_MAX_STRIDED_POSITIONS}", loc=n.loc)
    labels = ["R", "J", "C"]

    def copied(src, length, dst, at):   # `length` indices of parameter `src` from `at`, to `dst`
        return Piece(labels, (O, length, I), 0, (0, dst, 0), src, [(0, 0, 1), (1, at, 1), (2, 0, 1)])

    pieces, at = [], 0
    for j in range(L):
        p = start + j * step
        if p > at:   # x between the previous position and this one
            pieces.append(copied(0, p - at, at, at))
        pieces.append(copied(1, 1, p, j))
        at = p + 1
    if at < A:
        pieces.append(copied(0, A - at, at, at))
    return [View(labels, (O, A, I)), View(labels, (O, L, I))], [View(labels, (O, A, I))], pieces


def _pad_plan(n: Node):
    x, y = n.inputs[0], n.outputs[0]
    pads = n.attrs["pads"]
    k = len(pads) // 2
    rank = x.type.rank
    before = [pads[2 * (rank - 1 - a)] if rank - 1 - a < k else 0 for a in range(rank - k, rank)]
    after = [pads[2 * (rank - 1 - a) + 1] if rank - 1 - a < k else 0 for a in range(rank - k, rank)]
    O = math.prod(x.type.shape[:rank - k])
    inner = tuple(x.type.shape[rank - k:])
    outer = tuple(y.type.shape[rank - k:])
    labels = ["R"] + [f"P{i}" for i in range(k)]
    fill = literal(n.attrs["value"])
    pieces = [Piece(labels, (O,) + inner, 0, (0,) + tuple(before), 0, [(i, 0, 1) for i in range(k + 1)])]
    for j in range(k):   # the border: along axis j, before and after the input; axes < j inside it
        for size, at in ((before[j], 0), (after[j], before[j] + inner[j])):
            if size:
                ext = (O,) + inner[:j] + (size,) + outer[j + 1:]
                off = (0,) + tuple(before[:j]) + (at,) + (0,) * (k - j - 1)
                pieces.append(Piece(labels, ext, 0, off, fill=fill))
    return [View(labels, (O,) + inner)], [View(labels, (O,) + outer)], pieces


def _expand_plan(n: Node):
    x, y = n.inputs[0], n.outputs[0]
    shape = tuple(y.type.shape)
    src = (1,) * (len(shape) - x.type.rank) + tuple(x.type.shape)
    groups: list[list[int]] = []   # neighbouring axes that are all copied or all broadcast merge
    for i, (s, d) in enumerate(zip(src, shape)):
        if d == 1:
            continue
        kind = s == d
        if groups and groups[-1][-1] == i - 1 and (src[groups[-1][0]] == shape[groups[-1][0]]) == kind:
            groups[-1].append(i)
        else:
            groups.append([i])
    if not groups:
        groups = [[len(shape) - 1]] if shape else []
    sizes = tuple(math.prod(shape[i] for i in g) for g in groups) or (1,)
    have = tuple(math.prod(src[i] for i in g) for g in groups) or (1,)
    labels = _group_labels(len(sizes))
    smap = [(i, 0, 1) for i in range(len(sizes))]
    return ([View(labels, have)], [View(labels, sizes)],
            [Piece(labels, sizes, 0, (0,) * len(sizes), 0, smap)])


def _group_labels(k: int) -> list[str]:
    return {1: ["C"], 2: ["R", "C"], 3: ["R", "J", "C"]}.get(k, [f"A{i}" for i in range(k)])


_PLANS = {"slice": _slice_plan, "select": _select_plan, "split": _split_plan, "concat": _concat_plan,
          "pad": _pad_plan, "expand": _expand_plan, "slice_scatter": _slice_scatter_plan}


# -- the kernel ---------------------------------------------------------------------------------

def _write(node: Node, body, n: Node, cfg, params: list[View], outs: list[View], pieces: list[Piece]):
    names = Names({"stages"})
    fname = kernel_name(node)
    names.taken.add(fname)
    inputs = Inputs.of(node, body)
    sizes: dict[str, set] = {}
    for v in params + outs:
        for a, s in zip(v.labels, v.shape):
            sizes.setdefault(a, set()).add(s)
    named = [a for a in ("R", "J", "C") if len(sizes.get(a, ())) == 1]
    sig = Signature(names, inputs)
    pnames = [sig.add(v, view.shape, spec(view.labels, view.shape, named)) for v, view in zip(body.inputs, params)]
    w = Writer()
    header(w, node, body, "data-movement", sig.header, inputs.literals)
    w(f'@fl.kernel(target="{cfg.name}")')
    w(f"def {fname}({', '.join(sig.annotations)}, *, stages: int = {STAGES}):")
    with w.indent():
        if named:
            w(f"{', '.join(named)} = {', '.join(str(next(iter(sizes[a]))) for a in named)}")
        onames = []
        for v, view in zip(body.outputs, outs):
            oname = names.new(v.name + "_out").upper()
            onames.append(oname)
            dims = ", ".join(a if a in named else str(s) for a, s in zip(view.labels, view.shape))
            axes = " ".join(a if a in named else "_" for a in view.labels)
            w(f'{oname} = fl.output(({dims}{"," if len(view.shape) == 1 else ""}), '
              f'{fl_dtype(v.type.dtype)}, axes="{axes}")')
        last = None
        for p in pieces:
            last = _piece(w, names, cfg, p, params, outs, pnames, onames, body, named, last)
        w(f"return {', '.join(onames)}")
    results = tuple(Result(i, tuple(v.type.shape)) for i, v in enumerate(node.outputs))
    return GeneratedKernel(fname, "movement", w.text(), cfg, tuple(sig.params), results, (n.op.name,))


def _piece(w, names, cfg, p: Piece, params, outs, pnames, onames, body, named, last):
    """Write the copy of one piece; a piece whose tile loop is the one just written (`last`: the
    loop's header and the line after its body) joins that loop's body."""
    # a step over one element is no step: such an axis is indexed like any other
    walked = {b for b, _, step in p.src_map if b is not None and step > 1 and p.extents[b] > 1}
    tiles = tile_sizes(p.extents, cfg, fixed=walked)
    loops = Loops(p.labels, p.extents, tiles, named)
    for b in walked:             # walked one index at a time: not a parallel axis
        loops.looped.remove(b)
        del loops.vars[b]
    if not loops.looped:
        loops.looped, loops.vars[0] = [0], "rs"
    out_view = outs[p.out]
    head = loops.header()
    if last is not None and last[0] == head and last[1] == len(w.lines):
        w.depth += 1
        w(f"# {_describe(p, pnames, onames)}")
    else:
        w(f"# {_describe(p, pnames, onames)}")
        w(head)
        w.depth += 1
    walk = {b: names.new("j") for b in walked}
    for b, j in walk.items():
        w(f"for {j} in fl.range({p.extents[b]}):")
        w.depth += 1
    shape = [loops.extent(i) for i in range(len(p.extents)) if i not in walk]
    shape_text = f"({', '.join(shape)}{',' if len(shape) == 1 else ''})"
    dst = []
    for i, whole in enumerate(out_view.shape):
        dst.append(_walked(walk[i], p.dst_off[i], 1) if i in walk else loops.index(i, p.dst_off[i], whole))
    out_v = body.outputs[p.out]
    if p.src is None:
        t = names.new("border")
        w(f"{t} = fl.full({shape_text}, {p.fill}, {fl_dtype(out_v.type.dtype)})")
    else:
        src_view = params[p.src]
        idx, bcast = [], False
        for (b, off, step), whole in zip(p.src_map, src_view.shape):
            if b is None:
                idx.append(str(off))
            elif b in walk:
                idx.append(_walked(walk[b], off, step))
            elif whole == 1 and p.extents[b] > 1:
                idx.append(":")
                bcast = True
            else:
                idx.append(loops.index(b, off, whole))
        t = names.new(pnames[p.src] + "_t")
        w(f"{t} = fl.load({pnames[p.src]}[{', '.join(idx)}])")
        if bcast:
            w(f"{t} = fl.broadcast_to({t}, {shape_text})")
        in_v = body.inputs[p.src]
        if in_v.type.dtype != out_v.type.dtype:
            t = astype(t, out_v.type.dtype)
    w(f"fl.store({onames[p.out]}[{', '.join(dst)}], {t})")
    w.depth -= len(walk)
    w.depth -= 1
    return head, len(w.lines)


def _walked(j: str, off: int, step: int) -> str:
    term = j if step == 1 else f"{step} * {j}"
    return term if off == 0 else f"{off} + {term}"


def _describe(p: Piece, pnames, onames) -> str:
    where = ", ".join(f"{o}:{o + e}" for o, e in zip(p.dst_off, p.extents))
    what = f"fill {p.fill}" if p.src is None else pnames[p.src]
    return f"{what} -> {onames[p.out]}[{where}]"


def _triangle(node: Node, body, n: Node, cfg) -> GeneratedKernel:
    """tril / triu of (..., M, N): each (rows, columns) tile is kept where column - row is at most
    (tril) or at least (triu) the diagonal, zero elsewhere."""
    x, y = n.inputs[0], n.outputs[0]
    *lead, M, N = x.type.shape
    B = math.prod(lead)
    names = Names({"stages", "ROWS", "COLS"})
    fname = kernel_name(node)
    names.taken.add(fname)
    inputs = Inputs.of(node, body)
    sig = Signature(names, inputs)
    xname = sig.add(x, (B, M, N), ['"B"', '"M"', '"N"'])
    tiles = tile_sizes((B, M, N), cfg, live=4)
    loops = Loops(["B", "M", "N"], (B, M, N), tiles, {"B", "M", "N"})
    for i in (1, 2):                     # rows and columns are always loop variables: their positions
        if i not in loops.looped:
            loops.looped.append(i)
            loops.vars[i] = {1: "ms", 2: "ns"}[i]
    loops.looped.sort()
    d = n.attrs["diagonal"]
    keep = "<=" if n.op.name == "tril" else ">="
    w = Writer()
    header(w, node, body, "data-movement", sig.header, inputs.literals)
    w(f'@fl.kernel(target="{cfg.name}")')
    w(f"def {fname}({', '.join(sig.annotations)}, *, stages: int = {STAGES}):")
    with w.indent():
        w(f"B, M, N = {B}, {M}, {N}")
        w(f'OUT = fl.output((B, M, N), {fl_dtype(y.type.dtype)}, axes="B M N")')
        index_row(w, cfg, "ROWS", M, 2, 0, "the row of each element")
        index_row(w, cfg, "COLS", N, 2, 1, "the column of each element")
        w(loops.header())
        with w.indent():
            w(f"x_t = fl.load({xname}[bs, ms, ns])")
            w(f"keep = fl.load(COLS[:, ns]) - fl.load(ROWS[ms, :]) {keep} {d}   # column - row {keep} diagonal")
            w(f"fl.store(OUT[bs, ms, ns], fl.where(keep, x_t, 0.0, dtype={fl_dtype(y.type.dtype)}))")
        w("return OUT")
    return GeneratedKernel(fname, "movement", w.text(), cfg, tuple(sig.params), (Result(0, tuple(y.type.shape)),),
                           (n.op.name,))
