"""The SRAM allocator: gives every buffer an address in its PE's SRAM for its lifetime.

A buffer lives from the first command that touches it to the last (program order); there is no
explicit free. Walking the program in order, a buffer is placed when its first command comes and
released after its last. If it does not fit, `SRAMOverflowError` names the buffer, its size, the
capacity, and every buffer live at that point.

Reusing an address is a hazard on a real chip: the new buffer's first writer must not run before
the old buffer's last reader has finished. The allocator returns those reuse dependencies, and the
program adds them, so the simulated SRAM occupancy never exceeds the capacity. To keep such waits
rare it places a buffer in never-used space first, else where the previous occupant finished
longest ago, so a program that frees a tile and allocates the next still overlaps them when
SRAM has room.
"""

from __future__ import annotations

import bisect

from fexplore.npu.commands import NO_ENGINE, Buffer, Command
from fexplore.npu.config import NPUConfig
from fexplore.npu.errors import SRAMOverflowError


class Allocation:
    """Where each buffer lives: `offset[buffer id]`, its aligned `size`, lifetime `first`..`last`
    (command ids); per PE the `peak` bytes live at once and the `footprint` (highest address
    used); `reuse_deps[cmd id]` the commands that must finish before that command may overwrite
    the space."""

    __slots__ = ("offset", "size", "first", "last", "peak", "footprint", "reuse_deps")

    def __init__(self, num_buffers: int, num_pes: int):
        self.offset = [-1] * num_buffers
        self.size = [0] * num_buffers
        self.first = [-1] * num_buffers
        self.last = [-1] * num_buffers
        self.peak = [0] * num_pes        # most bytes live at once, in program order
        self.footprint = [0] * num_pes   # highest address used + 1
        self.reuse_deps: dict[int, list[int]] = {}


OLDEST_STARTS = 16   # freed ranges whose starts are tried as a new buffer's place, oldest first


class _PESpace:
    """Free segments of one PE's SRAM (sorted by offset), plus who last occupied each freed range.

    A long program frees thousands of ranges and `place` runs per buffer, so the freed ranges are
    kept sorted by start, in two lists: the short ones (the tiles), where the ranges overlapping a
    place are found by bisection looking back at most SHORT bytes, and the few long ones (tensors
    kept on chip), scanned whole."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.free = [(0, capacity)]          # (offset, size), sorted, coalesced
        self.live: dict[int, Buffer] = {}    # buffer id -> buffer
        self.live_bytes = 0
        self.short_limit = max(capacity // 64, 1)
        # freed ranges and who used them last: (start, end, final accessors, latest accessor)
        self.short: list[tuple[int, int, tuple[int, ...], int]] = []
        self.long: list[tuple[int, int, tuple[int, ...], int]] = []
        # freed ranges that still order a reuse but no longer steer placement (`forget_placement`)
        self.archive: list[tuple[int, int, tuple[int, ...], int]] = []
        # per free segment (offset, size): its freed ranges and, per buffer size, its best place
        # (`_best_in`). What decides them (the segment and the freed ranges overlapping it) changes
        # only when the segment does: an entry is dropped when its segment is split or merged, and
        # a range is vacated only into a segment its release just made (no entry yet)
        self._best: dict[tuple[int, int], _Segment] = {}

    def forget_placement(self) -> None:
        """The PE's SRAM is empty: place what comes next as in fresh SRAM (first fit), while the
        ranges freed so far still give the new buffers their reuse dependencies."""
        self.archive.extend(self.short + self.long)
        self.short, self.long = [], []
        self._best.clear()

    def vacate(self, start: int, end: int, accessors: tuple[int, ...]) -> None:
        rec = (start, end, accessors, max(accessors, default=-1))
        bisect.insort(self.short if end - start <= self.short_limit else self.long, rec)

    def _overlapping(self, start: int, end: int):
        """(list, index) of every freed range overlapping [start, end), archived ones included."""
        rs = self.short
        hi = bisect.bisect_left(rs, (end,))
        for i in range(bisect.bisect_left(rs, (start - self.short_limit,), 0, hi), hi):
            if rs[i][1] > start:
                yield rs, i
        for i, r in enumerate(self.long):
            if r[0] >= end:
                break
            if r[1] > start:
                yield self.long, i
        for i, r in enumerate(self.archive):   # unsorted, and only once a PE has emptied
            if r[0] < end and start < r[1]:
                yield self.archive, i

    def place(self, size: int) -> int:
        """An offset for `size` bytes, or -1. Among the places that fit, prefer space never used, then
        space whose last occupant finished longest ago (program order): reusing just-freed space
        would make the new buffer wait for the old one's last reader and serialize the program."""
        best = None
        for seg in self.free:
            if seg[1] < size:
                continue
            key = self._best_in(seg, size)
            if best is None or key < best:
                best = key
            if best[0] < 0:
                break   # never-used space: no later place (at a higher offset) beats it
        if best is None:
            return -1
        off = best[1]
        for i, (off0, n) in enumerate(self.free):
            if off0 <= off and off + size <= off0 + n:
                pieces = [(off0, off - off0), (off + size, off0 + n - off - size)]
                self.free[i:i + 1] = [p for p in pieces if p[1] > 0]
                self._best.pop((off0, n), None)
                break
        return off

    def _best_in(self, seg: tuple[int, int], size: int) -> tuple[int, int]:
        """(age, offset) of the best place for `size` bytes in the free segment `seg`: the lowest
        `_age`, then the lowest offset, among the segment's ends and the starts of the
        OLDEST_STARTS longest-vacated ranges beginning in it with room for `size` from there (all
        of them made the allocator quadratic in the ranges a long program frees, for a choice
        among near-equals)."""
        known = self._best.get(seg)
        if known is None:
            known = self._best[seg] = _Segment(self, *seg)
        key = known.best.get(size)
        if key is None:
            off0, n = seg
            last, age = off0 + n - size, known.age
            key, tried = None, 0
            for latest, off in known.starts:   # oldest first
                if tried == OLDEST_STARTS or (key is not None and latest > key[0]):
                    break   # a place is as old as the range starting there at best: none beats `key`
                if off <= last:
                    tried += 1
                    k = (age(off, size), off)
                    if key is None or k < key:
                        key = k
            for off in (off0, last):   # the segment's ends: no bound on their age, always tried
                k = (age(off, size), off)
                if key is None or k < key:
                    key = k
            known.best[size] = key
        return key

    def release(self, off: int, size: int) -> None:
        i = bisect.bisect_left(self.free, (off, 0))
        self.free.insert(i, (off, size))
        # coalesce with the neighbours (a merged segment's best places are no longer known)
        if i + 1 < len(self.free) and off + size == self.free[i + 1][0]:
            self._best.pop(self.free[i + 1], None)
            self.free[i] = (off, size + self.free[i + 1][1])
            del self.free[i + 1]
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == off:
            self._best.pop(self.free[i - 1], None)
            self.free[i - 1] = (self.free[i - 1][0], self.free[i - 1][1] + self.free[i][1])
            del self.free[i]

    def previous_occupants(self, start: int, end: int) -> list[int]:
        """Final accessors of buffers that used [start, end) before; forget ranges now covered."""
        deps, covered = [], []
        for rs, i in self._overlapping(start, end):
            s, e, accessors, _ = rs[i]
            deps.extend(accessors)
            if start <= s and e <= end:
                covered.append((rs, i))  # fully re-occupied: the new buffer's own accessors come after these
        for rs, i in reversed(covered):
            del rs[i]
        return deps


class _Segment:
    """What `_PESpace._best_in` knows of one free segment: the freed ranges overlapping it (every
    candidate place lies in it, so no other range can overlap one), the short ones with the
    longest of their lengths (how far back from a place a range overlapping it may start), the
    (latest accessor, start) of the ranges beginning in it (oldest first), and the best place found
    per buffer size."""

    __slots__ = ("near", "reach", "long", "long_reach", "starts", "best")

    def __init__(self, space: _PESpace, off0: int, n: int):
        end = off0 + n
        rs = space.short
        hi = bisect.bisect_left(rs, (end,))
        self.near = [r for r in rs[bisect.bisect_left(rs, (off0 - space.short_limit,), 0, hi):hi] if r[1] > off0]
        self.reach = max((r[1] - r[0] for r in self.near), default=0)
        self.long = []
        for r in space.long:
            if r[0] >= end:
                break
            if r[1] > off0:
                self.long.append(r)
        self.long_reach = max((r[1] - r[0] for r in self.long), default=0)
        starts = []
        for rs in (space.short, space.long):
            lo, hi = bisect.bisect_left(rs, (off0,)), bisect.bisect_left(rs, (end,))
            starts.extend((r[3], r[0]) for r in rs[lo:hi])
        starts.sort()
        self.starts = starts
        self.best: dict[int, tuple[int, int]] = {}

    def age(self, off: int, size: int) -> int:
        """The latest accessor of the freed ranges [off, off + size) overlaps, or -1 (archived
        ranges do not steer placement). The hot path of a long program's allocation."""
        end, best = off + size, -1
        rs = self.near
        hi = bisect.bisect_left(rs, (end,))
        for r in rs[bisect.bisect_left(rs, (off - self.reach,), 0, hi):hi]:
            if r[1] > off and r[3] > best:
                best = r[3]
        rs = self.long
        hi = bisect.bisect_left(rs, (end,))
        for r in rs[bisect.bisect_left(rs, (off - self.long_reach,), 0, hi):hi]:
            if r[1] > off and r[3] > best:
                best = r[3]
        return best


def allocate(commands: list[Command], buffers: list[Buffer], final_accessors, cfg: NPUConfig,
             *, fresh_when_empty: bool = False) -> Allocation:
    """Assign SRAM addresses. `final_accessors(buffer)` gives the commands whose completion frees it
    (its last writer and the readers after it). `fresh_when_empty`: whenever a PE's SRAM empties,
    place the next buffers as in fresh SRAM (first fit), so a program of kernels one after another
    fragments no more than each kernel alone (the reuse dependencies are kept all the same)."""
    alloc = Allocation(len(buffers), cfg.num_pes)
    align = cfg.sram_alignment_bytes
    # the DMAs that address a resident tensor use its buffer without naming it (they are DRAM-box
    # accesses to the hazard tracker): its space is free only when they have finished too
    resident_users: dict[int, list[int]] = {}
    resident_writers: dict[int, list[int]] = {}
    for c in commands:
        backing = _resident_backing(c)
        for buf in backing:
            resident_users.setdefault(buf.id, []).append(c.id)
        for buf in _resident_backing(c, written=True):
            resident_writers.setdefault(buf.id, []).append(c.id)
        for buf in c.reads + c.writes + backing:
            if alloc.first[buf.id] < 0:
                alloc.first[buf.id] = c.id
            alloc.last[buf.id] = c.id

    births: dict[int, list[Buffer]] = {}
    deaths: dict[int, list[Buffer]] = {}
    for buf in buffers:
        if alloc.first[buf.id] >= 0:  # a buffer no command touches takes no space
            births.setdefault(alloc.first[buf.id], []).append(buf)
            deaths.setdefault(alloc.last[buf.id], []).append(buf)

    spaces = [_PESpace(cfg.sram_bytes_per_pe) for _ in range(cfg.num_pes)]
    for c in commands:
        for buf in births.get(c.id, ()):
            space = spaces[buf.pe]
            size = -(-buf.nbytes // align) * align
            off = space.place(size)
            if off < 0:
                raise _overflow(buf, size, space, c, cfg)
            alloc.offset[buf.id], alloc.size[buf.id] = off, size
            space.live[buf.id] = buf
            space.live_bytes += size
            alloc.peak[buf.pe] = max(alloc.peak[buf.pe], space.live_bytes)
            alloc.footprint[buf.pe] = max(alloc.footprint[buf.pe], off + size)
            before = _last_per_queue(space.previous_occupants(off, off + size), commands)
            if before:
                # a tile's first command writes it and the others follow it; a resident tensor is
                # written box by box by DMAs none of which follows another: each of them waits
                for w in dict.fromkeys([c.id, *resident_writers.get(buf.id, ())]):
                    alloc.reuse_deps.setdefault(w, []).extend(before)
        for buf in deaths.get(c.id, ()):
            space = spaces[buf.pe]
            off, size = alloc.offset[buf.id], alloc.size[buf.id]
            space.release(off, size)
            del space.live[buf.id]
            space.live_bytes -= size
            # a resident tensor's buffer is freed by the DMAs that touched it, its on-chip copies
            accessors = tuple(dict.fromkeys([*final_accessors(buf), *resident_users.get(buf.id, ())])) \
                or (alloc.last[buf.id],)
            space.vacate(off, off + size, accessors)
            if fresh_when_empty and not space.live:
                space.forget_placement()
    return alloc


def _last_per_queue(ids: list[int], commands: list[Command]) -> list[int]:
    """The commands of `ids` whose completion implies all the others': an engine queue runs its
    commands one at a time in program order, so of those on one queue the last is enough (syncs,
    on no queue, are kept). A buffer placed where a hundred earlier tiles lived would otherwise
    carry every reader of every one of them, and a resident tensor written by a thousand DMAs
    each of them: tens of millions of dependencies in a long model's program, for the same
    schedule."""
    if len(ids) <= 1:
        return ids
    last: dict[tuple[int, int], int] = {}
    kept = []
    for i in ids:
        c = commands[i]
        if c.engine == NO_ENGINE:
            kept.append(i)
        else:
            key = (c.pe, c.engine)
            if last.get(key, -1) < i:
                last[key] = i
    return kept + sorted(last.values())


def _resident_backing(c: Command, written: bool = False) -> tuple:
    """The SRAM buffers of resident tensors a DMA addresses (they live while it runs); `written`:
    only those it writes into."""
    refs = (getattr(c, "dst", None),) if written else (getattr(c, "src", None), getattr(c, "dst", None))
    out = []
    for r in refs:
        for x in (r if isinstance(r, tuple) else (r,)):
            backing = getattr(getattr(x, "tensor", None), "backing", None)
            if backing is not None:
                out.append(backing)
    return tuple(out)


def _overflow(buf: Buffer, size: int, space: _PESpace, cmd: Command, cfg: NPUConfig) -> SRAMOverflowError:
    live = sorted(space.live.values(), key=lambda b: -b.nbytes)
    listing = "\n".join(f"    {b.name:<20} {_fmt_bytes(b.nbytes):>12}  {b!r}" for b in live) or "    (none)"
    largest = max((n for _, n in space.free), default=0)
    free = space.capacity - space.live_bytes
    why = ("it is fragmented: " if free >= size else "") + \
        f"{_fmt_bytes(free)} free, largest free block {_fmt_bytes(largest)}"
    return SRAMOverflowError(
        f"SRAM overflow on PE {buf.pe} of target {cfg.name!r}: buffer {buf.name!r} "
        f"({buf.nbytes} bytes, {buf.shape} {buf.dtype}) does not fit; capacity "
        f"{cfg.sram_bytes_per_pe} bytes, {space.live_bytes} bytes live in {len(live)} buffers ({why})",
        loc=cmd.loc or buf.loc,
        detail=f"  needed by {cmd}\n  live buffers on PE {buf.pe}:\n{listing}",
        hint="use smaller tiles, or end a buffer's life earlier: a buffer lives from the first command "
             "that uses it to the last, so reuse one buffer instead of allocating a new one per tile")


def _fmt_bytes(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
