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
"""

from __future__ import annotations

import numpy as np

from fexplore.ir import Constant, DType, Graph, Node, Value

from ..stage import StageResult
from .rewrite import Rewriter

POLICIES = {"fp32": None, "bf16": DType.bf16, "fp8": DType.fp8}
# Which operands of each contraction are narrowed (biases and masks stay f32).
_OPERANDS = {"linear": (0, 1), "matmul": (0, 1), "conv2d": (0, 1), "attention": (0, 1, 2)}


def precision(graph: Graph, options) -> StageResult:
    target = POLICIES[options.precision]
    if target is None:
        return StageResult(graph, {"policy": options.precision, "casts_inserted": 0,
                                   "weights_converted": 0, "contractions": 0}, [],
                           "policy fp32: nothing to narrow")
    p = _Policy(target)
    g = p.apply(graph, top=True)
    stats = {"policy": options.precision, "casts_inserted": p.casts,
             "weights_converted": len(p.converted), "contractions": p.contractions,
             "weight_bytes_saved": p.bytes_saved}
    summary = (f"policy {options.precision}: {p.contractions} contractions narrowed, "
               f"{len(p.converted)} weights converted, {p.casts} casts")
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
        if c.name not in self.converted and c.payload is None:   # a meta-device weight: the type only
            new = rw.constant(f"{c.name}.{self.dtype.value}", None, source=c.source,
                              type=c.type.with_dtype(self.dtype), digest=f"{c.digest}.{self.dtype.value}")
            itemsize = c.type.dtype.numpy.itemsize - self.dtype.numpy.itemsize
            self.bytes_saved += int(np.prod(c.type.shape)) * itemsize
            self.converted[c.name] = new
        elif c.name not in self.converted:
            payload = c.payload.astype(np.float32)
            if self.dtype == DType.fp8:  # saturate as the hardware does, instead of NaN
                payload = np.clip(payload, -448.0, 448.0)
            new = rw.constant(f"{c.name}.{self.dtype.value}", payload.astype(self.dtype.numpy),
                              source=c.source, type=c.type.with_dtype(self.dtype))
            self.bytes_saved += int(c.payload.nbytes - new.payload.nbytes)
            self.converted[c.name] = new
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
