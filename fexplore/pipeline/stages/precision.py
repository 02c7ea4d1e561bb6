"""precision: the cast policy, as a stage of its own so the error it introduces shows on its own.

- ``fp32`` (the default) changes nothing.
- ``bf16``: every contraction (linear, matmul, conv2d, attention) reads bf16 operands and
  accumulates in f32, writing the dtype its consumers expect (``out_dtype``), so epilogues, norms
  and softmax stay f32. Constant weights are converted once, at compile time (half the bytes);
  activations get a ``cast`` in front of the contraction.
- ``fp8``: the same with float8 e4m3 operands (f32 accumulation). Values beyond e4m3's range
  saturate at ±448; per-tensor scaling is not modelled yet.
Contractions inside fused regions are rewritten in place in their bodies; a weight that enters a
region as an operand is converted outside, so the region's operand itself is the narrow one.
A region's result that every consumer narrows on entry is then narrowed where it is made
(``narrow_at_producers``): the same values, half the bytes between the two kernels. Before that, a
cast moves back through ops that commute with rounding (a max pool, a relu, views, a concat) that
stand between two kernels (``narrow_through_exact_ops``), so they too run on the narrow bytes.
"""

from __future__ import annotations

import numpy as np

from fexplore.ir import Attrs, Category, Constant, DType, Graph, Node, TensorType, Value, get_op
from fexplore.ir.graph import unique_name

from ..stage import StageResult
from .fusion import region_kind, region_node
from .rewrite import Rewriter

POLICIES = {"fp32": None, "bf16": DType.bf16, "fp8": DType.fp8}
# Which operands of each contraction are narrowed (biases and masks stay f32).
_OPERANDS = {"linear": (0, 1), "matmul": (0, 1), "conv2d": (0, 1), "attention": (0, 1, 2),
             "grouped_matmul": (0, 1)}


def precision(graph: Graph, options) -> StageResult:
    target = POLICIES[options.precision]
    if target is None:
        return StageResult(graph, {"policy": options.precision, "casts_inserted": 0,
                                   "weights_converted": 0, "contractions": 0}, [],
                           "policy fp32: nothing to narrow")
    p = _Policy(target)
    g = p.apply(graph, top=True)
    g, through = narrow_through_exact_ops(g, target)
    p.rewrites.extend(through)
    g, moved = narrow_at_producers(g, target)
    p.rewrites.extend(moved)
    stats = {"policy": options.precision, "casts_inserted": p.casts,
             "weights_converted": len(p.converted), "contractions": p.contractions,
             "weight_bytes_saved": p.bytes_saved, "narrowed_at_producer": len(moved)}
    summary = (f"policy {options.precision}: {p.contractions} contractions narrowed, "
               f"{len(p.converted)} weights converted, {p.casts} casts"
               + (f", {len(moved)} region results narrowed where they are made" if moved else ""))
    return StageResult(g, stats, p.rewrites, summary)


class _Policy:
    def __init__(self, dtype: DType):
        self.dtype = dtype
        self.casts = 0
        self.contractions = 0
        self.bytes_saved = 0
        self.converted: dict[str, Constant] = {}
        self.rewrites = []

    def narrow_constant(self, rw: Rewriter, c: Constant) -> Constant:
        if c.name not in self.converted:
            self.converted[c.name] = _constant_in(rw, c, self.dtype)
            itemsize = c.type.dtype.numpy.itemsize - self.dtype.numpy.itemsize
            self.bytes_saved += int(np.prod(c.type.shape)) * itemsize
        elif all(x.name != self.converted[c.name].name for x in rw.constants):
            rw.constants.append(self.converted[c.name])
        return self.converted[c.name]

    def wants(self, v: Value) -> bool:
        return v.type.dtype.is_float and v.type.dtype != self.dtype

    def apply(self, graph: Graph, top: bool, renamed: dict | None = None) -> Graph:
        """``renamed`` maps body inputs that arrive already narrowed to their new Values."""
        rw = Rewriter(graph)
        for old_name, new in (renamed or {}).items():
            rw.replace(Value(old_name, new.type), new)
        cast_of: dict[str, Value] = {}

        def narrow(v: Value) -> Value:
            v = rw.lookup(v)
            if not self.wants(v):
                return v
            if top and isinstance(v, Constant) and (v.payload is not None or v.digest.startswith("meta-")):
                return self.narrow_constant(rw, v)
            if v.name not in cast_of:
                cast_of[v.name] = rw.emit("cast", [v], {"dtype": self.dtype},
                                          name=rw.fresh_name(f"{v.name}.{self.dtype.value}"),
                                          layout=v.type.layout)
                self.casts += 1
            return cast_of[v.name]

        for node in graph.nodes:
            ins = [rw.lookup(v) for v in node.inputs]
            if node.op.name == "region":
                self.region(rw, node, ins, top)
            elif node.op.name in _OPERANDS and any(
                    self.wants(ins[i]) for i in _OPERANDS[node.op.name] if i < len(ins)):
                for i in _OPERANDS[node.op.name]:
                    if i < len(ins):
                        ins[i] = narrow(ins[i])
                attrs = dict(node.attrs)
                attrs["out_dtype"] = node.outputs[0].type.dtype
                rw.rebuild(node, ins, attrs=attrs)
                self.contractions += 1
                rw.record(f"narrow-to-{self.dtype.value}", [node.name])
            else:
                rw.keep(node)
        self.rewrites.extend(rw.rewrites)
        return rw.finish()

    def region(self, rw: Rewriter, node: Node, ins: list[Value], top: bool) -> None:
        """Narrow a region's weight operands outside it, then rewrite its body."""
        body = node.regions[0]
        weights = _weight_inputs(body)
        new_ins, body_inputs, renamed = list(ins), list(body.inputs), {}
        for i, (outer, inner) in enumerate(zip(ins, body.inputs)):
            if top and i in weights and isinstance(outer, Constant) and self.wants(outer):
                new_ins[i] = self.narrow_constant(rw, outer)
                body_inputs[i] = Value(new_ins[i].name, new_ins[i].type)
                renamed[inner.name] = body_inputs[i]
        body = Graph(body.name, body_inputs, list(body.constants), list(body.nodes),
                     list(body.outputs), dict(body.symbols))
        rw.rebuild(node, new_ins, regions=[self.apply(body, top=False, renamed=renamed)])


def _weight_inputs(body: Graph) -> set[int]:
    """Positions of body inputs read only as a contraction's weight operand."""
    names = {v.name: i for i, v in enumerate(body.inputs)}
    uses: dict[str, list[bool]] = {}
    for n in body.nodes:
        for j, v in enumerate(n.inputs):
            is_weight = n.op.name in ("linear", "matmul", "conv2d") and j == 1
            uses.setdefault(v.name, []).append(is_weight)
    return {names[k] for k, flags in uses.items() if k in names and all(flags)}


def _constant_in(rw: Rewriter, c: Constant, dtype: DType) -> Constant:
    """``c`` converted to ``dtype`` once, at compile time (fp8 saturating, as the hardware does,
    instead of NaN); a meta-device weight by its type alone."""
    if c.payload is None:
        return rw.constant(f"{c.name}.{dtype.value}", None, source=c.source,
                           type=c.type.with_dtype(dtype), digest=f"{c.digest}.{dtype.value}")
    payload = c.payload.astype(np.float32)
    if dtype == DType.fp8:
        payload = np.clip(payload, -448.0, 448.0)
    return rw.constant(f"{c.name}.{dtype.value}", payload.astype(dtype.numpy), source=c.source,
                       type=c.type.with_dtype(dtype))


# Ops that only move data: a cast commutes with them.
_DATA_ONLY = {"reshape", "permute", "slice", "select", "split", "expand", "relayout"}


# Ops whose result, on inputs narrowed to a float dtype, is their result narrowed: a max picks one
# of its inputs, a view or a copy moves them (rounding commutes with all of these)
_EXACT_UNDER_ROUNDING = {"max_pool2d", "relu"} | _DATA_ONLY | {"concat"}


def narrow_through_exact_ops(graph: Graph, dtype: DType) -> tuple[Graph, list]:
    """An op of `_EXACT_UNDER_ROUNDING` outside any region (a stem's max pool between two
    convolutions) whose every consumer narrows its result to ``dtype`` on entry runs on narrowed
    inputs instead: a cast in front of it, its consumers' casts gone. The values are the same; the
    op reads and writes half the bytes, and `narrow_at_producers` then narrows the region that makes
    its input. Repeated until nothing moves, so a cast walks back through a chain of such ops."""
    outputs = {v.name for v in graph.outputs}
    rewrites = []
    while True:
        uses = _uses(graph)
        picked = {}
        for n in graph.nodes:
            if n.op.name not in _EXACT_UNDER_ROUNDING or n.regions or len(n.outputs) != 1:
                continue
            v = n.outputs[0]
            wide = [i for i, x in enumerate(n.inputs) if x.type.dtype.is_float and x.type.dtype != dtype]
            if v.name in outputs or not v.type.dtype.is_float or v.type.dtype == dtype or not wide or \
                    any(not x.type.dtype.is_float for x in n.inputs):
                continue
            if v.name in uses and all(_narrows_on_entry(u, i, dtype) for u, i in uses[v.name]):
                picked[id(n)] = wide
        if not picked:
            return graph, rewrites
        narrowed = {n.outputs[0].name for n in graph.nodes if id(n) in picked}
        rw = Rewriter(graph)
        converted: dict[str, Constant] = {}
        for n in graph.nodes:
            ins = [rw.lookup(v) for v in n.inputs]
            entering = {i for i, v in enumerate(n.inputs) if v.name in narrowed}
            if id(n) in picked:
                for i in picked[id(n)]:
                    if isinstance(ins[i], Constant):   # converted now, not by a kernel at run time
                        if ins[i].name not in converted:
                            converted[ins[i].name] = _constant_in(rw, ins[i], dtype)
                        ins[i] = converted[ins[i].name]
                        continue
                    ins[i] = rw.emit("cast", [ins[i]], {"dtype": dtype},
                                     name=rw.fresh_name(f"{n.inputs[i].name}_narrow"), loc=n.loc,
                                     layout=ins[i].type.layout)   # computes in its input's layout
                rw.rebuild(n, ins)
                rw.record(f"narrow-through-{n.op.name}-{dtype.value}", [n.outputs[0].name])
            elif n.op.name == "region" and entering:
                rw.rebuild(n, ins, regions=[_drop_entry_casts(n.regions[0], entering, dtype)])
            elif entering:   # a cast to dtype at the top level: its input is narrow already
                rw.replace(n.outputs[0], ins[0])
            else:
                rw.keep(n)
        graph = rw.finish()
        rewrites.extend(rw.rewrites)


# regions whose kernel writes any number of results row by row (a second, narrow copy of one is
# one more store of the rows it has in SRAM)
_ROW_KINDS = ("norm", "elementwise", "softmax")


def narrow_at_producers(graph: Graph, dtype: DType) -> tuple[Graph, list]:
    """A region's result that every consumer narrows to ``dtype`` on entry (a cast, perhaps after
    views) is narrowed in the region that makes it instead, as the last op of its epilogue.

    The values are the same (the same cast, earlier; views commute with it), but the tensor
    between the two kernels is half the bytes, and a consumer that re-reads it tile by tile (a
    contraction reads its left operand once per column tile) no longer casts it each time. The
    model's own outputs keep their dtype.

    A row-wise region's result that some consumers read wide and others narrow (a post-norm
    encoder's layer norm: the next residual add reads it in f32, the projections in bf16) is
    written both ways: the narrow copy is one more result of the region, which the narrowing
    consumers read, instead of a cast kernel reading the wide one back. A row-wise op left outside
    any region (a norm whose residual add an epilogue took) becomes a region of itself and the
    cast, for the same reason."""
    outputs = {v.name for v in graph.outputs}
    uses = _uses(graph)
    narrowed, both = {}, {}
    for n in graph.nodes:
        if n.op.name != "region":
            continue
        for v in n.outputs:
            if v.name in outputs or not v.type.dtype.is_float or v.type.dtype == dtype:
                continue
            made = {o.name for m in n.regions[0].nodes for o in m.outputs}
            inner = n.regions[0].outputs[n.outputs.index(v)]
            if inner.name not in made or [o.name for o in n.regions[0].outputs].count(inner.name) > 1:
                continue   # a body input passed through, or one value returned twice: left alone
            narrowing = [(u, i) for u, i in uses.get(v.name, []) if _narrows_on_entry(u, i, dtype)]
            if narrowing and len(narrowing) == len(uses[v.name]):
                narrowed[v.name] = n
            elif narrowing and n.attrs["kind"] in _ROW_KINDS:
                both[v.name] = narrowing
    for n in graph.nodes:   # bare row-wise ops whose result some consumer narrows
        v = n.outputs[0] if len(n.outputs) == 1 else None
        if v is None or n.regions or not _row_wise(n) or v.name in outputs or not v.type.dtype.is_float or \
                v.type.dtype == dtype:
            continue
        narrowing = [(u, i) for u, i in uses.get(v.name, []) if _narrows_on_entry(u, i, dtype)]
        if narrowing:
            both[v.name] = narrowing
    if not narrowed and not both:
        return graph, []
    rw = Rewriter(graph)
    narrow_copy: dict[str, Value] = {}   # wide result -> its narrow copy
    reads_copy = {(id(u), i): name for name, readers in both.items() for u, i in readers}
    copy_names = {}
    for name, readers in both.items():
        casts = [u.outputs[0].name for u, _ in readers if u.op.name == "cast"]
        if casts:
            copy_names[name] = casts[0]
    for n in graph.nodes:
        ins = [rw.lookup(v) for v in n.inputs]
        copies = {i: narrow_copy[reads_copy[id(n), i]] for i in range(len(ins)) if (id(n), i) in reads_copy}
        entering = {i for i, v in enumerate(n.inputs) if v.name in narrowed} | set(copies)
        leaving = {j for j, v in enumerate(n.outputs) if v.name in narrowed}
        doubled = [j for j, v in enumerate(n.outputs) if v.name in both]
        for i, c in copies.items():
            ins[i] = c
        if n.op.name != "region" and doubled:   # a bare row-wise op: a region of it and its cast
            rw.keep(n)
            op = rw.nodes.pop()
            body, (narrow,) = _narrow_copies(Graph("copy", [], [], [op], list(op.outputs), {}), [0], dtype, n.loc, rw,
                                             copy_names)
            wide_read = len(both[n.outputs[0].name]) < len(uses[n.outputs[0].name])
            outs = ([op.outputs[0]] if wide_read else []) + [body.outputs[-1]]
            rw.nodes.append(region_node(list(body.nodes), outs, region_kind([op]),
                                        f"{region_kind([op])}_{n.name}".replace(".", "_"), n.loc))
            narrow_copy[n.outputs[0].name] = narrow
        elif n.op.name == "region" and (entering or leaving or doubled):
            body = _drop_entry_casts(n.regions[0], entering, dtype) if entering else n.regions[0]
            body = _cast_exits(body, leaving, dtype, n.loc) if leaving else body
            body, extra = _narrow_copies(body, doubled, dtype, n.loc, rw, copy_names) if doubled else (body, [])
            rebuilt = rw.rebuild(n, ins, regions=[body])
            if extra:
                rw.nodes[-1] = Node(rebuilt.op, rebuilt.inputs, rebuilt.attrs, rebuilt.outputs + tuple(extra),
                                    rebuilt.loc, rebuilt.regions)
                for j, c in zip(doubled, extra):
                    narrow_copy[n.outputs[j].name] = c
        elif entering:   # a cast to dtype at the top level: its input is narrow already
            rw.replace(n.outputs[0], ins[0])
        else:
            rw.keep(n)
    for name, n in narrowed.items():
        rw.record(f"narrow-at-producer-{dtype.value}", [n.name], [name])
    for name, c in narrow_copy.items():
        rw.record(f"narrow-copy-at-producer-{dtype.value}", [name], [c.name])
    return rw.finish(), rw.rewrites


def _cast(x: Value, name: str, dtype: DType, loc) -> Node:
    """A cast of `x` to `dtype` whose result, `name`, keeps `x`'s layout."""
    cast = get_op("cast")
    attrs = Attrs(cast.complete_attrs({"dtype": dtype}))
    (t,) = cast.infer_types([x.type], attrs)
    return Node(cast, [x], attrs, [Value(name, TensorType(t.shape, t.dtype, x.type.layout))], loc)


def _row_wise(n: Node) -> bool:
    """An op a row-wise (vector) region computes: elementwise, a norm, a softmax."""
    return n.op.category == Category.elementwise or n.op.name in ("layer_norm", "rms_norm", "softmax", "log_softmax")


def _narrow_copies(body: Graph, doubled: list[int], dtype: DType, loc, rw: Rewriter,
                   names: dict[str, str]) -> tuple[Graph, list[Value]]:
    """The body with a cast to ``dtype`` of each result ``doubled`` returned as one more result;
    the region's new results (named as the body's, as a region's results are). ``names``: the
    name to give the copy of a result, if it has one."""
    nodes, outs, extra = list(body.nodes), list(body.outputs), []
    for j in doubled:
        o = body.outputs[j]
        # named as the cast it stands for, where there is one at the top level (dropped, so free)
        nodes.append(_cast(o, names.get(o.name) or rw.fresh_name(f"{o.name}.{dtype.value}"), dtype, loc))
        narrow = nodes[-1].outputs[0]
        outs.append(narrow)
        extra.append(Value(narrow.name, narrow.type))
    return Graph(body.name, list(body.inputs), list(body.constants), nodes, outs, dict(body.symbols)), extra


def _uses(graph: Graph) -> dict[str, list[tuple[Node, int]]]:
    """Each value's readers: (node, input index)."""
    uses: dict[str, list[tuple[Node, int]]] = {}
    for n in graph.nodes:
        for i, v in enumerate(n.inputs):
            uses.setdefault(v.name, []).append((n, i))
    return uses


def _narrows_on_entry(user: Node, i: int, dtype: DType) -> bool:
    if user.op.name == "cast":
        return user.attrs["dtype"] == dtype
    if user.op.name != "region":
        return False
    body = user.regions[0]
    inner: dict[str, list[Node]] = {}
    for n in body.nodes:
        for v in n.inputs:
            inner.setdefault(v.name, []).append(n)
    body_outputs = {v.name for v in body.outputs}
    stack = [body.inputs[i].name]
    while stack:
        name = stack.pop()
        if name in body_outputs:
            return False
        for n in inner.get(name, []):
            if n.op.name == "cast" and n.attrs["dtype"] == dtype:
                continue
            if n.op.name not in _DATA_ONLY:
                return False
            stack.extend(o.name for o in n.outputs)
    return True


def _drop_entry_casts(body: Graph, entering: set[int], dtype: DType) -> Graph:
    """The body with inputs ``entering`` arriving as ``dtype``: its views re-typed, its casts to
    ``dtype`` of them gone."""
    inputs = [Value(v.name, v.type.with_dtype(dtype)) if i in entering else v for i, v in enumerate(body.inputs)]
    rw = Rewriter(Graph(body.name, inputs, list(body.constants), list(body.nodes), list(body.outputs),
                        dict(body.symbols)))
    for old, new in zip(body.inputs, inputs):
        rw.replace(old, new)
    for n in body.nodes:
        ins = [rw.lookup(v) for v in n.inputs]
        if n.op.name == "cast" and n.attrs["dtype"] == dtype and ins[0].type.dtype == dtype:
            rw.replace(n.outputs[0], ins[0])
        else:
            rw.keep(n)
    return rw.finish(prune=False)


def _cast_exits(body: Graph, leaving: set[int], dtype: DType, loc) -> Graph:
    """The body with results ``leaving`` cast to ``dtype`` last. A region's results are named as
    its body's outputs, so the cast takes the result's name and the wide value a new one."""
    taken = {v.name for v in body.inputs} | {c.name for c in body.constants} | \
        {v.name for n in body.nodes for v in n.outputs}
    wide = {body.outputs[j].name: Value(unique_name(f"{body.outputs[j].name}.wide", taken), body.outputs[j].type)
            for j in leaving}
    nodes = []
    for n in body.nodes:
        ins = [wide.get(v.name, v) for v in n.inputs]
        outs = [wide.get(v.name, v) for v in n.outputs]
        same = all(a is b for a, b in zip(ins + outs, list(n.inputs) + list(n.outputs)))
        nodes.append(n if same else Node(n.op, ins, n.attrs, outs, n.loc, n.regions))
    outs = list(body.outputs)
    for j in sorted(leaving):
        nodes.append(_cast(wide[outs[j].name], outs[j].name, dtype, loc))
        outs[j] = nodes[-1].outputs[0]
    return Graph(body.name, list(body.inputs), list(body.constants), nodes, outs, dict(body.symbols))
