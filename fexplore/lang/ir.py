"""The kernel IR: what tracing a kernel produces, and what every back end consumes.

A `KernelTrace` is a flat list of ops in program order (loops are unrolled at trace time, like a
jaxpr), over DRAM tensors and tiles. Ten ops, one per thing the chip does:

    load      DMA      DRAM box -> tile
    store     DMA      tile -> DRAM box
    gather    DMA      rows (or elements) of a DRAM box picked by an integer tile's values -> tile
    scatter   DMA      a tile's rows (or elements) -> a DRAM box at an integer tile's values
    transpose vector   a tile relaid out with a permutation of its axes (the transpose engine)
    contract  tensor   einsum of two SRAM tiles into (or accumulating onto) an ACC tile, f32
    vector    vector   an op of `fexplore.npu.vector_ops.VECTOR_OPS` over tiles and scalars
    fill      vector   every element of a tile set to a scalar (zeros, full)
    broadcast vector   a tile expanded to a larger shape
    wait      -        later ops on this PE start after an earlier DMA finishes

Every op records its PE and the author's source location; tiles record their allocation site, which
the SRAM plan (`plan.py`) uses to give tiles made by the same line the same buffers.
`str(trace)` is the IR text: one op per line, each with the kernel line it came from.
"""

from __future__ import annotations

from fexplore.errors import SourceLoc
from fexplore.lang.types import shape_text
from fexplore.npu.commands import SCATTER_REDUCES, index_text
from fexplore.lang.values import DramSlice, DramTensor, Tile


class Op:
    __slots__ = ("index", "pe", "loc")
    kind = "op"
    engine = None   # "dma" | "tensor" | "vector" | None

    def _base(self, pe: int, loc: SourceLoc | None):
        self.index = -1   # set when recorded
        self.pe = pe
        self.loc = loc

    def reads(self) -> tuple[Tile, ...]:
        return ()

    def writes(self) -> tuple[Tile, ...]:
        return ()

    def tiles(self) -> tuple[Tile, ...]:
        return tuple(dict.fromkeys(self.reads() + self.writes()))

    def text_body(self, name=lambda t: t.name) -> str:
        raise NotImplementedError


class Load(Op):
    __slots__ = ("dst", "src")
    kind, engine = "load", "dma"

    def __init__(self, dst: Tile, src: DramSlice, pe, loc):
        self._base(pe, loc)
        self.dst, self.src = dst, src

    def writes(self):
        return (self.dst,)

    def text_body(self, name=lambda t: t.name):
        return f"{name(self.dst)} = load {self.src}"


class Store(Op):
    __slots__ = ("dst", "src")
    kind, engine = "store", "dma"

    def __init__(self, dst: DramSlice, src: Tile, pe, loc):
        self._base(pe, loc)
        self.dst, self.src = dst, src

    def reads(self):
        return (self.src,)

    def text_body(self, name=lambda t: t.name):
        return f"store {self.dst} <- {name(self.src)}"


class Gather(Op):
    """`idx` is a tuple of index tiles (one, or several of one shape picking along consecutive axes
    from `axis`, an axis of the box's tile shape); `mode` "rows" or "elements"."""

    __slots__ = ("dst", "src", "idx", "axis", "mode")
    kind, engine = "gather", "dma"

    def __init__(self, dst: Tile, src: DramSlice, idx: tuple[Tile, ...], axis: int, mode: str, pe, loc):
        self._base(pe, loc)
        self.dst, self.src, self.idx, self.axis, self.mode = dst, src, idx, axis, mode

    def reads(self):
        return self.idx

    def writes(self):
        return (self.dst,)

    def text_body(self, name=lambda t: t.name):
        el = ", elements" if self.mode == "elements" else ""
        return f"{name(self.dst)} = gather {self.src}[{', '.join(map(name, self.idx))}, axis={self.axis}{el}]"


class Scatter(Op):
    __slots__ = ("dst", "idx", "src", "axis", "mode", "reduce")
    kind, engine = "scatter", "dma"

    def __init__(self, dst: DramSlice, idx: tuple[Tile, ...], src: Tile, axis: int, mode: str, reduce, pe, loc):
        self._base(pe, loc)
        self.dst, self.idx, self.src, self.axis, self.mode, self.reduce = dst, idx, src, axis, mode, reduce

    def reads(self):
        return (*self.idx, self.src)

    def text_body(self, name=lambda t: t.name):
        el = ", elements" if self.mode == "elements" else ""
        op = SCATTER_REDUCES.get(self.reduce, "<-")
        return f"scatter {self.dst}[{', '.join(map(name, self.idx))}, axis={self.axis}{el}] {op} {name(self.src)}"


class Transpose(Op):
    __slots__ = ("out", "src", "perm")
    kind, engine = "transpose", "vector"

    def __init__(self, out: Tile, src: Tile, perm: tuple[int, ...], pe, loc):
        self._base(pe, loc)
        self.out, self.src, self.perm = out, src, perm

    def reads(self):
        return (self.src,)

    def writes(self):
        return (self.out,)

    def text_body(self, name=lambda t: t.name):
        return f"{name(self.out)} = transpose {name(self.src)} {list(self.perm)}"


class Contract(Op):
    """`sizes` = (batch, m, n, k) extents, the unit the tensor unit's tile quantization pads."""

    __slots__ = ("out", "spec", "a", "b", "accumulate", "sizes")
    kind, engine = "contract", "tensor"

    def __init__(self, out: Tile, spec: str, a: Tile, b: Tile, accumulate: bool, sizes, pe, loc):
        self._base(pe, loc)
        self.out, self.spec, self.a, self.b = out, spec, a, b
        self.accumulate, self.sizes = accumulate, sizes

    def reads(self):
        return (self.a, self.b, self.out) if self.accumulate else (self.a, self.b)

    def writes(self):
        return (self.out,)

    @property
    def macs(self) -> int:
        b, m, n, k = self.sizes
        return b * m * n * k

    def text_body(self, name=lambda t: t.name):
        op = "+=" if self.accumulate else "="
        return f"{name(self.out)} {op} contract {self.spec} ({name(self.a)}, {name(self.b)})"


class Vector(Op):
    __slots__ = ("out", "op", "operands", "axis", "keepdims")
    kind, engine = "vector", "vector"

    def __init__(self, out: Tile, op: str, operands: tuple, axis, keepdims: bool, pe, loc):
        self._base(pe, loc)
        self.out, self.op, self.operands, self.axis, self.keepdims = out, op, operands, axis, keepdims

    def reads(self):
        return tuple(dict.fromkeys(x for x in self.operands if isinstance(x, Tile)))

    def writes(self):
        return (self.out,)

    def text_body(self, name=lambda t: t.name):
        args = ", ".join(name(x) if isinstance(x, Tile) else repr(x) for x in self.operands)
        red = ""
        if self.axis is not None:   # show the reduced axis by name when it has one
            src = self.operands[0]
            red = f", axis={src.axes[self.axis] or self.axis}" if isinstance(src, Tile) else f", axis={self.axis}"
        return f"{name(self.out)} = {self.op}({args}{red})"


class Fill(Op):
    __slots__ = ("out", "value")
    kind, engine = "fill", "vector"

    def __init__(self, out: Tile, value: float | int, pe, loc):
        self._base(pe, loc)
        self.out, self.value = out, value

    def writes(self):
        return (self.out,)

    def text_body(self, name=lambda t: t.name):
        return f"{name(self.out)} = fill {self.value!r}"


class Broadcast(Op):
    __slots__ = ("out", "src")
    kind, engine = "broadcast", "vector"

    def __init__(self, out: Tile, src: Tile, pe, loc):
        self._base(pe, loc)
        self.out, self.src = out, src

    def reads(self):
        return (self.src,)

    def writes(self):
        return (self.out,)

    def text_body(self, name=lambda t: t.name):
        return f"{name(self.out)} = broadcast {name(self.src)}"


class Wait(Op):
    __slots__ = ("target",)
    kind = "wait"

    def __init__(self, target: Op, pe, loc):
        self._base(pe, loc)
        self.target = target

    def text_body(self, name=lambda t: t.name):
        return f"wait %{self.target.index}"


class KernelTrace:
    """One kernel traced for concrete argument shapes on one target: the kernel IR."""

    def __init__(self, name: str, target, *, pipelining: bool = True):
        self.name = name
        self.target = target                  # an NPUConfig
        self.pipelining = pipelining          # False: every `stages=` is treated as 1 (serial)
        self.ops: list[Op] = []
        self.tiles: list[Tile] = []
        self.tensors: list[DramTensor] = []   # parameters, then outputs and scratch, in order made
        self.params: list[DramTensor] = []
        self.outputs: list[DramTensor] = []   # in the order the kernel returns them
        self.returns_tuple = False
        self.axes: dict[str, int] = {}        # axis name -> size, bound by the arguments
        self.static: dict = {}                # the non-tensor arguments
        self.plan = None                      # SramPlan, made when tracing ends
        # output name -> (the parameter it starts as, the ops of that copy): `fl.output(init=)`;
        # a caller that binds the two to one storage drops the copy (`lowering.emit`)
        self.initial: dict[str, tuple[str, list[int]]] = {}
        self._program = None

    # ---- back ends ----------------------------------------------------------------------------
    def program(self):
        """The NPU command program this trace lowers to (built once)."""
        if self._program is None:
            from fexplore.lang.lowering import lower

            self._program = lower(self)
        return self._program

    def simulate(self, inputs: dict | None = None, *, functional: bool | None = None):
        return self.program().simulate(inputs, functional=functional)

    def unpack(self, outputs: dict):
        """Outputs by name (a SimResult's) -> what the kernel returns (one array or a tuple)."""
        values = tuple(outputs[t.name] for t in self.outputs)
        return values if self.returns_tuple else values[0]

    # ---- figures ------------------------------------------------------------------------------
    @property
    def flops(self) -> int:
        return sum(2 * op.macs for op in self.ops if isinstance(op, Contract))

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for op in self.ops:
            out[op.kind] = out.get(op.kind, 0) + 1
        return out

    def cycles_by_line(self, result):
        """Busy cycles per kernel source line and engine, from a simulation of this trace: a pandas
        table with the line's text, sorted by total."""
        import linecache

        import pandas as pd  # lazy: headless runs never need pandas

        per: dict[tuple, dict[str, float]] = {}
        for e in result.timeline.events:
            key = (e.loc.file, e.loc.line) if e.loc is not None else (None, None)
            row = per.setdefault(key, {"dma": 0.0, "tensor": 0.0, "vector": 0.0})
            row[e.engine] += e.end - e.start
        rows = []
        for (file, line), cyc in per.items():
            src = linecache.getline(file, line).strip() if file else ""
            rows.append({"line": line, "source": src, **cyc, "total": sum(cyc.values())})
        df = pd.DataFrame(rows, columns=["line", "source", "dma", "tensor", "vector", "total"])
        cycles = ["dma", "tensor", "vector", "total"]
        df[cycles] = df[cycles].round().astype("int64")   # whole cycles (DMA shares are fractional)
        return df.sort_values(["total", "line"], ascending=[False, True]).reset_index(drop=True)

    # ---- text ---------------------------------------------------------------------------------
    def tile_names(self) -> dict[int, str]:
        """Display names: ``%acc.0``, ``%acc.1`` ... numbered per name in order of creation."""
        seen: dict[str, int] = {}
        names = {}
        for t in self.tiles:
            if t.base is not None:   # a slice is shown as its base indexed: %x.0[0:64, 128:256]
                continue
            k = seen.get(t.name, 0)
            seen[t.name] = k + 1
            names[t.id] = f"%{t.name}.{k}"
        return names

    def format(self, max_ops: int | None = None, *, with_source: bool = True) -> str:
        names = self.tile_names()
        show = lambda t: names[t.id] if t.base is None else f"{names[t.base.id]}[{index_text(t.index)}]"  # noqa: E731
        lines = [f"kernel {self.name} on {self.target.name}"
                 + ("" if self.pipelining else " (pipelining off)")]
        for t in self.tensors:
            role = {"input": "in ", "output": "out", "scratch": "tmp"}[t.kind]
            lines.append(f"  {role} {t.name}: {t.dtype}[{shape_text(t.shape, t.axes)}]")
        ops = self.ops if max_ops is None else self.ops[:max_ops]
        width = 0
        bodies = []
        for op in ops:
            body = f"pe{op.pe} {op.text_body(show)}"
            out = getattr(op, "out", None)
            out = getattr(op, "dst", None) if out is None else out
            if isinstance(out, Tile):
                body += f" : {out.space} {out.dtype}[{shape_text(out.shape, out.axes)}]"
            bodies.append(body)
            width = max(width, len(body))
        width = min(width, 88)
        for op, body in zip(ops, bodies):
            tail = ""
            if op.loc is not None and op.loc.line:
                tail = f"  # line {op.loc.line}"
                if with_source:
                    src = op.loc.source_line()
                    tail += f": {src}" if src else ""
            lines.append(f"  {body:<{width}}{tail}".rstrip())
        if max_ops is not None and len(self.ops) > max_ops:
            lines.append(f"  ... {len(self.ops) - max_ops:,} more ops")
        rets = ", ".join(t.name for t in self.outputs)
        lines.append(f"  return {rets}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        counts = ", ".join(f"{n} {k}" for k, n in self.counts().items())
        return f"<KernelTrace {self.name} on {self.target.name}: {len(self.ops)} ops ({counts})>"

    def _repr_html_(self) -> str:
        from fexplore.lang.view import trace_html

        return trace_html(self)
