"""The timing model, in one place: what each command costs on a given chip.

  DMA       start-up + moved bytes / bandwidth, where moved bytes round every contiguous run up to
            the DRAM's minimum transfer (256 B on rngd), and the bandwidth is the DMA engine's,
            shared fairly with other PEs' transfers when DRAM is the bottleneck (the simulator
            does the sharing; `dma_alone_cycles` is the uncontended figure).
  tensor    batch x ceil(m/tm) x ceil(n/tn) x ceil(k/tk) + pipeline latency: the contraction is
            padded to the unit's native tile (tm, tn, tk) for its dtype (tile quantization), so
            a 100x100x100 matmul costs what a 128x112x112 one does on rngd.
  vector    ceil(elements x passes / lanes) + latency, elements being the largest operand.
  gather /  one start-up for the command, then one transfer per index value (a row) or per element,
  scatter   each rounded up to the minimum transfer like any contiguous run; a scatter that
            reduces (add, max, min, mul) reads and writes every row ([ASSUMPTION] a
            read-modify-write: 2x bytes).
  transpose ceil(elements / transpose_elements_per_cycle) + the vector latency, on the vector queue.
  host      start-up + (operand + result bytes) / host link + flops / host rate (`host_cycles`).
"""

from __future__ import annotations

import math

from fexplore.npu import dtypes
from fexplore.npu.commands import Contract, DramRef, Transpose, Vector, _Indexed
from fexplore.npu.config import NPUConfig


def dma_moved_bytes(ref: DramRef, cfg: NPUConfig) -> int:
    """Bytes the DMA really moves for `ref`: each contiguous run rounded up to the minimum transfer."""
    run_elems = ref.contiguous_run()
    run_bytes = run_elems * dtypes.itemsize(ref.tensor.dtype)
    line = cfg.dram_min_transfer_bytes
    return (ref.size // run_elems) * (-(-run_bytes // line)) * line


def indexed_moved_bytes(cmd: _Indexed, cfg: NPUConfig) -> int:
    """Bytes a gather or scatter really moves: each row (or element) its own transfer, rounded up."""
    ref = cmd.ref
    if cmd.mode == "rows":
        picked = range(cmd.axis, cmd.axis + len(cmd.index))
        shape = tuple(1 if d in picked else n for d, n in enumerate(ref.shape))
        per = dma_moved_bytes(DramRef(ref.tensor, ref.offsets, shape), cfg)
    else:
        line = cfg.dram_min_transfer_bytes
        per = -(-dtypes.itemsize(ref.tensor.dtype) // line) * line
    rmw = 2 if getattr(cmd, "reduce", None) else 1   # a Gather has no reduce
    return cmd.rows * per * rmw


def dma_command_bytes(cmd, cfg: NPUConfig) -> int:
    """Moved bytes of any DMA command (a box load/store, a gather or a scatter)."""
    if isinstance(cmd, _Indexed):
        return indexed_moved_bytes(cmd, cfg)
    return dma_moved_bytes(cmd.ref, cfg)


def host_cycles(cmd, cfg: NPUConfig) -> float:
    """A host op: one DMA start-up, its operands and results over the host link, and the host's
    compute at `host_flops_per_cycle` (an [ASSUMPTION] of the config)."""
    return cfg.dma_startup_cycles + cmd.nbytes / cfg.host_bytes_per_cycle + cmd.flops / cfg.host_flops_per_cycle


def onchip_copy_cycles(ref: DramRef, cfg: NPUConfig) -> float:
    """A DMA to or from a resident (SRAM) tensor: a short start-up and the bytes at the DMA
    engine's rate; DRAM bandwidth is not involved."""
    return cfg.onchip_copy_startup_cycles + ref.size * dtypes.itemsize(ref.tensor.dtype) / cfg.dma_bytes_per_cycle


def dma_rate(cfg: NPUConfig, concurrent: int = 1) -> float:
    """Bytes per cycle each of `concurrent` transfers gets: fair shares of DRAM, capped by the engine."""
    return min(cfg.dma_bytes_per_cycle, cfg.dram_bytes_per_cycle / concurrent)


def dma_alone_cycles(nbytes_moved: int, cfg: NPUConfig) -> float:
    """A DMA with the DRAM to itself: start-up + bytes / min(engine, DRAM) bandwidth."""
    return cfg.dma_startup_cycles + nbytes_moved / dma_rate(cfg)


def contract_tiles(cmd: Contract, cfg: NPUConfig) -> int:
    batch, m, n, k = cmd.sizes
    tm, tn, tk = cfg.native_tile(cmd.dtype)
    return batch * math.ceil(m / tm) * math.ceil(n / tn) * math.ceil(k / tk)


def contract_cycles(cmd: Contract, cfg: NPUConfig) -> int:
    return contract_tiles(cmd, cfg) + cfg.tensor_latency_cycles


def vector_cycles(cmd: Vector, cfg: NPUConfig) -> int:
    return math.ceil(cmd.elements * cmd.op.passes / cfg.vector_lanes) + cfg.vector_latency_cycles


def transpose_cycles(cmd: Transpose, cfg: NPUConfig) -> int:
    return math.ceil(cmd.elements / cfg.transpose_elements_per_cycle) + cfg.vector_latency_cycles
