"""The NPU command set, and the memory objects commands name.

Memory: a `DramTensor` is a named, row-major array in DRAM (an input, an output, or scratch); a
`DramRef` is a box of one (``A[0:64, 128:256]``). A `Buffer` is a named array in one PE's SRAM.

Commands, one engine each (per PE: DMA, tensor, vector):
  Load      DMA     DRAM box -> SRAM buffer
  Store     DMA     SRAM buffer -> DRAM box
  Contract  tensor  einsum of two SRAM buffers, f32 accumulation, into (or accumulating onto) a buffer
  Vector    vector  an op from `vector_ops.VECTOR_OPS` over buffers and scalars
  Gather    DMA     rows (or elements) of a DRAM box picked by an index buffer's values -> SRAM buffer
  Scatter   DMA     SRAM buffer -> rows (or elements) of a DRAM box at an index buffer's values
  Transpose vector  an SRAM buffer relaid out with a permutation of its axes (the transpose engine)
  Host      DMA     an op the chip cannot run: its operands go to the host over the host link, the
                    host computes it, the result comes back (a whole program's explicit host ops)
  Sync      none    a join point: done when its dependencies are; costs nothing

A *resident* tensor (``ProgramBuilder.resident``) is addressed like a DRAM tensor but lives in one
PE's SRAM (its `backing` buffer): DMAs to and from it are on-chip copies, with no DRAM traffic.
This is how a whole-model program keeps an intermediate on chip between its producer and
consumer kernels, whatever tiles each of them uses.

A DRAM tensor may be a *view* of another (`storage` names the tensor that owns the bytes): the
same row-major bytes seen with another shape, as a reshape that moves no data. Hazards and the
functional mode follow the storage, so a store through one view orders a load through another.

Every command names the SRAM buffers it reads and writes, the commands it depends on (ids), and
the source location (model op or kernel line) it came from. A command is also the handle the
builder returns, so it can be passed as a dependency.
"""

from __future__ import annotations

import math

from fexplore.errors import SourceLoc
from fexplore.npu import dtypes
from fexplore.npu.errors import ProgramError
from fexplore.npu.vector_ops import VectorOpDef

ENGINES = ("dma", "tensor", "vector")
DMA, TENSOR, VECTOR = 0, 1, 2
NO_ENGINE = -1  # Sync


# ---- memory -----------------------------------------------------------------------------------
class DramTensor:
    """A named row-major tensor in DRAM. Index it with slices to get a box for a DMA."""

    __slots__ = ("name", "shape", "dtype", "kind", "nbytes", "storage", "storage_shape", "storage_offset",
                 "aliased", "backing", "returned")

    def __init__(self, name: str, shape: tuple[int, ...], dtype: str, kind: str, storage: str | None = None):
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.kind = kind  # "input" | "output" | "scratch" | "view"
        self.nbytes = math.prod(shape) * dtypes.itemsize(dtype)
        self.storage = storage or name   # the tensor owning the bytes (itself unless a view)
        self.storage_shape = shape       # that tensor's shape (hazards compare boxes in it)
        self.storage_offset = 0          # the element of the storage a view starts at
        self.aliased = False             # seen through a view: hazards then track whole byte ranges
        self.backing = None              # a resident tensor's SRAM buffer (it never reaches DRAM)
        self.returned = kind == "output"  # the caller reads it as a result (an output, or a view of one)

    @property
    def resident(self) -> bool:
        return self.backing is not None

    def of_storage(self, array):
        """This tensor's elements in `array`, an array of its storage's elements in row-major order
        (any shape): a view, so a write to it writes the storage."""
        n = math.prod(self.shape)
        return array.reshape(-1)[self.storage_offset:self.storage_offset + n].reshape(self.shape)

    def __getitem__(self, index) -> "DramRef":
        return DramRef.from_index(self, index)

    def full(self) -> "DramRef":
        return DramRef(self, (0,) * len(self.shape), self.shape)

    def __repr__(self) -> str:
        return f"dram.{self.kind} {self.name}<{_shape_str(self.shape)} {self.dtype}>"


class DramRef:
    """A box of a DRAM tensor: per dim an offset and an extent (unit stride)."""

    __slots__ = ("tensor", "offsets", "shape")

    def __init__(self, tensor: DramTensor, offsets: tuple[int, ...], shape: tuple[int, ...]):
        self.tensor = tensor
        self.offsets = offsets
        self.shape = shape

    @classmethod
    def from_index(cls, tensor: DramTensor, index) -> "DramRef":
        if not isinstance(index, tuple):
            index = (index,)
        if len(index) > len(tensor.shape):
            raise IndexError(f"{tensor.name} has {len(tensor.shape)} dims, indexed with {len(index)}")
        offsets, shape = [], []
        for i, dim in enumerate(tensor.shape):
            ix = index[i] if i < len(index) else slice(None)
            if isinstance(ix, slice):
                start, stop, step = ix.indices(dim)
                if step != 1:
                    raise IndexError(f"{tensor.name}: DMA boxes have unit stride, got step {step}")
                if stop <= start:
                    raise IndexError(f"{tensor.name}: empty box {start}:{stop} in dim {i}")
                offsets.append(start)
                shape.append(stop - start)
            else:  # an int index keeps the dim with extent 1
                ix = int(ix)
                if not -dim <= ix < dim:
                    raise IndexError(f"{tensor.name}: index {ix} out of range for dim {i} of size {dim}")
                offsets.append(ix % dim)
                shape.append(1)
        return cls(tensor, tuple(offsets), tuple(shape))

    @property
    def slices(self) -> tuple[slice, ...]:
        return tuple(slice(o, o + n) for o, n in zip(self.offsets, self.shape))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def strides(self) -> tuple[int, ...]:
        """Byte strides of the box in DRAM (the tensor is row-major)."""
        out, acc = [], dtypes.itemsize(self.tensor.dtype)
        for d in reversed(self.tensor.shape):
            out.append(acc)
            acc *= d
        return tuple(reversed(out))

    def contiguous_run(self) -> int:
        """Elements per contiguous run: trailing dims merge while the box spans them fully."""
        run = 1
        for box, full in zip(reversed(self.shape), reversed(self.tensor.shape)):
            run *= box
            if box != full:
                break
        return run

    def flat_range(self) -> tuple[int, int]:
        """The element range [first, last + 1) of the box in its tensor's row-major order."""
        first = last = 0
        for o, n, d in zip(self.offsets, self.shape, self.tensor.shape):
            first, last = first * d + o, last * d + o + n - 1
        return first, last + 1

    def overlaps(self, other: "DramRef") -> bool:
        for o1, n1, o2, n2 in zip(self.offsets, self.shape, other.offsets, other.shape):
            if o1 + n1 <= o2 or o2 + n2 <= o1:
                return False
        return True

    def __str__(self) -> str:
        if self.shape == self.tensor.shape:
            return self.tensor.name
        return f"{self.tensor.name}[{', '.join(f'{o}:{o + n}' for o, n in zip(self.offsets, self.shape))}]"


class Buffer:
    """A named array in one PE's SRAM. Its lifetime (and so its address) is decided by the program:
    from the first command that touches it to the last."""

    __slots__ = ("name", "shape", "dtype", "pe", "nbytes", "id", "loc")

    def __init__(self, name, shape, dtype, pe, id, loc=None):
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.pe = pe
        self.nbytes = math.prod(shape) * dtypes.itemsize(dtype)
        self.id = id
        self.loc = loc

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __getitem__(self, index) -> "BufferView":
        """A box of the buffer, read or written in place (see `BufferView`)."""
        return view_of(self, index)

    def __repr__(self) -> str:
        return f"pe{self.pe}.{self.name}<{_shape_str(self.shape)} {self.dtype}>"


class BufferView(Buffer):
    """A box of an SRAM buffer (``buf[0:64, 128:256]``; an int index drops its dim; slices may step),
    read or written in place by a command: a contraction's operand or the part of an accumulator it
    adds into, a vector op's input or output, a DMA's source or destination. A command using one
    uses its whole buffer as far as dependencies and lifetimes go: `id` is the buffer's, and
    commands list the buffer itself in their reads and writes (conservative: two writes into
    disjoint parts of one buffer are ordered)."""

    __slots__ = ("base", "index")

    def __init__(self, base: Buffer, index: tuple):
        shape = tuple(len(range(*ix.indices(n))) for ix, n in zip(index, base.shape) if isinstance(ix, slice))
        super().__init__(f"{base.name}[{index_text(index)}]", shape, base.dtype, base.pe, base.id, base.loc)
        self.base = base
        self.index = index   # one int or slice (a step of 1 or more) per dim of the buffer


class ResidentView(BufferView):
    """A box of a resident tensor read in place: the view of its SRAM buffer (`base`, the tensor's
    `backing`) that holds the DRAM-style box `ref`. A command on the tensor's own PE reads the
    tensor through it instead of copying the box into a buffer of its own first. Its hazards are
    the box's (it waits for the stores that wrote it, and a later store waits for it), not the
    whole buffer's: the tensor is written box by box by DMAs, not by commands naming the buffer."""

    __slots__ = ("ref",)

    def __init__(self, base: Buffer, index: tuple, ref: "DramRef"):
        super().__init__(base, index)
        self.ref = ref


def resident_view(ref: "DramRef", kept, shape, dtype: str) -> ResidentView | None:
    """`ref` (a box of a resident tensor) as a view of the tensor's SRAM buffer, with the dims
    `kept` marks as its axes, if that view has `shape` and `dtype` (the tile a load of the box would
    make); None when it cannot stand for that tile (a box a reshaped view of the tensor cannot
    cut out of the buffer's own dims, another dtype)."""
    backing = ref.tensor.backing
    if backing is None or backing.dtype != dtype:
        return None
    index = _box_in(tuple(zip(ref.offsets, ref.shape, kept, ref.tensor.shape)), backing.shape)
    if index is None:
        return None
    view = ResidentView(backing, tuple(index), ref)
    return view if view.shape == tuple(shape) else None


def _box_in(box, dims) -> list | None:
    """The index into a row-major buffer of shape `dims` of `box`, per dim of a view of it
    (offset, size, kept, dim size): a view dim equal to a buffer dim is sliced as it is; one that
    merges several buffer dims is cut from the last of them, when its range lies within one row of
    that dim (the others are then ints); size-1 dims on either side are dropped or indexed 0. None
    when the box is no box of the buffer so made."""
    view = [b for b in box if b[3] != 1]
    index, i, j = [], 0, 0   # i: the view dim, j: the buffer dim
    while j < len(dims):
        if dims[j] == 1:
            index.append(0)
            j += 1
            continue
        if i >= len(view):
            return None
        o, n, k, d = view[i]
        merged, j2 = 1, j
        while j2 < len(dims) and merged < d:
            merged *= dims[j2]
            j2 += 1
        if merged != d:
            return None
        last = dims[j2 - 1]
        if o // last != (o + n - 1) // last:   # across rows of the buffer's last merged dim
            return None
        outer, at = [], o // last
        for dd in reversed(dims[j:j2 - 1]):
            at, r = divmod(at, dd)
            outer.insert(0, r)
        index += outer + [slice(o % last, o % last + n) if k else o % last]
        i, j = i + 1, j2
    return index if i == len(view) else None


def view_of(buf: Buffer, index) -> BufferView:
    """The box `index` (ints and slices with a step of 1 or more, as in numpy) of SRAM buffer `buf`;
    a view of a view is a view of its buffer. Raises ProgramError for an index outside the buffer."""
    index = index if isinstance(index, tuple) else (index,)
    if len(index) > len(buf.shape):
        raise ProgramError(f"{buf!r} has {len(buf.shape)} dims but is indexed with {len(index)}")
    index = index + (slice(None),) * (len(buf.shape) - len(index))
    own = []
    for ix, n in zip(index, buf.shape):
        if isinstance(ix, bool) or not isinstance(ix, (int, slice)):
            raise ProgramError(f"{buf!r} is indexed with {ix!r}: ints and slices only")
        if isinstance(ix, int):
            if not -n <= ix < n:
                raise ProgramError(f"index {ix} is outside a dim of {n} of {buf!r}")
            own.append(ix % n)
            continue
        start, stop, step = ix.indices(n)
        if step < 1 or stop <= start:
            raise ProgramError(f"{buf!r} is indexed with {ix!r}: non-empty slices with a positive step only")
        own.append(slice(start, start + (len(range(start, stop, step)) - 1) * step + 1, step))
    if isinstance(buf, ResidentView):   # a part of a resident box read in place: the box's hazards
        return ResidentView(buf.base, compose_index(buf.index, own), buf.ref)
    if isinstance(buf, BufferView):
        return BufferView(buf.base, compose_index(buf.index, own))
    return BufferView(buf, tuple(own))


def compose_index(outer, inner) -> tuple:
    """The index into a base of `inner` applied to the view `outer` of it: each int of `outer`
    stays (it dropped that dim); each slice of `outer` is narrowed by the next item of `inner`.
    Slices are (start, stop, step) with step >= 1 and stop one past the last element."""
    at, it = [], iter(inner)
    for ix in outer:
        if isinstance(ix, int):
            at.append(ix)
            continue
        sub = next(it)
        step = ix.step or 1
        if isinstance(sub, int):
            at.append(ix.start + sub * step)
        else:
            sub_step = sub.step or 1
            start, n = ix.start + sub.start * step, len(range(sub.start, sub.stop, sub_step))
            at.append(slice(start, start + (n - 1) * step * sub_step + 1, step * sub_step))
    return tuple(at)


def storage_of(buf: Buffer) -> Buffer:
    """The buffer a view is of (a buffer is its own)."""
    return buf.base if isinstance(buf, BufferView) else buf


def index_text(index) -> str:
    """``0:64, 3, 1:9:2``: a box of a buffer (or tile), per dim an int or a slice."""
    return ", ".join(str(ix) if isinstance(ix, int) else
                     f"{ix.start}:{ix.stop}" + (f":{ix.step}" if (ix.step or 1) != 1 else "") for ix in index)


def _shape_str(shape) -> str:
    return "x".join(map(str, shape)) if shape else "scalar"


def _squeeze(shape) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


# ---- commands ---------------------------------------------------------------------------------
class Command:
    __slots__ = ("id", "pe", "engine", "reads", "writes", "resident_reads", "deps", "loc")
    kind = "command"

    def _init(self, pe: int, engine: int, reads, writes, loc: SourceLoc | None):
        self.id = -1  # set by the builder: the index in the program
        self.pe = pe
        self.engine = engine
        self.reads = tuple(storage_of(b) for b in reads)   # views count as their whole buffer
        self.writes = tuple(storage_of(b) for b in writes)
        # the boxes of resident tensors it reads in place (`ResidentView`): DRAM-style hazards
        self.resident_reads = tuple(b.ref for b in reads if isinstance(b, ResidentView))
        self.deps: tuple[int, ...] = ()
        self.loc = loc

    @property
    def name(self) -> str:
        return self.kind

    def _args(self) -> str:
        return ""

    def __str__(self) -> str:
        engine = ENGINES[self.engine] if self.engine >= 0 else "-"
        deps = f"  after({', '.join(f'%{d}' for d in self.deps)})" if self.deps else ""
        loc = f"  # {self.loc}" if self.loc is not None else ""
        return f"%{self.id} = pe{self.pe}.{engine} {self._text()}{deps}{loc}"

    def _text(self) -> str:
        return f"{self.kind} {self._args()}".rstrip()

    def __repr__(self) -> str:
        return f"<%{self.id} {self.name} on pe{self.pe}>"


class _DMA(Command):
    """Shared by Load and Store: the DRAM box (`ref`), the SRAM buffer, and the payload. The bytes
    really moved depend on the chip's minimum transfer (`cost.dma_moved_bytes`)."""

    __slots__ = ()

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes

    @property
    def strides(self) -> tuple[int, ...]:
        return self.ref.strides


class Load(_DMA):
    __slots__ = ("src", "dst")
    kind = "load"

    def __init__(self, dst: Buffer, src: DramRef, loc=None):
        self._init(dst.pe, DMA, (), (dst,), loc)
        self.src, self.dst = src, dst

    @property
    def ref(self) -> DramRef:
        return self.src

    @property
    def buffer(self) -> Buffer:
        return self.dst

    @property
    def name(self) -> str:
        return f"load {self.src.tensor.name}"

    def _args(self) -> str:
        return f"{self.src} -> {self.dst.name}"


class Stage(Load):
    """DMA: a whole DRAM tensor into a resident tensor (`into`, same shape and dtype), i.e. into
    its SRAM buffer: the DRAM read happens once, and the loads of the resident tensor that follow
    are on-chip copies. How a schedule keeps an input or a weight that its kernels read many
    times on chip."""

    __slots__ = ("into",)
    kind = "stage"

    def __init__(self, into: DramRef, src: DramRef, loc=None):
        super().__init__(into.tensor.backing, src, loc)
        self.into = into

    @property
    def name(self) -> str:
        return f"stage {self.src.tensor.name}"

    def _args(self) -> str:
        return f"{self.src} -> {self.into}"


class Store(_DMA):
    __slots__ = ("src", "dst")
    kind = "store"

    def __init__(self, dst: DramRef, src: Buffer, loc=None):
        self._init(src.pe, DMA, (src,), (), loc)
        self.src, self.dst = src, dst

    @property
    def ref(self) -> DramRef:
        return self.dst

    @property
    def buffer(self) -> Buffer:
        return self.src

    @property
    def name(self) -> str:
        return f"store {self.dst.tensor.name}"

    def _args(self) -> str:
        return f"{self.src.name} -> {self.dst}"


class Contract(Command):
    """``out (+)= einsum(spec, a, b)`` on the tensor unit. Index letters group into batch (in a, b
    and out), m (a and out), n (b and out) and k (summed); `sizes` holds each group's extent, the
    unit the tile quantization pads."""

    __slots__ = ("spec", "a", "b", "out", "accumulate", "dtype", "sizes")
    kind = "contract"

    def __init__(self, spec, a, b, out, accumulate, dtype, sizes, loc=None):
        reads = (a, b, out) if accumulate else (a, b)
        self._init(out.pe, TENSOR, reads, (out,), loc)
        self.spec, self.a, self.b, self.out = spec, a, b, out
        self.accumulate, self.dtype, self.sizes = accumulate, dtype, sizes

    @property
    def macs(self) -> int:
        return math.prod(self.sizes)

    @property
    def name(self) -> str:
        return f"contract {self.spec}"

    def _args(self) -> str:
        op = "+=" if self.accumulate else "="
        return f"{self.out.name} {op} {self.spec}({self.a.name}, {self.b.name}) {self.dtype}"


class Vector(Command):
    __slots__ = ("op", "operands", "out", "axis", "keepdims", "elements")
    kind = "vector"

    def __init__(self, op: VectorOpDef, operands, out, axis, keepdims, loc=None):
        reads = [x for x in operands if isinstance(x, Buffer)]
        self._init(out.pe, VECTOR, dict.fromkeys(reads), (out,), loc)
        self.op, self.operands, self.out = op, tuple(operands), out
        self.axis, self.keepdims = axis, keepdims
        self.elements = max([out.size] + [x.size for x in reads])

    @property
    def name(self) -> str:
        return self.op.name

    def _args(self) -> str:
        args = ", ".join(x.name if isinstance(x, Buffer) else repr(x) for x in self.operands)
        red = f", axis={self.axis}" if self.op.kind == "reduction" else ""
        return f"{self.out.name} = {self.op.name}({args}{red})"

    def _text(self) -> str:
        return self._args()


class _Indexed(Command):
    """Shared by Gather and Scatter: a DMA whose DRAM addresses come from an index buffer's values.

    ``mode="rows"``: index value v picks the slab ``box[..., v, ...]`` along `axis` (a dim of the box's
    tensor), so the SRAM side has shape ``box[:axis] + index.shape + box[axis+1:]`` (np.take). With k
    index buffers of one shape (`index` is always a tuple), they pick along the k dims from `axis` on
    together, ``box[..., i0, i1, ...]`` (numpy's adjacent advanced indexing).
    ``mode="elements"``: the index has the box's rank and picks one element per position along
    `axis` (np.take_along_axis / torch.gather); the SRAM side has the index's shape.
    Index values in [-n, n) are valid (negative ones count from the end of the axis, n its extent in
    the box); anything else is an error when the command runs. The DRAM box is the whole region the
    command may touch, which is what hazards track (the rows themselves are known only at run time).
    """

    __slots__ = ()

    @property
    def rows(self) -> int:
        """Separate transfers: one per index value (rows mode) or per element (elements mode)."""
        return self.index[0].size if self.mode == "rows" else self.buffer.size

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes


class Gather(_Indexed):
    __slots__ = ("src", "index", "dst", "axis", "mode")
    kind = "gather"

    def __init__(self, dst: Buffer, src: DramRef, index: tuple[Buffer, ...], axis: int, mode: str = "rows",
                 loc=None):
        self._init(dst.pe, DMA, index, (dst,), loc)
        self.src, self.index, self.dst, self.axis, self.mode = src, index, dst, axis, mode

    @property
    def ref(self) -> DramRef:
        return self.src

    @property
    def buffer(self) -> Buffer:
        return self.dst

    @property
    def name(self) -> str:
        return f"gather {self.src.tensor.name}"

    def _args(self) -> str:
        el = ", elements" if self.mode == "elements" else ""
        return f"{self.src}[{_names(self.index)}, axis={self.axis}{el}] -> {self.dst.name}"


# A scatter's reductions: the DMA engine combines each value with what the destination holds (a
# read-modify-write, [ASSUMPTION] as a DMA engine's add, max, min and multiply on write do), and
# how a command's text shows each. None overwrites.
SCATTER_REDUCES = {"add": "+=", "max": "max=", "min": "min=", "mul": "*="}


class Scatter(_Indexed):
    __slots__ = ("dst", "index", "src", "axis", "mode", "reduce")
    kind = "scatter"

    def __init__(self, dst: DramRef, index: tuple[Buffer, ...], src: Buffer, axis: int, mode: str = "rows",
                 reduce: str | None = None, loc=None):
        self._init(src.pe, DMA, (*index, src), (), loc)
        self.dst, self.index, self.src, self.axis, self.mode, self.reduce = dst, index, src, axis, mode, reduce

    @property
    def ref(self) -> DramRef:
        return self.dst

    @property
    def buffer(self) -> Buffer:
        return self.src

    @property
    def name(self) -> str:
        return f"scatter {self.dst.tensor.name}"

    def _args(self) -> str:
        el = ", elements" if self.mode == "elements" else ""
        op = SCATTER_REDUCES.get(self.reduce, "<-")
        return f"{self.dst}[{_names(self.index)}, axis={self.axis}{el}] {op} {self.src.name}"


def _names(bufs) -> str:
    return ", ".join(b.name for b in bufs)


class Transpose(Command):
    """``out = src.transpose(perm)`` on the PE's transpose engine, modeled on the vector unit's
    queue (see `NPUConfig.transpose_elements_per_cycle`)."""

    __slots__ = ("src", "out", "perm", "elements")
    kind = "transpose"

    def __init__(self, out: Buffer, src: Buffer, perm: tuple[int, ...], loc=None):
        self._init(out.pe, VECTOR, (src,), (out,), loc)
        self.src, self.out, self.perm = src, out, tuple(perm)
        self.elements = src.size

    def _args(self) -> str:
        return f"{self.out.name} = transpose({self.src.name}, {list(self.perm)})"

    def _text(self) -> str:
        return self._args()


class Host(Command):
    """An op run on the host: reads DRAM boxes, writes DRAM boxes, computes with `fn` (numpy
    arrays in, arrays out) in functional mode. Timed on PE 0's DMA engine: the operands and results
    cross the host link (`host_bytes_per_cycle`) and the host computes at `host_flops_per_cycle`."""

    __slots__ = ("op", "fn", "src", "dst", "nbytes", "flops")
    kind = "host"

    def __init__(self, op: str, fn, src: tuple, dst: tuple, flops: int = 0, loc=None):
        self._init(0, DMA, (), (), loc)
        self.op, self.fn, self.src, self.dst, self.flops = op, fn, tuple(src), tuple(dst), int(flops)
        self.nbytes = sum(r.size * dtypes.itemsize(r.tensor.dtype) for r in self.src + self.dst)

    @property
    def name(self) -> str:
        return f"host {self.op}"

    def _args(self) -> str:
        return f"{', '.join(map(str, self.dst))} = {self.op}({', '.join(map(str, self.src))})"


class Sync(Command):
    __slots__ = ()
    kind = "sync"

    def __init__(self, pe: int, loc=None):
        self._init(pe, NO_ENGINE, (), (), loc)
