"""Two doors, one graph: the fused regions of a compile through the ONNX door against those of
the same model through the torch door, as a diff a person can read."""

from __future__ import annotations

import collections


def region_signatures(g) -> collections.Counter:
    """Each fused region as (kind, the sorted ops of its body), counted."""
    out: collections.Counter = collections.Counter()
    for n in g.nodes:
        if n.op.name == "region":
            out[(n.attrs["kind"], tuple(sorted(m.op.name for m in n.regions[0].nodes)))] += 1
    return out


def regions_diff(onnx_graph, torch_graph) -> str | None:
    """None when both graphs have the same fused regions; else the regions only one door made,
    one per line (``- onnx`` / ``+ torch``)."""
    a, b = region_signatures(onnx_graph), region_signatures(torch_graph)
    if a == b:
        return None
    lines = []
    for sig, n in sorted((a - b).items()):
        lines.append(f"- onnx  {n}x {sig[0]}: {', '.join(sig[1])}")
    for sig, n in sorted((b - a).items()):
        lines.append(f"+ torch {n}x {sig[0]}: {', '.join(sig[1])}")
    return "\n".join(lines)
