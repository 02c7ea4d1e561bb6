"""The verifier explains itself; a wrong stage fails verification and bisection names the node."""

import numpy as np
import pytest
import torch

import fexplore
from fexplore import ir
from fexplore.errors import NumericMismatchError, SourceLoc, VerificationError
from fexplore.ir import DType, Graph, Node, TensorType, Value
from fexplore.models import ZOO
from fexplore.pipeline import Exploration, Stage, StageResult
from fexplore.pipeline.options import CompileOptions


def f32(*shape):
    return TensorType(shape, DType.f32)


def test_use_before_definition_shows_a_window_and_the_source_line():
    x = Value("x", f32(3))
    a, b = Value("a", f32(3)), Value("b", f32(3))
    loc = SourceLoc(__file__, 1, "blk")
    g = Graph("g", [x], [], [Node("relu", [b], {}, [a], loc), Node("exp", [x], {}, [b])], [a])
    with pytest.raises(VerificationError) as info:
        ir.verify(g, stage="simplify")
    msg = str(info.value)
    assert "%b is used by relu before it is defined" in msg
    assert "after stage 'simplify'" in msg
    assert ">> %a: f32[3] = relu(%b)" in msg  # the window marks the bad node
    assert f"{__file__}:1" in msg and "in blk" in msg
    assert "hint:" in msg


def test_stored_type_must_equal_the_reinferred_type():
    x = Value("x", f32(2, 3))
    y = Value("y", f32(3, 2))  # permute would give (3, 2); claim (2, 3) below
    bad = Value("y", f32(2, 3))
    ir.verify(Graph("ok", [x], [], [Node("permute", [x], {"perm": (1, 0)}, [y])], [y]))
    with pytest.raises(VerificationError, match=r"typed f32\[2, 3\] but permute gives f32\[3, 2\]"):
        ir.verify(Graph("bad", [x], [], [Node("permute", [x], {"perm": (1, 0)}, [bad])], [bad]))


@pytest.mark.parametrize("make, match", [
    (lambda x: Node("softmax", [x], {}, [Value("y", f32(3))]), "missing attribute 'axis'"),
    (lambda x: Node("relu", [x], {"bogus": 1}, [Value("y", f32(3))]), "unknown attribute"),
    (lambda x: Node("add", [x], {}, [Value("y", f32(3))]), "takes 2 input"),
    (lambda x: Node("relu", [x], {}, [Value("x", f32(3))]), "defined twice"),
])
def test_malformed_nodes_are_rejected(make, match):
    x = Value("x", f32(3))
    n = make(x)
    with pytest.raises(VerificationError, match=match):
        ir.verify(Graph("g", [x], [], [n], [n.outputs[0]]))


def test_undeclared_symbol_is_rejected():
    x = Value("x", TensorType((ir.symbol("n"),), DType.f32))
    with pytest.raises(VerificationError, match="undeclared symbol"):
        ir.verify(Graph("g", [x], [], [], [x]))


def _drop_gelu(graph: Graph, options) -> StageResult:
    """A deliberately wrong rewrite: replace every gelu by its input (epilogue dropped)."""
    rename, nodes = {}, []
    for n in graph.nodes:
        ins = [rename.get(v.name, v) for v in n.inputs]
        if n.op.name == "gelu":
            rename[n.output.name] = ins[0]
            continue
        nodes.append(Node(n.op, ins, n.attrs, n.outputs, n.loc, n.regions))
    outs = [rename.get(v.name, v) for v in graph.outputs]
    return StageResult(Graph(graph.name, graph.inputs, graph.constants, nodes, outs,
                             graph.symbols))


def test_a_wrong_rewrite_is_caught_and_the_divergent_node_named():
    model, inputs = ZOO["mlp"](activation="gelu")
    ex = Exploration(model, inputs, CompileOptions(), stages=[Stage("broken", _drop_gelu)])
    ex.run_all()
    ingest, broken = ex.records
    assert ingest.verification.ok
    assert broken.verification.structural_ok  # the IR is well formed...
    assert not broken.verification.numeric.ok  # ...but it computes something else
    # the first value that differs from the input graph: the one that used gelu's result
    users = [n for n in ingest.after.nodes
             if any(v.name.startswith("gelu") for v in n.inputs)]
    assert broken.verification.numeric.first_divergent.startswith(f"%{users[0].output.name} =")
    with pytest.raises(NumericMismatchError, match="stage 'broken'"):
        ex.result


def _sizes_at_the_example(graph: Graph, options) -> StageResult:
    """A deliberately wrong rewrite that holds at the traced size only: every symbolic value in
    an attribute (the row count a mean divides by) taken at the example's 6."""
    at_example = {ir.symbol(name): 6 for name in graph.symbols}

    def pinned(v):
        return int(v.xreplace(at_example)) if hasattr(v, "xreplace") else v
    nodes = [Node(n.op, n.inputs, type(n.attrs)({k: pinned(v) for k, v in n.attrs.items()}),
                  n.outputs, n.loc, n.regions) for n in graph.nodes]
    return StageResult(Graph(graph.name, graph.inputs, graph.constants, nodes, graph.outputs,
                             graph.symbols))


class MeanByHand(torch.nn.Module):
    def forward(self, x):
        return x.sum(0) / x.shape[0]


def _mean_by_hand_onnx():
    """MeanByHand in ONNX: the row count from Shape, the rows a dim_param."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
             helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
             helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["s", "nf"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
                          [helper.make_tensor("axes", TensorProto.INT64, [1], [0]),
                           helper.make_tensor("zero", TensorProto.INT64, [], [0])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("door", ["torch", "onnx"])
def test_a_rewrite_right_only_at_the_traced_size_is_caught(door):
    """With symbolic dims, a random input set is at another size in the compiled range: a stage
    that replaced ``n`` by the example's 6 computes the example's numbers exactly, and passed
    when every set had the example's shapes."""
    x = torch.randn(6, 3)
    if door == "torch":
        rows = torch.export.Dim("n", min=3, max=64)
        ex = Exploration(MeanByHand(), (x,), CompileOptions(dynamic_shapes=({0: rows},)),
                         stages=[Stage("broken", _sizes_at_the_example)])
    else:
        ex = Exploration(_mean_by_hand_onnx(), (x.numpy(),), CompileOptions(),
                         stages=[Stage("broken", _sizes_at_the_example)])
    ex.run_all()
    ingest, broken = ex.records
    assert ingest.verification.ok and broken.verification.structural_ok
    assert "value=6" in str(broken.after) and "value=n" in str(ingest.after)
    assert not broken.verification.numeric.ok
    assert broken.verification.numeric.input_sets == 2


def _slice_from_the_end(graph: Graph, options) -> StageResult:
    """A deliberately wrong rewrite whose types still check: x[:, 1:] (start 1, end n) as start
    1 - n, end 0, the same length in symbols but an empty slice in Python's meaning."""
    nodes = []
    for n in graph.nodes:
        attrs = n.attrs
        if n.op.name == "slice" and attrs["start"] == 1:
            size = n.inputs[0].type.shape[attrs["axis"]]
            attrs = type(attrs)({**dict(attrs), "start": 1 - size, "end": 0})
        nodes.append(Node(n.op, n.inputs, attrs, n.outputs, n.loc, n.regions))
    return StageResult(Graph(graph.name, graph.inputs, graph.constants, nodes, graph.outputs,
                             graph.symbols))


class AllButFirst(torch.nn.Module):
    def forward(self, x):
        return x[:, 1:] * 2


def test_a_stage_whose_graph_does_not_run_fails_its_check_instead_of_crashing():
    """The interpreter's own assertion (a slice gave 0 columns where its type says n - 1) came out
    of the compile raw; XLM with a dynamic sequence hit it, its x[:, -n:] ingested as that."""
    rows = torch.export.Dim("n", min=3, max=64)
    ex = Exploration(AllButFirst(), (torch.randn(2, 6),), CompileOptions(dynamic_shapes=({1: rows},)),
                     stages=[Stage("broken", _slice_from_the_end)])
    ex.run_all()
    broken = ex.records[1]
    assert broken.verification.structural_ok and not broken.verification.numeric.ok
    assert "does not run on input set 0: AssertionError" in broken.verification.numeric.detail
    with pytest.raises(NumericMismatchError, match="stage 'broken'"):
        ex.result


def test_compile_options_are_validated():
    model, inputs = ZOO["mlp"]()
    with pytest.raises(fexplore.errors.ConfigError, match="precision"):
        fexplore.compile(model, inputs, precision="fp4")
    with pytest.raises(fexplore.errors.ConfigError, match="target"):
        fexplore.compile(model, inputs, target="gpu")
    with pytest.raises(fexplore.errors.FexploreError, match="torch.nn.Module"):
        fexplore.compile(lambda x: x, inputs)


def test_bad_models_get_clear_errors_not_tracebacks():
    class Counts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(1))

        def forward(self, x):
            self.count.add_(1)
            return x * self.count

    with pytest.raises(fexplore.errors.ExportError, match="updates its buffer count in place, and it is on "
                                                         "the meta device"):
        fexplore.compile(Counts().to("meta"), (torch.randn(2, device="meta"),))

    class Determinant(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.det(x) * 2  # THE DET LINE

    with pytest.raises(fexplore.errors.UnsupportedOperatorError) as info:
        fexplore.compile(Determinant(), (torch.randn(3, 3),))
    e = info.value
    assert "det" in e.op and e.loc.file == __file__
    assert "THE DET LINE" in open(__file__).read().splitlines()[e.loc.line - 1]

    class Broken(torch.nn.Module):
        def forward(self, x):
            return x @ torch.ones(3, 3)

    with pytest.raises(fexplore.errors.ExportError, match="torch.export could not capture"):
        fexplore.compile(Broken(), (torch.randn(2, 4),))


def test_exploration_steps_one_stage_at_a_time():
    model, inputs = ZOO["mlp"]()
    ex = fexplore.explore(model, inputs)
    assert ex.records == [] and not ex.done
    rec = ex.step()
    assert rec.name == "ingest" and rec.before is None and rec.verification.ok
    assert ex["ingest"] is rec
    cm = ex.result
    np.testing.assert_allclose(cm(*inputs).numpy(), model(*inputs).detach().numpy(),
                               rtol=1.3e-6, atol=1e-5)


def test_a_random_input_set_the_model_itself_refuses_is_dropped_not_a_crash():
    class ImageTokens(torch.nn.Module):
        """Writes one feature row over each image token (id 3): eager raises when the counts
        differ, which fresh random token ids almost always make them."""

        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(8, 4)

        def forward(self, ids, feats):
            x = self.embed(ids)
            x[ids == 3] = feats
            return x

    ids = torch.tensor([[1, 3, 3, 5, 7, 0, 2, 6]])
    feats = torch.randn(2, 4)
    model = ImageTokens()
    ex = fexplore.explore(model, (ids, feats), random_input_sets=3)
    cm = ex.result
    oracle = ex._oracle
    assert oracle.dropped_sets and all("the model raised" in d for d in oracle.dropped_sets)
    assert len(oracle.input_sets) == 4 - len(oracle.dropped_sets)
    torch.testing.assert_close(cm(ids, feats), model(ids, feats))


def test_an_op_reads_its_operands_in_the_layout_it_computes_in():
    """Layouts live on the types and the interpreter ignores them, so a forgotten relayout can
    change no number in a check; the verifier catches it on the types."""
    nhwc = ir.Layout((0, 2, 3, 1))
    x = Value("x", f32(1, 2, 3, 3))
    xn = Value("xn", f32(1, 2, 3, 3).with_layout(nhwc))
    y = Value("y", f32(1, 2, 3, 3).with_layout(nhwc))
    back = Value("back", f32(1, 2, 3, 3))
    relayout = Node("relayout", [x], {"order": (0, 2, 3, 1), "tile": ()}, [xn])
    to_rows = Node("relayout", [y], {"order": (0, 1, 2, 3), "tile": ()}, [back])
    ir.verify(Graph("ok", [x], [], [relayout, Node("relu", [xn], {}, [y]), to_rows], [back]))
    with pytest.raises(VerificationError, match="relu computes in layout .* but reads %x in layout "
                                                "row-major") as info:
        ir.verify(Graph("bad", [x], [], [Node("relu", [x], {}, [y]), to_rows], [back]))
    assert "relayout is missing" in str(info.value)
    flat = Value("flat", f32(1, 18))   # a reshape reads row-major: channels-last first goes back
    with pytest.raises(VerificationError, match="reshape computes in layout row-major but reads %y"):
        ir.verify(Graph("bad", [x], [], [relayout, Node("relu", [xn], {}, [y]),
                                         Node("reshape", [y], {"shape": (1, 18)}, [flat])], [flat]))


class TiesAfterAnEmptyBuffer(torch.nn.Module):
    """A buffer made with new_empty and filled by copies, then a top-k over ReLU scores that tie
    at 0.0 (a sparse-attention indexer in miniature: GLM-MoE-DSA, DeepSeek-V3.2)."""

    def forward(self, x):
        buf = x.new_empty(x.shape)
        buf[..., :4].copy_(x[..., :4])
        buf[..., 4:].copy_(x[..., 4:])
        return torch.gather(x, -1, torch.relu(buf).topk(4, dim=-1).indices)


def test_the_divergence_is_the_tie_not_torch_uninitialized_memory():
    """Replaying the exported program, torch's empty holds whatever memory held: the first
    divergent node was the empty buffer (or a slice of it), and the tie was never named."""
    torch.manual_seed(0)
    with pytest.raises(NumericMismatchError) as e:
        fexplore.compile(TiesAfterAnEmptyBuffer(), (torch.randn(1, 9) - 1.0,))
    assert "first divergent node: %topk" in e.value.message, e.value.message
    assert "its indices do not" in e.value.message


class WritesIntoItsInput(torch.nn.Module):
    def forward(self, x, cache):
        cache.mul_(0.5).add_(x)
        return cache.sum(0)


class CountsCalls(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x, y):
        self.count.add_(1)
        return (x + y).sum(0)


def _forget_the_update(graph: Graph, options) -> StageResult:
    """A deliberately wrong rewrite: the last update dropped (the value it updates, unchanged,
    out instead: the input's, or the buffer's, both the graph's last input)."""
    outs = list(graph.outputs[:-1]) + [graph.inputs[-1]]
    return StageResult(Graph(graph.name, graph.inputs, graph.constants, graph.nodes, outs, graph.symbols))


@pytest.mark.parametrize("model", [WritesIntoItsInput(), CountsCalls()], ids=["input", "buffer"])
def test_an_update_in_place_is_verified_like_an_output(model):
    """The new value of an input or a buffer the model updates in place is an output of the
    graph; a stage that loses it computes the same model output and is still caught."""
    inputs = (torch.randn(4, 3), torch.randn(4, 3))
    ex = Exploration(model, inputs, CompileOptions(), stages=[Stage("broken", _forget_the_update)])
    ex.run_all()
    ingest, broken = ex.records
    assert ingest.verification.ok and len(ingest.after.outputs) == 2
    assert broken.verification.structural_ok and not broken.verification.numeric.ok
    with pytest.raises(NumericMismatchError, match="stage 'broken'"):
        ex.result
