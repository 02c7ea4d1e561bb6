"""Lowering: a kernel trace becomes an NPU command program (`fexplore.npu.ProgramBuilder`).

  1. DRAM tensors become the program's inputs/outputs/scratch; the SRAM plan's buffers become
     SRAM buffers (the npu allocator then gives them addresses).
  2. Peephole: zero-filling an accumulator that a contraction then accumulates onto is dropped, and
     that contraction overwrites instead (the tensor unit starts from zero for free). An output
     that starts as a parameter (`fl.output(init=)`) and that the caller bound to the parameter's
     own bytes is not copied: the kernel updates the parameter in place.
  3. Dependencies between ops are the npu's own hazard rules (`npu.hazards`) over the plan's
     buffers and the DRAM boxes, plus waits. The list scheduler (`schedule.py`) picks the issue
     order from the npu's cost model; the builder re-derives the same hazards from that order.
  4. Every command carries the kernel line it came from, so the timeline attributes cycles to lines.

`emit` does the same for many kernels (and host ops) into one program: the schedule stage's
whole-model program is the kernels of the lower stage emitted together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from fexplore.lang import ir
from fexplore.lang.errors import SRAMOverflowError
from fexplore.lang.schedule import WINDOW, list_schedule
from fexplore.npu import ProgramBuilder, cost, dtypes
from fexplore.npu.commands import DMA, TENSOR, VECTOR, ResidentView, resident_view, view_of
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
    """The kernel's NPU program: its DRAM tensors as the program's inputs, outputs and scratch."""
    b = ProgramBuilder(trace.target, name=trace.name, capture_locs=False)
    make = {"input": b.input, "output": b.output, "scratch": b.scratch}
    dram = {t.name: make[t.kind](t.name, t.shape, t.dtype.name) for t in trace.tensors}
    try:
        return emit(b, [KernelPart(trace, dram)])
    except SRAMOverflowError:
        # the list scheduler's order kept more tiles alive than the plan allowed: trace order,
        # which the SRAM plan was checked in, fits
        b = ProgramBuilder(trace.target, name=trace.name, capture_locs=False)
        make = {"input": b.input, "output": b.output, "scratch": b.scratch}
        dram = {t.name: make[t.kind](t.name, t.shape, t.dtype.name) for t in trace.tensors}
        return emit(b, [KernelPart(trace, dram)], interleave="trace")


@dataclass
class KernelPart:
    """One kernel of a program: its trace, and the program's DRAM tensor for each of the kernel's
    (by the kernel's own tensor names). Buffers are named ``prefix`` + the plan's names."""

    trace: ir.KernelTrace
    dram: dict
    prefix: str = ""


@dataclass
class HostPart:
    """An op the chip does not run (see `npu.commands.Host`): DRAM boxes in, DRAM boxes out."""

    op: str
    fn: Callable
    src: tuple
    dst: tuple
    flops: int = 0
    loc: Any = None


@dataclass
class StagePart:
    """A DRAM tensor the kernels read many times, staged once into a resident tensor on chip
    (`npu.commands.Stage`), issued while the kernel before its first reader runs."""

    src: Any      # the DRAM tensor
    dst: Any      # the resident tensor


def emit(b: ProgramBuilder, parts: list, *, interleave: bool | str = True, owner: list | None = None,
         sram_limit: float | None = None):
    """Emit `parts` (KernelPart / HostPart, in program order) into `b` and build the program.

    Dependencies are the npu's hazard rules over every part's buffers and DRAM boxes, so a part
    waits for the parts whose outputs it reads and nothing else. With `interleave`, one list
    scheduler orders the ops of all parts together: the next kernel's weight loads are issued
    while this one computes, and independent kernels overlap. Without it, each part's ops are
    scheduled on their own and the parts follow each other (a serial schedule); ``"trace"`` keeps
    every op in trace order, parts in sequence (the order each kernel's SRAM plan was checked in,
    the last resort when a scheduled order overflows). `owner`, if given,
    is filled with each command's part index (-1 for a barrier between parts)."""
    cfg = b.target
    ops: list = []        # (part index, op) in program order
    meta: list = []       # per part: buf(), overwrite set, slot map base
    for pi, part in enumerate(parts):
        if isinstance(part, (HostPart, StagePart)):
            ops.append((pi, part))
            meta.append(None)
            continue
        plan = part.trace.plan
        bufs = [b.alloc(part.prefix + pb.name, pb.shape, pb.dtype.name, pe=pb.pe, loc=pb.loc)
                for pb in plan.buffers]
        dropped, overwrite = _fresh_accumulators(part.trace.ops)
        dropped |= _copies_in_place(part)
        keep = [op for op in part.trace.ops if op.index not in dropped]
        meta.append((plan, bufs, overwrite, len({op.pe for op in keep}) or 1))
        ops.extend((pi, op) for op in keep)
    # loads of a resident tensor on its own PE into a tile nothing else writes: the tile is the
    # tensor's SRAM, read in place (no on-chip copy, which would queue on the DMA engine behind
    # other kernels' weight loads); the load stays as a join point for waits on it
    def ref(pi, box):
        return parts[pi].dram[box.tensor.name][box.slices]

    forwarded: dict[tuple[int, int], ResidentView] = {}
    for pi, part in enumerate(parts):
        if not isinstance(part, KernelPart):
            continue
        writers: dict[int, int] = {}
        for op in part.trace.ops:
            for t in op.writes():
                writers[t.storage.id] = writers.get(t.storage.id, 0) + 1
        for op in part.trace.ops:
            if not isinstance(op, ir.Load) or op.dst.base is not None or writers.get(op.dst.id) != 1:
                continue
            box = ref(pi, op.src)
            backing = box.tensor.backing
            if backing is None or backing.pe != op.pe:
                continue
            view = resident_view(box, op.src.kept, op.dst.shape, op.dst.dtype.name)
            if view is not None:
                forwarded[(pi, op.dst.id)] = view
    slot = {(pi, op.index): k for k, (pi, op) in enumerate(ops) if not isinstance(op, (HostPart, StagePart))}
    first_op: dict[int, int] = {}
    for k, (pi, _) in enumerate(ops):
        first_op.setdefault(pi, k)

    made: dict[tuple[int, int], Any] = {}   # (part, tile id) -> its buffer or view, made once

    def buf(pi, t):
        got = made.get((pi, t.id))
        if got is None:
            got = made[(pi, t.id)] = _buffer_of(pi, t)
        return got

    def _buffer_of(pi, t):
        plan, bufs = meta[pi][0], meta[pi][1]
        view = forwarded.get((pi, t.storage.id))
        if view is not None:   # a resident tensor read in place
            return view if t.base is None else view_of(view, t.index)
        if t.base is not None:   # a slice of a tile: a view of its buffer (hazards: the whole buffer)
            return view_of(bufs[plan.buffer_of[t.base.id].id], t.index)
        return bufs[plan.buffer_of[t.id].id]

    # ---- dependencies and costs, in program order ----------------------------------------------
    hz = HazardTracker()
    pe_of, engine_of, duration, deps, refs = [], [], [], [], []
    touches: list[tuple[int, ...]] = []   # per op, the SRAM buffers it uses (memory-aware order)
    fence: dict[tuple[int, int], int] = {}   # (part, pe) -> the latest wait on it
    for k, (pi, op) in enumerate(ops):
        if isinstance(op, StagePart):
            d = hz.dram_deps(k, op.src.full(), False) | hz.dram_deps(k, op.dst.full(), True)
            # prefetched while the part before runs, not at the program's start: its SRAM is taken
            # from then on, and the residency budget counted it from about there
            before = [q for q in range(pi - 1, -1, -1) if not isinstance(parts[q], StagePart)]
            if before and before[0] in first_op:
                d.add(first_op[before[0]])
            touches.append(())
            pe_of.append(op.dst.backing.pe)
            engine_of.append(DMA)
            duration.append(cfg.dma_startup_cycles + op.src.nbytes / cfg.dram_bytes_per_cycle)
            deps.append(sorted(d))
            refs.append(None)
            continue
        if isinstance(op, HostPart):
            d: set = set()
            for r in op.src:
                d |= hz.dram_deps(k, r, False)
            for r in op.dst:
                d |= hz.dram_deps(k, r, True)
            host_bytes = sum(r.size * dtypes.itemsize(r.tensor.dtype) for r in op.src + op.dst)
            touches.append(())
            pe_of.append(0)
            engine_of.append(DMA)
            duration.append(cfg.dma_startup_cycles + host_bytes / cfg.host_bytes_per_cycle
                            + op.flops / cfg.host_flops_per_cycle)
            deps.append(sorted(d))
            refs.append(None)
            continue
        if isinstance(op, ir.Load) and (pi, op.dst.id) in forwarded:   # no command moves data
            box = ref(pi, op.src)
            d = hz.dram_deps(k, box, False)
            if (pi, op.pe) in fence:
                d.add(fence[(pi, op.pe)])
            touches.append(())
            pe_of.append(op.pe)
            engine_of.append(-1)
            duration.append(0.0)
            deps.append(sorted(d))
            refs.append(box)
            continue
        overwrite = meta[pi][2]
        reads = tuple(buf(pi, t) for t in op.reads() if not (op.index in overwrite and t is op.out))
        writes = tuple(buf(pi, t) for t in op.writes())
        d = hz.buffer_deps(k, reads, writes)
        for x in reads:   # a resident box read in place waits for the stores that wrote it
            if isinstance(x, ResidentView):
                d |= hz.dram_deps(k, x.ref, False)
        # the SRAM the op opens (a resident tensor's is the residency's, not the kernel's)
        touches.append(tuple({x.id for x in reads + writes if not isinstance(x, ResidentView)}))
        box = None
        if isinstance(op, (ir.Load, ir.Store, ir.Gather, ir.Scatter)):
            writes_dram = isinstance(op, (ir.Store, ir.Scatter))
            box = ref(pi, op.dst if writes_dram else op.src)   # a gather/scatter may touch all of its box
            d |= hz.dram_deps(k, box, writes_dram)
        if isinstance(op, ir.Wait):
            d.add(slot[(pi, op.target.index)])
        elif (pi, op.pe) in fence:
            d.add(fence[(pi, op.pe)])
        if isinstance(op, ir.Wait):
            fence[(pi, op.pe)] = k
        pe_of.append(op.pe)
        engine_of.append(_engine(op))
        duration.append(_estimate(op, cfg, box, cost.dma_rate(cfg, meta[pi][3])))
        deps.append(sorted(d))
        refs.append(box)

    if interleave == "trace":   # program order as traced: what each kernel's SRAM plan was checked in
        order = list(range(len(ops)))
    elif interleave:
        sizes = {x.id: -(-x.nbytes // cfg.sram_alignment_bytes) * cfg.sram_alignment_bytes
                 for m in meta if m is not None for x in m[1]}
        # the look-ahead per PE grows with a fused PE's width: it runs the ops of `fused_pes` PEs,
        # and must see as far into the next kernel (its weight loads, to prefetch them)
        order = list_schedule(pe_of, engine_of, duration, deps, cfg.num_pes, window=WINDOW * cfg.fused_pes,
                              touches=touches, buffer_bytes=sizes, sram_limit=sram_limit)
    else:  # each part scheduled on its own; a barrier between parts (below)
        order, lo = [], 0
        while lo < len(ops):
            hi = lo
            while hi < len(ops) and ops[hi][0] == ops[lo][0]:
                hi += 1
            local = list_schedule(pe_of[lo:hi], engine_of[lo:hi], duration[lo:hi],
                                  [[x - lo for x in ds if x >= lo] for ds in deps[lo:hi]], cfg.num_pes)
            order += [lo + i for i in local]
            lo = hi

    # ---- emission ----------------------------------------------------------------------------
    cmds: list = [None] * len(ops)
    previous = None
    for k in order:
        pi, op = ops[k]
        if interleave is not True and previous is not None and pi != previous:
            b.barrier()
        previous = pi
        if owner is not None:
            owner.extend([-1] * (len(b) - len(owner)))
            mark = len(b)
        if isinstance(op, HostPart):
            cmds[k] = b.host(op.op, op.fn, op.src, op.dst, flops=op.flops, loc=op.loc)
            if owner is not None:
                owner.append(pi)
            continue
        if isinstance(op, StagePart):
            after = [cmds[d] for d in deps[k] if cmds[d] is not None]
            cmds[k] = b.stage(op.dst, op.src, deps=after)
            if owner is not None:
                owner.append(pi)
            continue
        loc = op.loc
        explicit = [cmds[d] for d in deps[k] if not isinstance(ops[d][1], HostPart)
                    and isinstance(ops[d][1], ir.Wait)]
        overwrite = meta[pi][2]
        if isinstance(op, ir.Load) and (pi, op.dst.id) in forwarded:
            cmd = b.sync(*[cmds[d] for d in deps[k] if cmds[d] is not None], *explicit, pe=op.pe, loc=loc)
        elif isinstance(op, ir.Load):
            cmd = b.load(buf(pi, op.dst), refs[k], deps=explicit, loc=loc)
        elif isinstance(op, ir.Store):
            cmd = b.store(refs[k], buf(pi, op.src), deps=explicit, loc=loc)
        elif isinstance(op, ir.Gather):
            cmd = b.gather(buf(pi, op.dst), refs[k], tuple(buf(pi, t) for t in op.idx),
                           axis=_dram_axis(op.src, op.axis), mode=op.mode, deps=explicit, loc=loc)
        elif isinstance(op, ir.Scatter):
            cmd = b.scatter(refs[k], tuple(buf(pi, t) for t in op.idx), buf(pi, op.src),
                            axis=_dram_axis(op.dst, op.axis), mode=op.mode, reduce=op.reduce, deps=explicit, loc=loc)
        elif isinstance(op, ir.Transpose):
            cmd = b.transpose(buf(pi, op.out), buf(pi, op.src), op.perm, deps=explicit, loc=loc)
        elif isinstance(op, ir.Contract):
            acc = op.accumulate and op.index not in overwrite
            cmd = b.contract(buf(pi, op.out), op.spec, buf(pi, op.a), buf(pi, op.b), accumulate=acc,
                             deps=explicit, loc=loc)
        elif isinstance(op, ir.Vector):
            args = [buf(pi, x) if isinstance(x, ir.Tile) else x for x in op.operands]
            cmd = b.vector(buf(pi, op.out), op.op, *args, axis=op.axis if op.axis is not None else -1,
                           keepdims=op.keepdims, deps=explicit, loc=loc)
        elif isinstance(op, ir.Fill):
            cmd = b.vector(buf(pi, op.out), "fill", op.value, deps=explicit, loc=loc)
        elif isinstance(op, ir.Broadcast):
            # the vector unit has no broadcast; 0 + x broadcasts x exactly into the larger shape
            out = buf(pi, op.out)
            b.vector(out, "fill", 0.0, deps=explicit, loc=loc)
            cmd = b.vector(out, "add", out, buf(pi, op.src), deps=explicit, loc=loc)
        else:  # Wait
            cmd = b.sync(cmds[slot[(pi, op.target.index)]], *explicit, pe=op.pe, loc=loc)
        cmds[k] = cmd
        if owner is not None:
            owner.extend([pi] * (len(b) - mark))
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
            fill = pending.pop(t.storage.id, None)
            if fill is not None and isinstance(op, ir.Contract) and op.accumulate and op.out is t \
                    and t.base is None and op.a.storage is not t and op.b.storage is not t:
                dropped.add(fill.index)
                overwrite.add(op.index)
        if isinstance(op, ir.Fill) and op.value == 0.0 and op.out.base is None:
            pending[op.out.id] = op
    return dropped, overwrite


def _copies_in_place(part: "KernelPart") -> set[int]:
    """The ops of the initial copies (`fl.output(init=)`) whose output the caller bound to its
    parameter's own bytes: the output already holds them, there is nothing to copy."""
    dropped: set[int] = set()
    for out, (param, ops) in part.trace.initial.items():
        a, b = part.dram[out], part.dram[param]
        if (a.storage, a.storage_offset, a.shape) == (b.storage, b.storage_offset, b.shape):
            dropped.update(ops)
    return dropped


def _box_of(op):
    return op.src if isinstance(op, ir.Gather) else op.dst


def _dram_axis(box, axis: int) -> int:
    """The tensor dim of a box's tile axis (dims indexed by an int are not in the tile)."""
    return [d for d, kept in enumerate(box.kept) if kept][axis]


def _engine(op: ir.Op) -> int:
    return {"dma": DMA, "tensor": TENSOR, "vector": VECTOR}.get(op.engine, -1)


def _estimate(op: ir.Op, cfg, box, dma_rate: float) -> float:
    """The op's cycles in the npu's cost model (DMA at a fair share of DRAM for the PEs in use)."""
    if box is not None and box.tensor.resident:
        return cost.onchip_copy_cycles(box, cfg)
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
