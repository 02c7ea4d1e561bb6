"""Flash attention: softmax(q k^T * scale) v, streaming over the keys with a running max and sum, so
the (S x T) score matrix never exists whole; one block of queries per PE iteration.

Per key block: scores on the tensor unit ('sd,td->st': q @ k^T without a transpose), the softmax
update on the vector unit, then P @ V onto the output accumulator, rescaled when the max grows.
The row sums of P are a contraction too (P @ a column of ones), because on this chip the vector
unit, not the tensor unit, is the bottleneck of attention: every pass it is spared counts.
With `stages=2` the next block's scores are computed while the vector unit works on this block's.
"""

from __future__ import annotations

import math

from fexplore import lang as fl
from fexplore.lang.examples._tiling import big_tile, shrink


def _blocks(H: int, S: int, T: int, D: int, itemsize: int, cfg, stages: int, group: int = 1) -> tuple[int, int]:
    """Query and key block sizes for H grid heads, each `group` query heads sharing one key head."""
    big = big_tile(cfg)
    bq, bk = min(S, big), min(T, big)   # big query blocks: K and V are re-read once per query block
    while H * math.ceil(S / bq) < 2 * cfg.num_pes and bq > 16:   # two query blocks per PE at least
        bq //= 2

    def fits(bq, bk):
        return blocks_fit(bq, bk, D, itemsize, cfg, stages, group)

    bq, bk = shrink([bq, bk], fits, [min(S, 4), min(T, 4)])
    return bq, bk


def blocks_fit(bq: int, bk: int, D: int, itemsize: int, cfg, stages: int, group: int = 1) -> bool:
    """Whether query and key blocks of these sizes fit half a PE's SRAM: per stage k, v, scores,
    shifted scores and p; held across the keys q, o and the row statistics."""
    per_stage = 2 * bk * D * itemsize + group * bq * bk * (4 + 4 + itemsize)
    held = group * (bq * D * (2 * itemsize + 8) + 64 * bq)
    return stages * per_stage + held <= cfg.sram_bytes_per_pe // 2


@fl.kernel
def flash_attention(q: fl.Tensor["H", "S", "D"], k: fl.Tensor["H", "T", "D"], v: fl.Tensor["H", "T", "D"], *,
                    scale: float = 0.0, bq: int = 0, bk: int = 0, stages: int = 2):
    H, S, D = q.shape
    T = k.shape[1]
    scale = scale or 1.0 / math.sqrt(D)
    if not (bq and bk):
        bq, bk = _blocks(H, S, T, D, q.dtype.itemsize, fl.target(), stages)
    O = fl.output(q.dtype["H", "S", "D"])
    ones = {}   # (pe, rows) -> a column of ones: row sums of P run on the tensor unit, not the vector unit
    for h, qs in fl.parallel(range(H), fl.tiles(S, bq)):
        qt = fl.load(q[h, qs, :])   # the scale is not folded in: q * scale would round to q's dtype
        m = fl.full((qs, 1), -math.inf, axes=("S", None))           # running row max
        l = o = None                                                # running row sum, output (ACC)  # noqa: E741
        for ts in fl.range(fl.tiles(T, bk), stages=stages):
            kt = fl.load(k[h, ts, :])
            vt = fl.load(v[h, ts, :])
            s = fl.contract("sd,td->st", qt, kt)
            m_new = fl.maximum(m, s.max(axis="T") * scale)          # the row max of the scaled scores
            # the scale where the shift is: exp(s * scale - max), a multiply-add in the same pass;
            # P in the operand dtype, for P @ V
            p = fl.exp(fl.fma(s, scale, -m_new), dtype=q.dtype)
            if o is not None:
                alpha = fl.exp(m - m_new)                           # how much the old max shrinks by
                fl.mul(o, alpha, out=o)                             # rescale the accumulators in place
                fl.mul(l, alpha, out=l)
            key = (fl.pe(), ts.stop - ts.start)
            if key not in ones:
                ones[key] = fl.full((ts, 1), 1.0, dtype=q.dtype, axes=("T", None))
            l = fl.contract("st,tx->sx", p, ones[key], acc=l)  # noqa: E741
            o = fl.contract("st,td->sd", p, vt, acc=o)
            m = m_new
        fl.store(O[h, qs, :], fl.div(o, l, dtype=O.dtype))
    return O
