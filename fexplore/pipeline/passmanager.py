"""The pass manager: runs stages in order and calls a hook between them.

The hook is what feeds verification, progress bars and the explorer's views; a stage knows nothing
about notebooks or about being checked.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from fexplore.ir import Graph

from .stage import Stage, StageRecord, graph_stats

Hook = Callable[[StageRecord], None]


class PassManager:
    def __init__(self, stages: Sequence[Stage], hooks: Sequence[Hook] = ()):
        self.stages = list(stages)
        self.hooks = list(hooks)

    def run_stage(self, stage: Stage, graph: Graph, options, lowering=None) -> StageRecord:
        t0 = time.perf_counter()
        result = stage.run(graph, options, lowering=lowering) if stage.uses_lowering \
            else stage.run(graph, options)
        elapsed = time.perf_counter() - t0
        stats = {"nodes_before": len(graph.nodes), **graph_stats(result.graph), **result.stats}
        record = StageRecord(stage.name, graph, result.graph, stats, result.rewrites, None, elapsed,
                             result.summary, result.lowering, result.schedule, options)
        self.notify(record)
        return record

    def notify(self, record: StageRecord) -> None:
        for hook in self.hooks:
            hook(record)

    def run(self, graph: Graph, options) -> list[StageRecord]:
        records = []
        for stage in self.stages:
            rec = self.run_stage(stage, graph, options, records[-1].lowering if records else None)
            records.append(rec)
            graph = rec.after
        return records
