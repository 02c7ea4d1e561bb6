"""The IR's text form: golden text for small hand-built graphs, each paired with a numeric check;
exact round trips (symbols, layouts, regions, inline constants, locations); parse errors with
line and column."""

import numpy as np
import pytest

from fexplore import ir
from fexplore.errors import ParseError, SourceLoc
from fexplore.ir import Attrs, Constant, DType, Graph, Layout, Node, TensorType, Value


def f32(*shape):
    return TensorType(shape, DType.f32)


def small_graph() -> Graph:
    x = Value("x", f32(2, 3))
    w = Constant("w", f32(4, 3), np.arange(12, dtype=np.float32).reshape(4, 3) / 10,
                 source="proj.weight")
    half = Constant("half", f32(), np.float32(0.5))
    y = Value("y", f32(2, 4))
    z = Value("z", f32(2, 4))
    s = Value("s", f32(2, 4))
    loc = SourceLoc("model.py", 7, "proj")
    nodes = [
        Node("linear", [x, w], {}, [y], loc),
        Node("mul", [y, half], {}, [z], SourceLoc("model.py", 8, None)),
        Node("softmax", [z], {"axis": -1}, [s], None),
    ]
    return Graph("forward", [x], [w, half], nodes, [s])


GOLDEN = """\
graph @forward(%x: f32[2, 3]) {
  source f0 = "model.py"
  const %w: f32[4, 3] = param "proj.weight" #DIGEST
  const %half: f32[] = dense 0.5
  %y: f32[2, 4] = linear(%x, %w) loc(f0:7 "proj")
  %z: f32[2, 4] = mul(%y, %half) loc(f0:8)
  %s: f32[2, 4] = softmax(%z) {axis=-1}
  return %s
}
"""


def test_golden_text_and_its_numbers():
    g = small_graph()
    text = str(g)
    assert text == GOLDEN.replace("DIGEST", g.constants[0].digest)
    ir.verify(g)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    (got,) = ir.run(g, [x])
    logits = 0.5 * (x.astype(np.float64) @ g.constants[0].payload.T.astype(np.float64))
    want = np.exp(logits - logits.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    # the parsed text, bound to the payloads, computes the same numbers
    back = ir.parse(text, payloads=g.payloads)
    np.testing.assert_array_equal(ir.run(back, [x])[0], got)


def test_round_trip_symbols_layouts_regions_and_odd_values():
    seq = ir.symbol("seq")
    x = Value("x", TensorType((2, seq), DType.f32))
    p = Value("p", TensorType((), DType.bool))
    mask = Constant("mask", TensorType((2, 2), DType.bool), np.array([[True, False], [True, True]]))
    big = Constant("big", f32(64), np.linspace(-1, 1, 64, dtype=np.float32))  # by digest
    # a region taking x
    rx = Value("rx", TensorType((2, seq), DType.f32))
    ry = Value("ry", TensorType((2, seq), DType.f32))
    then_g = Graph("then", [rx], [], [Node("exp", [rx], {}, [ry])], [ry])
    ex = Value("ex", TensorType((2, seq), DType.f32))
    ey = Value("ey", TensorType((2, seq), DType.f32))
    else_g = Graph("else", [ex], [], [Node("neg", [ex], {}, [ey])], [ey])
    c = Value("c", TensorType((2, seq), DType.f32))
    clamp = Value("cl", TensorType((2, seq), DType.f32))
    nodes = [
        Node("cond", [p, x], {}, [c], SourceLoc("a b\".py", 3, "m.0"), [then_g, else_g]),
        Node("clamp", [c], {"min": float("-inf"), "max": 1e-30}, [clamp], None),
        Node("concat", [clamp, c], {"axis": 1}, [Value("r", TensorType((2, 2 * seq), DType.f32))],
             SourceLoc(None, None, "only.module")),
    ]
    g = Graph("g", [x, p], [mask, big], nodes, [nodes[-1].outputs[0], c], {"seq": (2, None)})
    ir.verify(g)
    text = str(g)
    back = ir.parse(text)
    assert ir.graph_diff(g, back) is None and back == g and str(back) == text
    assert back.constants[0].payload is not None  # small constants are written out
    assert back.constants[1].payload is None  # big ones are bound by name
    # types with layouts print and parse too
    t = ir.parse("graph @l(%a: f32[2, 3]{1,0 tile 8x16}) {\n  return %a\n}\n").inputs[0].type
    assert t == TensorType((2, 3), DType.f32, Layout((1, 0), (8, 16)))


def test_attribute_kinds_survive_the_round_trip():
    x = Value("x", f32(4))
    y = Value("y", TensorType((4,), DType.i32))
    n = Node("cast", [x], {"dtype": DType.i32}, [y])
    g = Graph("k", [x], [], [n], [y])
    back = ir.parse(str(g))
    assert back.nodes[0].attrs["dtype"] is DType.i32
    # 1.0 and 1 are different attribute values, and stay so
    a, b = Attrs({"v": 1.0}), Attrs({"v": 1})
    assert a != b


@pytest.mark.parametrize("text, line, col, msg", [
    ("graph @g(%x: f32[2]) {\n  %y: f32[2] = relu(%z)\n  return %y\n}\n", 2, 21, "not defined"),
    ("graph @g(%x: f99[2]) {\n  return %x\n}\n", 1, 17, "unknown dtype"),
    ("graph @g(%x: f32[2]) {\n  %y: f32[2] = frobnicate(%x)\n  return %y\n}\n", 2, 16,
     "unknown op"),
    ("graph @g(%x: f32[n]) {\n  return %x\n}\n", 1, 18, "undeclared symbol"),
])
def test_parse_errors_name_line_and_column(text, line, col, msg):
    with pytest.raises(ParseError) as info:
        ir.parse(text)
    e = info.value
    assert (e.line, e.column) == (line, col)
    assert msg in str(e)
    assert "^" in str(e)  # the caret under the spot
