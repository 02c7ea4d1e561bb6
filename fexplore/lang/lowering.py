"""Lowering: a kernel trace becomes an NPU command program (`fexplore.npu.ProgramBuilder`).

  1. DRAM tensors become the program's inputs/outputs/scratch; the SRAM plan's buffers become
     SRAM buffers (the npu allocator then gives them addresses).
  2. Peephole: zero-filling an accumulator that a contraction then accumulates onto is dropped, and
     that contraction overwrites instead (the tensor unit starts from zero for free).
  3. Dependencies between ops are the npu's own hazard rules (`npu.hazards`) over the plan's
     buffers and the DRAM boxes, plus waits. The list scheduler (`schedule.py`) picks the issue
     order from the npu's cost model; the builder re-derives the same hazards from that order.
  4. Every command carries the kernel line it came from, so the timeline attributes cycles to lines.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from fexplore.lang import ir
from fexplore.lang.errors import SRAMOverflowError
from fexplore.lang.schedule import list_schedule
from fexplore.npu import ProgramBuilder, cost
from fexplore.npu.commands import DMA, TENSOR, VECTOR
from fexplore.npu.errors import SRAMOverflowError as NPUSRAMOverflowError
from fexplore.npu.hazards import HazardTracker
from fexplore.npu.vector_ops import VECTOR_OPS


class _ContractShape(NamedTuple):   # what npu.cost needs of a contraction
    sizes: tuple
    dtype: str


class _VectorShape(NamedTuple):     # what npu.cost needs of a vector command
    elements: int
    op: object


class _IndexedShape(NamedTuple):   # what npu.cost needs of a gather or scatter
    ref: object
    axis: int
    index: tuple
    mode: str
    rows: int
    reduce: str | None


def lower(trace: ir.KernelTrace):
    cfg = trace.target
    plan = trace.plan
    b = ProgramBuilder(cfg, name=trace.name, capture_locs=False)
    make = {"input": b.input, "output": b.output, "scratch": b.scratch}
    dram = {t.name: make[t.kind](t.name, t.shape, t.dtype.name) for t in trace.tensors}
    bufs = [b.alloc(pb.name, pb.shape, pb.dtype.name, pe=pb.pe, loc=pb.loc) for pb in plan.buffers]

    def buf(t):
        return bufs[plan.buffer_of[t.id].id]

    def ref(box):
        return dram[box.tensor.name][box.slices]

    ops = trace.ops
    dropped, overwrite = _fresh_accumulators(ops)
    keep = [op for op in ops if op.index not in dropped]
    slot = {op.index: k for k, op in enumerate(keep)}

    # ---- dependencies and costs, in trace order ------------------------------------------------
    hz = HazardTracker()
    active = max(1, len({op.pe for op in keep}))
    dma_rate = cost.dma_rate(cfg, active)
    pe_of, engine_of, duration, deps, refs = [], [], [], [], []
    fence: dict[int, int] = {}   # pe -> the latest wait on it
    for k, op in enumerate(keep):
        reads = tuple(buf(t) for t in op.reads() if not (op.index in overwrite and t is op.out))
        writes = tuple(buf(t) for t in op.writes())
        d = hz.buffer_deps(k, reads, writes)
        box = None
        if isinstance(op, (ir.Load, ir.Store, ir.Gather, ir.Scatter)):
            writes_dram = isinstance(op, (ir.Store, ir.Scatter))
            box = ref(op.dst if writes_dram else op.src)   # a gather/scatter may touch all of its box
            d |= hz.dram_deps(k, box, writes_dram)
        if isinstance(op, ir.Wait):
            d.add(slot[op.target.index])
        elif op.pe in fence:
            d.add(fence[op.pe])
        if isinstance(op, ir.Wait):
            fence[op.pe] = k
        pe_of.append(op.pe)
        engine_of.append(_engine(op))
        duration.append(_estimate(op, cfg, box, dma_rate))
        deps.append(sorted(d))
        refs.append(box)

    order = list_schedule(pe_of, engine_of, duration, deps, cfg.num_pes)

    # ---- emission ----------------------------------------------------------------------------
    cmds: list = [None] * len(keep)
    for k in order:
        op = keep[k]
        loc = op.loc
        explicit = [cmds[d] for d in deps[k] if isinstance(keep[d], ir.Wait)]
        if isinstance(op, ir.Load):
            cmd = b.load(buf(op.dst), refs[k], deps=explicit, loc=loc)
        elif isinstance(op, ir.Store):
            cmd = b.store(refs[k], buf(op.src), deps=explicit, loc=loc)
        elif isinstance(op, ir.Gather):
            cmd = b.gather(buf(op.dst), refs[k], tuple(map(buf, op.idx)), axis=_dram_axis(op.src, op.axis), mode=op.mode,
                           deps=explicit, loc=loc)
        elif isinstance(op, ir.Scatter):
            cmd = b.scatter(refs[k], tuple(map(buf, op.idx)), buf(op.src), axis=_dram_axis(op.dst, op.axis), mode=op.mode,
                            reduce=op.reduce, deps=explicit, loc=loc)
        elif isinstance(op, ir.Transpose):
            cmd = b.transpose(buf(op.out), buf(op.src), op.perm, deps=explicit, loc=loc)
        elif isinstance(op, ir.Contract):
            acc = op.accumulate and op.index not in overwrite
            cmd = b.contract(buf(op.out), op.spec, buf(op.a), buf(op.b), accumulate=acc, deps=explicit, loc=loc)
        elif isinstance(op, ir.Vector):
            args = [buf(x) if isinstance(x, ir.Tile) else x for x in op.operands]
            cmd = b.vector(buf(op.out), op.op, *args, axis=op.axis if op.axis is not None else -1,
                           keepdims=op.keepdims, deps=explicit, loc=loc)
        elif isinstance(op, ir.Fill):
            cmd = b.vector(buf(op.out), "fill", op.value, deps=explicit, loc=loc)
        elif isinstance(op, ir.Broadcast):
            # the vector unit has no broadcast; 0 + x broadcasts x exactly into the larger shape
            out = buf(op.out)
            b.vector(out, "fill", 0.0, deps=explicit, loc=loc)
            cmd = b.vector(out, "add", out, buf(op.src), deps=explicit, loc=loc)
        else:  # Wait
            cmd = b.sync(cmds[slot[op.target.index]], *explicit, pe=op.pe, loc=loc)
        cmds[k] = cmd
    try:
        return b.build()
    except NPUSRAMOverflowError as e:
        raise SRAMOverflowError(
            "after scheduling, the SRAM of a PE does not fit its buffers (overlapping lifetimes or "
            "fragmentation)", expected=f"at most {cfg.sram_bytes_per_pe:,} bytes per PE",
            given=e.message, loc=e.loc, detail=e.detail,
            hint="use smaller tiles or fewer stages; the SRAM plan leaves too little headroom") from None


def _fresh_accumulators(ops: list[ir.Op]) -> tuple[set[int], set[int]]:
    """Zero fills whose tile's next use is a contraction accumulating onto it: drop the fill, and let
    the contraction overwrite. Returns (dropped fill indices, overwriting contraction indices)."""
    pending: dict[int, ir.Fill] = {}   # tile id -> its zero fill, while no other op touched it
    dropped, overwrite = set(), set()
    for op in ops:
        for t in op.tiles():
            fill = pending.pop(t.id, None)
            if fill is not None and isinstance(op, ir.Contract) and op.accumulate and op.out is t \
                    and op.a is not t and op.b is not t:
                dropped.add(fill.index)
                overwrite.add(op.index)
        if isinstance(op, ir.Fill) and op.value == 0.0:
            pending[op.out.id] = op
    return dropped, overwrite


def _box_of(op):
    return op.src if isinstance(op, ir.Gather) else op.dst


def _dram_axis(box, axis: int) -> int:
    """The tensor dim of a box's tile axis (dims indexed by an int are not in the tile)."""
    return [d for d, kept in enumerate(box.kept) if kept][axis]


def _engine(op: ir.Op) -> int:
    return {"dma": DMA, "tensor": TENSOR, "vector": VECTOR}.get(op.engine, -1)


def _estimate(op: ir.Op, cfg, box, dma_rate: float) -> float:
    """The op's cycles in the npu's cost model (DMA at a fair share of DRAM for the PEs in use)."""
    if isinstance(op, (ir.Gather, ir.Scatter)):
        tile = op.dst if isinstance(op, ir.Gather) else op.src
        rows = op.idx[0].size if op.mode == "rows" else tile.size
        shape = _IndexedShape(box, _dram_axis(_box_of(op), op.axis), op.idx, op.mode, rows, getattr(op, "reduce", None))
        return cfg.dma_startup_cycles + cost.indexed_moved_bytes(shape, cfg) / dma_rate
    if isinstance(op, ir.Transpose):
        return math.ceil(op.src.size / cfg.transpose_elements_per_cycle) + cfg.vector_latency_cycles
    if box is not None:
        return cfg.dma_startup_cycles + cost.dma_moved_bytes(box, cfg) / dma_rate
    if isinstance(op, ir.Contract):
        return cost.contract_cycles(_ContractShape(op.sizes, op.a.dtype.name), cfg)
    if isinstance(op, ir.Vector):
        elems = max([op.out.size] + [x.size for x in op.operands if isinstance(x, ir.Tile)])
        return cost.vector_cycles(_VectorShape(elems, VECTOR_OPS[op.op]), cfg)
    if isinstance(op, (ir.Fill, ir.Broadcast)):
        passes = 1 if isinstance(op, ir.Fill) else 2
        return math.ceil(op.out.size * passes / cfg.vector_lanes) + cfg.vector_latency_cycles * passes
    return 0.0
