"""The ONNX door's numeric reference: ONNX Runtime, and its f64 twin of the model, which measures
each output's reference noise. The twin computes f16/bf16 nodes exactly and rounds each result
once (ONNX Runtime's f16 kernels round inside an op, and that error is the reference's), and runs
in f32 the ops ONNX Runtime has no f64 kernel for (Erf: every exact-GELU model). A bf16 model
ONNX Runtime cannot run at all is referenced by the twin alone."""

import math

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import fexplore
from fexplore.pipeline.onnx.importer import ingest_onnx
from fexplore.pipeline.onnx.oracle import OnnxOracle, _f64_session, run_session, session


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _gelu_sum():
    """x @ w -> exact GELU (Erf) -> sum over 256 values, in f32."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, (64, 256),
                           (rng.standard_normal((64, 256)) / 8).astype(np.float32).ravel())
    c = [helper.make_tensor(n, TensorProto.FLOAT, (), [v]) for n, v in
         (("half", 0.5), ("one", 1.0), ("rsqrt2", 2 ** -0.5))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Mul", ["h", "rsqrt2"], ["hs"]),
             helper.make_node("Erf", ["hs"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]),
             helper.make_node("Mul", ["h", "e1"], ["he"]),
             helper.make_node("Mul", ["he", "half"], ["y"]),
             helper.make_node("ReduceSum", ["y"], ["s"], keepdims=0)]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, (16, 64))],
                   [helper.make_tensor_value_info("s", TensorProto.FLOAT, ())], [w, *c])
    return model, rng.standard_normal((16, 64)).astype(np.float32) * 3


def test_ops_without_an_f64_kernel_run_in_f32_in_the_twin():
    model, x = _gelu_sum()
    twin, note = _f64_session(model)
    assert note is None, note            # before: no twin at all (no f64 Erf), no noise measured
    (got,) = run_session(twin, ["x"], [x.astype(np.float64)])
    (f32,) = run_session(session(model), ["x"], [x])
    assert got.dtype == np.float64
    assert 0 < abs(float(got) - float(f32)) < 1e-5 * abs(float(got))
    cm = fexplore.compile(model, [x])     # before: FX301 at ingest, f32 rounding over 4096 terms
    assert cm.verification["ok"].all(), cm.verification


def test_a_value_read_by_two_ops_without_an_f64_kernel_is_cast_once():
    nodes = [helper.make_node("Erf", ["x"], ["a"]), helper.make_node("Erf", ["x"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4,))],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4,))])
    twin, note = _f64_session(model)
    assert note is None, note            # before: two Casts defined x.f32, an invalid model
    x = np.linspace(-2, 2, 4)
    (got,) = run_session(twin, ["x"], [x])
    np.testing.assert_allclose(got, 2 * np.array([math.erf(v) for v in x]), rtol=1e-6)


def _f16_sum(n=2048):
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]),
             helper.make_node("ReduceSum", ["sq"], ["s"], keepdims=0)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT16, (n,))],
                  [helper.make_tensor_value_info("s", TensorProto.FLOAT16, ())])


def test_f16_nodes_in_the_twin_are_exact_then_rounded_once():
    model = _f16_sum()
    x = np.random.default_rng(1).standard_normal(2048).astype(np.float16)
    twin, note = _f64_session(model)
    assert note is None
    (got,) = run_session(twin, ["x"], [x.astype(np.float64)])
    squares = (x.astype(np.float64) ** 2).astype(np.float16).astype(np.float64)  # Mul, rounded
    assert float(got) == float(np.float16(squares.sum()))                       # ReduceSum, once
    cm = fexplore.compile(model, [x])
    assert cm.verification["ok"].all(), cm.verification
    np.testing.assert_array_equal(np.asarray(cm(x)), np.float16(squares.sum()))


def _bf16_mlp():
    """x @ w + b -> Relu -> squared, all bf16: ONNX Runtime's CPU build has no bf16 Relu (nor
    Add, Mul), so it cannot load the model."""
    rng = np.random.default_rng(2)
    w, b = (rng.standard_normal(s).astype(ml_dtypes.bfloat16) for s in ((16, 8), (8,)))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Mul", ["r", "r"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, (4, 16))],
                   [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, (4, 8))],
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return model, w, b, rng.standard_normal((4, 16)).astype(ml_dtypes.bfloat16)


def test_a_bf16_model_onnx_runtime_cannot_run_is_referenced_by_its_twin():
    model, w, b, x = _bf16_mlp()
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
        session(model)                    # before: FX412, no compile at all
    ingested = ingest_onnx(model, [x])
    oracle = OnnxOracle(ingested, [x], random_sets=1)
    assert "has no bf16 kernel" in oracle.reference_note
    bf16 = ml_dtypes.bfloat16

    def by_hand(x):   # each node exact, its result rounded to bf16 once
        m = (x.astype(np.float64) @ w.astype(np.float64)).astype(bf16).astype(np.float64)
        r = np.maximum((m + b.astype(np.float64)).astype(bf16).astype(np.float64), 0)
        return (r * r).astype(bf16)

    for inputs, (want,) in zip(oracle.input_sets, oracle.expected):
        assert want.dtype == bf16
        np.testing.assert_array_equal(want, by_hand(inputs[0]))
    assert len(oracle.input_sets) == 2 and oracle.noise == [[0.0], [0.0]]
    cm = fexplore.compile(model, [x])
    assert cm.verification["ok"].all(), cm.verification
    assert "f64, each bf16 node rounded once" in cm["fusion"].verification.numeric.tolerance
    (got,) = cm(x)
    np.testing.assert_array_equal(np.asarray(got).astype(np.float64), by_hand(x).astype(np.float64))


def test_an_op_onnx_runtime_expands_into_one_without_an_f64_kernel_runs_in_f32_in_the_twin():
    """Opset 20's Gelu has no f64 kernel; ONNX Runtime expands it into its function body and names
    the Erf inside, which is no node of the model (before: no twin, and every model exported
    with torch's Gelu op got no noise measured)."""
    nodes = [helper.make_node("Gelu", ["x"], ["g"]), helper.make_node("ReduceSum", ["g"], ["s"], keepdims=0)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4096,))],
                          [helper.make_tensor_value_info("s", TensorProto.FLOAT, ())])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    twin, note = _f64_session(model)
    assert note is None, note
    x = np.random.default_rng(3).standard_normal(4096).astype(np.float32)
    (got,) = run_session(twin, ["x"], [x.astype(np.float64)])
    exact = sum(0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64))
    assert abs(float(got) - exact) < 1e-4 * abs(exact)   # the Gelu in f32, the sum in f64
    cm = fexplore.compile(model, [x])
    assert cm.verification["ok"].all(), cm.verification
