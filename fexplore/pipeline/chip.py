"""A compiled model on the simulated chip: its schedules (one per static size), runs, and the
per-kernel report.

A model compiled with static shapes has one schedule, made by the schedule stage. A model with
symbolic dims is scheduled per static size, as NPU serving stacks compile prefill and decode
buckets: the first call with a new size specializes the final graph to it, lowers and schedules
it, and caches the schedule (``Schedules.made`` lists them, with their simulated latency).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from fexplore.errors import InputError


@dataclass
class MadeSchedule:
    sizes: tuple          # ((symbol, value), ...); () for a static model
    schedule: object      # stages.schedule.Schedule
    cycles: int
    latency_us: float
    build_s: float


class Schedules:
    """The schedules of one CompiledModel, by static size."""

    def __init__(self, graph, options, static_schedule=None):
        self.graph = graph
        self.options = options
        self._by_size: dict[tuple, MadeSchedule] = {}
        if static_schedule is not None:
            self._remember((), static_schedule, 0.0)

    def _remember(self, key, sched, build_s) -> MadeSchedule:
        res = sched.simulate()
        made = MadeSchedule(key, sched, res.cycles, res.latency_s * 1e6, build_s)
        self._by_size[key] = made
        return made

    def for_inputs(self, arrays) -> MadeSchedule:
        """The schedule for these inputs' sizes (made and cached on first use)."""
        key = self._sizes(arrays)
        made = self._by_size.get(key)
        if made is None:
            made = self._make(key)
        return made

    def _sizes(self, arrays) -> tuple:
        """The symbols' values for these inputs; raises InputError on a wrong count, rank, dtype
        or shape, as the interpreter does."""
        from fexplore.ir import bind_symbols

        bound = bind_symbols(self.graph, [np.asarray(a) for a in arrays])
        if not self.graph.symbols:
            return ()
        return tuple(sorted((str(k), int(v)) for k, v in bound.items() if str(k) in self.graph.symbols))

    def _make(self, key) -> MadeSchedule:
        from .stages.lower import lower
        from .stages.schedule import schedule
        from .stages.shapes import specialize

        t0 = time.perf_counter()
        g = specialize(self.graph, **dict(key)) if key else self.graph
        low = lower(g, self.options).lowering
        sched = schedule(g, self.options, lowering=low).schedule
        if sched is None:
            raise InputError(f"could not schedule @{self.graph.name} for sizes {dict(key)}")
        return self._remember(key, sched, time.perf_counter() - t0)

    @property
    def made(self):
        """One row per schedule made: sizes, simulated cycles and latency, build time."""
        import pandas as pd

        return pd.DataFrame([{"sizes": dict(m.sizes) or "static", "cycles": m.cycles,
                              "latency_us": m.latency_us, "build_s": m.build_s,
                              "commands": len(m.schedule.program.commands)}
                             for m in self._by_size.values()])


def kernel_report(sched, res):
    """One row per lowered node that runs (kernels and host ops), in program order.

    Kernels overlap in a schedule, so a kernel's ``cycles`` is its span (first command start to
    last command end) and ``share`` is that span over the program's; ``busy_*`` are the cycles
    its commands keep each engine busy. ``roofline_cycles`` is the kernel's own bound (its flops
    at the chip's peak, its DRAM bytes at full bandwidth, its vector work on every lane) and
    ``vs_roofline`` the span over it; ``bound`` names the resource that sets it."""
    import pandas as pd

    from fexplore.npu.commands import Contract, Host, Vector

    prog, cfg = sched.program, sched.program.target
    start, end = res.trace.start, res.trace.end
    total = max(res.cycles, 1)
    rows = []
    for k in sched.kernels:
        if not k.commands:
            continue
        cmds = [prog.commands[c] for c in k.commands]
        busy = {"dma": 0.0, "tensor": 0.0, "vector": 0.0}
        flops = dram = vec = 0
        tensor_bound = 0.0
        for c in cmds:
            if c.engine >= 0:
                busy[("dma", "tensor", "vector")[c.engine]] += end[c.id] - start[c.id]
            if isinstance(c, Contract):
                flops += 2 * c.macs
                tensor_bound += c.macs / (cfg.macs_per_cycle(c.dtype) * cfg.num_pes)
            elif isinstance(c, Vector):
                vec += c.elements * c.op.passes
            elif isinstance(c, Host):
                dram += c.nbytes
            elif c.engine == 0:
                dram += prog.moved_bytes[c.id]
        t0 = min(start[c.id] for c in cmds)
        t1 = max(end[c.id] for c in cmds)
        bounds = {"compute": tensor_bound, "DRAM": dram / cfg.dram_bytes_per_cycle,
                  "vector": vec / (cfg.vector_lanes * cfg.num_pes)}
        if k.how == "host":
            bounds = {"host": t1 - t0}
        bound = max(bounds, key=bounds.get)
        line = k.loc.line if k.loc is not None and getattr(k.loc, "line", None) else None
        rows.append({"kernel": k.name, "kind": k.kind, "how": k.how, "module": k.module,
                     "source": f"{k.loc.file}:{line}" if line else "",
                     "start": t0, "cycles": t1 - t0, "share": (t1 - t0) / total,
                     "busy_tensor": busy["tensor"], "busy_vector": busy["vector"], "busy_dma": busy["dma"],
                     "flops": flops, "dram_bytes": dram, "bound": bound,
                     "roofline_cycles": bounds[bound],
                     "vs_roofline": (t1 - t0) / bounds[bound] if bounds[bound] else float("inf")})
    return pd.DataFrame(rows)
