"""The HTML report ``CompiledModel.save()`` and ``fexplore compile`` write: one self-contained file.

The same views a notebook shows, on one page: the compiled model's summary, then every stage with
its header, diff, graph and statistics. Graphs are inline SVG and the stylesheet is inline, so the
file opens offline, from disk, with nothing else beside it.
"""

from __future__ import annotations

import datetime
import os

from .compiled_view import compiled_html
from .page import CSS, esc
from .stage_view import stage_html

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{title}</title>
{css}
<style>body {{ margin: 16px 24px; }} .fx h2 {{ font-size: 17px; margin: 22px 0 6px; }}</style>
</head><body><div class="fx">
<h1 style="font-size:20px">{title}</h1>
<p class="muted">written by fexplore on {when}</p>
{body}
</div></body></html>
"""


def report_html(cm, *, title: str | None = None) -> str:
    title = title or f"fexplore report: @{cm.graph.name}"
    parts = [compiled_html(cm, css=False, graph=False)]
    for i, rec in enumerate(cm.stages):
        parts.append(f'<h2 id="stage-{esc(rec.name)}">{i + 1}. {esc(rec.name)}</h2>')
        parts.append(stage_html(rec, css=False))
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return _PAGE.format(title=esc(title), css=CSS, when=when, body="\n".join(parts))


def write_report(cm, path: str | os.PathLike, *, title: str | None = None) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(report_html(cm, title=title))
    return str(path)
