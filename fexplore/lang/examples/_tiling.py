"""Tile sizes from the target: big tiles on a big chip (few commands, DMA start-up amortized, the
tensor unit's tile quantization fills), small ones on `tiny`; enough tiles to keep every PE busy;
and a footprint that leaves SRAM headroom. Kernels take explicit sizes too; these are defaults."""

from __future__ import annotations

import math

MiB = 1 << 20


def big_tile(cfg) -> int:
    """The largest tile edge worth using on this chip: 512 on a chip with MiBs of SRAM per PE."""
    return 512 if cfg.sram_bytes_per_pe >= 8 * MiB else 64


def round_to(n: int, unit: int) -> int:
    return max(unit, n // unit * unit)


def ceil_to(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def shrink(sizes: list[int], fits, floors: list[int]) -> list[int]:
    """Halve the largest size still above its floor until `fits(*sizes)` (or nothing can shrink),
    then give back what was cut without need: double the smallest cut size again while it fits.

    Halving the largest size first keeps tiles square, but the largest is not always the one the
    footprint grows with: a panel kernel's row slabs (rows x whole K) shrink only with the rows, so
    the column and K tiles were halved to their floors (8 x 8 on `tiny`) before the rows were cut,
    and a 9 x 1024 x 1024 linear traced 50k contractions instead of 3k."""
    start, sizes = list(sizes), list(sizes)
    while not fits(*sizes):
        candidates = [i for i, (s, f) in enumerate(zip(sizes, floors)) if s > f]
        if not candidates:
            return sizes
        i = max(candidates, key=lambda i: sizes[i])
        sizes[i] = max(floors[i], sizes[i] // 2)
    return grow_back(sizes, start, fits)


def grow_back(sizes: list[int], start: list[int], fits) -> list[int]:
    """Sizes that fit, each cut below its `start` doubled again (the smallest first, up to its
    start) while they still fit: what an order of cuts took without need."""
    sizes = list(sizes)
    while True:
        for i in sorted(range(len(sizes)), key=lambda i: sizes[i]):
            if sizes[i] < start[i]:
                grown = sizes[:i] + [min(start[i], 2 * sizes[i])] + sizes[i + 1:]
                if fits(*grown):
                    sizes = grown
                    break
        else:
            return sizes


def matmul_tiles(M: int, N: int, K: int, itemsize: int, cfg, dtype: str, stages: int) -> tuple[int, int, int]:
    nm, nn, nk = cfg.native_tile(dtype)
    big = big_tile(cfg)
    tm, tn, tk = min(M, big), min(N, big), min(K, big // 2)   # a shallower K slab: shorter pipeline fill
    # enough output tiles that every PE gets one, halving the larger edge first
    while math.ceil(M / tm) * math.ceil(N / tn) < cfg.num_pes and max(tm, tn) > 2 * max(nm, nn):
        if tm >= tn:
            tm = round_to(tm // 2, nm)
        else:
            tn = round_to(tn // 2, nn)
    budget = cfg.sram_bytes_per_pe // 2

    def fits(tm, tn, tk):  # operands per stage (x2 across output tiles), accumulators, epilogue
        return 2 * stages * (tm * tk + tk * tn) * itemsize + 2 * tm * tn * (4 + 4 + itemsize) <= budget

    tm, tn, tk = shrink([tm, tn, tk], fits, [min(M, nm), min(N, nn), min(K, nk)])
    return tm, tn, tk


def max_tile_bytes(cfg) -> int:
    """The largest tile worth a default or a tile search's choice: a sixteenth of a PE's SRAM,
    still many times what amortizes a DMA's start-up. Bigger tiles may win alone (a decode step's
    lm_head would stream its weights in fewer loads), but among the buffers of the kernels around
    them they fragment SRAM until the whole program's placement fails, and every step back the
    schedule stage then takes is a rebuild of the whole program."""
    return cfg.sram_bytes_per_pe // 16


def amortizing_bytes(cfg) -> int:
    """The bytes a DMA command should move so its transfer is at least twice its start-up: below
    that, a PE's DMA engine spends a third or more of its time starting commands, while DRAM, which
    the start-up does not use, idles whenever the PEs start theirs together."""
    return int(2 * cfg.dma_startup_cycles * cfg.dma_bytes_per_cycle)


def row_tiles(R: int, bytes_per_row: int, cfg, stages: int, outer: int = 1) -> int:
    """Rows per tile for a row-wise kernel: enough tiles for every PE, as many rows as fit a quarter
    of SRAM; and two tiles per PE, so each PE's own loads and computes can overlap, when a tile
    still moves what amortizes a DMA's start-up (`amortizing_bytes`). A second, smaller tile of a
    few rows overlaps little and costs each of its loads and its store a whole start-up: a small
    GPT's embedding add took 3,009 cycles alone in tiles of one row, two per PE, and 1,526 in
    tiles of two. `outer`: items the kernel has besides its row tiles (one per index of the axes
    it loops over outside the rows), which count towards filling the PEs."""
    rows = max(1, min(R, (cfg.sram_bytes_per_pe // 4) // max(1, bytes_per_row * stages)))
    while rows > 1 and math.ceil(R / rows) * outer < cfg.num_pes:
        rows = max(1, rows // 2)
    while rows > 1 and math.ceil(R / rows) * outer < 2 * cfg.num_pes and \
            rows // 2 * bytes_per_row >= amortizing_bytes(cfg):
        rows = max(1, rows // 2)
    return rows


def panel_tiles(M: int, N: int, K: int, itemsize: int, cfg, dtype: str, stages: int,
                siblings: int = 1, extra_tile_bytes: int = 0) -> tuple[int, int, int, int] | None:
    """(tm, tp, tn, tk) for a panel contraction, or None when a row tile's whole K does not fit.

    A panel kernel gives each PE a row tile (tm rows) and a panel of columns (tp): the row tile's K
    slabs are loaded once and reused by every column tile (tn) of the panel, so the activations are
    read once per panel instead of once per output tile, and the items number a multiple of the
    PEs when the shape allows (one round, no PE idle in a second one). Each PE's DMA engine
    delivers its own operands, so operand bytes per PE, not DRAM bytes, are what a small GEMM
    waits on. `extra_tile_bytes`: bytes per output element the epilogue keeps besides the
    accumulator; `siblings`: contractions sharing the activations (each its weights and accumulator)."""
    nm, nn, nk = cfg.native_tile(dtype)
    tm, tp = _split_over_pes(M, N, K, itemsize, cfg, dtype, (nm, nn))
    # column tiles: a narrow panel is one; a wide one is cut short, so the first epilogue starts
    # early; a row tile of a few rows (a decode step's GEMV streams the weights) takes wide ones,
    # whose big DMA commands amortize their start-up. On a fused PE, whose DMA moves its bytes
    # `fused_pes` times faster, no column tile is shorter than a load that amortizes its start-up:
    # the tile search's factors do not reach that width from the default (GPT-2's lm_head wants
    # 1,024 columns fused by 4, 8x the default), while on the unfused chip they do (defaulting to
    # it there measured 1.5% slower on GPT-2)
    big = big_tile(cfg)
    tn = tp if tp <= big // 2 or tm <= nm else max(nn, big // 4)
    slab = K if K <= 2 * big else big
    while cfg.fused_pes > 1 and tn < tp and siblings * tn * slab * itemsize < amortizing_bytes(cfg):
        tn = min(tp, 2 * tn)
    # whole-K weight tiles when K is short (fewest DMA commands); slabs of a big tile when it is
    # long, so the first contraction does not wait for a whole row tile of activations, but deep
    # enough that a K step's weight load moves well over what its start-up costs (a narrow panel's
    # slab of 128 columns would spend as long starting as transferring)
    tk = slab
    while tk < K and siblings * tn * tk * itemsize < amortizing_bytes(cfg):
        tk = min(K, 2 * tk)
    # a decode step's GEMV would take its whole panel as one weight tile (the lm_head's: 4 MB on
    # rngd, 32 MB fused by 4): cut to `max_tile_bytes`
    if tm <= nm:
        tn = min(tn, max(nn, round_to(max_tile_bytes(cfg) // (siblings * tk * itemsize), nn)))
    # column tiles of one width across the panel: a short last one (288 as 128 + 128 + 32) costs a
    # whole DMA start-up for a sliver of weights, while the epilogue tail after the last
    # contraction shrinks with the tile width anyway
    columns = -(-tp // tn)
    tn = min(tp, ceil_to(-(-tp // columns), nn))
    budget = cfg.sram_bytes_per_pe // 2

    def fits(tm, tn, tk):   # the row tile's slabs, weight tiles double buffered, accumulators
        return 2 * tm * K * itemsize + 2 * stages * siblings * tk * tn * itemsize + \
            2 * tm * tn * (4 * siblings + 4 + extra_tile_bytes) <= budget

    tm, tn, tk = shrink([tm, tn, tk], fits, [min(M, nm), min(N, nn), min(K, nk)])
    return (tm, tp, tn, tk) if fits(tm, tn, tk) else None


def streamed_rows(tm: int, tp: int, tn: int, tk: int, K: int, itemsize: int, cfg, dtype: str, stages: int,
                  siblings: int = 1, extra_tile_bytes: int = 0) -> int | None:
    """Rows per step of a weight-stationary panel item, or None to keep the row tile whole.

    A panel item of many rows keeps its weight tiles (K x tp) in SRAM and streams its rows through
    in steps: the first step needs only its own rows, so in a whole program it starts as soon as
    the producer kernel has written them, instead of waiting for the whole row tile (the chain of
    a transformer layer's kernels pipelines), and each step's row loads overlap the previous step's
    contractions. A step is a few of the tensor unit's row tiles, so its contractions stay long."""
    nm = cfg.native_tile(dtype)[0]
    tr = max(2 * nm, big_tile(cfg) // 4)
    if tm <= tr:
        return None
    # no more SRAM than the item takes with whole row tiles (the row tile's slabs, weight tiles
    # double buffered), or an eighth of a PE's: the schedule keeps intermediates on chip in what
    # the kernels leave free, and a big (fused) PE has room for a wide panel's weights to spare
    whole = 2 * tm * K * itemsize + 2 * stages * siblings * tk * tn * itemsize + \
        2 * tm * tn * (4 * siblings + 4 + extra_tile_bytes)
    need = 2 * siblings * K * tp * itemsize + 2 * tr * K * itemsize + \
        2 * tr * tn * (4 * siblings + 4 + extra_tile_bytes)
    return tr if need <= max(whole, cfg.sram_bytes_per_pe // 8) else None


def _split_over_pes(M: int, N: int, K: int, itemsize: int, cfg, dtype: str, native) -> tuple[int, int]:
    """(tm, tp): the rows and the column panel of one PE's item, the split of the output over the
    PEs that finishes first by a simple per-PE model: each PE's DMA engine brings its row tile's and
    its panel's K slabs once per item (the operand bytes), the tensor unit does its items' MACs, and
    a PE with one item more than another makes the others wait (rounds). As in `matmul_tiles`, no
    edge is split below twice the tensor unit's tile: such an item is all DMA start-up, and each
    extra PE re-reads its operands from DRAM.

    Tried and dropped: sharing DRAM's rate among the round's items (eight engines at 256 B/cycle ask
    for more than rngd's 1,500). It picks fewer, wider panels (GPT-2's attention output projection
    256 columns, not 192), faster alone (9,071 -> 8,545 cycles), but the GPT-2-small layer at
    sequence 512 got 5% slower as a program (67,781 -> 71,214 cycles; not traced: in a program the
    kernels around it run beside it and use the DRAM a kernel alone has to itself)."""
    nm, nn = native
    pes = cfg.num_pes
    floor = 2 * max(nm, nn)
    macs = cfg.macs_per_cycle(dtype)

    best = None
    for rows in range(1, -(-M // nm) + 1):
        tm = min(M, ceil_to(-(-M // rows), nm))
        if tm < min(M, floor):
            break
        if best is not None and tm == best[1]:
            continue
        for panels in range(1, -(-N // nn) + 1):
            tp = min(N, ceil_to(-(-N // panels), nn))
            if tp < min(N, floor):
                break
            rounds = -(-(-(-M // tm) * -(-N // tp)) // pes)
            dma = rounds * ((tm + tp) * K * itemsize / cfg.dma_bytes_per_cycle + 2 * cfg.dma_startup_cycles)
            tensor = rounds * ceil_to(tm, nm) * ceil_to(tp, nn) * K / macs
            cost = (max(dma, tensor), -tm)    # ties: taller row tiles (fewer, longer panels)
            if best is None or cost < best[0]:
                best = (cost, tm, tp)
    return best[1], best[2]
