"""The schedule stage's view: where the time goes on the chip.

- the whole-model timeline as inline SVG: one lane per engine per PE, one bar per kernel on each
  lane it uses (from its first to its last command there), coloured by kernel, hovering shows
  the kernel, its module path and source line and its cycles; ``window=(start, end)`` zooms;
- the per-kernel report (``cm.report()``), slowest first;
- a roofline chart of the kernels and SRAM occupancy over time (matplotlib);
- the stage's decisions: residency, spills, serial fallback.

Rendering only: the numbers come from `pipeline.chip` and the npu simulator.
"""

from __future__ import annotations

import colorsys
import html

from .page import esc, section, table

LANE_H, LABEL_W, WIDTH = 16, 78, 900
ENGINES = ("dma", "tensor", "vector")


def _color(i: int) -> str:
    r, g, b = colorsys.hls_to_rgb((i * 0.618034) % 1.0, 0.62, 0.55)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def kernel_spans(sched, res, window=None) -> list[tuple]:
    """(pe, engine, start, end, kernel index) per kernel per lane it uses."""
    start, end = res.trace.start, res.trace.end
    cmds = sched.program.commands
    spans = []
    for ki, k in enumerate(sched.kernels):
        lanes: dict[tuple[int, int], list[float]] = {}
        for c in k.commands:
            cmd = cmds[c]
            if cmd.engine < 0 or getattr(getattr(cmd, "op", None), "name", "") == "fill":
                continue   # a fill may be issued long before its kernel runs: it would stretch the bar
            s, e = start[c], end[c]
            if window and (e < window[0] or s > window[1]):
                continue
            lane = lanes.setdefault((cmd.pe, cmd.engine), [s, e])
            lane[0], lane[1] = min(lane[0], s), max(lane[1], e)
        spans += [(pe, eng, s, e, ki) for (pe, eng), (s, e) in lanes.items()]
    return spans


def timeline_svg(sched, res, window=None) -> str:
    spans = kernel_spans(sched, res, window)
    if not spans:
        return '<div class="muted">no engine commands</div>'
    lanes = sorted({(pe, eng) for pe, eng, *_ in spans})
    row = {lane: i for i, lane in enumerate(lanes)}
    lo, hi = window if window else (0.0, max(res.cycles, 1))
    scale = (WIDTH - LABEL_W) / max(hi - lo, 1)
    height = LANE_H * len(lanes) + 24
    out = [f'<svg width="{WIDTH}" height="{height}" style="font:10px sans-serif">']
    for (pe, eng), i in row.items():
        y = i * LANE_H
        out.append(f'<text x="2" y="{y + 11}">PE{pe} {ENGINES[eng]}</text>')
    clock = sched.target.clock_hz
    for pe, eng, s, e, ki in spans:
        k = sched.kernels[ki]
        x = LABEL_W + (max(s, lo) - lo) * scale
        w = max(1.0, (min(e, hi) - max(s, lo)) * scale)
        y = row[(pe, eng)] * LANE_H + 1
        where = f"{k.loc.file}:{k.loc.line}" if k.loc is not None and k.loc.line else ""
        tip = (f"{k.name} ({k.kind}, {k.how})\n{k.module or ''} {where}\n"
               f"{ENGINES[eng]} on PE{pe}: {s:,.0f} - {e:,.0f} cycles ({(e - s) / clock * 1e6:.2f} us)")
        out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{LANE_H - 2}" '
                   f'fill="{"#999" if k.how == "host" else _color(ki)}" stroke="white" stroke-width="0.3">'
                   f'<title>{html.escape(tip)}</title></rect>')
        if w > 7 * len(k.name) * 0.6:
            out.append(f'<text x="{x + 2:.1f}" y="{y + 11}" fill="#111" pointer-events="none">'
                       f'{html.escape(k.name)}</text>')
    y = len(lanes) * LANE_H + 14
    out.append(f'<text x="{LABEL_W}" y="{y}">{lo:,.0f}</text>'
               f'<text x="{WIDTH - 4}" y="{y}" text-anchor="end">{hi:,.0f} cycles</text>')
    out.append("</svg>")
    return "".join(out)


def roofline_figure(report, target):
    """Each kernel as a point: arithmetic intensity (flops per DRAM byte) against achieved flops
    per cycle, under the chip's roof (tensor peak, DRAM bandwidth)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 3.4))
    ax = fig.add_subplot()
    peak = target.macs_per_cycle("bf16") * 2 * target.num_pes
    bw = target.dram_bytes_per_cycle
    ks = report[(report.flops > 0) & (report.dram_bytes > 0) & (report.cycles > 0)]
    if len(ks):
        ai = ks.flops / ks.dram_bytes
        ax.scatter(ai, ks.flops / ks.cycles, s=14, color="#E45756")
        xs = [min(ai.min(), peak / bw) / 4, max(ai.max(), peak / bw) * 4]
        ax.plot(xs, [min(peak, x * bw) for x in xs], color="#333", lw=1)
        ax.plot([peak / bw], [peak], marker="|", color="#333")
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("flops per DRAM byte")
    ax.set_ylabel("flops per cycle")
    ax.set_title("kernels under the roofline (bf16 peak)", fontsize=9)
    fig.tight_layout()
    return fig


def sram_figure(timeline, target):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 2.6))
    ax = fig.add_subplot()
    for pe, steps in timeline.sram_occupancy().items():
        if steps and max(b for _, b in steps) > 0:
            xs = [t for t, _ in steps]
            ax.step(xs, [b / 2**20 for _, b in steps], where="post", lw=0.8, label=f"PE{pe}")
    ax.axhline(target.sram_bytes_per_pe / 2**20, color="#999", ls="--", lw=0.8)
    ax.set_xlabel("cycles")
    ax.set_ylabel("SRAM live (MiB)")
    ax.set_title("SRAM occupancy per PE", fontsize=9)
    fig.tight_layout()
    return fig


def schedule_html(sched, report, res, *, window=None, top: int = 15) -> str:
    from .timeline import figure_html

    parts = []
    head = (f"<div>{len(sched.program.commands):,} commands on {esc(sched.target.name)}: "
            f"<b>{res.latency_s * 1e6:,.1f} us</b> ({res.cycles:,} cycles), "
            f"DRAM {res.dram_bytes / 1e6:.2f} MB, roofline bound {res.roofline.bound_cycles:,.0f} cycles "
            f"({esc(res.roofline.limiter)})</div>")
    if sched.decisions:
        head += "<ul>" + "".join(f"<li><b>{esc(w)}</b>: {esc(why)}</li>" for w, why in sched.decisions) + "</ul>"
    parts.append(head)
    parts.append(section("timeline (hover a bar: kernel, module, line)", timeline_svg(sched, res, window), open=True))
    df = report.sort_values("cycles", ascending=False).head(top)
    rows = [[esc(r.kernel), esc(r.kind), esc(r.how), esc(r.module), f"{r.cycles:,.0f}", f"{r.share:.0%}",
             f"{r.flops:,}", f"{r.dram_bytes:,}", esc(r.bound), f"{r.vs_roofline:.1f}x"]
            for r in df.itertuples()]
    parts.append(section(f"kernels, slowest first (top {len(rows)} of {len(report)})",
                         table(["kernel", "kind", "how", "module", "cycles", "share", "flops", "DRAM bytes",
                                "bound", "vs roofline"], rows), open=True))
    try:
        charts = figure_html(roofline_figure(report, sched.target)) + \
            figure_html(sram_figure(res.timeline, sched.target))
    except ImportError:  # matplotlib missing: the tables still say it all
        charts = '<div class="muted">matplotlib is not installed: no charts</div>'
    parts.append(section("roofline and SRAM", charts, open=False))
    return "".join(parts)
