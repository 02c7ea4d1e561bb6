"""The timeline of a simulation: one event per engine command (PE, engine, start, end, command,
source location), SRAM occupancy per PE, and DRAM bandwidth over time.

Views: `to_perfetto(path)` writes Chrome/Perfetto trace-event JSON (one track per engine per PE,
flow arrows for dependencies, counters for SRAM bytes and DRAM bandwidth); `to_dataframe()` a
pandas table; `plot()` / `_repr_html_` a matplotlib Gantt chart (both rendered by
`fexplore.viz.timeline`, imported only when asked for).
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import NamedTuple

from fexplore.errors import SourceLoc
from fexplore.npu.commands import ENGINES
from fexplore.npu.program import Program
from fexplore.npu.simulator import TimingTrace


class TimelineEvent(NamedTuple):
    pe: int
    engine: str
    start: float   # cycles
    end: float
    cmd: int       # command id in the program
    name: str
    loc: SourceLoc | None


class Timeline:
    def __init__(self, program: Program, trace: TimingTrace):
        self.program = program
        self.trace = trace
        self.clock_hz = program.target.clock_hz
        self.num_pes = program.target.num_pes

    # ---- events -------------------------------------------------------------------------------
    @cached_property
    def events(self) -> list[TimelineEvent]:
        """Engine commands in order of start time (syncs take no engine and are not events)."""
        start, end, cmds = self.trace.start, self.trace.end, self.program.commands
        out = []
        for c in self.trace.order:
            cmd = cmds[c]
            out.append(TimelineEvent(cmd.pe, ENGINES[cmd.engine], start[c], end[c], c, cmd.name, cmd.loc))
        return out

    def __len__(self) -> int:
        return len(self.trace.order)

    def __iter__(self):
        return iter(self.events)

    @property
    def makespan(self) -> float:
        return self.trace.makespan

    @property
    def lanes(self) -> list[tuple[int, str]]:
        """Every (pe, engine) of the chip, in display order."""
        return [(pe, e) for pe in range(self.num_pes) for e in ENGINES]

    def pe_label(self, pe: int) -> str:
        """"PE 1", or on a fused chip the chip's PEs it is: "PE 1 (PEs 4-7 fused)"."""
        g = self.program.target.fused_pes
        return f"PE {pe}" if g == 1 else f"PE {pe} (PEs {pe * g}-{pe * g + g - 1} fused)"

    def window(self, start: float, end: float) -> list[TimelineEvent]:
        """Events overlapping the cycle window [start, end)."""
        return [e for e in self.events if e.end > start and e.start < end]

    def sram_occupancy(self) -> dict[int, list[tuple[float, int]]]:
        """Per PE, a step function [(cycle, live bytes)]: a buffer occupies its space from the start of
        the first command using it to the end of the last one to finish."""
        start, end = self.trace.start, self.trace.end
        alloc = self.program.allocation
        deltas: dict[int, list[tuple[float, int]]] = {pe: [] for pe in range(self.num_pes)}
        for buf, users in zip(self.program.buffers, self.program.buffer_users):
            if users:
                size = alloc.size[buf.id]
                deltas[buf.pe].append((min(start[u] for u in users), size))
                deltas[buf.pe].append((max(end[u] for u in users), -size))
        out = {}
        for pe, ds in deltas.items():
            ds.sort(key=lambda x: (x[0], x[1]))  # frees before allocations at the same cycle
            steps, live = [(0.0, 0)], 0
            for t, d in ds:
                live += d
                if steps[-1][0] == t:
                    steps[-1] = (t, live)
                else:
                    steps.append((t, live))
            out[pe] = steps
        return out

    def dram_bandwidth(self) -> list[tuple[float, float]]:
        """A step function [(cycle, bytes per cycle in use)] over the whole chip."""
        steps: list[tuple[float, float]] = []
        for t, r in zip(self.trace.bw_time, self.trace.bw_rate):
            if steps and steps[-1][0] == t:
                steps[-1] = (t, r)
            elif not steps or steps[-1][1] != r:
                steps.append((t, r))
        return steps

    # ---- tables -------------------------------------------------------------------------------
    def to_dataframe(self):
        import pandas as pd  # lazy

        return pd.DataFrame(self.events, columns=TimelineEvent._fields).assign(
            cycles=lambda d: d.end - d.start, loc=lambda d: d["loc"].map(lambda x: str(x) if x else None))

    def cycles_by_source(self):
        """Busy cycles per source location and engine: which model op or kernel line costs what."""
        df = self.to_dataframe()
        table = df.groupby(["loc", "engine"], dropna=False)["cycles"].sum().unstack(fill_value=0)
        table["total"] = table.sum(axis=1)
        return table.sort_values("total", ascending=False)

    # ---- Perfetto -----------------------------------------------------------------------------
    def _us(self, cycles: float) -> float:
        return cycles * 1e6 / self.clock_hz  # trace-event timestamps are microseconds

    def to_perfetto_dict(self, *, flows: bool = True) -> dict:
        """The Chrome trace-event document: pid = PE, tid = engine, one more process for DRAM."""
        us, prog = self._us, self.program
        scale = 1e6 / self.clock_hz
        ev: list[dict] = []
        dram_pid = self.num_pes
        for pe in range(self.num_pes):
            ev.append({"ph": "M", "name": "process_name", "pid": pe, "args": {"name": self.pe_label(pe)}})
            ev.append({"ph": "M", "name": "process_sort_index", "pid": pe, "args": {"sort_index": pe}})
            for tid, engine in enumerate(ENGINES):
                ev.append({"ph": "M", "name": "thread_name", "pid": pe, "tid": tid,
                           "args": {"name": f"PE{pe} {engine}"}})
        ev.append({"ph": "M", "name": "process_name", "pid": dram_pid, "args": {"name": "DRAM"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": dram_pid,
                   "args": {"sort_index": dram_pid}})

        cmds, moved = prog.commands, prog.moved_bytes
        for e in self.events:
            c = cmds[e.cmd]
            args = {"cmd": e.cmd, "text": c._text(), "cycles": e.end - e.start}
            if e.loc is not None:
                args["loc"] = str(e.loc)
            if c.engine == 0:
                args["bytes"] = moved[e.cmd]
            elif c.kind == "contract":
                args["macs"] = c.macs
            ev.append({"ph": "X", "name": e.name, "cat": e.engine, "pid": e.pe, "tid": c.engine,
                       "ts": e.start * scale, "dur": (e.end - e.start) * scale, "args": args})

        if flows:
            ev.extend(self._flow_events())

        for pe, steps in self.sram_occupancy().items():
            for t, live in steps:
                ev.append({"ph": "C", "name": "SRAM bytes", "pid": pe, "ts": us(t), "args": {"live": live}})
        for t, rate in self.dram_bandwidth():
            ev.append({"ph": "C", "name": "DRAM bandwidth (B/cycle)", "pid": dram_pid, "ts": us(t),
                       "args": {"in use": rate}})
        return {"traceEvents": ev, "displayTimeUnit": "ns",
                "otherData": {"program": prog.name, "target": prog.target.name,
                              "cycles": self.makespan, "clock_hz": self.clock_hz}}

    def _flow_events(self) -> list[dict]:
        """An arrow from each dependency to its dependent, across engines (an engine's own queue is
        in order anyway, so arrows within one lane would only add clutter). Syncs are looked through."""
        us, cmds = self._us, self.program.commands
        start, queue_of = self.trace.start, self.program.queue_of
        through: dict[int, set[int]] = {}

        def engine_deps(c: int) -> set[int]:
            out: set[int] = set()
            for d in cmds[c].deps:
                if queue_of[d] >= 0:
                    out.add(d)
                else:
                    if d not in through:
                        through[d] = engine_deps(d)
                    out |= through[d]
            return out

        ev, fid = [], 0
        for c in self.trace.order:
            for d in sorted(engine_deps(c)):
                if queue_of[d] == queue_of[c]:
                    continue
                fid += 1
                ev.append({"ph": "s", "id": fid, "name": "dep", "cat": "dep", "pid": cmds[d].pe,
                           "tid": cmds[d].engine, "ts": us(start[d])})
                ev.append({"ph": "f", "bp": "e", "id": fid, "name": "dep", "cat": "dep", "pid": cmds[c].pe,
                           "tid": cmds[c].engine, "ts": us(start[c])})
        return ev

    def to_perfetto(self, path, *, flows: bool = True):
        """Write Chrome/Perfetto trace-event JSON (open it at ui.perfetto.dev). Returns the path."""
        text = json.dumps(self.to_perfetto_dict(flows=flows))  # one shot: the C encoder, ~3x json.dump
        with open(path, "w") as f:
            f.write(text)
        return path

    # ---- pictures -----------------------------------------------------------------------------
    def plot(self, window: tuple[float, float] | None = None, **kwargs):
        """A matplotlib Gantt chart (Figure), one lane per engine per PE; `window` zooms in (cycles)."""
        from fexplore.viz.timeline import plot_timeline

        return plot_timeline(self, window=window, **kwargs)

    def _repr_html_(self) -> str:
        from fexplore.viz.timeline import timeline_html

        return timeline_html(self)

    def __repr__(self) -> str:
        return (f"<Timeline {self.program.name!r}: {len(self)} events on {self.num_pes} PEs, "
                f"{self.makespan:,.0f} cycles>")
