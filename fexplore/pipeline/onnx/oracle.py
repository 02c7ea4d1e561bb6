"""ONNX Runtime as the numeric oracle of an ONNX model's stages.

The same contract as ``numeric.Oracle`` (input sets, expected outputs, each output's reference
noise): ONNX Runtime runs the model on the example inputs and on fresh random inputs of the same
spec; shape-like inputs frozen at ingestion keep their example values in every set. The noise of
float output is how far ONNX Runtime's result is from its run of an f64 twin of the model (every
f32 tensor, input and cast made f64), the same measure the torch door takes from eager. Where the
model computes in f16 or bf16, the twin computes each such node in f64 and rounds its result once
to the node's own dtype, as fexplore does: ONNX Runtime's f16 kernels round inside an op (a sum of
256 f16 values accumulates in f16), and that error is the reference's, not the compile's.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np

from fexplore.errors import ErrorDoc, FexploreError

from .importer import OnnxIngested


class OnnxRuntimeError(FexploreError):
    """ONNX Runtime, the reference, could not run the model."""

    code = "FX412"
    doc = ErrorDoc(
        when="ONNX Runtime, the numeric reference of an ONNX model's stages, is not installed or "
             "cannot load or run the model on the example inputs.",
        example="fexplore.compile(\"model.onnx\", [x])   # without onnxruntime installed",
        fix="pip install 'fexplore[onnx]'; or compile with verify=False, which skips the numeric "
            "checks (the structural ones still run).")


def session(model):
    try:
        import onnxruntime as ort
    except ImportError:
        raise OnnxRuntimeError("verifying an ONNX model needs onnxruntime",
                               hint="pip install 'fexplore[onnx]', or compile with "
                                    "verify=False") from None
    opts = ort.SessionOptions()
    opts.log_severity_level = 4   # failures surface as exceptions; no stderr noise
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def run_session(sess, names, arrays) -> list[np.ndarray]:
    return [np.asarray(o) for o in sess.run(None, dict(zip(names, arrays)))]


class OnnxOracle:
    """``reference_note`` (None when ONNX Runtime runs the model itself): what the expected
    outputs are instead. A model in bf16 or f16 whose ops ONNX Runtime's CPU build has no kernel
    for (its bf16 Add, Mul, Relu) is referenced by its f64 twin, each narrow node computed exactly
    and rounded once to its dtype: what the ONNX operators specify, and what fexplore computes.
    Its noise is then nil; the fixed tolerance of the narrow dtype holds the compile."""

    def __init__(self, ingested: OnnxIngested, example_inputs, *, random_sets: int = 1,
                 seed: int = 0):
        from ..numeric import shapes_at_another_size

        self.input_sets: list[list[np.ndarray]] = []
        self.expected: list[list[np.ndarray]] = []
        self.noise: list[list[float]] = []
        self.dropped_sets: list[str] = []
        self.reference_note: str | None = None
        names = ingested.input_names
        twin, self.f64_note = _f64_session(ingested.model)
        sess, self.reference_note = _reference(ingested.model, twin)
        if self.reference_note is not None:
            twin = None   # the reference is the twin: no noise to measure against it
        rng = np.random.default_rng(seed)
        flat = [np.asarray(a) for a in example_inputs]
        sets = [flat] + [[a if i in ingested.frozen else _like(a, rng) for i, a in enumerate(flat)]
                         for _ in range(random_sets)]
        # with dim_param dims, the first random set at another size (as numeric.Oracle does)
        free = [i for i in range(len(flat)) if i not in ingested.frozen]
        resized = shapes_at_another_size(ingested.graph, [flat[i].shape for i in free])
        if resized is not None and random_sets:
            shapes = dict(zip(free, resized))
            sets[1] = [_like(a, rng, shapes[i]) if i in shapes else a for i, a in enumerate(flat)]
        for k, arrays in enumerate(sets):
            try:
                outs = run_session(sess, names, arrays)
            except Exception as e:
                if k == 0:
                    raise OnnxRuntimeError(f"ONNX Runtime failed on the example inputs: "
                                           f"{str(e).splitlines()[0][:300]}") from None
                self.dropped_sets.append(f"random input set {k}: ONNX Runtime raised "
                                         f"{str(e).splitlines()[0][:200]}")
                continue
            self.input_sets.append(arrays)
            self.expected.append(outs)
            self.noise.append(_noise(twin, names, arrays, outs))


def _reference(model, twin):
    """(the reference, None), or when ONNX Runtime has no kernels for the model's f16/bf16 ops,
    (its f64 twin with the model's output dtypes, why)."""
    try:
        return session(model), None
    except FexploreError:
        raise
    except Exception as e:  # noqa: BLE001  (ONNX Runtime raises its own exception types)
        from onnx import TensorProto

        first = str(e).splitlines()[0]
        by_name = {TensorProto.FLOAT16: "f16", TensorProto.BFLOAT16: "bf16"}
        narrow = sorted({by_name[t] for t in _value_types(model).values() if t in by_name})
        if twin is None or "NOT_IMPLEMENTED" not in first or not narrow:
            raise OnnxRuntimeError(f"ONNX Runtime cannot load the model: {first[:300]}",
                                   hint="compile with verify=False to skip the numeric checks") from None
        names = " or ".join(narrow)
        return _TwinReference(twin, model), (
            f"reference: the model computed in f64, each {names} node rounded once (ONNX "
            f"Runtime has no {names} kernel for some of its ops: {first[first.find('for ') + 4:][:80]})")


class _TwinReference:
    """The f64 twin run as the model: inputs widened, float outputs in the model's dtypes."""

    def __init__(self, twin, model):
        from onnx.helper import tensor_dtype_to_np_dtype

        self.twin = twin
        self.dtypes = [np.dtype(tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type))
                       for o in model.graph.output]

    def run(self, _, feed: dict):
        outs = self.twin.run(None, {k: _widened(a) for k, a in feed.items()})
        return [np.asarray(o).astype(d) if d in _WIDENED else o for o, d in zip(outs, self.dtypes)]


def _like(a: np.ndarray, rng, shape: tuple | None = None) -> np.ndarray:
    """A fresh input like ``a`` (of ``shape``, when given)."""
    shape = a.shape if shape is None else tuple(shape)
    if a.dtype == np.bool_:
        return rng.random(shape) < 0.5
    if a.dtype.kind == "f" or a.dtype in _WIDENED:   # numpy calls bf16 a "V" kind
        x = a.astype(np.float64)
        finite = x[np.isfinite(x)]
        std = float(finite.std()) if finite.size > 1 else 1.0
        mean = float(finite.mean()) if finite.size else 0.0
        return np.asarray(rng.standard_normal(shape) * (std or 1.0) + mean).astype(a.dtype)
    lo, hi = (a.min(), a.max()) if a.size else (0, 1)
    # drawn in the input's own dtype: a u64 value above i64's range is a valid bound
    return np.asarray(rng.integers(lo, hi, size=shape, dtype=a.dtype, endpoint=True))


def _noise(twin, names, arrays, outs) -> list[float]:
    if twin is None:
        return [0.0] * len(outs)
    try:
        ref = run_session(twin, names, [_widened(a) for a in arrays])
    except Exception:
        return [0.0] * len(outs)
    noise = []
    for a, b in zip(outs, ref):
        if a.dtype not in _WIDENED or a.shape != b.shape or a.size == 0:
            noise.append(0.0)
            continue
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
        d = d[np.isfinite(d)]
        noise.append(float(d.max()) if d.size else 0.0)
    return noise


def _f64_session(model):
    """(an ONNX Runtime session of the model's f64 twin, None) or (None, why not). An op ONNX
    Runtime has no f64 kernel for (Erf, for one) is computed in f32 in the twin, found by trying:
    its f32 rounding is eager-sized, and far better than no reference at all."""
    in_f32: set[str] = set()
    while True:
        try:
            return session(f64_twin(model, in_f32=in_f32)), None
        except Exception as e:  # noqa: BLE001
            first = str(e).splitlines()[0]
            missing = re.search(r"implementation for (\w+)\(", first)
            suspects = [op for op in (_ops_computing(model, missing.group(1)) if missing else [])
                        if op not in in_f32]
            if not suspects or len(in_f32) >= 16:
                return None, f"no f64 reference: ONNX Runtime cannot run the model in f64 " \
                             f"({first[:120]})"
            in_f32.add(suspects[0])   # one at a time: an op run in f32 is a less exact twin


def _ops_computing(model, op_type: str) -> list[str]:
    """The op types of the main graph that may make ONNX Runtime run ``op_type``: itself; else
    the ops whose function body holds it (ONNX Runtime expands opset 20's Gelu into an Erf),
    those whose body is known first, then those whose body depends on their attributes."""
    import onnx

    ops = sorted({n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")})
    if op_type in ops:
        return [op_type]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    known, maybe = [], []
    for op in ops:
        try:
            schema = onnx.defs.get_schema(op, opset)
        except Exception:  # noqa: BLE001  (an op onnx does not know: not a function)
            continue
        if schema.has_function and op_type in {n.op_type for n in schema.function_body.node}:
            known.append(op)
        elif schema.has_context_dependent_function:
            maybe.append(op)
    return known + maybe


# the float dtypes the twin computes in f64
_WIDENED = {np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)}


def _widened(a: np.ndarray) -> np.ndarray:
    """An input as the twin takes it."""
    return a.astype(np.float64) if a.dtype in _WIDENED else a


def f64_twin(model, in_f32=frozenset()):
    """A copy of the model computing in f64 wherever it computed in f32, f16 or bf16.

    - The result of each node of the main graph that was f16 or bf16 is rounded to that dtype
      once (a Cast there and back), so the twin is that node computed exactly and rounded.
    - Nodes whose op type is in ``in_f32`` (ops ONNX Runtime has no f64 kernel for) read their
      float inputs in f32 and give f64 results.
    """
    import onnx
    from onnx import TensorProto, numpy_helper

    wide = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    types = _value_types(model)

    def fix_type(t):
        if t.HasField("tensor_type") and t.tensor_type.elem_type in wide:
            t.tensor_type.elem_type = TensorProto.DOUBLE

    def fix_tensor(t):
        if t.data_type in wide:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))

    def fix_graph(g):
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            fix_type(vi.type)
        for init in g.initializer:
            fix_tensor(init)
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    fix_tensor(a.t)
                elif a.type == onnx.AttributeProto.GRAPH:
                    fix_graph(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sg in a.graphs:
                        fix_graph(sg)
                elif a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and \
                        a.i in wide:
                    a.i = TensorProto.DOUBLE
                elif n.op_type == "Constant" and a.name == "value_float":
                    v = a.f
                    a.Clear()
                    a.CopyFrom(onnx.helper.make_attribute(
                        "value", numpy_helper.from_array(np.asarray(v, np.float64))))

    fix_graph(twin.graph)
    _rewire(twin.graph, types, in_f32)
    return twin


def _value_types(model) -> dict[str, int]:
    """Element type of each value of the main graph, from onnx's shape inference (what it cannot
    infer is missing: such a value is neither rounded nor narrowed in the twin)."""
    import onnx

    try:
        graph = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001  (a model onnx cannot infer: the twin just widens)
        graph = model.graph
    types = {i.name: i.data_type for i in graph.initializer}
    for v in list(graph.input) + list(graph.value_info) + list(graph.output):
        if v.type.HasField("tensor_type"):
            types[v.name] = v.type.tensor_type.elem_type
    return types


def _rewire(g, types: dict[str, int], in_f32) -> None:
    """The main graph's per-node casts: f32 inputs for the ops in ``in_f32``, and the rounding
    of each f16/bf16 result. Every reader of a value, graph outputs included, sees the value
    after them, under its own name."""
    import onnx
    from onnx import TensorProto

    narrow = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
    floats = (TensorProto.FLOAT,) + narrow
    cast = onnx.helper.make_node
    nodes, in_f32_made = [], set()
    for n in g.node:
        f32 = n.op_type in in_f32
        if f32:
            for k, x in enumerate(n.input):
                if x and types.get(x) in floats:
                    if x not in in_f32_made:   # one cast per value, however many nodes read it
                        nodes.append(cast("Cast", [x], [x + ".f32"], to=TensorProto.FLOAT))
                        in_f32_made.add(x)
                    n.input[k] = x + ".f32"
            for a in n.attribute:
                if a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and \
                        a.i == TensorProto.DOUBLE:
                    a.i = TensorProto.FLOAT
        nodes.append(n)
        for k, out in enumerate(n.output):
            t = types.get(out)
            if not out or t not in floats or not (f32 or t in narrow):
                continue
            n.output[k] = out + ".computed"
            if t in narrow:
                nodes.append(cast("Cast", [out + ".computed"], [out + ".rounded"], to=t))
                n_out = out + ".rounded"
            else:
                n_out = out + ".computed"
            nodes.append(cast("Cast", [n_out], [out], to=TensorProto.DOUBLE))
    del g.node[:]
    g.node.extend(nodes)
