"""Timelines as pictures: a matplotlib Gantt chart with one lane per engine per PE.

Rendering only. `fexplore.npu.Timeline` and `SimResult` call in here from their `_repr_html_`, so
matplotlib is imported when a notebook shows a timeline and never in headless runs. No pyplot:
figures are built directly, so nothing leaks between notebook cells.
"""

from __future__ import annotations

import base64
import math
import html
import io

ENGINE_COLORS = {"dma": "#4C78A8", "tensor": "#E45756", "vector": "#54A24B"}


def plot_timeline(timeline, window: tuple[float, float] | None = None, *, ax=None,
                  figsize: tuple[float, float] | None = None, pes=None, title: str | None = None):
    """Draw `timeline` (a `fexplore.npu.Timeline`) as a Gantt chart; returns the matplotlib Figure.

    window: (start, end) in cycles to zoom into; pes: which PEs to show (default: those with work).
    """
    from matplotlib.figure import Figure

    events = timeline.window(*window) if window else timeline.events
    used = sorted({e.pe for e in timeline.events}) or [0]
    pes = list(pes) if pes is not None else used
    lanes = [(pe, engine) for pe in pes for engine in ENGINE_COLORS]
    row = {lane: i for i, lane in enumerate(lanes)}
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {lane: [] for lane in lanes}
    for e in events:
        if (e.pe, e.engine) in bars:
            bars[(e.pe, e.engine)].append((e.start, e.end - e.start))

    if ax is None:
        fig = Figure(figsize=figsize or (11, 0.9 + 0.32 * len(lanes)))
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    for lane, spans in bars.items():
        if spans:
            ax.broken_barh(spans, (row[lane] - 0.4, 0.8), facecolors=ENGINE_COLORS[lane[1]],
                           edgecolors="white", linewidth=0.3)
    ax.set_yticks(range(len(lanes)), [f"PE{pe} {engine}" for pe, engine in lanes], fontsize=8)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    lo, hi = window if window else (0, max(timeline.makespan, 1))
    ax.set_xlim(lo, hi)
    ax.set_xlabel("cycles")
    ax.grid(axis="x", alpha=0.3)
    for i in range(3, len(lanes), 3):
        ax.axhline(i - 0.5, color="#999999", linewidth=0.5)
    name = timeline.program.name
    cycles = math.ceil(timeline.makespan - 1e-6)
    ax.set_title(title or f"{name} on {timeline.program.target.name}: {cycles:,} cycles", fontsize=10)
    fig.tight_layout()
    return fig


def figure_html(fig, fmt: str = "png") -> str:
    """Inline HTML for a Figure: an <img> with base64 PNG, or raw SVG."""
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=96 if fmt == "png" else None)
    if fmt == "svg":
        return buf.getvalue().decode()
    data = base64.b64encode(buf.getvalue()).decode()
    return f'<img src="data:image/png;base64,{data}" style="max-width:100%"/>'


def timeline_html(timeline, window=None, fmt: str = "png") -> str:
    if len(timeline) == 0:
        return f"<pre>{html.escape(repr(timeline))}</pre>"
    return figure_html(plot_timeline(timeline, window=window), fmt)


def sim_result_html(result) -> str:
    """A summary table (cycles, latency, utilization, roofline, memory) above the Gantt chart."""
    r = result.roofline
    rows = [("cycles", f"{result.cycles:,}"), ("latency", f"{result.latency_s * 1e6:,.3f} µs")]
    rows += [(f"{e} busy", f"{u:.1%}") for e, u in result.utilization.items()]
    rows += [("roofline bound", f"{r.bound_cycles:,.0f} cycles ({r.limiter})"),
             ("achieved / bound", f"{r.ratio:.1%}"),
             ("DRAM bytes moved", f"{result.dram_bytes:,}"),
             ("SRAM peak per PE", ", ".join(f"{b:,}" for b in result.sram_peak))]
    table = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                    for k, v in rows)
    head = html.escape(f"{result.program.name} on {result.target.name}"
                       + (" (functional)" if result.functional else ""))
    return f"<div><b>{head}</b><table>{table}</table>{timeline_html(result.timeline)}</div>"


def cost_waterfall(costs, *, figsize: tuple[float, float] = (9, 3.2)):
    """A waterfall of simulated latency over the stages (``cm.costs()`` / ``ex.costs()``): the
    first bar is the ingested program's latency, each next bar what that stage added (red) or
    saved (green), with DRAM traffic as a line on the second axis. Returns the Figure."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    ax = fig.add_subplot()
    names = list(costs["stage"])
    lat = list(costs["latency_us"])
    prev = 0.0
    for i, (name, value) in enumerate(zip(names, lat)):
        delta = value - prev
        color = "#4C78A8" if i == 0 else ("#54A24B" if delta <= 0 else "#E45756")
        ax.bar(i, delta if i else value, bottom=prev if i else 0.0, color=color, width=0.6)
        if i:
            ax.text(i, max(prev, value), f"{delta:+.1f}", ha="center", va="bottom", fontsize=7)
        prev = value
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("simulated latency (us)")
    ax2 = ax.twinx()
    ax2.plot(range(len(names)), list(costs["dram_mb"]), color="#333", marker="o", lw=1)
    ax2.set_ylabel("DRAM traffic (MB)")
    ax.set_title("what each stage bought on the chip", fontsize=9)
    fig.tight_layout()
    return fig
