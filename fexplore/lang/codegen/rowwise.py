"""The vector-unit kernel: a region of elementwise ops, norms, softmax and last-axis reductions.

Every value of such a region is a function of rows: the kernel loads a block of whole rows of each
operand (broadcast operands: their one row, or their one column), runs the region's nodes on the
vector unit one line each (norms and softmax a few lines), and stores the results. Blocks of rows
go round-robin to the PEs, double buffered; operands that are the same for every row (a norm's
weights) are loaded once per PE. Axes that cannot merge into the rows (an operand varies along
one but not the next: a per-channel scale over NCHW features) are looped over outside them; the
one just outside is taken in tiles (``tb``) when its blocks are small, so a DMA moves enough to
amortize its start-up.
"""

from __future__ import annotations

import math

import numpy as np

from fexplore.ir import Node
from fexplore.lang.examples._tiling import amortizing_bytes, row_tiles

from . import vector
from .common import Inputs, body_of, header, kernel_name, region_label
from .domain import aligned, group_axes, pattern, trimmed
from .errors import UnsupportedRegionError
from .generated import GeneratedKernel, Param, Result
from .source import Names, Writer, fl_dtype

STAGES = 2


def generate_vector(node: Node, cfg) -> GeneratedKernel:
    body = body_of(node)
    label = region_label(node)
    for n in body.nodes:
        if not vector.supported(n):
            raise UnsupportedRegionError(n.op.name, label, "not a vector-unit op (elementwise, norm, softmax "
                                                           "or last-axis reduction)", loc=n.loc, node=n)
    inputs = Inputs.of(node, body)
    shapes, dropped = _aligned_shapes(body, inputs, label)
    try:
        domain = tuple(np.broadcast_shapes(*shapes.values()))
    except ValueError:   # e.g. two independent casts of differently shaped tensors: two kernels
        raise UnsupportedRegionError(body.nodes[-1].op.name, label, "its values do not broadcast to one "
                                     "shape (one tile grid): " + ", ".join(
                                         f"{k} {list(v)}" for k, v in shapes.items()),
                                     loc=body.nodes[-1].loc, node=body.nodes[-1]) from None
    lead, C = domain[:-1], domain[-1]

    params = [v for v in body.inputs if v.name not in inputs.literals]
    outs = list(body.outputs)
    pats = {v.name: pattern(shapes[v.name][:-1], lead) for v in params + outs}
    groups = group_axes(lead, list(pats.values()))
    sizes = groups.sizes
    outer_names = ["B"] if len(sizes) == 2 else [f"B{i}" for i in range(len(sizes) - 1)]
    axis_names = outer_names + ["R"]
    loop_vars = [n.lower() for n in outer_names] + ["rs"]

    names = Names({"rows", "tb", "stages", "once", "rs", "b", *(f"b{i}" for i in range(8))})
    fname = kernel_name(node)
    names.taken.add(fname)
    w = Writer()
    kparams, specs, boxes = [], [], {}
    for v in params:
        pname = names.new(v.name)
        sh = shapes[v.name]
        if v.type.rank == 0:
            kshape, spec, box = (1,), ["1"], f"{pname}[:]"
        else:
            view = groups.view(pats[v.name])
            tail = (C,) if sh[-1] == C else (1,)
            kshape = trimmed(view, tail, sizes)
            first = len(view) - (len(kshape) - 1)
            spec, idx = [], []
            for j in range(first, len(view)):
                full = view[j] != 1 or sizes[j] == 1
                spec.append(f'"{axis_names[j]}"' if full else "1")
                last = j == len(view) - 1
                idx.append(loop_vars[j] if full else ("0:1" if last else "0"))
            spec.append('"C"' if tail[0] == C and C != 1 else str(tail[0]))
            idx.append(":")
            box = f"{pname}[{', '.join(idx)}]"
        kparams.append(Param(pname, inputs.index[v.name], kshape))
        specs.append(f"{pname}: {fl_dtype(v.type.dtype)}[{', '.join(spec)}]")
        boxes[v.name] = (pname, box, all(s == "1" for s in spec[:-1]) and v.type.rank != 0 or kshape == (1,))

    live = len(params) + 2 * len(body.nodes)
    rows = _rows(cfg, sizes[-1], C, live, label, math.prod(sizes[:-1]))
    tb = _outer_tile(cfg, sizes, C, live, rows)
    header(w, node, body, "vector-unit", [(p.name, v, p.shape) for p, v in zip(kparams, params)],
           inputs.literals)
    w(f'@fl.kernel(target="{cfg.name}")')
    tiling = f"rows: int = {rows}, " + (f"tb: int = {tb}, " if tb else "")
    w(f"def {fname}({', '.join(specs)}, *, {tiling}stages: int = {STAGES}):")
    with w.indent():
        size_line = ", ".join(axis_names + ["C"])
        w(f"{size_line} = {', '.join(str(s) for s in sizes + (C,))}")
        results, out_names = [], []
        for v in outs:
            view = groups.view(pats[v.name])
            tail = 1 if shapes[v.name][-1] != C or C == 1 else C
            dims = [a if view[j] != 1 or sizes[j] == 1 else "1" for j, a in enumerate(axis_names)]
            dims.append("C" if tail == C and C != 1 else "1")
            oname = names.new(v.name + "_out").upper()
            out_names.append((v, oname, view, tail))
            results.append(Result(body.outputs.index(v), tuple(node.outputs[body.outputs.index(v)].type.shape)))
            axes = " ".join(d if d != "1" else "_" for d in dims)
            w(f'{oname} = fl.output(({", ".join(dims)}), {fl_dtype(v.type.dtype)}, axes="{axes}")')
        invariant = [v for v in params if boxes[v.name][2]]
        if invariant:
            w("once = {}   # operands the same for every row: loaded once per PE")
        outer_loops = [f"range({a})" for a in outer_names[:len(sizes) - 1]]
        if tb:   # the axis just outside the rows in tiles too: items of a few short rows are tiny DMAs
            outer_loops[-1] = f"fl.tiles({outer_names[len(sizes) - 2]}, tb)"
        grid = ", ".join(outer_loops + ["fl.tiles(R, rows)"])
        w(f"for {', '.join(loop_vars)} in fl.parallel({grid}, stages=stages):")
        with w.indent():
            tiles: dict[str, str] = dict(inputs.literals)
            if invariant:
                tnames = [names.new(boxes[v.name][0] + "_t") for v in invariant]
                w("if fl.pe() not in once:")
                with w.indent():
                    loads = ", ".join(f"fl.load({boxes[v.name][1]})" for v in invariant)
                    w(f"once[fl.pe()] = {loads}")
                w(f"{', '.join(tnames)} = once[fl.pe()]")
                tiles.update({v.name: t for v, t in zip(invariant, tnames)})
            for v in params:
                if v.name not in tiles:
                    t = names.new(boxes[v.name][0] + "_t")
                    w(f"{t} = fl.load({boxes[v.name][1]})")
                    tiles[v.name] = t
            emit = vector.VectorEmitter(w, names, label)
            for n in body.nodes:
                src = n.inputs[0]
                emit.axis = '"C"' if n.inputs and src.name in shapes and shapes[src.name][-1] == C and C > 1 \
                    else "-1"
                last = -1 if src.name in dropped else src.type.rank - 1
                tiles[n.outputs[0].name] = emit.node(n, [tiles[x.name] for x in n.inputs], last)
            for v, oname, view, tail in out_names:
                idx = [loop_vars[j] if view[j] != 1 or sizes[j] == 1 else ("0:1" if j == len(view) - 1 else "0")
                       for j in range(len(view))]
                idx.append(":")
                w(f"fl.store({oname}[{', '.join(idx)}], {tiles[v.name]})")
        w(f"return {', '.join(o for _, o, _, _ in out_names)}")
    parts = sorted({_part(n) for n in body.nodes})
    return GeneratedKernel(fname, "vector", w.text(), cfg, tuple(kparams), tuple(results), tuple(parts))


def _part(n: Node) -> str:
    if n.op.name in vector.REDUCTIONS or n.op.name == "var":
        return "reduction"
    if n.op.name in ("softmax", "log_softmax"):
        return "softmax"
    if n.op.name in ("layer_norm", "rms_norm"):
        return "norm"
    return "elementwise"


def _aligned_shapes(body, inputs: Inputs, label: str):
    """Each value's shape right-aligned into the domain's rank; a reduction without keepdim keeps
    its reduced axis as size 1 (the store's view drops it again)."""
    values = [v for v in body.inputs if v.name not in inputs.literals] + \
        [v for n in body.nodes for v in n.outputs]
    rank = max((v.type.rank for v in values), default=0)
    if rank == 0:
        raise UnsupportedRegionError(body.nodes[0].op.name, label, "every value is a scalar")
    shapes, dropped = {}, set()
    for v in body.inputs:
        if v.name not in inputs.literals:
            shapes[v.name] = aligned(v.type.shape, rank)
    for n in body.nodes:
        if any(not isinstance(d, int) for v in n.outputs for d in v.type.shape):
            raise UnsupportedRegionError(n.op.name, label, "symbolic sizes (specialize the shapes first)")
        args = [x for x in n.inputs if x.name in shapes]
        if len(n.outputs) != 1:
            raise UnsupportedRegionError(n.op.name, label, "more than one result")
        out = n.outputs[0]
        mixed = {x.name in dropped for x in args if x.type.rank > 0}
        if len(mixed) > 1:
            raise UnsupportedRegionError(n.op.name, label, "mixes a reduced value with unreduced ones")
        if n.op.name in vector.REDUCTIONS or n.op.name == "var":
            src = shapes[n.inputs[0].name]
            shapes[out.name] = src[:-1] + (1,)
            if not n.attrs["keepdim"]:
                dropped.add(out.name)
        else:
            shapes[out.name] = tuple(np.broadcast_shapes(*(shapes[x.name] for x in args)))
            if mixed == {True}:
                dropped.add(out.name)
    return shapes, dropped


def _rows(cfg, R: int, C: int, live: int, label: str, outer: int) -> int:
    per_row = C * 4 * live
    if per_row * STAGES > cfg.sram_bytes_per_pe // 2:
        raise UnsupportedRegionError("row", label, f"a row of {C} elements with {live} live tiles does not fit "
                                                   f"one PE's SRAM on {cfg.name}; needs a split-row kernel")
    return row_tiles(R, per_row, cfg, STAGES, outer)


def _outer_tile(cfg, sizes: tuple, C: int, live: int, rows: int) -> int | None:
    """Indices per item of the axis just outside the rows (``tb``), or None to take them one at a
    time. An item of a single index moves boxes of R x C elements: a squeeze-and-excite
    scale over a late CNN stage (672 channels of 14 x 14) would be thousands of DMAs of 784 bytes,
    each mostly start-up. Taken in tiles, each DMA moves what amortizes its start-up, while the
    items still number two per PE and fit a quarter of SRAM."""
    if len(sizes) < 2 or rows < sizes[-1]:
        return None
    B = sizes[-2]
    per_index = sizes[-1] * C * 4
    tb = min(B, -(-amortizing_bytes(cfg) // per_index))
    others = math.prod(sizes[:-2])
    while tb > 1 and (-(-B // tb) * others < 2 * cfg.num_pes or
                      tb * per_index * live * STAGES > cfg.sram_bytes_per_pe // 4):
        tb = -(-tb // 2) if tb > 2 else 1
    return tb if tb > 1 else None

