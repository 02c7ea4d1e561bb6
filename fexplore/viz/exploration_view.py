"""The pipeline overview: one row per stage (done, next or pending), what it changed, key stats.

Shown by ``Exploration._repr_html_``, at the top of the stepper and in the compiled model's view.
"""

from __future__ import annotations

from .page import esc, fmt_seconds, table, wrap
from .stage_view import key_stats, verification_text


def stage_row(rec) -> dict:
    """One stage that has run, as plain values (the DataFrame and the HTML table share it)."""
    before = len(rec.before.nodes) if rec.before is not None else None
    v = rec.verification
    n = v.numeric if v is not None else None
    return {
        "stage": rec.name,
        "status": "done",
        "changed": rec.changed,
        "nodes_before": before,
        "nodes_after": len(rec.after.nodes),
        "rewrites": len(rec.rewrites),
        "ok": None if v is None else v.ok,
        "max_abs_err": None if n is None else n.max_abs,
        "elapsed_s": rec.elapsed_s,
        "key_stats": format_stats(key_stats(rec.stats)),
    }


def overview_rows(ex) -> list[dict]:
    done = {r.name: r for r in ex.records}
    rows = []
    for i, name in enumerate(ex.stage_names):
        if name in done:
            rows.append(stage_row(done[name]))
        else:
            status = "next" if i == len(ex.records) else "pending"
            rows.append({"stage": name, "status": status})
    return rows


def overview_frame(ex, *, costs: bool = False):
    """The overview as a pandas DataFrame (``Exploration.overview()``); with ``costs`` also each
    stage's output program's simulated latency and DRAM traffic on the target."""
    import pandas as pd

    cols = ["stage", "status", "changed", "nodes_before", "nodes_after", "rewrites", "ok",
            "max_abs_err", "elapsed_s", "key_stats"]
    df = pd.DataFrame(overview_rows(ex), columns=cols)
    if costs:
        c = ex.costs()[["stage", "latency_us", "dram_mb", "latency_change_us"]]
        df = df.merge(c, on="stage", how="left")
    return df


def overview_table(ex, *, current: str | None = None) -> str:
    """The overview as an HTML table; ``current`` is marked (the stepper's selection)."""
    done = {r.name: r for r in ex.records}
    rows = []
    for row in overview_rows(ex):
        name = row["stage"]
        label = f"<b>{esc(name)}</b>" if name == current else esc(name)
        if name == current:
            label = "▶ " + label
        if row["status"] != "done":
            rows.append([label, f'<span class="muted">{row["status"]}</span>', "", "", "", "", ""])
            continue
        rec = done[name]
        before = "–" if row["nodes_before"] is None else row["nodes_before"]
        changed = "yes" if row["changed"] else '<span class="muted">no</span>'
        rows.append([label, "done", changed, f"{before} → {row['nodes_after']}",
                     verification_text(rec.verification), esc(fmt_seconds(rec.elapsed_s)),
                     esc(row["key_stats"])])
    return table(["stage", "status", "changed", "nodes", "verification", "time", "key stats"], rows)


def exploration_html(ex, *, css: bool = True) -> str:
    done = len(ex.records)
    total = len(ex.stage_names)
    head = (f'<div class="fx-head"><span class="fx-name">exploration of '
            f"{esc(type(ex.model).__name__)}</span><span>{done} of {total} stages run</span></div>")
    hint = ('<div class="muted"><code>ex.step()</code> runs the next stage, '
            '<code>ex["name"]</code> runs up to a stage and shows it, '
            "<code>ex.widget()</code> opens the stepper, <code>ex.result</code> is the "
            "compiled model</div>")
    return wrap(head + overview_table(ex) + hint, css=css)


def format_stats(stats: dict) -> str:
    """``constants_folded 10 · rules_fired dce 2, cse 1``: compact, for one table cell."""
    parts = []
    for k, v in stats.items():
        if isinstance(v, dict):
            v = ", ".join(f"{a} {b}" for a, b in v.items()) or "–"
        elif isinstance(v, float):
            v = f"{v:.3g}"
        parts.append(f"{k} {v}")
    return " · ".join(parts)
