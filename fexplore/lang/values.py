"""What a kernel holds while it is traced: DRAM tensors, boxes of them, tiles, DMA handles.

These are handles, not data: a `Tile` knows its shape, dtype, named axes, memory space and PE, and
(only when the numpy interpreter runs the kernel) its value, via ``tile.numpy()``. Arithmetic on
tiles goes to the vector unit through the same checked door as ``fl.add`` and friends.
"""

from __future__ import annotations

import math

from fexplore.lang.types import DRAM, DType, shape_text


class DramTensor:
    """A kernel parameter, output or scratch tensor in DRAM. Index it to get a box for a DMA:
    ``A[ms, ks]`` (slices, e.g. from ``fl.tiles``) or ``Q[h, qs, :]`` (an int drops the axis)."""

    __slots__ = ("trace", "name", "shape", "dtype", "axes", "kind", "loc")
    space = DRAM

    def __init__(self, trace, name: str, shape: tuple[int, ...], dtype: DType, axes, kind: str, loc=None):
        self.trace = trace
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.axes = tuple(axes)
        self.kind = kind  # "input" | "output" | "scratch"
        self.loc = loc

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def __getitem__(self, index) -> "DramSlice":
        from fexplore.lang import compute, semantics

        return semantics.dram_slice(self, index)

    def full(self) -> "DramSlice":
        return DramSlice(self, (0,) * self.ndim, self.shape, (True,) * self.ndim)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"{self.name}: dram {self.dtype}[{shape_text(self.shape, self.axes)}]"


class DramSlice:
    """A unit-stride box of a DRAM tensor. Dims indexed by an int have extent 1 and are dropped
    from the tile a load makes (`kept` marks the dims a tile keeps)."""

    __slots__ = ("tensor", "offsets", "sizes", "kept")
    space = DRAM

    def __init__(self, tensor: DramTensor, offsets, sizes, kept):
        self.tensor = tensor
        self.offsets = tuple(offsets)
        self.sizes = tuple(sizes)
        self.kept = tuple(kept)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(n for n, k in zip(self.sizes, self.kept) if k)

    @property
    def axes(self) -> tuple:
        return tuple(a for a, k in zip(self.tensor.axes, self.kept) if k)

    @property
    def dtype(self) -> DType:
        return self.tensor.dtype

    @property
    def slices(self) -> tuple[slice, ...]:
        return tuple(slice(o, o + n) for o, n in zip(self.offsets, self.sizes))

    def __str__(self) -> str:
        if self.sizes == self.tensor.shape:
            return self.tensor.name
        parts = [f"{o}:{o + n}" if k else str(o) for o, n, k in zip(self.offsets, self.sizes, self.kept)]
        return f"{self.tensor.name}[{', '.join(parts)}]"

    __repr__ = __str__


class Tile:
    """A tile in one PE's SRAM (space ``sram``) or in the tensor unit's accumulator (``acc``)."""

    __slots__ = ("trace", "id", "shape", "dtype", "axes", "space", "pe", "name", "loc", "site", "stamps",
                 "written", "origin", "base", "index")

    def __init__(self, trace, id: int, shape, dtype: DType, axes, space: str, pe: int, name: str,
                 loc, site, stamps, origin: str, base: "Tile | None" = None, index: tuple | None = None):
        self.trace = trace
        self.id = id
        self.shape = tuple(shape)
        self.dtype = dtype
        self.axes = tuple(axes)
        self.space = space
        self.pe = pe
        self.name = name        # from the author's assignment (`acc = ...`), for IR text and errors
        self.loc = loc
        self.site = site        # allocation site: tiles made by the same line share SRAM buffers
        self.stamps = stamps    # (loop key, iteration) of each enclosing pipelined loop
        self.written = False    # anything stored into it yet? (reads before that are FK150)
        self.origin = origin    # what made it, for error messages ("fl.empty at line 4")
        self.base = base        # a slice (``t[:, ks]``) is a view of this tile's buffer
        self.index = index      # ... at these indices of the base: an int or a slice per base dim

    @property
    def storage(self) -> "Tile":
        """The tile whose buffer holds this one's elements: its base for a slice, else itself."""
        return self if self.base is None else self.base

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    # ---- values (the interpreter only) --------------------------------------------------------
    def numpy(self):
        """The tile's current value, when the numpy interpreter runs the kernel (``k(a, b)``)."""
        from fexplore.lang import compute, semantics

        return semantics.tile_value(self)

    # ---- the vector unit, as methods and operators --------------------------------------------
    def astype(self, dtype) -> "Tile":
        from fexplore.lang import builtins

        return builtins.cast(self, dtype)

    def transpose(self, *perm) -> "Tile":
        """``t.transpose(1, 0)`` (or a tuple): the tile with its axes permuted, on the transpose engine."""
        from fexplore.lang import builtins

        return builtins.transpose(self, perm[0] if len(perm) == 1 and isinstance(perm[0], (tuple, list)) else perm)

    permute = transpose

    @property
    def T(self) -> "Tile":
        return self.transpose(tuple(reversed(range(self.ndim))))

    def sum(self, axis=-1, **kw) -> "Tile":
        return _vec("sum", self, axis=axis, **kw)

    def max(self, axis=-1, **kw) -> "Tile":
        return _vec("max", self, axis=axis, **kw)

    def min(self, axis=-1, **kw) -> "Tile":
        return _vec("min", self, axis=axis, **kw)

    def mean(self, axis=-1, **kw) -> "Tile":
        return _vec("mean", self, axis=axis, **kw)

    def __add__(self, o): return _vec("add", self, o)
    def __radd__(self, o): return _vec("add", o, self)
    def __sub__(self, o): return _vec("sub", self, o)
    def __rsub__(self, o): return _vec("sub", o, self)
    def __mul__(self, o): return _vec("mul", self, o)
    def __rmul__(self, o): return _vec("mul", o, self)
    def __truediv__(self, o): return _vec("div", self, o)
    def __rtruediv__(self, o): return _vec("div", o, self)
    def __pow__(self, o): return _vec("pow", self, o)
    def __neg__(self): return _vec("neg", self)
    def __abs__(self): return _vec("abs", self)
    def __lt__(self, o): return _vec("lt", self, o)
    def __le__(self, o): return _vec("le", self, o)
    def __gt__(self, o): return _vec("gt", self, o)
    def __ge__(self, o): return _vec("ge", self, o)
    def __eq__(self, o): return _vec("eq", self, o)
    def __ne__(self, o): return _vec("ne", self, o)

    __hash__ = object.__hash__

    # ---- what a traced value cannot do ---------------------------------------------------------
    def __bool__(self):
        from fexplore.lang import compute, semantics

        semantics.no_value(self, "used in an `if`, `while`, `and`/`or` or `bool()`")

    def __iter__(self):
        from fexplore.lang import compute, semantics

        semantics.no_value(self, "iterated over")

    def __float__(self):
        from fexplore.lang import compute, semantics

        semantics.no_value(self, "converted to a Python number")

    __int__ = __index__ = __float__

    def __getitem__(self, index) -> "Tile":
        """``t[:, ks]``: a box of the tile, in place (no copy, no DMA): an operand of a contraction,
        a vector op or a store, or a destination (``acc=``, ``out=``, ``into=``: e.g. a contraction
        accumulating into part of an accumulator). An int drops its axis; a slice may step
        (``t[:, ::2]``: SRAM is read with strides, DRAM boxes are not). It is a view, not a copy:
        it reads what its tile holds when it is used."""
        from fexplore.lang import semantics

        return semantics.sram_slice(self, index)

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 0

    def __repr__(self) -> str:
        return (f"<tile {self.name}: pe{self.pe} {self.space} {self.dtype}"
                f"[{shape_text(self.shape, self.axes)}]>")


class DMA:
    """The handle of a store (or load): ``fl.store(...).wait()`` makes everything issued after it
    on this PE start only once the transfer is done. Dependencies are inferred anyway, so waits
    never change results; they are ordering points (e.g. to serialize on purpose)."""

    __slots__ = ("trace", "op")

    def __init__(self, trace, op):
        self.trace = trace
        self.op = op

    def wait(self) -> None:
        from fexplore.lang import builtins

        builtins.wait(self)

    def __repr__(self) -> str:
        return f"<dma %{self.op.index}: {self.op.text_body()}>"


def _vec(op, *operands, **kw):
    from fexplore.lang import compute

    return compute.vector(op, operands, **kw)
