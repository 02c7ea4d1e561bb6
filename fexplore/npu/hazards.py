"""Dependency inference: program order is the meaning, dependencies make it safe to run in parallel.

Every command reads and writes memory: SRAM buffers (whole buffers) and DRAM boxes. A command
depends on every earlier command it conflicts with: read-after-write, write-after-read and
write-after-write. Hand-written programs, the kernel language and the scheduler therefore never
have to spell out data dependencies; explicit `deps=` only add ordering (e.g. for a barrier).
Because every dependency points to an earlier command, program order is always a valid execution
order, and the simulator cannot deadlock.

DRAM conflicts are tracked per box: stores of disjoint tiles of one tensor from different PEs stay
independent, while a load of data a store produced waits for that store, whatever the tilings.
"""

from __future__ import annotations

import bisect
import math

from fexplore.npu.commands import Buffer, DramRef, DramTensor


class _Access:
    """Last writer and the readers since, of one buffer or one DRAM box."""

    __slots__ = ("writer", "readers")

    def __init__(self):
        self.writer = -1
        self.readers: list[int] = []

    def final(self) -> list[int]:
        """The commands whose completion ends all use of the data so far."""
        return ([self.writer] if self.writer >= 0 else []) + self.readers


class _TensorIndex:
    """The accessed boxes of one DRAM tensor, indexed along its first few axes longer than 1
    (`_index_axes`), one level per axis. A level keeps the intervals its boxes span along its axis,
    sorted by start, one list per length: the intervals of one length that overlap a box are one
    run of that list, found by bisection, and tiled access patterns have a few lengths. So an
    access is compared with the boxes near it only (a row of a [heads, S, S] score matrix with the
    rows of its own head, not with every row of every head), however long the program."""

    __slots__ = ("root", "axes", "written")

    def __init__(self):
        self.root: _Level | dict | None = None   # a dict of boxes when no axis is indexed
        self.axes: tuple[int, ...] = ()          # set by the first box: the same for every box
        self.written = False

    def overlapping(self, ref: DramRef) -> list[_Access]:
        found: list[_Access] = []
        if self.root is None:
            return found
        axes = self.axes
        stack = [(self.root, 0)]
        while stack:
            node, depth = stack.pop()
            if depth == len(axes):   # the boxes themselves
                found += [acc for box, acc in node.values() if box.overlaps(ref)]
                continue
            a = axes[depth]
            lo, hi = ref.offsets[a], ref.offsets[a] + ref.shape[a]
            for length, starts in node.starts.items():
                for start in starts[bisect.bisect_left(starts, lo - length + 1):bisect.bisect_left(starts, hi)]:
                    stack.append((node.children[(start, length)], depth + 1))
        return found

    def entry(self, ref: DramRef) -> _Access:
        if self.root is None:
            self.axes = _index_axes(ref)
            self.root = _Level() if self.axes else {}
        axes = self.axes
        node = self.root
        for depth, a in enumerate(axes):
            key = (ref.offsets[a], ref.shape[a])
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Level() if depth + 1 < len(axes) else {}
                bisect.insort(node.starts.setdefault(key[1], []), key[0])
            node = child
        box_key = (ref.offsets, ref.shape)
        found = node.get(box_key)
        if found is None:
            found = node[box_key] = (ref, _Access())
        return found[1]


class _Level:
    """One axis of a `_TensorIndex`: per interval length, the sorted starts of the intervals boxes
    span along the axis; per interval (start, length), the next axis's level or the boxes."""

    __slots__ = ("starts", "children")

    def __init__(self):
        self.starts: dict[int, list[int]] = {}
        self.children: dict[tuple[int, int], _Level | dict] = {}


class HazardTracker:
    def __init__(self):
        self._buffers: dict[int, _Access] = {}
        self._dram: dict[str, _TensorIndex] = {}

    # ---- SRAM --------------------------------------------------------------------------------
    def buffer_deps(self, cid: int, reads: tuple[Buffer, ...], writes: tuple[Buffer, ...]) -> set[int]:
        deps: set[int] = set()
        for buf in reads:
            acc = self._buffers.get(buf.id)
            if acc is not None and acc.writer >= 0:
                deps.add(acc.writer)
        for buf in writes:
            acc = self._buffers.get(buf.id)
            if acc is not None:
                deps.update(acc.final())
        for buf in reads:
            self._buffers.setdefault(buf.id, _Access()).readers.append(cid)
        for buf in writes:
            acc = self._buffers.setdefault(buf.id, _Access())
            acc.writer, acc.readers = cid, []
        deps.discard(cid)
        return deps

    def final_accessors(self, buf: Buffer) -> list[int]:
        acc = self._buffers.get(buf.id)
        return acc.final() if acc is not None else []

    # ---- DRAM --------------------------------------------------------------------------------
    def dram_deps(self, cid: int, ref: DramRef, write: bool) -> set[int]:
        if ref.tensor.aliased:  # seen through views of other shapes: compare boxes of the storage
            ref = _in_storage(ref)
        index = self._dram.get(ref.tensor.storage)
        if index is None:
            index = self._dram[ref.tensor.storage] = _TensorIndex()
        deps: set[int] = set()
        if write:
            for acc in index.overlapping(ref):
                deps.update(acc.final())
            index.written = True
            acc = index.entry(ref)
            acc.writer, acc.readers = cid, []
        else:
            if index.written:  # a tensor nothing stored to has no writers to wait for
                for acc in index.overlapping(ref):
                    if acc.writer >= 0:
                        deps.add(acc.writer)
            index.entry(ref).readers.append(cid)
        return deps


def _in_storage(ref: DramRef) -> DramRef:
    """The box in its storage's coordinates, size-1 dims dropped, so that every view of one
    storage is compared in the same terms. Exact when the view only adds or drops size-1 dims (a
    model's [1, S, N] output written as [S, N] tiles: the tiles stay independent); otherwise the
    box of storage elements spanning the element range the ref covers (conservative: a conflict
    is never missed, and unrelated tiles of a reshaped view may wait on each other). A view that
    starts further in (a piece of a concatenation) is placed at its offset."""
    t = ref.tensor
    canon = tuple(d for d in t.storage_shape if d != 1)
    base = DramTensor(t.storage, canon, t.dtype, "view")
    kept = [(o, n) for o, n, d in zip(ref.offsets, ref.shape, t.shape) if d != 1]
    if tuple(d for d in t.shape if d != 1) == canon and not t.storage_offset:
        return DramRef(base, tuple(o for o, _ in kept), tuple(n for _, n in kept))
    lo, hi = (t.storage_offset + e for e in ref.flat_range())
    offsets, shape = _range_box(lo, hi, canon)
    return DramRef(base, offsets, shape)


def _range_box(lo: int, hi: int, shape: tuple[int, ...]) -> tuple[tuple, tuple]:
    """The smallest box of a row-major `shape` holding the elements [lo, hi)."""
    if not shape:
        return (), ()
    inner = math.prod(shape[1:])
    first, last = lo // inner, (hi - 1) // inner
    if first == last:   # within one index of dim 0: narrow the inner dims too
        offs, ext = _range_box(lo - first * inner, hi - first * inner, shape[1:])
        return (first, *offs), (1, *ext)
    return (first, *(0,) * (len(shape) - 1)), (last - first + 1, *shape[1:])


# how many axes a tensor's box index nests (a score matrix [B, H, S, S] is indexed by batch, head
# and row); the rest are compared box by box
INDEX_DEPTH = 3


def _index_axes(ref: DramRef) -> tuple[int, ...]:
    """The axes the box index nests by: the tensor's first INDEX_DEPTH axes longer than 1 (a
    [1, C, H, W] image's tiles all span batch 0..1: indexed by it, each access would be compared
    with every box of the tensor). All boxes of one index are of one tensor shape (or of the
    storage's, when aliased), so the axes are the same for all of them."""
    return tuple(i for i, d in enumerate(ref.tensor.shape) if d > 1)[:INDEX_DEPTH]
