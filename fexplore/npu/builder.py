"""`ProgramBuilder`: write NPU command programs by hand (and the kernel language and scheduler emit
through the same door).

    b = ProgramBuilder("tiny")
    A = b.input("A", (64, 64), "f32"); C = b.output("C", (64, 64), "f32")
    a = b.alloc("a", (64, 64), "f32", pe=0)
    b.load(a, A)                         # destination first, like an assignment
    b.vector(a, "exp", a)
    b.store(C, a)
    prog = b.build()                     # allocates SRAM, infers dependencies, fixes costs
    res = prog.simulate({"A": x})

Each method returns the command, a handle usable in `deps=`. Data dependencies need not be given:
they are inferred from what each command reads and writes (see `hazards`). The PE of a command is
the PE of its buffers. A command records the caller's file:line unless `loc=` is given.
"""

from __future__ import annotations

import math
import re
import sys
from numbers import Number

from fexplore.errors import ConfigError, SourceLoc
from fexplore.npu import dtypes
from fexplore.npu.commands import (ENGINES, NO_ENGINE, SCATTER_REDUCES, Buffer, Command, Contract, DramRef, DramTensor,
                                   Gather, Host, Load, Stage, Scatter, Store, Sync, Transpose, Vector, _squeeze,
                                   storage_of)
from fexplore.npu.config import NPUConfig, get_target
from fexplore.npu.errors import ProgramError, SRAMOverflowError
from fexplore.npu.hazards import HazardTracker
from fexplore.npu.program import Program
from fexplore.npu.sram import allocate
from fexplore.npu.vector_ops import VECTOR_OPS, result_shape

_EINSUM = re.compile(r"^([a-zA-Z]+),([a-zA-Z]+)->([a-zA-Z]*)$")


class ProgramBuilder:
    def __init__(self, target: str | NPUConfig = "rngd", *, name: str = "program",
                 capture_locs: bool = True):
        self.target = get_target(target)
        self.name = name
        self.capture_locs = capture_locs
        # place buffers as in fresh SRAM whenever a PE empties (see sram.allocate): for programs of
        # kernels one after another, which then fragment no more than each kernel alone
        self.fresh_placement_when_empty = False
        self._commands: list[Command] = []
        self._buffers: list[Buffer] = []
        self._tensors: dict[str, DramTensor] = {}
        self._hazards = HazardTracker()
        self._queue_last: dict[int, int] = {}     # engine queue -> its last command
        self._fence = -1                           # the latest barrier
        self._fenced: set[int] = set()             # queues already ordered after it
        self._einsum_cache: dict[tuple, tuple[int, int, int, int]] = {}
        self._built = False

    # ---- memory -------------------------------------------------------------------------------
    def input(self, name: str, shape, dtype="f32") -> DramTensor:
        """A DRAM tensor the caller provides when simulating."""
        return self._dram(name, shape, dtype, "input")

    def output(self, name: str, shape, dtype="f32") -> DramTensor:
        """A DRAM tensor returned in `SimResult.outputs`."""
        return self._dram(name, shape, dtype, "output")

    def scratch(self, name: str, shape, dtype="f32") -> DramTensor:
        """A DRAM tensor for intermediates (spills, results between kernels)."""
        return self._dram(name, shape, dtype, "scratch")

    def view(self, name: str, base: DramTensor, shape, *, returned: bool = False, offset: int | None = None
             ) -> DramTensor:
        """`base`'s bytes seen with another row-major `shape` (a reshape that moves no data), or,
        with an element `offset`, a contiguous part of them: `shape`'s elements from that one on
        (a piece of a concatenation its producer writes in place). Declare views before the
        commands that use `base`: from then on, hazards on the storage compare element ranges,
        whichever view a command goes through. `returned`: the caller reads this view as a result
        (its bytes are then compulsory traffic, as an output's)."""
        self._check_open()
        loc = self._loc(None)
        shape = _shape(shape, name, loc)
        if not isinstance(base, DramTensor) or self._tensors.get(base.name) is not base:
            raise ProgramError(f"view {name!r}: {base!r} is not a DRAM tensor of this program", loc=loc)
        if offset is None and math.prod(shape) != math.prod(base.shape):
            raise ProgramError(f"view {name!r}: shape {shape} has {math.prod(shape)} elements, "
                               f"{base.name} has {math.prod(base.shape)}", loc=loc)
        if offset is not None and not 0 <= offset <= math.prod(base.shape) - math.prod(shape):
            raise ProgramError(f"view {name!r}: elements {offset}..{offset + math.prod(shape)} of "
                               f"{base.name} are not all among its {math.prod(base.shape)}", loc=loc)
        if any(c.kind in ("load", "store", "host") and _touches(c, base.storage) for c in self._commands):
            raise ProgramError(f"view {name!r} of {base.name} declared after commands that use it", loc=loc,
                               hint="declare every view before the first command")
        t = self._dram(name, shape, base.dtype, "view")
        t.storage = base.storage
        t.storage_shape = base.storage_shape
        t.storage_offset = base.storage_offset + (offset or 0)
        t.backing = base.backing
        t.aliased = True
        t.returned = returned
        self._tensors[base.storage].aliased = True
        base.aliased = True
        return t

    def resident(self, name: str, shape, dtype="f32", *, pe: int = 0) -> DramTensor:
        """A scratch tensor kept in `pe`'s SRAM: addressed by boxes like a DRAM tensor, it occupies
        SRAM from the first command that touches it to the last; loads and stores of it are
        on-chip copies (no DRAM traffic; `onchip_copy_startup_cycles` + bytes at the DMA rate)."""
        t = self._dram(name, shape, dtype, "scratch")
        t.backing = self.alloc(f"resident {name}", t.shape, t.dtype, pe=pe)
        return t

    def tensor(self, name: str) -> DramTensor:
        """The DRAM tensor declared as `name`."""
        return self._tensors[name]

    def alloc(self, name: str, shape, dtype="f32", *, pe: int = 0, loc: SourceLoc | None = None) -> Buffer:
        """An SRAM buffer on `pe`. It takes space only from its first use to its last."""
        self._check_open()
        loc = self._loc(loc)
        shape = _shape(shape, name, loc)
        dt = dtypes.dtype_name(dtype)
        if not (isinstance(pe, int) and 0 <= pe < self.target.num_pes):
            raise ProgramError(f"buffer {name!r}: PE {pe} does not exist on {self.target.name!r} "
                               f"({self.target.num_pes} PEs)", loc=loc)
        buf = Buffer(name, shape, dt, pe, len(self._buffers), loc)
        if buf.nbytes > self.target.sram_bytes_per_pe:
            raise SRAMOverflowError(
                f"buffer {name!r} ({buf.nbytes} bytes, {shape} {dt}) is larger than the whole SRAM of a "
                f"PE on {self.target.name!r} ({self.target.sram_bytes_per_pe} bytes)", loc=loc,
                hint="tile the data: load and process it in pieces that fit")
        self._buffers.append(buf)
        return buf

    # ---- commands -----------------------------------------------------------------------------
    def load(self, dst: Buffer, src: DramRef | DramTensor, *, deps=(), loc=None) -> Load:
        """DMA: DRAM box `src` (e.g. ``A[0:64, 128:256]``) into SRAM buffer `dst`."""
        loc = self._loc(loc)
        ref = self._ref(src, loc)
        self._check_buffer(dst, loc)
        self._check_transfer(dst, ref, loc)
        return self._add(Load(dst, ref, loc), deps, dram=((ref, False),))

    def stage(self, dst: DramTensor, src: DramTensor, *, deps=(), loc=None) -> Stage:
        """DMA: all of DRAM tensor `src` into resident tensor `dst` (``resident``, same shape and
        dtype): one DRAM read, after which loads of `dst` are on-chip copies (and wait for this)."""
        loc = self._loc(loc)
        if not isinstance(dst, DramTensor) or not dst.resident:
            raise ProgramError(f"stage: {getattr(dst, 'name', dst)!r} is not a resident tensor", loc=loc,
                               hint="declare the destination with ProgramBuilder.resident")
        if not isinstance(src, DramTensor) or src.resident or src.shape != dst.shape or src.dtype != dst.dtype:
            raise ProgramError(f"stage: {getattr(src, 'name', src)!r} must be a DRAM tensor of "
                               f"{dst.dtype}{list(dst.shape)}, as {dst.name!r} is", loc=loc)
        into, ref = self._ref(dst, loc), self._ref(src, loc)
        return self._add(Stage(into, ref, loc), deps, dram=((ref, False), (into, True)))

    def store(self, dst: DramRef | DramTensor, src: Buffer, *, deps=(), loc=None) -> Store:
        """DMA: SRAM buffer `src` into DRAM box `dst`."""
        loc = self._loc(loc)
        ref = self._ref(dst, loc)
        self._check_buffer(src, loc)
        self._check_transfer(src, ref, loc)
        return self._add(Store(ref, src, loc), deps, dram=((ref, True),))

    def gather(self, dst: Buffer, src: DramRef | DramTensor, index, *, axis: int = 0,
               mode: str = "rows", deps=(), loc=None) -> Gather:
        """DMA gather: ``dst = take(src, index, axis)`` (rows mode) or ``take_along_axis`` (elements
        mode), the index read from SRAM buffer `index` when the command runs. `axis` is a dim of
        `src`'s tensor. A tuple of index buffers picks along that many dims from `axis` on (rows mode).
        See `commands.Gather`."""
        loc = self._loc(loc)
        ref = self._ref(src, loc)
        index = tuple(index) if isinstance(index, (tuple, list)) else (index,)
        for buf in (dst, *index):
            self._check_buffer(buf, loc)
        self._check_indexed(ref, index, dst, axis, mode, "gather", loc)
        return self._add(Gather(dst, ref, index, axis, mode, loc), deps, dram=((ref, False),))

    def scatter(self, dst: DramRef | DramTensor, index, src: Buffer, *, axis: int = 0,
                mode: str = "rows", reduce: str | None = None, deps=(), loc=None) -> Scatter:
        """DMA scatter: the rows (or elements) of `src` into `dst` at `index` along `axis`; reduce
        "add", "max", "min" or "mul" combines each value with the destination's
        (`SCATTER_REDUCES`), None overwrites (of duplicate indices, the last one wins)."""
        loc = self._loc(loc)
        ref = self._ref(dst, loc)
        index = tuple(index) if isinstance(index, (tuple, list)) else (index,)
        for buf in (src, *index):
            self._check_buffer(buf, loc)
        if reduce is not None and reduce not in SCATTER_REDUCES:
            raise ProgramError(f"scatter: reduce must be None or one of {sorted(SCATTER_REDUCES)}, got {reduce!r}",
                               loc=loc)
        self._check_indexed(ref, index, src, axis, mode, "scatter", loc)
        return self._add(Scatter(ref, index, src, axis, mode, reduce, loc), deps, dram=((ref, True),))

    def transpose(self, out: Buffer, src: Buffer, perm, *, deps=(), loc=None) -> Transpose:
        """Transpose engine: ``out = src.transpose(perm)``, both buffers on one PE."""
        loc = self._loc(loc)
        for buf in (out, src):
            self._check_buffer(buf, loc)
        perm = tuple(int(p) for p in perm)
        if sorted(perm) != list(range(len(src.shape))):
            raise ProgramError(f"transpose: {list(perm)} is not a permutation of {src!r}'s axes", loc=loc)
        if out.pe != src.pe or out.dtype != src.dtype or out.shape != tuple(src.shape[p] for p in perm):
            raise ProgramError(f"transpose: {out!r} is not {src!r} permuted by {list(perm)} on its PE", loc=loc)
        return self._add(Transpose(out, src, perm, loc), deps)

    def contract(self, out: Buffer, spec: str, a: Buffer, b: Buffer, *, accumulate: bool = False,
                 deps=(), loc=None) -> Contract:
        """Tensor unit: ``out = einsum(spec, a, b)`` (or ``+=`` with accumulate), f32 accumulation."""
        loc = self._loc(loc)
        spec = spec.replace(" ", "")
        for buf in (out, a, b):
            self._check_buffer(buf, loc)
        if not (a.pe == b.pe == out.pe):
            raise ProgramError(f"contract {spec}: operands on different PEs ({a!r}, {b!r}, {out!r})",
                               loc=loc, hint="load the operands into buffers of the same PE")
        if a.dtype != b.dtype:
            raise ProgramError(f"contract {spec}: operand dtypes differ ({a.dtype} vs {b.dtype})", loc=loc,
                               hint="cast one operand on the vector unit first")
        try:
            self.target.tensor_rate(a.dtype)
        except ConfigError:
            raise ProgramError(f"contract {spec}: the tensor unit of {self.target.name!r} has no "
                               f"{a.dtype} mode", loc=loc) from None
        key = (spec, a.shape, b.shape, out.shape)
        sizes = self._einsum_cache.get(key)
        if sizes is None:  # parse and check each distinct (spec, shapes) once: loops repeat them
            sizes = self._einsum_cache[key] = _einsum_sizes(spec, a, b, out, loc)
        return self._add(Contract(spec, a, b, out, bool(accumulate), a.dtype, sizes, loc), deps)

    def vector(self, out: Buffer, op: str, *operands, axis=-1, keepdims: bool = True,
               deps=(), loc=None) -> Vector:
        """Vector unit: ``out = op(*operands)``; operands are buffers or Python scalars.
        Reductions (sum, max, min, mean) reduce `axis`, keeping the dim by default."""
        loc = self._loc(loc)
        opdef = VECTOR_OPS.get(op)
        if opdef is None:
            raise ProgramError(f"unknown vector op {op!r}", loc=loc,
                               hint=f"vector ops: {', '.join(sorted(VECTOR_OPS))}")
        if len(operands) != opdef.arity:
            raise ProgramError(f"vector op {op} takes {opdef.arity} operand(s), got {len(operands)}", loc=loc)
        self._check_buffer(out, loc)
        shapes = []
        for x in operands:
            if isinstance(x, Buffer):
                self._check_buffer(x, loc)
                if x.pe != out.pe:
                    raise ProgramError(f"vector {op}: operand {x!r} is not on PE {out.pe} like {out!r}",
                                       loc=loc)
                shapes.append(x.shape)
            elif isinstance(x, Number):
                shapes.append(())
            else:
                raise ProgramError(f"vector {op}: operand {x!r} is neither an SRAM buffer nor a number",
                                   loc=loc)
        if op == "fill" and shapes != [()]:
            raise ProgramError("vector fill takes one scalar operand: b.vector(buf, 'fill', 0.0)", loc=loc)
        try:
            shape = out.shape if op == "fill" else result_shape(opdef, shapes, axis, keepdims)
        except ValueError as e:
            raise ProgramError(f"vector {op}: operands {shapes} do not fit: {e}", loc=loc) from None
        if shape != out.shape:
            raise ProgramError(f"vector {op}: result shape {shape} does not match output {out!r}", loc=loc,
                               hint=f"allocate the output with shape {shape}")
        return self._add(Vector(opdef, operands, out, axis, keepdims, loc), deps)

    def host(self, op: str, fn, src, dst, *, flops: int = 0, deps=(), loc=None) -> Host:
        """An op the chip does not run: `fn(*src arrays) -> dst arrays` on the host, with its
        operands (DRAM boxes `src`) and results (`dst`) crossing the host link."""
        loc = self._loc(loc)
        src = tuple(self._ref(x, loc) for x in src)
        dst = tuple(self._ref(x, loc) for x in dst)
        return self._add(Host(op, fn, src, dst, flops, loc), deps,
                         dram=tuple((r, False) for r in src) + tuple((r, True) for r in dst))

    def sync(self, *deps: Command, pe: int = 0, loc=None) -> Sync:
        """A join point, done when all `deps` are; depend on it to wait for all of them at once."""
        loc = self._loc(loc)
        return self._add(Sync(pe, loc), deps)

    def barrier(self, loc=None) -> Sync:
        """Everything issued before finishes before anything issued after starts, on every PE."""
        loc = self._loc(loc)
        cmd = self._add(Sync(0, loc), list(self._queue_last.values()))
        self._fence, self._fenced = cmd.id, set()
        return cmd

    # ---- building -----------------------------------------------------------------------------
    def build(self) -> Program:
        """Fix SRAM addresses (raising SRAMOverflowError if the live buffers do not fit) and costs."""
        self._check_open()
        allocation = allocate(self._commands, self._buffers, self._hazards.final_accessors, self.target,
                              fresh_when_empty=self.fresh_placement_when_empty)
        for cid, extra in allocation.reuse_deps.items():
            c = self._commands[cid]
            c.deps = tuple(sorted(set(c.deps).union(extra) - {cid}))
        self._built = True
        return Program(self.name, self.target, self._commands, self._buffers, self._tensors, allocation)

    def __len__(self) -> int:
        return len(self._commands)

    # ---- internals ----------------------------------------------------------------------------
    def _add(self, cmd: Command, explicit, dram: tuple[tuple[DramRef, bool], ...] = ()) -> Command:
        """Append `cmd`, depending on `explicit` and on the hazards of its buffers and of the
        DRAM boxes in `dram` ((box, written) pairs)."""
        self._check_open()
        cid = cmd.id = len(self._commands)
        deps = self._hazards.buffer_deps(cid, cmd.reads, cmd.writes)
        for ref, write in dram + tuple((r, False) for r in cmd.resident_reads):
            deps |= self._hazards.dram_deps(cid, ref, write)
        deps.discard(cid)   # a command reading and writing one box (an in-place host op)
        for d in explicit:
            did = d.id if isinstance(d, Command) else d
            if not (isinstance(did, int) and 0 <= did < cid) or \
                    (isinstance(d, Command) and self._commands[did] is not d):
                raise ProgramError(f"dependency {d!r} is not an earlier command of this program", loc=cmd.loc)
            deps.add(did)
        if cmd.engine != NO_ENGINE:
            q = cmd.pe * len(ENGINES) + cmd.engine
            if self._fence >= 0 and q not in self._fenced:
                deps.add(self._fence)
                self._fenced.add(q)
            self._queue_last[q] = cid
        elif self._fence >= 0 and self._fence != cid:
            deps.add(self._fence)
        cmd.deps = tuple(sorted(deps))
        self._commands.append(cmd)
        return cmd

    def _loc(self, loc: SourceLoc | None, depth: int = 2) -> SourceLoc | None:
        if loc is not None or not self.capture_locs:
            return loc
        frame = sys._getframe(depth)  # the caller of the public method
        return SourceLoc(frame.f_code.co_filename, frame.f_lineno)

    def _check_open(self) -> None:
        if self._built:
            raise ProgramError("this ProgramBuilder has already built its program",
                               hint="start a new ProgramBuilder for another program")

    def _dram(self, name, shape, dtype, kind) -> DramTensor:
        self._check_open()
        loc = self._loc(None, depth=3)  # input/output/scratch -> _dram -> here
        if name in self._tensors:
            raise ProgramError(f"DRAM tensor {name!r} is declared twice", loc=loc)
        t = DramTensor(name, _shape(shape, name, loc), dtypes.dtype_name(dtype), kind)
        self._tensors[name] = t
        return t

    def _ref(self, x, loc) -> DramRef:
        if isinstance(x, DramTensor):
            x = x.full()
        if not isinstance(x, DramRef) or self._tensors.get(x.tensor.name) is not x.tensor:
            raise ProgramError(f"{x!r} is not a DRAM tensor (or box of one) of this program", loc=loc,
                               hint="declare it with builder.input/output/scratch and index it: A[0:64, :]")
        return x

    def _check_buffer(self, buf, loc) -> None:
        base = storage_of(buf) if isinstance(buf, Buffer) else buf
        if not isinstance(buf, Buffer) or base.id >= len(self._buffers) or self._buffers[base.id] is not base:
            raise ProgramError(f"{buf!r} is not an SRAM buffer of this program", loc=loc,
                               hint="allocate it with builder.alloc(name, shape, dtype, pe=...)")

    @staticmethod
    def _check_indexed(ref: DramRef, indices: tuple, buf: Buffer, axis: int, mode: str, what: str, loc) -> None:
        index = indices[0]
        for ix in indices:
            if ix.pe != buf.pe:
                raise ProgramError(f"{what}: index {ix!r} and data {buf!r} are on different PEs", loc=loc)
            if ix.dtype not in ("i32", "i64"):
                raise ProgramError(f"{what}: the index buffer {ix!r} must hold i32 or i64", loc=loc)
            if ix.shape != index.shape:
                raise ProgramError(f"{what}: index buffers {indices} differ in shape", loc=loc)
        if buf.dtype != ref.tensor.dtype:
            raise ProgramError(f"{what}: {ref} is {ref.tensor.dtype}, {buf!r} is not", loc=loc)
        k = len(indices)
        if not 0 <= axis <= len(ref.shape) - k or (k > 1 and mode != "rows"):
            raise ProgramError(f"{what}: {k} index buffer(s) from axis {axis} do not fit {ref} ({mode})", loc=loc)
        if mode == "rows":
            want = ref.shape[:axis] + index.shape + ref.shape[axis + k:]
            if _squeeze(buf.shape) != _squeeze(want):
                raise ProgramError(f"{what}: {buf!r} does not hold the rows of {ref} picked by {index!r}",
                                   loc=loc)
        elif mode == "elements":
            if index.shape != buf.shape or len(index.shape) != len(ref.shape) or any(
                    i > n for d, (i, n) in enumerate(zip(index.shape, ref.shape)) if d != axis):
                raise ProgramError(f"{what}: the index {index!r} and {buf!r} must have one shape, of {ref}'s "
                                   f"rank, no larger off the axis", loc=loc)
        else:
            raise ProgramError(f"{what}: mode must be 'rows' or 'elements', got {mode!r}", loc=loc)

    @staticmethod
    def _check_transfer(buf: Buffer, ref: DramRef, loc) -> None:
        if buf.dtype != ref.tensor.dtype:
            raise ProgramError(f"DMA between {ref} ({ref.tensor.dtype}) and {buf!r}: dtypes differ", loc=loc,
                               hint="DMA moves bytes; convert with a vector 'cast' into a buffer of the "
                                    "other dtype")
        if buf.shape != ref.shape and _squeeze(buf.shape) != _squeeze(ref.shape):
            raise ProgramError(f"DMA between {ref} (box {ref.shape}) and {buf!r}: shapes differ", loc=loc)


def _touches(c: Command, storage: str) -> bool:
    refs = (c.src + c.dst) if isinstance(c, Host) else (c.ref,)
    return any(r.tensor.storage == storage for r in refs)


def _shape(shape, name, loc) -> tuple[int, ...]:
    if isinstance(shape, int):
        shape = (shape,)
    try:
        shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise ProgramError(f"{name!r}: shape {shape!r} is not a tuple of ints", loc=loc) from None
    if any(d <= 0 for d in shape):
        raise ProgramError(f"{name!r}: shape {shape} has a non-positive dim", loc=loc)
    return shape


def _einsum_sizes(spec: str, a: Buffer, b: Buffer, out: Buffer, loc) -> tuple[int, int, int, int]:
    """Check `spec` against the buffers and return the (batch, m, n, k) extents."""
    m = _EINSUM.match(spec.replace(" ", ""))
    if not m:
        raise ProgramError(f"contract: spec {spec!r} is not of the form 'mk,kn->mn'", loc=loc)
    sa, sb, so = m.groups()
    extents: dict[str, int] = {}
    for letters, buf in ((sa, a), (sb, b)):
        if len(letters) != len(buf.shape):
            raise ProgramError(f"contract {spec}: '{letters}' has {len(letters)} indices but {buf!r} "
                               f"has {len(buf.shape)} dims", loc=loc)
        if len(set(letters)) != len(letters):
            raise ProgramError(f"contract {spec}: repeated index in '{letters}'", loc=loc)
        for ch, d in zip(letters, buf.shape):
            if extents.setdefault(ch, d) != d:
                raise ProgramError(f"contract {spec}: index '{ch}' is {extents[ch]} in one operand and {d} "
                                   f"in {buf!r}", loc=loc)
    if len(set(so)) != len(so) or not set(so) <= set(extents):
        raise ProgramError(f"contract {spec}: output indices must be distinct and appear in an operand",
                           loc=loc)
    expect = tuple(extents[ch] for ch in so)
    if expect != out.shape:
        raise ProgramError(f"contract {spec}: result shape {expect} does not match output {out!r}", loc=loc)
    return einsum_groups(extents, sa, sb, so)


def einsum_groups(extents: dict, sa: str, sb: str, so: str) -> tuple[int, int, int, int]:
    """(batch, m, n, k) of a contraction: indices in both operands and the result are batch, in
    one operand and the result m or n, summed ones k -- the extents tile quantization pads."""
    group = {"batch": 1, "m": 1, "n": 1, "k": 1}
    for ch, d in extents.items():
        in_a, in_b, in_o = ch in sa, ch in sb, ch in so
        key = "batch" if (in_a and in_b and in_o) else "m" if (in_a and in_o) else \
            "n" if (in_b and in_o) else "k"
        group[key] *= d
    return group["batch"], group["m"], group["n"], group["k"]

