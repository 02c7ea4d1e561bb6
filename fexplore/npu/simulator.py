"""The event-driven simulator: per PE a DMA, a tensor and a vector engine, all PEs sharing DRAM.

Model
  - Each (PE, engine) pair is a queue that issues its commands in program order, one at a time.
    A command starts when it is at the head of its queue, its engine is idle, and all its
    dependencies have finished.
  - Tensor and vector commands take their cost (`cost.py`) in cycles.
  - A DMA command spends `dma_startup_cycles` getting going, then transfers its bytes. All
    transfers in flight share DRAM fairly: with n in flight each moves min(engine bandwidth,
    DRAM bandwidth / n) bytes per cycle. Because every transfer then has the same rate, a single
    "virtual bytes" clock (bytes each transfer has moved since time 0) orders their finishes;
    rates change only when a transfer starts or ends, so each change is O(log n).
  - Sync commands take no time and no engine.
  Deterministic: ties are broken by command id, and nothing depends on dict or set order.

Functional mode then runs the commands with numpy in the order they started in the simulation,
so a missing dependency would show up as wrong numbers, not be hidden by program order; and
before that the run is checked (`racecheck`): conflicting commands ran in program order and no two
live buffers shared SRAM, which catches a missing dependency even where the replay is right.
"""

from __future__ import annotations

import heapq
import time

from fexplore.npu.program import Program

_INF = float("inf")


class TimingTrace:
    """Raw output of the event loop: per command start/end cycle, the start order, and the DRAM
    bandwidth in use over time (a step function: at `bw_time[i]` it becomes `bw_rate[i]` B/cycle)."""

    __slots__ = ("start", "end", "order", "bw_time", "bw_rate", "makespan")

    def __init__(self, start, end, order, bw_time, bw_rate):
        self.start, self.end, self.order = start, end, order
        self.bw_time, self.bw_rate = bw_time, bw_rate
        self.makespan = max(end, default=0.0)


def run_timing(prog: Program) -> TimingTrace:
    """Replay the program's commands on the chip's engines. Kept in one function with local names:
    it is the hot loop (the benchmark asks for >= 200k commands per second of wall time)."""
    cfg = prog.target
    n = len(prog.commands)
    queue_of, position, duration = prog.queue_of, prog.position, prog.duration
    moved, dependents, queues = prog.moved_bytes, prog.dependents, prog.queues
    pending = list(prog.num_deps)
    head = [0] * len(queues)
    busy = [False] * len(queues)
    qlen = [len(q) for q in queues]
    is_dma = [False] * n
    for q in range(0, len(queues), 3):  # queue = pe * 3 + engine; engine 0 is the DMA
        for c in queues[q]:
            is_dma[c] = True
    start = [0.0] * n
    end = [-1.0] * n
    order: list[int] = []
    events: list[tuple[float, int]] = []  # (time, c): c >= 0 finishes c, c < 0 starts ~c's transfer
    push, pop = heapq.heappush, heapq.heappop

    cap, dram_bw = float(cfg.dma_bytes_per_cycle), float(cfg.dram_bytes_per_cycle)
    flying: list[tuple[float, int]] = []  # transfers in flight: (virtual bytes at finish, c)
    vbytes, vtime, rate, pool_next = 0.0, 0.0, 0.0, _INF
    bw_time, bw_rate = [0.0], [0.0]

    def begin(c, t):  # only for the first commands; the loop below inlines the same steps
        q = queue_of[c]
        head[q] += 1
        busy[q] = True
        start[c] = t
        order.append(c)
        push(events, (t + duration[c], ~c if is_dma[c] else c))

    for q, cmds in enumerate(queues):
        if cmds and pending[cmds[0]] == 0:
            begin(cmds[0], 0.0)
    for c in range(n):
        if queue_of[c] < 0 and pending[c] == 0:
            push(events, (0.0, c))  # a sync with nothing to wait for

    while True:
        # The next thing to happen: a transfer finishing in DRAM, or an event from the heap.
        t_ev = events[0][0] if events else _INF
        if pool_next <= t_ev:
            if pool_next == _INF:
                break
            t = pool_next
            vbytes, c = pop(flying)
            vtime = t
            k = len(flying)
            if k:
                rate = cap if cap * k <= dram_bw else dram_bw / k
                pool_next = t + (flying[0][0] - vbytes) / rate
            else:
                rate, pool_next = 0.0, _INF
            bw_time.append(t)
            bw_rate.append(rate * k)
        else:
            t, c = pop(events)
            if c < 0:  # start-up over: the transfer joins DRAM
                c = ~c
                vbytes += rate * (t - vtime)
                vtime = t
                push(flying, (vbytes + moved[c], c))
                k = len(flying)
                rate = cap if cap * k <= dram_bw else dram_bw / k
                pool_next = t + (flying[0][0] - vbytes) / rate
                bw_time.append(t)
                bw_rate.append(rate * k)
                continue

        # Command c finishes at t: free its engine, start what is now ready.
        end[c] = t
        q = queue_of[c]
        if q >= 0:
            busy[q] = False
            h = head[q]
            if h < qlen[q]:
                nxt = queues[q][h]
                if pending[nxt] == 0:
                    head[q] = h + 1
                    busy[q] = True
                    start[nxt] = t
                    order.append(nxt)
                    push(events, (t + duration[nxt], ~nxt if is_dma[nxt] else nxt))
        for d in dependents[c]:
            left = pending[d] - 1
            pending[d] = left
            if left == 0:
                qd = queue_of[d]
                if qd < 0:  # a sync: done as soon as it is ready
                    start[d] = t
                    push(events, (t, d))
                elif not busy[qd] and head[qd] == position[d]:
                    head[qd] += 1
                    busy[qd] = True
                    start[d] = t
                    order.append(d)
                    push(events, (t + duration[d], ~d if is_dma[d] else d))

    if n and min(end) < 0:
        stuck = [prog.commands[c] for c in range(n) if end[c] < 0][:5]
        # cannot happen: every dependency points to an earlier command
        raise RuntimeError(f"simulation stalled; unfinished commands: {stuck}")
    return TimingTrace(start, end, order, bw_time, bw_rate)


def simulate(program: Program, inputs: dict | None = None, *, functional: bool | None = None):
    """Run `program` on its target. `inputs` maps input tensor names to arrays; functional mode
    (on by default when inputs are given) computes real outputs with numpy. Returns a SimResult."""
    from fexplore.npu.result import SimResult

    if functional is None:
        functional = inputs is not None
    t0 = time.perf_counter()
    trace = run_timing(program)
    dram = None
    if functional:
        from fexplore.npu.functional import execute
        from fexplore.npu.racecheck import raise_on_violations

        try:
            # numbers from a run that broke program order are not the program's: check it first
            raise_on_violations(program, trace)
            dram = execute(program, inputs or {}, trace.order)
        except MemoryError as e:
            from fexplore.npu.errors import SimulationMemoryError

            raise SimulationMemoryError(
                f"running program {program.name!r} with values ran out of memory "
                f"({str(e).splitlines()[0] if str(e) else 'MemoryError'})",
                hint="run a smaller input or configuration; simulate() without inputs times the "
                     "program without computing its values") from None
    return SimResult(program, trace, dram, wall_s=time.perf_counter() - t0)
