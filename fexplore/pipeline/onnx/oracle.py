"""ONNX Runtime as the numeric oracle of an ONNX model's stages.

The same contract as ``numeric.Oracle`` (input sets, expected outputs, each output's reference
noise): ONNX Runtime runs the model on the example inputs and on fresh random inputs of the same
spec; shape-like inputs frozen at ingestion keep their example values in every set. The noise of
an f32 output is how far ONNX Runtime's f32 result is from its run of an f64 twin of the model
(every f32 tensor, input and cast made f64), the same measure the torch door takes from eager.
"""

from __future__ import annotations

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
    def __init__(self, ingested: OnnxIngested, example_inputs, *, random_sets: int = 1,
                 seed: int = 0):
        self.input_sets: list[list[np.ndarray]] = []
        self.expected: list[list[np.ndarray]] = []
        self.noise: list[list[float]] = []
        self.dropped_sets: list[str] = []
        names = ingested.input_names
        try:
            sess = session(ingested.model)
        except FexploreError:
            raise
        except Exception as e:
            raise OnnxRuntimeError(f"ONNX Runtime cannot load the model: "
                                   f"{str(e).splitlines()[0][:300]}",
                                   hint="compile with verify=False to skip the numeric checks") from None
        twin, self.f64_note = _f64_session(ingested.model)
        rng = np.random.default_rng(seed)
        flat = [np.asarray(a) for a in example_inputs]
        sets = [flat] + [[a if i in ingested.frozen else _like(a, rng) for i, a in enumerate(flat)]
                         for _ in range(random_sets)]
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


def _like(a: np.ndarray, rng) -> np.ndarray:
    if a.dtype == np.bool_:
        return rng.random(a.shape) < 0.5
    if a.dtype.kind == "f":
        x = a.astype(np.float64)
        finite = x[np.isfinite(x)]
        std = float(finite.std()) if finite.size > 1 else 1.0
        mean = float(finite.mean()) if finite.size else 0.0
        return np.asarray(rng.standard_normal(a.shape) * (std or 1.0) + mean).astype(a.dtype)
    lo, hi = (a.min(), a.max()) if a.size else (0, 1)
    # drawn in the input's own dtype: a u64 value above i64's range is a valid bound
    return np.asarray(rng.integers(lo, hi, size=a.shape, dtype=a.dtype, endpoint=True))


def _noise(twin, names, arrays, outs) -> list[float]:
    if twin is None:
        return [0.0] * len(outs)
    f64 = [a.astype(np.float64) if a.dtype == np.float32 else a for a in arrays]
    try:
        ref = run_session(twin, names, f64)
    except Exception:
        return [0.0] * len(outs)
    noise = []
    for a, b in zip(outs, ref):
        if a.dtype != np.float32 or a.shape != b.shape or a.size == 0:
            noise.append(0.0)
            continue
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
        d = d[np.isfinite(d)]
        noise.append(float(d.max()) if d.size else 0.0)
    return noise


def _f64_session(model):
    """(an ONNX Runtime session of the model in f64, None) or (None, why not)."""
    try:
        twin = f64_twin(model)
        return session(twin), None
    except Exception as e:
        return None, f"no f64 reference: ONNX Runtime cannot run the model in f64 " \
                     f"({str(e).splitlines()[0][:120]})"


def f64_twin(model):
    """A copy of the model computing in f64 wherever it computed in f32."""
    import onnx
    from onnx import TensorProto, numpy_helper

    twin = onnx.ModelProto()
    twin.CopyFrom(model)

    def fix_type(t):
        if t.HasField("tensor_type") and t.tensor_type.elem_type == TensorProto.FLOAT:
            t.tensor_type.elem_type = TensorProto.DOUBLE

    def fix_tensor(t):
        if t.data_type == TensorProto.FLOAT:
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
                        a.i == TensorProto.FLOAT:
                    a.i = TensorProto.DOUBLE
                elif n.op_type == "Constant" and a.name == "value_float":
                    v = a.f
                    a.Clear()
                    a.CopyFrom(onnx.helper.make_attribute(
                        "value", numpy_helper.from_array(np.asarray(v, np.float64))))

    fix_graph(twin.graph)
    return twin
