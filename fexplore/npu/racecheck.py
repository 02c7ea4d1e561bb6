"""The simulator's hazard check: did a simulated run keep the program's meaning?

Program order is the meaning of a program; the dependencies the builder infers (`hazards`) and
the SRAM allocator's reuse waits are what let the simulator run commands out of that order. If
either misses one, the timing is simply too good, and the functional mode, which replays commands
in the order they *started*, can still compute the right numbers (a load that began before the
store it reads had finished is replayed after that store began). So the run itself is checked,
from the commands' memory accesses and the simulated start and end of each, independently of how
the dependencies were derived:

- memory order: two commands touching the same memory, at least one writing (an SRAM buffer, or
  overlapping elements of one DRAM tensor's storage, a resident tensor included), must run in
  program order: the later one starts no earlier than the earlier one ends;
- SRAM addresses: two buffers of one PE whose address ranges overlap must not be alive at the same
  time (alive: from the start of the first command that touches a buffer to the end of the last).

DRAM is tracked per element (the last writer and the latest-ending reader of each element of
every storage some command writes), so partly overlapping boxes, views and tilings are exact;
storages nothing writes (inputs, weights) have no hazards and cost nothing, and a storage's tracks
are dropped after the last command that touches it.
"""

from __future__ import annotations

import heapq

import numpy as np

from fexplore.npu.commands import Gather, Host, Load, Scatter, Stage, Store
from fexplore.npu.errors import HazardError

# simulated times are sums of float cycle counts: a dependency makes start == end exactly, so the
# slack only absorbs rounding, far below one cycle
_EPS = 1e-6
MAX_REPORTED = 5


def check_run(program, trace) -> list[str]:
    """The violations of one simulated run (empty when the run kept program order and no two live
    buffers shared SRAM), at most `MAX_REPORTED` of each kind, each a sentence naming the commands."""
    return _memory_order(program, trace) + _sram_addresses(program, trace)


def raise_on_violations(program, trace) -> None:
    found = check_run(program, trace)
    if found:
        raise HazardError(
            f"the simulated run of program {program.name!r} broke program order: "
            f"{len(found)} violation(s) found", detail="\n".join(f"  {v}" for v in found),
            hint="a dependency is missing: the builder's hazard inference or the SRAM allocator's "
                 "reuse waits let a command run before one it conflicts with had finished")


def dram_accesses(c) -> list[tuple[object, bool]]:
    """(DRAM box, written) for every DRAM (or resident tensor) box command `c` touches, the boxes
    of resident tensors it reads in place included."""
    return _box_accesses(c) + [(r, False) for r in c.resident_reads]


def _box_accesses(c) -> list[tuple[object, bool]]:
    if isinstance(c, Stage):
        return [(c.src, False), (c.into, True)]
    if isinstance(c, (Load, Gather)):
        return [(c.src, False)]
    if isinstance(c, Store):
        return [(c.dst, True)]
    if isinstance(c, Scatter):
        return [(c.dst, True)] + ([(c.dst, False)] if c.reduce else [])
    if isinstance(c, Host):
        return [(r, False) for r in c.src] + [(r, True) for r in c.dst]
    return []


def _memory_order(program, trace) -> list[str]:
    start, end, cmds = trace.start, trace.end, program.commands
    found: list[str] = []

    def late(later, earlier, what):
        if len(found) < MAX_REPORTED:
            found.append(f"{cmds[later]} started at cycle {start[later]:.0f}, before {cmds[earlier]} "
                         f"ended at {end[earlier]:.0f} ({what})")

    # SRAM buffers, whole: per buffer its last writer and the latest-ending reader since
    last_w: dict[int, int] = {}
    last_r: dict[int, int] = {}
    for c in cmds:
        i, s = c.id, start[c.id]
        writes = {b.id for b in c.writes}
        for b in dict.fromkeys(x.id for x in c.reads):
            w = last_w.get(b)
            if w is not None and w != i and s < end[w] - _EPS:
                late(i, w, f"reads SRAM buffer {program.buffers[b].name!r} it writes")
        for b in writes:
            for prev, what in ((last_w.get(b), "both write"), (last_r.get(b), "overwrites what it reads")):
                if prev is not None and prev != i and s < end[prev] - _EPS:
                    late(i, prev, f"{what} SRAM buffer {program.buffers[b].name!r}")
        for b in dict.fromkeys(x.id for x in c.reads):
            r = last_r.get(b)
            if r is None or end[i] > end[r]:
                last_r[b] = i
        for b in writes:
            last_w[b] = i
            last_r.pop(b, None)

    # DRAM storages some command writes, per element: the id of its last writer and of its
    # latest-ending reader since (4 bytes each; the end times are looked up by id, so a storage's
    # tracks cost 8 bytes an element, not the 32 of times and ids kept side by side)
    written = {r.tensor.storage for c in cmds for r, w in dram_accesses(c) if w}
    ends_of = np.append(np.asarray(end, dtype=np.float64), -np.inf)   # id -1 (none) ends at -inf
    tracks: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    # a storage's tracks are dropped after the last command that touches it: the check holds the
    # tracks of the storages alive at a point of the program, not of every one it writes
    last = {r.tensor.storage: c.id for c in cmds for r, _ in dram_accesses(c)}
    for c in cmds:
        i, s = c.id, start[c.id]
        for ref, write in dram_accesses(c):
            t = ref.tensor
            if t.storage not in written:
                continue
            if t.storage not in tracks:
                n = int(np.prod(t.storage_shape))
                tracks[t.storage] = (np.full(n, -1, np.int32), np.full(n, -1, np.int32))
            # views into the tracks (the Ellipsis keeps a 0-d box an array, not a scalar copy)
            w_id, r_id = (t.of_storage(a)[(*ref.slices, ...)] for a in tracks[t.storage])
            prior = [(w_id, "reads DRAM it writes" if not write else "both write DRAM")]
            if write:
                prior.append((r_id, "overwrites DRAM it reads"))
            for ids, what in prior:
                ends = ends_of[ids]
                if ends.size and ends.max() > s + _EPS:
                    ends = np.where(ids == i, -np.inf, ends)   # a command reading what it writes
                    if ends.max() > s + _EPS:
                        late(i, int(ids.reshape(-1)[int(np.argmax(ends))]), f"{what}: {t.storage}")
            if write:
                w_id[...], r_id[...] = i, -1
            else:
                r_id[end[i] > ends_of[r_id]] = i
        for ref, _ in dram_accesses(c):
            if last[ref.tensor.storage] == i:
                tracks.pop(ref.tensor.storage, None)
    return found


def _sram_addresses(program, trace) -> list[str]:
    alloc, start, end = program.allocation, trace.start, trace.end
    alive: dict[int, list[float]] = {}
    for c in program.commands:
        bufs = [*c.reads, *c.writes]
        for ref, _ in dram_accesses(c):
            if ref.tensor.backing is not None:
                bufs.append(ref.tensor.backing)
        for b in bufs:
            span = alive.get(b.id)
            if span is None:
                alive[b.id] = [start[c.id], end[c.id]]
            else:
                span[0], span[1] = min(span[0], start[c.id]), max(span[1], end[c.id])
    found: list[str] = []
    by_pe: dict[int, list[int]] = {}
    for bid in alive:
        if alloc.offset[bid] >= 0:
            by_pe.setdefault(program.buffers[bid].pe, []).append(bid)
    for pe, bids in by_pe.items():
        bids.sort(key=lambda b: (alive[b][0], b))
        live: list[tuple[float, int]] = []   # (end, buffer id), a heap: the buffers alive now
        for b in bids:
            s, e = alive[b]
            while live and live[0][0] <= s + _EPS:
                heapq.heappop(live)
            lo, hi = alloc.offset[b], alloc.offset[b] + alloc.size[b]
            for _, o in live:
                if alloc.offset[o] < hi and lo < alloc.offset[o] + alloc.size[o] and len(found) < MAX_REPORTED:
                    bo, bb = program.buffers[o], program.buffers[b]
                    found.append(f"SRAM of PE {pe}: {bb!r} at [{lo:#x}, {hi:#x}) and {bo!r} at "
                                 f"[{alloc.offset[o]:#x}, {alloc.offset[o] + alloc.size[o]:#x}) overlap "
                                 f"while both are alive (cycles {s:.0f}-{e:.0f} and "
                                 f"{alive[o][0]:.0f}-{alive[o][1]:.0f})")
            heapq.heappush(live, (e, b))
    return found
