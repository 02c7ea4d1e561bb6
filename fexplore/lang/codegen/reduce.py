"""The reduction kernel: reductions over any neighbouring axes, arg-extremes, scans, topk and sort.

The input is seen as (R, K, C): the reduced (or scanned, or ranked) axes merged into K between the
kept axes before (R) and after (C); the vector part already reduces a row's last axis, this part
reduces any run of axes. A block of (rows, K tile, columns) is loaded at a time and reduced over
its middle axis on the vector unit into an accumulator of (rows, columns):

    sum, mean, amax, amin, any   a partial reduction per K tile, added (maxed) into the accumulator
    var                          two passes: the mean, then the squared deviations from it
    prod                         one K index at a time (the vector unit has no product reduction)
    argmax, argmin               per K tile: its extreme, and the first index that holds it, from an
                                 index row written once into DRAM scratch (0, 1, ..., K-1)
    cumsum, cumprod              one K index at a time: a running sum stored at every step
    logcumsumexp                 one K index at a time: a running log-add-exp,
                                 max(run, x) + log1p(exp(-|run - x|))
    cummax, cummin               one K index at a time: the running extreme and where it was seen
    softmax, log_softmax         over an axis that is not the last: a block of (rows, K, columns)
                                 with all of K, its max, exp and sum over the middle axis
    topk                         the whole K axis in one tile, k passes of: the extreme of the elements
                                 not taken yet, its first index, then that element marked taken
    sort                         a rank sort: an element's place is the number of elements that go
                                 before it (smaller, or equal and earlier: stable; NaN last, as
                                 torch), counted against the whole axis a tile of elements at a
                                 time, then each value and its index scattered to its place. K^2
                                 comparisons in a few wide vector commands and two scatters per
                                 tile, not K passes of narrow commands and stores each
"""

from __future__ import annotations

import contextlib
import math

from fexplore.ir import DType, Node

from . import vector
from .boxes import STAGES, Loops, index_row, spec, tile_sizes
from .common import Inputs, Signature, body_of, header, kernel_name, region_label
from .errors import UnsupportedRegionError
from .generated import GeneratedKernel, Result
from .source import Names, Writer, astype, fl_dtype

ACCUMULATE = {"sum": ("0.0", "add", "sum"), "mean": ("0.0", "add", "sum"), "amax": ('float("-inf")', "maximum", "max"),
              "amin": ('float("inf")', "minimum", "min"), "any": ("0.0", "maximum", "max")}
REDUCE = set(ACCUMULATE) | {"prod", "var", "argmax", "argmin", "cumsum", "cumprod", "logcumsumexp", "cummax",
                            "cummin", "topk", "sort"}
SOFTMAX = {"softmax", "log_softmax"}   # over a middle axis (the vector part does the last one)


def takes(node: Node) -> bool:
    """A plain op this part writes: a reduction the vector part cannot (not over the last axis
    alone), and every arg-extreme, scan, topk and sort."""
    op = node.op.name
    if op == "adaptive_avg_pool2d":          # global average pooling: a mean over H and W
        return tuple(node.attrs["output_size"]) == (1, 1)
    if op in SOFTMAX:
        rank = node.inputs[0].type.rank
        return rank > 0 and node.attrs["axis"] % rank != rank - 1
    if op not in REDUCE:
        return False
    if op in ("sum", "mean", "amax", "amin", "var"):
        rank = node.inputs[0].type.rank
        axes = sorted({a % rank for a in node.attrs["axes"]}) if node.attrs["axes"] else list(range(rank))
        return axes != [rank - 1] and rank > 0
    return True


def generate_reduction(node: Node, cfg) -> GeneratedKernel:
    body = body_of(node)
    n = body.nodes[0]
    label = region_label(node)
    x = n.inputs[0]
    for v in list(n.inputs) + list(n.outputs):
        if any(not isinstance(d, int) for d in v.type.shape):
            raise UnsupportedRegionError(n.op.name, label, "symbolic sizes (specialize the shapes first)", loc=n.loc)
        if math.prod(v.type.shape) == 0:
            raise UnsupportedRegionError(n.op.name, label, "an empty tensor", loc=n.loc)
    rank = x.type.rank
    op = n.op.name
    if op == "adaptive_avg_pool2d":
        op, axes = "mean", [2, 3]
    elif op in ACCUMULATE or op in ("prod", "var"):
        axes = sorted({a % rank for a in n.attrs["axes"]}) if n.attrs["axes"] else list(range(rank))
    elif op in ("argmax", "argmin"):
        axes = list(range(rank)) if n.attrs["axis"] is None else [n.attrs["axis"] % max(rank, 1)]
    elif op in SOFTMAX:
        axes = [n.attrs["axis"] % rank]
    else:
        axes = [n.attrs["axis"] % max(rank, 1)] if rank else []
    R, K, C = _around(tuple(x.type.shape), axes, n, label)
    # the parts' own tiles and loop variables, so a parameter named after an IR value never shadows one
    names = Names({"stages", "iota", "R", "K", "C", "OUT", "VALUES", "INDICES", "IOTA", "n", "k", "ks", "p", "rs", "d",
                   "cs", "c", "its", "x_t", "y", "acc", "at", "best", "first", "m", "mean", "won", "run", "squares",
                   "total", "taken", "jrow", "row", "row_nan", "xi", "ii", "xi_nan", "ordered", "tied", "place",
                   "hi", "gap"})
    fname = kernel_name(node)
    names.taken.add(fname)
    inputs = Inputs.of(node, body)
    sig = Signature(names, inputs)
    named = [a for a, s in (("R", R), ("K", K), ("C", C))]
    xname = sig.add(x, (R, K, C), spec(["R", "K", "C"], (R, K, C), named))
    w = Writer()
    header(w, node, body, "reduction", sig.header, inputs.literals)
    w(f'@fl.kernel(target="{cfg.name}")')
    w(f"def {fname}({', '.join(sig.annotations)}, *, stages: int = {STAGES}):")
    with w.indent():
        w(f"R, K, C = {R}, {K}, {C}")
        if op in SOFTMAX:
            _softmax(w, names, n, cfg, xname, R, K, C, label)
        elif op == "sort":
            _rank_sort(w, n, cfg, xname, R, K, C)
        elif op == "topk":
            _ranked(w, n, cfg, xname, R, K, C, label)
        elif op in ("cumsum", "cumprod", "logcumsumexp"):
            _scan(w, n, cfg, xname, R, K, C)
        elif op in ("cummax", "cummin"):
            _running_extreme(w, n, cfg, xname, R, K, C)
        elif op in ("argmax", "argmin"):
            _arg_extreme(w, n, cfg, xname, R, K, C)
        elif op == "var":
            _variance(w, n, cfg, xname, R, K, C, label)
        else:
            _accumulate(w, n, op, cfg, xname, R, K, C)
        w(f"return {'VALUES, INDICES' if len(n.outputs) == 2 else 'OUT'}")
    results = tuple(Result(i, tuple(v.type.shape)) for i, v in enumerate(node.outputs))
    return GeneratedKernel(fname, "reduction", w.text(), cfg, tuple(sig.params), results, (n.op.name,))


def _around(shape, axes, n: Node, label: str) -> tuple[int, int, int]:
    """(R, K, C) with K the reduced axes merged; they must be neighbours (size-1 axes aside)."""
    big = [i for i, d in enumerate(shape) if d != 1]
    red = [i for i in big if i in axes]
    if not red:
        first = axes[0] if axes else len(shape)
        return math.prod(shape[:first]), 1, math.prod(shape[first:])
    pos = [big.index(i) for i in red]
    if pos != list(range(pos[0], pos[0] + len(pos))):
        raise UnsupportedRegionError(n.op.name, label, f"reduces axes {list(axes)} that are not neighbours: "
                                                       f"the reduced axes must merge into one", loc=n.loc)
    return (math.prod(shape[i] for i in big[:pos[0]]), math.prod(shape[i] for i in red),
            math.prod(shape[i] for i in big[pos[-1] + 1:]))


def _outputs(w, n: Node, shape_text: str, axes: str) -> list[str]:
    outs = []
    for k, v in enumerate(n.outputs):
        name = ("VALUES", "INDICES")[k] if len(n.outputs) == 2 else "OUT"
        w(f'{name} = fl.output({shape_text}, {fl_dtype(v.type.dtype)}, axes="{axes}")')
        outs.append(name)
    return outs


def _store_cast(expr: str, dt: DType) -> str:
    return expr if dt == DType.f32 else astype(expr, dt)


def _accumulate(w, n: Node, op: str, cfg, x: str, R: int, K: int, C: int) -> None:
    (out,) = _outputs(w, n, "(R, C)", "R C")
    walk = op == "prod"
    tiles = tile_sizes((R, K, C), cfg, live=3, fixed={1} if walk else ())
    outer = Loops(["R", "C"], (R, C), (tiles[0], tiles[2]), {"R", "C"})
    w(outer.header())
    with w.indent():
        shape = f"({outer.extent(0)}, {outer.extent(1)})"
        cs = outer.index(1, 0, C)
        rs = outer.index(0, 0, R)
        if walk:
            w(f"acc = fl.full({shape}, 1.0)")
            w("for k in fl.range(K):")
            with w.indent():
                w(f"fl.mul(acc, fl.load({x}[{rs}, k, {cs}]), out=acc)")
        else:
            init, combine, part = ACCUMULATE[op]
            w(f"acc = fl.full({shape}, {init})")
            w(f"for ks in fl.range(fl.tiles(K, {tiles[1]})):")
            with w.indent():
                w(f"x_t = fl.load({x}[{rs}, ks, {cs}])")
                if op == "any":
                    w("x_t = x_t != 0.0")
                w(f"fl.{combine}(acc, x_t.{part}(axis=1, keepdims=False), out=acc)")
        result = "acc / K" if op == "mean" else "acc != 0.0" if op == "any" else "acc"
        dt = n.outputs[0].type.dtype
        w(f"fl.store({out}[{rs}, {cs}], {result if op == 'any' else _store_cast(result, dt)})")


def _softmax(w, names, n: Node, cfg, x: str, R: int, K: int, C: int, label: str) -> None:
    """Blocks of (rows, K, columns) holding the whole softmax axis, written by the vector part's own
    softmax lines over the middle axis."""
    tiles = tile_sizes((R, K, C), cfg, live=4)
    if tiles[1] < K:
        raise UnsupportedRegionError(n.op.name, label, f"{n.op.name} over {K} elements of a middle axis: the "
                                                       f"whole axis does not fit one tile on {cfg.name}", loc=n.loc)
    (out,) = _outputs(w, n, "(R, K, C)", "R K C")
    outer = Loops(["R", "C"], (R, C), (tiles[0], tiles[2]), {"R", "C"})
    w(outer.header())
    with w.indent():
        rs, cs = outer.index(0, 0, R), outer.index(1, 0, C)
        w(f"x_t = fl.load({x}[{rs}, :, {cs}])")
        vector.VectorEmitter(w, names, label, axis="1").softmax(n, "x_t", "y")
        w(f"fl.store({out}[{rs}, :, {cs}], y)")


def _variance(w, n: Node, cfg, x: str, R: int, K: int, C: int, label: str) -> None:
    """Two passes over K: the mean, then the squared deviations from it (not E[x^2] - E[x]^2,
    which cancels badly)."""
    dof = K - n.attrs["correction"]
    if dof <= 0:
        raise UnsupportedRegionError("var", label, f"{K} elements with correction {n.attrs['correction']}: "
                                                   f"no degrees of freedom", loc=n.loc)
    w(f'OUT = fl.output((R, 1, C), {fl_dtype(n.outputs[0].type.dtype)}, axes="R _ C")')
    tiles = tile_sizes((R, K, C), cfg, live=4)
    outer = Loops(["R", "C"], (R, C), (tiles[0], tiles[2]), {"R", "C"})
    w(outer.header())
    with w.indent():
        shape = f"({outer.extent(0)}, 1, {outer.extent(1)})"
        rs, cs = outer.index(0, 0, R), outer.index(1, 0, C)
        w(f"total = fl.zeros({shape})")
        w(f"for ks in fl.range(fl.tiles(K, {tiles[1]})):")
        with w.indent():
            w(f"fl.add(total, fl.load({x}[{rs}, ks, {cs}]).sum(axis=1), out=total)")
        w("mean = total / K")
        w(f"squares = fl.zeros({shape})")
        w(f"for ks in fl.range(fl.tiles(K, {tiles[1]})):")
        with w.indent():
            w(f"d = fl.load({x}[{rs}, ks, {cs}]) - mean")
            w("fl.add(squares, (d * d).sum(axis=1), out=squares)")
        w(f"fl.store(OUT[{rs}, :, {cs}], {_store_cast(f'squares / {dof}', n.outputs[0].type.dtype)})")


def _arg_extreme(w, n: Node, cfg, x: str, R: int, K: int, C: int) -> None:
    big = n.op.name == "argmax"
    pick, better, worst = ("max", "gt", 'float("-inf")') if big else ("min", "lt", 'float("inf")')
    (out,) = _outputs(w, n, "(R, C)", "R C")
    index_row(w, cfg, "IOTA", K, 3, 1, "the position of each element along K")
    tiles = tile_sizes((R, K, C), cfg, live=5)
    outer = Loops(["R", "C"], (R, C), (tiles[0], tiles[2]), {"R", "C"})
    w(outer.header())
    with w.indent():
        shape = f"({outer.extent(0)}, {outer.extent(1)})"
        rs, cs = outer.index(0, 0, R), outer.index(1, 0, C)
        w(f"best = fl.full({shape}, {worst})")
        w(f"at = fl.zeros({shape})")
        w(f"for ks in fl.range(fl.tiles(K, {tiles[1]})):")
        with w.indent():
            w(f"x_t = fl.load({x}[{rs}, ks, {cs}])")
            w("iota = fl.load(IOTA[:, ks, :])")
            w(f"m = x_t.{pick}(axis=1)")
            w("first = fl.where(x_t == m, iota, float(K)).min(axis=1, keepdims=False)   # where m first is")
            w(f"m = x_t.{pick}(axis=1, keepdims=False)")
            w(f"won = fl.{better}(m, best)   # strictly: on a tie the earlier tile keeps its index")
            w("fl.where(won, first, at, out=at)")
            w("fl.where(won, m, best, out=best)")
        w(f"fl.store({out}[{rs}, {cs}], at.astype(fl.i64))")


def _scan(w, n: Node, cfg, x: str, R: int, K: int, C: int) -> None:
    """cumsum, cumprod and logcumsumexp: a running value, updated one K index at a time and stored
    at every step. logcumsumexp adds as log(exp(run) + exp(x)) = hi + log1p(exp(-|run - x|)), hi
    their max, so no exp of a large value is taken; where hi is infinite (both -inf, or a +inf
    seen) the gap is taken as 0, not inf - inf, and hi is the answer."""
    op = n.op.name
    start, what = {"cumsum": ("0.0", "sum"), "cumprod": ("1.0", "product"),
                   "logcumsumexp": ('float("-inf")', "log of the sum of exponentials")}[op]
    (out,) = _outputs(w, n, "(R, K, C)", "R K C")
    tiles = tile_sizes((R, K, C), cfg, live=5 if op == "logcumsumexp" else 3, fixed={1})
    outer = Loops(["R", "C"], (R, C), (tiles[0], tiles[2]), {"R", "C"})
    w(outer.header())
    with w.indent():
        shape = f"({outer.extent(0)}, {outer.extent(1)})"
        rs, cs = outer.index(0, 0, R), outer.index(1, 0, C)
        w(f"run = fl.full({shape}, {start})   # the running {what}")
        w("for k in fl.range(K):")
        with w.indent():
            if op == "logcumsumexp":
                w(f"x_t = fl.load({x}[{rs}, k, {cs}])")
                w("hi = fl.maximum(run, x_t)")
                w("gap = fl.where(fl.isinf(hi), 0.0, fl.abs(run - x_t))")
                w("fl.add(hi, fl.log1p(fl.exp(-gap)), out=run)")
            else:
                w(f"fl.{'mul' if op == 'cumprod' else 'add'}(run, fl.load({x}[{rs}, k, {cs}]), out=run)")
            w(f"fl.store({out}[{rs}, k, {cs}], {_store_cast('run', n.outputs[0].type.dtype)})")


def _running_extreme(w, n: Node, cfg, x: str, R: int, K: int, C: int) -> None:
    """cummax / cummin: the running extreme and where it was last seen (a tie moves the index
    forward); once a NaN is seen it stays the extreme, as torch has it."""
    big = n.op.name == "cummax"
    values, indices = _outputs(w, n, "(R, K, C)", "R K C")
    tiles = tile_sizes((R, K, C), cfg, live=5, fixed={1})
    outer = Loops(["R", "C"], (R, C), (tiles[0], tiles[2]), {"R", "C"})
    w(outer.header())
    with w.indent():
        shape = f"({outer.extent(0)}, {outer.extent(1)})"
        rs, cs = outer.index(0, 0, R), outer.index(1, 0, C)
        worst = 'float("-inf")' if big else 'float("inf")'
        w(f"best = fl.full({shape}, {worst})")
        w(f"at = fl.zeros({shape})")
        w("for k in fl.range(K):")
        with w.indent():
            w(f"x_t = fl.load({x}[{rs}, k, {cs}])")
            w(f"won = fl.logical_or(fl.isnan(x_t), fl.logical_and(fl.logical_not(fl.isnan(best)), "
              f"fl.{'ge' if big else 'le'}(x_t, best)))")
            w("fl.where(won, x_t, best, out=best)")
            w("fl.where(won, k, at, out=at)")
            w(f"fl.store({values}[{rs}, k, {cs}], {_store_cast('best', n.outputs[0].type.dtype)})")
            w(f"fl.store({indices}[{rs}, k, {cs}], at.astype(fl.i64))")


def _rank_sort(w, n: Node, cfg, x: str, R: int, K: int, C: int) -> None:
    """Per row (and column) of the (R, K, C) view: each element's place along K is the count of the
    elements that go before it, compared in tiles of `ti` elements against the axis in chunks of
    `tj` (a (rows, ti, tj) comparison; the whole axis at once where it fits); its value and its
    position are then scattered to that place. The tiles of one row are items of their own, so a
    long sort spreads over the PEs."""
    descending, floats = n.attrs["descending"], n.inputs[0].type.dtype.is_float
    values, indices = _outputs(w, n, "(R, K, C)", "R K C")
    index_row(w, cfg, "IOTA", K, 3, 1, "the position of each element along K")
    # about ten (rows, ti, tj) tiles live at once (comparisons, masks and their conversions)
    room = max(1, cfg.sram_bytes_per_pe // (2 * STAGES * 4 * 10))
    tj = min(K, room)
    rows = max(1, min(R, room // tj))
    ti = max(1, min(K, room // (rows * tj)))
    w("# the scatters below are a permutation and cover every place, but which places is data: the")
    w("# outputs are first stored whole (zeros) so the kernel writes every element it returns")
    w(f"for rs, c in fl.parallel(fl.tiles(R, {rows}), range(C), stages=stages):")
    with w.indent():
        w(f"fl.store({values}[rs, :, c:c + 1], fl.zeros((rs, K, 1)).astype({fl_dtype(n.outputs[0].type.dtype)}))")
        w(f"fl.store({indices}[rs, :, c:c + 1], fl.zeros((rs, K, 1)).astype(fl.i64))")
    w(f"for rs, c, its in fl.parallel(fl.tiles(R, {rows}), range(C), fl.tiles(K, {ti}), stages=stages):")
    with w.indent():
        w(f"xi, ii = fl.load({x}[rs, its, c:c + 1]), fl.load(IOTA[:, its, :])   # (rows, ti, 1): a tile of "
          f"elements, their positions")
        if floats:
            w("xi_nan = fl.isnan(xi)")
        whole = tj == K
        if not whole:
            w(f"place = fl.zeros((rs, its, 1))   # counted over the axis {tj} elements at a time")
            w(f"for js in fl.range(fl.tiles(K, {tj})):")
        js, width = (":", "K") if whole else ("js", "tj")
        with w.indent() if not whole else contextlib.nullcontext():
            w(f"jrow = fl.load(IOTA[:, {js}, :]).transpose(0, 2, 1)   # (1, 1, {width}): each element's position")
            w(f"row = fl.load({x}[rs, {js}, c:c + 1]).transpose(0, 2, 1)   # (rows, 1, {width}): what each is "
              f"compared against")
            if floats:
                w("row_nan = fl.isnan(row)")
                w("# j goes before i: ordered before it (NaN after every number), or equal and earlier")
                if descending:
                    w("ordered = fl.logical_and(fl.logical_not(xi_nan), fl.logical_or(row_nan, row > xi))")
                else:
                    w("ordered = fl.logical_and(fl.logical_not(row_nan), fl.logical_or(xi_nan, row < xi))")
                w("tied = fl.logical_and(fl.logical_or(row == xi, fl.logical_and(row_nan, xi_nan)), jrow < ii)")
            else:
                w("# j goes before i: ordered before it, or equal and earlier")
                w(f"ordered = row {'>' if descending else '<'} xi")
                w("tied = fl.logical_and(row == xi, jrow < ii)")
            count = "fl.logical_or(ordered, tied).astype(fl.f32).sum(axis=2)"
            if whole:
                w(f"place = {count}   # (rows, ti, 1)")
            else:
                w(f"fl.add(place, {count}, out=place)")
        w("place = place.astype(fl.i64)")
        w(f"fl.scatter({values}[rs, :, c:c + 1], place, xi, axis=1, mode=\"elements\")")
        w(f"fl.scatter({indices}[rs, :, c:c + 1], place, (ii + fl.zeros(xi.shape)).astype(fl.i64), axis=1, "
          f"mode=\"elements\")")


def _ranked(w, n: Node, cfg, x: str, R: int, K: int, C: int, label: str) -> None:
    op = n.op.name
    k = n.attrs["k"] if op == "topk" else K
    largest = n.attrs["largest"] if op == "topk" else n.attrs["descending"]
    budget = tile_sizes((R, K, C), cfg, live=6)
    if budget[1] < K:
        raise UnsupportedRegionError(op, label, f"{op} over {K} elements: the whole axis does not fit one tile "
                                                f"on {cfg.name} (a merge of per-tile winners is not written)",
                                     loc=n.loc)
    pick, masked = ("max", 'float("-inf")') if largest else ("min", 'float("inf")')
    values, indices = _outputs(w, n, f"(R, {k}, C)" if op == "topk" else "(R, K, C)", "R _ C" if op == "topk"
                               else "R K C")
    index_row(w, cfg, "IOTA", K, 3, 1, "the position of each element along K")
    outer = Loops(["R", "C"], (R, C), (budget[0], budget[2]), {"R", "C"})
    w(outer.header())
    with w.indent():
        rs, cs = outer.index(0, 0, R), outer.index(1, 0, C)
        w(f"x_t = fl.load({x}[{rs}, :, {cs}])")
        w(f"taken = fl.zeros(({outer.extent(0)}, K, {outer.extent(1)}), fl.bool_)   # picked by an earlier pass")
        w("iota = fl.load(IOTA[:, :, :])")
        w(f"for p in fl.range({'K' if op == 'sort' else k}):")
        with w.indent():
            w(f"m = fl.where(taken, {masked}, x_t).{pick}(axis=1)")
            w("# its first place not taken yet (equal values: the first one)")
            w("first = fl.where(fl.logical_and(x_t == m, fl.logical_not(taken)), iota, float(K)).min(axis=1)")
            w(f"fl.store({values}[{rs}, p:p + 1, {cs}], {_store_cast('m', n.outputs[0].type.dtype)})")
            w(f"fl.store({indices}[{rs}, p:p + 1, {cs}], first.astype(fl.i64))")
            w("fl.logical_or(taken, iota == first, out=taken)")
