"""Rendering of ``TwoDoors``: the fused regions each door made, side by side, then the two
graphs' IR text diffed."""

from __future__ import annotations

from .diff_view import side_by_side
from .page import esc, note, section, wrap


def two_doors_html(td) -> str:
    from fexplore.pipeline.onnx.compare import region_lines

    head = ("the same fused regions through both doors" if td.same else
            "the fused regions differ: lines on one side only are regions only that door made")
    body = note(f"after <b>{esc(td.stage)}</b>: {esc(head)}")
    body += side_by_side(region_lines(td.onnx_graph), region_lines(td.torch_graph),
                         headers=("ONNX door", "torch door"))
    body += section("IR of both graphs, diffed",
                    side_by_side(str(td.onnx_graph).splitlines(), str(td.torch_graph).splitlines(),
                                 headers=("ONNX door", "torch door")))
    return wrap(body)
