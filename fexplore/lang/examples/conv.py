"""A 2-D convolution as a contraction over patches.

out[b, p, q, o] = sum over (kh, kw, c) of x[b, p + kh, q + kw, c] * w[kh, kw, c, o]   (stride 1, valid)

The patch elements at kernel offset (kh, kw), for a block of output rows, are one unit-stride box
of x: x[b, p0+kh : p1+kh, kw : kw+Q, :]. So the convolution is KH*KW contractions 'pqc,co->pqo'
accumulated on the tensor unit (the c axis contracted, p and q together the M side), with no
im2col copy in DRAM. Each (batch, row block, output-channel block) is one parallel iteration.
"""

from __future__ import annotations

import itertools
import math

from fexplore import lang as fl
from fexplore.lang.examples._tiling import big_tile, shrink


@fl.kernel
def conv2d(x: fl.Tensor["B", "H", "W", "C"], w: fl.Tensor["KH", "KW", "C", "O"], *, rows: int = 0,
           to: int = 0, stages: int = 2):
    B, H, W, C = x.shape
    KH, KW, _, O = w.shape
    P, Q = H - KH + 1, W - KW + 1
    cfg = fl.target()
    if not (rows and to):
        rows, to = max(1, big_tile(cfg) // Q), min(O, big_tile(cfg))
        while B * math.ceil(P / rows) * math.ceil(O / to) < cfg.num_pes and rows > 1:
            rows //= 2
        isz = x.dtype.itemsize
        rows, to = shrink([min(rows, P), to],
                          lambda r, t: 2 * stages * (r * Q * C + C * t) * isz + 2 * r * Q * t * (4 + isz)
                          <= cfg.sram_bytes_per_pe // 2, [1, min(O, 4)])
    Y = fl.output((B, P, Q, O), x.dtype, axes="B P Q O")
    for b, ps, os_ in fl.parallel(range(B), fl.tiles(P, rows), fl.tiles(O, to), stages=stages):
        acc = None
        for kh, kw in fl.range(itertools.product(range(KH), range(KW)), stages=stages):
            patch = fl.load(x[b, ps.start + kh:ps.stop + kh, kw:kw + Q, :])    # (rows, Q, C)
            wt = fl.load(w[kh, kw, :, os_])                                     # (C, to)
            acc = fl.contract("pqc,co->pqo", patch, wt, acc=acc)
        fl.store(Y[b, ps, :, os_], acc.astype(Y.dtype))
    return Y
