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


_HOW = {"generated": "generated", "user": "<b>user</b>", "free view": '<span class="muted">free view</span>',
        "host": '<span class="bad">host</span>', "split": '<span class="bad">split</span>'}


def _row(x, piece: bool) -> list:
    name = esc(x.name) if x.kernel is not None else '<span class="muted">–</span>'
    label = ("&nbsp;&nbsp;↳ " if piece else "") + esc(x.label)
    what = _HOW[x.how] if x.how != "split" else f"{_HOW['split']} into {len(x.pieces)}"
    reason = esc(x.reason)
    if x.how == "split" and x.scratch:
        reason += f"<br><span class=\"muted\">through DRAM: {esc(', '.join('%' + s for s in x.scratch))}</span>"
    return [name, what, esc(x.kind if x.kernel is not None else ""), label, esc(x.module), esc(x.shapes), reason]


def lowering_html(low) -> str:
    """A split region is a row followed by a row per piece (↳); its reason says why it was split
    and which values now pass through DRAM between pieces."""
    rows = []
    for x in low.nodes:
        rows.append(_row(x, False))
        rows += [_row(p, True) for p in x.pieces]
    split = f", {len(low.splits)} region(s) split into pieces" if low.splits else ""
    head = (f"<p>{len(low.kernels)} kernels, {len(low.free_views)} free views, "
            f"{len(low.host_ops)} host ops on {esc(low.target)}{split}</p>")
    sources = "".join(section(f"{x.name} ({x.how}, {x.kind}) for {x.label}"
                              + (f", a piece of {x.of}" if x.of else ""), source_html(x.source))
                      for x in low.kernels)
    return head + table(["kernel", "how", "kind", "node", "module", "shapes", "why on the host / split"],
                        rows) + sources
