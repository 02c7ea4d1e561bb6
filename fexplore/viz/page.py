"""The building blocks every view shares: one stylesheet, escaping, small formatters, sections.

Every view returns a plain HTML fragment wrapped in ``<div class="fx">``; the stylesheet is scoped
to that class so a view never restyles the notebook around it. Nothing here runs JavaScript: an
output must render the same in JupyterLab, in a saved notebook, and in the offline HTML report.
"""

from __future__ import annotations

import html
import os

from fexplore.ir import Category

# Fill colors of graph nodes and legend chips, one per op category.
CATEGORY_COLORS = {
    Category.elementwise: "#d9f2d9",
    Category.broadcast: "#e8ecf2",
    Category.reduction: "#fde2c4",
    Category.contraction: "#f7c6c0",
    Category.movement: "#d6e6f7",
    Category.opaque: "#e6d9f2",
    Category.region: "#fff6cc",
}

CSS = """
<style>
.fx { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; font-size: 13px;
      line-height: 1.4; color: #222; }
.fx h3 { font-size: 15px; margin: 4px 0; }
.fx .fx-head { display: flex; flex-wrap: wrap; gap: 14px; align-items: baseline;
               padding: 6px 10px; background: #f4f6f9; border-left: 4px solid #4c78a8; }
.fx .fx-head .fx-name { font-weight: 700; font-size: 15px; }
.fx .ok { color: #1a7f37; font-weight: 600; } .fx .bad { color: #c62828; font-weight: 600; }
.fx .muted { color: #777; }
.fx details { margin: 6px 0; } .fx summary { cursor: pointer; font-weight: 600; }
.fx pre, .fx .fx-code { font-family: Menlo, Consolas, "DejaVu Sans Mono", monospace; font-size: 12px; }
.fx pre { margin: 0; padding: 6px; background: #fafafa; overflow-x: auto; }
.fx table.fx-table { border-collapse: collapse; margin: 4px 0; }
.fx table.fx-table th, .fx table.fx-table td { border: 1px solid #ddd; padding: 2px 8px;
   text-align: left; vertical-align: top; }
.fx table.fx-table th { background: #f4f6f9; }
.fx table.fx-table td { white-space: nowrap; } .fx table.fx-table td:last-child { white-space: normal; }
.fx .fx-scroll { max-height: 640px; overflow: auto; border: 1px solid #eee; }
.fx .fx-legend span { display: inline-block; padding: 0 6px; margin-right: 4px; border: 1px solid #ccc;
   border-radius: 3px; font-size: 11px; }
.fx .fx-note { padding: 6px 10px; background: #fff4e5; border-left: 4px solid #f0a030; margin: 4px 0; }
.fx table.fx-diff { border-collapse: collapse; width: 100%; table-layout: fixed; }
.fx table.fx-diff td { font-family: Menlo, Consolas, "DejaVu Sans Mono", monospace; font-size: 12px;
   white-space: pre-wrap; word-break: break-all; padding: 0 4px; vertical-align: top; }
.fx table.fx-diff td.ln { width: 3.5em; color: #999; text-align: right; user-select: none; }
.fx table.fx-diff td.del { background: #ffeef0; } .fx table.fx-diff td.add { background: #e6ffed; }
.fx table.fx-diff td.chg-a { background: #ffeef0; } .fx table.fx-diff td.chg-b { background: #e6ffed; }
.fx table.fx-diff td.empty { background: #f6f6f6; }
.fx table.fx-diff td.mv { background: #f3f7fd; }
.fx table.fx-diff del { background: #fdb8c0; text-decoration: none; }
.fx table.fx-diff ins { background: #acf2bd; text-decoration: none; }
.fx table.fx-diff tr.fold td { background: #f1f8ff; color: #555; text-align: center; }
.fx .fx-src { color: #6a737d; }
</style>
"""


def esc(text) -> str:
    return html.escape(str(text), quote=True)


def wrap(body: str, *, css: bool = True) -> str:
    """A complete fragment: the scoped stylesheet and the body, in one ``fx`` div."""
    return (CSS if css else "") + f'<div class="fx">{body}</div>'


def section(title: str, body: str, *, open: bool = False, cls: str = "") -> str:
    """A collapsible section (``<details>``): folding needs no JavaScript."""
    attr = " open" if open else ""
    klass = f' class="{cls}"' if cls else ""
    return f"<details{attr}{klass}><summary>{esc(title)}</summary>{body}</details>"


def table(header: list[str], rows: list[list[str]], *, cls: str = "fx-table") -> str:
    """An HTML table; cells are HTML already (escape them with ``esc``)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def mark(ok: bool | None) -> str:
    if ok is None:
        return '<span class="muted">–</span>'
    return '<span class="ok">✓</span>' if ok else '<span class="bad">✗</span>'


def note(text_html: str) -> str:
    return f'<div class="fx-note">{text_html}</div>'


def fmt_bytes(n: int | float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def fmt_seconds(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 10 else f"{s:.1f} s"


def short_path(path: str | None) -> str:
    """A file path as a reader wants it: ``fexplore/models/gpt.py`` rather than the absolute path
    of one checkout, so views read the same on every machine."""
    if not path:
        return "?"
    path = os.path.abspath(path)
    d, parts = os.path.dirname(path), [os.path.basename(path)]
    while os.path.exists(os.path.join(d, "__init__.py")):  # climb to the top-level package
        parts.append(os.path.basename(d))
        d = os.path.dirname(d)
    if len(parts) > 1:
        return "/".join(reversed(parts))
    cwd = os.getcwd()
    if path.startswith(cwd + os.sep):
        return os.path.relpath(path, cwd)
    return os.path.basename(path)


def loc_text(loc) -> str:
    """``fexplore/models/gpt.py:114 in h.0.attn``, or '' without a location."""
    if loc is None or (not loc.file and not loc.module):
        return ""
    where = f"{short_path(loc.file)}:{loc.line}" if loc.file else ""
    if loc.module:
        where += (" in " if where else "in ") + loc.module
    return where


def legend() -> str:
    chips = "".join(f'<span style="background:{color}">{esc(cat.value)}</span>'
                    for cat, color in CATEGORY_COLORS.items())
    return f'<div class="fx-legend">{chips}</div>'
