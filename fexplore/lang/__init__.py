"""The kernel language: write NPU kernels in Python, checked at trace time, run three ways.

    from fexplore import lang as fl

    @fl.kernel
    def matmul(a: fl.Tensor["M", "K"], b: fl.Tensor["K", "N"]):
        M, K = a.shape
        N = b.shape[1]
        C = fl.output(a.dtype["M", "N"])
        for ms, ns in fl.parallel(fl.tiles(M, 128), fl.tiles(N, 128)):      # tiles over the PEs
            acc = None
            for ks in fl.range(fl.tiles(K, 128), stages=2):                 # double-buffered loop
                acc = fl.contract("mk,kn->mn", fl.load(a[ms, ks]), fl.load(b[ks, ns]), acc=acc)
            fl.store(C[ms, ns], acc.astype(C.dtype))
        return C

    y = matmul(a, b)                          # numpy interpreter
    r = matmul.simulate(a, b, target="rngd")  # NPU commands on the cycle simulator: r.timeline ...

A tile in SRAM can be sliced, ``a[:, ks]`` or ``w[:, 0::2]`` (ints, and slices with a step): a
view of its buffer, no copy and no DMA, e.g. whole rows loaded once and fed to the tensor unit in
K slabs, a pooling window's columns picked from rows loaded whole, or the part of an accumulator a
contraction adds into (``fl.contract(..., acc=acc[:, 1:])``).

Layers: the builtins here -> `semantics` (checks, records ops with source lines) -> the kernel IR
(`ir`) -> back ends: `interpreter` (numpy), `plan` + `lowering` + `schedule` (NPU commands, then
`fexplore.npu`'s simulator). Errors: `fexplore.lang.errors` (codes FK1xx). In a notebook,
``%load_ext fexplore`` adds the ``%%furiosa_kernel`` cell magic (`magic`).

Example kernels: ``fl.examples.matmul`` and friends (imported on first use).
"""

from fexplore.lang import errors
from fexplore.lang.builtins import (ELEMENTWISE, REDUCTIONS, broadcast_to, cast, contract, copy, empty, full,
                                    gather, load, num_pes, output, parallel, pe, range, scatter, scratch, store,
                                    target, tiles, transpose, wait, where, zeros)
from fexplore.lang.errors import KernelError
from fexplore.lang.ir import KernelTrace
from fexplore.lang.kernel import ArgSpec, Kernel, PipelineCheck, kernel, spec
from fexplore.lang.types import (ACC, DRAM, SRAM, DType, Tensor, TensorSpec, bf16, bool_, f16, f32, fp8, i8,
                                 i16, i32, i64, u8, u16, u32, u64)
from fexplore.lang.values import DMA, DramSlice, DramTensor, Tile

globals().update(ELEMENTWISE)   # fl.exp, fl.add, fl.maximum, fl.gt, ... (the vector unit's op table)
globals().update(REDUCTIONS)    # fl.sum, fl.max, fl.min, fl.mean (shadow Python's only inside `fl.`)


def __getattr__(name):
    if name == "examples":   # lazy: importing the language does not trace or build anything
        import importlib

        return importlib.import_module("fexplore.lang.examples")
    raise AttributeError(f"module 'fexplore.lang' has no attribute {name!r}")


# `from fexplore.lang import *` leaves Python's range/sum/max/min/abs/round alone; write fl.range etc.
__all__ = ["ACC", "DRAM", "SRAM", "ArgSpec", "DMA", "DType", "DramSlice", "DramTensor", "Kernel", "KernelError",
           "KernelTrace", "PipelineCheck", "Tensor", "TensorSpec", "Tile", "bf16", "bool_", "broadcast_to",
           "cast", "contract", "copy", "empty", "errors", "f16", "f32", "fp8", "full", "gather", "i8", "i16",
           "i32", "i64", "u8", "u16", "u32", "u64", "kernel", "load", "num_pes", "output", "parallel", "pe", "scatter", "scratch", "spec", "store",
           "target", "tiles", "transpose", "wait", "where", "zeros",
           *(n for n in (*ELEMENTWISE, *REDUCTIONS) if n not in ("sum", "max", "min", "abs", "round"))]
