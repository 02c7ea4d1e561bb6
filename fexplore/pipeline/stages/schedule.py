"""schedule: the lowered kernels of the whole model become one NPU program on the target.

Every graph value lives in DRAM under its own name: the model's inputs and weights are the
program's inputs, its outputs the program's outputs, everything else scratch. A kernel's
parameters are those tensors seen through free views (a kernel may merge leading axes); a free
view of the lower stage is a DRAM view, no command at all; a host op is an explicit `host`
command whose operands and results cross the host link.

The kernels are then emitted into one program (`fexplore.lang.lowering.emit`): dependencies are the
hazards on SRAM buffers and DRAM boxes, so a kernel waits only for the kernels whose outputs it
reads, and one list scheduler orders the ops of all kernels together. That is what makes a whole
program faster than its kernels one after another: the next kernel's weights stream in while
this one computes (prefetch), and independent kernels overlap. Within a kernel, its own tiling,
its split across PEs (``fl.parallel``) and its double buffering (``stages=2``) are the generator's
choices. If the interleaved program does not fit SRAM, the stage falls back to kernels in
sequence (each kernel's own plan fits) and records that decision with its reason.

Residency: an intermediate that fits in SRAM next to the others live at the same time stays on
chip between its producer and its consumers (`_pick_resident`; a resident tensor of the npu:
the kernels' DMAs to it are on-chip copies, whatever tiles each kernel uses, and no DRAM traffic;
a kernel on the tensor's own PE reads its boxes in place, with no copy at all: see
`lang.lowering.emit`).
When the kernels' own tiles then do not fit, the stage spills (schedules with every intermediate
in DRAM) and records that decision with its reason.

Concatenations in place: where a concatenation's pieces are contiguous runs of its result (it
joins along its first axis that is not 1: a stack of each layer's KV cache), each piece is made
by a kernel for this concatenation alone and not all of them stay in SRAM, the piece's kernel
stores into its run of the result (a DRAM view at an offset) and the concatenation is no command
at all (`_concats_in_place`): its copy of every piece, a read and a write of the whole result, is
gone.

Tile sizes: each generated kernel's tiling parameters are searched with the cost model
(`tiles.py`: candidates traced, timed alone on the simulator, the fastest kept; the slowest kernels
first, within a budget of traced commands per compile); the choices are in ``Schedule.tiles`` and
the stage's decisions.

The stage's result is a `Schedule`: the program, the map from graph values to DRAM tensors, and
the span of commands of each kernel, so a timeline event names its kernel, module and source
line. ``Schedule.run(inputs)`` runs the program on the simulator (functional mode) and returns the
graph's outputs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fexplore.ir import Graph, Node, evaluate_node

from ..stage import StageResult
from .lower import LoweringCheck


@dataclass
class ScheduledKernel:
    """One lowered node in the program; `commands` are the ids of its commands."""

    name: str
    kind: str           # the kernel's kind, "host" or "free view"
    how: str            # "generated", "user", "host", "free view"
    module: str
    loc: Any
    node: Any = None
    commands: list = field(default_factory=list)


@dataclass
class Schedule:
    target: Any
    program: Any
    tensor_of: dict          # graph value name -> DRAM tensor name
    inputs: list             # graph input value names, in order
    weights: dict            # DRAM tensor name -> numpy payload (the graph's constants)
    outputs: list            # graph output value names
    kernels: list = field(default_factory=list)   # ScheduledKernel, program order
    decisions: list = field(default_factory=list)  # (what, why): spills, serial fallback, residency
    residency: dict = field(default_factory=dict)  # intermediates kept in SRAM, their bytes
    tiles: list = field(default_factory=list)      # tiles.TileChoice per generated kernel
    tile_search_commands: int = 0                  # what the tile search traced (its budget's unit)

    def dram_inputs(self, arrays) -> dict:
        feed = {self.tensor_of[n]: np.asarray(a) for n, a in zip(self.inputs, arrays) if n in self.tensor_of}
        feed.update(self.weights)
        return feed

    def simulate(self, arrays=None):
        """Run on the simulated chip: functional (with `arrays`, the graph inputs in order) or
        timing only (None). Returns the npu SimResult."""
        from fexplore.npu import simulate

        if arrays is None:
            return simulate(self.program, None, functional=False)
        return simulate(self.program, self.dram_inputs(arrays), functional=True)

    def outputs_of(self, res) -> list[np.ndarray]:
        return [np.array(res.dram[self.tensor_of[n]]) for n in self.outputs]

    def kernel_of_command(self) -> list[int]:
        """For each command id, the index of its kernel in `kernels` (-1: a barrier)."""
        owner = [-1] * len(self.program.commands)
        for i, k in enumerate(self.kernels):
            for c in k.commands:
                owner[c] = i
        return owner


def _dtype(v) -> str:
    return v.type.dtype.value


def _shape(v) -> tuple[int, ...]:
    return tuple(int(d) for d in v.type.shape)


def schedule(graph: Graph, options, lowering=None) -> StageResult:
    """Build the whole-model program from the lower stage's `lowering`."""
    if lowering is None:
        from .lower import lower

        lowering = lower(graph, options).lowering
    why = not_schedulable(graph)
    if why == SYMBOLIC:
        from ..buckets import check_buckets, pad_values

        check_buckets(graph, options.buckets)   # a wrong bucket is the compile's error, not a call's
        pad_values(options.pad_value, len(graph.inputs))
    if why:
        return _no_schedule(graph, lowering, why)
    t0 = time.perf_counter()
    sched, spills = lowering.made or schedule_with_fallbacks(graph, lowering, lowering.chip or options.target)
    lowering.made = None   # taken: a stage run again builds its own
    sched.decisions[:0] = spills
    prog = sched.program
    timing = sched.simulate()
    stats = {"commands": len(prog.commands), "kernels": sum(k.how in ("generated", "user") for k in sched.kernels),
             "host_ops": sum(k.how == "host" for k in sched.kernels),
             "cycles": timing.cycles, "latency_us": timing.latency_s * 1e6,
             "flops": prog.flops, "dram_bytes": timing.dram_bytes, "compulsory_bytes": prog.compulsory_bytes(),
             "vs_bound": _vs_bound(timing), "limiter": timing.roofline.limiter,
             "interleaved": not any(w == "serial" for w, _ in sched.decisions),
             "resident_tensors": len(sched.residency.get("kept", [])),
             "resident_bytes": sched.residency.get("bytes", 0),
             "decisions": [f"{w}: {why}" for w, why in sched.decisions],
             "kernels_retiled": sum(t.changed for t in sched.tiles),
             "tile_search_commands": sched.tile_search_commands,
             "build_s": time.perf_counter() - t0}
    summary = (f"{stats['kernels']} kernels, {stats['host_ops']} host ops -> {stats['commands']} commands; "
               f"simulated {stats['latency_us']:.1f} us on {sched.target.name}, "
               f"{stats['vs_bound']:.2f}x its roofline bound ({stats['limiter']}), "
               f"DRAM {stats['dram_bytes'] / 1e6:.2f} MB")
    return StageResult(graph, stats, [], summary, lowering=lowering, schedule=sched)


SYMBOLIC = "symbolic shapes: scheduled per size on first call"

# The most operations a whole program may hold, counted before it is built: the sum over its
# generated kernels of what each one's trace at its default tiles records (a program holds 0.6 to
# 1.2 commands an operation: the zoo on rngd and tiny, Falcon-H1's Mamba layers on tiny). A
# command takes ~6 KB and ~1 ms to build and schedule, with the fallbacks (a 234k-command program
# on tiny: +1.5 GB, 214 s), so two million would take ~12 GB and most of an hour. Past it a compile
# stops before building rather than exhaust the machine's memory: Falcon-H1 at its default Mamba
# sizes (128 heads, chunks of 256) on tiny traces 2.8M operations, and its schedule grew past
# 13 GB. The largest programs of bench/npu_models.py hold under 80k commands.
MAX_PROGRAM_OPS = 2_000_000


# Who builds a program (`schedule_with_fallbacks`'s `building`): how a refusal names it, and where
# it leaves an exploration
_BUILDERS = {
    "schedule": ("stage 'schedule': ",
                 "; the exploration stays at 'lower', whose kernels can be read and run one by one"),
    "lower": ("stage 'lower' (pe_fusion='auto' builds the program of each chip arrangement): ",
              "; the exploration stays at the stage before"),
    "cost": ("costing a stage: ", ""),
}


def check_program_size(lowering, target, building: str = "schedule") -> None:
    """Raise CompileMemoryError (FX505) before building a program of more than `MAX_PROGRAM_OPS`
    operations, naming the kernels that make the most of them. `building`: what builds it, the
    schedule stage, the lower stage (under pe_fusion="auto" it times each chip arrangement's
    program) or "cost" (a stage's program costed, `chip.graph_cost`)."""
    kernels = [x for x in lowering.leaves if x.how == "generated"]
    total = sum(x.ops for x in kernels)
    if total <= MAX_PROGRAM_OPS:
        return
    from fexplore.npu.errors import CompileMemoryError

    biggest = sorted(kernels, key=lambda x: -x.ops)[:3]
    chip = getattr(target, "name", target)
    where, stays = _BUILDERS[building]
    raise CompileMemoryError(
        f"{where}the program for {chip!r} would hold {total:,} operations, over the limit of "
        f"{MAX_PROGRAM_OPS:,} (each takes kilobytes to build: it would exhaust the machine's memory); "
        "the most are in " + ", ".join(f"{x.name} ({x.ops:,}: {x.label}" + (f" of {x.module})" if x.module else ")")
                                        for x in biggest),
        loc=biggest[0].node.loc,
        hint=f"compile a smaller configuration (fewer layers, a shorter input, smaller inner sizes) or "
             f"for a chip with more SRAM per PE than {chip!r}, whose bigger tiles make fewer "
             f"operations{stays}")


def not_schedulable(graph: Graph) -> str | None:
    """Why `graph` gets no program of its own (it runs another way), or None."""
    if any(not isinstance(d, int) for v in graph.inputs for d in v.type.shape):
        return SYMBOLIC
    # an empty input nothing reads (the empty cache of a first prompt, whose positions the
    # attention computes from the lengths) costs nothing and is no reason to leave the chip
    read = {i.name for n in graph.nodes for i in n.inputs} | {o.name for o in graph.outputs}
    values = [v for v in graph.inputs if v.name in read] + list(graph.constants) + \
        [o for n in graph.nodes for o in n.outputs]
    if any(0 in tuple(v.type.shape) for v in values):
        return ("a tensor with no elements: nothing for the chip to move or compute; the "
                "interpreter runs the model")
    return None


def _vs_bound(res) -> float:
    """Simulated latency over the roofline bound (>= 1; 1 is the best the program could do)."""
    bound = res.roofline.bound_cycles
    return res.cycles / bound if bound else float("inf")


def _no_schedule(graph, lowering, why):
    return StageResult(graph, {"scheduled": False, "why": why}, [], why, lowering=lowering, schedule=None)


def schedule_with_fallbacks(graph: Graph, lowering, target, building: str = "schedule"):
    """(Schedule, spills): interleaved with residency in half a PE's SRAM, then less, then none;
    then kernels in sequence; then every op in trace order. Each step back is recorded (what,
    why); only an SRAM overflow makes the stage step back. A smaller share that fits is followed
    by one more build, halfway back up to the share above it, kept if it fits too: overflowing is
    a matter of fragmentation more than of totals, and halving the share gave up half the
    intermediates the program could keep.

    After half a PE's SRAM overflows, interleaving with no residency is tried next: when that
    overflows too, a smaller share would (the kernels' own buffers are what fragment SRAM), and
    the smaller shares are not built; a program of hundreds of thousands of commands (EfficientNet
    or a CHMv2 head on `tiny`) takes half a minute a build. When it fits, the shares between are
    tried from the largest down, as before, and the first that fits is kept.

    Re-read inputs and weights are then staged on chip in a second build, kept only if it is
    not slower (within STAGE_MAX_LOSS): staging saves DRAM traffic, but the copies take SRAM from
    the intermediates and DMA time of their own, and which wins depends on the model.

    Interleaving overflows although its order keeps the kernels' buffers under `SRAM_HEADROOMS[0]`
    of a PE's SRAM when the allocator, placing them in that order, finds the room but not in one
    piece. Before the kernels are serialized, the order is made again under the tighter headrooms
    (more room for the gaps); the first that fits is set against the serial schedule and the
    faster kept. (GPT on a 32 KiB chip: 62,972 cycles interleaved under 60%, 64,230 in sequence;
    the VLA model on 48 KiB, whose kernels overflowed in sequence too, ran in trace order, 160,583
    cycles, and interleaves under 60%, 131,897.)

    A program past `MAX_PROGRAM_OPS` is refused before any build (`check_program_size`; `building`
    names who asked for it)."""
    check_program_size(lowering, target, building)
    spills = []

    def attempt(interleave, share, headroom=None):
        try:
            return build_schedule(graph, lowering, target, interleave=interleave, resident=share,
                                  headroom=headroom)
        except Exception as e:  # noqa: BLE001 - only an SRAM overflow falls through
            if interleave == "trace" or "SRAM" not in type(e).__name__ + str(e):
                raise
            spills.append(_spill(interleave, share, e, headroom))
            return None

    first, *smaller = RESIDENT_SHARES
    sched = attempt(True, first)
    if sched is not None:
        return _staged(graph, lowering, target, sched, first), spills
    unshared = attempt(True, 0.0)
    if unshared is not None:
        above = first
        for share in smaller:
            sched = attempt(True, share)
            if sched is not None:
                # halfway back up to the share that overflowed: the shares halve, so the first that
                # fits can keep half the room the failing one had (the VLA model on tiny in bf16
                # overflows at 25% and fits at 12.5% and 18.75%: 98,048 -> 89,226 cycles)
                between = attempt(True, (share + above) / 2)
                if between is not None:
                    sched, share = between, (share + above) / 2
                return _staged(graph, lowering, target, sched, share), spills
            above = share
        return unshared, spills
    spills.append(("spill", "keeping intermediates in " + ", ".join(f"{s:.0%}" for s in smaller)
                   + " of a PE's SRAM not tried: interleaving the kernels with none overflows already"))
    tighter = None
    for headroom in SRAM_HEADROOMS[1:]:
        tighter = attempt(True, 0.0, headroom)
        if tighter is not None:
            break
    serial = attempt(False, 0.0)
    if tighter is None:
        return serial or attempt("trace", 0.0), spills
    fast = tighter.simulate().cycles
    slow = serial.simulate().cycles if serial is not None else None
    if slow is not None and slow < fast:
        spills.append(("serial", f"interleaving under {headroom:.0%} of a PE's SRAM fits, but takes "
                                 f"{fast:,} cycles where the kernels in sequence take {slow:,}"))
        return serial, spills
    # interleaved after all: the overflows that would have serialized it are spills of its order
    spills[:] = [("tighter order" if w in ("serial", "trace order") else w, why) for w, why in spills]
    spills.append(("tighter order", f"interleaving the kernels with their buffers under {headroom:.0%} "
                                    f"of a PE's SRAM fits: {fast:,} cycles"
                   + (f", where the kernels in sequence take {slow:,}" if slow is not None else "")))
    return tighter, spills


def _spill(interleave, share, e, headroom=None) -> tuple[str, str]:
    what = (f"keeping intermediates in {share:.0%} of a PE's SRAM" if share
            else "interleaving the kernels" + (f" under {headroom:.0%} of a PE's SRAM" if headroom else "")
            if interleave is True
            else "scheduling each kernel's ops")
    return ("spill" if share else "serial" if interleave is True else "trace order",
            f"{what} overflows SRAM ({str(e).splitlines()[0][:100]})")


def _staged(graph, lowering, target, sched, share):
    """`sched`, or the same schedule with its re-read inputs and weights staged on chip when that
    builds and is not slower (see schedule_with_fallbacks)."""
    reread = _reread(sched)
    if not reread:
        return sched
    try:
        staged = build_schedule(graph, lowering, target, interleave=True, resident=share, stage=reread)
    except Exception as e:  # noqa: BLE001 - staging overflows: the schedule without it
        if "SRAM" not in type(e).__name__ + str(e):
            raise
        sched.decisions.append(("no staging", f"staging {len(reread)} re-read inputs and weights "
                                f"overflows SRAM ({str(e).splitlines()[0][:100]})"))
        return sched
    plain, with_copies = sched.simulate(), staged.simulate()
    if with_copies.cycles <= plain.cycles * (1 + STAGE_MAX_LOSS):
        return staged
    sched.decisions.append(("no staging", f"staging {len(reread)} re-read inputs and weights "
                            f"would save {(plain.dram_bytes - with_copies.dram_bytes) / 1e6:,.1f} MB "
                            f"of DRAM traffic but take {with_copies.cycles:,} cycles instead of "
                            f"{plain.cycles:,}"))
    return sched


# An input or weight whose loads move more than this many times its size is worth staging on chip
# (a convolution's or pool's bands of rows re-read their windows' halo rows: a few tens of percent)
REREAD_FACTOR = 1.1
# ... and staging is worth a second build when the re-reads are this share of what the loads move
STAGE_MIN_SHARE = 0.01
# ... and the staged program is kept unless it is slower than this fraction (it saves DRAM traffic)
STAGE_MAX_LOSS = 0.02


def _reread(sched: Schedule) -> set[str]:
    """The graph inputs and constants (by value name) the program's loads move from DRAM more
    than REREAD_FACTOR times over: a convolution's image once per output tile, a weight once per
    band of rows, or an image read in boxes so small that the DMA's minimum transfer moves it
    many times over (a patch embedding's strided taps)."""
    from fexplore.npu.commands import Load, Stage
    from fexplore.npu.cost import dma_command_bytes

    prog = sched.program
    moved: dict[str, int] = {}
    for c in prog.commands:
        if isinstance(c, Load) and not isinstance(c, Stage) and not c.src.tensor.resident:
            moved[c.src.tensor.storage] = moved.get(c.src.tensor.storage, 0) + dma_command_bytes(c, prog.target)
    out, excess = set(), 0
    room = prog.target.sram_bytes_per_pe * RESIDENT_SHARES[0]
    for name in list(sched.inputs) + list(sched.weights):   # weights: by the constants' names
        if name not in sched.tensor_of:   # an empty input nothing reads
            continue
        t = prog.tensors[sched.tensor_of[name]]
        if t.nbytes <= room and moved.get(t.storage, 0) > REREAD_FACTOR * t.nbytes:
            out.add(name)
            excess += moved[t.storage] - t.nbytes
    # staging costs a second build of the whole program: only for a real share of its traffic
    return out if excess >= STAGE_MIN_SHARE * sum(moved.values()) else set()


def build_schedule(graph: Graph, lowering, target, *, interleave: bool = True,
                   resident: float | bool = True, search_tiles: bool = True,
                   stage: set | frozenset = frozenset(), headroom: float | None = None) -> Schedule:
    """The whole-model program. `resident`: the share of a PE's SRAM intermediates may stay in
    (True: the first of RESIDENT_SHARES; False or 0: every intermediate in DRAM).
    `search_tiles`: each generated kernel's tile sizes searched with the cost model (`tiles.py`);
    False keeps the generator's defaults. `stage`: graph inputs and constants (value names) to
    copy on chip once before their first reader, where they fit the resident share next to the
    intermediates (the kernels then read them by on-chip copies). `headroom`: the share of what
    residency leaves of a PE's SRAM the interleaved order keeps the kernels' buffers in (None: the
    first of SRAM_HEADROOMS)."""
    tiles: list = []
    from fexplore.lang.lowering import HostPart, StagePart, emit
    from fexplore.npu import ProgramBuilder, get_target

    cfg = get_target(target)
    b = ProgramBuilder(cfg, name="model", capture_locs=False)
    # the last resort, every op in trace order: each kernel's buffers placed as in the SRAM its
    # own plan was checked in, not around what earlier kernels left
    b.fresh_placement_when_empty = interleave == "trace"
    tensors: dict[str, Any] = {}   # DRAM tensor name -> DramTensor
    tensor_of: dict[str, str] = {}
    outputs = {v.name for v in graph.outputs}

    share = RESIDENT_SHARES[0] if resident is True else float(resident or 0.0)
    on_chip = _pick_resident(graph, lowering, cfg, share, stage) if share else {}
    units = _units(graph, lowering)
    in_place, pieces = _concats_in_place(graph, lowering, units, on_chip)
    for name in pieces:   # a piece is stored into its concatenation's result, in DRAM
        on_chip.pop(name, None)
    updated = _updates_in_place(graph, lowering, units, on_chip, pieces)
    kept: list[str] = []
    staged: dict[str, Any] = {}    # graph value name -> its resident copy (or a view of one)
    staged_base: dict[str, str] = {}   # graph value name -> the staged input or constant it reads

    def declare(v, kind):
        if kind == "scratch" and v.name in on_chip:
            t = b.resident(v.name, _shape(v), _dtype(v), pe=on_chip[v.name])
            kept.append(v.name)
        else:
            t = {"input": b.input, "output": b.output, "scratch": b.scratch}[kind](v.name, _shape(v), _dtype(v))
        tensors[t.name] = t
        tensor_of[v.name] = t.name
        return t

    def view(base_value, shape, name):
        base = staged.get(base_value.name) or tensors[tensor_of[base_value.name]]
        if tuple(shape) == base.shape:
            return base
        if name not in tensors:
            tensors[name] = b.view(name, base, shape)
        return tensors[name]

    for v in graph.inputs:
        if 0 not in tuple(v.type.shape):   # an empty input is one nothing reads (`not_schedulable`)
            declare(v, "input")
    weights = {}
    for c in graph.constants:
        t = declare(c, "input")
        weights[t.name] = np.asarray(c.payload)
    for v in list(graph.inputs) + list(graph.constants):
        if v.name in on_chip:
            staged[v.name] = b.resident(f"{v.name}@sram", _shape(v), _dtype(v), pe=on_chip[v.name])
            staged_base[v.name] = v.name
    calls = {id(node): _kernel_call(x, node) for x, node in units
             if x is not None and x.how in ("generated", "user") and x.kernel is not None and id(node) not in in_place}
    search = _plan_tiles(units, cfg, calls) if search_tiles else None
    # free views first: a view's tensor must exist before any command touches its storage
    for x, node in units:
        for o in node.outputs:
            if o.name in tensor_of:
                continue
            if x is not None and x.how == "free view":
                tensors[o.name] = b.view(o.name, tensors[tensor_of[node.inputs[0].name]], _shape(o),
                                         returned=o.name in outputs)
                tensor_of[o.name] = o.name
                if node.inputs[0].name in staged:   # a view of a staged tensor reads the copy too
                    staged[o.name] = b.view(f"{o.name}@sram", staged[node.inputs[0].name], _shape(o))
                    staged_base[o.name] = staged_base[node.inputs[0].name]
            elif o.name in updated:   # written into its table's bytes: that storage seen as this value
                tensors[o.name] = b.view(o.name, tensors[tensor_of[updated[o.name]]], _shape(o),
                                         returned=o.name in outputs)
                tensor_of[o.name] = o.name
            elif o.name in pieces:
                whole, offset = pieces[o.name]
                if whole.name not in tensor_of:
                    declare(whole, "output" if whole.name in outputs else "scratch")
                tensors[o.name] = b.view(o.name, tensors[tensor_of[whole.name]], _shape(o), offset=offset)
                tensor_of[o.name] = o.name
            else:
                declare(o, "output" if o.name in outputs else "scratch")
    parts, kernels = [], []
    copies = [n for n in staged if n in on_chip]   # the copies themselves (not views of them)
    to_stage = set(copies)
    for x, node in units:
        mod = node.loc.module if node.loc is not None and node.loc.module else ""
        for name in [staged_base.get(v.name, v.name) for v in node.inputs]:
            if name in to_stage and x is not None and x.how in ("generated", "user"):
                to_stage.discard(name)
                parts.append(StagePart(tensors[tensor_of[name]], staged[name]))
                kernels.append(None)
        if x is None or x.how == "free view":
            kernels.append(ScheduledKernel(node.name, "free view", "free view", mod, node.loc, node=node))
            parts.append(None)
            continue
        if id(node) in in_place:   # its pieces' kernels stored them where it would copy them to
            kernels.append(ScheduledKernel(x.name, x.kind, "in place", mod, node.loc, node=node))
            parts.append(None)
            continue
        if x.how in ("generated", "user") and x.kernel is not None:
            part = _kernel_part(x, calls[id(node)], view, b, cfg, search, tiles,
                                scratch_on_chip=int(cfg.sram_bytes_per_pe * share / 4))
            if part is not None:
                parts.append(part)
                kernels.append(ScheduledKernel(x.name, x.kind, x.how, mod, node.loc, node=node))
                continue
        src = tuple(tensors[tensor_of[v.name]].full() for v in node.inputs)
        dst = tuple(tensors[tensor_of[v.name]].full() for v in node.outputs)
        parts.append(HostPart(node.op.name, _host_fn(node), src, dst, _flops(node), node.loc))
        kernels.append(ScheduledKernel(getattr(x, "name", node.name), "host", "host", mod, node.loc, node=node))

    real = [p for p in parts if p is not None]
    owner: list[int] = []
    # the kernels' own buffers in what residency leaves of a PE's SRAM, with headroom for
    # fragmentation; the order keeps them there (an overflow is still caught, and falls back)
    prog = emit(b, real, interleave=interleave, owner=owner,
                sram_limit=cfg.sram_bytes_per_pe * (1 - share) * (headroom or SRAM_HEADROOMS[0]))
    emitted = [k for k, p in zip(kernels, parts) if p is not None]
    for i in range(len(emitted) - 2, -1, -1):   # a staging copy is its first reader's
        if emitted[i] is None:
            emitted[i] = emitted[i + 1]
    kernels = [k for k in kernels if k is not None]
    for cid, pi in enumerate(owner):
        if pi >= 0:
            emitted[pi].commands.append(cid)
    sched = Schedule(cfg, prog, tensor_of, [v.name for v in graph.inputs], weights,
                     [v.name for v in graph.outputs], kernels)
    sched.residency = {"kept": sorted(kept), "bytes": sum(tensors[n].nbytes for n in kept),
                       "staged": sorted(copies), "staged_bytes": sum(staged[n].nbytes for n in copies)}
    sched.tiles = tiles
    sched.tile_search_commands = search.spent if search is not None else 0
    changed = [t for t in tiles if t.changed]
    if changed:
        saved = sum(t.default_cycles - t.cycles for t in changed)
        sched.decisions.append(("tiles", f"{len(changed)} of {len(tiles)} kernels retiled by the cost model "
                                f"({saved:,} cycles saved, kernels timed alone): "
                                + "; ".join(str(t) for t in changed[:4]) + (" ..." if len(changed) > 4 else "")))
    if search is not None and search.exhausted:
        kept_default = [c for c in search.exhausted if c.skipped]
        sched.decisions.append(("tile budget", f"the tile search traced its budget of {search.budget:,} "
                                f"commands: {len(kept_default)} kernels kept their default tiles and "
                                f"{len(search.exhausted) - len(kept_default)} were searched in part "
                                "(the slowest kernels are searched first)"))
    if in_place:
        nbytes = sum(tensors[tensor_of[n.outputs[0].name]].nbytes for n in in_place.values())
        what = "1 concatenation is" if len(in_place) == 1 else f"{len(in_place)} concatenations are"
        sched.decisions.append(("in place", f"{what} written in place by the kernels that make their pieces "
                                f"({nbytes / 1e6:,.2f} MB not copied)"))
    if updated:
        nbytes = sum(tensors[tensor_of[n]].nbytes for n in updated)
        what = ("1 update writes into its table's own storage (nothing reads the old table after it)"
                if len(updated) == 1 else f"{len(updated)} updates write into their tables' own storage (nothing "
                "reads the old tables after them)")
        sched.decisions.append(("updated in place", f"{what}: {nbytes / 1e6:,.3g} MB not copied"))
    if copies:
        sched.decisions.append(("staged", f"{len(copies)} inputs and weights the kernels read many times are "
                                f"copied on chip once ({sched.residency['staged_bytes'] / 1e6:.2f} MB), "
                                "their re-reads are on-chip copies"))
    if kept:
        sched.decisions.append(("resident", f"{len(kept)} intermediates stay in SRAM between their "
                                f"producer and consumers ({sched.residency['bytes'] / 1e6:.2f} MB not "
                                "written to DRAM and read back)"))
    return sched


def _units(graph: Graph, lowering) -> list[tuple[Any, Node]]:
    """(lowered node or None, node) in program order; a split region's pieces stand in its place
    (they read and make the region's operands and results under their outer names, and pass the
    values between them through DRAM scratch tensors)."""
    by_node = {id(x.node): x for x in lowering.nodes}
    out = []
    for node in graph.nodes:
        x = by_node.get(id(node))
        if x is not None and x.how == "split":
            out += [(p, p.node) for p in x.pieces]
        else:
            out.append((x, node))
    return out


def _storage_of(lowering):
    """name -> the value whose tensor holds the named value's bytes: through free views (a
    reshape of a contiguous tensor) to the value they view, else the value itself."""
    views = {x.node.outputs[0].name: x.node.inputs[0].name for x in lowering.nodes if x.how == "free view"}

    def storage(name):
        while name in views:
            name = views[name]
        return name

    return storage


def _concats_in_place(graph: Graph, lowering, units, on_chip: dict) -> tuple[dict, dict]:
    """The concatenations whose pieces their producers can store straight into the result, as
    ({id(node): node}, {piece value name: (result value, element offset)}).

    A concatenation qualifies when every axis before the one it joins along is 1 (each piece is
    then one contiguous run of the result) and each piece, seen through free views, is made by a
    generated or user kernel, is no model output, is not a piece twice and has elements (a
    concatenation written in place is no kernel: it cannot be a piece of another).

    Residency: when `_pick_resident` keeps every piece in SRAM, the copy is left as it is: it
    reads them on chip and writes the result once, the DRAM bytes the pieces' kernels would
    write, and their stores would be on their way (a decode step's small caches, stored tile by
    tile, each store with its DMA start-up). When some piece is in DRAM, the copy reads it back:
    the pieces kept in SRAM then go to DRAM too, unless other kernels read them (they read them
    on chip, and the copy is what the result costs), and the whole concatenation is written in
    place. The piece named is the producer's own result (the one a free view chain starts
    from): that is the tensor the kernel stores to."""
    outputs = {v.name for v in graph.outputs}
    storage = _storage_of(lowering)
    made_by = {o.name: (x, node) for x, node in units for o in node.outputs}
    kernel_readers: dict[str, set] = {}   # storage value -> the nodes (not free views) reading it
    for x, node in units:
        if x is not None and x.how != "free view":
            for v in node.inputs:
                kernel_readers.setdefault(storage(v.name), set()).add(id(node))

    nodes, pieces = {}, {}
    for x, node in units:
        if x is None or x.how != "generated" or node.op.name != "concat" or node.outputs[0].name in on_chip:
            continue
        out = node.outputs[0]
        shape = _shape(out)
        axis = node.attrs["axis"] % len(shape)
        if any(d != 1 for d in shape[:axis]) or not shape[axis]:
            continue
        inner = int(np.prod(shape[axis + 1:]))
        plan, offset = {}, 0
        for v in node.inputs:
            root = storage(v.name)   # free views are reshapes: the root has v's elements
            px, pnode = made_by.get(root, (None, None))
            if px is None or px.how not in ("generated", "user") or px.kernel is None or 0 in _shape(v) or \
                    root in outputs or root in plan or root in pieces or id(pnode) in nodes or \
                    (root in on_chip and kernel_readers[root] - {id(node)}) or \
                    v.name in outputs or v.type.dtype != out.type.dtype:
                break
            plan[root] = (out, offset)
            offset += _shape(v)[axis] * inner
        else:
            if all(root in on_chip for root in plan):
                continue   # the copy reads SRAM and writes the result once, as its pieces would
            nodes[id(node)] = node
            pieces.update(plan)
    return nodes, pieces


def _updates_in_place(graph: Graph, lowering, units, on_chip: dict, pieces: dict) -> dict:
    """{output value name: the value whose bytes it takes}: the outputs of kernels that start as one
    of their inputs (`GeneratedKernel.initial`: a scatter's or a cache update's table) written into
    that input's own storage, so the kernel copies nothing (`lang.lowering.emit` drops its copy).

    An output takes its table's storage (the value a free-view chain of the table starts from)
    when the table's old value is dead once the kernel runs: every other kernel reading that
    storage comes before it in program order (the hazard rules then hold the update back until
    they have read), no model output is that storage or a view of it, and it is no constant (the
    model's weights are the caller's). A graph input qualifies: the program's inputs are its own
    copies (a decode step's cache, updated in place as serving runtimes do). The kernel must read
    the storage through the table alone, and neither value may be kept or staged in SRAM
    (`on_chip`) or be a piece of a concatenation written in place. Updates chain: the next update
    of an output written in place takes the same storage, and the readers of each value that
    storage holds count for it."""
    storage = _storage_of(lowering)
    taken: dict[str, str] = {}

    def home(name):   # the storage a value's bytes are in
        name = storage(name)
        while name in taken:
            name = storage(taken[name])
        return name

    constants = {c.name for c in graph.constants}
    readers: dict[str, list[int]] = {}   # storage -> the program positions of the kernels reading it
    for i, (x, node) in enumerate(units):
        if x is not None and x.how != "free view":
            for v in node.inputs:
                readers.setdefault(storage(v.name), []).append(i)
    for i, (x, node) in enumerate(units):
        gk = getattr(x, "kernel", None)
        if x is None or x.how != "generated" or not getattr(gk, "initial", ()):
            continue
        for r, t in gk.initial:
            out, table = node.outputs[r], node.inputs[t]
            where = home(table.name)
            dead = all(j <= i for j in readers.get(where, []))
            kept = where in on_chip or out.name in on_chip or where in pieces or out.name in pieces
            if not dead or kept or where in constants or any(home(v.name) == where for v in graph.outputs) or \
                    sum(home(v.name) == where for v in node.inputs) != 1 or \
                    tuple(out.type.shape) != tuple(table.type.shape) or out.type.dtype != table.type.dtype:
                continue
            taken[out.name] = where
            readers[where] = readers.get(where, []) + readers.pop(out.name, [])
    return taken


# The shares of a PE's SRAM intermediates may take, tried in order; the rest is left to the
# kernels' own tiles.
RESIDENT_SHARES = (0.5, 0.25, 0.125)
# the share of what residency leaves of a PE's SRAM an interleaved order keeps the kernels' buffers
# in: the rest is room for the gaps between them (the allocator places them after the order is
# made); the tighter ones are tried when the first overflows (`schedule_with_fallbacks`)
SRAM_HEADROOMS = (0.85, 0.6, 0.4)


def _pick_resident(graph: Graph, lowering, cfg, share: float, stage=frozenset()) -> dict[str, int]:
    """Intermediates to keep in SRAM, with their PE: walking the program in order, an
    intermediate stays on chip from its producer to its last consumer if it fits in the resident
    share of the least-loaded PE's SRAM, next to the others live at that point. Free views extend
    the life of the tensor they view. Inputs and constants in `stage` are placed the same way,
    from their first consumer (the copy is made while the kernel before it runs)."""
    storage = _storage_of(lowering)
    outputs = {storage(v.name) for v in graph.outputs}
    last: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last[storage(v.name)] = i
    budget = int(cfg.sram_bytes_per_pe * share)
    live: list[tuple[int, str, int, int]] = []   # (last use, name, pe, bytes)
    used = [0] * cfg.num_pes
    chosen: dict[str, int] = {}
    sources = {v.name: v for v in list(graph.inputs) + list(graph.constants)
               if v.name in stage and v.name not in outputs}

    def place(v):
        """On the least-loaded PE, if it fits there next to what is live."""
        nbytes = v.type.dtype.numpy.itemsize * int(np.prod(_shape(v)))
        pe = min(range(cfg.num_pes), key=lambda p: used[p])
        if used[pe] + nbytes <= budget:
            chosen[v.name] = pe
            used[pe] += nbytes
            live.append((last[v.name], v.name, pe, nbytes))

    for i, node in enumerate(graph.nodes):
        for entry in [e for e in live if e[0] < i]:
            live.remove(entry)
            used[entry[2]] -= entry[3]
        for v in [sources.pop(storage(u.name)) for u in node.inputs if storage(u.name) in sources]:
            place(v)
        if node.outputs and storage(node.outputs[0].name) != node.outputs[0].name:
            continue
        for v in node.outputs:
            if v.name not in outputs and v.name in last:
                place(v)
    return chosen


def _kernel_call(x, node):
    """(kernel, args, params, results) of a lowered node: the kernel to trace, the arguments it is
    traced on, and the graph values its parameters and results are."""
    zeros = [np.zeros(_shape(v), v.type.dtype.numpy) for v in node.inputs]
    gk = x.kernel
    if x.how == "generated":
        return (x.traced or gk.kernel(), gk.arguments(zeros), [node.inputs[p.index] for p in gk.params],
                [node.outputs[r.index] for r in gk.results])
    return gk.kernel, zeros, list(node.inputs), list(node.outputs)


def _search_key(x, args):
    """Kernels alike but for names and literals (each layer's cache update at its own row) share a
    tile search: tiles change how work is cut, never what is computed (test_tile_params)."""
    from fexplore.lang.codegen.source import canonical_source

    return (canonical_source(x.kernel.source, numbers=False), tuple((a.shape, str(a.dtype)) for a in args))


def _plan_tiles(units, cfg, calls):
    """The program's tile search (`tiles.TileSearch`), its generated kernels searched slowest first."""
    from .tiles import TileSearch

    search = TileSearch(cfg)
    found = []
    for x, node in units:
        if id(node) in calls and x.how == "generated":
            kernel, args, _, _ = calls[id(node)]
            found.append((x.name, kernel, args, _search_key(x, args)))
    search.plan(found)
    return search


def _kernel_part(x, call, view, b, cfg, search=None, tiles: list | None = None, scratch_on_chip: int = 0):
    """The KernelPart of a generated or user kernel (its `_kernel_call`), or None if it cannot be
    traced here. With a tile `search` (`tiles.TileSearch`), a generated kernel takes the tiles it
    chose, and its TileChoice is appended to `tiles`."""
    from fexplore.lang.lowering import KernelPart

    kernel, args, params, results = call
    if x.how != "generated" and not hasattr(kernel, "trace"):
        return None   # a plain callable: it runs on the host
    if x.how == "generated" and search is not None:
        trace, choice = search.trace(x.name, kernel, args, _search_key(x, args))
        tiles.append(choice)
    else:
        trace = kernel.trace(*args, target=cfg)
    dram = {}
    for t, v in list(zip(trace.params, params)) + list(zip(trace.outputs, results)):
        dram[t.name] = view(v, t.shape, f"{v.name}@{x.name}.{t.name}")
    for i, t in enumerate(trace.tensors):
        if t.name not in dram:   # the kernel's own scratch tensors (a pool's padded copy): on chip
            # when small, where its boxes (often a few bytes each) cost no DRAM transfer each
            nbytes = int(np.prod(t.shape)) * t.dtype.itemsize
            make = (lambda *a: b.resident(*a, pe=i % cfg.num_pes)) if nbytes <= scratch_on_chip else b.scratch
            dram[t.name] = make(f"{x.name}.{t.name}", t.shape, t.dtype.name)
    return KernelPart(trace, dram, prefix=f"{x.name}.")


def _host_fn(node):
    def run(*arrays):
        return evaluate_node(node, list(arrays), {})
    return run


def _flops(node) -> int:
    try:
        return int(node.op.cost(node).flops) if hasattr(node.op, "cost") else 0
    except Exception:  # noqa: BLE001 - a cost rule is an estimate; a host op without one costs its transfers
        return 0


# -- verification ------------------------------------------------------------------------------

@dataclass
class ScheduleCheck(LoweringCheck):
    """The whole program run on the simulator (functional mode) on the example inputs; the
    fields of the lower stage's check, ``max_abs`` being the simulated outputs against eager."""

    cycles: int = 0

    def summary(self) -> str:
        mark = "✓" if self.ok else "✗"
        return (f"{mark} simulated program ({self.kernels_run} kernels, {self.cycles:,} cycles); "
                f"outputs vs eager max abs err {self.max_abs:.2e}")


def check_schedule(graph: Graph, sched: Schedule | None, oracle) -> ScheduleCheck | None:
    """Run the program on the simulator on the oracle's example inputs and compare its outputs
    with eager. If they differ, compare every kernel's outputs in the simulated DRAM with the IR
    interpreter's values of the same graph, and name the first kernel that leaves them."""
    if sched is None:
        return None
    from fexplore.ir import bind_symbols
    from fexplore.npu.errors import HazardError

    from ..numeric import TOLERANCES, accept_tie_order, compare, compare_with_oracle, compute_dtype

    t0 = time.perf_counter()
    inputs, want = oracle.input_sets[0], oracle.expected[0]
    arrays = [np.asarray(x) for x in inputs]
    try:
        res = sched.simulate(arrays)
    except HazardError as e:   # the run broke program order: its numbers mean nothing
        return ScheduleCheck(False, 0, 0, float("inf"), "simulator hazard check",
                             f"simulator hazard check: {e.message}\n{e.detail or ''}".rstrip(),
                             time.perf_counter() - t0, cycles=0)
    got = accept_tie_order(graph, inputs, sched.outputs_of(res), want)
    max_abs, _, ok, d = compare_with_oracle(graph, oracle, 0, got)
    tol = TOLERANCES[compute_dtype(graph)]   # each kernel against the interpreter, in the graph's dtypes
    first = detail = None
    if not ok:
        detail = f"simulated outputs vs eager: {d}"
        bindings = bind_symbols(graph, arrays)
        env = {v.name: a for v, a in zip(graph.inputs, arrays)}
        env.update({c.name: c.payload for c in graph.constants})
        for k in sched.kernels:
            node = k.node
            outs = evaluate_node(node, [env[v.name] for v in node.inputs], bindings)
            for v, a in zip(node.outputs, outs):
                env[v.name] = np.asarray(a).astype(v.type.dtype.numpy, copy=False)
            sim = [np.asarray(res.dram[sched.tensor_of[v.name]]) for v in node.outputs]
            _, _, same, why = compare(sim, [env[v.name] for v in node.outputs], tol, 0.0)
            if not same:
                first = f"{k.how} {k.name} ({k.kind}, for {node.op.name} %{node.name})"
                detail = f"{first}: {why}"
                break
    n = sum(k.how in ("generated", "user") for k in sched.kernels)
    return ScheduleCheck(bool(ok), n, n, float(max_abs), first, detail, time.perf_counter() - t0,
                         cycles=res.cycles)
