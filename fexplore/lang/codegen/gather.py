"""The gather part: ops that read or write rows picked by an index tensor, as DMA gathers and
scatters (`fl.gather`, `fl.scatter`) -- the rows move between DRAM and SRAM once, never the table.

    embedding(w, idx)                 rows of w           -> a row gather
    index(x, idx, axes=(a,))          x[..., idx, ...]    -> a row gather along axis a (several
                                                             adjacent index tensors of one shape too)
    gather(x, idx, axis)              torch.gather        -> an element gather (one per index)
    index_put(x, v, idx, axes=(a,))   x[..., idx, ...] = v (or +=)  -> the output starts as x
                                                             (`fl.output(init=x)`: a copy, or x's
                                                             own bytes), then a row scatter
    scatter(x, idx, src, axis)        torch.scatter(_add), scatter_reduce (sum, prod, amax, amin)
                                                          -> the output starts as x (a mean: a
                                                             copy), then an element scatter that
                                                             reduces on write (without include_self
                                                             the picked places first get the
                                                             reduction's identity); a float mean
                                                             also scatter-adds a count per place,
                                                             then divides by it

A row gather views the table as (P, A, R): the axes before the indexed one merged into P, the
indexed axis A, the axes after it merged into R (free views of the row-major array), and the index
as N values. Blocks of (p, index rows, columns) go round-robin to the PEs, double buffered. Index
values in [-A, A) are valid (negative from the end, as torch's indexing); others fail when the
kernel runs, as torch does.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from fexplore.ir import Node
from fexplore.ir.ops.scatter import reduction_identity

from .common import Inputs, Signature, body_of, header, kernel_name, region_label
from .errors import UnsupportedRegionError
from .generated import GeneratedKernel, Result
from .source import Names, Writer, fl_dtype, literal, scalar_constant

STAGES = 2
GATHERS = ("embedding", "index", "gather", "index_put", "scatter")
# the IR scatter's reductions: those the DMA engine applies on write (fl.scatter's reduce=), and a
# mean, a sum divided by a count of writes per place (scatter-added too)
SCATTER_ON_CHIP = {"none": None, "add": "add", "amax": "max", "amin": "min", "mul": "mul", "mean": "mean"}
MAX_ITERATIONS = 8192   # loops unroll at trace time: beyond this the kernel is too big to trace


def generate_gather(node: Node, cfg) -> GeneratedKernel:
    op = node.op.name
    label = region_label(node)
    for v in list(node.inputs) + list(node.outputs):
        if any(not isinstance(d, int) for d in v.type.shape):
            raise UnsupportedRegionError(op, label, "symbolic sizes (specialize the shapes first)", loc=node.loc)
    if op == "embedding":
        return _rows(node, cfg, table=0, index=(1,), axes=(0,), values=None)
    if op == "index":
        axes = tuple(node.attrs["axes"])
        return _rows(node, cfg, table=0, index=tuple(range(1, 1 + len(axes))), axes=axes, values=None)
    if op == "index_put":
        axes = tuple(node.attrs["axes"])
        return _rows(node, cfg, table=0, index=tuple(range(2, 2 + len(axes))), axes=axes, values=1,
                     reduce="add" if node.attrs["accumulate"] else None)
    if op == "gather":
        return _elements(node, cfg, table=0, index=1, values=None)
    if op == "scatter":
        reduce = node.attrs["reduce"]
        if reduce not in SCATTER_ON_CHIP:
            raise UnsupportedRegionError(op, label, f"reduce={reduce!r} (the reductions written: "
                                                    f"{', '.join(SCATTER_ON_CHIP)})", loc=node.loc)
        if reduce != "none" and node.inputs[0].type.dtype.name == "bool":
            raise UnsupportedRegionError(op, label, f"reduce={reduce!r} of a bool tensor", loc=node.loc)
        if reduce == "mean" and not node.inputs[0].type.dtype.is_float:
            raise UnsupportedRegionError(op, label, "reduce='mean' of integers (a floor division the vector "
                                                    "unit does not have)", loc=node.loc)
        return _elements(node, cfg, table=0, index=1, values=2, reduce=SCATTER_ON_CHIP[reduce],
                         include_self=node.attrs["include_self"])
    raise UnsupportedRegionError(op, label, "not a gather or scatter op", loc=node.loc)


# ---- rows: embedding, index, index_put ---------------------------------------------------------------
def _rows(node: Node, cfg, *, table: int, index: tuple, axes: tuple, values: int | None, reduce=None):
    op, label = node.op.name, region_label(node)
    x, idxs = node.inputs[table], [node.inputs[i] for i in index]
    shape = tuple(x.type.shape)
    if not shape:
        raise UnsupportedRegionError(op, label, "a 0-d table", loc=node.loc)
    axes = tuple(a % len(shape) for a in axes)
    k = len(axes)
    if axes != tuple(range(axes[0], axes[0] + k)):
        raise UnsupportedRegionError(op, label, f"index tensors on axes {list(axes)} that are not adjacent "
                                                "(the result's axes move to the front)", loc=node.loc)
    if len({tuple(v.type.shape) for v in idxs}) != 1:
        return _rows_broadcast(node, cfg, x, idxs, axes, values=values, reduce=reduce, table=table)
    axis = axes[0]
    P, R = math.prod(shape[:axis]), math.prod(shape[axis + k:])
    A = shape[axis:axis + k]
    N = max(1, math.prod(idxs[0].type.shape))
    if values is not None:
        v = node.inputs[values]
        if math.prod(v.type.shape) != P * N * R:
            raise UnsupportedRegionError(op, label, f"values {v.type} broadcast to the indexed rows "
                                                    "(values of the indexed shape are written)", loc=node.loc)
    item = x.type.dtype.itemsize
    rows, cols = _row_tiles(cfg, N, R, item, P, k)
    iterations = P * math.ceil(N / rows) * math.ceil(R / cols)
    if iterations > MAX_ITERATIONS:
        raise UnsupportedRegionError(op, label, f"{iterations:,} blocks (more than {MAX_ITERATIONS:,} to unroll)",
                                     loc=node.loc)

    body = body_of(node)
    inputs = Inputs.of(node, body)
    anames = ["A"] if k == 1 else [f"A{j}" for j in range(k)]
    ivars = ["i"] if k == 1 else [f"i{j}" for j in range(k)]
    names = Names({"rows", "cols", "stages", "p", "ns", "rs", "As", "picked", "vals", "P", "N", "R", "OUT",
                   *anames, *ivars, *(a.lower() for a in anames)})
    fname = kernel_name(node)
    names.taken.add(fname)
    sig = Signature(names, inputs)
    lead = P > 1
    tab_spec = (['"P"'] if lead else []) + [f'"{a}"' for a in anames] + ['"R"']
    tname = sig.add(x, ((P,) if lead else ()) + A + (R,), tab_spec)
    if values is not None:
        vname = sig.add(node.inputs[values], ((P,) if lead else ()) + (N, R), (['"P"'] if lead else []) + ['"N"', '"R"'])
    inames = [sig.add(v, (N,), ['"N"']) for v in idxs]

    w = Writer()
    what = "scatter" if values is not None else "gather"
    header(w, node, body, f"{what} (DMA)", sig.header, {})
    picks = " and ".join(inames)
    if values is not None:
        w(f"# the output starts as {tname} (copied, or {tname} itself where nothing reads it after this "
          f"kernel); the rows {picks} pick are then "
          + ("added onto" if reduce == "add" else "overwritten (of repeated indices the last one wins)"))
    w(f'@fl.kernel(target="{cfg.name}")')
    w(f"def {fname}({', '.join(sig.annotations)}, *, rows: int = {rows}, cols: int = {cols}, "
      f"stages: int = {STAGES}):")
    pre = "p, " if lead else ""
    grid = "P, " if lead else ""
    whole = ", ".join(":" for _ in range(k))
    idx_expr = ivars[0] if k == 1 else f"({', '.join(ivars)})"
    with w.indent():
        w(f"{pre.upper()}{', '.join(anames)}, R = {tname}.shape")
        w(f"(N,) = {inames[0]}.shape")
        dt = fl_dtype(x.type.dtype)
        if values is None:
            out_spec = (['"P"'] if lead else []) + ['"N"', '"R"']
            w(f"OUT = fl.output({dt}[{', '.join(out_spec)}])")
        else:
            w(f"OUT = fl.output({dt}[{', '.join(tab_spec)}], init={tname})")
        w(f"for {pre}ns, rs in fl.parallel({grid}fl.tiles(N, rows), fl.tiles(R, cols), stages=stages):")
        with w.indent():
            for iv, iname in zip(ivars, inames):
                w(f"{iv} = fl.load({iname}[ns])")
            if values is None:
                w(f"picked = fl.gather({tname}[{pre}{whole}, rs], {idx_expr})   # the rows picked, straight "
                  "from DRAM")
                w(f"fl.store(OUT[{pre}ns, rs], picked)")
            else:
                w(f"vals = fl.load({vname}[{pre}ns, rs])")
                red = ', reduce="add"' if reduce == "add" else ""
                w(f"fl.scatter(OUT[{pre}{whole}, rs], {idx_expr}, vals{red})")
        w("return OUT")
    results = (Result(0, tuple(node.outputs[0].type.shape)),)
    return GeneratedKernel(fname, "gather", w.text(), cfg, tuple(sig.params), results, (what,),
                           initial=((0, table),) if values is not None else ())


def _rows_broadcast(node: Node, cfg, x, idxs, axes: tuple, values: int | None = None,
                    reduce=None, table: int = 0) -> GeneratedKernel:
    """Index tensors of different shapes that broadcast together (``mask[b[:, None], t[None, :]]``):
    each is loaded whole and broadcast on the vector unit to the common shape (exact for index
    values below 2**24, as the unit computes in f32), then one gather per block of columns. An
    index_put (`values`, an input of the broadcast index's shape of rows) copies the table first
    and scatters each block of columns of the values instead."""
    op, label = node.op.name, region_label(node)
    shape = tuple(x.type.shape)
    try:
        bshape = tuple(int(d) for d in np.broadcast_shapes(*(tuple(v.type.shape) for v in idxs)))
    except ValueError:
        raise UnsupportedRegionError(op, label, "index tensors that do not broadcast", loc=node.loc) from None
    k, axis = len(axes), axes[0]
    P, R = math.prod(shape[:axis]), math.prod(shape[axis + k:])
    A = shape[axis:axis + k]
    N = max(1, math.prod(bshape))
    item = x.type.dtype.itemsize
    budget = cfg.sram_bytes_per_pe // 4
    if max(A) >= 1 << 24 or STAGES * N * (8 * (2 * k) + item) > budget:
        raise UnsupportedRegionError(op, label, f"a broadcast index of {N:,} rows that does not fit a quarter of "
                                                f"a PE's SRAM on {cfg.name}", loc=node.loc)
    if values is not None and math.prod(node.inputs[values].type.shape) != P * N * R:
        raise UnsupportedRegionError(op, label, f"values {node.inputs[values].type} broadcast to the indexed rows "
                                                "(values of the indexed shape are written)", loc=node.loc)
    cols = R
    while cols > 1 and STAGES * N * (cols * item + 16 * k) > budget:
        cols = -(-cols // 2)
    blocks = P * math.ceil(R / cols)
    if blocks > MAX_ITERATIONS:
        raise UnsupportedRegionError(op, label, f"more than {MAX_ITERATIONS:,} blocks to unroll", loc=node.loc)
    bs = bshape or (1,)

    body = body_of(node)
    names = Names({"cols", "stages", "p", "rs", "As", "picked", "vals", "P", "R", "OUT",
                   *(f"A{j}" for j in range(k)), *(f"a{j}" for j in range(k)), *(f"i{j}" for j in range(k))})
    fname = kernel_name(node)
    names.taken.add(fname)
    sig = Signature(names, Inputs.of(node, body))
    lead = P > 1
    anames = [f"A{j}" for j in range(k)]
    tname = sig.add(x, ((P,) if lead else ()) + A + (R,),
                    (['"P"'] if lead else []) + [f'"{a}"' for a in anames] + ['"R"'])
    if values is not None:
        vname = sig.add(node.inputs[values], ((P,) if lead else ()) + bs + (R,),
                        (['"P"'] if lead else []) + [str(d) for d in bs] + ['"R"'])
    inames = []
    for v in idxs:   # each index right-aligned into the broadcast rank: a free view
        own = (1,) * (len(bs) - len(v.type.shape)) + tuple(v.type.shape)
        inames.append(sig.add(v, own, [str(d) for d in own]))

    w = Writer()
    what = "scatter" if values is not None else "gather"
    header(w, node, body, f"{what} (DMA)", sig.header, {})
    w(f"# the index tensors broadcast to {list(bs)}; each is broadcast on the vector unit, then {what}ed")
    if values is not None:
        w(f"# the output starts as {tname} (copied, or {tname} itself where nothing reads it after this "
          "kernel); the rows the indices pick are then "
          + ("added onto" if reduce == "add" else "overwritten (of repeated indices the last one wins)"))
    w(f'@fl.kernel(target="{cfg.name}")')
    w(f"def {fname}({', '.join(sig.annotations)}, *, cols: int = {cols}, stages: int = {STAGES}):")
    pre, grid = ("p, ", "P, ") if lead else ("", "")
    whole = ", ".join(":" for _ in range(k))
    with w.indent():
        w(f"{pre.upper()}{', '.join(anames)}, R = {tname}.shape")
        dims = ", ".join(str(d) for d in bs) + ("," if len(bs) == 1 else "")
        lead_axis = '"P", ' if lead else ""
        dt = fl_dtype(x.type.dtype)
        if values is None:
            w(f'OUT = fl.output({dt}[{lead_axis}{dims}, "R"])')
        else:
            w(f'OUT = fl.output({dt}[{lead_axis}{", ".join(repr(a) for a in anames)}, "R"], init={tname})')
        w(f"for {pre}rs in fl.parallel({grid}fl.tiles(R, cols), stages=stages):")
        with w.indent():
            for j, iname in enumerate(inames):
                w(f"i{j} = fl.broadcast_to(fl.load({iname}), ({dims}))")
            idx = ", ".join(f"i{j}" for j in range(k)) + ("," if k == 1 else "")
            if values is None:
                w(f"picked = fl.gather({tname}[{pre}{whole}, rs], ({idx}))")
                w(f"fl.store(OUT[{pre}{', '.join(':' for _ in bs)}, rs], picked)")
            else:
                w(f"vals = fl.load({vname}[{pre}{', '.join(':' for _ in bs)}, rs])")
                red = ', reduce="add"' if reduce == "add" else ""
                w(f"fl.scatter(OUT[{pre}{whole}, rs], ({idx}), vals{red})")
        w("return OUT")
    results = (Result(0, tuple(node.outputs[0].type.shape)),)
    return GeneratedKernel(fname, "gather", w.text(), cfg, tuple(sig.params), results, (what,),
                           initial=((0, table),) if values is not None else ())


def _row_tiles(cfg, N: int, R: int, item: int, P: int, k: int = 1) -> tuple[int, int]:
    """(index rows, columns) per block: columns as many as fit, rows to fill a quarter of SRAM over
    the stages (a block holds the index, the picked rows and, for a scatter, the values), and enough
    blocks to give every PE some."""
    budget = cfg.sram_bytes_per_pe // 4
    cols = R
    while cols > 16 and 2 * STAGES * cols * item > budget // 8:
        cols = -(-cols // 2)
    per_row = STAGES * (2 * cols * item + 8 * k)
    rows = max(1, min(N, budget // per_row, 512))
    while rows > 8 and P * math.ceil(N / rows) * math.ceil(R / cols) < cfg.num_pes:
        rows = -(-rows // 2)
    return rows, cols


# ---- elements: torch.gather, torch.scatter ---------------------------------------------------------------
def _elements(node: Node, cfg, *, table: int, index: int, values: int | None, reduce=None, include_self=True):
    op, label = node.op.name, region_label(node)
    x, idx = node.inputs[table], node.inputs[index]
    xs, js = tuple(x.type.shape), tuple(idx.type.shape)
    rank = len(xs)
    if rank == 0 or len(js) != rank or min(js, default=1) == 0:
        raise UnsupportedRegionError(op, label, "a 0-d or empty index", loc=node.loc)
    axis = node.attrs["axis"] % rank
    src = node.inputs[values] if values is not None else None
    scalar = src is not None and src.type.rank == 0    # torch.scatter(x, axis, idx, value)
    if src is not None and not scalar and (len(src.type.shape) != rank or
                                           any(s < j for s, j in zip(src.type.shape, js))):
        raise UnsupportedRegionError(op, label, f"a source {src.type} smaller than the index", loc=node.loc)
    item = x.type.dtype.itemsize
    per_element = STAGES * (8 + 2 * item)   # an index, the picked value and the one written, in flight
    per_row = per_element * math.prod(js[1:])
    budget = cfg.sram_bytes_per_pe // 4
    # an index row too long for SRAM is cut along its last axis other than the indexed one (the
    # table and the output are cut alike there: torch.gather pairs them position for position)
    col_axis, cols = None, None
    if per_row > budget:
        col_axis = next((d for d in range(rank - 1, 0, -1) if d != axis), None)
        cols = budget // (per_row // js[col_axis]) if col_axis is not None else 0
        if cols < 1:
            raise UnsupportedRegionError(op, label, f"one index row of {math.prod(js[1:])} elements does not fit "
                                                    f"a quarter of a PE's SRAM on {cfg.name}", loc=node.loc)
        per_row = per_row // js[col_axis] * cols
    rows = max(1, min(js[0], budget // per_row, 512))
    while rows > 1 and math.ceil(js[0] / rows) < cfg.num_pes:
        rows = -(-rows // 2)
    blocks = math.ceil(js[0] / rows) * (math.ceil(js[col_axis] / cols) if cols else 1)
    if blocks > MAX_ITERATIONS:
        raise UnsupportedRegionError(op, label, f"more than {MAX_ITERATIONS:,} blocks to unroll", loc=node.loc)
    # a mean copies the table itself, with a count per place: the copy's rows in flight (its last
    # pass holds a row of the sum, of the f32 count and its quotient); other scatters start the
    # output as the table (`fl.output(init=)`)
    mean = reduce == "mean"
    copy_row = 3 * STAGES * math.prod(xs[1:]) * max(item, 4)
    copy_cols = None   # a row too long for SRAM is copied in pieces of its last axis
    if mean and copy_row > budget:
        copy_cols = budget // (copy_row // xs[-1]) if rank > 1 else 0
        if copy_cols < 1:
            raise UnsupportedRegionError(op, label, "a row of the tensor does not fit SRAM for the copy", loc=node.loc)
        copy_row = copy_row // xs[-1] * copy_cols
    copy_rows = max(1, min(xs[0], budget // max(1, copy_row)))
    if mean and math.ceil(xs[0] / copy_rows) * math.ceil(xs[-1] / (copy_cols or xs[-1])) > MAX_ITERATIONS:
        raise UnsupportedRegionError(op, label, f"more than {MAX_ITERATIONS:,} blocks to copy", loc=node.loc)

    body = body_of(node)
    inputs = Inputs.of(node, body)
    names = Names({"rows", "cols", "copy_rows", "copy_cols", "stages", "ts", "cs", "ccs", "i", "picked", "vals",
                   "OUT", "COUNT", "X", "J", "t"})
    fname = kernel_name(node)
    names.taken.add(fname)
    sig = Signature(names, inputs)
    xaxes = [f'"X{d}"' for d in range(rank)]
    jaxes = [f'"J{d}"' for d in range(rank)]
    tname = sig.add(x, xs, xaxes)
    iname = sig.add(idx, js, jaxes)
    scattered = scalar_constant(src) if scalar else None
    sname = None
    if src is not None and scattered is None:
        sname = sig.add(src, (1,) if scalar else tuple(src.type.shape),
                        ["1"] if scalar else [f'"S{d}"' for d in range(rank)])

    def box(tensor, full, tiled_axis_full):
        """Dim 0 tiled (ts), the indexed axis whole in a table box, a cut index row's axis tiled
        (cs), the rest cut to the index's extent."""
        parts = []
        for d in range(rank):
            if d == 0:
                parts.append(":" if (tiled_axis_full and d == axis) else "ts")
            elif d == col_axis:
                parts.append("cs")
            elif (tiled_axis_full and d == axis) or full[d] == js[d]:
                parts.append(":")
            else:
                parts.append(f"0:{js[d]}")
        return f"{tensor}[{', '.join(parts)}]"

    index_box = box(iname, js, False)

    def copy_box(tensor):
        return f"{tensor}[ts{', :' * (rank - 2)}, ccs]" if copy_cols else f"{tensor}[ts]"

    @contextlib.contextmanager
    def tiled(extent: int, rows: str, cut_extent: int, cut: str | None, var: str):
        """Loops over tiles: `rows` of the first axis in parallel, and pieces (`cut` wide, of a
        `cut_extent` axis) when a row is cut."""
        w(f"for ts in fl.parallel(fl.tiles({extent}, {rows}), stages=stages):")
        with w.indent():
            if cut is None:
                yield
                return
            w(f"for {var} in fl.range(fl.tiles({cut_extent}, {cut}), stages=stages):")
            with w.indent():
                yield

    def copy_tiles():   # the copy of x: rows, and a row's pieces along x's last axis
        return tiled(xs[0], "copy_rows", xs[-1], "copy_cols" if copy_cols else None, "ccs")

    def index_tiles():   # the index: rows, and a cut row's columns
        return tiled(js[0], "rows", js[col_axis] if col_axis is not None else 0,
                     "cols" if col_axis is not None else None, "cs")

    w = Writer()
    what = "scatter" if src is not None else "gather"
    header(w, node, body, f"DMA element-{what}", sig.header, {})
    w(f"# one DMA transfer per index element along axis {axis} (torch.{what}): each element is its own "
      f"{cfg.dram_min_transfer_bytes} B line")
    if src is not None:
        how = {"add": "added onto", "max": "maxed into", "min": "mined into", "mul": "multiplied into",
               "mean": "added onto, each place's count of them added into COUNT, and the sums divided by the "
                       "counts"}
        start = f"a copy of {tname}" if mean else \
            f"{tname} (copied, or {tname} itself where nothing reads it after this kernel)"
        w(f"# the output starts as {start}; the elements {iname} picks are then "
          + (how[reduce] if reduce else "overwritten (of repeated indices the last one wins)"))
        if reduce and not include_self:
            w("# (without include_self: the picked elements first get the reduction's identity, all of them "
              "before any value is combined)")
    w(f'@fl.kernel(target="{cfg.name}")')
    copy_kw = f", copy_rows: int = {copy_rows}" if mean else ""
    copy_kw += f", copy_cols: int = {copy_cols}" if copy_cols else ""
    cols_kw = f", cols: int = {cols}" if col_axis is not None else ""
    w(f"def {fname}({', '.join(sig.annotations)}, *, rows: int = {rows}{cols_kw}{copy_kw}, stages: int = {STAGES}):")
    dt = fl_dtype(x.type.dtype)
    with w.indent():
        if src is None:
            w(f"OUT = fl.output({dt}[{', '.join(jaxes)}])")
        else:
            if mean:
                w(f"OUT = fl.output({dt}[{', '.join(xaxes)}])")
                w(f"COUNT = fl.scratch(fl.f32[{', '.join(xaxes)}])   # the values each place averages")
                with copy_tiles():
                    w(f"t = fl.load({copy_box(tname)})")
                    w(f"fl.store({copy_box('OUT')}, t)   # the copy")
                    w(f"fl.store({copy_box('COUNT')}, fl.full(t.shape, {1.0 if include_self else 0.0}, fl.f32))"
                      + ("   # its own value counts" if include_self else ""))
            else:
                w(f"OUT = fl.output({dt}[{', '.join(xaxes)}], init={tname})")
            if reduce and not include_self:
                with index_tiles():
                    w(f"i = fl.load({index_box})")
                    start = literal(reduction_identity(node.attrs["reduce"], x.type.dtype.numpy))
                    w(f"fl.scatter({box('OUT', xs, True)}, i, fl.full(i.shape, {start}, {dt}), axis={axis}, "
                      f"mode=\"elements\")")
        with index_tiles():
            w(f"i = fl.load({index_box})")
            if src is None:
                w(f'picked = fl.gather({box(tname, xs, True)}, i, axis={axis}, mode="elements")')
                w(f"fl.store({box('OUT', js, False)}, picked)")
            else:
                if scattered is not None:
                    w(f"vals = fl.full(i.shape, {scattered}, {dt})   # the scattered value, written in")
                elif scalar:
                    w(f"vals = fl.broadcast_to(fl.load({sname}), i.shape)")
                else:
                    w(f"vals = fl.load({box(sname, src.type.shape, False)})")
                red = f', reduce="{"add" if mean else reduce}"' if reduce else ""
                w(f'fl.scatter({box("OUT", xs, True)}, i, vals, axis={axis}, mode="elements"{red})')
                if mean:
                    w(f'fl.scatter({box("COUNT", xs, True)}, i, fl.full(i.shape, 1.0, fl.f32), axis={axis}, '
                      'mode="elements", reduce="add")')
        if mean:   # a place no value reached keeps its own (a count of 0, or 1 for its own)
            with copy_tiles():
                w(f"fl.store({copy_box('OUT')}, fl.div(fl.load({copy_box('OUT')}), "
                  f"fl.maximum(fl.load({copy_box('COUNT')}), 1.0), dtype={dt}))")
        w("return OUT")
    results = (Result(0, tuple(node.outputs[0].type.shape)),)
    return GeneratedKernel(fname, "gather", w.text(), cfg, tuple(sig.params), results, (f"element {what}",),
                           initial=((0, table),) if src is not None and not mean else ())
