"""How a kernel shows itself in a notebook: its kernel IR, its SRAM plan, and its timeline.

Rendering only, and only when asked: the timeline picture comes from `fexplore.viz.timeline`, which
imports matplotlib; nothing here is imported by headless runs.
"""

from __future__ import annotations

import html

_MAX_OPS = 60


def _pre(text: str) -> str:
    return f"<pre style='font-size:11px;line-height:1.25'>{html.escape(text)}</pre>"


def timeline_image(timeline, window=None, **kwargs):
    """A timeline as an `IPython.display.Image` (PNG): shows in any notebook, whatever its matplotlib
    backend. `window` = (start, end) cycles zooms in; other arguments go to `Timeline.plot`."""
    import io

    from IPython.display import Image

    buf = io.BytesIO()
    timeline.plot(window, **kwargs).savefig(buf, format="png", dpi=96)
    return Image(data=buf.getvalue(), format="png")


def plan_html(plan) -> str:
    head = ("tile", "space", "type", "bytes each", "buffers per PE", "PEs", "line", "source")
    rows = []
    for r in plan.rows():
        cells = (r["tile"], r["space"], r["type"], f"{r['bytes']:,}", r["buffers"], r["pes"],
                 str(r["line"] or ""), r["source"])
        rows.append("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(str(c))}</td>"
                                     for c in cells) + "</tr>")
    peak = max(plan.peak, default=0)
    caption = (f"SRAM plan on {plan.target.name}: peak {peak:,} of {plan.capacity:,} bytes per PE "
               f"({peak / plan.capacity:.1%}), {len(plan.buffers)} buffers")
    th = "".join(f"<th style='text-align:left'>{h}</th>" for h in head)
    return f"<div><b>{html.escape(caption)}</b><table><tr>{th}</tr>{''.join(rows)}</table></div>"


def lines_html(trace, result, top: int = 8) -> str:
    df = trace.cycles_by_line(result).head(top)
    return "<div><b>busy cycles by kernel line</b>" + df.to_html(index=False) + "</div>"


def trace_html(trace, result=None) -> str:
    from fexplore.viz.timeline import timeline_html  # lazy: matplotlib

    if result is None or result.program is not trace.program():
        result = trace.simulate(functional=False)
    parts = [f"<div><b>{html.escape(repr(trace))}</b></div>",
             _pre(trace.format(max_ops=_MAX_OPS)),
             plan_html(trace.plan),
             f"<div><b>{html.escape(repr(result))}</b></div>",
             timeline_html(result.timeline),
             lines_html(trace, result)]
    return "<div>" + "".join(parts) + "</div>"


def kernel_html(kernel) -> str:
    if kernel.last_trace is None:
        return (f"<div><b>{html.escape(repr(kernel))}</b><br/>not traced yet: call it on arrays "
                f"(<code>{html.escape(kernel.name)}(a, b)</code>) or simulate it to see its kernel IR, "
                f"SRAM plan and timeline.</div>")
    return trace_html(kernel.last_trace, kernel.last_result)
