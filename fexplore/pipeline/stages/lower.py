"""lower: every node of the final graph becomes a kernel-language kernel, a free view or a host op.

- a fused ``region`` or a plain op with a codegen part -> a generated kernel
  (``fexplore.lang.codegen.generate``), or a user kernel registered with
  ``fexplore.register_kernel(match, kernel)`` for its region kind, op name or a predicate;
- a ``reshape`` of a row-major tensor moves no data -> a free view (no kernel, no cost);
- anything codegen has no part for yet (gathers, relayouts, pooling, sort, ...) -> an explicit
  host op, with the reason codegen gave; counted and listed in the stats and the summary.

Design. The graph is not rewritten: every node keeps its body, which stays its meaning, so the IR
interpreter, printer, parser, diff and graph views work on the lowered program unchanged, and the
IR layer needs to know nothing of the kernel language. What lowering decided lives beside the
graph, in a ``Lowering`` (the stage result's and record's ``lowering``): one ``LoweredNode`` per
top-level node, naming the node (its output value, stable across stages) and holding its kernel.
The CompiledModel exposes the kernels as ``cm.kernels``. Kernel names are unique per compile:
two regions of one module get ``_2``, ``_3`` suffixes, in the source too.

Verification (``check_lowering``, called by the driver's hook besides the graph-vs-eager check):
the program is run the chip way on the example inputs: each node computed by its kernel in the
kernel-language interpreter, host ops and free views by the IR interpreter, and each kernel's
outputs compared with its node run by the IR interpreter on the same inputs (the dtype's
tolerance, ``codegen.check_kernel``); the first kernel that leaves it is named. To stay cheap on
big graphs, each distinct kernel (same source up to its name, same input shapes) is run once; its
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
        raise TypeError("match is a region kind, an op name or a predicate over nodes")
    if not callable(kernel):
        raise TypeError("kernel must be an fl.kernel (or a callable taking the node's inputs)")
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
    """What one top-level node became. ``how``: "generated", "user", "free view" or "host"."""

    node: Node
    how: str
    kernel: Any = None            # GeneratedKernel or UserKernel; None for views and host ops
    reason: str = ""              # why a host op (codegen's words)
    traced: Any = None            # the generated source executed: its fexplore.lang.Kernel

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
        extra = f": {self.reason}" if self.reason else ""
        return f"<{self.name}: {what} for {self.label}{extra}>"


@dataclass
class Lowering:
    target: str
    nodes: list[LoweredNode] = field(default_factory=list)

    @property
    def kernels(self) -> list[LoweredNode]:
        return [x for x in self.nodes if x.kernel is not None]

    @property
    def host_ops(self) -> list[LoweredNode]:
        return [x for x in self.nodes if x.how == "host"]

    @property
    def free_views(self) -> list[LoweredNode]:
        return [x for x in self.nodes if x.how == "free view"]

    @property
    def replaced(self) -> list[LoweredNode]:
        return [x for x in self.nodes if x.how == "user"]

    def __getitem__(self, name: str) -> LoweredNode:
        for x in self.nodes:
            if x.name == name or x.node.name == name:
                return x
        raise KeyError(name)


# -- the stage ---------------------------------------------------------------------------------

def _free_view(node: Node) -> bool:
    """A reshape of a row-major tensor to a row-major result moves no data."""
    return node.op.name == "reshape" and node.inputs[0].type.layout is None \
        and node.outputs[0].type.layout is None


def lower(graph: Graph, options) -> StageResult:
    from fexplore.lang import codegen  # lazy: the pipeline imports the kernel language only here

    target = options.target
    low = Lowering(target if isinstance(target, str) else getattr(target, "name", str(target)))
    taken: dict[str, int] = {}
    for node in graph.nodes:
        if _free_view(node):
            low.nodes.append(LoweredNode(node, "free view"))
            continue
        user = _user_kernel_for(node)
        if user is not None:
            name = _unique(getattr(user, "name", None) or "user_kernel", taken)
            shapes = tuple(tuple(v.type.shape) for v in node.outputs)
            from fexplore.npu import get_target

            low.nodes.append(LoweredNode(node, "user", UserKernel(name, user, get_target(target), shapes)))
            continue
        try:
            gk = codegen.generate(node, target)
        except codegen.UnsupportedRegionError as e:
            low.nodes.append(LoweredNode(node, "host", reason=_reason(e)))
            continue
        except Exception as e:  # a generator that fails is a host op too, saying so
            low.nodes.append(LoweredNode(node, "host", reason=f"codegen failed: {type(e).__name__}: "
                                                               f"{str(e).splitlines()[0][:160] if str(e) else ''}"))
            continue
        gk = _renamed(gk, _unique(gk.name, taken))
        traced, why = _traces(gk, node)
        if why:  # a generator that writes a kernel the kernel language rejects: said, not hidden
            low.nodes.append(LoweredNode(node, "host", reason=f"generated kernel {gk.name} does not "
                                                               f"trace (a codegen bug): {why}"))
            continue
        low.nodes.append(LoweredNode(node, "generated", gk, traced=traced))
    stats = lowering_stats(low)
    host = ", host ops: " + ", ".join(f"{k}×{v}" for k, v in stats["host_ops_by_op"].items()) \
        if low.host_ops else ""
    user = f", {len(low.replaced)} user kernel(s)" if low.replaced else ""
    summary = (f"{stats['kernels']} kernels ({stats['generated']} generated{user}), "
               f"{stats['free_views']} free views, {stats['host_ops']} host ops{host}")
    return StageResult(graph, stats, [], summary, lowering=low)


def _traces(gk, node: Node):
    """(the traced kernel, None), or (None, why) when the kernel language rejects the source."""
    try:
        zeros = [np.zeros(tuple(int(d) for d in v.type.shape), v.type.dtype.numpy) for v in node.inputs]
        k = gk.kernel()
        k.trace(*gk.arguments(zeros), target=gk.target)
        return k, None
    except Exception as e:
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def lowering_stats(low: Lowering) -> dict:
    by_kind: dict[str, int] = {}
    for x in low.kernels:
        by_kind[x.kind] = by_kind.get(x.kind, 0) + 1
    host: dict[str, int] = {}
    for x in low.host_ops:
        host[x.op] = host.get(x.op, 0) + 1
    return {"kernels": len(low.kernels), "generated": sum(x.how == "generated" for x in low.nodes),
            "user_kernels": len(low.replaced), "replaced": [x.label for x in low.replaced],
            "free_views": len(low.free_views), "host_ops": len(low.host_ops),
            "host_ops_by_op": host, "kernels_by_kind": by_kind}


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
    kernels_run: int              # distinct kernels run in the kernel-language interpreter
    kernels_total: int
    max_abs: float                # chip-way outputs vs eager
    first_divergent: str | None = None   # "kernel <name> (region ...)"
    detail: str | None = None
    elapsed_s: float = 0.0

    def summary(self) -> str:
        mark = "✓" if self.ok else "✗"
        return (f"{mark} kernels: {self.kernels_run} distinct of {self.kernels_total} run in the "
                f"kernel interpreter; chip-way max abs err {self.max_abs:.2e}")


class _RunOnce:
    """A kernel whose outputs are kept from the check's run, so it runs once."""

    def __init__(self, x: LoweredNode):
        self.x, self.name, self.out = x, x.kernel.name, None

    def run(self, arrays, kernel=None):
        self.out = self.x.kernel.run(arrays, self.x.traced)
        return self.out


def _distinct_key(x: LoweredNode, arrays) -> tuple:
    src = x.kernel.source.replace(x.kernel.name, "<k>")
    return (x.kind, src, tuple(a.shape for a in arrays), tuple(str(a.dtype) for a in arrays))


def check_lowering(graph: Graph, low: Lowering, oracle) -> LoweringCheck:
    """Run ``graph`` the chip way on the oracle's example inputs, against eager; see the module
    docstring."""
    from fexplore.ir import bind_symbols
    from fexplore.lang.codegen import check_kernel

    from ..numeric import TOLERANCES, accept_tie_order, compare, compute_dtype

    inputs, want, noise = oracle.input_sets[0], oracle.expected[0], oracle.noise[0]
    t0 = time.perf_counter()
    arrays = [np.asarray(x) for x in inputs]
    bindings = bind_symbols(graph, arrays)
    env = {v.name: a for v, a in zip(graph.inputs, arrays)}
    env.update({c.name: c.payload for c in graph.constants})
    by_node = {id(x.node): x for x in low.nodes}
    seen: set = set()
    run = 0
    first, detail = None, None
    for node in graph.nodes:
        ins = [env[v.name] for v in node.inputs]
        x = by_node.get(id(node))
        outs = None
        if x is not None and x.kernel is not None and first is None:
            key = _distinct_key(x, ins)
            if key not in seen:
                seen.add(key)
                run += 1
                try:
                    once = _RunOnce(x)
                    with np.errstate(all="ignore"):
                        res = check_kernel(node, once, ins)
                    if res.ok:
                        outs = once.out
                    else:
                        first = f"kernel {x.name} ({x.how}, for {x.label})"
                        detail = (f"{first}: max abs error {res.max_abs_error:.3g} vs the IR "
                                  f"interpreter ({res.limit_exceeded_by:.3g}x the tolerance)")
                except Exception as e:
                    first = f"kernel {x.name} ({x.how}, for {x.label})"
                    detail = f"{first} raised {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        if outs is None:
            outs = evaluate_node(node, ins, bindings)
        for v, a in zip(node.outputs, outs):
            env[v.name] = np.asarray(a).astype(v.type.dtype.numpy, copy=False)
    # sort/topk indices of tied values in another order count as equal, as in check_graph
    got = accept_tie_order(graph, inputs, [env[v.name] for v in graph.outputs], want)
    max_abs, _, ok, d = compare(got, want, TOLERANCES[compute_dtype(graph)], noise)
    if first is not None:
        ok = False
    elif not ok:
        detail = f"chip-way outputs vs eager: {d}"
    return LoweringCheck(ok, run, len(low.kernels), float(max_abs), first, detail,
                         time.perf_counter() - t0)
