"""The stage view: what one stage did, as ``StageRecord._repr_html_`` shows it.

A header (stage, nodes before → after, wall time, verification with its max error), then the diff
against the stage before, the graph, the IR text with the user's source lines, and the stage's
statistics as a pandas table. Sections fold (``<details>``), so the view stays short until opened.
"""

from __future__ import annotations

import re

from .diff_view import diff_html
from .graph_view import GraphView
from .page import esc, fmt_seconds, mark, section, wrap

VIEWS = ("diff", "graph", "ir", "stats")

# Generic graph statistics every stage repeats; the overview tables show only what is particular
# to a stage (fused_regions, constants_folded, ...).
GENERIC_STATS = {"nodes", "nodes_before", "constants", "constant_bytes", "symbols",
                 "ops_by_category"}


def stage_html(rec, *, css: bool = True, views=VIEWS) -> str:
    """The whole stage view. ``views`` picks the sections (the stepper shows one at a time)."""
    parts = [header_html(rec)]
    parts.append(verification_html(rec))
    for view in views:
        parts.append(section(SECTION_TITLES[view], view_html(rec, view), open=_opens(rec, view)))
    sched = getattr(rec, "schedule", None)  # the schedule stage: where the time goes
    low = getattr(rec, "lowering", None)  # the lower stage carries its kernels
    if sched is not None:
        from fexplore.pipeline.chip import kernel_report

        from .schedule_view import schedule_html

        res = sched.simulate()
        parts.append(section("on the chip", schedule_html(sched, kernel_report(sched, res), res), open=True))
    elif getattr(rec, "schedules", None) is not None:   # symbolic dims: one schedule per size
        parts.append(section("schedules per size", rec.schedules.html(css=False), open=True))
    if low is not None and sched is None:
        from .lower_view import lowering_html

        parts.append(section("kernels", lowering_html(low), open=True))
    tl = getattr(rec, "timeline", None)  # scheduled stages carry one
    if tl is not None:
        from .timeline import timeline_html

        parts.append(section("timeline", timeline_html(tl), open=True))
    return wrap("".join(parts), css=css)


SECTION_TITLES = {"diff": "diff against the previous stage", "graph": "graph",
                  "ir": "IR text, with source lines", "stats": "statistics"}


def _opens(rec, view: str) -> bool:
    if view == "diff":
        return rec.before is not None and rec.changed
    return view == "graph"


def view_html(rec, view: str) -> str:
    """One view of a stage, without the stylesheet: "diff", "graph", "ir" or "stats"."""
    if view == "diff":
        return diff_html(rec.before, rec.after, rewrites=rec.rewrites, css=False)
    if view == "graph":
        low = getattr(rec, "lowering", None)
        if low is not None:   # the lowered program: each node says what it became, host ops stand out
            from .graph_view import lowering_marks

            return GraphView(rec.after, marks=lowering_marks(low)).html(css=False)
        return GraphView(rec.after).html(css=False)
    if view == "ir":
        return ir_html(str(rec.after))
    if view == "stats":
        return stats_frame(rec.stats).to_html(classes="fx-table", border=0)
    raise ValueError(f"unknown view {view!r}; one of {', '.join(VIEWS)}")


def header_html(rec) -> str:
    before = len(rec.before.nodes) if rec.before is not None else "–"
    items = [f'<span class="fx-name">{esc(rec.name)}</span>',
             f"<span>nodes {before} → {len(rec.after.nodes)}</span>",
             f"<span>{esc(fmt_seconds(rec.elapsed_s))}</span>",
             f"<span>{verification_text(rec.verification)}</span>"]
    if rec.rewrites:
        items.append(f"<span>{len(rec.rewrites)} rewrite(s)</span>")
    if rec.before is not None and not rec.changed:
        items.append('<span class="muted">no change</span>')
    head = f'<div class="fx-head">{"".join(items)}</div>'
    summary = getattr(rec, "summary", "")
    return head + (f'<div class="muted">{esc(summary)}</div>' if summary else "")


def verification_text(v) -> str:
    """``✓ max abs 1.2e-07, rel 3.4e-06`` as HTML; the check a header shows."""
    if v is None:
        return '<span class="muted">not verified</span>'
    if not v.structural_ok:
        return f"{mark(False)} invalid IR"
    n = v.numeric
    if n is None:
        return f"{mark(True)} structure (numerics not checked)"
    text = f"{mark(n.ok)} max abs {n.max_abs:.1e}, rel {n.max_rel:.1e}"
    k = getattr(v, "kernels", None)
    if k is not None:
        text += f"; {mark(k.ok)} kernels ({k.kernels_run} distinct run)"
    return text


def verification_html(rec) -> str:
    """Nothing when the stage verified; the verifier's or the numeric check's story when not."""
    v = rec.verification
    if v is None or v.ok:
        return ""
    if not v.structural_ok:
        return section("verification failed: invalid IR", f"<pre>{esc(v.structural_error)}</pre>",
                       open=True)
    n = v.numeric
    k = getattr(v, "kernels", None)
    if k is not None and not k.ok and (n is None or n.ok):
        return section("verification failed: a kernel is wrong",
                       f"<pre>{esc(k.detail or '')}</pre>", open=True)
    lines = [n.detail or "", f"tolerance: {n.tolerance}", f"input sets: {n.input_sets}"]
    if n.first_divergent:
        lines.append(f"first divergent node: {n.first_divergent}")
    return section("verification failed: numbers changed",
                   f"<pre>{esc(chr(10).join(x for x in lines if x))}</pre>", open=True)


_SOURCE = re.compile(r'^\s*source (f\d+) = "(.*)"$')
_LOC = re.compile(r" loc\((f\d+):(\d+)")


def ir_html(text: str) -> str:
    """IR text with each node's source line after it, as a comment."""
    import json
    import linecache

    files: dict[str, str] = {}
    out = []
    for line in text.splitlines():
        m = _SOURCE.match(line)
        if m:
            files[m.group(1)] = json.loads(f'"{m.group(2)}"')
        src = ""
        m = _LOC.search(line)
        if m and m.group(1) in files:
            code = linecache.getline(files[m.group(1)], int(m.group(2))).strip()
            if code:
                src = f'<span class="fx-src">  # {esc(code)}</span>'
        out.append(esc(line) + src)
    return f'<div class="fx-scroll"><pre>{chr(10).join(out)}</pre></div>'


def stats_frame(stats: dict):
    """A stage's statistics as a one-column pandas table; nested dicts become dotted rows."""
    import pandas as pd

    flat: dict[str, object] = {}

    def put(prefix, value):
        if isinstance(value, dict) and value and prefix != "symbols":
            for k, v in value.items():
                put(f"{prefix}.{k}", v)
        else:
            flat[prefix] = str(value) if isinstance(value, (dict, list, tuple)) else value

    for k, v in stats.items():
        put(k, v)
    return pd.DataFrame({"value": pd.Series(flat, dtype=object)}).rename_axis("statistic")


def key_stats(stats: dict) -> dict:
    """The statistics particular to a stage (what the overview tables show)."""
    return {k: v for k, v in stats.items()
            if k not in GENERIC_STATS and not k.endswith("_s")}  # *_s are timings
