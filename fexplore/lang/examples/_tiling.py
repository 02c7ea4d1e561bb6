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


def shrink(sizes: list[int], fits, floors: list[int]) -> list[int]:
    """Halve the largest size still above its floor until `fits(*sizes)` (or nothing can shrink)."""
    sizes = list(sizes)
    while not fits(*sizes):
        candidates = [i for i, (s, f) in enumerate(zip(sizes, floors)) if s > f]
        if not candidates:
            break
        i = max(candidates, key=lambda i: sizes[i])
        sizes[i] = max(floors[i], sizes[i] // 2)
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


def row_tiles(R: int, bytes_per_row: int, cfg, stages: int) -> int:
    """Rows per tile for a row-wise kernel: enough tiles for every PE (two each, so each PE's own
    loads and computes can overlap), as many rows as fit a quarter of SRAM."""
    rows = max(1, min(R, (cfg.sram_bytes_per_pe // 4) // max(1, bytes_per_row * stages)))
    while rows > 1 and math.ceil(R / rows) < 2 * cfg.num_pes:
        rows = max(1, rows // 2)
    return rows
