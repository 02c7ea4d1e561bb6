"""The graph view: a Drawing rendered by graphviz as inline SVG, or as text when ``dot`` is missing.

    g.view()                    # the whole graph (collapsed by module path above 150 ops)
    g.view(expand="layers.0")   # open one part; the rest stays collapsed
    g.view(collapse=False)      # every op, however many

Nodes are colored by category and labeled with op, result type and the parameters they read;
edges carry the bytes they move; fused regions are clusters; a node's tooltip is its IR line, its
module path and the user's source line.
"""

from __future__ import annotations

from fexplore.ir import Graph

from .drawing import Box, Cluster, Drawing, draw
from .page import CATEGORY_COLORS, esc, legend, loc_text, note, wrap

NO_DOT = ("graphviz's <code>dot</code> program was not found, so this graph is shown as text. "
          "Install graphviz (<code>apt-get install graphviz</code>, <code>brew install graphviz</code> "
          "or <code>conda install graphviz</code>; <code>make install</code> does it here) and "
          "re-run the cell to see the picture.")

_CLUSTER_STYLE = {
    "region": dict(style="rounded,filled", fillcolor="#fff6cc", color="#c9a227", penwidth="1.5"),
    "host region": dict(style="rounded,filled,dashed", fillcolor="#fde0dd", color="#d62728", penwidth="2.5"),
    "module": dict(style="dashed,rounded", color="#888888"),
    "branch": dict(style="dotted,rounded", color="#888888"),
}


class GraphView:
    """A graph as a picture; renders inline in a notebook. ``svg()`` and ``source`` for files."""

    def __init__(self, graph: Graph, **options):
        self.graph = graph
        self.options = options
        self.drawing: Drawing = draw(graph, **options)

    @property
    def source(self) -> str:
        """The graphviz DOT text."""
        return to_dot(self.drawing).source

    def svg(self) -> str:
        """The SVG (without XML prolog, ready to inline). Raises graphviz.ExecutableNotFound
        when ``dot`` is not installed."""
        svg = to_dot(self.drawing).pipe(format="svg", encoding="utf-8")
        return svg[svg.index("<svg"):]

    def text(self) -> str:
        """The same drawing as indented text: what the view shows when ``dot`` is missing."""
        return outline(self.drawing)

    def html(self, *, css: bool = True) -> str:
        import graphviz

        d = self.drawing
        head = f"<b>graph @{esc(d.name)}</b> · {d.total_ops} ops"
        if d.collapsed:
            shown = sum(1 for b in d.boxes.values() if b.kind in ("op", "group"))
            head += (f' · <span class="muted">collapsed by module path into {shown} boxes '
                     f"(depth {d.depth})")
            head += f"; expanded: {esc(', '.join(d.expanded))}" if d.expanded else \
                f"; open a part with <code>.view(expand=&quot;{esc(_first_group(d))}&quot;)</code>"
            head += "</span>"
        try:
            body = f'<div class="fx-scroll">{self.svg()}</div>'
        except graphviz.ExecutableNotFound:
            body = note(NO_DOT) + f"<pre>{esc(self.text())}</pre>"
        except graphviz.CalledProcessError as e:  # dot itself failed: still show the graph
            body = note(f"graphviz failed: {esc(e)}") + f"<pre>{esc(self.text())}</pre>"
        return wrap(f'<div class="fx-graph">{head}{legend()}{body}</div>', css=css)

    def _repr_html_(self) -> str:
        return self.html()

    def __repr__(self) -> str:
        d = self.drawing
        how = f", collapsed at depth {d.depth}" if d.collapsed else ""
        return f"<GraphView @{d.name}: {d.total_ops} ops, {len(d.boxes)} boxes{how}>"


def lowering_marks(low) -> dict:
    """What the lower stage made of each top-level node (keyed by the node object: a region and
    the op inside it may share a name), for ``GraphView(g, marks=...)``."""
    out = {}
    for x in low.nodes:
        if x.how == "host":
            out[id(x.node)] = ("host", f"HOST op: {x.reason[:80]}")
        elif x.how == "free view":
            out[id(x.node)] = ("free view", "free view")
        else:
            out[id(x.node)] = ("kernel", f"kernel {x.name}")
    return out


def graph_html(g: Graph, *, css: bool = True, **options) -> str:
    """What ``Graph._repr_html_`` shows."""
    return GraphView(g, **options).html(css=css)


def _first_group(d: Drawing) -> str:
    return next((b.title for b in d.boxes.values() if b.kind == "group"), "")


# -- DOT -------------------------------------------------------------------------------------

def to_dot(d: Drawing):
    import graphviz

    dot = graphviz.Digraph(d.name, graph_attr=dict(
        rankdir="TB", fontname="Helvetica", fontsize="10", nodesep="0.25", ranksep="0.35",
        bgcolor="transparent", tooltip=f"@{d.name}"))
    dot.attr("node", fontname="Helvetica", fontsize="10", margin="0.08,0.03", height="0.3")
    dot.attr("edge", fontname="Helvetica", fontsize="8", color="#666666", fontcolor="#555555",
             arrowsize="0.6")
    _emit_cluster(dot, d.root, d)
    for e in d.edges:
        dot.edge(e.src, e.dst, label=e.label,
                 tooltip=_literal("\n".join(f"%{v.name}: {v.type}" for v in e.values)))
    return dot


def _literal(text: str) -> str:
    """Text as graphviz shows it: a backslash in a user's source line is a backslash, not an
    escape sequence that could end the quoted string."""
    import graphviz

    return graphviz.escape(text)


def _emit_cluster(dot, c: Cluster, d: Drawing) -> None:
    for bid in c.boxes:
        _emit_box(dot, d.boxes[bid])
    for sub in c.clusters:
        # graphviz draws a subgraph as a box only when its name starts with "cluster"
        with dot.subgraph(name=f"cluster_{sub.id}") as s:
            s.attr(label=_literal(sub.label), tooltip=_literal(sub.tooltip or sub.label), fontsize="10",
                   labeljust="l", **{"class": f"fx-{sub.kind}"}, **_CLUSTER_STYLE[sub.kind])
            _emit_cluster(s, sub, d)


def _emit_box(dot, b: Box) -> None:
    lines = "".join(f'<br/><font point-size="8">{esc(x)}</font>' for x in b.lines)
    if b.kind == "op":
        fill = CATEGORY_COLORS.get(b.category, "#ffffff")
        host = b.mark == "host"   # an op the chip does not run: drawn so nobody misses it
        dot.node(b.id, f"<<b>{esc(b.title)}</b>{lines}>", shape="box",
                 style="rounded,filled,dashed" if host else "rounded,filled",
                 fillcolor=fill, color="#d62728" if host else "#777777", penwidth="2.5" if host else "1",
                 tooltip=_literal(b.tooltip), **{"class": f"fx-op cat-{b.category.name}"
                                                 + (" fx-host" if host else "")})
    elif b.kind == "group":
        top = ", ".join(f"{op}×{k}" for op, k in b.ops.most_common(3))
        more = " …" if len(b.ops) > 3 else ""
        label = (f"<<b>{esc(b.title)}</b><br/>{sum(b.ops.values())} ops"
                 f'<br/><font point-size="8">{esc(top + more)}</font>>')
        tip = f"module {b.title} (collapsed)\n" + "\n".join(f"{op} × {k}"
                                                           for op, k in b.ops.most_common())
        dot.node(b.id, label, shape="box3d", style="filled", fillcolor="#eeeeee",
                 color="#777777", tooltip=_literal(tip), **{"class": "fx-group"})
    else:  # graph input or output
        dot.node(b.id, f"<<b>{esc(b.title)}</b>{lines}>", shape="ellipse", style="filled",
                 fillcolor="#ffffff", color="#4c78a8", penwidth="1.5", tooltip=_literal(b.tooltip),
                 **{"class": f"fx-{b.kind}"})


# -- text ------------------------------------------------------------------------------------

def outline(d: Drawing) -> str:
    """The drawing as indented text: one line per box, clusters as blocks."""
    lines = [f"graph @{d.name} ({d.total_ops} ops"
             + (f", collapsed by module path at depth {d.depth})" if d.collapsed else ")")]
    _outline_cluster(d.root, d, lines, "  ")
    return "\n".join(lines)


def _outline_cluster(c: Cluster, d: Drawing, lines: list[str], ind: str) -> None:
    for item in c.items:
        if isinstance(item, str):
            lines.append(ind + _box_line(d.boxes[item]))
        else:
            lines.append(f"{ind}{item.label} {{")
            _outline_cluster(item, d, lines, ind + "  ")
            lines.append(ind + "}")


def _box_line(b: Box) -> str:
    if b.kind == "input":
        return f"input {b.title}: {b.lines[0]}"
    if b.kind == "output":
        return f"output {b.title}"
    if b.kind == "group":
        ops = ", ".join(f"{op}×{k}" for op, k in b.ops.most_common())
        return f"[{b.title}] {sum(b.ops.values())} ops: {ops}"
    n = b.node
    outs = ", ".join(f"%{v.name}" for v in n.outputs)
    args = ", ".join(f"%{v.name}" for v in n.inputs)
    where = loc_text(n.loc)
    mark = f"  → {b.lines[-1]}" if b.mark else ""
    return f"{outs} = {n.op.name}({args}) : {b.lines[0]}" + (f"  # {where}" if where else "") + mark
