"""The ONNX front door: zoo models exported with torch.onnx.export reach the fused regions the
torch door reaches (or the test shows the difference), every stage verified against ONNX Runtime;
a symbolic batch dim compiles once and runs at two sizes; shape-like graph inputs are frozen
and checked; the CLI compiles a .onnx file."""

import contextlib
import io
import logging
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import onnx
from onnx import TensorProto, helper

import fexplore
from fexplore.errors import InputError
from fexplore.models import ZOO
from fexplore.pipeline.numeric import to_numpy
from fexplore.pipeline.onnx.compare import TwoDoors, regions_diff
from fexplore.pipeline.onnx.oracle import run_session, session


def export(model, inputs, path, dynamo=True, **kw):
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            torch.onnx.export(model, inputs, str(path), dynamo=dynamo, verbose=False, **kw)
        finally:
            logging.disable(logging.NOTSET)
    return str(path)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_round_trip_through_onnx(name, tmp_path):
    model, inputs = ZOO[name]()
    path = export(model, inputs, tmp_path / f"{name}.onnx")
    arrays = [to_numpy(x) for x in inputs]
    ex = fexplore.explore(path, arrays)
    fused = ex["fusion"]
    for rec in ex.records:   # every stage's numbers against ONNX Runtime
        assert rec.verification.ok, (rec.name, rec.verification)
    # provenance: the exporter's module path and the model's own source line, as the torch
    # door shows them, with the ONNX node's name and op type
    locs = [n.loc for n in ex.records[0].after.nodes if n.loc is not None]
    assert any(loc.file and "fexplore/models/" in loc.file.replace("\\", "/") and loc.line
               for loc in locs)
    assert all(loc.module.endswith(")") for loc in locs)
    want = run_session(session(onnx.load(path)), [i.name for i in onnx.load(path).graph.input],
                       arrays)
    got = fexplore.ir.run(fused.after, arrays)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    torch_fused = fexplore.explore(model, inputs)["fusion"]
    diff = regions_diff(fused.after, torch_fused.after)
    view = TwoDoors(fused.after, torch_fused.after)
    # the exporter decomposes what the torch door keeps (scaled_dot_product_attention, silu,
    # rsqrt, nn.Linear, adaptive pooling, embedding lookups); the ONNX door reads them back, so
    # fusion makes the same regions from both; the view shows any difference side by side
    assert diff is None and view.same, f"{name}: the doors' fused regions differ\n{diff}"
    assert "ONNX door" in view._repr_html_() and "same regions" in repr(view)


class Batched(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 16)

    def forward(self, x):
        return torch.softmax(self.proj(x).relu(), dim=-1) * x.shape[0]


def test_symbolic_batch_dim_compiles_once_and_runs_at_two_sizes(tmp_path):
    torch.manual_seed(0)
    model = Batched().eval()
    x = torch.randn(3, 8)
    path = export(model, (x,), tmp_path / "b.onnx",
                  dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=64)}})
    proto = onnx.load(path)
    dim = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_param, "the exporter kept the batch dim symbolic"
    cm = fexplore.compile(path, (x.numpy(),))
    g = cm.stages[0].after
    assert str(g.inputs[0].type.shape[0]) == dim.dim_param.replace(".", "_")
    sess = session(proto)
    for b in (3, 7):
        xb = np.random.default_rng(b).standard_normal((b, 8)).astype(np.float32)
        (got,) = cm(xb)
        (want,) = run_session(sess, ["x"], [xb])
        assert got.shape == (b, 16)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _reshape_model():
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], name="flat")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                                        helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def test_shape_like_graph_input_is_frozen_recorded_and_checked():
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    shape = np.array([3, 4], dtype=np.int64)
    cm = fexplore.compile(_reshape_model(), (x, shape))
    assert "'shape'" in cm.stages[0].summary and "frozen" in cm.stages[0].summary
    assert cm.stages[0].stats["frozen_inputs"] == ["shape"]
    (y,) = cm(x, shape)
    np.testing.assert_array_equal(y, x.reshape(3, 4))
    with pytest.raises(InputError, match="frozen"):
        cm(x, np.array([4, 3], dtype=np.int64))


def test_provenance_is_the_onnx_node(tmp_path):
    cm = fexplore.explore(_reshape_model(), (np.zeros((2, 6), np.float32),
                                             np.array([12, 1], np.int64)))
    rec = cm.step()
    (node,) = rec.after.nodes
    assert node.loc.module == "flat (Reshape)"
    assert 'loc("flat (Reshape)")' in str(rec.after)


def test_cli_compiles_an_onnx_file(tmp_path, monkeypatch, capsys):
    from fexplore import cli

    torch.manual_seed(0)
    path = export(Batched().eval(), (torch.randn(3, 8),), tmp_path / "b.onnx",
                  dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=64)}})
    monkeypatch.chdir(tmp_path)
    assert cli.main(["compile", path, "--input-shapes", "x=4x8", "--no-report"]) == 0
    assert "compiled @forward" in capsys.readouterr().out
    assert cli.main(["compile", path, "--no-report"]) == 2
    assert "--input-shapes x=" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_language_model_with_a_symbolic_sequence_runs_at_two_lengths(name, tmp_path):
    # the exporter's shape arithmetic over the dynamic length (Shape, Range, a mask buffer's
    # [:T, :T] corner) resolves to the IR's symbolic dim
    from fexplore.models import DYNAMIC_SEQ

    model, inputs = ZOO[name]()
    path = export(model, inputs, tmp_path / f"{name}.onnx", dynamic_shapes=DYNAMIC_SEQ[name](model))
    cm = fexplore.compile(path, [to_numpy(x) for x in inputs])
    assert cm.stages[0].after.symbols, "the sequence length stayed symbolic"
    proto = onnx.load(path)
    sess = session(proto)
    for t in (5, 9):
        ids = np.random.default_rng(t).integers(0, 100, (1, t)).astype(np.int64)
        (got,) = cm(ids)
        (want,) = run_session(sess, [i.name for i in proto.graph.input], [ids])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_torchscript_exporter_models_fuse_as_the_torch_door(name, tmp_path):
    # the older exporter writes GELU as x * 0.5 * (1 + Erf(x / sqrt 2)), nn.Linear as Gemm,
    # shapes through Shape/Gather/Concat: read back all the same
    model, inputs = ZOO[name]()
    path = export(model, inputs, tmp_path / f"{name}.onnx", dynamo=False, opset_version=17)
    ex = fexplore.explore(path, [to_numpy(x) for x in inputs])
    fused = ex["fusion"]
    assert all(r.verification.ok for r in ex.records)
    view = TwoDoors(fused.after, fexplore.explore(model, inputs)["fusion"].after)
    assert view.same, view.diff


def _attention_model(causal: bool, past: bool, window=None):
    """ONNX Attention over a symbolic sequence (and a cache of symbolic length)."""
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, "seq", 8]) for n in "qkv"]
    names, outs = ["q", "k", "v"], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if past:
        ins += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, "past", 8]) for n in ("pk", "pv")]
        names += ["", "pk", "pv"]
        outs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("k_all", "v_all")]
    attrs = {"is_causal": int(causal)}
    if window is not None:
        attrs["left_window_size"] = window
    node = helper.make_node("Attention", names, [o.name for o in outs], **attrs)
    graph = helper.make_graph([node], "attention", ins, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24 if window else 23)])


def _attention_inputs(rng, seq, past_len, past):
    xs = [rng.standard_normal((1, 2, seq, 8)).astype(np.float32) for _ in range(3)]
    return xs + ([rng.standard_normal((1, 2, past_len, 8)).astype(np.float32) for _ in range(2)] if past else [])


@pytest.mark.parametrize("past", [False, True], ids=["prefill", "on-a-cache"])
def test_causal_attention_over_a_symbolic_sequence_runs_at_every_length(past):
    """Causality over lengths known at run time was refused; its mask is IR ops over the
    positions now (query i sees keys up to past + i), folded to a constant at each size."""
    model, rng = _attention_model(True, past), np.random.default_rng(0)
    cm = fexplore.compile(model, tuple(_attention_inputs(rng, 6, 4, past)))
    assert set(cm.graph.symbols) == ({"seq", "past"} if past else {"seq"})
    sess, names = session(model), [i.name for i in model.graph.input]
    for seq, past_len in ((9, 3), (3, 7)):
        xs = _attention_inputs(rng, seq, past_len, past)
        for got, want in zip(cm(*xs), run_session(sess, names, xs)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        made = cm.schedules.for_inputs(xs)
        assert not [k.name for k in made.schedule.kernels if k.how == "host"]


def test_a_sliding_window_over_a_symbolic_sequence_equals_the_static_compiles():
    """ONNX Runtime has no left_window_size yet: the mask over symbolic lengths is checked
    against the constant mask a static compile at the same lengths builds."""
    rng = np.random.default_rng(1)
    dynamic = fexplore.compile(_attention_model(True, True, window=2), tuple(_attention_inputs(rng, 6, 4, True)),
                               verify=False)
    for seq, past_len in ((9, 3), (4, 6)):
        xs = _attention_inputs(rng, seq, past_len, True)
        fixed = _attention_model(True, True, window=2)
        for vi, x in zip(fixed.graph.input, xs):
            for d, n in zip(vi.type.tensor_type.shape.dim, x.shape):
                d.dim_value = n
        static = fexplore.compile(fixed, tuple(xs), verify=False)
        assert not static.graph.symbols
        for got, want in zip(dynamic(*xs), static(*xs)):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_a_model_saved_optimized_by_onnx_runtime_compiles_with_its_contrib_ops(name, tmp_path):
    """ONNX Runtime saves the models it optimizes with its own fused ops (FusedMatMul,
    SkipLayerNormalization, FastGelu, QuickGelu): an "optimized for ONNX Runtime" file is a
    common ONNX model in the wild. They convert to the standard ops they fuse; every stage is
    checked against ONNX Runtime running the optimized file, and the result equals the torch
    door's."""
    import collections

    import onnxruntime as ort

    model, inputs = ZOO[name]()
    path = export(model, inputs, tmp_path / f"{name}.onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / f"{name}.ort.onnx")
    ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(options.optimized_model_filepath)
    contrib = collections.Counter(n.op_type for n in optimized.graph.node if n.domain == "com.microsoft")
    assert contrib, "ONNX Runtime fused nothing: the test would prove nothing"
    arrays = [to_numpy(x) for x in inputs]
    cm = fexplore.compile(options.optimized_model_filepath, arrays)
    assert cm.verification["ok"].all() and not cm.lowering.host_ops, cm.verification
    with torch.no_grad():
        want = model(*inputs)
    np.testing.assert_allclose(cm(*arrays)[0], to_numpy(want), rtol=1e-4, atol=1e-4)


GENAI_LLAMA = Path(__file__).parent / "data" / "genai_llama_tiny.onnx"


def test_a_decoder_written_by_onnx_runtimes_genai_builder_prompts_and_decodes_on_the_chip():
    """ONNX Runtime's GenAI builder's Llama (tests/data/README.md): a prompt on the empty cache,
    then two decode steps from one compile with a symbolic cache length, each equal to ONNX
    Runtime (logits and the present caches) and run wholly on the chip. The cache's head size
    is a dim_param of its own ('kv_cache_dim'): the compile fixes it at the head size and says so."""
    path = str(GENAI_LLAMA)
    model = onnx.load(path)
    # the logits read the last layer (the builder wrote the first layer's for a vocabulary of 64)
    assert any(n.name == "/lm_head/MatMul" and "final_norm" in n.input[0] for n in model.graph.node)
    names = [i.name for i in model.graph.input]
    caches = [n for n in names if n.startswith("past_key_values")]
    outs = [o.name for o in model.graph.output]
    sess = session(model)
    rng = np.random.default_rng(0)

    def inputs(new, past, cache=None):
        given = {"input_ids": rng.integers(0, 96, (1, new)).astype(np.int64),
                 "attention_mask": np.ones((1, past + new), np.int64)}
        for n in caches:
            given[n] = cache[n] if cache else np.zeros((1, 1, past, 16), np.float32)
        return [given[n] for n in names]

    def step(cm, arrays):
        want = run_session(sess, names, arrays)
        got = cm(*arrays)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
        made = cm.schedules.for_inputs(arrays)
        assert made.schedule is not None, made.why
        assert not [k.name for k in made.schedule.kernels if k.how == "host"]
        return {n: w for n, w in zip(outs, want)}

    prompt = inputs(6, 0)
    cm = fexplore.compile(path, prompt)
    assert cm.verification["ok"].all(), cm.verification
    assert "'kv_cache_dim' is fixed at 16" in cm.stages[0].summary
    present = step(cm, prompt)
    cache = {n: present[n.replace("past_key_values", "present")] for n in caches}
    first = inputs(1, 6, cache)
    decode = fexplore.compile(path, first)
    assert decode.verification["ok"].all(), decode.verification
    present = step(decode, first)
    cache = {n: present[n.replace("past_key_values", "present")] for n in caches}
    step(decode, inputs(1, 7, cache))
