"""The SRAM plan: which SRAM buffer holds each tile, and the check that they fit the target.

Tiles are values; buffers are places. A kernel makes a new tile at every `load`/`contract`/vector op,
in every loop iteration, but a hand-written kernel would reuse a few buffers. The plan does that
reuse, by allocation site (the line that makes the tile, see `tracer.py`):

  - A new tile takes a buffer of its site (same PE, shape, dtype, space) whose tile is dead (never
    used again): one that this iteration of the enclosing loops already uses first, then the one
    freed longest ago; if there is none, a new buffer. So a loop that loads a tile per iteration
    reuses one buffer (serial: the next load waits for the last reader), and a loop-carried value
    (the running max of flash attention) gets two, automatically.
  - Declared pipelining: inside ``fl.range(..., stages=s)`` (or a parallel loop with stages), a tile
    never takes a buffer used by one of the previous s-1 iterations, so the DMA of the next tile
    overlaps the compute on this one (double buffering for s=2).
  - An elementwise vector op may write its result over an operand that dies there (in place).
  - A slice (``t[:, ks]``) is a view of its tile's buffer: it takes no buffer of its own, and its
    uses keep that buffer alive.

A buffer lives from its first tile's first use to its last tile's last use. If the buffers live at
some point on a PE exceed its SRAM, tracing fails with FK160 on the line that needed the space.
"""

from __future__ import annotations

from fexplore.lang import ir
from fexplore.lang.errors import SRAMOverflowError, describe_loc
from fexplore.lang.types import shape_text
from fexplore.lang.values import Tile


class PlanBuffer:
    __slots__ = ("id", "pe", "space", "shape", "dtype", "axes", "nbytes", "name", "loc", "site", "tiles",
                 "first", "last")

    def __init__(self, id: int, tile: Tile, align: int):
        self.id = id
        self.pe, self.space, self.shape, self.dtype = tile.pe, tile.space, tile.shape, tile.dtype
        self.axes = tile.axes
        self.nbytes = -(-tile.nbytes // align) * align
        self.name = tile.name
        self.loc = tile.loc
        self.site = tile.site
        self.tiles: list[Tile] = []
        self.first = self.last = -1

    def __repr__(self) -> str:
        return (f"<buffer {self.name} pe{self.pe} {self.space} {self.dtype}[{shape_text(self.shape, self.axes)}]: "
                f"{len(self.tiles)} tiles, ops {self.first}..{self.last}>")


class SramPlan:
    def __init__(self, trace: ir.KernelTrace, buffers: list[PlanBuffer], buffer_of: dict[int, PlanBuffer],
                 peak: list[int]):
        self.trace = trace
        self.target = trace.target
        self.buffers = buffers
        self.buffer_of = buffer_of        # tile id -> its buffer
        self.peak = peak                  # most bytes live at once, per PE (program order)

    @property
    def capacity(self) -> int:
        return self.target.sram_bytes_per_pe

    def rows(self) -> list[dict]:
        """One row per allocation site: buffers made by the same line, counted per PE."""
        groups: dict[tuple, dict] = {}
        for b in self.buffers:
            key = (b.site, b.space, b.shape, b.dtype)
            g = groups.get(key)
            if g is None:
                g = groups[key] = {"tile": b.name, "space": b.space,
                                   "type": f"{b.dtype}[{shape_text(b.shape, b.axes)}]",
                                   "bytes": b.nbytes, "per_pe": {}, "line": b.loc.line if b.loc else None,
                                   "source": (b.loc.source_line() or "") if b.loc else "", "tiles": 0}
            g["per_pe"][b.pe] = g["per_pe"].get(b.pe, 0) + 1
            g["tiles"] += len(b.tiles)
        out = []
        for g in groups.values():
            counts = set(g["per_pe"].values())
            g["buffers"] = (f"{max(counts)}" if len(counts) == 1 else f"{min(counts)}-{max(counts)}")
            g["pes"] = _ranges(sorted(g.pop("per_pe")))
            out.append(g)
        return out

    def format(self) -> str:
        lines = [f"SRAM plan on {self.target.name}: peak {_kib(max(self.peak, default=0))} of "
                 f"{_kib(self.capacity)} per PE ({len(self.buffers)} buffers)"]
        rows = self.rows()
        w = max([len(r["tile"]) for r in rows] + [4])
        tw = max([len(r["type"]) for r in rows] + [4])
        lines.append(f"  {'tile':<{w}}  space  {'type':<{tw}}  {'bytes':>9}  buffers  PEs     line")
        for r in rows:
            lines.append(f"  {r['tile']:<{w}}  {r['space']:<5}  {r['type']:<{tw}}  {_kib(r['bytes']):>9}  "
                         f"{r['buffers']:>7}  {r['pes']:<6}  {r['line'] or ''}")
        return "\n".join(lines)

    __str__ = format

    def __repr__(self) -> str:
        return f"<SramPlan {self.trace.name} on {self.target.name}: peak {max(self.peak, default=0):,} B/PE>"


def make_plan(trace: ir.KernelTrace) -> SramPlan:
    cfg = trace.target
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for op in trace.ops:
        for t in op.tiles():   # a slice keeps its base's buffer alive
            first.setdefault(t.storage.id, op.index)
            last[t.storage.id] = op.index
    born: dict[int, list[Tile]] = {}
    for t in trace.tiles:
        if t.base is None and t.id in first:  # a tile no op touches (an unused fl.empty) takes no space
            born.setdefault(first[t.id], []).append(t)

    pools: dict[tuple, list[PlanBuffer]] = {}
    buffers: list[PlanBuffer] = []
    buffer_of: dict[int, PlanBuffer] = {}
    align = cfg.sram_alignment_bytes
    for op in trace.ops:
        in_place = isinstance(op, (ir.Vector, ir.Broadcast))
        for t in born.get(op.index, ()):
            pool = pools.setdefault((t.pe, t.site, t.shape, t.dtype, t.space), [])
            # a buffer this iteration of the enclosing loops already holds before any other: a loop
            # nest then keeps the product of its stages, as a hand-written one would. Taking the one
            # freed longest ago among all would let an inner loop rotate through the buffers its
            # outer loop's previous iteration left (when items of this shape are not consecutive on
            # the PE, e.g. the edge bands of a convolution), and the next item would find them all
            # barred by its stages and take new ones, without bound
            best, best_key = None, None
            for b in pool:
                free_from = b.last + (0 if in_place and any(x is b.tiles[-1] for x in op.reads()) else 1)
                if free_from <= op.index and _stages_allow(b.tiles[-1], t):
                    key = (-_shared_iterations(b.tiles[-1], t), b.last)
                    if best is None or key < best_key:
                        best, best_key = b, key
            if best is None:
                best = PlanBuffer(len(buffers), t, align)
                best.first = op.index
                buffers.append(best)
                pool.append(best)
            best.tiles.append(t)
            best.last = last[t.id]
            buffer_of[t.id] = best
    peak = _check_capacity(trace, buffers)
    return SramPlan(trace, buffers, buffer_of, peak)


def _shared_iterations(prev: Tile, new: Tile) -> int:
    """How many of the enclosing pipelined loops, outermost first, run the same iteration for both."""
    n = 0
    for a, b in zip(prev.stamps, new.stamps):
        if a[0] != b[0] or a[1] != b[1] or a[2] != b[2]:
            break
        n += 1
    return n


def _stages_allow(prev: Tile, new: Tile) -> bool:
    """May `new` take the buffer `prev` is in? Not if, in some pipelined loop around both, `prev` was
    made in one of the `stages - 1` iterations before `new`'s."""
    for site, pe, it, stages in new.stamps:
        for psite, ppe, pit, _ in prev.stamps:
            if psite == site and ppe == pe and pit != it and it - pit < stages:
                return False
    return True


def _check_capacity(trace: ir.KernelTrace, buffers: list[PlanBuffer]) -> list[int]:
    cfg = trace.target
    starts: dict[int, list[PlanBuffer]] = {}
    ends: dict[int, list[PlanBuffer]] = {}
    for b in buffers:
        starts.setdefault(b.first, []).append(b)
        ends.setdefault(b.last, []).append(b)
    live = [0] * cfg.num_pes
    peak = [0] * cfg.num_pes
    alive: list[set[PlanBuffer]] = [set() for _ in range(cfg.num_pes)]
    for op in trace.ops:
        for b in starts.get(op.index, ()):
            live[b.pe] += b.nbytes
            alive[b.pe].add(b)
            if live[b.pe] > cfg.sram_bytes_per_pe:
                raise _overflow(trace, op, b, alive[b.pe], live[b.pe])
            peak[b.pe] = max(peak[b.pe], live[b.pe])
        for b in ends.get(op.index, ()):
            live[b.pe] -= b.nbytes
            alive[b.pe].discard(b)
    return peak


def _overflow(trace, op, buf: PlanBuffer, alive, live: int) -> SRAMOverflowError:
    cfg = trace.target
    listing = []
    for b in sorted(alive, key=lambda b: (-b.nbytes, b.id)):
        where = describe_loc(b.loc) or "?"
        listing.append(f"    {b.name:<12} {b.space:<4} {b.dtype}[{shape_text(b.shape)}] {_kib(b.nbytes):>10}"
                       f"   made at {where}")
    return SRAMOverflowError(
        f"the tiles live on PE {buf.pe} do not fit its SRAM on {cfg.name!r} when {buf.name!r} is made",
        expected=f"at most {cfg.sram_bytes_per_pe:,} bytes ({_kib(cfg.sram_bytes_per_pe)}) live per PE",
        given=f"{live:,} bytes ({_kib(live)}) in {len(alive)} buffers", loc=op.loc,
        detail="  live buffers, largest first:\n" + "\n".join(listing),
        hint="use smaller tiles, fewer pipeline stages, or let tiles die sooner (a buffer is held from "
             "its first tile's first use to its last tile's last use)")


def _kib(n: int) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.1f} KiB"
    return f"{n} B"


def _ranges(pes: list[int]) -> str:
    if not pes:
        return ""
    if pes == list(range(pes[0], pes[-1] + 1)) and len(pes) > 1:
        return f"{pes[0]}-{pes[-1]}"
    return ",".join(map(str, pes))
