"""The diff view: what a stage changed, as a structural summary above a side-by-side IR diff.

Value names are stable across stages (they come from provenance), so lining up the IR text of two
snapshots shows real changes only: changed lines are highlighted (the changed characters within
them too), and runs of unchanged lines fold into one row that opens on a click.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from fexplore.ir import Graph, Node

from .page import esc, table, wrap

CONTEXT = 3  # unchanged lines kept around each change


@dataclass
class Changes:
    """How two snapshots differ, node by node (a node is named by its first result)."""

    removed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    fused: list[str] = field(default_factory=list)  # top-level before, inside a region after
    regions: list[str] = field(default_factory=list)  # region nodes that are new
    constants_before: int = 0
    constants_after: int = 0

    @property
    def empty(self) -> bool:
        return not (self.removed or self.added or self.changed or self.fused or self.regions) \
            and self.constants_before == self.constants_after


def structural_changes(before: Graph, after: Graph) -> Changes:
    old = {n.name: n for n in before.nodes}
    new = {n.name: n for n in after.nodes}
    inside = {m.name for n in after.nodes for r in n.regions for m in r.walk()}
    was_region = {n.name for n in before.nodes if n.op.name == "region"}
    c = Changes(constants_before=len(before.constants), constants_after=len(after.constants))
    for name, n in old.items():
        if name in new:
            if n is not new[name] and not _same_node(n, new[name]) and name not in inside:
                c.changed.append(name)
        elif name in inside:
            c.fused.append(name)
        else:
            c.removed.append(name)
    for name, n in new.items():
        if n.op.name == "region" and name not in was_region:
            c.regions.append(name)
            if name in old:  # the region took over the name of the last node it fused
                c.fused.append(name)
        elif name not in old:
            c.added.append(name)
    return c


def _same_node(a: Node, b: Node) -> bool:
    return (a.op.name == b.op.name and a.attrs == b.attrs
            and [v.name for v in a.inputs] == [v.name for v in b.inputs]
            and [(v.name, v.type) for v in a.outputs] == [(v.name, v.type) for v in b.outputs])


def summary_html(before: Graph, after: Graph, rewrites=()) -> str:
    """One line of counts, then one row per rewrite rule that fired."""
    c = structural_changes(before, after)
    parts = [f"nodes {len(before.nodes)} → {len(after.nodes)}"]
    for label, items in (("removed", c.removed), ("added", c.added), ("changed", c.changed)):
        if items:
            parts.append(f"{len(items)} {label}")
    if c.regions:
        parts.append(f"{len(c.fused)} fused into {len(c.regions)} region(s)")
    if c.constants_before != c.constants_after:
        parts.append(f"constants {c.constants_before} → {c.constants_after}")
    line = f'<div class="fx-summary">{esc(" · ".join(parts))}</div>'
    if not rewrites:
        return line
    by_rule: dict[str, list] = {}
    for rw in rewrites:
        by_rule.setdefault(rw.rule, []).append(rw)
    rows = []
    for rule, rws in sorted(by_rule.items(), key=lambda kv: -len(kv[1])):
        seen = ", ".join(f"%{n}" for rw in rws[:3] for n in rw.nodes[:2])
        rows.append([f"<code>{esc(rule)}</code>", str(len(rws)),
                     str(sum(len(rw.nodes) for rw in rws)), str(sum(len(rw.result) for rw in rws)),
                     f'<span class="fx-code">{esc(seen)}{" …" if len(rws) > 3 else ""}</span>'])
    return line + table(["rule", "fired", "nodes in", "results", "e.g. on"], rows)


def diff_html(before: Graph | None, after: Graph, *, rewrites=(), context: int = CONTEXT,
              css: bool = True) -> str:
    """The structural summary and the side-by-side diff of two snapshots' IR text."""
    if before is None:
        body = (f'<div class="fx-summary">the first stage: it creates @{esc(after.name)} '
                f"({len(after.nodes)} nodes, {len(after.constants)} constants); "
                "there is nothing before it to compare with</div>")
        return wrap(body, css=css)
    a, b = str(before).splitlines(), str(after).splitlines()
    summary = summary_html(before, after, rewrites)
    if a == b:
        return wrap(summary + '<div class="muted">the IR text is unchanged</div>', css=css)
    return wrap(summary + side_by_side(a, b, context=context), css=css)


def side_by_side(a: list[str], b: list[str], *, context: int = CONTEXT,
                 headers: tuple[str, str] = ("before", "after")) -> str:
    rows: list[str] = []
    # Lines match ignoring indentation: an op moved into a fused region's body is the same op,
    # one level deeper, and lines up with itself instead of showing as deleted and re-added.
    ops = difflib.SequenceMatcher(None, [x.strip() for x in a], [x.strip() for x in b],
                                  autojunk=False).get_opcodes()
    for k, (tag, i1, i2, j1, j2) in enumerate(ops):
        if tag == "equal":
            for same, s1, s2, t1 in _indent_runs(a, b, i1, i2, j1):
                if same:
                    rows.extend(_equal_rows(a, s1, s2, t1, context, first=k == 0 and s1 == 0,
                                            last=k == len(ops) - 1 and s2 == i2))
                else:
                    rows.extend(_row(s1 + d + 1, esc(a[s1 + d]), "mv", t1 + d + 1,
                                     esc(b[t1 + d]), "mv") for d in range(s2 - s1))
        elif tag == "replace":
            for off in range(max(i2 - i1, j2 - j1)):
                i, j = i1 + off, j1 + off
                left = a[i] if i < i2 else None
                right = b[j] if j < j2 else None
                if left is not None and right is not None:
                    la, rb = _intraline(left, right)
                    rows.append(_row(i + 1, la, "chg-a", j + 1, rb, "chg-b"))
                elif left is not None:
                    rows.append(_row(i + 1, esc(left), "del", None, "", "empty"))
                else:
                    rows.append(_row(None, "", "empty", j + 1, esc(right), "add"))
        elif tag == "delete":
            rows.extend(_row(i + 1, esc(a[i]), "del", None, "", "empty") for i in range(i1, i2))
        else:  # insert
            rows.extend(_row(None, "", "empty", j + 1, esc(b[j]), "add") for j in range(j1, j2))
    head = (f'<tr><th></th><th>{esc(headers[0])}</th><th></th><th>{esc(headers[1])}</th></tr>')
    cols = '<colgroup><col style="width:3.5em"><col><col style="width:3.5em"><col></colgroup>'
    return f'<table class="fx-diff">{cols}<thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def _indent_runs(a, b, i1, i2, j1):
    """Split a matching run into maximal pieces that are identical or differ in indentation:
    (identical, start in a, end in a, start in b)."""
    out = []
    start = i1
    for i in range(i1, i2 + 1):
        if i == i2 or (a[i] == b[j1 + i - i1]) != (a[start] == b[j1 + start - i1]):
            if i > start:
                out.append((a[start] == b[j1 + start - i1], start, i, j1 + start - i1))
            start = i
    return out


def _row(ln_a, text_a, cls_a, ln_b, text_b, cls_b) -> str:
    na = "" if ln_a is None else ln_a
    nb = "" if ln_b is None else ln_b
    return (f'<tr><td class="ln">{na}</td><td class="{cls_a}">{text_a}</td>'
            f'<td class="ln">{nb}</td><td class="{cls_b}">{text_b}</td></tr>')


def _equal_rows(a, i1, i2, j1, context, *, first: bool, last: bool) -> list[str]:
    """Unchanged lines: ``context`` of them next to each change, the rest folded into one row."""
    keep_head = 0 if first else context
    keep_tail = 0 if last else context
    n = i2 - i1
    if n <= keep_head + keep_tail + 1:
        return [_row(i1 + k + 1, esc(a[i1 + k]), "eq", j1 + k + 1, esc(a[i1 + k]), "eq")
                for k in range(n)]
    rows = [_row(i1 + k + 1, esc(a[i1 + k]), "eq", j1 + k + 1, esc(a[i1 + k]), "eq")
            for k in range(keep_head)]
    hidden = a[i1 + keep_head:i2 - keep_tail]
    rows.append(f'<tr class="fold"><td colspan="4"><details><summary>⋯ {len(hidden)} unchanged '
                f'lines</summary><pre>{esc(chr(10).join(hidden))}</pre></details></td></tr>')
    rows += [_row(i2 - keep_tail + k + 1, esc(a[i2 - keep_tail + k]), "eq",
                  j1 + n - keep_tail + k + 1, esc(a[i2 - keep_tail + k]), "eq")
             for k in range(keep_tail)]
    return rows


_TOKEN = re.compile(r"[\w.]+|\s+|.")  # names like %h.0.attn stay whole; each symbol alone


def _intraline(left: str, right: str) -> tuple[str, str]:
    """Both lines escaped, with the tokens that differ wrapped in <del> and <ins>. Tokens, not
    characters: ``none`` -> ``tanh`` reads as one word replaced, not as letters shuffled."""
    a, b = _TOKEN.findall(left), _TOKEN.findall(right)
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    if sm.ratio() < 0.4:  # barely alike: marking tokens would only add noise
        return esc(left), esc(right)
    la, rb = [], []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        x, y = "".join(a[i1:i2]), "".join(b[j1:j2])
        if tag == "equal":
            la.append(esc(x))
            rb.append(esc(y))
            continue
        if x:
            la.append(f"<del>{esc(x)}</del>")
        if y:
            rb.append(f"<ins>{esc(y)}</ins>")
    return "".join(la), "".join(rb)
