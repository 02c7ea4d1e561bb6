"""Stages and their records.

A stage takes a graph and returns a new one; it never edits its input, so every snapshot stays
available for stepping back and diffing. What a stage did is a ``StageRecord``: input, output, wall
time, statistics, the rewrites it made (which rule fired on which nodes) and its verification.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from fexplore.ir import Category, Graph


@dataclass(frozen=True)
class Rewrite:
    """One rule firing: ``rule`` rewrote ``nodes`` (value names in the input graph) into
    ``result`` (value names in the output graph)."""

    rule: str
    nodes: tuple[str, ...]
    result: tuple[str, ...] = ()


@dataclass
class StageResult:
    graph: Graph
    stats: dict[str, Any] = field(default_factory=dict)
    rewrites: list[Rewrite] = field(default_factory=list)
    summary: str = ""  # one line on what the stage did, in its own words
    lowering: Any = None  # the lower stage's kernels (stages/lower.py: Lowering)
    schedule: Any = None  # the schedule stage's whole-model program (stages/schedule.py: Schedule)


@dataclass
class Stage:
    """A named graph-to-graph step. ``run(graph, options) -> StageResult``."""

    name: str
    run: Callable[[Graph, Any], StageResult]
    doc: str = ""
    uses_lowering: bool = False  # run(graph, options, lowering=<the previous stage's Lowering>)
    # the compile options (field names) its result depends on: an exploration forked with other
    # values of none of them shares this stage's record (driver.Exploration.fork); None, a stage
    # of one's own that did not say, is taken to read them all. A test holds the stages to theirs.
    reads: frozenset | None = None


@dataclass
class NumericCheck:
    """How far a stage's graph, run by the interpreter, is from PyTorch eager."""

    max_abs: float
    max_rel: float
    ok: bool
    input_sets: int
    tolerance: str
    first_divergent: str | None = None  # the first node whose value left the previous stage's
    detail: str | None = None
    eager_noise: float = 0.0  # eager's own f32 error (vs an f64 run): what max_abs compares to
    export_differs: bool = False  # ingest: torch's exported program, run by torch, misses eager too


@dataclass
class Verification:
    structural_ok: bool
    structural_error: str | None
    numeric: NumericCheck | None
    kernels: Any = None  # the lower stage: its program run the chip way (stages/lower.py)

    @property
    def ok(self) -> bool:
        return self.structural_ok and (self.numeric is None or self.numeric.ok) \
            and (self.kernels is None or self.kernels.ok)

    def summary(self) -> str:
        if not self.structural_ok:
            return "✗ invalid IR"
        if self.numeric is None:
            return "✓ structure (numerics not checked)"
        n = self.numeric
        mark = "✓" if n.ok else "✗"
        if self.kernels is not None and not self.kernels.ok:
            mark = "✗"
        return f"{mark} max abs err {n.max_abs:.2e}, max rel err {n.max_rel:.2e}"


@dataclass
class StageRecord:
    name: str
    before: Graph | None
    after: Graph
    stats: dict[str, Any]
    rewrites: list[Rewrite]
    verification: Verification | None
    elapsed_s: float
    summary: str = ""
    lowering: Any = None  # the lower stage's Lowering: its kernels, free views and host ops
    schedule: Any = None  # the schedule stage's Schedule: the whole-model NPU program
    options: Any = None   # the compile's options (what cost() lowers and schedules with)
    schedules: Any = None  # the schedule stage: the CompiledModel's schedules per size (chip.Schedules)

    def cost(self):
        """This stage's input and output programs lowered, scheduled and simulated on the
        target (timing only): ``StageCost(before, after)``, e.g. what fusion bought."""
        from .chip import StageCost, graph_cost

        if self.options is None:
            raise ValueError("this record was not made by a compile: it has no target to cost on")
        before = graph_cost(self.before, self.options) if self.before is not None else None
        return StageCost(self.name, before, graph_cost(self.after, self.options))

    @property
    def changed(self) -> bool:
        return self.before is None or self.before != self.after

    def diff(self) -> str:
        """A unified diff of the IR text before and after (the explorer renders it side by side)."""
        import difflib

        a = str(self.before).splitlines() if self.before is not None else []
        b = str(self.after).splitlines()
        return "\n".join(difflib.unified_diff(a, b, f"before {self.name}", f"after {self.name}",
                                              lineterm=""))

    def graph(self) -> Graph:
        return self.after

    def __repr__(self) -> str:
        v = self.verification.summary() if self.verification else "not verified"
        before = len(self.before.nodes) if self.before is not None else "-"
        return (f"<StageRecord {self.name}: nodes {before} -> {len(self.after.nodes)}, "
                f"{self.elapsed_s * 1e3:.0f} ms, {v}>")

    def _repr_html_(self) -> str:
        try:
            from fexplore.viz.stage_view import stage_html
        except ImportError:
            import html

            return f"<pre>{html.escape(repr(self))}</pre><pre>{html.escape(str(self.after))}</pre>"
        return stage_html(self)


def graph_stats(g: Graph) -> dict[str, Any]:
    """The statistics every stage reports about its output graph."""
    by_cat: dict[str, int] = {c.value: 0 for c in Category}
    for n in g.walk():
        by_cat[n.op.category.value] += 1
    const_bytes = sum(int(c.payload.nbytes) for c in g.constants if c.payload is not None)
    return {
        "nodes": len(g.nodes),
        "constants": len(g.constants),
        "constant_bytes": const_bytes,
        "symbols": dict(g.symbols),
        "ops_by_category": {k: v for k, v in by_cat.items() if v},
    }
