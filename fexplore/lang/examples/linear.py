"""Contractions with the tensor unit: matmul, and matmul + bias + gelu (a fused epilogue)."""

from __future__ import annotations

from fexplore import lang as fl
from fexplore.lang.examples._tiling import matmul_tiles


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
