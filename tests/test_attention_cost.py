"""What the generated attention kernel spends on the vector unit, and that spending less keeps
its numbers: the passes per block of scores, a constant causal mask run as the causal block
structure (blocks above the diagonal cost nothing), the scale folded into q, on odd sizes."""

from __future__ import annotations

import numpy as np
import pytest

from fexplore.errors import SourceLoc
from fexplore.ir import Attrs, Constant, DType, Graph, Node, TensorType, Value, get_op
from fexplore.ir.interpreter import evaluate_node
from fexplore.lang import codegen
from fexplore.lang.codegen import check_kernel
from fexplore.npu.commands import Contract, Vector

TARGETS = ["rngd", "tiny"]
LOC = SourceLoc("model.py", 3, "attn")


class Region:
    """An attention region built op by op; inputs are random, constants carry their payload."""

    def __init__(self, seed=0):
        self.inputs, self.outer, self.arrays, self.nodes = [], [], [], []
        self.rng = np.random.default_rng(seed)

    def input(self, name, shape):
        v = Value(name, TensorType(tuple(shape), DType.f32))
        self.inputs.append(v)
        self.outer.append(v)
        self.arrays.append(self.rng.standard_normal(shape).astype(np.float32))
        return v

    def constant(self, name, payload):
        payload = np.asarray(payload)
        dt = DType.bool if payload.dtype == np.bool_ else DType.f32
        t = TensorType(payload.shape, dt)
        inner = Value(name, t)
        self.inputs.append(inner)
        self.outer.append(Constant(name, t, payload.astype(dt.numpy)))
        self.arrays.append(payload.astype(dt.numpy))
        return inner

    def __call__(self, op, *ins, **attrs):
        opdef = get_op(op)
        full = Attrs(opdef.complete_attrs(attrs))
        (t,) = opdef.infer_types([v.type for v in ins], full)
        out = Value(f"{op}_{len(self.nodes)}", t)
        self.nodes.append(Node(opdef, list(ins), full, [out], LOC))
        return out

    def region(self, y):
        body = Graph("attention_test", list(self.inputs), [], list(self.nodes), [y], {})
        return Node("region", list(self.outer), {"kind": "attention"}, [y], LOC, [body])


def written_out(S, T, mask_of, heads=3, D=12, scale=0.3):
    """softmax(q kᵀ * scale, masked) v written out, as GPT-2 is: ``mask_of(r, s)`` masks the
    scores ``s`` with a constant (or returns them)."""
    r = Region(S * 1000 + T)
    q, kt, v = r.input("q", (1, heads, S, D)), r.input("kt", (1, heads, D, T)), r.input("v", (1, heads, T, 7))
    s = r("mul", r("matmul", q, kt), r.constant("scale", np.float32(scale)))
    p = r("softmax", mask_of(r, s), axis=-1)
    return r.region(r("matmul", p, v)), r.arrays


def drop_above_diagonal(S, T, shift=0):
    def mask_of(r, s):   # GPT-2: scores.masked_fill(~tril, -inf)
        drop = ~np.tril(np.ones((S, T), bool), shift)[None, None]
        return r("where", r.constant("drop", drop), r.constant("ninf", np.float32(-np.inf)), s)
    return mask_of


def additive_causal(S, T):
    def mask_of(r, s):   # HF: scores + a mask of 0 and the dtype's lowest value
        add = np.where(np.tril(np.ones((S, T), bool)), 0.0, np.finfo(np.float32).min).astype(np.float32)
        return r("add", s, r.constant("mask", add[None, None]))
    return mask_of


def sdpa(S, T, causal=False, mask=None, heads=2, depth=8):
    r = Region(7)
    q, k, v = (r.input(n, (1, heads, S if n == "q" else T, depth)) for n in "qkv")
    ins = [q, k, v] + ([r.constant("mask", mask)] if mask is not None else [])
    return r.region(r("attention", *ins, causal=causal)), r.arrays


def simulated_equals_reference(node, arrays, gk, target, **tiles):
    """The kernel's outputs on the chip simulator (and in the interpreter) equal the region's."""
    assert check_kernel(node, gk, arrays).ok, gk.source
    k = gk.kernel()
    res = k.simulate(*gk.arguments(arrays), target=target, **tiles)
    (got,) = res.outputs.values()
    want = evaluate_node(node, [np.asarray(a) for a in arrays])[0]
    np.testing.assert_allclose(np.asarray(got, np.float32).reshape(want.shape), want, rtol=2e-5, atol=2e-5)
    return res


def block_commands(gk, arrays, target, bq, bk=None):
    """The traced program's vector commands over a whole (bq, bk) block of scores, and its
    score contractions ('sd,td->st')."""
    tiles = {"bq": bq} if bk is None else {"bq": bq, "bk": bk}
    bk = bk or bq   # causal: the key blocks are the query blocks
    program = gk.kernel().trace(*gk.arguments(arrays), target=target, **tiles).program()
    vec = [c for c in program.commands if isinstance(c, Vector) and c.elements == bq * bk]
    scores = [c for c in program.commands if isinstance(c, Contract) and c.out.shape == (bq, bk)]
    return vec, scores


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("depth, shift", [(8, "fma"), (64, "sub")])
def test_a_block_of_scores_costs_four_vector_passes(target, depth, shift):
    # no mask, no scale op: the row max, the shifted scores and their exp (two passes); the row
    # sums run on the tensor unit. The scale 1/sqrt(D) is folded into q when that is exact (a power
    # of two, D = 64), else it goes in the exponent: the shift is then a multiply-add, one pass too
    node, arrays = sdpa(16, 48, depth=depth)
    gk = codegen.generate(node, target)
    vec, scores = block_commands(gk, arrays, target, bq=16, bk=16)
    assert len(scores) == 2 * 3                       # 2 heads x 3 key blocks
    assert sorted(c.op.name for c in vec) == sorted(["max", shift, "exp"] * len(scores))
    assert sum(c.op.passes for c in vec) == 4 * len(scores)
    simulated_equals_reference(node, arrays, gk, target, bq=16, bk=16)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mask", [drop_above_diagonal, additive_causal])
@pytest.mark.parametrize("scale, placed, shift", [(0.25, "the scale folded into q once", "sub"),
                                                  (0.3, "fl.exp(fl.fma(s, 0.3", "fma")])
def test_a_constant_causal_mask_skips_the_blocks_above_the_diagonal(target, mask, scale, placed, shift):
    S = T = 45                                        # odd: the last block is short
    node, arrays = written_out(S, T, mask(S, T), scale=scale)
    gk = codegen.generate(node, target)
    assert "causal" in gk.parts and "score ops" not in gk.parts
    assert len(gk.params) == 4                        # q, kᵀ, v and the mask, read for its diagonal only
    assert placed in gk.source                        # exact on q, else in the exponent
    vec, scores = block_commands(gk, arrays, target, bq=16)
    assert len(scores) == 3 * (1 + 2)                 # per head: the full blocks on or below the diagonal
    wheres = [c for c in vec if c.op.name == "where"]
    assert len(wheres) == 3 * 2                       # the mask on the two full diagonal blocks only
    per_block = [c for c in vec if c.op.name in ("max", shift, "exp")]
    assert len(per_block) == 3 * len(scores)
    # besides: a diagonal block's mask, made at most once per PE (from the additive constant)
    rest = [c for c in vec if c not in per_block and c not in wheres]
    assert len(rest) <= len(wheres) and {c.op.name for c in rest} <= {"eq"}
    simulated_equals_reference(node, arrays, gk, target, bq=16)
    simulated_equals_reference(node, arrays, gk, target, bq=32)


@pytest.mark.parametrize("target", TARGETS)
def test_a_constant_mask_that_is_not_the_triangle_stays_a_mask(target):
    S = T = 37
    node, arrays = written_out(S, T, drop_above_diagonal(S, T, shift=1))   # one key past the diagonal
    gk = codegen.generate(node, target)
    assert "causal" not in gk.parts and "score ops" in gk.parts
    simulated_equals_reference(node, arrays, gk, target)
    node, arrays = written_out(21, 33, drop_above_diagonal(21, 33))       # S != T: aligned top left
    gk = codegen.generate(node, target)
    assert "causal" in gk.parts
    simulated_equals_reference(node, arrays, gk, target, bq=8)


@pytest.mark.parametrize("target", TARGETS)
def test_an_sdpa_constant_causal_mask_is_the_causal_flag(target):
    S = 29
    keep = np.tril(np.ones((S, S), bool))
    node, arrays = sdpa(S, S, mask=keep[None, None])
    gk = codegen.generate(node, target)
    assert "causal" in gk.parts
    simulated_equals_reference(node, arrays, gk, target, bq=8)
    flag, flag_arrays = sdpa(S, S, causal=True)
    assert codegen.generate(flag, target).parts == gk.parts
    simulated_equals_reference(flag, flag_arrays, codegen.generate(flag, target), target, bq=8)


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16", np.float32])
def test_a_causal_mask_in_a_narrow_dtype_is_the_causal_structure(dtype):
    """A model in f16 masks with -65504, its dtype's lowest value: exp of it underflows as -1e30's
    does, so the mask is the causal triangle all the same (it was compared with -1e30 in f16,
    which is -inf); a bf16 mask (numpy kind 'V') was not taken as a float mask at all."""
    import ml_dtypes

    from fexplore.lang.codegen import scores

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    low = float(ml_dtypes.finfo(dt).min)
    add = np.where(np.tril(np.ones((6, 6), bool)), 0.0, low).astype(dt)[None, None]
    assert scores.is_causal_additive(add, 6, 6)
    assert scores._masks(np.asarray(low, dtype=dt))
    assert not scores.is_causal_additive(np.where(np.tril(np.ones((6, 6), bool)), 0.0, -1e3).astype(dt), 6, 6)
