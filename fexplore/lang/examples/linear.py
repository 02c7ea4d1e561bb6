"""Contractions with the tensor unit: matmul; matmul + bias + gelu (a fused epilogue); the two that
frame a transformer block's residual stream: a projection added onto it (matmul_residual) and a
layer norm of it feeding a projection (layer_norm_matmul)."""

from __future__ import annotations

from fexplore import lang as fl
from fexplore.lang.examples._tiling import matmul_tiles, shrink
from fexplore.lang.examples.normalization import normed


@fl.kernel
def matmul(a: fl.Tensor["M", "K"], b: fl.Tensor["K", "N"], *, tm: int = 0, tn: int = 0, tk: int = 0,
           stages: int = 2):
    """C = a @ b, accumulated in f32, stored in a's dtype. Output tiles go round-robin to the PEs;
    the K loop is double buffered, so loading the next K slab overlaps contracting this one."""
    M, K = a.shape
    N = b.shape[1]
    if not (tm and tn and tk):
        tm, tn, tk = matmul_tiles(M, N, K, a.dtype.itemsize, fl.target(), a.dtype.name, stages)
    C = fl.output(a.dtype["M", "N"])
    for ms, ns in fl.parallel(fl.tiles(M, tm), fl.tiles(N, tn), stages=stages):
        acc = None
        for ks in fl.range(fl.tiles(K, tk), stages=stages):
            at = fl.load(a[ms, ks])
            bt = fl.load(b[ks, ns])
            acc = fl.contract("mk,kn->mn", at, bt, acc=acc)
        fl.store(C[ms, ns], acc.astype(C.dtype))
    return C


@fl.kernel
def matmul_bias_gelu(a: fl.Tensor["M", "K"], b: fl.Tensor["K", "N"], bias: fl.Tensor["N"], *,
                     tm: int = 0, tn: int = 0, tk: int = 0, stages: int = 2):
    """C = gelu(a @ b + bias): the epilogue runs on the vector unit straight off the accumulator,
    while the tensor unit goes on with the next output tile."""
    M, K = a.shape
    N = b.shape[1]
    if not (tm and tn and tk):
        tm, tn, tk = matmul_tiles(M, N, K, a.dtype.itemsize, fl.target(), a.dtype.name, stages)
    C = fl.output(a.dtype["M", "N"])
    for ms, ns in fl.parallel(fl.tiles(M, tm), fl.tiles(N, tn), stages=stages):
        acc = None
        for ks in fl.range(fl.tiles(K, tk), stages=stages):
            acc = fl.contract("mk,kn->mn", fl.load(a[ms, ks]), fl.load(b[ks, ns]), acc=acc)
        bt = fl.load(bias[ns])
        y = fl.gelu(acc + bt, dtype=C.dtype)
        fl.store(C[ms, ns], y)
    return C


@fl.kernel
def matmul_residual(a: fl.Tensor["M", "K"], b: fl.Tensor["K", "N"], bias: fl.Tensor["N"],
                    residual: fl.Tensor["M", "N"], *, tm: int = 0, tn: int = 0, tk: int = 0, stages: int = 2):
    """C = residual + (a @ b + bias), in the residual's dtype: an output projection adding onto the
    residual stream, which mixed precision keeps in f32 while the operands are bf16. The residual
    tile is loaded while the K loop runs; the bias and the add are the epilogue."""
    M, K = a.shape
    N = b.shape[1]
    if not (tm and tn and tk):
        tm, tn, tk = matmul_tiles(M, N, K, a.dtype.itemsize, fl.target(), a.dtype.name, stages)
    C = fl.output(residual.dtype["M", "N"])
    for ms, ns in fl.parallel(fl.tiles(M, tm), fl.tiles(N, tn), stages=stages):
        acc = None
        for ks in fl.range(fl.tiles(K, tk), stages=stages):
            acc = fl.contract("mk,kn->mn", fl.load(a[ms, ks]), fl.load(b[ks, ns]), acc=acc)
        y = fl.add(acc + fl.load(bias[ns]), fl.load(residual[ms, ns]), dtype=C.dtype)
        fl.store(C[ms, ns], y)
    return C


@fl.kernel
def layer_norm_matmul(x: fl.Tensor["M", "K"], gamma: fl.Tensor["K"], beta: fl.Tensor["K"], b: fl.Tensor["K", "N"],
                      *, eps: float = 1e-5, tm: int = 0, tn: int = 0, stages: int = 2):
    """C = layer_norm(x) @ b, in x's dtype: the norm runs on whole rows of x (f32, the residual
    stream) and writes them in b's dtype for the tensor unit (the vector unit casts on write), then
    one contraction over the whole K. gamma and beta are loaded once per PE."""
    M, K = x.shape
    N = b.shape[1]
    if not (tm and tn):
        cfg = fl.target()
        tm, tn, _ = matmul_tiles(M, N, K, b.dtype.itemsize, cfg, b.dtype.name, stages)

        def fits(tm, tn):   # per item in flight: the rows and 3 f32 temporaries of them, the weight
            # tile, the accumulator; within half the SRAM, as the other examples' tiles
            return stages * (4 * tm * K * 4 + K * tn * b.dtype.itemsize + tm * tn * 4) <= cfg.sram_bytes_per_pe // 2
        nm, nn, _ = cfg.native_tile(b.dtype.name)
        tm, tn = shrink([tm, tn], fits, [min(M, nm), min(N, nn)])
    C = fl.output(x.dtype["M", "N"])
    params = {}   # per PE, decided at trace time
    for ms, ns in fl.parallel(fl.tiles(M, tm), fl.tiles(N, tn), stages=stages):
        if fl.pe() not in params:
            params[fl.pe()] = fl.load(gamma[:]), fl.load(beta[:])
        g, bt = params[fl.pe()]
        xn = normed(fl.load(x[ms, :]), g, bt, eps, "K", b.dtype)   # the tensor unit's operand dtype
        fl.store(C[ms, ns], fl.contract("mk,kn->mn", xn, fl.load(b[:, ns])))
    return C
