"""IR text is read safely: nothing in it is evaluated, hostile or oversized input gets a ParseError
with a line and column (never a hang, a RecursionError or a raw exception), and what fexplore
writes reads back equal, for every stage of every zoo model, with or without weights."""

import builtins
import random

import pytest
import torch

import fexplore
from fexplore import ir
from fexplore.errors import ParseError
from fexplore.ir import parser
from fexplore.models import DYNAMIC_SEQ, ZOO

SMALL = """\
graph @f(%x: f32[2, seq]) {
  symbol seq in [2, 64]
  source f0 = "model.py"
  const %w: f32[2, 2] = dense [1.0, -2.5, 0.0, 3.0]
  const %big: f32[64, 64] = param "fc.weight" #0123456789abcdef
  %y: f32[2, seq] = relu(%x) loc(f0:3 "blk")
  %z: f32[2, 2*seq] = concat(%y, %y) {axis=1} loc(f0:4 "blk.cat")
  return %z
}
"""


def parse_error(text: str, **kw) -> ParseError:
    with pytest.raises(ParseError) as e:
        ir.parse(text, **kw)
    err = e.value
    assert err.line >= 1 and err.column >= 1 and f"(line {err.line}, column {err.column})" in str(err)
    return err


def test_the_sample_is_valid_and_round_trips():
    g = ir.parse(SMALL)
    assert ir.parse(str(g)) == g


def test_parse_never_evaluates_code(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("parse called eval/exec")

    text = SMALL.replace("2*seq", "Max(1, floor(seq/2) + 3*seq - Mod(seq, 4))")
    ir.parse(text)   # once before: sympy imports some modules lazily, and an import runs exec
    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    g = ir.parse(text)   # symbolic dims read without sympy's eval-based sympify
    assert str(g.nodes[1].outputs[0].type) == "f32[2, Max(1,3*seq-Mod(seq,4)+floor(seq/2))]"
    for payload in ("__import__('os').system('true')", "seq.__class__", "lambda: 1", "seq[0]",
                    "exec('1')", "(seq)()", "seq if seq else 1", "'seq'"):
        err = parse_error(SMALL.replace("2*seq", payload))
        assert err.line == 7, (payload, str(err))


def test_oversized_text_is_refused_before_reading():
    err = parse_error(SMALL, max_chars=100)
    assert "more than the limit of 100" in err.message and err.hint
    big = SMALL + " " * parser.MAX_CHARS
    err = parse_error(big)
    assert (err.line, err.column) == (1, 1)


@pytest.mark.parametrize("make, messages", [
    # regions inside regions
    (lambda n: "graph @f(%x: f32[2]) {\n" + "".join(
        f"{'  ' * (i + 1)}%y{i}: f32[2] = region(%x) {{\n{'  ' * (i + 2)}graph @r{i}(%x: f32[2]) {{\n"
        for i in range(n)) + "return %x\n" + "}}\n" * n + "return %x\n}\n", ["regions nested"]),
    # attribute lists inside lists
    (lambda n: SMALL.replace("{axis=1}", "{axis=" + "[" * n + "1" + "]" * n + "}"),
     ["attribute lists nested"]),
    # parentheses inside a dim
    # a dim: too deep, or (deeper still) too long to be one
    (lambda n: SMALL.replace("2*seq", "(" * n + "seq" + ")" * n), ["nested more than", "at most"]),
    (lambda n: SMALL.replace("2*seq", "-" * n + "seq"), ["nested more than", "at most"]),
])
@pytest.mark.parametrize("depth", [100, 3000])
def test_deep_nesting_is_a_parse_error_not_a_recursion_error(make, messages, depth):
    err = parse_error(make(depth))
    assert any(m in err.message for m in messages), err.message


@pytest.mark.parametrize("old, new, message", [
    ("f32[2, seq])", "f32[2" + "9" * 100000 + ", seq])", "is not a size"),
    ("f32[2, seq])", "f32[281474976710656, 281474976710656, seq])", "beyond any memory"),
    ("f32[2, seq])", "f32[" + "140737488355328, " * 31 + "seq])", "beyond any memory"),
    ("f32[2, seq])", "f32[" + "1, " * 40 + "seq])", "more than 32 dims"),
    ("2*seq", "seq**100000", "exponent"),
    ("2*seq", "9" * 500 + "*seq", "beyond any dim"),
    ("[2, 64]", "[2, " + "9" * 100000 + "]", "outside"),
    ("f0:3", "f0:" + "9" * 100000, "outside"),
    ("{axis=1}", "{axis=" + "9" * 100000 + "}", "not a size"),
    ("dense [1.0, -2.5, 0.0, 3.0]", "dense [1.0, -2.5, 0.0]", "3 value(s) for f32[2, 2]"),
    ("dense [1.0, -2.5, 0.0, 3.0]", "dense [1.0, -2.5, 0.0, 3.0, 4.0]", "more than the 4"),
    ("f32[2, 2] = dense [1.0, -2.5, 0.0, 3.0]", "i32[2] = dense [1, 2.5]", "not a i32 value"),
    ("f32[2, 2] = dense [1.0, -2.5, 0.0, 3.0]", "i8[2] = dense [1, 300]", "outside the range of i8"),
    ("f32[2, 2] = dense [1.0, -2.5, 0.0, 3.0]", "i64[1] = dense " + "7" * 100000, "not a i64 value"),
    ("f32[2, 2] = dense [1.0, -2.5, 0.0, 3.0]", "f32[seq] = dense [1.0]", "static shape"),
    ("f32[2, 2] = dense [1.0, -2.5, 0.0, 3.0]", "f32[2] = dense 1.0", "one value for f32[2]"),
    ("#0123456789abcdef", "#", "expected a digest"),
    ("#0123456789abcdef", '#""', "digest is empty"),
    ("f32[2, seq])", "f32[2, seq]{1,1})", "not an order"),
    ("relu(%x)", "relu(%x)\x00", "control character"),
    ("relu(%x)", "relu(%x)\x1b[31m", "control character"),
    ("relu(%x)", "relu(%x)\x7f", "control character"),
])
def test_hostile_values_are_parse_errors(old, new, message):
    assert old in SMALL
    err = parse_error(SMALL.replace(old, new, 1))
    assert message in err.message, err.message
    assert len(str(err)) < 2000   # a million-digit number is not echoed back whole
    assert not any(c in str(err) for c in "\x00\x1b\x7f")   # nor a terminal escape


def test_not_text_is_a_parse_error():
    for bad in (SMALL.encode(), None, 42):
        assert "must be a str" in parse_error(bad).message


# ---- fuzz: mutated IR text and garbage only ever parse or raise ParseError ------------------------

TOKENS = ["%", "@", "#", "{", "}", "(", ")", "[", "]", ",", ":", "=", "\n", " ", '"', "\\", "-",
          "graph", "region", "const", "dense", "param", "data", "symbol", "source", "loc(", "return",
          "f32", "i64", "bool", "inf", "nan", "1e999", "-0", "99999999999999999999999", "seq",
          "**", "/", "*", "floor(", "Max(", "#meta-2x2", "true", "none", "\x00", "é", "\u2028"]


def mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 4)):
        i, j = sorted(rng.randrange(len(text) + 1) for _ in range(2))
        kind = rng.randrange(5)
        if kind == 0:
            text = text[:i] + text[j:]                                  # delete a span
        elif kind == 1:
            text = text[:i] + rng.choice(TOKENS) + text[i:]             # insert a token
        elif kind == 2:
            text = text[:i] + text[i:j] * rng.randint(2, 5) + text[j:]   # repeat a span
        elif kind == 3 and j > i:
            text = text[:i] + text[j - 1] + text[i + 1:j - 1] + text[i] + text[j:]   # swap ends
        else:
            text = text[:i] + chr(rng.randrange(32, 0x250)) + text[i + 1:]   # replace a char
    return text


@pytest.fixture(scope="module")
def corpus():
    """IR text fexplore itself writes: every stage of a small model, and the hand-written sample."""
    model, inputs = ZOO["mlp"]()
    cm = fexplore.compile(model, inputs)
    return [SMALL] + [str(r.after) for r in cm.stages]


def test_fuzzed_ir_text_only_ever_parses_or_raises_parse_error(corpus):
    rng = random.Random(13)
    parsed = refused = 0
    for case in range(1500):
        text = mutate(rng.choice(corpus), rng) if case % 10 else \
            "".join(rng.choice(TOKENS) for _ in range(rng.randint(1, 200)))
        try:
            g = ir.parse(text)
        except ParseError as e:
            assert e.line >= 1 and e.column >= 1
            refused += 1
            continue
        except Exception as e:   # anything else is a bug: show the input that made it
            raise AssertionError(f"{type(e).__name__}: {e}\n--- input ---\n{text!r}") from e
        parsed += 1
        # whatever is accepted prints to text that reads back the same
        assert ir.parse(str(g)) == g, text
    assert parsed > 20 and refused > 500, (parsed, refused)


# ---- what fexplore writes reads back equal ----------------------------------------------------------

def _stage_graphs(model, inputs, **options):
    ex = fexplore.explore(model, inputs, **options)
    ex.run_all(progress=False)
    return [(r.name, r.after) for r in ex.records]


def _assert_round_trips(stages):
    for name, g in stages:
        text = str(g)
        back = ir.parse(text, payloads=g.payloads)
        assert back == g, name
        assert str(back) == text, name


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_stage_of_every_zoo_model_on_the_meta_device_round_trips(name):
    """A meta-device weight has no payload to hash: its digest is its shape (``meta-768x768``),
    a folded one's its name (``meta-folded-...``), a cast one's gets the dtype (``.bf16``)."""
    model, inputs = ZOO[name]()
    model = model.to("meta")
    inputs = tuple(x.to("meta") for x in inputs)
    stages = _stage_graphs(model, inputs, precision="bf16")
    digests = {c.digest for _, g in stages for c in g.constants}
    assert any(d.startswith("meta-") for d in digests)
    assert any(d.endswith(".bf16") for d in digests)
    _assert_round_trips(stages)


def test_a_digest_of_any_characters_round_trips():
    g = ir.parse(SMALL)
    odd = ir.Constant("odd", g.constants[1].type, None, digest='meta-folded-"block 1"#x')
    g2 = ir.Graph(g.name, g.inputs, [*g.constants, odd], g.nodes, g.outputs, g.symbols)
    text = str(g2)
    assert '#"meta-folded-\\"block 1\\"#x"' in text
    assert ir.parse(text) == g2


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_every_stage_of_a_dynamic_shape_model_round_trips(name):
    model, inputs = ZOO[name]()
    stages = _stage_graphs(model, inputs, dynamic_shapes=DYNAMIC_SEQ[name](model))
    assert any(g.symbols for _, g in stages)
    _assert_round_trips(stages)
