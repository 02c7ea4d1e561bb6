"""lower: every node of the final graph becomes a kernel-language kernel, a free view or a host op.

- a fused ``region`` or a plain op with a codegen part -> a generated kernel
  (``fexplore.lang.codegen.generate``), or a user kernel registered with
  ``fexplore.register_kernel(match, kernel)`` for its region kind, op name or a predicate;
- a ``reshape`` of a row-major tensor moves no data -> a free view (no kernel, no cost);
- anything codegen has no part for yet (gathers, relayouts, pooling, sort, ...) -> an explicit
  host op, with the reason codegen gave; counted and listed in the stats and the summary;
- a region no generator takes whole -> split: its body is partitioned into the largest pieces
  codegen generates (``_Splitter``): the op codegen names is peeled off, the rest tried again as
  sub-regions built as fusion builds regions (``fusion.region_node``); each piece is a kernel, a
  free view or (a single op with no part) a host op. The values passed between pieces go
  through DRAM: that fusion is lost, and the record says so with codegen's reason.
  A generator that raises anything but a clear refusal (``UnsupportedRegionError``), or writes a
  kernel the kernel language rejects, is a bug of fexplore: the fallback keeps the compile going,
  and ``Lowering.codegen_bugs`` (the stats' ``codegen_bugs``, present when there is one) lists
  each one, so it is not hidden.

Design. The graph is not rewritten: every node keeps its body, which stays its meaning, so the IR
interpreter, printer, parser, diff and graph views work on the lowered program unchanged, and the
IR layer needs to know nothing of the kernel language. What lowering decided lives beside the
graph, in a ``Lowering`` (the stage result's and record's ``lowering``): one ``LoweredNode`` per
top-level node, naming the node (its output value, stable across stages) and holding its kernel.
The CompiledModel exposes the kernels as ``cm.kernels``. Kernel names are unique per compile:
two regions of one module get ``_2``, ``_3`` suffixes, in the source too.

Verification (``check_lowering``, called by the driver's hook besides the graph-vs-eager check):
the program is run the chip way on each of the oracle's input sets (the example inputs and the
random ones): each node computed by its kernel in the kernel-language interpreter, a split region
piece by piece, host ops and free views by the IR interpreter, and each kernel's
outputs compared with its node run by the IR interpreter on the same inputs (the dtype's
tolerance, ``codegen.check_kernel``); the first kernel (or piece) that leaves it is named. To stay
cheap on big graphs, each distinct kernel (same source up to its name, same input shapes) is run
once per input set; its
repeats (the layers of a transformer) are computed by the IR interpreter. The chip-way outputs are
then compared with eager.
"""

from __future__ import annotations

import inspect
import re
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fexplore.errors import RegistrationError
from fexplore.ir import Graph, Node, evaluate_node

from ..stage import StageResult

# -- the user-kernel registry ------------------------------------------------------------------

_REGISTRY: list[tuple[Any, Any]] = []


def register_kernel(match, kernel) -> None:
    """Use ``kernel`` (an ``fl.kernel``) instead of the generated one for every node that
    ``match`` names: a region kind (``"attention"``, ``"contraction"``), an op name (``"gelu"``)
    or a predicate ``match(node) -> bool``. The kernel takes the node's inputs (numpy arrays, in
    order) and returns its outputs. Later registrations win; ``unregister_kernels()`` clears."""
    if not (isinstance(match, str) or callable(match)):
        raise RegistrationError(f"register_kernel cannot match nodes by {match!r}",
                                hint='match is a region kind ("attention"), an op name ("gelu") '
                                     "or a predicate over nodes (lambda node: ...)")
    if not callable(kernel):
        raise RegistrationError(f"register_kernel needs a kernel, got {type(kernel).__name__}",
                                hint="an @fl.kernel (or a callable taking the node's inputs as "
                                     "numpy arrays)")
    _REGISTRY.insert(0, (match, kernel))


def unregister_kernels() -> None:
    _REGISTRY.clear()


def _matches(match, node: Node) -> bool:
    if callable(match) and not isinstance(match, str):
        return bool(match(node))
    if node.op.name == "region":
        return node.attrs.get("kind") == match
    return node.op.name == match


def _user_kernel_for(node: Node):
    return next((k for m, k in _REGISTRY if _matches(m, node)), None)


@dataclass
class UserKernel:
    """A registered kernel standing in for a node: called with the node's inputs."""

    name: str
    kernel: Any
    target: Any
    shapes: tuple
    kind: str = "user"
    parts: tuple = ("user",)

    @property
    def source(self) -> str:
        fn = getattr(self.kernel, "fn", self.kernel)
        try:
            return inspect.getsource(fn)
        except (OSError, TypeError):
            return f"# user kernel {self.name}: source not available"

    def run(self, inputs, kernel=None) -> list[np.ndarray]:
        got = self.kernel(*[np.asarray(x) for x in inputs], target=self.target) \
            if hasattr(self.kernel, "fn") else self.kernel(*[np.asarray(x) for x in inputs])
        got = got if isinstance(got, (tuple, list)) else (got,)
        return [np.asarray(y).reshape(s) if np.size(y) == int(np.prod(s)) else np.asarray(y)
                for y, s in zip(got, self.shapes)]


# -- the lowering record -----------------------------------------------------------------------

@dataclass
class LoweredNode:
    """What one node became. ``how``: "generated", "user", "free view", "host", or "split": a
    region no generator takes whole, lowered as ``pieces`` (each a LoweredNode of a sub-region or
    of one body op, in program order); the values in ``scratch`` pass between pieces through DRAM,
    where the region would have kept them on chip."""

    node: Node
    how: str
    kernel: Any = None            # GeneratedKernel or UserKernel; None for views and host ops
    reason: str = ""              # why a host op, or why split (codegen's words)
    traced: Any = None            # the generated source executed: its fexplore.lang.Kernel
    ops: int = 0                  # how == "generated": the operations its trace at default tiles records
    pieces: list = field(default_factory=list)   # how == "split": the pieces
    scratch: tuple = ()           # how == "split": values the pieces pass through DRAM
    of: str = ""                  # a piece: the label of the region it was split from
    members: tuple = ()           # a piece: the body nodes of that region it computes

    @property
    def name(self) -> str:
        return self.kernel.name if self.kernel is not None else self.node.name

    @property
    def kind(self) -> str:
        if self.kernel is not None:
            return self.kernel.kind
        return self.how

    @property
    def region(self) -> Node:
        return self.node

    @property
    def source(self) -> str:
        return self.kernel.source if self.kernel is not None else ""

    @property
    def module(self) -> str:
        loc = self.node.loc
        return loc.module if loc is not None and loc.module else ""

    @property
    def op(self) -> str:
        """The op name, or ``region:<kind>`` for a fused region."""
        n = self.node
        return f"region:{n.attrs.get('kind')}" if n.op.name == "region" else n.op.name

    @property
    def label(self) -> str:
        n = self.node
        return f"region {n.regions[0].name}" if n.op.name == "region" else f"{n.op.name} %{n.name}"

    @property
    def shapes(self) -> str:
        ins = ", ".join(str(v.type) for v in self.node.inputs)
        outs = ", ".join(str(v.type) for v in self.node.outputs)
        return f"({ins}) -> ({outs})"

    def __repr__(self) -> str:
        what = f"{self.kind} kernel" if self.kernel is not None else self.how
        if self.how == "split":
            what = f"split into {len(self.pieces)} pieces"
        extra = f": {self.reason}" if self.reason else ""
        return f"<{self.name}: {what} for {self.label}{extra}>"

    def leaves(self) -> list["LoweredNode"]:
        """Itself, or its pieces when split."""
        return list(self.pieces) if self.how == "split" else [self]


@dataclass
class Lowering:
    """One LoweredNode per top-level node (``nodes``); the kernels, host ops and free views count
    the pieces of split regions, which is what runs."""

    target: str
    nodes: list[LoweredNode] = field(default_factory=list)
    chip: Any = None          # the NPUConfig lowered for (a fused arrangement of the target's PEs)
    arrangements: list = field(default_factory=list)   # what pe_fusion="auto" tried
    made: Any = None   # (Schedule, spills) pe_fusion="auto" made and timed: the schedule stage's
    # generated kernels that failed for a reason other than a clear refusal (the generator raised,
    # or wrote a kernel the kernel language rejects): bugs of fexplore, which the fallback (split,
    # host op) keeps from breaking the compile but must not hide
    codegen_bugs: list[str] = field(default_factory=list)

    @property
    def leaves(self) -> list[LoweredNode]:
        return [y for x in self.nodes for y in x.leaves()]

    @property
    def kernels(self) -> list[LoweredNode]:
        return [x for x in self.leaves if x.kernel is not None]

    @property
    def host_ops(self) -> list[LoweredNode]:
        return [x for x in self.leaves if x.how == "host"]

    @property
    def free_views(self) -> list[LoweredNode]:
        return [x for x in self.leaves if x.how == "free view"]

    @property
    def replaced(self) -> list[LoweredNode]:
        return [x for x in self.leaves if x.how == "user"]

    @property
    def splits(self) -> list[LoweredNode]:
        return [x for x in self.nodes if x.how == "split"]

    def __getitem__(self, name: str) -> LoweredNode:
        for x in self.nodes + self.leaves:
            if x.name == name or x.node.name == name:
                return x
        raise KeyError(name)


# -- the stage ---------------------------------------------------------------------------------

def _free_view(node: Node) -> bool:
    """A reshape of a row-major tensor to a row-major result moves no data; nor does a permute that
    moves only axes of size 1 (a decode step's heads, (B, H, 1, D) -> (B, 1, H, D)): the non-unit
    axes keep their order, so every element keeps its place."""
    if node.inputs and (node.inputs[0].type.layout is not None or node.outputs[0].type.layout is not None):
        return False
    if node.op.name == "permute":   # reduced as its kernel reduces it: nothing left to move
        from fexplore.lang.codegen.permute import reduce_permutation

        _, perm = reduce_permutation(tuple(node.inputs[0].type.shape), tuple(node.attrs["perm"]))
        return perm == tuple(range(len(perm)))
    return node.op.name == "reshape"


def lower(graph: Graph, options, building: str = "lower") -> StageResult:
    """The lower stage. `building`: who lowers, the stage itself or a stage's cost
    (`chip.graph_cost`), which a refusal to build a program too big names."""
    from ..arrangement import arranged_target

    chip, tried, low = arranged_target(graph, options, lambda cfg: _lowered(graph, cfg), building)
    if low is None:
        low = _lowered(graph, chip)
    low.arrangements = tried
    stats = lowering_stats(low)
    host = ", host ops: " + ", ".join(f"{k}×{v}" for k, v in stats["host_ops_by_op"].items()) \
        if low.host_ops else ""
    user = f", {len(low.replaced)} user kernel(s)" if low.replaced else ""
    split = (f"; {stats['split_regions']} region(s) split into {stats['split_pieces']} pieces"
             if low.splits else "")
    summary = (f"{stats['kernels']} kernels ({stats['generated']} generated{user}), "
               f"{stats['free_views']} free views, {stats['host_ops']} host ops{host}{split}")
    if tried:
        summary += (f"; for {chip.name} (pe_fusion='auto', simulated cycles: "
                    + ", ".join(f"{a.target} {a.cycles:,}" for a in tried) + ")")
    elif chip.fused_pes > 1:
        summary += f"; for {chip.name}"
    return StageResult(graph, stats, [], summary, lowering=low)


def _lowered(graph: Graph, chip) -> "Lowering":
    """Every node of `graph` lowered for the chip arrangement `chip`."""
    low = Lowering(chip.name, chip=chip)
    lowerer = _Lowerer(chip)
    # values an attention reads head by head: their producers make them head by head
    for node in graph.nodes:
        if node.op.name == "region" and node.attrs.get("kind") == "attention":
            lowerer.head_layouts.update(lowerer.codegen.attention.heads_read(node))
    for node in graph.nodes:
        low.nodes.append(lowerer.node(node))
    low.codegen_bugs = list(lowerer.bugs)
    return low


class _Lowerer:
    """Lowers one node at a time; a region no generator takes whole is split into pieces."""

    def __init__(self, target):
        from fexplore.lang import codegen  # lazy: the pipeline imports the kernel language only here

        self.codegen, self.target = codegen, target
        self.head_layouts: dict[str, tuple] = {}   # value name -> (parts, heads, depth)
        self.taken: dict[str, int] = {}
        self.bugs: list[str] = []

    def node(self, node: Node, of: str = "") -> LoweredNode:
        if _free_view(node):
            return LoweredNode(node, "free view", of=of)
        user = _user_kernel_for(node)
        if user is not None:
            name = _unique(getattr(user, "name", None) or "user_kernel", self.taken)
            shapes = tuple(tuple(v.type.shape) for v in node.outputs)
            from fexplore.npu import get_target

            return LoweredNode(node, "user", UserKernel(name, user, get_target(self.target), shapes), of=of)
        x, err = self.generated(node, of)
        if x is not None:
            return x
        if node.op.name == "region" and len(node.regions[0].nodes) > 1:
            return self.split(node, err)
        return LoweredNode(node, "host", reason=_reason(err), of=of)

    def generated(self, node: Node, of: str = ""):
        """(the LoweredNode of the generated kernel, None), or (None, the error saying why not)."""
        codegen = self.codegen
        try:
            layout = self.head_layouts.get(node.outputs[0].name) if len(node.outputs) == 1 else None
            gk = codegen.generate(node, self.target, head_layout=layout)
        except codegen.UnsupportedRegionError as e:
            return None, e
        except MemoryError:   # the machine's limit, not the generator's: the compile says so (FX505)
            raise
        except Exception as e:  # a generator that fails is said to, not hidden
            return None, self.bug(node, f"codegen failed: {type(e).__name__}: {_first_line(e)}")
        from fexplore.lang.errors import TraceLimitError

        traced, ops, err = _traces(gk, node)
        if isinstance(err, TraceLimitError):   # tiles too small for the tensors: too big, not wrong
            return None, err
        if err is not None:  # a generator that writes a kernel the kernel language rejects: a codegen bug
            return None, self.bug(node, f"generated kernel {gk.name} does not trace (a codegen bug): "
                                        f"{type(err).__name__}: {_first_line(err)}")
        gk = _renamed(gk, _unique(gk.name, self.taken))
        return LoweredNode(node, "generated", gk, traced=traced, ops=ops, of=of), None

    def split(self, node: Node, err) -> LoweredNode:
        return _Splitter(self, node).lowered(err)

    def bug(self, node: Node, why: str) -> "_Failed":
        self.bugs.append(f"{self.codegen.common.region_label(node)}: {why}")
        return _Failed(why)


class _Splitter:
    """The region as the largest pieces codegen generates. The body is cut around the op codegen
    names (``_cut``), each part tried whole and cut again if refused; with no op named, the body
    is halved in program order. Every part is convex (an ancestor-closed set, its complement, a
    single op, or a contiguous run of a topological order), so the pieces run in order. A single
    op no generator takes is a host op."""

    def __init__(self, lowerer: _Lowerer, node: Node):
        self.lowerer, self.node = lowerer, node
        self.body = node.regions[0]
        self.label = f"region {self.body.name}"
        self.users: dict[str, set[int]] = {}
        for n in self.body.nodes:
            for v in n.inputs:
                self.users.setdefault(v.name, set()).add(id(n))
        self.parts = 0
        # a piece reads the region's operands and makes its results under their outer names (a
        # body may name them otherwise, as after the precision stage), so the pieces run in the
        # outer program; only the values between pieces keep their body names
        self.outer = {bv.name: nv for bv, nv in zip(self.body.inputs, node.inputs)}
        self.outer.update({bv.name: nv for bv, nv in zip(self.body.outputs, node.outputs)})

    def lowered(self, err) -> LoweredNode:
        pieces = self.partition(list(self.body.nodes), err)
        made = {v.name: i for i, p in enumerate(pieces) for v in p.node.outputs}
        outs = {v.name for v in self.node.outputs}
        scratch = tuple(dict.fromkeys(v.name for i, p in enumerate(pieces) for v in p.node.inputs
                                      if made.get(v.name, i) != i and v.name not in outs))
        reason = (f"{_reason(err)}; split into {len(pieces)} pieces"
                  + (f", {len(scratch)} value(s) between them through DRAM (the fusion there is lost)"
                     if scratch else ""))
        return LoweredNode(self.node, "split", reason=reason, pieces=pieces, scratch=scratch)

    def partition(self, members: list[Node], err) -> list[LoweredNode]:
        low = self.lowerer
        if len(members) == 1:
            return [self.held(low.node(self.single(members[0]), of=self.label), members)]
        out = []
        for part in _cut(members, _culprit(members, err)):
            if len(part) == 1:
                out.append(self.held(low.node(self.single(part[0]), of=self.label), part))
                continue
            sub = self.piece(part)
            if _user_kernel_for(sub) is not None:
                out.append(self.held(low.node(sub, of=self.label), part))
                continue
            x, e = low.generated(sub, of=self.label)
            out += [self.held(x, part)] if x is not None else self.partition(part, e)
        return out

    @staticmethod
    def held(x: LoweredNode, part: list[Node]) -> LoweredNode:
        x.members = tuple(part)
        return x

    def piece(self, part: list[Node]) -> Node:
        """A region node of ``part``, built as fusion builds regions; it gives back what other
        nodes of the body, or the body's outputs, read."""
        from .fusion import region_kind, region_node

        inside = {id(n) for n in part}
        body_outs = {v.name for v in self.body.outputs}
        outs = [v for n in part for v in n.outputs
                if v.name in body_outs or self.users.get(v.name, set()) - inside]
        anchor = next((n for n in part if n.op.name in _ANCHORS), part[-1])
        self.parts += 1
        r = region_node(part, outs, region_kind(part), f"{self.body.name}_part{self.parts}", anchor.loc)
        return Node("region", self.renamed(r.inputs), r.attrs, self.renamed(r.outputs), r.loc, r.regions)

    def single(self, n: Node) -> Node:
        """A body op as a piece of its own, over the region's operands and results."""
        ins, outs = self.renamed(n.inputs), self.renamed(n.outputs)
        if all(a is b for a, b in zip(ins + outs, list(n.inputs) + list(n.outputs))):
            return n
        return Node(n.op, ins, n.attrs, outs, n.loc, n.regions)

    def renamed(self, values) -> list:
        return [self.outer.get(v.name, v) for v in values]


class _Failed(Exception):
    """Why a generated kernel is not usable, when codegen itself raised no UnsupportedRegionError."""


def _culprit(members: list[Node], err):
    """The body op codegen's error names: the node it gives, else one of that op at its source
    location, else the first of that op."""
    node = getattr(err, "node", None)
    if node is not None and any(n is node for n in members):
        return node
    op = getattr(err, "op", None)
    named = [n for n in members if n.op.name == op]
    at = [n for n in named if getattr(err, "loc", None) is not None and n.loc == err.loc]
    return (at or named or [None])[0]


_ANCHORS = {"attention", "linear", "matmul", "conv2d"}


def _cut(members: list[Node], culprit) -> list[list[Node]]:
    """Members in two or three convex parts, in an order they can run in, around the op codegen
    refused: for a contraction or attention, what feeds it (the op keeps its epilogue); for any
    other op, the op with what feeds it (the rest keeps its anchor); the op alone when that is
    all there is. With no op named, the two halves of program order."""
    if culprit is None:
        mid = len(members) // 2
        return [members[:mid], members[mid:]]
    before = _ancestors(culprit, members)
    if culprit.op.name in _ANCHORS and before:
        return [[n for n in members if id(n) in before], [n for n in members if id(n) not in before]]
    if len(before) + 1 < len(members) and culprit.op.name not in _ANCHORS:
        return [[n for n in members if id(n) in before or n is culprit],
                [n for n in members if id(n) not in before and n is not culprit]]
    after = _descendants(culprit, members)
    return [p for p in ([n for n in members if n is not culprit and id(n) not in after], [culprit],
                        [n for n in members if id(n) in after]) if p]


def _ancestors(node: Node, members: list[Node]) -> set[int]:
    """ids of the members whose results ``node`` reads, directly or not."""
    made_by = {v.name: n for n in members for v in n.outputs}
    out, stack = set(), list(node.inputs)
    while stack:
        n = made_by.get(stack.pop().name)
        if n is not None and id(n) not in out:
            out.add(id(n))
            stack.extend(n.inputs)
    return out


def _descendants(node: Node, members: list[Node]) -> set[int]:
    """ids of the members that read, directly or not, what ``node`` makes."""
    made, out = {v.name for v in node.outputs}, set()
    for n in members:  # program order: producers come first
        if n is not node and any(v.name in made for v in n.inputs):
            out.add(id(n))
            made |= {v.name for v in n.outputs}
    return out


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0][:160] if str(e) else ""


def _traces(gk, node: Node):
    """(the traced kernel, the operations its trace records, None), or (None, 0, the error) when the
    kernel language rejects it."""
    try:
        zeros = [np.zeros(tuple(int(d) for d in v.type.shape), v.type.dtype.numpy) for v in node.inputs]
        k = gk.kernel()
        trace = k.trace(*gk.arguments(zeros), target=gk.target)
        return k, len(trace.ops), None
    except MemoryError:
        raise
    except Exception as e:
        return None, 0, e


def lowering_stats(low: Lowering) -> dict:
    """Counts over what runs: the pieces of split regions are counted, the regions too."""
    by_kind: dict[str, int] = {}
    for x in low.kernels:
        by_kind[x.kind] = by_kind.get(x.kind, 0) + 1
    host: dict[str, int] = {}
    for x in low.host_ops:
        host[x.op] = host.get(x.op, 0) + 1
    return {"kernels": len(low.kernels), "generated": sum(x.how == "generated" for x in low.leaves),
            "split_regions": len(low.splits), "split_pieces": sum(len(x.pieces) for x in low.splits),
            "split": [{"region": x.label, "pieces": [y.label for y in x.pieces], "scratch": list(x.scratch),
                       "reason": x.reason} for x in low.splits],
            "user_kernels": len(low.replaced), "replaced": [x.label for x in low.replaced],
            "free_views": len(low.free_views), "host_ops": len(low.host_ops),
            "host_ops_by_op": host, "kernels_by_kind": by_kind,
            # only when there is one: a clean lowering's statistics read as they did
            **({"codegen_bugs": list(low.codegen_bugs)} if low.codegen_bugs else {}),
            **({"chip": low.chip.name} if low.chip is not None and low.chip.fused_pes > 1 else {}),
            **({"arrangements": {a.target: a.cycles for a in low.arrangements}}
               if low.arrangements else {})}


def _reason(e: Exception) -> str:
    return str(e).splitlines()[0][:200]


def _unique(name: str, taken: dict[str, int]) -> str:
    n = taken.get(name, 0) + 1
    taken[name] = n
    new = name if n == 1 else f"{name}_{n}"
    while new in taken and n > 1:  # "a_2" may itself be a module's name
        n += 1
        new = f"{name}_{n}"
    taken[new] = max(taken.get(new, 0), 1)
    return new


def _renamed(gk, name: str):
    if name == gk.name:
        return gk
    from dataclasses import replace

    src = re.sub(rf"\bdef {re.escape(gk.name)}\(", f"def {name}(", gk.source, count=1)
    return replace(gk, name=name, source=src)


# -- verification ------------------------------------------------------------------------------

@dataclass
class LoweringCheck:
    ok: bool
    kernels_run: int              # distinct kernels run in the kernel-language interpreter, per input set
    kernels_total: int
    max_abs: float                # chip-way outputs vs eager, worst over the input sets
    first_divergent: str | None = None   # "kernel <name> (region ...)"
    detail: str | None = None
    elapsed_s: float = 0.0
    input_sets: int = 1

    def summary(self) -> str:
        mark = "✓" if self.ok else "✗"
        return (f"{mark} kernels: {self.kernels_run} distinct of {self.kernels_total} run in the "
                f"kernel interpreter on {self.input_sets} input set(s); chip-way max abs err {self.max_abs:.2e}")


class _RunOnce:
    """A kernel whose outputs are kept from the check's run, so it runs once."""

    def __init__(self, x: LoweredNode):
        self.x, self.name, self.out = x, x.kernel.name, None

    def run(self, arrays, kernel=None):
        self.out = self.x.kernel.run(arrays, self.x.traced)
        return self.out


def _distinct_key(x: LoweredNode, arrays) -> tuple:
    from fexplore.lang.codegen.source import canonical_source

    src = canonical_source(x.kernel.source)
    return (x.kind, src, tuple(a.shape for a in arrays), tuple(str(a.dtype) for a in arrays))


class _ChipWay:
    """Runs nodes the chip way: each distinct kernel in the kernel-language interpreter, checked
    against its node in the IR interpreter; repeats, views and host ops by the IR interpreter; a
    split region piece by piece, its intermediates passed between pieces as DRAM would."""

    def __init__(self, bindings):
        self.bindings, self.seen = bindings, set()
        self.run = 0
        self.first = self.detail = None

    def node(self, x: LoweredNode | None, node: Node, ins: list) -> list:
        if x is not None and x.how == "split":
            body = node.regions[0]
            env = {v.name: a for v, a in zip(node.inputs, ins)}   # pieces read the outer names
            env.update({c.name: c.payload for c in body.constants})
            for i, p in enumerate(x.pieces):
                outs = self.leaf(p, p.node, [env[v.name] for v in p.node.inputs], (i, x))
                for v, a in zip(p.node.outputs, outs):
                    env[v.name] = np.asarray(a).astype(v.type.dtype.numpy, copy=False)
            return [env[v.name] for v in node.outputs]
        return self.leaf(x, node, ins)

    def leaf(self, x, node, ins, piece=None) -> list:
        if x is not None and x.kernel is not None and self.first is None:
            key = _distinct_key(x, ins)
            if key not in self.seen:
                self.seen.add(key)
                self.run += 1
                what = (f"kernel {x.name} ({x.how}, piece {piece[0] + 1} of {len(piece[1].pieces)} of split "
                        f"{piece[1].label}: {x.label})" if piece else f"kernel {x.name} ({x.how}, for {x.label})")
                try:
                    from fexplore.lang.codegen import check_kernel

                    once = _RunOnce(x)
                    with np.errstate(all="ignore"):
                        res = check_kernel(node, once, ins)
                    if res.ok:
                        return once.out
                    self.first = what
                    self.detail = (f"{what}: max abs error {res.max_abs_error:.3g} vs the IR "
                                   f"interpreter ({res.limit_exceeded_by:.3g}x the tolerance)")
                except MemoryError:   # no verdict on the kernel: the compile says the check could not run
                    raise
                except Exception as e:
                    self.first = what
                    self.detail = f"{what} raised {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        return evaluate_node(node, ins, self.bindings)


def check_lowering(graph: Graph, low: Lowering, oracle) -> LoweringCheck:
    """Run ``graph`` the chip way on each of the oracle's input sets (the example inputs and the
    random ones), against eager; see the module docstring. Each distinct kernel runs once per
    input set; the first divergent kernel (or piece of a split region) is named."""
    from fexplore.ir import bind_symbols

    from ..numeric import accept_tie_order, compare_with_oracle

    t0 = time.perf_counter()
    by_node = {id(x.node): x for x in low.nodes}
    worst, ok_all, run = 0.0, True, 0
    first = detail = None
    sets = list(zip(oracle.input_sets, oracle.expected))
    for k, (inputs, want) in enumerate(sets):
        arrays = [np.asarray(x) for x in inputs]
        chip = _ChipWay(bind_symbols(graph, arrays))
        env = {v.name: a for v, a in zip(graph.inputs, arrays)}
        env.update({c.name: c.payload for c in graph.constants})
        for node in graph.nodes:
            outs = chip.node(by_node.get(id(node)), node, [env[v.name] for v in node.inputs])
            for v, a in zip(node.outputs, outs):
                env[v.name] = np.asarray(a).astype(v.type.dtype.numpy, copy=False)
        run = max(run, chip.run)
        # sort/topk indices of tied values in another order count as equal, as in check_graph
        got = accept_tie_order(graph, inputs, [env[v.name] for v in graph.outputs], want)
        max_abs, _, ok, d = compare_with_oracle(graph, oracle, k, got)
        worst = max(worst, float(max_abs))
        where = "" if k == 0 else f" (random input set {k})"
        if chip.first is not None:
            first, detail, ok_all = chip.first + where, chip.detail + where, False
            break
        if not ok:
            ok_all, detail = False, f"chip-way outputs vs eager{where}: {d}"
            break
    return LoweringCheck(ok_all, run, len(low.kernels), worst, first, detail,
                         time.perf_counter() - t0, len(sets))
