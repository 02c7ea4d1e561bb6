"""What a graph view draws, independent of how it is rendered: boxes, clusters and edges.

The graphviz renderer and the text fallback both draw a ``Drawing``, so the picture and the text
a user gets without ``dot`` always show the same thing.

- Every op is a box colored by its category, labeled with op, result type and the parameters it
  reads (constants are not boxes of their own: a weight is part of the op that uses it).
- A ``region`` node (a fused region) is a cluster holding its body; edges run from the producers
  outside straight to the body ops that read them, so a fused region reads like the ops it fused.
  Other region ops (``cond``) are a box fed by one cluster per branch.
- Big graphs collapse by module path (model → layer → block → op): every op under one module
  prefix becomes a single box counting what it holds, and ``expand`` opens chosen parts again.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from fexplore.ir import Category, Constant, Graph, Node, Value

from .page import fmt_bytes, loc_text

MAX_NODES = 150  # above this many ops a view collapses by module path
OVERVIEW_BOXES = MAX_NODES // 4  # a collapsed overview aims at about this many boxes


@dataclass
class Box:
    id: str
    kind: str  # "op", "input", "output" or "group" (a collapsed module)
    title: str  # op name, value name or module path
    lines: list[str] = field(default_factory=list)  # further label lines
    tooltip: str = ""
    category: Category | None = None
    node: Node | None = None
    ops: Counter = field(default_factory=Counter)  # a group's ops by name
    mark: str = ""  # what lowering made of the op: "kernel", "host" or "free view"


@dataclass
class Cluster:
    id: str
    kind: str  # "region", "branch" or "module" (an expanded module)
    label: str
    items: list = field(default_factory=list)  # box ids and Clusters, in program order
    tooltip: str = ""

    @property
    def boxes(self) -> list[str]:
        return [x for x in self.items if isinstance(x, str)]

    @property
    def clusters(self) -> list["Cluster"]:
        return [x for x in self.items if isinstance(x, Cluster)]


@dataclass
class Edge:
    src: str
    dst: str
    values: list[Value]

    @property
    def label(self) -> str:
        """The bytes the edge carries; a symbolic size is spelled as its type instead."""
        if all(v.type.is_static for v in self.values):
            return fmt_bytes(sum(int(v.type.nbytes()) for v in self.values))
        return ", ".join(str(v.type) for v in self.values)


@dataclass
class Drawing:
    name: str
    boxes: dict[str, Box]
    root: Cluster  # the top level: its boxes and clusters
    edges: list[Edge]
    total_ops: int
    collapsed: bool = False
    depth: int | None = None  # the module depth groups were cut at, when collapsed
    expanded: tuple[str, ...] = ()


# -- module paths ----------------------------------------------------------------------------

def module_levels(module: str | None) -> list[str]:
    """The prefixes of a module path, outermost first; an index stays with its container
    (``layers.0.attn.q_proj`` -> ``layers.0``, ``layers.0.attn``, ``layers.0.attn.q_proj``)."""
    if not module:
        return []
    out: list[str] = []
    for part in module.split("."):
        if part.isdigit() and out:
            out[-1] = f"{out[-1]}.{part}"
        else:
            out.append(f"{out[-1]}.{part}" if out else part)
    return out


def _under(module: str | None, prefix: str) -> bool:
    return bool(module) and (module == prefix or module.startswith(prefix + "."))


def _module(n: Node) -> str | None:
    return n.loc.module if n.loc is not None else None


def group_key(n: Node, depth: int) -> str | None:
    levels = module_levels(_module(n))
    return levels[min(depth, len(levels)) - 1] if levels else None


def _box_count(nodes: list[Node], depth: int) -> int:
    keys = Counter(group_key(n, depth) for n in nodes)
    return sum(count if key is None else 1 for key, count in keys.items())


def choose_depth(nodes: list[Node], target: int = OVERVIEW_BOXES) -> int:
    """The deepest module depth whose collapsed view has at most ``target`` boxes (at least 1)."""
    deepest = max((len(module_levels(_module(n))) for n in nodes), default=1)
    best = 1
    for d in range(1, deepest + 1):
        if _box_count(nodes, d) <= target:
            best = d
    return best


# -- building --------------------------------------------------------------------------------

def draw(g: Graph, *, expand: str | list[str] | tuple[str, ...] | None = None,
         max_nodes: int = MAX_NODES, collapse: bool | None = None,
         depth: int | None = None, marks: dict | None = None) -> Drawing:
    """The drawing of ``g``. Collapses by module path when ``g`` has more than ``max_nodes`` ops or
    when ``expand`` names parts to open (the rest then collapses); ``collapse`` forces either way;
    ``depth`` sets how deep the collapsed modules are cut (default: a readable overview)."""
    expanded = (expand,) if isinstance(expand, str) else tuple(expand or ())
    total = sum(1 for _ in g.walk())
    if collapse is None:
        collapse = total > max_nodes or bool(expanded)
    b = _Builder()
    b.marks = marks or {}
    if collapse and depth is None:
        # Opening a part asks to focus on it: the rest folds to the top modules. Otherwise aim
        # for an overview a person can read.
        rest = [n for n in g.nodes if not any(_under(_module(n), p) for p in expanded)]
        depth = 1 if expanded else choose_depth(rest)
    b.draw_graph(g, b.root, {}, top=True, depth=depth if collapse else None, expanded=expanded)
    return Drawing(g.name, b.boxes, b.root, b.edges(), total, bool(collapse),
                   depth if collapse else None, expanded)


class _Builder:
    def __init__(self):
        self.boxes: dict[str, Box] = {}
        self.root = Cluster("root", "root", "")
        self._edges: dict[tuple[str, str], list[Value]] = {}
        self._sizes: dict[tuple[int, int], Counter] = {}
        self._count = 0

    def new_id(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def add_box(self, box: Box, into: Cluster) -> Box:
        self.boxes[box.id] = box
        into.items.append(box.id)
        return box

    def connect(self, src: str | None, dst: str, v: Value) -> None:
        if src is None or src == dst:  # constants are labels, not boxes; a group's inner edges vanish
            return
        vals = self._edges.setdefault((src, dst), [])
        if all(x.name != v.name for x in vals):
            vals.append(v)

    def edges(self) -> list[Edge]:
        return [Edge(s, d, vs) for (s, d), vs in self._edges.items()]

    # A scope maps a value name to the id of the box that produces it (None for constants).
    # ``consts`` maps the names that hold a constant here (a body input bound to a constant
    # outside counts: a fused linear still reads its weight).
    def draw_graph(self, g: Graph, into: Cluster, scope: dict[str, str | None], *, top: bool,
                   depth: int | None = None, expanded: tuple[str, ...] = (),
                   consts: dict[str, Constant] | None = None) -> dict:
        scope = dict(scope)
        for c in g.constants:
            scope[c.name] = None
        consts = {**(consts or {}), **{c.name: c for c in g.constants}}
        if top:
            for v in g.inputs:
                box = self.add_box(Box(self.new_id("in"), "input", f"%{v.name}", [str(v.type)],
                                       tooltip=f"graph input %{v.name}: {v.type}"), into)
                scope[v.name] = box.id
        modules: dict[str, Cluster] = {}
        groups: dict[str, Box] = {}
        for n in g.nodes:
            target = into
            opened = next((p for p in expanded if _under(_module(n), p)), None)
            if opened is not None:
                if opened not in modules:
                    modules[opened] = Cluster(self.new_id("mod"), "module", opened,
                                              tooltip=f"module {opened} (expanded)")
                    into.items.append(modules[opened])
                target = modules[opened]
            elif depth is not None:
                key = group_key(n, depth)
                if key is not None and self._group_size(g, key, depth, expanded) > 1:
                    self._add_to_group(n, key, groups, into, scope)
                    continue
            self.draw_node(n, target, scope, consts)
        if top:
            for v in g.outputs:
                box = self.add_box(Box(self.new_id("out"), "output", f"%{v.name}", [str(v.type)],
                                       tooltip=f"graph output %{v.name}: {v.type}"), into)
                self.connect(scope.get(v.name), box.id, v)
        return scope

    def _group_size(self, g: Graph, key: str, depth: int, expanded) -> int:
        if (id(g), depth) not in self._sizes:
            self._sizes[(id(g), depth)] = Counter(
                group_key(n, depth) for n in g.nodes
                if not any(_under(_module(n), p) for p in expanded))
        return self._sizes[(id(g), depth)][key]

    def _add_to_group(self, n: Node, key: str, groups: dict[str, Box], into: Cluster,
                      scope: dict) -> None:
        box = groups.get(key)
        if box is None:
            box = self.add_box(Box(self.new_id("grp"), "group", key), into)
            groups[key] = box
        for inner in _walk_node(n):
            box.ops[inner.op.name] += 1
        for v in n.inputs:
            self.connect(scope.get(v.name), box.id, v)
        for v in n.outputs:
            scope[v.name] = box.id

    def draw_node(self, n: Node, into: Cluster, scope: dict, consts: dict[str, Constant]) -> None:
        if n.regions and n.op.name == "region" and len(n.regions) == 1:
            self._draw_region(n, into, scope, consts)
            return
        box = self.add_box(op_box(self.new_id("n"), n, consts), into)
        mark = getattr(self, "marks", {}).get(id(n))
        if mark:
            box.mark, text = mark
            box.lines.append(text)
            box.tooltip += "\n" + text
        for v in n.inputs:
            self.connect(scope.get(v.name), box.id, v)
        for i, r in enumerate(n.regions):
            branch = Cluster(self.new_id("br"), "branch", f"{n.op.name} region {i} @{r.name}")
            into.items.append(branch)
            inner = self.draw_graph(r, branch, _bind(r, n, scope), top=False,
                                    consts=_bind_consts(r, n, consts))
            for v in r.outputs:
                self.connect(inner.get(v.name), box.id, v)
        for v in n.outputs:
            scope[v.name] = box.id

    def _draw_region(self, n: Node, into: Cluster, scope: dict,
                     consts: dict[str, Constant]) -> None:
        body = n.regions[0]
        kind = n.attrs.get("kind", "fused")
        ops = sum(1 for _ in body.walk())
        mark = getattr(self, "marks", {}).get(id(n))
        cluster = Cluster(self.new_id("reg"), "region",
                          f"region {kind} @{body.name} ({ops} ops)" + (f" → {mark[1]}" if mark else ""),
                          tooltip="\n".join(filter(None, [f"%{n.name} = region {kind}",
                                                          loc_text(n.loc), mark[1] if mark else ""])))
        if mark and mark[0] == "host":
            cluster.kind = "host region"
        into.items.append(cluster)
        inner = self.draw_graph(body, cluster, _bind(body, n, scope), top=False,
                                consts=_bind_consts(body, n, consts))
        for outer, v in zip(n.outputs, body.outputs):
            scope[outer.name] = inner.get(v.name)


def _bind(body: Graph, n: Node, scope: dict) -> dict:
    """The scope a body sees: each body input is produced where the operand outside is."""
    return {**scope, **{bv.name: scope.get(ov.name) for bv, ov in zip(body.inputs, n.inputs)}}


def _bind_consts(body: Graph, n: Node, consts: dict[str, Constant]) -> dict[str, Constant]:
    return {bv.name: consts[ov.name] for bv, ov in zip(body.inputs, n.inputs) if ov.name in consts}


def _walk_node(n: Node):
    yield n
    for r in n.regions:
        yield from r.walk()


def op_box(box_id: str, n: Node, consts: dict[str, Constant]) -> Box:
    lines = [", ".join(str(v.type) for v in n.outputs)]
    params = [consts[v.name] for v in n.inputs if v.name in consts and not consts[v.name].is_inline]
    if params:
        lines.append("+ " + ", ".join(_param_name(c) for c in params))
    tip = [f"{', '.join('%' + v.name for v in n.outputs)} = {n.op.name}"
           f"({', '.join('%' + v.name for v in n.inputs)})"]
    if n.attrs:
        tip.append(", ".join(f"{k}={v}" for k, v in n.attrs.items()))
    where = loc_text(n.loc)
    if where:
        tip.append(where)
    src = n.loc.source_line() if n.loc is not None else None
    if src:
        tip.append(src)
    return Box(box_id, "op", n.op.name, lines, "\n".join(tip), n.op.category, n)


def _param_name(c: Constant) -> str:
    """``h.0.attn.c_attn.weight`` -> ``weight``: the op's module already says whose it is. A
    suffix a stage added (``conv.weight.nhwc``, a laid-out copy) gives way to the role."""
    parts = (c.source or c.name).split(".")
    if len(parts) > 1 and parts[-2] in ("weight", "bias") and parts[-1] not in ("weight", "bias"):
        return parts[-2]
    return parts[-1]
