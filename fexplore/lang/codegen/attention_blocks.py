"""Default query and key block sizes of a generated attention kernel, from a per-PE cost model of
the kernel as written: how many DMA commands a grid item and a key block issue (q, k and v
computed in the kernel, as rotary embeddings are, load several pieces each), the vector passes
per block of scores, and how the grid items fall on the PEs.

Larger blocks mean fewer DMA start-ups (~500 cycles each on rngd) and fewer 16-cycle vector
latencies; smaller ones mean more grid items to spread over the PEs and, with a causal mask, less
work above the diagonal. The tile search of the schedule stage refines the choice by simulation;
this gives it a starting point near its result instead of a fixed rule.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from fexplore.lang.examples._tiling import big_tile
from fexplore.npu.cost import dma_rate

# vector commands per block of scores and query head: the row max, the shifted scores and their
# exp (the 4 passes over the block) and the small ones on a column (the max, the rescale factor
# and its exp, the rescale of the row sums and of the output)
BLOCK_COMMANDS = 8
PASSES = 4


@dataclass(frozen=True)
class Work:
    grid: int        # grid heads: query heads, or key heads when a group of query heads shares them
    group: int       # query heads per grid item
    S: int
    T: int
    D: int
    Dv: int
    itemsize: int    # bytes per operand element (the tensor unit's dtype)
    dtype: str       # the tensor unit's dtype
    causal: bool
    q_loads: int     # DMA commands of a grid item before its key loop
    kv_loads: int    # DMA commands per key block
    k_vector: int    # vector commands per key block making k and v (rotary, casts)
    score_ops: int   # vector passes per block of scores before the softmax (a scale, a mask)
    score_loads: int  # loads of score operands per block (a mask), a block of scores each
    positions: bool  # the causal positions made by doubling in DRAM before the first diagonal block


def count_work(lines: list[str], group: int) -> dict:
    """What a kernel body as `attention` writes it issues: ``q_loads``, the loads between the grid
    loop and the key loop (those in the per-head loop of a grouped kernel once per query head);
    per key block ``kv_loads`` (a diagonal block's mask, made once per PE, aside; those in the
    per-head loop of a grouped kernel once per query head), ``k_vector``,
    the vector lines making k and v before the scores, and ``score_ops``, those on the scores
    before the softmax (a scale, a mask)."""
    par = next(i for i, t in enumerate(lines) if "fl.parallel(" in t and t.lstrip().startswith("for "))
    key = next(i for i, t in enumerate(lines) if t.lstrip().startswith("for ts in fl.range("))
    depth = _indent(lines[key])
    q_loads = sum(t.count("fl.load(") * (group if _indent(t) > depth else 1) for t in lines[par + 1:key])
    kv_loads = k_vector = score_ops = score_loads = 0
    scores = False
    heads_depth = None   # the indent of a grouped kernel's loop over the group's query heads
    for t in lines[key + 1:]:
        s = t.strip()
        if _indent(t) <= depth and s:
            break
        if s.startswith("m_new = "):
            break
        if s.startswith("for j, "):
            heads_depth = _indent(t)
        if "tri[key]" in s or s.startswith(("if ", "else", "elif ", "#", "key = ", "for j, ")):
            continue
        if s.startswith("s = fl.contract"):
            scores = True
            continue
        loads = s.count("fl.load(") * (group if heads_depth is not None and _indent(t) > heads_depth else 1)
        kv_loads += loads
        score_loads += loads if scores else 0
        vector_line = re.match(r"^\w+ = ", s) is not None and "fl.load(" not in s and \
            not s.startswith(("kt = [", "vt = ", "m, l, o = ")) and "q_of[j]" not in s
        if scores:
            score_ops += vector_line
        else:
            k_vector += s.count(".astype(") + vector_line
    return {"q_loads": q_loads, "kv_loads": kv_loads, "k_vector": k_vector, "score_ops": score_ops,
            "score_loads": score_loads}


def default_blocks(work: Work, cfg, fits) -> tuple[int, int]:
    """The (bq, bk) of least modelled time per PE among the power-of-two sizes that `fits`."""
    big = big_tile(cfg)
    qs = _sizes(work.S, big)
    best = None
    for bq in qs:
        for bk in ([bq] if work.causal else _sizes(work.T, big)):
            if not fits(bq, bk):
                continue
            t = pe_cycles(work, cfg, bq, bk)
            if best is None or t < best[0] * 0.98:   # within 2%: the larger blocks, met first
                best = (t, bq, bk)
    if best is None:
        return min(work.S, 4), min(work.T, 4)
    return best[1], best[2]


def pe_cycles(work: Work, cfg, bq: int, bk: int) -> float:
    """Modelled cycles of the busiest PE: grid items dealt heaviest first to the least loaded PE;
    per key block the slowest of its DMA, vector and tensor work (they overlap, double buffered)."""
    lanes, lat, start = cfg.vector_lanes, cfg.vector_latency_cycles, cfg.dma_startup_cycles
    # the PEs loading at once share DRAM: all of them, or as many as there are grid items
    rate = dma_rate(cfg, min(cfg.num_pes, work.grid * math.ceil(work.S / bq)))
    line = cfg.dram_min_transfer_bytes
    tm, tn, tk = cfg.native_tile(work.dtype)
    g = work.group
    row_bytes = -(-work.D * work.itemsize // line) * line

    def dma(r, c):   # k and v; a score operand (a mask) as a block of (r, c), at least a byte each
        return work.kv_loads * start + (2 * c * row_bytes + work.score_loads * r * max(line, c)) / rate

    def block(r, c, diagonal=False):   # a diagonal block of a causal kernel: one more pass, the mask
        vec = g * ((PASSES + work.score_ops + diagonal) * r * c / lanes + r * work.Dv / lanes + BLOCK_COMMANDS * lat) + \
            work.k_vector * (c * work.D / lanes + lat)
        ten = g * math.ceil(r / tm) * (math.ceil(c / tn) * math.ceil(work.D / tk) +
                                       math.ceil(c / tk) * (math.ceil(work.Dv / tn) + 1))
        return max(vec, dma(r, c), ten)

    items = []
    n_q = math.ceil(work.S / bq)
    for i in range(n_q):
        r = min(bq, work.S - i * bq)
        keys = min(work.T, (i + 1) * bq) if work.causal else work.T
        blocks = sum(block(r, min(bk, keys - j), work.causal and j + bk >= keys) for j in range(0, keys, bk))
        fixed = work.q_loads * start + g * (start + r * work.Dv * work.itemsize / rate + 2 * (r * work.Dv / lanes + lat))
        # the first key block's loads come before any compute: double buffering hides the
        # loads of the next blocks only, so an item of few large blocks exposes its loads
        items += [fixed + dma(r, min(bk, keys)) + blocks] * work.grid
    # the positions a causal mask is made from: log2(bq) load and store pairs on one PE, which
    # every PE's first diagonal block waits for
    setup = math.ceil(math.log2(max(2, bq))) * (2 * start + lat) if work.positions else 0.0
    load = [setup] * cfg.num_pes
    for c in sorted(items, reverse=True):
        load[load.index(min(load))] += c
    return max(load)


def _sizes(n: int, big: int) -> list[int]:
    """min(n, big), then halves down to 16 (or n itself when smaller)."""
    out, s = [], min(n, big)
    while True:
        out.append(s)
        if s <= 16:
            return out
        s //= 2


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))
