"""The grouped contraction: ``grouped_matmul(x, w, ends)``, a mixture of experts' expert layer over
tokens sorted by expert. Rows of x (S, K) fall into G groups, group g the rows
``ends[g-1]:ends[g]``, and each row is multiplied by its group's matrix w[g] (K, N).

Which rows a group holds is data: it is known when the kernel runs, not when it is traced, and the
chip's grid is static. So the kernel runs a fixed number of steps, each a (group, row tile) pair,
in the manner of a block-sparse grouped GEMM (megablox): a row tile is visited once per group it
holds rows of, so ``T = ceil(S / tm) + min(G, S) - 1`` steps cover any ends (each group boundary
inside a tile adds one visit; no more than S groups can hold rows). Before the steps, PE 0 works
out on the vector unit which pair each step is (the step table: its group, its rows, which of them
the group holds, whether the step before wrote the same row tile) from the ends and writes it to
DRAM; the steps past the last pair take the row tiles after the last group's end, whose rows are
zero. It works on blocks of steps against blocks of groups, so the table of a mixture of hundreds
of experts is worked out on a small SRAM too (Qwen3-Next's 512 experts on tiny).

Then each PE takes a panel of output columns and runs the steps in order: it gathers the step's
rows of x (a DMA row gather) and its group's matrix tiles (a gather of one matrix along G),
contracts them, and writes the whole row tile back with a DMA scatter: its group's rows from the
product (a select, so a row of another group never reaches the output, whatever it holds), the
other rows as the step before wrote them when it wrote the same tile, else zero. The visits to a
tile come one after another (groups are in row order), so the last one leaves every group's rows.
No write reads the output back (a scatter that adds would read and write every row).

The grid being static, every step costs what a full one does: the simulator times the worst case,
T steps, whatever the routing. Each step reads its group's matrix once per panel, so the weights
move about T / G times per call, against once for a kernel that knew the routing; `_tiles` picks
the row tile that balances that against the tensor unit's padded rows.
"""

from __future__ import annotations

import math

from fexplore.ir import DType, Node

from fexplore.lang.examples._tiling import big_tile, ceil_to

from .boxes import index_row
from .common import Inputs, Signature, body_of, header, kernel_name, region_label
from .errors import UnsupportedRegionError
from .generated import GeneratedKernel, Result
from .source import Names, Writer, fl_dtype

STAGES = 2
MAX_STEPS = 20_000   # step x column tile x K tile iterations unrolled at trace time, per PE


def step_count(S: int, G: int, tm: int) -> int:
    """The grid's steps: each row tile once, and once more per group boundary inside a tile (no more
    than S groups hold rows). The kernel computes the same from its `tm`."""
    return math.ceil(S / tm) + min(G, S) - 1


def steps_per_pe(S: int, N: int, K: int, G: int, cfg, tm: int, tp: int, tn: int, tk: int) -> int:
    """Contraction steps a PE unrolls at these tiles: each grid step for each of its panels, column
    tiles and K slabs (held under `MAX_STEPS`)."""
    panels = math.ceil(math.ceil(N / tp) / cfg.num_pes)
    return step_count(S, G, tm) * panels * math.ceil(tp / tn) * math.ceil(K / tk)


def generate_grouped_matmul(node: Node, cfg) -> GeneratedKernel:
    """The kernel of a grouped_matmul op (codegen's `generate` has refused symbolic sizes and
    operands the tensor unit has no rate for)."""
    label = region_label(node)
    x, w, ends = node.inputs
    out = node.outputs[0]
    transposed = bool(node.attrs["transpose_w"])
    S, K = (int(d) for d in x.type.shape)
    G = int(w.type.shape[0])
    N = int(out.type.shape[1])
    dt = x.type.dtype
    item = dt.itemsize
    tiles = _tiles(S, N, K, G, item, out.type.dtype.itemsize, cfg, dt.name)
    if tiles is None:
        rows = min(S, cfg.native_tile(dt.name)[0])
        raise UnsupportedRegionError("grouped_matmul", label, f"a step's rows of x ({rows} x {K}) and the step "
                                     f"table do not fit a PE's SRAM on {cfg.name}", loc=node.loc)
    tm, tp, tn, tk = tiles
    steps = step_count(S, G, tm)
    per_pe = steps_per_pe(S, N, K, G, cfg, tm, tp, tn, tk)
    if per_pe > MAX_STEPS:
        raise UnsupportedRegionError("grouped_matmul", label, f"{per_pe:,} contraction steps per PE (more than "
                                     f"{MAX_STEPS:,} to unroll)", loc=node.loc)
    meta = _metadata_block(G, steps, tm, cfg)
    if meta is None:
        raise UnsupportedRegionError("grouped_matmul", label, f"the step table of {G} groups does not fit a "
                                     f"PE's SRAM on {cfg.name}", loc=node.loc)

    body = body_of(node)
    names = Names({"S", "K", "N", "G", "T", "E", "OUT", "POS", "STARTS", "CUM", "STEP_ROWS", "STEP_KEEP",
                   "STEP_GROUP", "STEP_TILE", "STEP_SAME", "tm", "tp", "tn", "tk", "tb", "stages", "e", "s",
                   "first", "last", "count", "cum", "g", "gs", "below", "total", "ts", "t", "groups", "valid",
                   "pick", "begin", "tile", "rows", "lo", "hi", "keep", "same", "ps", "ms", "step", "written",
                   "slabs", "ns", "ks", "acc", "mat", "before", "n", "js", "gb", "BEGIN", "END",
                   "FIRST", "COUNT", "part", "parts"})
    fname = kernel_name(node)
    names.taken.add(fname)
    sig = Signature(names, Inputs.of(node, body))
    xn = sig.add(x, (S, K), ['"S"', '"K"'])
    wn = sig.add(w, (G, N, K) if transposed else (G, K, N), ['"G"', '"N"', '"K"'] if transposed else
                 ['"G"', '"K"', '"N"'])
    en = sig.add(ends, (1, G), ["1", '"G"'])
    odt = fl_dtype(out.type.dtype)

    wr = Writer()
    header(wr, node, body, "grouped contraction", sig.header, {})
    wr(f"# rows of {xn} sorted into {G} groups: group g holds rows {en}[g-1]:{en}[g], each times its matrix "
       f"{wn}[g]{'.T' if transposed else ''}")
    wr("# a static grid of T (group, row tile) steps covers any routing; PE 0 writes the step table first")
    wr(f'@fl.kernel(target="{cfg.name}")')
    wr(f"def {fname}({', '.join(sig.annotations)}, *, tm: int = {tm}, tp: int = {tp}, tn: int = {tn}, "
       f"tk: int = {tk}, stages: int = {STAGES}):")
    with wr.indent():
        wr(f"S, K, N, G = {S}, {K}, {N}, {G}")
        wr("tm = min(tm, S)")
        wr("T = -(-S // tm) + min(G, S) - 1   # steps: a row tile once per group it holds rows of")
        wr(f"OUT = fl.output((S, N), {odt}, axes=\"S N\")")
        _step_table(wr, cfg, en, S, G, meta)
        _steps(wr, xn, wn, transposed, odt, out.type.dtype != DType.f32)
        wr("return OUT")
    results = (Result(0, tuple(out.type.shape)),)
    return GeneratedKernel(fname, "contraction", wr.text(), cfg, tuple(sig.params), results,
                           ("step table", "grouped contraction"))


def _tiles(S: int, N: int, K: int, G: int, item: int, out_item: int, cfg, dtype: str) -> tuple | None:
    """(tm, tp, tn, tk). Panels of columns (tp) go round-robin to the PEs, one each where they fit;
    a panel is cut into column tiles (tn) that share the step's row slabs. Rows per step (tm) trade
    the tensor unit against DMA: every step computes a whole row tile, so the tensor unit does
    (S + (min(G, S) - 1) tm) rows' work, while each step reads its group's matrix, so the weights
    move T times. Deep K slabs (tk) make fewer, longer DMA commands (each pays the start-up). The
    tiles of the least estimated time among those that fit: the larger of the tensor unit's time and
    a PE's DMA time (its start-ups, and its bytes at its share of DRAM). None when none fit."""
    nm, nn, nk = cfg.native_tile(dtype)
    big = big_tile(cfg)
    budget = cfg.sram_bytes_per_pe // 2

    def fits(tm, tp, tn, tk):
        if steps_per_pe(S, N, K, G, cfg, tm, tp, tn, tk) > MAX_STEPS:
            return False                                  # too many to unroll: narrower panels, wider tiles
        steps = step_count(S, G, tm)
        table = steps * (tm * 5 + 12)                     # rows (i32), keep, group, tile, same
        # the step's rows of x: every K slab, kept for the panel's other column tiles; a panel of
        # one column tile uses each slab once, and its buffers are reused (double buffered)
        slabs = STAGES * tm * (ceil_to(K, tk) if tn < tp else tk) * item
        mats = 2 * STAGES * tk * tn * item                # the group's matrix tiles
        written = tm * tp * 4                             # the row tile each column tile last wrote
        return table + slabs + mats + written + 3 * tm * tn * 4 <= budget

    def estimate(tm, tp, tn, tk):
        steps = step_count(S, G, tm)
        flops = 2 * steps * ceil_to(tm, nm) * K * N
        panels = math.ceil(N / tp)
        per_pe = math.ceil(panels / cfg.num_pes)
        rate = min(cfg.dma_bytes_per_cycle, cfg.dram_bytes_per_cycle / min(panels, cfg.num_pes))
        commands = per_pe * steps * math.ceil(K / tk) * (1 + 2 * math.ceil(tp / tn))
        moved = per_pe * (steps * (K * tp * item + tm * K * item + tm * tp * out_item) + S * tp * out_item)
        return max(flops / cfg.peak_flops_per_cycle(dtype), commands * cfg.dma_startup_cycles + moved / rate)

    def halvings(start: int, floor: int, unit: int) -> list[int]:
        sizes = [start]
        while sizes[-1] > floor:
            sizes.append(max(floor, ceil_to(-(-sizes[-1] // 2), unit)))
        return sizes

    best = None
    for tp in halvings(min(N, max(nn, ceil_to(math.ceil(N / cfg.num_pes), nn))), min(N, nn), nn):
        for tm in halvings(min(S, big), min(S, nm), 1):
            for tk in halvings(K, min(K, nk), nk):
                tn = next((t for t in halvings(min(tp, big // 2), min(tp, nn), nn) if fits(tm, tp, t, tk)), None)
                if tn is not None and (best is None or estimate(tm, tp, tn, tk) < estimate(*best)):
                    best = (tm, tp, tn, tk)
        if best is not None:   # the widest panels that fit: narrower ones only re-read the rows
            break
    return best


def _metadata_block(G: int, T: int, tm: int, cfg) -> tuple[int, int] | None:
    """(steps, groups) per block of the step table's computation. A block of steps is set against a
    block of groups at a time: a few (steps, groups) tiles, six (1, groups) rows (five of the
    groups' figures and their positions), the steps' rows; all groups at once where they fit, else
    as many as leave a block of eight steps room (a mixture of 512 experts on a small SRAM)."""
    budget = cfg.sram_bytes_per_pe // 4

    def block(gb: int) -> int:   # steps per block beside `gb` groups
        return (budget - 6 * gb * 4) // (4 * gb * 4 + 4 * tm * 4)

    gb = G
    while gb > 1 and block(gb) < min(8, T):
        gb = -(-gb // 2)
    tb = min(T, block(gb))
    return (tb, gb) if tb >= 1 else None


def _step_table(wr, cfg, en: str, S: int, G: int, blocks: tuple[int, int]) -> None:
    """PE 0's prologue: from the ends, each step's group, rows and which rows the group holds. Every
    figure over the groups is a sum over blocks of groups (`_metadata_block`)."""
    tb, gb = blocks
    wr(f"tb, gb = {tb}, {gb}   # steps, and groups, per block of the table's computation")
    index_row(wr, cfg, "POS", S + G, 2, 1, "positions along a row")
    wr("# where each group begins (the end of the one before, 0 for the first) and ends, its first row")
    wr("# tile, and its steps: one per row tile it holds rows of")
    wr("STARTS = fl.scratch((1, G), fl.f32)")
    wr("fl.store(STARTS[:, 0:1], fl.zeros((1, 1)))")
    if G > 1:
        wr("for gs in fl.range(fl.tiles(G - 1, gb)):")
        with wr.indent():
            wr(f"fl.store(STARTS[:, gs.start + 1:gs.stop + 1], fl.cast(fl.load({en}[:, gs]), fl.f32))")
    wr("BEGIN = fl.scratch((1, G), fl.f32)")
    wr("END = fl.scratch((1, G), fl.f32)")
    wr("FIRST = fl.scratch((1, G), fl.f32)")
    wr("COUNT = fl.scratch((1, G), fl.f32)")
    wr("for gs in fl.range(fl.tiles(G, gb)):")
    with wr.indent():
        wr(f"e = fl.minimum(fl.cast(fl.load({en}[:, gs]), fl.f32), float(S))")
        wr("s = fl.minimum(fl.load(STARTS[:, gs]), float(S))")
        wr("first = fl.floor(s / tm)")
        wr("last = fl.floor((e - 1) / tm)")
        wr("fl.store(BEGIN[:, gs], s)")
        wr("fl.store(END[:, gs], e)")
        wr("fl.store(FIRST[:, gs], first)")
        wr("fl.store(COUNT[:, gs], fl.where(e > s, last - first + 1, 0.0))")
    wr("# the steps before each group's end: a running sum of the counts, over the blocks up to its own")
    wr("CUM = fl.scratch((1, G), fl.f32)")
    wr("for gs in fl.range(fl.tiles(G, gb)):")
    with wr.indent():
        wr("g = fl.load(POS[:, gs]).transpose(1, 0)   # (block, 1): the block's groups")
        wr("cum = None")
        wr("for js in fl.range(fl.tiles(gs.stop, gb)):")
        with wr.indent():
            wr("below = fl.load(POS[:, js]) <= g         # (block, block): group j comes no later than group i")
            wr("part = fl.where(below, fl.load(COUNT[:, js]), 0.0).sum(axis=1)")
            wr("cum = part if cum is None else cum + part")
        wr("fl.store(CUM[:, gs], cum.transpose(1, 0))")
    wr("E, total = fl.load(END[:, G - 1:G]), fl.load(CUM[:, G - 1:G])   # the last group's end and steps")
    wr("STEP_ROWS = fl.scratch((T, tm), fl.i32)        # each step's rows (clamped into x)")
    wr("STEP_KEEP = fl.scratch((T, tm, 1), fl.bool_)   # which of them its group holds")
    wr("STEP_GROUP = fl.scratch((T, 1), fl.i32)        # its group")
    wr("STEP_TILE = fl.scratch((T + 1, 1), fl.f32)     # its row tile, after a -1 for the step before the first")
    wr("fl.store(STEP_TILE[0:1, :], fl.full((1, 1), -1.0))")
    wr("for ts in fl.range(fl.tiles(T, tb)):")
    with wr.indent():
        wr("t = fl.load(POS[:, ts]).transpose(1, 0)                       # (block, 1): the steps")
        wr("groups = None                                                  # groups all of whose steps come before")
        wr("for gs in fl.range(fl.tiles(G, gb)):")
        with wr.indent():
            wr("part = fl.where(fl.load(CUM[:, gs]) <= t, 1.0, 0.0).sum(axis=1)")
            wr("groups = part if groups is None else groups + part")
        wr("valid = groups < G                                             # past the last: a step with no rows")
        wr("# the step's group's first step, first row tile, and rows")
        wr("begin = first = lo = hi = None")
        wr("for gs in fl.range(fl.tiles(G, gb)):")
        with wr.indent():
            wr("pick = fl.minimum(groups, G - 1) == fl.load(POS[:, gs])      # (block, groups): the step's group")
            wr("parts = (fl.where(pick, fl.load(CUM[:, gs]) - fl.load(COUNT[:, gs]), 0.0).sum(axis=1),")
            wr("         fl.where(pick, fl.load(FIRST[:, gs]), 0.0).sum(axis=1),")
            wr("         fl.where(pick, fl.load(BEGIN[:, gs]), 0.0).sum(axis=1),")
            wr("         fl.where(pick, fl.load(END[:, gs]), 0.0).sum(axis=1))")
            wr("if begin is None:")
            with wr.indent():
                wr("begin, first, lo, hi = parts")
            wr("else:")
            with wr.indent():
                wr("begin, first, lo, hi = begin + parts[0], first + parts[1], lo + parts[2], hi + parts[3]")
        wr("# a step past the last takes a row tile after the last group's end, and writes its zeros;")
        wr("# there are always enough of them for every such tile (then they repeat the last)")
        wr("tile = fl.where(valid, first + t - begin,")
        wr("                fl.minimum(fl.ceil(E / tm) + t - total, float(-(-S // tm) - 1)))")
        wr("rows = fl.minimum(tile * tm + fl.load(POS[:, 0:tm]), float(S - 1))   # a partial last tile repeats row S-1")
        wr("fl.store(STEP_ROWS[ts, :], fl.cast(rows, fl.i32))")
        wr("fl.store(STEP_KEEP[ts, :, 0], fl.logical_and(fl.logical_and(rows >= lo, rows < hi), valid))")
        wr("fl.store(STEP_GROUP[ts, :], fl.cast(fl.minimum(groups, G - 1), fl.i32))")
        wr("fl.store(STEP_TILE[ts.start + 1:ts.stop + 1, :], tile)")
    wr("STEP_SAME = fl.scratch((T, 1, 1), fl.bool_)   # the step writes the row tile the step before wrote")
    wr("fl.store(STEP_SAME[:, :, 0], fl.load(STEP_TILE[1:T + 1, :]) == fl.load(STEP_TILE[0:T, :]))")


def _steps(wr, xn: str, wn: str, transposed: bool, odt: str, narrow_out: bool) -> None:
    """Per panel, the steps in order. The steps that visit a row tile come one after another (groups
    are in row order), so each step writes its whole row tile: its group's rows from its product,
    the others as the step before wrote them if it wrote this tile (else zero). The last visit
    leaves every group's rows; a tile no group reaches gets zeros from a step past the last."""
    wr("for ps in fl.parallel(fl.tiles(N, tp)):     # a panel of output columns per PE")
    with wr.indent():
        wr("# the panel stored whole once first: the output is covered, whichever rows the scatters write")
        wr("for ms in fl.range(fl.tiles(S, tm)):")
        with wr.indent():
            wr(f"fl.store(OUT[ms, ps], fl.zeros((ms.stop - ms.start, ps.stop - ps.start), {odt}))")
        wr("rows, keep, groups, same = fl.load(STEP_ROWS), fl.load(STEP_KEEP), fl.load(STEP_GROUP), "
           "fl.load(STEP_SAME)")
        wr("written = {}   # per column tile: the row tile the last step wrote")
        wr("for step in fl.range(T, stages=stages):")
        with wr.indent():
            wr("slabs = {}   # the step's rows of x, a K slab each: gathered once, reused by every column tile")
            wr("for ns in fl.range(fl.tiles(ps, tn)):")
            with wr.indent():
                wr("acc = None")
                wr("for ks in fl.range(fl.tiles(K, tk), stages=stages):")
                with wr.indent():
                    wr("if ks.start not in slabs:")
                    with wr.indent():
                        wr(f"slabs[ks.start] = fl.gather({xn}[:, ks], rows[step])")
                    box, spec = ("ns, ks", "mk,nk->mn") if transposed else ("ks, ns", "mk,kn->mn")
                    wr(f"mat = fl.gather({wn}[:, {box}], groups[step])   # the group's matrix tile")
                    wr(f'acc = fl.contract("{spec}", slabs[ks.start], mat[0], acc=acc)')
                wr("before = fl.where(same[step], written[ns.start], 0.0) if ns.start in written else 0.0")
                wr("written[ns.start] = fl.where(keep[step], acc, before)")
                tile = "written[ns.start]"
                if narrow_out:
                    tile = f"fl.cast({tile}, {odt})"
                wr(f"fl.scatter(OUT[:, ns], rows[step], {tile})")
