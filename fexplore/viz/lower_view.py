"""The lower stage's view: a table of what every node became (a generated or user kernel, a free
view, a host op), with kind, module path and shapes; each kernel's source folds open below it,
highlighted when pygments is installed (it comes with Jupyter), plain otherwise."""

from __future__ import annotations

from .page import esc, section, table


def source_html(source: str) -> str:
    try:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer
    except ImportError:
        return f'<div class="fx-scroll"><pre>{esc(source)}</pre></div>'
    body = highlight(source, PythonLexer(), HtmlFormatter(noclasses=True, nowrap=True))
    return f'<div class="fx-scroll"><pre>{body}</pre></div>'


def lowering_html(low) -> str:
    rows = []
    for x in low.nodes:
        what = {"generated": "generated", "user": "<b>user</b>", "free view": '<span class="muted">free view</span>',
                "host": '<span class="bad">host</span>'}[x.how]
        name = esc(x.name) if x.kernel is not None else '<span class="muted">–</span>'
        rows.append([name, what, esc(x.kind if x.kernel is not None else ""), esc(x.label),
                     esc(x.module), esc(x.shapes), esc(x.reason)])
    head = (f"<p>{len(low.kernels)} kernels, {len(low.free_views)} free views, "
            f"{len(low.host_ops)} host ops on {esc(low.target)}</p>")
    sources = "".join(section(f"{x.name} ({x.how}, {x.kind}) for {x.label}", source_html(x.source))
                      for x in low.kernels)
    return head + table(["kernel", "how", "kind", "node", "module", "shapes", "why on the host"], rows) + sources
