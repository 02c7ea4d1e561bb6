"""The compiled model's view: the verification table, stage timings, and what each stage changed.

``CompiledModel._repr_html_`` shows it; the HTML report (``report.py``) puts it on top.
"""

from __future__ import annotations

from .diff_view import structural_changes
from .exploration_view import format_stats
from .graph_view import GraphView
from .page import esc, fmt_seconds, mark, section, table, wrap
from .stage_view import key_stats


def compiled_html(cm, *, css: bool = True, graph: bool = True) -> str:
    g = cm.graph
    ok = all(r.verification is None or r.verification.ok for r in cm.stages)
    total = sum(r.elapsed_s for r in cm.stages)
    head = (f'<div class="fx-head"><span class="fx-name">compiled @{esc(g.name)}</span>'
            f"<span>{len(cm.stages)} stages</span><span>{len(g.nodes)} nodes</span>"
            f"<span>target {esc(cm.options.chip.name)}</span>"
            f"<span>precision {esc(cm.options.precision)}</span>"
            f"<span>{esc(fmt_seconds(total))}</span>"
            f"<span>verification {mark(ok)}</span></div>")
    parts = [head, "<h3>verification</h3>", verification_table(cm),
             "<h3>stages</h3>", stages_table(cm)]
    if graph:
        parts.append(section(f"final graph ({len(g.nodes)} nodes)", GraphView(g).html(css=False)))
    return wrap("".join(parts), css=css)


def verification_table(cm) -> str:
    """``cm.verification`` with marks instead of booleans."""
    rows = []
    for r in cm.stages:
        v = r.verification
        n = v.numeric if v is not None else None
        rows.append([esc(r.name), mark(None if v is None else v.structural_ok),
                     "–" if n is None else f"{n.max_abs:.2e}", "–" if n is None else f"{n.max_rel:.2e}",
                     "–" if n is None else str(n.input_sets), "–" if n is None else esc(n.tolerance),
                     mark(None if v is None else v.ok)])
    return table(["stage", "structure", "max abs err", "max rel err", "input sets", "tolerance",
                  "ok"], rows)


def stages_table(cm) -> str:
    """One row per stage: time, nodes, what changed (by rule) and the stage's own statistics."""
    rows = []
    for r in cm.stages:
        if r.before is None:
            changes = f"creates the graph ({len(r.after.nodes)} nodes)"
        elif not r.changed:
            changes = '<span class="muted">no change</span>'
        else:
            c = structural_changes(r.before, r.after)
            bits = [f"{len(x)} {label}" for label, x in
                    (("removed", c.removed), ("added", c.added), ("changed", c.changed)) if x]
            if c.regions:
                bits.append(f"{len(c.fused)} fused into {len(c.regions)} regions")
            changes = esc(", ".join(bits) or "attributes or types only")
        rules: dict[str, int] = {}
        for rw in r.rewrites:
            rules[rw.rule] = rules.get(rw.rule, 0) + 1
        by_rule = ", ".join(f"{k} ×{v}" for k, v in sorted(rules.items(), key=lambda kv: -kv[1]))
        before = len(r.before.nodes) if r.before is not None else "–"
        rows.append([esc(r.name), esc(fmt_seconds(r.elapsed_s)), f"{before} → {len(r.after.nodes)}",
                     changes, f'<span class="fx-code">{esc(by_rule)}</span>',
                     esc(format_stats(key_stats(r.stats)))])
    return table(["stage", "time", "nodes", "changes", "rules fired", "key stats"], rows)
