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

from fexplore.ir import DType, Node
from fexplore.lang.examples._tiling import amortizing_bytes, row_tiles

from . import vector
from .common import Inputs, body_of, header, kernel_name, region_label
from .domain import aligned, group_axes, pattern, trimmed
from .errors import UnsupportedRegionError
from .generated import GeneratedKernel, Param, Result
from .source import Names, Writer, fl_dtype, literal

STAGES = 2


def generate_vector(node: Node, cfg) -> GeneratedKernel:
    body = body_of(node)
    label = region_label(node)
    for n in body.nodes:
        if not vector.supported(n):
            raise UnsupportedRegionError(n.op.name, label, "not a vector-unit op (elementwise, norm, softmax "
                                                           "or last-axis reduction)", loc=n.loc, node=n)
    inputs = Inputs.of(node, body)
    if all(v.type.rank == 0 for v in list(body.inputs) + [v for n in body.nodes for v in n.outputs]):
        return _scalars(node, body, inputs, label, cfg)
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
        if v.type.rank == 0:   # a tile of one row of one, as a block of rows is two axes
            kshape, spec, box = (1, 1), ["1", "1"], f"{pname}[:, :]"
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
        boxes[v.name] = (pname, box, all(s == "1" for s in spec[:-1]) or kshape == (1,))

    live = len(params) + 2 * len(body.nodes)
    split = C * 4 * live * STAGES > cfg.sram_bytes_per_pe // 2   # whole rows do not fit: chunks of columns
    plan = SplitRow.of(body, shapes, C, label) if split else None
    tb = None
    if not split:
        rows = row_tiles(sizes[-1], C * 4 * live, cfg, STAGES, math.prod(sizes[:-1]))
        tb = _outer_tile(cfg, sizes, C, live, rows)

    # the body first: a split row's tiles are sized from the tiles its passes make
    k = Writer()
    k.depth = 1
    size_line = ", ".join(axis_names + ["C"])
    k(f"{size_line} = {', '.join(str(s) for s in sizes + (C,))}")
    results, out_names = [], []
    for v in outs:
        view = groups.view(pats[v.name])
        tail = 1 if shapes[v.name][-1] != C or C == 1 else C
        dims = [a if view[j] != 1 or sizes[j] == 1 else "1" for j, a in enumerate(axis_names)]
        dims.append("C" if tail == C and C != 1 else "1")
        oname = names.new(v.name + "_out").upper()
        # where a block of rows goes in the output, all but the last axis
        index = [loop_vars[j] if view[j] != 1 or sizes[j] == 1 else ("0:1" if j == len(view) - 1 else "0")
                 for j in range(len(view))]
        out_names.append((v, oname, index))
        results.append(Result(body.outputs.index(v), tuple(node.outputs[body.outputs.index(v)].type.shape)))
        axes = " ".join(d if d != "1" else "_" for d in dims)
        k(f'{oname} = fl.output(({", ".join(dims)}), {fl_dtype(v.type.dtype)}, axes="{axes}")')
    # on split rows, an operand along the columns (a norm's weight) is loaded a chunk at a time
    chunked = {v.name: boxes[v.name][1][:-2] + "cs]" for v in params if split and shapes[v.name][-1] == C}
    invariant = [v for v in params if boxes[v.name][2] and v.name not in chunked]
    if invariant:
        k("once = {}   # operands the same for every row: loaded once per PE")
    outer_loops = [f"range({a})" for a in outer_names[:len(sizes) - 1]]
    if tb:   # the axis just outside the rows in tiles too: items of a few short rows are tiny DMAs
        outer_loops[-1] = f"fl.tiles({outer_names[len(sizes) - 2]}, tb)"
    grid = ", ".join(outer_loops + ["fl.tiles(R, rows)"])
    k(f"for {', '.join(loop_vars)} in fl.parallel({grid}, stages=stages):")
    with k.indent():
        tiles: dict[str, str] = dict(inputs.literals)
        if invariant:
            tnames = [names.new(boxes[v.name][0] + "_t") for v in invariant]
            k("if fl.pe() not in once:")
            with k.indent():
                loads = ", ".join(f"fl.load({boxes[v.name][1]})" for v in invariant)
                k(f"once[fl.pe()] = {loads}")
            k(f"{', '.join(tnames)} = once[fl.pe()]")
            tiles.update({v.name: t for v, t in zip(invariant, tnames)})
        for v in params:
            if v.name not in tiles and v.name not in chunked:
                t = names.new(boxes[v.name][0] + "_t")
                k(f"{t} = fl.load({boxes[v.name][1]})")
                tiles[v.name] = t
        if split:
            plan.emit(k, names, tiles, chunked, out_names)
        else:
            ranks = {v.name: len(p.shape) for p, v in zip(kparams, params)}
            _whole_rows(k, names, label, body, tiles, shapes, dropped, C, out_names, ranks)
    k(f"return {', '.join(o for _, o, _ in out_names)}")
    if split:
        rows, cols = _split_tiles(cfg, sizes, C, plan.chunk_tiles, label)

    header(w, node, body, "vector-unit", [(p.name, v, p.shape) for p, v in zip(kparams, params)],
           inputs.literals)
    w(f'@fl.kernel(target="{cfg.name}")')
    tiling = f"rows: int = {rows}, " + (f"tb: int = {tb}, " if tb else "") + (f"cols: int = {cols}, " if split else "")
    w(f"def {fname}({', '.join(specs)}, *, {tiling}stages: int = {STAGES}):")
    w.lines += k.lines
    parts = sorted({_part(n) for n in body.nodes} | ({"split rows"} if split else set()))
    return GeneratedKernel(fname, "vector", w.text(), cfg, tuple(kparams), tuple(results), tuple(parts))


def _scalars(node: Node, body, inputs: Inputs, label: str, cfg) -> GeneratedKernel:
    """A region of scalars alone (a bound computed from a statistic: T5 in f16 clamps its
    activations by one): each scalar a tile of one element, the ops in a row, on one PE."""
    for n in body.nodes:
        if n.op.name in vector.REDUCTIONS or n.op.name in vector.ROW_OPS:
            raise UnsupportedRegionError(n.op.name, label, "a reduction of a scalar", loc=n.loc, node=n)
    names = Names({"item"})
    fname = kernel_name(node)
    names.taken.add(fname)
    params = [v for v in body.inputs if v.name not in inputs.literals]
    kparams = [Param(names.new(v.name), inputs.index[v.name], (1,)) for v in params]
    k = Writer()
    k.depth = 1
    onames = [names.new(v.name + "_out").upper() for v in body.outputs]
    for v, oname in zip(body.outputs, onames):
        k(f"{oname} = fl.output((1,), {fl_dtype(v.type.dtype)})")
    k("for item in fl.parallel(range(1)):   # one element: one PE")
    with k.indent():
        tiles: dict[str, str] = dict(inputs.literals)
        for v, p in zip(params, kparams):
            tiles[v.name] = names.new(p.name + "_t")
            k(f"{tiles[v.name]} = fl.load({p.name}[:])")
        emit = vector.VectorEmitter(k, names, label)
        for n in body.nodes:
            tiles[n.outputs[0].name] = emit.node(n, [tiles[x.name] for x in n.inputs], -1)
        for v, oname in zip(body.outputs, onames):
            k(f"fl.store({oname}[:], {tiles[v.name]})")
    k(f"return {', '.join(onames)}")
    w = Writer()
    header(w, node, body, "vector-unit", [(p.name, v, p.shape) for p, v in zip(kparams, params)],
           inputs.literals)
    w(f'@fl.kernel(target="{cfg.name}")')
    w(f"def {fname}({', '.join(f'{p.name}: {fl_dtype(v.type.dtype)}[1]' for p, v in zip(kparams, params))}):")
    w.lines += k.lines
    results = tuple(Result(i, tuple(node.outputs[i].type.shape)) for i in range(len(body.outputs)))
    return GeneratedKernel(fname, "vector", w.text(), cfg, tuple(kparams), results, ("elementwise",))


def _whole_rows(w, names, label, body, tiles, shapes, dropped, C, out_names, ranks):
    """The body of a block of whole rows (its operands loaded): the region's nodes, its results stored.
    `ranks`: the parameters' tile ranks; a result made of 1-d tiles alone (operands the same for
    every row: a scalar, a (1, 1, 1) tensor) is broadcast to its box's two axes."""
    emit = vector.VectorEmitter(w, names, label)
    for n in body.nodes:
        src = n.inputs[0]
        emit.axis = '"C"' if n.inputs and src.name in shapes and shapes[src.name][-1] == C and C > 1 else "-1"
        last = -1 if src.name in dropped else src.type.rank - 1
        tiles[n.outputs[0].name] = emit.node(n, [tiles[x.name] for x in n.inputs], last)
        ranks[n.outputs[0].name] = max((ranks.get(x.name, 0) for x in n.inputs), default=0)
    for v, oname, index in out_names:
        t = tiles[v.name]
        if ranks.get(v.name, 0) < 2:
            t = f"fl.broadcast_to({t}, (1, {'C' if shapes[v.name][-1] == C and C != 1 else 1}))"
        w(f"fl.store({oname}[{', '.join(index + [':'])}], {t})")


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
            if not vector.reduces_last_axis_only(n):
                # before shaping it as one (a whole-tensor mean in a norm region, fuzz seed 1590649)
                raise UnsupportedRegionError(n.op.name, label, vector.not_last_axis(n), loc=n.loc, node=n)
            src = shapes[n.inputs[0].name]
            shapes[out.name] = src[:-1] + (1,)
            if not n.attrs["keepdim"]:
                dropped.add(out.name)
        else:
            try:
                shapes[out.name] = tuple(np.broadcast_shapes(*(shapes[x.name] for x in args)))
            except ValueError:
                raise UnsupportedRegionError(n.op.name, label, "its operands do not broadcast to one tile grid: "
                                             + ", ".join(f"{x.name} {list(shapes[x.name])}" for x in args),
                                             loc=n.loc, node=n) from None
            if mixed == {True}:
                dropped.add(out.name)
    return shapes, dropped


def _split_tiles(cfg, sizes: tuple, C: int, chunk_tiles: int, label: str) -> tuple[int, int]:
    """(rows, cols) of a split-row kernel whose passes make `chunk_tiles` tiles of a chunk: each is a
    buffer of its own for the whole loop, double buffered by the chunk loop and by the loop over
    blocks of rows, and together they take at most a quarter of a PE's SRAM. The columns are the
    widest multiple of the vector lanes that fits one row, cut into chunks of like sizes."""
    lanes, held = cfg.vector_lanes, 4 * chunk_tiles * STAGES * STAGES
    widest = (cfg.sram_bytes_per_pe // 4) // held // lanes * lanes
    if widest < lanes:
        raise UnsupportedRegionError("row", label, f"{chunk_tiles} tiles of even {lanes} columns each do "
                                                   f"not fit one PE's SRAM on {cfg.name}")
    chunks = -(-C // widest)   # as few chunks as fit, of like sizes (no short last one)
    cols = min(widest, max(lanes, -(-C // chunks // lanes) * lanes))
    rows = row_tiles(sizes[-1], cols * held // STAGES, cfg, STAGES, math.prod(sizes[:-1]))
    return rows, cols


class SplitRow:
    """A row-wise region whose rows do not fit SRAM, written over chunks of columns (``cols``).

    At most one node reduces along the row (a reduction, var, a norm or softmax): its statistics
    are gathered over the chunks in passes, each pass loading the row again a chunk at a time and
    recomputing the elementwise ops before it; a last pass applies it and the ops after it and
    stores each chunk. The passes follow the whole-row lines: a layer norm centres twice (its mean,
    then the mean of what is left: E[d^2] - E[d]^2 of the once-centred d, whose mean is an ulp), a
    softmax takes the row max before the sum of exponentials. Values along no column (a row's
    statistic, an operand of one value per row) are computed once per block of rows."""

    def __init__(self, body, shapes, C, reducer, before, after, label):
        self.body, self.shapes, self.C, self.label = body, shapes, C, label
        self.reducer, self.before, self.after = reducer, before, after
        self.chunk_tiles = 0   # tiles of a chunk's size the passes make (each a buffer of its own)

    @classmethod
    def of(cls, body, shapes, C: int, label: str) -> "SplitRow":
        reducers = [n for n in body.nodes if n.op.name in vector.REDUCTIONS or n.op.name in vector.ROW_OPS]
        if len(reducers) > 1:
            n = reducers[1]
            raise UnsupportedRegionError(n.op.name, label, f"rows of {C} elements do not fit SRAM, and split "
                                         f"rows take one reduction along the row, not {len(reducers)}",
                                         loc=n.loc, node=n)
        reducer = reducers[0] if reducers else None
        if reducer is not None and not reducer.inputs[0].type.dtype.is_float:
            raise UnsupportedRegionError(reducer.op.name, label, "a split-row reduction of integers",
                                         loc=reducer.loc, node=reducer)
        after, tainted = [], {reducer.outputs[0].name} if reducer is not None else set()
        for n in body.nodes:
            if n is not reducer and any(x.name in tainted for x in n.inputs):
                tainted.add(n.outputs[0].name)
                after.append(n)
        before = [n for n in body.nodes if n is not reducer and n not in after]
        return cls(body, shapes, C, reducer, before, after, label)

    def _along(self, v) -> bool:
        return self.shapes[v.name][-1] == self.C

    def _chunk(self, w, names, emit, tiles, chunked, nodes, want=()):
        """Inside a chunk loop: the chunked operands `nodes` read (and the values `want`), loaded,
        and `nodes` along the row computed; returns the tiles by value name."""
        t = dict(tiles)
        needed = {x.name for n in nodes for x in n.inputs} | set(want)
        for v, box in chunked.items():
            if v in needed:
                t[v] = names.new(v + "_c")
                w(f"{t[v]} = fl.load({box})")
                self.chunk_tiles += 1
        for n in nodes:
            if self._along(n.outputs[0]):
                t[n.outputs[0].name] = emit.node(n, [t[x.name] for x in n.inputs], n.inputs[0].type.rank - 1)
                self.chunk_tiles += 4   # a composed op (gelu, a norm's affine) makes a few
        return t

    def _ancestors(self, v) -> list:
        """The nodes of `before` along the row that value `v` needs."""
        producer = {n.outputs[0].name: n for n in self.before}
        need, stack = set(), [v.name]
        while stack:
            n = producer.get(stack.pop())
            if n is not None and id(n) not in need:
                need.add(id(n))
                stack += [x.name for x in n.inputs]
        return [n for n in self.before if id(n) in need]

    def emit(self, w, names, tiles, chunked, out_names):
        """The passes, in a block of rows whose operands not along the columns are `tiles`;
        `chunked`: the boxes of those along them, `out_names`: (value, output, its row index)."""
        outs = {v.name: (o, index) for v, o, index in out_names}
        emit = vector.VectorEmitter(w, names, self.label, axis="-1")
        tiles = dict(tiles)
        for n in self.before:   # one value per row: once per block of rows
            if not self._along(n.outputs[0]):
                tiles[n.outputs[0].name] = emit.node(n, [tiles[x.name] for x in n.inputs], n.inputs[0].type.rank - 1)
        apply = None
        if self.reducer is not None:
            apply = self._statistics(w, names, emit, tiles, chunked)
        for n in self.after:
            if not self._along(n.outputs[0]):
                tiles[n.outputs[0].name] = emit.node(n, [tiles[x.name] for x in n.inputs], n.inputs[0].type.rank - 1)
        for v in self.body.outputs:   # results of one value per row: stored once
            if not self._along(v):
                w(f"fl.store({outs[v.name][0]}[{', '.join(outs[v.name][1] + [':'])}], {tiles[v.name]})")
        if not any(self._along(v) for v in self.body.outputs):
            return
        w("for cs in fl.range(fl.tiles(C, cols), stages=stages):")
        with w.indent():
            outputs = [v.name for v in self.body.outputs if self._along(v)]
            reads = [x.name for x in self.reducer.inputs] if self.reducer is not None else []
            t = self._chunk(w, names, emit, tiles, chunked, self.before, want=outputs + reads)
            if apply is not None:
                t[self.reducer.outputs[0].name] = apply(t)
                self.chunk_tiles += 6
            t = self._chunk(w, names, emit, t, chunked, self.after)
            for v in self.body.outputs:
                if self._along(v):
                    w(f"fl.store({outs[v.name][0]}[{', '.join(outs[v.name][1] + ['cs'])}], {t[v.name]})")

    def _pass(self, w, names, emit, tiles, chunked, line):
        """One pass over the chunks: `line(x)` is the accumulating line on the reducer's input."""
        w("for cs in fl.range(fl.tiles(C, cols), stages=stages):")
        self.chunk_tiles += 4   # its own temporaries (a difference, a square, an exponential)
        with w.indent():
            x = self.reducer.inputs[0]
            t = self._chunk(w, names, emit, tiles, chunked, self._ancestors(x), want=(x.name,))
            line(t[x.name])

    def _statistics(self, w, names, emit, tiles, chunked):
        """The reducer's statistics over the whole row (after its passes); returns how the last pass
        applies it to a chunk (a function of the chunk's tiles), or None for a reduction, whose
        value (one per row) is then in `tiles`."""
        n, C = self.reducer, self.C
        op, name = n.op.name, names.new(n.outputs[0].name)
        kw = emit.dtype_kw(n.outputs[0].type.dtype, DType.f32)
        shape = "(rs, 1)"
        acc = names.new(name + "_acc")
        if op in ("sum", "mean"):
            w(f"{acc} = fl.zeros({shape})")
            self._pass(w, names, emit, tiles, chunked, lambda x: w(f"fl.add({acc}, {x}.sum(axis=-1), out={acc})"))
            emit.affine(name, f"{acc} / {C}" if op == "mean" else acc, [], kw)
            tiles[n.outputs[0].name] = name
            return None
        if op in ("amax", "amin"):
            pick, start = ("maximum", 'float("-inf")') if op == "amax" else ("minimum", 'float("inf")')
            w(f"{acc} = fl.full({shape}, {start})")
            part = "max" if op == "amax" else "min"
            self._pass(w, names, emit, tiles, chunked, lambda x: w(f"fl.{pick}({acc}, {x}.{part}(axis=-1), out={acc})"))
            emit.affine(name, acc, [], kw)
            tiles[n.outputs[0].name] = name
            return None
        mean, sq = names.new(name + "_mean"), names.new(name + "_squares")
        if op in ("var", "layer_norm"):
            w(f"{acc} = fl.zeros({shape})")
            self._pass(w, names, emit, tiles, chunked, lambda x: w(f"fl.add({acc}, {x}.sum(axis=-1), out={acc})"))
            w(f"{mean} = {acc} / {C}")
            resid = names.new(name + "_residue")
            w(f"{resid}, {sq} = fl.zeros({shape}), fl.zeros({shape})")

            def second(x):
                d = names.new(name + "_d")
                w(f"{d} = {x} - {mean}")
                w(f"fl.add({resid}, {d}.sum(axis=-1), out={resid})")
                w(f"fl.add({sq}, ({d} * {d}).sum(axis=-1), out={sq})")
            self._pass(w, names, emit, tiles, chunked, second)
            if op == "var":
                dof = C - n.attrs["correction"]
                if dof <= 0:
                    emit.unsupported(n, f"{C} elements with correction {n.attrs['correction']}: no degrees of freedom")
                emit.affine(name, f"({sq} - {resid} * {resid} / {C}) / {dof}", [], kw)
                tiles[n.outputs[0].name] = name
                return None
            rstd, shift = names.new(name + "_rstd"), names.new(name + "_shift")
            w(f"{shift} = {mean} + {resid} / {C}")
            w(f"{rstd} = fl.rsqrt({sq} / {C} - ({resid} / {C}) * ({resid} / {C}) + {literal(n.attrs['eps'])})")
            return lambda t: self._apply_norm(w, names, emit, n, t, (f"({t[n.inputs[0].name]} - {shift})", rstd), kw)
        if op == "rms_norm":
            eps = n.attrs["eps"]
            eps = literal(eps) if eps is not None else literal(1.1920928955078125e-07)  # f32's epsilon
            w(f"{sq} = fl.zeros({shape})")
            self._pass(w, names, emit, tiles, chunked, lambda x: w(f"fl.add({sq}, ({x} * {x}).sum(axis=-1), out={sq})"))
            rrms = names.new(name + "_rrms")
            w(f"{rrms} = fl.rsqrt({sq} / {C} + {eps})")
            return lambda t: self._apply_norm(w, names, emit, n, t, (t[n.inputs[0].name], rrms), kw)
        # softmax, log_softmax: the row max, then the sum of exponentials below it
        top = names.new(name + "_max")
        w(f"{top} = fl.full({shape}, float(\"-inf\"))")
        self._pass(w, names, emit, tiles, chunked, lambda x: w(f"fl.maximum({top}, {x}.max(axis=-1), out={top})"))
        w(f"{acc} = fl.zeros({shape})")
        self._pass(w, names, emit, tiles, chunked,
                   lambda x: w(f"fl.add({acc}, fl.exp({x} - {top}).sum(axis=-1), out={acc})"))

        def softmax(t):
            y = names.new(name)
            x = t[n.inputs[0].name]
            if op == "softmax":
                w(f"{y} = fl.div(fl.exp({x} - {top}), {acc}{kw})")
            else:
                w(f"{y} = fl.sub({x} - {top}, fl.log({acc}){kw})")
            return y
        return softmax

    @staticmethod
    def _apply_norm(w, names, emit, n, t, normed, kw):
        y = names.new(n.outputs[0].name)
        emit.affine(y, normed, [t[x.name] for x in n.inputs[1:]], kw)
        return y


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

