"""Two doors, one graph: the fused regions of a compile through the ONNX door against those of
the same model through the torch door, as a diff a person can read (``TwoDoors`` renders in a
notebook; ``str`` and ``diff`` are the text)."""

from __future__ import annotations

import collections


def region_signatures(g) -> collections.Counter:
    """Each fused region as (kind, the sorted ops of its body), counted."""
    out: collections.Counter = collections.Counter()
    for n in g.nodes:
        if n.op.name == "region":
            out[(n.attrs["kind"], tuple(sorted(m.op.name for m in n.regions[0].nodes)))] += 1
    return out


def region_lines(g) -> list[str]:
    """One line per kind of fused region, sorted: ``2x attention: matmul, softmax, ...``."""
    return [f"{n}x {kind}: {', '.join(ops)}" for (kind, ops), n in
            sorted(region_signatures(g).items())]


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


class TwoDoors:
    """The same model's graphs after ``stage`` through both doors: ``same`` (equal fused
    regions), ``diff`` (the regions only one door made), and in a notebook the regions side by
    side and the two graphs' IR diffed."""

    def __init__(self, onnx_graph, torch_graph, stage: str = "fusion"):
        self.onnx_graph, self.torch_graph, self.stage = onnx_graph, torch_graph, stage

    @property
    def diff(self) -> str | None:
        return regions_diff(self.onnx_graph, self.torch_graph)

    @property
    def same(self) -> bool:
        return self.diff is None

    def __str__(self) -> str:
        d = self.diff
        return (f"after {self.stage}: " + ("the same fused regions through both doors" if d is None
                                          else f"the fused regions differ\n{d}"))

    def __repr__(self) -> str:
        return f"<TwoDoors after {self.stage}: {'same regions' if self.same else 'regions differ'}>"

    def _repr_html_(self) -> str:
        from fexplore.viz.two_doors_view import two_doors_html

        return two_doors_html(self)


def two_doors(onnx_model, torch_model, example_inputs, *, stage: str = "fusion", **options):
    """Explore ``torch_model`` and its ONNX export ``onnx_model`` (a ModelProto or a path) on
    the same inputs up to ``stage`` and compare them."""
    import fexplore
    from fexplore.pipeline.driver import _as_numpy

    inputs = tuple(example_inputs)
    onnx_rec = fexplore.explore(onnx_model, [_as_numpy(x) for x in inputs], **options)[stage]
    torch_rec = fexplore.explore(torch_model, inputs, **options)[stage]
    return TwoDoors(onnx_rec.after, torch_rec.after, stage)
