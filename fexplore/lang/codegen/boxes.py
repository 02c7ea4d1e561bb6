"""Boxes of a kernel's views, and the loops that walk them a tile at a time.

The data-movement, reduction and pooling parts see each operand through a free DRAM view (a
row-major reshape: neighbouring axes merged) chosen so that the op acts on one or a few axes of the
view: ``x[:, 3:8]`` of (B, T, D) is the box ``[:, 3:8, :]`` of x viewed as (R, J, C) = (B, T, D), a
concat along axis 1 of (2, 3, 4, 5) tensors writes boxes of the output viewed as (2, J, 20). A box
too large for SRAM is walked in tiles: `tile_sizes` picks them, `Loops` writes the loop over them
and the index text of each box.
"""

from __future__ import annotations

import keyword
import math

from fexplore.lang.examples._tiling import big_tile

STAGES = 2


def around(shape, axis: int) -> tuple[int, int, int]:
    """(O, A, I): the axes before `axis` merged, `axis`, the axes after it merged."""
    shape = tuple(int(d) for d in shape)
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def tile_sizes(extents, cfg, live: int = 2, fixed=()) -> tuple[int, ...]:
    """Tile sizes for a box of `extents`, filled from the last axis: whole trailing axes first,
    then as many rows as fit. `live` tiles of 4-byte elements, double buffered, in half of one
    PE's SRAM; never more elements than a big tile (so a big box still spreads over the PEs).
    Axes in `fixed` are walked one index at a time (tile 1)."""
    budget = min(cfg.sram_bytes_per_pe // (2 * STAGES * 4 * live), big_tile(cfg) ** 2)
    sizes, room = [], max(1, budget)
    for i in reversed(range(len(extents))):
        t = 1 if i in fixed else max(1, min(int(extents[i]), room))
        sizes.append(t)
        room = max(1, room // t)
    return tuple(reversed(sizes))


class Loops:
    """The tile loop over a box of `extents` (axis labels `labels`): a ``fl.parallel`` over the
    axes whose tile is smaller than the axis (and always the first), each with a loop variable
    (``rs`` for axis ``R``) that is a slice."""

    def __init__(self, labels, extents, tiles, named=()):
        self.labels, self.extents, self.tiles = list(labels), [int(e) for e in extents], list(tiles)
        self.named = set(named)      # labels the kernel defines as variables (``R, C = 10, 7``)
        self.looped = [i for i, (e, t) in enumerate(zip(self.extents, self.tiles)) if t < e or i == 0]
        self.vars = {i: _var(self.labels[i]) for i in self.looped}

    def header(self, stages: bool = True) -> str:
        grid = ", ".join(f"fl.tiles({self._size(i)}, {self.tiles[i]})" for i in self.looped)
        names = ", ".join(self.vars[i] for i in self.looped)
        return f"for {names} in fl.parallel({grid}{', stages=stages' if stages else ''}):"

    def _size(self, i: int) -> str:
        return self.labels[i] if self.labels[i] in self.named else str(self.extents[i])

    def index(self, i: int, offset=0, whole: int | None = None) -> str:
        """The index text of axis `i` of the box, shifted by `offset`, in a tensor whose axis has
        `whole` elements (``:`` when the box spans it)."""
        e = self.extents[i]
        if i not in self.vars:
            if offset == 0 and whole == e:
                return ":"
            return f"{offset}:{_plus(offset, e)}"
        v = self.vars[i]
        if offset == 0:
            return v
        return f"{offset} + {v}.start:{offset} + {v}.stop"

    def extent(self, i: int) -> str:
        """A tile's extent along axis `i`: the loop variable (a slice counts as its length) or an int."""
        return self.vars.get(i, str(self.extents[i]))


def _var(label: str) -> str:
    v = label.lower() + "s"
    return v + "_" if keyword.iskeyword(v) else v


def _plus(a, b) -> str:
    if isinstance(a, int) and isinstance(b, int):
        return str(a + b)
    return f"{a} + {b}"


def spec(labels, sizes, named) -> list[str]:
    """Annotation axes: an axis name (``"R"``) where it is one of `named`, else its size."""
    return [f'"{a}"' if a in named else str(s) for a, s in zip(labels, sizes)]


def index_row(w, cfg, name: str, n: int, rank: int, axis: int, what: str) -> None:
    """Write the positions 0, 1, ..., n-1 along `axis` into a DRAM scratch `name` of `rank` axes
    (size 1 elsewhere), by doubling: ``[n:2n] = [0:n] + n``, log2(n) copies. The kernel language
    has no iota; positions come from DRAM like any other operand."""
    chunk = tile_sizes((n,), cfg)[0]

    def box(rng: str) -> str:
        return ", ".join(rng if i == axis else ":" for i in range(rank))

    shape = ", ".join(str(n) if i == axis else "1" for i in range(rank))
    w(f"{name} = fl.scratch(({shape}), fl.f32)   # {what}: 0, 1, ..., {n - 1}")
    w(f"fl.store({name}[{box('0:1')}], fl.zeros(({', '.join('1' for _ in range(rank))})))")
    w("n = 1")
    w(f"while n < {n}:                           # doubling: [n:2n] = [0:n] + n")
    with w.indent():
        w(f"for js in fl.range(fl.tiles(min(n, {n} - n), {chunk})):")
        with w.indent():
            w(f"fl.store({name}[{box('n + js.start:n + js.stop')}], fl.load({name}[{box('js')}]) + n)")
        w("n *= 2")
