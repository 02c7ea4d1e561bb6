"""ONNX ingestion: an ``onnx.ModelProto`` (or a ``.onnx`` path) becomes an IR Graph.

Initializers become named constants (the ONNX name, payload shared with the loaded model);
graph inputs become graph inputs whose ``dim_param`` dims are symbolic dims of the same name;
every node becomes IR nodes through the ONNX converter registry, each carrying the node's name
and op type as its provenance. Values known at import time (initializers, Constant nodes, the
shapes ``Shape`` reads off typed values and small computations on them) are tracked beside the
IR, so the shape arithmetic an exporter writes (Shape -> Gather -> Concat -> Reshape) resolves
to the IR's static or symbolic dims instead of tensors. A shape-like operand that arrives as a
graph input (Reshape's shape, TopK's k...) is frozen to its example value and recorded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sympy

from fexplore.errors import ErrorDoc, FexploreError, InputError, SourceLoc, UnsupportedOperatorError
from fexplore.ir import DType, Graph, TensorType, Value
from fexplore.ir.types import symbol

from ..ingest import GraphBuilder, IngestionError
from ..symbols import SymbolTable
from .registry import MIN_OPSET, OnnxContext, OnnxConversionError, lookup, registered_opsets


class OnnxModelError(FexploreError):
    """The ONNX model cannot be read, or the example inputs do not fit its graph."""

    code = "FX411"
    doc = ErrorDoc(
        when="The ONNX model cannot be read (no file, not a model, external data not loaded, an "
             "opset too old to upgrade), or the example inputs do not fit its graph: their count, "
             "dtypes, ranks or fixed dims.",
        example="fexplore.compile(onnx_model, [x, y])   # the graph takes one input",
        fix="Pass numpy arrays in the graph's input order, with the dtypes and fixed dims the "
            "model declares; pass the .onnx path when its weights are external data.")


def onnx_dtype(elem_type: int) -> DType:
    from onnx import TensorProto as T

    table = {T.FLOAT: DType.f32, T.DOUBLE: DType.f64, T.FLOAT16: DType.f16,
             T.BFLOAT16: DType.bf16, T.FLOAT8E4M3FN: DType.fp8, T.INT64: DType.i64,
             T.INT32: DType.i32, T.INT16: DType.i16, T.INT8: DType.i8, T.UINT64: DType.u64,
             T.UINT32: DType.u32, T.UINT16: DType.u16, T.UINT8: DType.u8, T.BOOL: DType.bool}
    if elem_type not in table:
        from onnx import helper

        name = helper.tensor_dtype_to_string(elem_type) if elem_type else "undefined"
        raise TypeError(f"ONNX element type {name} has no IR counterpart "
                        f"(the IR has {', '.join(d.value for d in table.values())})")
    return table[elem_type]


def ir_to_onnx_dtype(dt: DType) -> int:
    from onnx import TensorProto as T

    return {DType.f32: T.FLOAT, DType.f64: T.DOUBLE, DType.f16: T.FLOAT16, DType.bf16: T.BFLOAT16,
            DType.fp8: T.FLOAT8E4M3FN, DType.i64: T.INT64, DType.i32: T.INT32, DType.i16: T.INT16,
            DType.i8: T.INT8, DType.u64: T.UINT64, DType.u32: T.UINT32, DType.u16: T.UINT16,
            DType.u8: T.UINT8, DType.bool: T.BOOL}[dt]


def is_onnx_model(model) -> bool:
    """Whether ``model`` is for the ONNX door: a ModelProto or a path to a ``.onnx`` file."""
    if isinstance(model, (str, os.PathLike)):
        return str(model).endswith(".onnx")
    return type(model).__name__ == "ModelProto" and type(model).__module__.startswith("onnx")


def load_model(model):
    """(ModelProto, path or None). A path loads with its external data (weights stored beside
    the file); a ModelProto whose tensors point at external data needs them loaded already."""
    try:
        import onnx
    except ImportError:
        raise OnnxModelError("the ONNX door needs the onnx package",
                             hint="pip install 'fexplore[onnx]' (onnx and onnxruntime)") from None
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise OnnxModelError(f"no ONNX file at {path}")
        try:
            proto = onnx.load(path, load_external_data=True)
        except Exception as e:
            raise OnnxModelError(f"cannot read {path} as an ONNX model: {e}") from None
        return proto, path
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            raise OnnxModelError(
                f"initializer {init.name!r} is stored as external data that is not loaded",
                hint="pass the .onnx path (its external data is read from beside it), or "
                     "onnx.load_external_data_for_model(model, folder) first")
    return model, None


def model_opset(proto) -> int:
    for o in proto.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return MIN_OPSET


def upgraded(proto):
    """The model at opset 13 or newer: an older one goes through onnx's version converter."""
    opset = model_opset(proto)
    if opset >= MIN_OPSET:
        return proto, None
    import onnx.version_converter

    try:
        new = onnx.version_converter.convert_version(proto, MIN_OPSET)
    except Exception as e:
        raise OnnxModelError(
            f"the model is at opset {opset}; fexplore reads opsets {MIN_OPSET} and newer and "
            f"onnx's version converter could not upgrade it ({str(e).splitlines()[0][:200]})",
            hint=f"re-export the model at opset {MIN_OPSET} or newer") from None
    # an adapter may change the graph's own inputs (Scan-8's batch axis is dropped): the
    # example inputs, made for the model as exported, would no longer fit it
    for before, after in zip(proto.graph.input, new.graph.input):
        if _declared_shape(before) != _declared_shape(after):
            raise OnnxModelError(
                f"the model is at opset {opset}; upgrading it to opset {MIN_OPSET} with onnx's "
                f"version converter changed input {before.name!r} from shape "
                f"{_declared_shape(before)} to {_declared_shape(after)}",
                hint=f"re-export the model at opset {MIN_OPSET} or newer")
    return new, f"upgraded from opset {opset} to {MIN_OPSET} by onnx.version_converter"


def _declared_shape(value_info) -> list | None:
    tt = value_info.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in tt.shape.dim]


@dataclass
class OnnxIngested:
    """What ingestion made of an ONNX model; CompiledModel and the oracle read it."""

    graph: Graph
    model: Any                      # the (possibly upgraded) ModelProto
    input_names: list[str]
    output_names: list[str]
    frozen: dict[int, np.ndarray]   # graph input position -> the example value it was frozen to
    notes: list[str] = field(default_factory=list)
    opset: int = MIN_OPSET
    # the torch door's fields, absent here
    in_spec: Any = None
    out_spec: Any = None
    exported: Any = None

    @property
    def frozen_names(self) -> dict[str, np.ndarray]:
        return {self.input_names[i]: v for i, v in self.frozen.items()}


def graph_inputs(proto) -> list:
    """The graph's real inputs: old exporters also list every initializer as an input."""
    inits = {i.name for i in proto.graph.initializer}
    return [i for i in proto.graph.input if i.name not in inits]


def ingest_onnx(model, example_inputs, *, name: str = "forward") -> OnnxIngested:
    proto, _ = load_model(model)
    proto, note = upgraded(proto)
    opset = model_opset(proto)
    arrays = [np.asarray(a) for a in example_inputs]
    ins = graph_inputs(proto)
    if len(arrays) != len(ins):
        raise OnnxModelError(
            f"the model takes {len(ins)} inputs ({', '.join(i.name for i in ins)}), "
            f"got {len(arrays)} example inputs",
            hint="pass numpy arrays in the graph's input order")
    pinned: dict[str, int] = {}
    while True:   # a converter that needs a dim_param fixed asks once; the import starts over
        imp = _Importer(proto.graph, opset, SymbolTable(), parent=None)
        imp.domain_opsets = {o.domain: o.version for o in proto.opset_import}
        imp.pinned = pinned
        imp.bind_inputs(ins, arrays)
        try:
            graph = imp.convert(name)
            break
        except _Pin as p:
            pinned[p.dim] = p.size
    notes = [note] if note else []
    for dim, size in pinned.items():
        notes.append(f"dim {dim!r} is fixed at {size}: the model needs it equal to that size "
                     f"(a call with another size is refused)")
    for i, v in sorted(imp.frozen.items()):
        notes.append(f"input {ins[i].name!r} is a shape-like operand: frozen to its example "
                     f"value {np.asarray(v).tolist()!r} (a call with another value is refused)")
    return OnnxIngested(graph, proto, [i.name for i in ins],
                        [o.name for o in proto.graph.output], dict(imp.frozen), notes, opset)


# ONNX ops whose result is known whenever their inputs are (deterministic, no subgraph).
_NEVER_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
               "Multinomial", "Bernoulli", "If", "Loop", "Scan", "SequenceConstruct",
               "Dropout"}
_FOLD_LIMIT = 1 << 16  # elements: folding is for shape arithmetic, not for weight preprocessing


class _Pin(Exception):
    """Raised by ``_Importer.pin``: import again with ``dim`` (a dim_param) fixed at ``size``."""

    def __init__(self, dim: str, size: int):
        super().__init__(dim)
        self.dim, self.size = dim, size


class _Importer:
    def __init__(self, graph_proto, opset: int, symbols: SymbolTable, parent: "_Importer | None"):
        self.gp = graph_proto
        self.opset = opset
        self.parent = parent
        self.b = GraphBuilder(symbols)
        self.env: dict[str, Value] = {}
        self.known: dict[str, np.ndarray] = {}
        self.inputs: list[Value] = []
        self.input_pos: dict[str, int] = {}
        self.examples: dict[str, np.ndarray] = {}
        self.frozen: dict[int, np.ndarray] = {}
        self.symbols: dict[str, tuple] = {}
        self.pinned: dict[str, int] = dict(parent.pinned) if parent else {}   # dim_param -> its size
        self.captured: list[str] = []   # a branch: outer values it reads, in order
        self.producers: dict[str, Any] = {}  # ONNX value name -> the node computing it
        self.domain_opsets: dict[str, int] = dict(parent.domain_opsets) if parent else {}
        from onnx import numpy_helper

        for init in graph_proto.initializer:
            self.known[init.name] = numpy_helper.to_array(init)
        self._params: set[str] = set(self.known)

    # -- inputs ----------------------------------------------------------------------------

    def bind_inputs(self, ins, arrays) -> None:
        for pos, (vi, a) in enumerate(zip(ins, arrays)):
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type"):
                raise OnnxModelError(f"input {vi.name!r} is not a tensor",
                                     hint="fexplore compiles models whose inputs are tensors")
            try:
                dt = onnx_dtype(tt.elem_type)
            except TypeError as e:
                raise OnnxModelError(f"input {vi.name!r}: {e}") from None
            if a.dtype != dt.numpy:
                raise OnnxModelError(f"input {vi.name!r} is {dt} in the model, the example is "
                                     f"{a.dtype}", hint=f"pass a {dt.numpy} array")
            shape = []
            if tt.HasField("shape"):
                if len(tt.shape.dim) != a.ndim:
                    raise OnnxModelError(f"input {vi.name!r} has rank {len(tt.shape.dim)} in the "
                                         f"model, the example has shape {a.shape}")
                for k, d in enumerate(tt.shape.dim):
                    if d.HasField("dim_value"):
                        if d.dim_value != a.shape[k]:
                            raise OnnxModelError(
                                f"input {vi.name!r} dim {k} is {d.dim_value} in the model, the "
                                f"example has {a.shape[k]}")
                        shape.append(int(d.dim_value))
                    elif d.HasField("dim_param") and _symbol_name(d.dim_param) in self.pinned:
                        size = self.pinned[_symbol_name(d.dim_param)]
                        if a.shape[k] != size:
                            raise OnnxModelError(
                                f"input {vi.name!r} dim {k} ({d.dim_param!r}) is {a.shape[k]} in the "
                                f"example; the model needs it equal to {size} (another input's size)")
                        shape.append(size)
                    elif d.HasField("dim_param") and a.shape[k] != 0:
                        name = _symbol_name(d.dim_param)
                        self.symbols.setdefault(name, (1, None))
                        shape.append(symbol(name))
                    else:  # no size stated: the example's
                        shape.append(int(a.shape[k]))
            else:
                shape = list(a.shape)
            v = Value(self.b._unique(vi.name), TensorType(tuple(shape), dt))
            self.env[vi.name] = v
            self.inputs.append(v)
            self.input_pos[vi.name] = pos
            self.examples[vi.name] = a

    # -- what converters ask for -----------------------------------------------------------

    def pin(self, dim, size: int) -> None:
        """Fix a graph input's symbolic dim at `size` (a converter found the model needs that:
        a cache's head size named by a dim_param of its own): the import starts over with the
        dim static, and a call with another size is refused as for any static dim."""
        name = str(dim)
        if name in self.pinned or not isinstance(dim, sympy.Symbol):
            raise NotImplementedError(f"the dim {dim} must equal {size}, and fexplore cannot fix it there")
        raise _Pin(name, int(size))

    def value(self, name: str, ctx: OnnxContext | None = None) -> Value:
        if name in self.env:
            return self.env[name]
        if name in self.known:
            v = self._materialize(name, self.known[name], ctx)
            self.env[name] = v
            return v
        if self.parent is not None and self.parent.has(name):
            return self._capture(name)
        raise IngestionError(f"ONNX value {name!r} is used before it is defined",
                             loc=ctx.loc if ctx else None,
                             hint="the graph is not in topological order or is malformed; "
                                  "onnx.checker.check_model says more")

    def has(self, name: str) -> bool:
        return name in self.env or name in self.known or \
            (self.parent is not None and self.parent.has(name))

    def _capture(self, name: str) -> Value:
        outer_known = self.parent.lookup_known(name)
        if outer_known is not None:
            self.known[name] = outer_known
            return self.value(name)
        outer = self.parent.value(name)
        v = Value(self.b._unique(name), outer.type)
        self.env[name] = v
        self.inputs.append(v)
        self.captured.append(name)
        return v

    def lookup_known(self, name: str):
        if name in self.known:
            return self.known[name]
        if name in self.env:
            return None
        return self.parent.lookup_known(name) if self.parent is not None else None

    def known_value(self, name: str, ctx: OnnxContext, what: str):
        k = self.lookup_known(name)
        if k is not None:
            return k
        if name in self.input_pos:  # a shape-like operand given as a graph input
            return self._freeze(name)
        k = self._evaluate_cone(name, depth=0)
        if k is not None:
            return k
        ctx.refuse(f"its {what} ({name!r}) is computed at run time; fexplore needs it known "
                   "when compiling (a constant, an initializer, a shape, or a graph input "
                   "frozen to its example value)",
                   hint="make the operand a constant (an initializer) in the exported model")

    def _freeze(self, name: str) -> np.ndarray:
        a = self.examples[name]
        self.frozen[self.input_pos[name]] = a
        self.known[name] = a
        return a

    def _evaluate_cone(self, name: str, depth: int):
        """A shape-like operand computed by nodes: evaluate the nodes that compute it, from
        known values, the types Shape reads and graph inputs (frozen, as shape-like operands
        themselves). None when the cone holds anything else (a big tensor, control flow)."""
        node = self.producers.get(name)
        if node is None or depth > 64 or node.op_type in _NEVER_FOLD or \
                any(a.type in (5, 10) for a in node.attribute):
            return None
        if node.op_type in ("Shape", "Size") and node.input[0] in self.env:
            vals = [_type_stub(self.env[node.input[0]].type)]
        else:
            vals = []
            for n in node.input:
                if not n:
                    vals.append(None)
                    continue
                k = self.lookup_known(n)
                if k is None and n in self.input_pos:
                    if self.examples[n].size > _FOLD_LIMIT:
                        return None
                    k = self._freeze(n)
                elif k is None:
                    k = self._evaluate_cone(n, depth + 1)
                if k is None:
                    return None
                vals.append(k)
        return self.known.get(name) if self._fold_into_known(node, vals) else None

    def _materialize(self, name: str, a: np.ndarray, ctx) -> Value:
        if a.dtype == object:  # symbolic sizes: built from the dims, as ints
            return _dims_tensor(ctx, a) if ctx is not None else _fail_symbolic(name)
        if a.dtype.kind in "US":
            raise IngestionError(f"ONNX value {name!r} holds strings", loc=ctx.loc if ctx else None,
                                 hint="the IR has no string tensors")
        if name in self._params:
            return self._param(name, a)
        return self.b.literal(_contiguous(a), name)

    def _param(self, name: str, a: np.ndarray) -> Value:
        from fexplore.ir import Constant

        a = _contiguous(a)
        c = Constant(self.b._unique(name), TensorType(a.shape, DType.from_numpy(a.dtype)), a,
                     source=name)
        self.b.constants.append(c)
        return c

    # -- nodes -----------------------------------------------------------------------------

    def convert(self, name: str, output_names=None) -> Graph:
        self.consumers: dict[str, list] = {}
        for node in self.gp.node:
            for i in node.input:
                self.consumers.setdefault(i, []).append(node)
        self.graph_outputs = {o.name for o in self.gp.output}
        self.taken_over: dict[str, Value] = {}   # outputs a converter computed ahead of their node
        for node in self.gp.node:
            if node.output and node.output[0] in self.taken_over:
                self.env[node.output[0]] = self.taken_over.pop(node.output[0])
                continue
            self._node(node)
        outs = []
        for o in (output_names or [o.name for o in self.gp.output]):
            outs.append(self.value(o))
        nodes = _live(self.b.nodes, outs)
        used = {v.name for n in nodes for v in n.inputs} | {v.name for v in outs}
        constants = [c for c in self.b.constants if c.name in used]
        return Graph(name, list(self.inputs), constants, nodes, outs, dict(self.symbols))

    def _node(self, node) -> None:
        for o in node.output:
            self.producers[o] = node
        loc = provenance(node)
        opset = self.opset if node.domain in ("", "ai.onnx") else self.domain_opsets.get(node.domain, 1)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            self.known[node.output[0]] = _constant_value(node, loc)
            return
        if self._fold(node, loc):
            return
        fn = lookup(node.domain, node.op_type, opset)
        if fn is None:
            if self._expand(node, opset):
                return
            raise _unsupported(node, opset, loc)
        ctx = OnnxContext(self.b, node, self, opset, loc)
        try:
            result = fn(ctx)
        except FexploreError:
            raise
        except (TypeError, ValueError, NotImplementedError, KeyError, IndexError) as e:
            raise OnnxConversionError(
                f"cannot convert {node.op_type} node {node.name or node.output[0]!r}: {e}",
                loc=loc, hint="this use of the op is not supported yet") from None
        results = result if isinstance(result, (tuple, list)) else (result,)
        for out, r in zip(node.output, results):
            if not out:
                continue
            if isinstance(r, np.ndarray):
                self.known[out] = r
                self.env.pop(out, None)
            elif isinstance(r, Value):
                self.env[out] = r
            else:
                raise IngestionError(f"the converter of {node.op_type} gave {r!r} for output "
                                     f"{out!r}", loc=loc, hint="this is a bug in the converter")
        missing = [o for o in node.output[len(results):] if o]
        if missing:
            raise OnnxConversionError(f"{node.op_type} node {node.name!r}: outputs "
                                      f"{missing} are not supported", loc=loc)

    def _expand(self, node, opset: int) -> bool:
        """Convert the op's ONNX function body in its place, when the schema has one."""
        from .functions import function_body

        types = [self._type_proto(n) for n in node.input]
        if any(t is None for t in types):
            return False
        got = function_body(node, opset, types)
        if got is None:
            return False
        body, opsets = got
        saved = self.opset, dict(self.domain_opsets)
        self.opset = opsets.get("", self.opset)
        self.domain_opsets.update(opsets)
        try:
            for inner in body:
                self._node(inner)
        finally:
            self.opset, self.domain_opsets = saved[0], saved[1]
        return True

    def _type_proto(self, name: str):
        from onnx import helper

        if not name:
            return helper.make_tensor_type_proto(0, None)
        k = self.lookup_known(name)
        if k is not None:
            if k.dtype == object:
                return helper.make_tensor_type_proto(7, k.shape)  # INT64 sizes
            try:
                return helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(k.dtype), k.shape)
            except Exception:
                return None
        try:
            v = self.value(name)
        except FexploreError:
            return None
        from .importer import ir_to_onnx_dtype

        shape = [d if isinstance(d, int) else str(d) for d in v.type.shape]
        return helper.make_tensor_type_proto(ir_to_onnx_dtype(v.type.dtype), shape)


    def _fold_into_known(self, node, vals) -> bool:
        """Run `node` on the known values `vals` (small ones only) and record its results."""
        from .folding import fold_node

        if sum(np.asarray(v).size for v in vals if v is not None) > _FOLD_LIMIT:
            return False
        outs = fold_node(node, vals, opset=self.opset)
        if outs is None:
            return False
        for o, v in zip(node.output, outs):
            if o:
                self.known[o] = v
        return True
    def _fold(self, node, loc) -> bool:
        """Compute the node at import time when every input is known (shape arithmetic)."""
        if node.op_type in _NEVER_FOLD or any(a.type in (5, 10) for a in node.attribute):
            return False  # 5, 10: GRAPH, GRAPHS attributes (control flow)
        from .folding import fold_node

        if node.op_type in ("Shape", "Size"):
            if not node.input or not node.input[0]:
                return False
            known = self.lookup_known(node.input[0])
            if known is None:
                x = self.value(node.input[0])
                self.known[node.output[0]] = fold_node(node, [_type_stub(x.type)], shape_only=True)[0]
                return True
        vals = []
        for n in node.input:
            if not n:
                vals.append(None)
                continue
            k = self.lookup_known(n)
            if k is None:
                return False
            vals.append(k)
        return self._fold_into_known(node, vals)


def _live(nodes, outputs) -> list:
    """The nodes an output depends on: converters that read through a node (MatMul + Add as
    linear, x * Sigmoid(x) as silu) leave the one they read through unused."""
    live = {v.name for v in outputs}
    kept = []
    for n in reversed(nodes):
        if any(v.name in live for v in n.outputs):
            kept.append(n)
            live.update(v.name for v in n.inputs)
    return kept[::-1]


def _contiguous(a: np.ndarray) -> np.ndarray:
    # not np.ascontiguousarray: it makes a 0-d array 1-d
    return a if a.flags.c_contiguous else np.array(a, order="C")


def provenance(node) -> SourceLoc:
    """Where an ONNX node came from: its name and op type, under the module path its exporter
    recorded (torch.onnx's ``pkg.torch.onnx.name_scopes``, or a ``/a/b/Op``-style node name),
    and the user's source line when the exporter kept a stack trace."""
    import ast
    import re

    meta = {p.key: p.value for p in node.metadata_props}
    name = node.name or (node.output[0] if node.output else node.op_type)
    scope = None
    scopes = meta.get("pkg.torch.onnx.name_scopes")
    if scopes:
        try:
            parts = [s for s in ast.literal_eval(scopes) if s]
        except (ValueError, SyntaxError):
            parts = []
        scope = parts[-2] if len(parts) >= 2 else None   # the last one is the op itself
    elif "/" in name:
        path = [p for p in name.split("/") if p]
        scope, name = ".".join(path[:-1]) or None, path[-1]
    module = f"{scope}.{name} ({node.op_type})" if scope else f"{name} ({node.op_type})"
    file = line = None
    from ..ingest import _TORCH_DIR

    # the innermost frame outside torch itself: the model's line, as the torch door shows
    frames = [f for f in re.findall(r'File "([^"]+)", line (\d+)',
                                    meta.get("pkg.torch.onnx.stack_trace", ""))
              if not f[0].startswith((_TORCH_DIR, "<"))]
    if frames:
        file, line = frames[-1][0], int(frames[-1][1])
    return SourceLoc(file, line, module)


class _type_stub:
    """An input of Shape/Size that has a type but no known value."""

    def __init__(self, t: TensorType):
        self.shape = t.shape


def _symbol_name(p: str) -> str:
    import re

    name = re.sub(r"[^A-Za-z0-9_]", "_", p)
    return name if name and not name[0].isdigit() else f"d_{name}"


def _constant_value(node, loc) -> np.ndarray:
    from onnx import helper, numpy_helper

    a = node.attribute[0]
    v = helper.get_attribute_value(a)
    if a.name == "value":
        return numpy_helper.to_array(v)
    if a.name in ("value_float", "value_int"):
        return np.asarray(v, dtype=np.float32 if a.name == "value_float" else np.int64)
    if a.name in ("value_floats", "value_ints"):
        return np.asarray(list(v), dtype=np.float32 if a.name == "value_floats" else np.int64)
    raise OnnxConversionError(f"Constant node {node.name!r}: {a.name} constants are not supported",
                              loc=loc, hint="the IR has no string or sparse tensors")


def _dims_tensor(ctx: OnnxContext, a: np.ndarray) -> Value:
    """An i64 tensor of sizes some of which are symbolic."""
    flat = [ctx.value(x if isinstance(x, sympy.Expr) else int(x), DType.i64)
            for x in a.reshape(-1)]
    if a.ndim == 0:
        return flat[0]
    parts = [ctx.emit("reshape", [v], {"shape": (1,)}) for v in flat]
    v = parts[0] if len(parts) == 1 else ctx.emit("concat", parts, {"axis": 0})
    return v if a.ndim == 1 else ctx.emit("reshape", [v], {"shape": a.shape})


def _fail_symbolic(name: str):
    raise IngestionError(f"ONNX value {name!r} holds symbolic sizes and is a graph output",
                         hint="return tensors computed from the inputs, not their shapes")


def _unsupported(node, opset: int, loc) -> UnsupportedOperatorError:
    domain = node.domain or "ai.onnx"
    have = registered_opsets(node.domain, node.op_type)
    op = f"{domain}::{node.op_type}"
    if have:
        spans = ", ".join(f"{lo}..{hi or 'newest'}" for lo, hi in have)
        reason = f"at opset {opset} (converters cover opsets {spans})"
    else:
        reason = f"(opset {opset}, node {node.name or node.output[0]!r})"
    dom = "" if domain == "ai.onnx" else f", domain={domain!r}"
    hint = (f"register a converter: @fexplore.pipeline.onnx.onnx_converter({node.op_type!r}"
            f"{dom}, since={opset}) on a function of an OnnxContext that returns the IR values "
            f"of the node's outputs (ctx.input(i), ctx.attr(name), ctx.emit(op, inputs, attrs))")
    return UnsupportedOperatorError(op, loc=loc, reason=reason, hint=hint)


def check_frozen(ingested: OnnxIngested, arrays) -> None:
    """A call's shape-like inputs must hold the values the compile froze them to."""
    for i, want in ingested.frozen.items():
        got = arrays[i]
        if got.shape != want.shape or not np.array_equal(got, want):
            raise InputError(
                f"input {ingested.input_names[i]!r} was frozen to {np.asarray(want).tolist()!r} "
                f"when compiling (a shape-like operand), got {np.asarray(got).tolist()!r}",
                hint="compile again with example inputs holding this value")
