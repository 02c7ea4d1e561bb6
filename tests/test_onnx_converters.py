"""The ONNX importer's own behaviour on small hand-built models: symbolic dims keep their
dim_param names, initializers are named constants, shape arithmetic folds, shape-like operands
computed from graph inputs are frozen, If becomes cond (or its known branch), ops with an ONNX
function body convert through it, older opsets are upgraded, external data loads, and the
converter registry is extensible."""

import numpy as np
import pytest

import onnx
from onnx import TensorProto, helper, numpy_helper

import fexplore
from fexplore.errors import FexploreError, InputError
from fexplore.ir import run
from fexplore.pipeline.onnx import ingest_onnx, onnx_converter
from fexplore.pipeline.onnx.oracle import run_session, session

F = TensorProto.FLOAT


def model(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def vi(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def ort(m, arrays):
    return run_session(session(m), [i.name for i in m.graph.input if i.name not in
                                    {t.name for t in m.graph.initializer}], arrays)


def test_dim_param_becomes_a_symbol_and_shape_arithmetic_folds():
    # y = reshape(x, [Shape(x)[0], -1]) @ w: the exporter's shape chain, over a symbolic batch
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(12, 1) / 10, "w")
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "zero1"], ["b1"]),
             helper.make_node("Concat", ["b1", "minus1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["flat"]),
             helper.make_node("MatMul", ["flat", "w"], ["y"])]
    inits = [w, numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "zero1"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    m = model(nodes, [vi("x", ["batch", 3, 4])], [vi("y", ["batch", 1])], inits)
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    ing = ingest_onnx(m, [x])
    g = ing.graph
    assert str(g.inputs[0].type.shape[0]) == "batch" and "batch" in g.symbols
    assert [n.op.name for n in g.nodes] == ["reshape", "permute", "linear"]
    assert [c.name for c in g.constants] == ["w"] and g.constants[0].source == "w"
    x5 = np.random.default_rng(1).standard_normal((5, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(run(g, [x5])[0], ort(m, [x5])[0], rtol=1e-5, atol=1e-6)


def test_shape_operand_computed_from_a_graph_input_freezes_that_input():
    nodes = [helper.make_node("Add", ["n", "one"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    m = model(nodes, [vi("x", [2, 6]), vi("n", [1], TensorProto.INT64)], [vi("y", None)], inits)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    cm = fexplore.compile(m, (x, np.array([2], np.int64)))
    assert cm.stages[0].stats["frozen_inputs"] == ["n"]
    np.testing.assert_array_equal(cm(x, np.array([2], np.int64))[0], x.reshape(3, 4))
    with pytest.raises(InputError, match="'n' was frozen"):
        cm(x, np.array([1], np.int64))


def _branch(name, op, shape=(3,)):
    return helper.make_graph([helper.make_node(op, ["x"], [f"{name}_y"])], name, [],
                             [vi(f"{name}_y", list(shape))])


def test_if_on_a_run_time_condition_becomes_cond():
    node = helper.make_node("If", ["c"], ["y"], then_branch=_branch("then", "Relu"),
                            else_branch=_branch("else", "Neg"))
    m = model([node], [vi("c", [], TensorProto.BOOL), vi("x", [3])], [vi("y", [3])])
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    cm = fexplore.compile(m, (np.array(True), x))
    assert any(n.op.name == "cond" for n in cm.stages[0].after.nodes)
    for c in (True, False):
        np.testing.assert_allclose(cm(np.array(c), x)[0], ort(m, [np.array(c), x])[0])


def test_if_on_a_symbolic_size_runs_its_branch_on_the_chip_at_each_size():
    """A condition on a dim_param is a cond while the size is a symbol; each size's program has
    the branch it takes inlined (simplify), not a cond run from the host."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Greater", ["n", "two"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=_branch("then", "Relu", ["n", 4]),
                              else_branch=_branch("else", "Neg", ["n", 4]))]
    consts = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
              numpy_helper.from_array(np.array(2, np.int64), "two")]
    m = model(nodes, [vi("x", ["n", 4])], [vi("y", ["n", 4])], consts)
    cm = fexplore.compile(m, (np.ones((3, 4), np.float32),))
    assert "cond" in cm.graph.op_counts()
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 6):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        np.testing.assert_allclose(cm(x)[0], ort(m, [x])[0])
        made = cm.schedules.for_inputs([x])
        assert not [k.name for k in made.schedule.kernels if k.how == "host"], n


def test_if_on_a_known_condition_keeps_only_its_branch():
    cond = numpy_helper.from_array(np.array(False), "c")
    node = helper.make_node("If", ["c"], ["y"], then_branch=_branch("then", "Relu"),
                            else_branch=_branch("else", "Neg"))
    m = model([node], [vi("x", [3])], [vi("y", [3])], [cond])
    g = ingest_onnx(m, [np.ones(3, np.float32)]).graph
    assert [n.op.name for n in g.nodes] == ["neg"]


@pytest.mark.parametrize("eq, shapes", [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("ij->ji", [(3, 4)]), ("i,i->", [(5,), (5,)]), ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]), ("bi,bj->bij", [(2, 3), (2, 4)]), ("ijk->i", [(2, 3, 4)]),
    ("bn,anm->bam", [(2, 3), (4, 3, 5)]),
    # a repeated letter takes a diagonal: alone, batched, as a trace, thrice, before a product
    ("ii->i", [(4, 4)]), ("bii->bi", [(2, 3, 3)]), ("ii", [(4, 4)]), ("iji->j", [(3, 2, 3)]),
    ("iii->i", [(3, 3, 3)]), ("ij,jj->i", [(3, 4), (4, 4)]),
    # three and four operands, two at a time: a chain, a shared batch letter, a letter summed
    # that only the first and last have, a broadcast ellipsis
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]), ("bij,bjk,bk->bi", [(2, 3, 4), (2, 4, 5), (2, 5)]),
    ("ai,ij,ja->", [(3, 4), (4, 5), (5, 3)]), ("i,j,k,l->ijkl", [(2,), (3,), (1,), (2,)]),
    ("...i,...i,i", [(2, 1, 3), (4, 3), (3,)]),
])
def test_einsum_matches_numpy(eq, shapes):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    names = [f"x{i}" for i in range(len(xs))]
    m = model([helper.make_node("Einsum", names, ["y"], equation=eq)],
              [vi(n, s) for n, s in zip(names, shapes)], [vi("y", None)], opset=13)
    got = run(ingest_onnx(m, xs).graph, xs)[0]
    np.testing.assert_allclose(got, np.einsum(eq, *xs), rtol=1e-5, atol=1e-5)


def test_an_op_with_an_onnx_function_body_converts_through_it():
    # CenterCropPad has no converter of its own: its function body (Shape, Max, Pad, Slice...)
    # stands in, the crop sizes frozen as a shape-like input
    m = model([helper.make_node("CenterCropPad", ["x", "shape"], ["y"], name="crop")],
              [vi("x", [5, 3]), vi("shape", [2], TensorProto.INT64)], [vi("y", None)])
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    shape = np.array([3, 5], np.int64)
    cm = fexplore.compile(m, (x, shape))
    np.testing.assert_array_equal(cm(x, shape)[0], ort(m, [x, shape])[0])
    assert all(n.loc.module.startswith("crop::CenterCropPad::") for n in cm.stages[0].after.nodes)


def test_an_older_opset_is_upgraded_and_says_so():
    m = model([helper.make_node("Unsqueeze", ["x"], ["y"], axes=[0])], [vi("x", [3])],
              [vi("y", [1, 3])], opset=11)
    cm = fexplore.compile(m, (np.ones(3, np.float32),))
    assert "upgraded from opset 11" in cm.stages[0].summary
    assert cm(np.arange(3, dtype=np.float32))[0].shape == (1, 3)


def test_external_data_loads_from_beside_the_file(tmp_path):
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64))
                                .astype(np.float32), "w")
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [2, 64])],
              [vi("y", [2, 64])], [w])
    path = tmp_path / "ext.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").exists()
    x = np.ones((2, 64), np.float32)
    cm = fexplore.compile(str(path), (x,))
    np.testing.assert_allclose(cm(x)[0], x @ numpy_helper.to_array(w), rtol=1e-5, atol=1e-4)
    proto = onnx.load(str(path), load_external_data=False)
    with pytest.raises(FexploreError, match="external data"):
        fexplore.compile(proto, (x,))


def test_a_user_converter_extends_and_can_take_over():
    calls = []

    @onnx_converter("Det", since=13)
    def _det(ctx):
        calls.append(ctx.onnx.name)
        x = ctx.input(0)   # a 2x2 determinant, enough to show the door works
        a, b, c, d = (ctx.emit("select", [ctx.emit("select", [x], {"axis": 0, "index": i})],
                               {"axis": 0, "index": j}) for i in (0, 1) for j in (0, 1))
        return ctx.emit("sub", [ctx.emit("mul", [a, d]), ctx.emit("mul", [b, c])])

    try:
        m = model([helper.make_node("Det", ["x"], ["y"], name="det")], [vi("x", [2, 2])],
                  [vi("y", [])])
        x = np.array([[2.0, 1.0], [3.0, 4.0]], np.float32)
        assert float(fexplore.compile(m, (x,))(x)[0]) == pytest.approx(5.0)
        assert calls == ["det"]
        with pytest.raises(ValueError, match="replace=True"):
            onnx_converter("Det", since=13)(lambda ctx: None)
    finally:
        from fexplore.pipeline.onnx.registry import ONNX_CONVERTERS

        ONNX_CONVERTERS.pop(("", "Det"), None)


def test_bad_example_inputs_are_clear_errors():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2, 3])], [vi("y", [2, 3])])
    with pytest.raises(FexploreError, match="takes 1 inputs"):
        fexplore.compile(m, ())
    with pytest.raises(FexploreError, match="float32 array"):
        fexplore.compile(m, (np.ones((2, 3)),))
    with pytest.raises(FexploreError, match="dim 1 is 3 in the model"):
        fexplore.compile(m, (np.ones((2, 4), np.float32),))
    with pytest.raises(FexploreError, match="dim_param"):
        fexplore.compile(m, (np.ones((2, 3), np.float32),), dynamic_shapes=({0: "batch"},))


@pytest.mark.parametrize("zp_type, per_axis", [(TensorProto.UINT8, False), (TensorProto.INT8, True)])
def test_quantize_dequantize_match_onnx_runtime(zp_type, per_axis):
    c = 3
    scale = np.array([0.05, 0.1, 0.02], np.float32) if per_axis else np.array(0.05, np.float32)
    zp_np = np.int8 if zp_type == TensorProto.INT8 else np.uint8
    zp = (np.array([0, 3, -2], zp_np) if per_axis else np.array(128, zp_np))
    inits = [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1)]
    m = model(nodes, [vi("x", [2, c, 4])], [vi("q", None, zp_type), vi("y", None)], inits, opset=13)
    x = (np.random.default_rng(0).standard_normal((2, c, 4)) * 4).astype(np.float32)
    got = fexplore.compile(m, (x,))(x)
    want = ort(m, [x])
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=1e-6)


def test_unsigned_types_compute_in_their_own_width_on_the_chip():
    # u16/u32/u64 are IR dtypes: wraparound, shifts into the top bit and values above i64's
    # range come out as ONNX Runtime computes them, through every stage and on the chip
    U16, U32, U64 = TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64
    nodes = [helper.make_node("Add", ["a", "b"], ["wrapped"]),
             helper.make_node("BitShift", ["w", "s"], ["shifted"], direction="LEFT"),
             helper.make_node("BitwiseNot", ["a"], ["flipped"]),
             helper.make_node("Mul", ["h", "h"], ["squared"]),
             helper.make_node("Greater", ["w", "v"], ["above"])]
    m = model(nodes, [vi("a", [8], U32), vi("b", [8], U32), vi("w", [8], U64), vi("s", [8], U64),
                      vi("h", [8], U16), vi("v", [8], U64)],
              [vi("wrapped", [8], U32), vi("shifted", [8], U64), vi("flipped", [8], U32),
               vi("squared", [8], U16), vi("above", [8], TensorProto.BOOL)])
    rng = np.random.default_rng(0)
    a = rng.integers(2**31, 2**32, 8, dtype=np.uint32)
    b = rng.integers(2**31, 2**32, 8, dtype=np.uint32)            # a + b overflows u32
    w = rng.integers(2**62, 2**64 - 1, 8, dtype=np.uint64)        # above i64's range
    s = np.arange(8, dtype=np.uint64)
    h = rng.integers(300, 2**16, 8, dtype=np.uint16)
    v = w ^ np.uint64(1)                                           # differs in the lowest bit
    arrays = [a, b, w, s, h, v]
    cm = fexplore.compile(m, arrays)
    assert [i.type.dtype.value for i in cm.stages[0].after.inputs] == \
        ["u32", "u32", "u64", "u64", "u16", "u64"]
    g = cm.stages[0].after
    assert fexplore.ir.parse(str(g), payloads=g.payloads) == g
    assert not cm.lowering.host_ops   # every op a kernel of the chip's, unsigned tiles and all
    got, want = cm(*arrays), ort(m, arrays)
    for x, y in zip(got, want):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)
    assert (got[0] < a).all()   # it did wrap


def test_bitcast_keeps_the_bits_and_refuses_unequal_widths():
    m = model([helper.make_node("BitCast", ["x"], ["bits"], to=TensorProto.INT32),
               helper.make_node("BitCast", ["u"], ["signed"], to=TensorProto.INT16)],
              [vi("x", [5]), vi("u", [3], TensorProto.UINT16)],
              [vi("bits", [5], TensorProto.INT32), vi("signed", [3], TensorProto.INT16)],
              opset=26)
    x = np.array([1.0, -0.0, np.inf, np.nan, 1e-45], np.float32)
    u = np.array([0, 32768, 65535], np.uint16)
    got = fexplore.compile(m, (x, u))(x, u)
    for g, w in zip(got, ort(m, [x, u])):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    assert got[0][0] == 0x3F800000 and list(got[1]) == [0, -32768, -1]
    wide = model([helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.INT64)],
                 [vi("x", [5])], [vi("y", [5], TensorProto.INT64)], opset=26)
    with pytest.raises(FexploreError, match=r"FX410.*f32 to i64: the bit widths differ"):
        fexplore.compile(wide, (x,))


@pytest.mark.parametrize("batch_dims, data, index", [
    (1, (2, 3, 4), (2, 5, 1)), (1, (2, 3, 4), (2, 2)), (1, (3, 4, 5, 2), (3, 2, 2)),
    (2, (2, 3, 4, 5), (2, 3, 6, 2)), (0, (4, 5), (3, 2)),
])
def test_gathernd_with_batch_dims_matches_onnx_runtime(batch_dims, data, index):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(data).astype(np.float32)
    k = index[-1]
    sizes = np.array(data[batch_dims:batch_dims + k])
    idx = rng.integers(-sizes, sizes, size=index).astype(np.int64)   # negatives count from the end
    m = model([helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)],
              [vi("x", list(data)), vi("i", list(index), TensorProto.INT64)], [vi("y", None)])
    got = fexplore.compile(m, (x, idx))(x, idx)[0]
    np.testing.assert_array_equal(got, ort(m, [x, idx])[0])


def _loop_model(cond_out_node, trip=10):
    """y, ys = Loop(trip, true, y0): y += x[iter] each step; ``cond_out_node`` makes cond_out."""
    I64, B = TensorProto.INT64, TensorProto.BOOL
    one = helper.make_tensor("one", I64, [1], [1])
    body = helper.make_graph(
        [helper.make_node("Unsqueeze", ["iter", "zero"], ["start"]),
         helper.make_node("Add", ["start", "one"], ["end"]),
         helper.make_node("Slice", ["x", "start", "end"], ["row"]),
         helper.make_node("Add", ["y_in", "row"], ["y_out"]),
         helper.make_node("Identity", ["y_out"], ["scan_out"]), cond_out_node],
        "body", [vi("iter", [], I64), vi("cond_in", [], B), vi("y_in", [1])],
        [vi("cond_out", [], B), vi("y_out", [1]), vi("scan_out", [1])],
        [one, helper.make_tensor("zero", I64, [1], [0]), helper.make_tensor("three", I64, [], [3])])
    nodes = [helper.make_node("Loop", ["trip", "go", "y0"], ["y", "ys"], body=body, name="loop")]
    inits = [helper.make_tensor("trip", I64, [], [trip]), helper.make_tensor("go", B, [], [True])]
    return model(nodes, [vi("x", [10]), vi("y0", [1])], [vi("y", [1]), vi("ys", None)], inits,
                 opset=13)


def test_loop_with_a_known_trip_count_and_condition_unrolls():
    x = np.arange(10, dtype=np.float32) + 1
    y0 = np.array([-2.0], np.float32)
    for cond_out, steps in [(helper.make_node("Identity", ["cond_in"], ["cond_out"]), 10),
                            (helper.make_node("Less", ["iter", "three"], ["cond_out"]), 4)]:
        m = _loop_model(cond_out)
        cm = fexplore.compile(m, (x, y0))
        got, want = cm(x, y0), ort(m, [x, y0])
        assert got[1].shape == (steps, 1) and want[1].shape == (steps, 1)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6)
    # a condition computed from the data: the number of steps is not known when compiling
    m = _loop_model(helper.make_node("Less", ["y_out", "y_in"], ["cond_out"]))
    with pytest.raises(FexploreError, match=r"FX410.*loop condition"):
        fexplore.compile(m, (x, y0))


def test_an_upgrade_that_changes_the_graph_inputs_is_refused_clearly():
    # Scan at opset 8 has a batch axis; the version converter's adapter drops it from the graph's
    # inputs, which the example inputs (shaped for the exported model) then no longer fit
    body = helper.make_graph([helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
                              helper.make_node("Identity", ["s_out"], ["y_t"])], "body",
                             [vi("s_in", [2]), vi("x_t", [2])], [vi("s_out", [2]), vi("y_t", [2])])
    node = helper.make_node("Scan", ["", "s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1)
    m = model([node], [vi("s0", [1, 2]), vi("xs", [1, 3, 2])], [vi("s", [1, 2]), vi("ys", [1, 3, 2])],
              opset=8)
    with pytest.raises(FexploreError, match=r"FX411.*changed input 's0' from shape \[1, 2\] to \[2\]"):
        fexplore.compile(m, (np.zeros((1, 2), np.float32), np.ones((1, 3, 2), np.float32)))


@pytest.mark.parametrize("size, output_shape", [((1, 2, 4, 6), False), ((2, 1, 5, 5), True)])
def test_maxunpool_inverts_maxpool_with_indices(size, output_shape):
    # MaxPool's values and flat indices back to the pooled input's size, zeros elsewhere; an odd
    # size needs output_shape (pooling floors it away), as torch's max_unpool2d needs output_size
    I64 = TensorProto.INT64
    ins = ["p", "i"] + (["s"] if output_shape else [])
    m = model([helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2]),
               helper.make_node("MaxUnpool", ins, ["y"], kernel_shape=[2, 2], strides=[2, 2])],
              [vi("x", list(size))], [vi("y", None), vi("i", None, I64)],
              [helper.make_tensor("s", I64, [4], list(size))] if output_shape else [])
    x = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    got, want = fexplore.compile(m, (x,))(x), ort(m, [x])
    np.testing.assert_array_equal(got[0], want[0])
    n, c, h, w = size
    kept = got[0] != 0
    assert got[0].shape == size and kept.sum() == n * c * (h // 2) * (w // 2)   # one per window
    np.testing.assert_array_equal(got[0][kept], x[kept])   # every kept value is the input's own


@pytest.mark.parametrize("opset_name", ["test_dft_axis", "test_dft_inverse", "test_dft_rfft", "test_dft_irfft_opset19"])
def test_dft_matches_onnxs_own_expected_outputs(opset_name):
    # ONNX Runtime fails these node tests, so the conformance bench does not count them: the
    # cases' own expected outputs (numpy's FFT) are the oracle here, on the chip of both presets
    from fexplore.testing.onnx_conformance import collect

    (case,) = [c for c in collect("DFT") if c.name == opset_name]
    inputs, (want,) = case.data_sets[0]
    for target in ("rngd", "tiny"):
        cm = fexplore.compile(case.model, [np.asarray(i) for i in inputs], target=target)
        assert cm.verification["ok"].all() and not cm.lowering.host_ops
        got = cm(*inputs)
        got = np.asarray(got[0] if isinstance(got, (list, tuple)) else got)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def _ml_model(nodes, inputs, outputs):
    """A model of the classical-ML domain only (as scikit-learn exporters write one)."""
    g = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1),
                                               helper.make_opsetid("", 13)])


@pytest.mark.parametrize("dtype, threshold", [(np.float32, 0.25), (np.int64, 1.5), (np.int64, -2.0)])
def test_binarizer_matches_onnx_runtime_and_the_spec(dtype, threshold):
    """ONNX Runtime runs float inputs only; integers are checked against the spec's x > t."""
    x = (np.random.default_rng(0).standard_normal((3, 7)) * 3).astype(dtype)
    t = {np.float32: F, np.int64: TensorProto.INT64}[dtype]
    m = _ml_model([helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=threshold)],
                  [vi("x", [3, 7], t)], [vi("y", None, t)])
    floats = dtype == np.float32
    got = fexplore.compile(m, (x,), verify=floats)(x)[0]
    assert got.dtype == dtype and got.any() and not got.all()
    np.testing.assert_array_equal(got, ort(m, [x])[0] if floats else (x > threshold).astype(dtype))


@pytest.mark.parametrize("xshape, idx", [((3, 4), [3, 0, 0]), ((2, 3, 5), [[4, 1], [2, 2]]), ((6,), [5, 1])],
                         ids=["matrix", "3d_by_2d_indices", "vector"])
@pytest.mark.parametrize("constant", [False, True], ids=["input_indices", "constant_indices"])
def test_array_feature_extractor_matches_onnx_runtime(xshape, idx, constant):
    x = np.random.default_rng(1).standard_normal(xshape).astype(np.float32)
    i = np.array(idx, dtype=np.int64)
    node = helper.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain="ai.onnx.ml")
    if constant:   # an initializer: converted as a known array, in its own shape
        g = helper.make_graph([node], "g", [vi("x", list(xshape))], [vi("y", None)], [numpy_helper.from_array(i, "i")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1), helper.make_opsetid("", 13)])
        args = (x,)
    else:
        m = _ml_model([node], [vi("x", list(xshape)), vi("i", list(i.shape), TensorProto.INT64)], [vi("y", None)])
        args = (x, i)
    want = ort(m, list(args))[0]
    got = fexplore.compile(m, args, target="tiny")(*args)[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("groups, offset_groups, stride, dilation, pads, with_mask", [
    (1, 1, (1, 1), (1, 1), (0, 0, 0, 0), False),
    (2, 2, (2, 1), (1, 2), (1, 2, 1, 2), True),
    (2, 1, (1, 2), (2, 1), (2, 1, 2, 1), True),
])
def test_deform_conv_matches_onnxs_reference(groups, offset_groups, stride, dilation, pads, with_mask):
    """Each kernel tap samples the image at its place plus a learned offset, bilinearly, zero
    outside; odd sizes, offsets that move taps off the image, groups and offset groups, a mask
    and a bias. The reference is ONNX's own (onnx.reference), on every stage and on the chip."""
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(groups * 10 + offset_groups)
    n, c, h, w, oc, kh, kw = 2, 4, 7, 6, 6, 3, 2
    oh = (h + pads[0] + pads[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + pads[1] + pads[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    weight = rng.standard_normal((oc, c // groups, kh, kw)).astype(np.float32)
    offset = (2.5 * rng.standard_normal((n, offset_groups * 2 * kh * kw, oh, ow))).astype(np.float32)
    bias = rng.standard_normal(oc).astype(np.float32)
    mask = rng.random((n, offset_groups * kh * kw, oh, ow)).astype(np.float32)
    names = ["x", "w", "offset", "b"] + (["mask"] if with_mask else [])
    arrays = [x, weight, offset, bias] + ([mask] if with_mask else [])
    node = helper.make_node("DeformConv", names, ["y"], group=groups, offset_group=offset_groups,
                            strides=list(stride), dilations=list(dilation), pads=list(pads),
                            kernel_shape=[kh, kw])
    m = model([node], [vi(nm, list(a.shape)) for nm, a in zip(names, arrays)], [vi("y", [n, oc, oh, ow])],
              opset=19)
    want = ReferenceEvaluator(m).run(None, dict(zip(names, arrays)))[0]
    assert np.abs(want).max() > 1.0
    cm = fexplore.compile(m, arrays)
    assert cm.verification["ok"].all() and not cm.lowering.host_ops
    np.testing.assert_allclose(cm(*arrays)[0], want, rtol=1e-4, atol=1e-4)


def _ms_model(nodes, inputs, outputs):
    g = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def _ms(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, domain="com.microsoft", **attrs)


_CONTRIB = {
    "FusedMatMul": ([_ms("FusedMatMul", ["a", "b"], ["y"], alpha=0.125, transA=1, transB=1)],
                    {"a": (2, 5, 3), "b": (2, 4, 5)}, {"y": (2, 3, 4)}),
    "FastGelu": ([_ms("FastGelu", ["x", "bias"], ["y"])], {"x": (2, 3, 6), "bias": (6,)}, {"y": (2, 3, 6)}),
    "BiasGelu": ([_ms("BiasGelu", ["x", "bias"], ["y"])], {"x": (2, 3, 6), "bias": (6,)}, {"y": (2, 3, 6)}),
    "Gelu": ([_ms("Gelu", ["x"], ["y"])], {"x": (2, 3, 6)}, {"y": (2, 3, 6)}),
    "QuickGelu": ([_ms("QuickGelu", ["x"], ["y"])], {"x": (2, 3, 6)}, {"y": (2, 3, 6)}),
    "QuickGelu-silu": ([_ms("QuickGelu", ["x"], ["y"], alpha=1.0)], {"x": (2, 3, 6)}, {"y": (2, 3, 6)}),
    "SkipLayerNormalization": (
        [_ms("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"], ["y", "mean", "inv", "sum"],
             epsilon=1e-5)],
        {"x": (2, 3, 8), "skip": (2, 3, 8), "gamma": (8,), "beta": (8,), "bias": (8,)},
        {"y": (2, 3, 8), "mean": (2, 3, 1), "inv": (2, 3, 1), "sum": (2, 3, 8)}),
    "SkipLayerNormalization-sum-only": (
        [_ms("SkipLayerNormalization", ["x", "skip", "gamma"], ["y", "", "", "sum"])],
        {"x": (2, 3, 8), "skip": (2, 3, 8), "gamma": (8,)}, {"y": (2, 3, 8), "sum": (2, 3, 8)}),
    "SkipSimplifiedLayerNormalization": (
        [_ms("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"], ["y", "", "", "sum"], epsilon=1e-6)],
        {"x": (2, 3, 8), "skip": (2, 3, 8), "gamma": (8,)}, {"y": (2, 3, 8), "sum": (2, 3, 8)}),
    "SimplifiedLayerNormalization": (
        [helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["y", "inv"], axis=-1, epsilon=1e-6)],
        {"x": (2, 3, 8), "scale": (8,)}, {"y": (2, 3, 8), "inv": (2, 3, 1)}),
}


@pytest.mark.parametrize("case", sorted(_CONTRIB))
def test_onnx_runtime_contrib_ops_match_onnx_runtime(case):
    """The com.microsoft ops ONNX Runtime's optimizer writes into the models it saves, each with
    its optional inputs and outputs, against ONNX Runtime itself, on the chip."""
    nodes, ins, outs = _CONTRIB[case]
    m = _ms_model(nodes, [vi(k, list(s)) for k, s in ins.items()], [vi(k, list(s)) for k, s in outs.items()])
    rng = np.random.default_rng(len(case))
    arrays = [(2.0 * rng.standard_normal(s) + 0.5).astype(np.float32) for s in ins.values()]
    want = ort(m, arrays)
    cm = fexplore.compile(m, arrays)
    assert cm.verification["ok"].all() and not cm.lowering.host_ops
    got = cm(*arrays)
    assert len(got) == len(want) == len(outs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_a_fused_matmul_that_moves_batch_axes_is_refused_by_name():
    m = _ms_model([_ms("FusedMatMul", ["a", "b"], ["y"], transBatchA=1)],
                  [vi("a", [2, 3, 4]), vi("b", [4, 5])], [vi("y", [3, 2, 5])])
    with pytest.raises(FexploreError, match="transBatchA"):
        fexplore.compile(m, [np.ones((2, 3, 4), np.float32), np.ones((4, 5), np.float32)])


_MHA = {   # inputs by name -> shapes, attributes
    "self-with-bias": ({"q": (2, 5, 8), "k": (2, 5, 8), "v": (2, 5, 8), "bias": (24,)}, {"num_heads": 2}),
    "cross-with-attention-bias": ({"q": (2, 3, 8), "k": (2, 6, 8), "v": (2, 6, 12), "": None,
                                   "ab": (2, 4, 3, 6)}, {"num_heads": 4, "scale": 0.3}),
    "causal": ({"q": (1, 7, 6), "k": (1, 7, 6), "v": (1, 7, 6)}, {"num_heads": 3, "unidirectional": 1}),
}


@pytest.mark.parametrize("case", sorted(_MHA))
def test_multi_head_attention_matches_onnx_runtime(case):
    ins, attrs = _MHA[case]
    names = list(ins)
    inputs = [n for n in names if n]
    node = _ms("MultiHeadAttention", names[:3] + (["bias"] if "bias" in ins else [""] if "ab" in ins else [])
               + (["", "ab"] if "ab" in ins else []), ["y"], **attrs)
    b, s, _ = ins["q"]
    m = _ms_model([node], [vi(n, list(ins[n])) for n in inputs], [vi("y", [b, s, ins["v"][2]])])
    rng = np.random.default_rng(len(case))
    arrays = [rng.standard_normal(ins[n]).astype(np.float32) for n in inputs]
    want = ort(m, arrays)[0]
    cm = fexplore.compile(m, arrays)
    assert cm.verification["ok"].all() and not cm.lowering.host_ops
    np.testing.assert_allclose(cm(*arrays)[0], want, rtol=1e-4, atol=1e-5)


_MHA_CACHED = {   # (batch, new tokens, past, heads, head size), unidirectional, a key padding mask
    "decode-step-causal": ((2, 1, 4, 2, 4), 1, False),
    "prompt-after-a-cache-causal-padded": ((2, 3, 4, 2, 4), 1, True),
    "cross-attention-to-a-cache-padded": ((1, 2, 5, 4, 2), 0, True),
    "prompt-after-a-cache-causal": ((2, 3, 4, 2, 4), 1, False),
    "prompt-padded": ((2, 3, 4, 2, 4), 0, True),
}


@pytest.mark.parametrize("case", sorted(_MHA_CACHED))
def test_multi_head_attention_on_a_cache_matches_onnx_runtime(case):
    """MultiHeadAttention as ONNX Runtime's fusions write it for decoders: the new keys and
    values follow the cache's (present_key and present_value), causality counts from the end of
    the past, and a key padding mask drops keys; output and both present caches."""
    (b, s, past, heads, d), causal, padded = _MHA_CACHED[case]
    hidden, total = heads * d, past + s
    names = ["q", "k", "v", "", "pad" if padded else "", "", "pk", "pv"]
    node = _ms("MultiHeadAttention", names, ["y", "present_k", "present_v"], num_heads=heads, unidirectional=causal)
    shapes = {"q": (b, s, hidden), "k": (b, s, hidden), "v": (b, s, hidden), "pad": (b, total),
              "pk": (b, heads, past, d), "pv": (b, heads, past, d)}
    inputs = [n for n in names if n]
    m = _ms_model([node], [vi(n, list(shapes[n]), TensorProto.INT32 if n == "pad" else F) for n in inputs],
                  [vi("y", [b, s, hidden]), vi("present_k", [b, heads, total, d]), vi("present_v", [b, heads, total, d])])
    rng = np.random.default_rng(len(case))
    keep = np.ones((b, total), np.int32)
    keep[0, 1] = 0
    keep[-1, :min(total - 1, past + 1)] = 0   # left padding: the last row's first query sees no key
    arrays = [keep if n == "pad" else rng.standard_normal(shapes[n]).astype(np.float32) for n in inputs]
    want = ort(m, arrays)
    cm = fexplore.compile(m, arrays)
    assert cm.verification["ok"].all() and not cm.lowering.host_ops
    for g, w in zip(cm(*arrays), want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("qkv, causal, with_bias", [(None, 0, True), ((8, 8, 12), 1, False), (None, 1, True)])
def test_attention_with_its_input_projection_matches_onnx_runtime(qkv, causal, with_bias):
    """ONNX Runtime's Attention: one weight projects the input to query, key and value (their
    widths may differ), then multi-head attention, causal when unidirectional, with an
    attention bias added to the scores."""
    b, s, din, heads = 2, 5, 6, 2
    d, dk, dv = qkv or (8, 8, 8)
    names = ["x", "w", "bias" if with_bias else "", "", "", "ab"]
    attrs = {"num_heads": heads, "unidirectional": causal}
    if qkv:
        attrs["qkv_hidden_sizes"] = list(qkv)
    node = _ms("Attention", names, ["y"], **attrs)
    shapes = {"x": (b, s, din), "w": (din, d + dk + dv), "bias": (d + dk + dv,), "ab": (1, heads, s, s)}
    inputs = [n for n in names if n]
    m = _ms_model([node], [vi(n, list(shapes[n])) for n in inputs], [vi("y", [b, s, dv])])
    rng = np.random.default_rng(d + dv + causal)
    arrays = [rng.standard_normal(shapes[n]).astype(np.float32) for n in inputs]
    want = ort(m, arrays)[0]
    cm = fexplore.compile(m, arrays)
    assert cm.verification["ok"].all() and not cm.lowering.host_ops
    np.testing.assert_allclose(cm(*arrays)[0], want, rtol=1e-4, atol=1e-5)


# ONNX Runtime's GroupQueryAttention: (batch, new tokens, cache length, heads, kv heads, head
# size), seqlens_k (per row: the index of its last valid key), total_sequence_length, and the
# node's options. ONNX Runtime's CPU kernel is the reference; its rotary needs head sizes of 16.
_GQA = {
    "first-prompt-padded-rows": ((2, 5, 0, 4, 2, 8), [4, 2], 5, {}),
    "decode-on-a-cache-rotary": ((2, 1, 5, 4, 2, 16), [5, 3], 6, {"do_rotary": 1}),
    "prompt-after-a-cache-packed-interleaved-window": (
        (1, 3, 4, 4, 2, 16), [6], 7, {"packed": True, "do_rotary": 1, "rotary_interleaved": 1, "local_window_size": 3}),
    "multi-query-softcap-scale-attention-bias": ((2, 3, 0, 4, 1, 8), [2, 2], 3, {"softcap": 2.0, "scale": 0.3, "bias": True}),
    "cache-longer-than-the-total": ((1, 1, 8, 2, 2, 8), [5], 6, {}),
    "partial-rotary": ((1, 4, 0, 2, 1, 32), [3], 4, {"do_rotary": 1, "rotary_dim": 16}),
}


def _gqa_case(case):
    (b, s, past, heads, kv_heads, d), seqlens, total, opts = _GQA[case]
    opts = dict(opts)
    packed, bias, rotary_dim = opts.pop("packed", False), opts.pop("bias", False), opts.pop("rotary_dim", d)
    rotary = opts.get("do_rotary", 0)
    length = max(past, total)
    shapes = {"q": (b, s, (heads + 2 * kv_heads) * d if packed else heads * d), "k": (b, s, kv_heads * d),
              "v": (b, s, kv_heads * d), "pk": (b, kv_heads, past, d), "pv": (b, kv_heads, past, d),
              "sl": (b,), "tl": (), "cos": (32, rotary_dim // 2), "sin": (32, rotary_dim // 2),
              "ab": (b, 1, s, length)}
    names = ["q", "" if packed else "k", "" if packed else "v", "pk" if past else "", "pv" if past else "",
             "sl", "tl"] + (["cos", "sin"] if rotary else ["", ""]) + (["", "ab"] if bias else [])
    while not names[-1]:
        names.pop()
    node = _ms("GroupQueryAttention", names, ["y", "present_k", "present_v"], num_heads=heads,
               kv_num_heads=kv_heads, **opts)
    inputs = [n for n in names if n]
    m = _ms_model([node], [vi(n, list(shapes[n]), TensorProto.INT32 if n in ("sl", "tl") else F) for n in inputs],
                  [vi("y", [b, s, heads * d]), vi("present_k", [b, kv_heads, length, d]),
                   vi("present_v", [b, kv_heads, length, d])])
    rng = np.random.default_rng(len(case))
    angles = rng.uniform(0, 6, shapes["cos"])
    given = {"sl": np.array(seqlens, np.int32), "tl": np.array(total, np.int32),
             "cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    arrays = [given[n] if n in given else rng.standard_normal(shapes[n]).astype(np.float32) for n in inputs]
    return m, arrays


@pytest.mark.parametrize("case", sorted(_GQA))
def test_group_query_attention_matches_onnx_runtime(case):
    """Each form of the op the GenAI model builder and ONNX Runtime's fusions write: padded rows
    of a first prompt, a decode step on a cache, a prompt after a cache, packed query/key/value,
    rotary (halves, interleaved pairs, partial), a sliding window, a softcap, an attention bias,
    a cache longer than the total length; the attention output and both present caches."""
    m, arrays = _gqa_case(case)
    want = ort(m, arrays)
    cm = fexplore.compile(m, arrays)
    assert cm.verification["ok"].all() and not cm.lowering.host_ops
    got = cm(*arrays)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_group_query_attention_with_a_smooth_softmax_is_refused_by_name():
    m, arrays = _gqa_case("first-prompt-padded-rows")
    m.graph.node[0].attribute.append(helper.make_attribute("smooth_softmax", 1))
    with pytest.raises(FexploreError, match="smooth_softmax"):
        fexplore.compile(m, arrays)


# ONNX Runtime's RotaryEmbedding: input shape, positions (per token, or one offset), cache width
# (half the rotary width), attributes
_ROTARY = {
    "3d-heads-from-the-cache-width": ((2, 5, 32), (2, 5), 8, {}),
    "4d-interleaved-positions-from-an-offset": ((1, 2, 4, 16), (1,), 8, {"interleaved": 1}),
    "3d-partial": ((1, 3, 32), (1, 3), 4, {"num_heads": 2, "rotary_embedding_dim": 8}),
}


@pytest.mark.parametrize("case", sorted(_ROTARY))
def test_rotary_embedding_matches_onnx_runtime(case):
    shape, at, half, attrs = _ROTARY[case]
    node = _ms("RotaryEmbedding", ["x", "at", "cos", "sin"], ["y"], **attrs)
    m = _ms_model([node], [vi("x", list(shape)), vi("at", list(at), TensorProto.INT64), vi("cos", [16, half]),
                           vi("sin", [16, half])], [vi("y", list(shape))])
    rng = np.random.default_rng(len(case))
    angles = rng.uniform(0, 6, (16, half))
    positions = rng.integers(0, 12, at).astype(np.int64) if len(at) == 2 else np.array([3], np.int64)
    arrays = [rng.standard_normal(shape).astype(np.float32), positions,
              np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)]
    want = ort(m, arrays)[0]
    cm = fexplore.compile(m, arrays)
    assert cm.verification["ok"].all() and not cm.lowering.host_ops
    np.testing.assert_allclose(cm(*arrays)[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("new, past", [(1, 5), (3, 4)], ids=["decode-step", "prompt-after-a-cache"])
def test_attention_on_its_packed_cache_with_a_mask_matches_onnx_runtime(new, past):
    """ONNX Runtime's Attention as its GPT-2 conversion writes it: the cache one tensor (2, B,
    heads, P, head size), keys then values, and so the present; a causal mask counted from the
    end of the past; the attention mask (B, P + S), left-padded in one row."""
    b, din, heads, hd = 2, 8, 2, 4
    total = past + new
    node = _ms("Attention", ["x", "w", "bias", "mask", "past"], ["y", "present"], num_heads=heads, unidirectional=1)
    shapes = {"x": (b, new, din), "w": (din, 3 * heads * hd), "bias": (3 * heads * hd,), "mask": (b, total),
              "past": (2, b, heads, past, hd)}
    m = _ms_model([node], [vi(n, list(sh), TensorProto.INT32 if n == "mask" else F) for n, sh in shapes.items()],
                  [vi("y", [b, new, heads * hd]), vi("present", [2, b, heads, total, hd])])
    rng = np.random.default_rng(new)
    mask = np.ones((b, total), np.int32)
    mask[1, :2] = 0
    arrays = [mask if n == "mask" else rng.standard_normal(sh).astype(np.float32) for n, sh in shapes.items()]
    want = ort(m, arrays)
    cm = fexplore.compile(m, arrays)
    assert cm.verification["ok"].all() and not cm.lowering.host_ops
    for g, w in zip(cm(*arrays), want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
