"""A compiled model on the simulated chip: its schedules (one per static size), runs, and the
per-kernel report.

A model compiled with static shapes has one schedule, made by the schedule stage. A model with
symbolic dims is scheduled per static size, as NPU serving stacks compile prefill and decode
buckets: the first call with a new size specializes the ingested graph to it, runs the graph
stages on it as a static compile at that size would (what only the size decided folds, attention
over a mask sliced to the length is recognized, tiles fit the real sizes), lowers and schedules
it, and caches the schedule (``Schedules.made`` lists them, with their simulated latency). A
compile that verifies checks each such schedule on its first call as the schedule stage checks
its own: the program simulated on the call's inputs against eager on them (``checked``); a wrong
one raises FX301 naming the sizes (and the first kernel that leaves the size's graph, if one does),
and is not kept. With
declared buckets and ``pad_safe=True``, a size between buckets runs padded on the next bucket up
(pipeline/buckets.py); ``Schedules.padded`` lists those calls with what the padding cost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


from .buckets import PaddedCalls, check_buckets, next_bucket, pad_inputs, padding_share, real_shapes, unpad


@dataclass
class MadeSchedule:
    sizes: tuple          # ((symbol, value), ...); () for a static model
    schedule: object      # stages.schedule.Schedule
    cycles: int
    latency_us: float
    build_s: float
    why: str = ""         # why there is no schedule (schedule None)
    codegen_bugs: tuple = ()   # kernel generators that raised lowering this size (its nodes ran on the host)
    graph: object = None  # the final graph at these sizes, the schedule's
    checked: str | None = None   # its check against eager (None: not checked yet)


@dataclass
class Call:
    """How one call runs: on `made`, with `arrays` (padded to a bucket when `real_shapes` is set,
    the outputs' shapes at the call's own size, which `outputs` slices back to)."""

    made: MadeSchedule
    arrays: list
    real_shapes: list | None = None

    def outputs(self, res) -> list[np.ndarray]:
        outs = self.made.schedule.outputs_of(res)
        return outs if self.real_shapes is None else unpad(outs, self.real_shapes)


class Schedules:
    """The schedules of one CompiledModel, by static size."""

    def __init__(self, graph, options, static_schedule=None, *, ingested=None, graph_stages=(), reference=None):
        """``graph``: the compile's final graph; ``ingested``: its ingest stage's graph, and
        ``graph_stages`` the (name, function) of the stages between ingest and lower, from which
        a size's graph is compiled (without them, the final graph is specialized instead).
        ``reference``: a call's inputs -> the oracle of eager on them (None: schedules made per
        size are not checked)."""
        self.graph = graph
        self.options = options
        self.ingested = ingested
        self.graph_stages = list(graph_stages)
        self.reference = reference
        self.buckets = check_buckets(graph, options.buckets) if graph.symbols else {}
        self._by_size: dict[tuple, MadeSchedule] = {}
        self._padded: dict[tuple, PaddedCalls] = {}
        if static_schedule is not None:
            made = self._remember((), static_schedule, 0.0, graph=graph)
            made.checked = "by the schedule stage"

    def _remember(self, key, sched, build_s, codegen_bugs=(), graph=None) -> MadeSchedule:
        res = sched.simulate()
        made = MadeSchedule(key, sched, res.cycles, res.latency_s * 1e6, build_s, codegen_bugs=tuple(codegen_bugs),
                            graph=graph)
        self._by_size[key] = made
        return made

    def for_inputs(self, arrays) -> MadeSchedule:
        """The schedule these inputs run on (made and cached on first use)."""
        return self.prepare(arrays).made

    def prepare(self, arrays) -> Call:
        """How a call with these inputs runs: on the schedule of their own size, or, with buckets
        and ``pad_safe``, padded on the next bucket up (see pipeline/buckets.py)."""
        arrays = [np.asarray(a) for a in arrays]
        key = self._sizes(arrays)
        bucket = next_bucket(key, self.buckets) if self.buckets and self.options.pad_safe else None
        if bucket is None or bucket == key:
            return Call(self._checked(self._get(key), arrays), arrays)
        made = self._get(bucket)
        padded = pad_inputs(self.graph, arrays, bucket, self.options.pad_value)
        self._checked(made, padded)
        seen = self._padded.setdefault(key, PaddedCalls(key, bucket, padding_share(key, bucket)))
        seen.calls += 1
        return Call(made, padded, real_shapes(self.graph, key))

    def _checked(self, made: MadeSchedule, arrays) -> MadeSchedule:
        """`made`, checked on its first call (on `arrays`) as the schedule stage checks its own
        schedule: simulated, against eager on the same inputs (a kernel that leaves the size's
        graph is named; a graph stage wrong at the size shows as the outputs alone).
        A schedule that fails is dropped (the next call at its sizes makes it again) and FX301
        raised: a size's compile runs its stages, lowering and tile choices afresh, none of
        which the compile's own checks saw at that size."""
        if made.checked is not None or made.schedule is None or self.reference is None:
            return made
        from fexplore.errors import FexploreError, NumericMismatchError

        from .stages.schedule import check_schedule

        try:
            oracle = self.reference(arrays)
        except FexploreError as e:   # eager itself raised on these inputs: nothing to check against
            made.checked = f"not checked: {e.message}"
            return made
        check = check_schedule(made.graph, made.schedule, oracle)
        if not check.ok:
            self._by_size.pop(made.sizes, None)
            raise NumericMismatchError(
                f"the program made for sizes {dict(made.sizes)} on its first call computes different numbers "
                f"from the model: {check.detail}",
                hint="compile with static shapes at these sizes (example inputs of this size, no "
                     "dynamic_shapes) to see which stage; compile(..., verify=False) skips the checks")
        made.checked = f"max abs err {check.max_abs:.1e} vs eager"
        return made

    def _get(self, key) -> MadeSchedule:
        made = self._by_size.get(key)
        return made if made is not None else self._make(key)

    def build_buckets(self) -> "Schedules":
        """Make the schedule of every declared bucket now (as a serving stack compiles its
        buckets ahead of the first request), not on first use."""
        import itertools

        names = sorted(self.buckets)
        for combo in itertools.product(*(self.buckets[n] for n in names)):
            if len(names) == len(self.graph.symbols):
                self._get(tuple(zip(names, combo)))
        return self

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

        t0 = time.perf_counter()
        g, problems = self._graph_at(key) if key else (self.graph, [])
        low = lower(g, self.options).lowering
        result = schedule(g, self.options, lowering=low)
        bugs = tuple(problems) + tuple(low.codegen_bugs)
        if result.schedule is None:   # e.g. empty tensors: the caller runs the interpreter
            made = MadeSchedule(key, None, 0, 0.0, time.perf_counter() - t0, result.stats.get("why", ""), bugs)
            self._by_size[key] = made
            return made
        return self._remember(key, result.schedule, time.perf_counter() - t0, bugs, graph=g)

    def _graph_at(self, key) -> tuple:
        """The final graph at one static size, and what went wrong making it (a stage that
        raised at this size: a bug, reported with the kernel generators' in ``codegen_bugs``).

        Compiled from the ingested graph at that size, so it is the graph a static compile makes.
        Specializing the symbolic compile's final graph instead keeps what was decided without
        the size: the positions' arange and the rotary tables computed on every call, attention
        over a mask sliced to the length left as three kernels (GPT's took twice the cycles of
        the static compile's). That is the fallback, its constants folded."""
        from fexplore.errors import InputError
        from fexplore.ir import verify
        from fexplore.ir.ops.rules import TypeRuleError

        from .stages.fold import fold
        from .stages.shapes import specialize

        try:
            final = specialize(self.graph, **dict(key))
        except TypeRuleError as e:   # sizes in range where an op of the program has no meaning
            raise InputError(f"the compiled program cannot run at {dict(key)}: {e}",
                             hint="the model's own shape logic rules these sizes out (eager raises "
                                  "too, or its traced program would be another); call with "
                                  "sizes the model takes") from None
        problems = []
        if self.ingested is not None and self.graph_stages:
            g, name = specialize(self.ingested, **dict(key)), "specialize"
            try:
                for name, run in self.graph_stages:
                    g = run(g, self.options).graph
                verify(g, stage=f"{name} at {dict(key)}")
                return g, problems
            except Exception as e:  # noqa: BLE001 - any stage's failure at this size is reported
                problems.append(f"stage {name} at {dict(key)}: {type(e).__name__}: {str(e).splitlines()[0]}")
        return fold(final, self.options, regions=True).graph, problems

    @property
    def made(self):
        """One row per schedule made: sizes, whether a declared bucket, simulated cycles and
        latency, build time."""
        import pandas as pd

        return pd.DataFrame([{"sizes": dict(m.sizes) or "static", "bucket": self._is_bucket(m.sizes),
                              "cycles": m.cycles, "latency_us": m.latency_us, "build_s": m.build_s,
                              "commands": len(m.schedule.program.commands) if m.schedule else 0,
                              "checked": m.checked or ""}
                             for m in self._by_size.values()],
                            columns=["sizes", "bucket", "cycles", "latency_us", "build_s", "commands", "checked"])

    @property
    def padded(self):
        """One row per call size that ran padded on a bucket: the bucket, the share of the
        bucketed dims that was padding, the calls, and the bucket's latency (what each call paid)."""
        import pandas as pd

        return pd.DataFrame([{"sizes": dict(p.sizes), "bucket": dict(p.bucket), "padding": p.share,
                              "calls": p.calls, "latency_us": self._by_size[p.bucket].latency_us}
                             for p in self._padded.values()],
                            columns=["sizes", "bucket", "padding", "calls", "latency_us"])

    def padding_cost(self):
        """`padded` with the latency of a schedule made for each exact size (made here, so
        this costs a schedule per size) and the padding's overhead: bucket / exact latency."""
        df = self.padded
        exact = []
        for p in self._padded.values():
            m = self._by_size.get(p.sizes) or self._make(p.sizes)
            exact.append(m.latency_us)
        df["exact_latency_us"] = exact
        df["overhead"] = df.latency_us / df.exact_latency_us
        return df

    def _is_bucket(self, sizes) -> bool:
        return bool(self.buckets) and all(v in self.buckets.get(k, (v,)) for k, v in sizes) and any(
            k in self.buckets for k, _ in sizes)

    def _repr_html_(self) -> str:
        return self.html()

    def html(self, *, css: bool = True) -> str:
        from fexplore.viz.page import wrap

        parts = ["<h4>schedules made</h4>", self.made.to_html(classes="fx-table", border=0, index=False)]
        if self._padded:
            parts += ["<h4>calls run padded on a bucket</h4>",
                      self.padded.to_html(classes="fx-table", border=0, index=False)]
        return wrap("".join(parts), css=css)


def kernel_report(sched, res):
    """One row per lowered node that runs (kernels and host ops), in program order.

    Kernels overlap in a schedule, so a kernel's ``cycles`` is its span (from its first command that
    waits on another kernel to its last command's end: weight loads and fills issued ahead do not
    stretch it) and ``share`` is that span over the program's; ``busy_*`` are the cycles
    its commands keep each engine busy. ``roofline_cycles`` is the kernel's own bound (its flops
    at the chip's peak, its DRAM bytes at full bandwidth, its vector work on every lane) and
    ``vs_roofline`` the span over it; ``bound`` names the resource that sets it."""
    import pandas as pd

    from fexplore.npu.commands import Contract, Host, Vector

    prog, cfg = sched.program, sched.program.target
    start, end = res.trace.start, res.trace.end
    total = max(res.cycles, 1)
    owner = sched.kernel_of_command()
    waits = [False] * len(prog.commands)   # depends, directly or not, on another kernel's command
    for c in prog.commands:
        waits[c.id] = any(owner[d] != owner[c.id] or waits[d] for d in c.deps)
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
        # the span starts at its first command that waits (through its dependencies) on another
        # kernel: what comes earlier (weight loads, fills, work on constants) was issued ahead
        own = [c for c in cmds if waits[c.id]] or cmds
        t0 = min(start[c.id] for c in own)
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


# -- what each stage bought, in simulated time ---------------------------------------------------

@dataclass(frozen=True)
class Cost:
    """One graph lowered and scheduled on the target, timing only."""

    cycles: int
    latency_us: float
    dram_bytes: int
    kernels: int
    host_ops: int

    def __str__(self) -> str:
        host = f", {self.host_ops} host ops" if self.host_ops else ""
        return (f"{_fmt_time(self.latency_us)}, DRAM {self.dram_bytes / 1e6:.2f} MB "
                f"({self.kernels} kernels{host})")


@dataclass(frozen=True)
class StageCost:
    """A stage's input and output programs on the chip (``ex["fusion"].cost()``)."""

    stage: str
    before: Cost | None
    after: Cost

    def __str__(self) -> str:
        if self.before is None:
            return f"{self.stage}: {self.after}"
        b, a = self.before, self.after
        return (f"{self.stage}: {_fmt_time(b.latency_us)} → {_fmt_time(a.latency_us)}, "
                f"DRAM {b.dram_bytes / 1e6:.2f} MB → {a.dram_bytes / 1e6:.2f} MB")

    __repr__ = __str__


def _fmt_time(us: float) -> str:
    return f"{us / 1e3:.2f} ms" if us >= 1e3 else f"{us:.1f} us"


_COSTS: dict = {}   # (id(graph), target) -> (graph, Cost); the graph kept so the id stays its own


def graph_cost(graph, options) -> Cost:
    """`graph` (any stage's output) lowered and scheduled like the final one, simulated timing
    only. Before fusion every op is its own kernel, so the difference between stages is what
    each stage bought on the chip. Cached per graph and target."""
    from .stages.lower import lower
    key = (id(graph), repr(options.target), getattr(options, "pe_fusion", 1))
    hit = _COSTS.get(key)
    if hit is not None and hit[0] is graph:
        return hit[1]
    low = lower(graph, options, building="cost").lowering
    from .stages.schedule import schedule_with_fallbacks

    sched, _ = low.made or schedule_with_fallbacks(graph, low, low.chip or options.target, building="cost")
    res = sched.simulate()
    cost = Cost(res.cycles, res.latency_s * 1e6, res.dram_bytes,
                sum(k.how in ("generated", "user") for k in sched.kernels),
                sum(k.how == "host" for k in sched.kernels))
    if len(_COSTS) > 256:
        _COSTS.clear()
    _COSTS[key] = (graph, cost)
    return cost


def stage_costs(records, options):
    """One row per graph stage: the simulated latency and DRAM traffic of its output program,
    and the change from the stage before (the waterfall of what each stage bought)."""
    import pandas as pd

    rows, prev = [], None
    low = next((r.lowering for r in records if r.lowering is not None and r.lowering.chip is not None), None)
    if low is not None and getattr(options, "pe_fusion", 1) == "auto":
        # every stage on the arrangement the compile chose: a row's change is then the stage's
        options = options.replace(pe_fusion=low.chip.fused_pes // options.chip.fused_pes)
    for r in records:
        if r.name == "schedule":   # its program is the lower stage's graph's: no new row
            continue
        if any(not isinstance(d, int) for v in r.after.inputs for d in v.type.shape):
            continue               # symbolic sizes: scheduled per size, not here
        c = graph_cost(r.after, options)
        rows.append({"stage": r.name, "latency_us": c.latency_us, "dram_mb": c.dram_bytes / 1e6,
                     "kernels": c.kernels, "host_ops": c.host_ops, "cycles": c.cycles,
                     "latency_change_us": None if prev is None else c.latency_us - prev.latency_us,
                     "dram_change_mb": None if prev is None else (c.dram_bytes - prev.dram_bytes) / 1e6})
        prev = c
    return pd.DataFrame(rows)
