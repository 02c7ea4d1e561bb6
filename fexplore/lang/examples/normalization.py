"""Row-wise kernels on the vector unit: softmax, layer norm, RMS norm. Each loads a block of rows,
reduces along the named axis, and stores; blocks go round-robin to the PEs. They move a lot of data
for little math, so they are DMA-bound: `stages=2` (the default) overlaps the next block's load and
the previous block's store with this block's math; `stages=1` is the serial version."""

from __future__ import annotations

from fexplore import lang as fl
from fexplore.lang.examples._tiling import row_tiles


@fl.kernel
def softmax(x: fl.Tensor["R", "C"], *, rows: int = 0, stages: int = 2):
    R, C = x.shape
    rows = rows or row_tiles(R, C * (x.dtype.itemsize * 2 + 12), fl.target(), stages)
    Y = fl.output(x.dtype["R", "C"])
    for rs in fl.parallel(fl.tiles(R, rows), stages=stages):
        xt = fl.load(x[rs, :])
        e = fl.exp(xt - xt.max(axis="C"))         # subtract the row max: exp cannot overflow
        y = fl.div(e, e.sum(axis="C"), dtype=Y.dtype)
        fl.store(Y[rs, :], y)
    return Y


@fl.kernel
def layer_norm(x: fl.Tensor["R", "D"], gamma: fl.Tensor["D"], beta: fl.Tensor["D"], *, eps: float = 1e-5,
               rows: int = 0, stages: int = 2):
    R, D = x.shape
    rows = rows or row_tiles(R, D * (x.dtype.itemsize * 2 + 12), fl.target(), stages)
    Y = fl.output(x.dtype["R", "D"])
    params = {}   # gamma and beta, loaded once per PE (plain Python state, decided at trace time)
    for rs in fl.parallel(fl.tiles(R, rows), stages=stages):
        if fl.pe() not in params:
            params[fl.pe()] = fl.load(gamma[:]), fl.load(beta[:])
        g, bt = params[fl.pe()]
        fl.store(Y[rs, :], normed(fl.load(x[rs, :]), g, bt, eps, "D", Y.dtype))
    return Y


def normed(xt, g, bt, eps: float, axis: str, dtype):
    """Layer norm of the rows of tile `xt` along `axis`, times `g` plus `bt`, written in `dtype`
    (the vector unit computes in f32 and casts on write). Called inside kernels: it traces."""
    xc = xt - xt.mean(axis=axis)
    rstd = fl.rsqrt((xc * xc).mean(axis=axis) + eps)
    return fl.add(xc * rstd * g, bt, dtype=dtype)


@fl.kernel
def rms_norm(x: fl.Tensor["R", "D"], w: fl.Tensor["D"], *, eps: float = 1e-6, rows: int = 0, stages: int = 2):
    """Computed in place (`out=`): one SRAM buffer per block of rows, so with `stages=1` the next
    block's load waits for this block's store, and with `stages=2` it does not."""
    R, D = x.shape
    rows = rows or row_tiles(R, D * (x.dtype.itemsize + 8), fl.target(), stages)
    Y = fl.output(x.dtype["R", "D"])
    weights = {}
    for rs in fl.parallel(fl.tiles(R, rows), stages=stages):
        if fl.pe() not in weights:
            weights[fl.pe()] = fl.load(w[:])
        xt = fl.load(x[rs, :])
        rms = fl.rsqrt((xt * xt).mean(axis="D") + eps)
        fl.mul(xt, rms, out=xt)
        fl.mul(xt, weights[fl.pe()], out=xt)
        fl.store(Y[rs, :], xt)
    return Y
