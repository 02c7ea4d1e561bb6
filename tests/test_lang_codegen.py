"""Kernel-language source generated from IR nodes (`fexplore.lang.codegen`): every kernel, run by
the kernel-language interpreter, equals its node run by the IR interpreter.

Two sources of nodes: the fused regions of the zoo models after the fusion stage (every region the
generator claims, on both targets; the rest must be refused with an error naming the op), and
hand-built regions with unusual epilogues and sizes that do not divide the tiles (odd sizes,
batch 1, a single head, broadcast operands of every shape)."""

from __future__ import annotations

import collections
import copy
import re

import ml_dtypes
import numpy as np
import pytest
import torch

import fexplore
from fexplore import lang
from fexplore.errors import SourceLoc
from fexplore.ir import Attrs, Constant, DType, Graph, Node, TensorType, Value, get_op, run
from fexplore.lang import codegen
from fexplore.lang.codegen import UnsupportedRegionError, check_kernel
from fexplore.lang.codegen import vector as vector_mod
from fexplore.lang.examples._tiling import amortizing_bytes, panel_tiles, streamed_rows
from fexplore.npu import get_target
from fexplore.pipeline.numeric import to_numpy
from fexplore.npu.commands import Load, Vector
from fexplore.models import ZOO

TARGETS = ["rngd", "tiny"]


# ---- the zoo's fused regions ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def zoo_regions():
    """{model: [(region node, its input arrays)]}, from the fusion stage's graph run on the
    model's example inputs."""
    out = {}
    for name, factory in ZOO.items():
        model, inputs = factory()
        cm = fexplore.compile(model, inputs, verify=False)
        out[name] = _regions_with_inputs(cm["fusion"].after, inputs)
    return out


def _regions_with_inputs(g, inputs) -> list:
    """[(region node, its input arrays)] of graph `g` run by the IR interpreter on the torch
    `inputs`."""
    values = {c.name: c.payload for c in g.constants}
    arrays = [to_numpy(t) for t in inputs]
    values.update({v.name: a for v, a in zip(g.inputs, arrays)})
    run(g, arrays, hook=lambda node, outs: values.update({v.name: a for v, a in zip(node.outputs, outs)}))
    return [(n, [values[v.name] for v in n.inputs]) for n in g.nodes if n.op.name == "region"]


# What the generator does not write yet, by the op it names (the lower stage will run these on
# the host until their parts land): nothing in the zoo today.
NOT_YET: set[str] = set()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("model", sorted(ZOO))
def test_zoo_regions_equal_the_ir_interpreter(zoo_regions, model, target):
    covered = 0
    for node, inputs in zoo_regions[model]:
        try:
            gk = codegen.generate(node, target)
        except UnsupportedRegionError as e:
            assert e.op in NOT_YET, str(e)
            assert e.op in str(e) and node.regions[0].name in str(e)
            continue
        check = check_kernel(node, gk, inputs)
        assert check.ok, f"{model}: {node.regions[0].name}\n{check}\n{gk.source}"
        assert check.outputs == len(node.outputs)
        covered += 1
    assert covered >= 1


def test_zoo_coverage(zoo_regions, capsys):
    """The fraction of the zoo's regions the generator covers, by kind: all of them."""
    total, covered = collections.Counter(), collections.Counter()
    refused = collections.Counter()
    for model, regions in zoo_regions.items():
        for node, _ in regions:
            kind = node.attrs["kind"]
            total[kind] += 1
            try:
                codegen.generate(node, "rngd")
                covered[kind] += 1
            except UnsupportedRegionError as e:
                refused[e.op] += 1
    with capsys.disabled():
        print("\nzoo regions covered by kernel generation: "
              f"{sum(covered.values())}/{sum(total.values())}; by kind: " +
              ", ".join(f"{k} {covered[k]}/{total[k]}" for k in sorted(total)) +
              f"; refused by op: {dict(refused)}")
    # the zoo's norms are all prologues of the projections after them (a norm region of its own
    # is built by hand below: `row_ops`, `reductions`, `residual_rms_norm`)
    assert covered["norm"] == total["norm"]
    assert covered["elementwise"] == total["elementwise"] > 0
    assert covered["contraction"] == total["contraction"] > 0   # linear, matmul and conv2d regions
    assert covered["attention"] == total["attention"] >= 10 and not refused
    assert sum(covered.values()) == sum(total.values()) >= 64


@pytest.mark.parametrize("precision, target", [("bf16", "tiny"), ("fp8", "rngd")])
def test_regions_after_the_precision_stage_equal_the_ir_interpreter(precision, target):
    """After `precision` (the stage lower will follow), operands are cast to bf16 / fp8 inside the
    regions: the kernels cast their tiles after the load, and still equal the IR interpreter
    (within the tolerance of the dtype the region computes in)."""
    checked = collections.Counter()
    for name in ("cnn", "gpt", "llama_decode", "post_norm"):
        model, inputs = ZOO[name]() if name in ZOO else _post_norm_block()
        g = fexplore.compile(model, inputs, verify=False, precision=precision)["precision"].after
        for node, arrays in _regions_with_inputs(g, inputs):
            gk = codegen.generate(node, target)
            check = check_kernel(node, gk, arrays)
            assert check.ok, f"{name} {precision}: {node.regions[0].name}\n{check}\n{gk.source}"
            checked[node.attrs["kind"]] += 1
    assert set(checked) == {"contraction", "attention", "norm", "elementwise"}


def _post_norm_block():
    """BERT's order: the norm of a residual sum read by two projections, a norm region of its own
    (the zoo's norms are all prologues)."""
    class PostNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln, self.a, self.b = torch.nn.LayerNorm(32), torch.nn.Linear(32, 16), torch.nn.Linear(32, 8)

        def forward(self, x, y):
            h = self.ln(x + y)
            return self.a(h), torch.relu(self.b(h))

    torch.manual_seed(0)
    return PostNorm().eval(), (torch.randn(2, 6, 32), torch.randn(2, 6, 32))


@pytest.mark.parametrize("fold", [True, False])
def test_a_norm_prologue_writes_the_tensor_units_operand_dtype_itself(fold, without_simplify_rule):
    # bf16: the layer norm's last line writes bf16 (the vector unit casts on write), with no cast
    # pass of its own after it; its weight and bias are one multiply-add, not a multiply then an
    # add; a norm whose weight and bias folded into the linear after it (simplify) is one multiply
    # of the centred rows by their 1/std (GPT's ln_1 and ln_2; ln_f keeps its own, the lm_head's
    # weight being tied to the embedding); the kernels equal the IR interpreter (test above)
    if not fold:
        without_simplify_rule("fold-norm-affine-into-linear")
    model, inputs = ZOO["gpt"]()
    g = fexplore.compile(model, inputs, verify=False, precision="bf16")["precision"].after
    forms = {"folded": r"\w+ = fl\.mul\(\w+_centered, \w+_rstd,",
             "affine": r"\w+ = fl\.fma\(\w+_centered \* \w+_rstd, \w+, \w+,"}
    seen = collections.Counter()
    for node in (n for n in g.nodes if n.op.name == "region" and n.attrs["kind"] == "contraction"):
        for target in ("rngd", "tiny"):
            gk = codegen.generate(node, target)
            if "norm" not in gk.parts:
                continue
            lines = [ln.strip() for ln in gk.source.splitlines()]
            last = [(form, ln) for ln in lines for form, pat in forms.items() if re.match(pat, ln)]
            assert len(last) == 1 and last[0][1].endswith("dtype=fl.bf16)"), gk.source
            name = last[0][1].split(" = ")[0]
            assert f"{name}.astype(" not in gk.source, gk.source
            seen[last[0][0]] += 1
    assert seen == ({"folded": 8, "affine": 2} if fold else {"affine": 10}), seen


@pytest.mark.parametrize("name, loaded_in_bf16", [("gpt", False), ("gpt", True), ("cnn", True)])
def test_a_bias_and_the_cast_to_the_output_dtype_are_one_vector_pass(name, loaded_in_bf16):
    # bf16: a linear's or a convolution's bias is added to the f32 accumulator and the sum rounded
    # to bf16 by one vector op (the unit rounds on write), not an add and then a cast pass, whether
    # the contraction writes bf16 itself (a model loaded in bf16) or the precision stage's cast
    # after it does (the f32 model under the bf16 policy; the f32 CNN's convolutions feed a relu in
    # f32, so it has none); a sum read by anything else stays f32. The kernels equal the IR
    # interpreter: the same rounding as a cast after the add.
    model, inputs = ZOO[name]()
    if loaded_in_bf16:
        model = copy.deepcopy(model).to(torch.bfloat16)
        inputs = tuple(t.to(torch.bfloat16) if t.is_floating_point() else t for t in inputs)
    g = fexplore.compile(model, inputs, verify=False, precision="bf16")["precision"].after
    one_pass = 0
    for node, arrays in _regions_with_inputs(g, inputs):
        if node.attrs["kind"] != "contraction":
            continue
        gk = codegen.generate(node, "rngd")
        src = gk.source
        written = re.findall(r"^\s*(\w+) = fl\.add\(acc\w*, \w+(?:\[[^\]]*\])?, dtype=fl\.bf16\)$", src, re.M)
        for value in written + re.findall(r"^\s*(\w+) = acc\w* \+ ", src, re.M):   # neither cast again
            assert f"{value}.astype(" not in src and f"fl.cast({value}," not in src, src
        one_pass += len(written)
        check = check_kernel(node, gk, arrays)
        assert check.ok, f"{node.regions[0].name}\n{check}\n{src}"
    assert one_pass >= 2


def test_generated_source_is_readable_and_points_at_the_model(zoo_regions):
    node = next(n for n, _ in zoo_regions["gpt"] if n.loc.module == "h.0.mlp.c_fc")
    gk = codegen.generate(node, "rngd")
    assert gk.kind == "contraction" and gk.parts == ("norm", "contraction", "epilogue")
    src = gk.source
    assert "# from h.0.mlp.c_fc (gpt.py:" in src and "/" not in src.splitlines()[1]
    assert '@fl.kernel(target="rngd")' in src and f"def {gk.name}(" in src
    assert 'fl.contract("mk,nk->mn"' in src and "fl.gelu_tanh(" in src and ".mean(axis=" in src
    k = gk.kernel()
    assert isinstance(k, lang.Kernel) and k.name == gk.name == "h_0_mlp_c_fc"


def test_generated_source_runs_as_a_furiosa_kernel_cell(zoo_regions):
    from IPython.core.interactiveshell import InteractiveShell

    node, inputs = residual_rms_norm()
    gk = codegen.generate(node, "tiny")
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "fexplore")
    for i, arr in enumerate(gk.arguments(inputs)):
        shell.user_ns[f"arg{i}"] = arr
    names = ",".join(f"arg{i}" for i in range(len(gk.params)))
    res = shell.run_cell(f"%%furiosa_kernel --inputs {names}\n{gk.source}")
    assert res.success, res.error_in_exec
    k = shell.user_ns[gk.name]
    assert isinstance(k, lang.Kernel)
    want = fexplore.ir.evaluate_node(node, inputs)[0]
    np.testing.assert_allclose(k(*gk.arguments(inputs)).reshape(want.shape), want, rtol=1e-5, atol=1e-5)


def test_a_generated_kernel_simulates_to_what_it_interprets(zoo_regions):
    node, inputs = next((n, x) for n, x in zoo_regions["llama"] if n.loc.module == "layers.0.mlp.gate_proj")
    gk = codegen.generate(node, "tiny")
    k = gk.kernel()
    args = gk.arguments(inputs)
    interpreted = k(*args)
    simulated = k.last_trace.unpack(k.simulate(*args).outputs)
    np.testing.assert_array_equal(simulated, interpreted)


def test_a_generated_convolution_simulates_to_what_it_interprets():
    node, arrays = conv_strided_padded_dilated()
    gk = codegen.generate(node, "tiny")
    assert gk.kind == "convolution"
    k = gk.kernel()
    args = gk.arguments(arrays)
    interpreted = k(*args)
    simulated = k.last_trace.unpack(k.simulate(*args).outputs)
    np.testing.assert_array_equal(simulated, interpreted)
    assert np.isfinite(interpreted).all()


def test_attention_reads_its_operands_where_they_are_and_streams_the_keys():
    node, arrays = sdpa_gqa_float_mask_odd_sizes()
    gk = codegen.generate(node, "tiny")
    assert gk.kind == "attention" and [p.name for p in gk.params] == ["qkv", "kv", "bias"]
    src = gk.source
    assert "for ts in fl.range(fl.tiles(T, bk)" in src
    assert "for h in range(2 * g, 2 * g + 2)" in src   # two q heads per k head: one grid item per k head
    k = gk.kernel()
    args = gk.arguments(arrays)
    defaults = k.__wrapped__.__kwdefaults__
    assert defaults["bk"] < 141     # the keys come in several blocks on tiny
    interpreted = k(*args)
    result = k.simulate(*args)
    simulated = k.last_trace.unpack(result.outputs)
    np.testing.assert_array_equal(simulated, interpreted)
    # each key and value is loaded once per query block of its group, not once per query head
    kv_loaded = sum(c.ref.size for c in result.program.commands
                    if isinstance(c, Load) and c.ref.tensor.name == "kv")
    assert kv_loaded == arrays[1].size * -(-13 // defaults["bq"]), (kv_loaded, defaults)


@pytest.mark.parametrize("scale, mask, placed", [
    (None, None, "fl.exp(fl.fma(s, 0.35355"),            # 1/sqrt(8): in the exponent, with the shift
    (0.25, None, "the scale folded into q once"),         # a power of two: exact on q
    (None, "additive", "the scale and the mask in one pass"),
])
def test_a_scale_that_would_round_q_goes_on_the_f32_scores(scale, mask, placed):
    """f16 attention with scores up to ~100 (OpInfo's sdpa sample in f16): q * 1/sqrt(8) rounded
    to f16 moved the scores by up to ~0.05 and the output past f16's tolerance. A scale that is
    not a power of two is applied to the f32 scores instead, at no extra pass."""
    b = Body(21)
    rng = np.random.default_rng(21)
    q, k, v = (b.input(n, (2, 3, 16, 8), DType.f16, data=rng.uniform(-9, 9, (2, 3, 16, 8))) for n in "qkv")
    ins = [q, k, v] + ([b.input("bias", (1, 1, 16, 16))] if mask else [])
    node = b.region(b("attention", *ins, causal=mask is None, scale=scale), kind="attention")
    gk = _check(node, b.arrays, "tiny")
    assert placed in gk.source


def test_rotary_embedding_is_computed_per_half_of_d_and_causal_blocks_are_skipped(zoo_regions):
    node, inputs = next((n, x) for n, x in zoo_regions["llama"] if n.attrs["kind"] == "attention")
    gk = codegen.generate(node, "tiny")
    assert gk.parts == ("view", "rotary", "attention", "causal")
    assert "# D[0:8]" in gk.source and "# D[8:16]" in gk.source and "if ts.start < qs.stop" in gk.source
    assert "concat" not in gk.source.split("def ", 1)[1]      # no copy is made of the rotated halves
    assert check_kernel(node, gk, inputs).ok


def test_a_decode_step_reads_the_cache_and_this_steps_key_as_parts_and_exports_both(zoo_regions):
    node, inputs = next((n, x) for n, x in zoo_regions["llama_decode"] if n.attrs["kind"] == "attention")
    assert len(node.outputs) == 3                             # the new keys, the new values, the attention
    gk = codegen.generate(node, "rngd")
    assert "kv cache" in gk.parts and "bands(T, (8,), bk)" in gk.source
    check = check_kernel(node, gk, inputs)
    assert check.ok and check.outputs == 3


def test_check_kernel_catches_a_wrong_kernel(zoo_regions):
    node, inputs = next((n, x) for n, x in zoo_regions["vit"] if n.loc.module == "blocks.0.mlp.2")
    gk = codegen.generate(node, "rngd")
    assert check_kernel(node, gk, inputs).ok
    wrong = gk.source.replace("acc + ", "acc - ", 1)
    assert wrong != gk.source
    bad = type(gk)(gk.name, gk.kind, wrong, gk.target, gk.params, gk.results, gk.parts)
    check = check_kernel(node, bad, inputs)
    assert not check.ok and check.limit_exceeded_by > 1


def test_every_elementwise_opdef_has_a_vector_unit_counterpart():
    assert codegen.check_table() == []
    for name in ("sin", "cos", "erf", "log1p", "remainder", "logical_not", "round"):
        assert callable(getattr(lang, name))
    assert "round" not in lang.__all__          # `from fexplore.lang import *` keeps Python's round


# ---- hand-built regions --------------------------------------------------------------------------
class Body:
    """Build a region node op by op: ``b.input(...)``, ``b("add", x, y)``, ``b.region(...)``."""

    def __init__(self, seed=0):
        self.inputs, self.outer, self.arrays, self.nodes = [], [], [], []
        self.rng = np.random.default_rng(seed)
        self.count = collections.Counter()

    def input(self, name, shape, dtype=DType.f32, data=None, positive=False):
        t = TensorType(tuple(shape), dtype)
        v = Value(name, t)
        if data is None:
            data = self.rng.standard_normal(shape)
            data = np.abs(data) + 0.5 if positive else data
        arr = np.asarray(data).astype(dtype.numpy)
        self.inputs.append(v)
        self.outer.append(v)
        self.arrays.append(arr)
        return v

    def const(self, name, value, dtype=DType.f32):
        """A scalar constant of the outer graph, passed into the region (it is written in)."""
        arr = np.asarray(value, dtype=dtype.numpy)
        inner = Value(name, TensorType((), dtype))
        self.inputs.append(inner)
        self.outer.append(Constant(name, TensorType((), dtype), arr))
        self.arrays.append(arr)
        return inner

    def __call__(self, op, *ins, **attrs):
        opdef = get_op(op)
        full = Attrs(opdef.complete_attrs(attrs))
        (t,) = opdef.infer_types([v.type for v in ins], full)
        self.count[op] += 1
        out = Value(f"{op}_{self.count[op]}", t)
        self.nodes.append(Node(opdef, list(ins), full, [out], SourceLoc("/some/dir/model.py", 7, "blk.fc")))
        return out

    def region(self, *outputs, kind="fused"):
        body = Graph(f"{kind}_test", list(self.inputs), [], list(self.nodes), list(outputs), {})
        return Node("region", list(self.outer), {"kind": kind}, list(outputs),
                    SourceLoc("/some/dir/model.py", 7, "blk.fc"), [body])


def _check(node, arrays, target):
    gk = codegen.generate(node, target)
    check = check_kernel(node, gk, arrays)
    assert check.ok, f"{check}\n{gk.source}"
    return gk


def linear_with_unusual_epilogue():
    b = Body(1)
    x = b.input("x", (2, 37, 45))
    w = b.input("fc.weight", (29, 45))
    bias = b.input("fc.bias", (29,))
    res = b.input("res", (2, 37, 29))
    col = b.input("col", (2, 37, 1))           # one value per row
    half = b.const("half", 0.5)
    y = b("linear", x, w, bias)
    y = b("mul", y, half)
    y = b("tanh", y)
    y = b("sub", b("add", y, res), col)
    y = b("clamp", y, min=-0.75, max=2.0)
    y = b("div", y, b("add", b("abs", col), half))
    y = b("where", b("gt", y, res), y, b("neg", y))
    return b.region(b("cast", y, dtype=DType.bf16), kind="contraction"), b.arrays


def batched_matmul_batch1_single_head():
    b = Body(2)
    q = b.input("q", (1, 1, 13, 24))
    k = b.input("k", (1, 1, 24, 19))
    s = b("matmul", q, k)
    return b.region(b("silu", b("mul", s, b.const("scale", 0.2))), kind="contraction"), b.arrays


def batched_matmul_of_transposed_activations():
    """k^T v per head (MiniMax's lightning attention): the activations a transpose of a region
    input, read in its own layout ("km"), against batched right operands."""
    b = Body(23)
    k = b.input("k", (1, 3, 11, 17))
    v = b.input("v", (1, 3, 11, 9))
    kv = b("matmul", b("permute", k, perm=(0, 1, 3, 2)), v)
    return b.region(b("mul", kv, b.const("decay", 0.5)), kind="contraction"), b.arrays


def batched_matmul_with_partial_broadcast():
    b = Body(3)
    a = b.input("a", (3, 5, 13, 33))
    m = b.input("m", (3, 5, 33, 10))
    per_batch = b.input("per_batch", (3, 1, 1, 10))
    y = b("matmul", a, m)
    return b.region(b("gelu", b("add", y, per_batch), approximate="tanh"), kind="contraction"), b.arrays


def matmul_3d_by_2d_and_swiglu():
    b = Body(4)
    x = b.input("x", (1, 7, 33))
    wg = b.input("gate.weight", (41, 33))
    wu = b.input("up.weight", (41, 33))
    g = b("linear", x, wg)
    u = b("linear", x, wu)
    return b.region(b("mul", b("silu", g), u), kind="contraction"), b.arrays


def norm_prologue_with_selected_row():
    b = Body(5)
    x = b.input("x", (3, 11, 40))
    gamma = b.input("norm.weight", (40,))
    w = b.input("head.weight", (9, 40))
    h = b("rms_norm", x, gamma, eps=1e-6)
    h = b("select", h, axis=1, index=4)
    return b.region(b("linear", h, w), kind="contraction"), b.arrays


def residual_rms_norm():
    b = Body(8)
    x = b.input("x", (2, 9, 48))
    resid = b.input("resid", (2, 9, 48))
    gamma = b.input("norm.weight", (48,))
    return b.region(b("rms_norm", b("add", x, resid), gamma, eps=1e-6), kind="norm"), b.arrays


def row_ops():
    b = Body(6)
    x = b.input("x", (3, 5, 77))
    gamma = b.input("g", (77,))
    beta = b.input("beta", (77,))
    ln = b("layer_norm", x, gamma, beta, eps=1e-5)
    sm = b("softmax", ln, axis=-1)
    ls = b("log_softmax", x, axis=2)
    plain = b("layer_norm", x)
    return b.region(sm, ls, plain, kind="norm"), b.arrays


def reductions():
    b = Body(7)
    x = b.input("x", (4, 3, 50))
    s = b("sum", x, axes=(-1,), keepdim=False)
    mx = b("amax", x, axes=(2,), keepdim=True)
    mn = b("amin", b("sub", x, mx), axes=(-1,), keepdim=True)
    mean = b("mean", x, axes=(-1,), keepdim=False)
    v = b("var", x, axes=(-1,), keepdim=True, correction=1)
    return b.region(s, mn, b("mul", mean, s), v, kind="norm"), b.arrays


def long_elementwise_chain():
    b = Body(8)
    x = b.input("x", (2, 9, 31))
    row = b.input("row", (31,))
    col = b.input("col", (2, 9, 1))
    per_batch = b.input("pb", (2, 1, 31))      # broadcast along the middle axis only
    pos = b.input("pos", (2, 9, 31), positive=True)
    y = b("add", x, row)
    y = b("mul", y, col)
    y = b("sub", y, per_batch)
    y = b("exp", b("neg", b("abs", y)))
    y = b("add", y, b("log1p", pos))
    y = b("add", y, b("sin", x))
    y = b("mul", y, b("cos", row))
    y = b("add", y, b("erf", per_batch))
    y = b("maximum", y, b("floor", col))
    y = b("minimum", y, b("ceil", pos))
    y = b("add", y, b("sign", x))
    y = b("add", y, b("pow", pos, b.const("p", 1.5)))
    y = b("add", y, b("remainder", x, b.const("r", 0.7)))
    y = b("add", y, b("fmod", x, b.const("f", 0.7)))
    y = b("add", y, b("sqrt", pos))
    y = b("add", y, b("rsqrt", pos))
    y = b("add", y, b("reciprocal", pos))
    y = b("add", y, b("sigmoid", x))
    y = b("add", y, b("gelu", x))
    y = b("add", y, b("relu", x))
    y = b("add", y, b("expm1", b("mul", x, b.const("s", 0.1))))
    y = b("add", y, b("log", pos))
    mask = b("logical_and", b("gt", x, row), b("logical_not", b("lt", col, b.const("z", 0.0))))
    y = b("where", mask, y, b("round", x))
    return b.region(y, mask, kind="elementwise"), b.arrays


def conv_strided_padded_dilated():
    b = Body(9)
    x = b.input("x", (1, 5, 14, 18))
    w = b.input("conv.weight", (7, 5, 3, 3))
    bias = b.input("conv.bias", (7,))
    y = b("conv2d", x, w, bias, stride=(2, 2), padding=(2, 1), dilation=(2, 1))
    return b.region(b("relu", b("mul", y, b.const("s", 1.5))), kind="contraction"), b.arrays


def residual_block_with_projection_shortcut():
    b = Body(10)
    x = b.input("x", (2, 4, 10, 10))
    h = b.input("h", (2, 6, 5, 5))
    w1 = b.input("down.weight", (6, 4, 1, 1))
    w3 = b.input("conv2.weight", (6, 6, 3, 3))
    per_channel = b.input("scale", (6, 1, 1))
    short = b("conv2d", x, w1, stride=(2, 2))
    main = b("conv2d", h, w3, padding=(1, 1))
    y = b("add", b("mul", main, per_channel), short)
    return b.region(b("relu", y), kind="contraction"), b.arrays


def sdpa_gqa_float_mask_odd_sizes():
    b = Body(11)
    qkv = b.input("qkv", (2, 13, 3 * 32))             # q: 4 heads of 8; k, v: 2 heads (grouped)
    kv = b.input("kv", (2, 141, 2, 2, 8))             # k and v, 141 keys, in a (T, 2, heads, D) layout
    bias = b.input("bias", (1, 1, 13, 141))           # an additive mask
    q = b("permute", b("reshape", b("slice", qkv, axis=2, start=0, end=32), shape=(2, 13, 4, 8)), perm=(0, 2, 1, 3))
    k = b("permute", b("select", kv, axis=2, index=0), perm=(0, 2, 1, 3))
    v = b("permute", b("select", kv, axis=2, index=1), perm=(0, 2, 1, 3))
    y = b("attention", q, k, v, bias, gqa=True, scale=0.3)
    return b.region(y, kind="attention"), b.arrays


def written_out_attention_single_head_bool_mask():
    b = Body(12)
    q = b.input("q", (1, 1, 7, 5))
    kt = b.input("kt", (1, 1, 5, 150))                # k stored transposed (named like the kernel's k tile)
    v = b.input("v", (1, 1, 150, 6))
    keep = b.input("keep", (1, 1, 7, 150), DType.bool, data=np.random.default_rng(0).random((1, 1, 7, 150)) > 0.3)
    s = b("mul", b("matmul", q, kt), b.const("scale", 0.4))
    s = b("where", keep, s, b.const("ninf", -np.inf))
    return b.region(b("matmul", b("softmax", s, axis=-1), v), kind="attention"), b.arrays


def attention_bool_mask_with_padding_rows():
    b = Body(14)
    q = b.input("q", (2, 2, 9, 8))
    k = b.input("k", (2, 2, 140, 8))
    v = b.input("v", (2, 2, 140, 8))
    keep = np.random.default_rng(1).random((2, 1, 9, 140)) > 0.3
    keep[0, :, :3, :] = False                         # left-padded queries: nothing to attend to
    mask = b.input("keep", (2, 1, 9, 140), DType.bool, data=keep)
    return b.region(b("attention", q, k, v, mask), kind="attention"), b.arrays


def decode_step_with_a_head_dim_of_1():
    """Blenderbot's decode step at d_model 32 over 32 heads: the new key and value appended to
    the cache, one query, a boolean mask. The head split [.., 32] -> [.., 32, 1] left its size-1
    axis out of the view's map, and q's tile was read one axis short (FK111 in the contraction)."""
    b = Body(21)
    keys = b.input("keys", (1, 1, 4, 6, 1))
    values = b.input("values", (1, 1, 4, 6, 1))
    q, k, v = (b.input(name, (1, 1, 4)) for name in ("q_in", "k_in", "v_in"))
    keep = b.input("keep", (1, 1, 1, 7), DType.bool, data=np.random.default_rng(0).random((1, 1, 1, 7)) > 0.2)

    def heads(x):
        return b("permute", b("reshape", x, shape=(1, 1, 4, 1)), perm=(0, 2, 1, 3))
    k = b("concat", b("select", keys, axis=0, index=0), heads(k), axis=2)
    v = b("concat", b("select", values, axis=0, index=0), heads(v), axis=2)
    return b.region(k, v, b("attention", heads(q), k, v, keep, scale=1.0), kind="attention"), b.arrays


def qk_norms_before_rotary_halves_grouped_heads():
    """QK-norm as Qwen 3 and Gemma 3 write it: q and k, slices of one merged projection, each
    head normalized over D (q a layer norm with weight and bias, k an RMS norm), then transposed
    and rotated by halves of D, causal, two query heads per key head. The norm's statistics are
    summed over both halves of the row the rotation cuts it into."""
    b = Body(15)
    S, D = 19, 12
    qkv = b.input("qkv", (1, S, (4 + 2 + 2) * D))
    cos, sin = b.input("cos", (S, D)), b.input("sin", (S, D))
    q_w, q_b, k_w = b.input("q_norm.weight", (D,)), b.input("q_norm.bias", (D,)), b.input("k_norm.weight", (D,))

    def heads(start, n):
        return b("reshape", b("slice", qkv, axis=2, start=start * D, end=(start + n) * D), shape=(1, S, n, D))

    def rotated(x):
        x = b("permute", x, perm=(0, 2, 1, 3))
        half = b("concat", b("neg", b("slice", x, axis=3, start=D // 2, end=D)),
                 b("slice", x, axis=3, start=0, end=D // 2), axis=3)
        return b("add", b("mul", x, cos), b("mul", half, sin))

    q = rotated(b("layer_norm", heads(0, 4), q_w, q_b, eps=1e-6))
    k = rotated(b("rms_norm", heads(4, 2), k_w, eps=1e-6))
    v = b("permute", heads(6, 2), perm=(0, 2, 1, 3))
    return b.region(b("attention", q, k, v, causal=True, gqa=True), kind="attention"), b.arrays


def interleaved_partial_rotary():
    """GPT-J's and GLM's rotation of interleaved pairs on the first 8 of 12 dims of each head:
    x[..., ::2] and x[..., 1::2] taken apart, stacked as (-odd, even) pairs and flattened back into
    D, the rest passed through. The kernel takes each piece's even and odd positions apart as
    strided reads of the tiles it loaded."""
    b = Body(18)
    S, D, R = 11, 12, 8
    qkv = b.input("qkv", (1, S, 3 * 2 * D))
    cos, sin = b.input("cos", (S, R)), b.input("sin", (S, R))

    def rotated(start):
        x = b("permute", b("reshape", b("slice", qkv, axis=2, start=start * D, end=(start + 2) * D),
                           shape=(1, S, 2, D)), perm=(0, 2, 1, 3))
        rot, rest = b("slice", x, axis=3, start=0, end=R), b("slice", x, axis=3, start=R, end=D)
        even, odd = b("slice", rot, axis=3, start=0, end=R, step=2), b("slice", rot, axis=3, start=1, end=R, step=2)
        pairs = b("concat", b("reshape", b("neg", odd), shape=(1, 2, S, R // 2, 1)),
                  b("reshape", even, shape=(1, 2, S, R // 2, 1)), axis=4)
        turned = b("add", b("mul", rot, cos), b("mul", b("reshape", pairs, shape=(1, 2, S, R)), sin))
        return b("concat", turned, rest, axis=3)

    v = b("permute", b("reshape", b("slice", qkv, axis=2, start=4 * D, end=6 * D), shape=(1, S, 2, D)),
          perm=(0, 2, 1, 3))
    return b.region(b("attention", rotated(0), rotated(2), v, causal=True), kind="attention"), b.arrays


def rope_written_over_part_of_d():
    """DeepSeek-V3's rotation: the last 4 of each head's 8 dims taken as (real, imaginary) pairs at
    even and odd positions, rotated, and written back over that range in half layout (a
    slice_scatter of D); pieces one position wide."""
    b = Body(19)
    S, D = 9, 8
    qkv = b.input("qkv", (1, S, 3 * 2 * D))
    cos, sin = b.input("cos", (S, 2)), b.input("sin", (S, 2))

    def rotated(start):
        x = b("permute", b("reshape", b("slice", qkv, axis=2, start=start * D, end=(start + 2) * D),
                           shape=(1, S, 2, D)), perm=(0, 2, 1, 3))
        pe = b("slice", x, axis=3, start=4, end=D)
        re, im = b("slice", pe, axis=3, start=0, end=4, step=2), b("slice", pe, axis=3, start=1, end=4, step=2)
        turned = b("concat", b("sub", b("mul", re, cos), b("mul", im, sin)),
                   b("add", b("mul", re, sin), b("mul", im, cos)), axis=3)
        return b("slice_scatter", x, turned, axis=3, start=4, end=D)

    v = b("permute", b("reshape", b("slice", qkv, axis=2, start=4 * D, end=6 * D), shape=(1, S, 2, D)),
          perm=(0, 2, 1, 3))
    return b.region(b("attention", rotated(0), rotated(2), v, causal=True), kind="attention"), b.arrays


def multi_query_heads_expanded():
    """One key and value head broadcast to three query heads with an expand (no reshape after it,
    as Hugging Face's repeat_kv has): each query head reads the one head where it is."""
    b = Body(17)
    q, kv = b.input("q", (2, 3, 10, 8)), b.input("kv", (2, 1, 2, 21, 8))
    k, v = (b("expand", b("select", kv, axis=2, index=i), shape=(2, 3, 21, 8)) for i in (0, 1))
    return b.region(b("attention", q, k, v), kind="attention"), b.arrays


def qk_rms_norm_without_weight_single_head():
    """A norm of each head with no weight and torch's default eps, no rotation: batch 1, one head,
    a depth of 5 and 23 keys, neither dividing a tile."""
    b = Body(16)
    q, k, v = b.input("q", (1, 1, 9, 5)), b.input("k", (1, 1, 23, 5)), b.input("v", (1, 1, 23, 3))
    return b.region(b("attention", b("rms_norm", q), b("rms_norm", k), v), kind="attention"), b.arrays


def causal_attention_odd_sizes(S=45, T=45):
    b = Body(13)
    q = b.input("q", (1, 1, S, 12))
    k = b.input("k", (1, 1, T, 12))
    v = b.input("v", (1, 1, T, 7))
    return b.region(b("attention", q, k, v, causal=True), kind="attention"), b.arrays


def causal_attention_fewer_queries_than_keys():
    return causal_attention_odd_sizes(20, 45)


HAND_BUILT = {f.__name__: f for f in (causal_attention_odd_sizes, causal_attention_fewer_queries_than_keys,
                                      qk_norms_before_rotary_halves_grouped_heads, qk_rms_norm_without_weight_single_head,
                                      multi_query_heads_expanded, interleaved_partial_rotary, rope_written_over_part_of_d,
                                      attention_bool_mask_with_padding_rows, decode_step_with_a_head_dim_of_1,
                                      sdpa_gqa_float_mask_odd_sizes, written_out_attention_single_head_bool_mask,
                                      conv_strided_padded_dilated, residual_block_with_projection_shortcut,
                                      linear_with_unusual_epilogue, batched_matmul_batch1_single_head,
                                      batched_matmul_with_partial_broadcast, batched_matmul_of_transposed_activations,
                                      matmul_3d_by_2d_and_swiglu,
                                      norm_prologue_with_selected_row, residual_rms_norm, row_ops, reductions,
                                      long_elementwise_chain)}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(HAND_BUILT))
def test_hand_built_regions_equal_the_ir_interpreter(case, target):
    node, arrays = HAND_BUILT[case]()
    gk = _check(node, arrays, target)
    assert "# from blk.fc (model.py:7)" in gk.source and "/some/dir" not in gk.source
    if case in ("interleaved_partial_rotary", "rope_written_over_part_of_d"):   # one kernel, strided reads
        assert gk.kind == "attention" and "rotary" in gk.parts and "::2]" in gk.source
    if case.startswith("qk_"):   # the norms are computed in the attention kernel, as it loads q and k
        assert gk.kind == "attention" and "norm" in gk.parts, gk.parts
        assert ("rotary" in gk.parts) == ("rotary" in case)


def test_sizes_that_do_not_divide_the_tiles_make_edge_tiles():
    node, arrays = linear_with_unusual_epilogue()
    gk = codegen.generate(node, "tiny")
    k = gk.kernel()
    trace = k.trace(*gk.arguments(arrays))
    tm, tn = k.__wrapped__.__kwdefaults__["tm"], k.__wrapped__.__kwdefaults__["tn"]
    assert 74 % tm and 29 % tn            # M = 2 x 37 rows, N = 29: the last tiles are short
    assert trace.target.name == "tiny"
    assert check_kernel(node, gk, arrays).ok
    assert gk.run(arrays)[0].dtype == ml_dtypes.bfloat16


def test_plain_op_nodes_are_kernels_too():
    x = Value("x", TensorType((6, 21), DType.f32))
    y = Value("y", TensorType((6, 21), DType.f32))
    node = Node("softmax", [x], {"axis": -1}, [y], SourceLoc("m.py", 3, "attn"))
    arr = np.random.default_rng(0).standard_normal((6, 21)).astype(np.float32)
    gk = _check(node, [arr], "tiny")
    assert gk.kind == "vector" and "softmax" in gk.source
    w = Value("w", TensorType((5, 21), DType.f32))
    z = Value("z", TensorType((6, 5), DType.f32))
    lin = Node("linear", [x, w], {}, [z], SourceLoc("m.py", 4, "fc"))
    gk = _check(lin, [arr, np.ones((5, 21), np.float32)], "rngd")
    assert gk.kind == "contraction"


def test_what_has_no_part_is_refused_with_the_op_named():
    b = Body()
    x = b.input("x", (4, 6))
    node = b.region(b("sum", x, axes=(0,), keepdim=False))
    with pytest.raises(UnsupportedRegionError, match=r"no kernel generator for sum .*last axis only") as e:
        codegen.generate(node, "rngd")
    assert isinstance(e.value, NotImplementedError) and e.value.op == "sum" and e.value.code == "FK190"
    b = Body()
    x = b.input("x", (1, 4, 8, 8))
    w = b.input("w", (4, 2, 3, 3))
    node = b.region(b("relu", b("conv2d", x, b("neg", w), groups=2)), kind="contraction")
    with pytest.raises(UnsupportedRegionError, match="conv2d .*operand computed inside the region"):
        codegen.generate(node, "tiny")
    b = Body()
    x = b.input("x", (4, 6))
    node = b.region(b("tril", x))
    with pytest.raises(UnsupportedRegionError, match="tril"):
        codegen.generate(node, "tiny")


@pytest.mark.parametrize("target", ["rngd", "tiny"])
def test_attention_with_only_q_computed_slices_the_loaded_keys_per_piece(target):
    """q computed in the region in pieces of D (a rotation: halves swapped and negated), k and v
    read as they are (a decode step's keys, rotated before they went into the cache): the kernel
    contracts each piece of q with that piece of the loaded keys, sliced in SRAM. Odd sizes, grouped
    heads (4 query heads over 2), and q computed with no pieces at all (a negation)."""
    rng = np.random.default_rng(0)
    b = Body()
    q = b.input("q", (1, 4, 5, 12))
    k = b.input("k", (1, 2, 37, 12))
    v = b.input("v", (1, 2, 37, 12))
    lo, hi = b("slice", q, axis=3, start=0, end=6, step=1), b("slice", q, axis=3, start=6, end=12, step=1)
    rotated = b("add", b("mul", q, b.input("cos", (1, 1, 5, 12))),
                b("mul", b("concat", b("neg", hi), lo, axis=3), b.input("sin", (1, 1, 5, 12))))
    node = b.region(b("attention", rotated, k, v, gqa=True), kind="attention")
    gk = _check(node, [rng.standard_normal(x.type.shape).astype(np.float32) for x in node.inputs], target)
    assert "kt[:, 0:6]" in gk.source and "kt[:, 6:12]" in gk.source, gk.source
    b = Body()
    q = b.input("q", (1, 2, 8, 4))
    node = b.region(b("attention", b("neg", q), q, q), kind="attention")
    _check(node, [rng.standard_normal((1, 2, 8, 4)).astype(np.float32)], target)


def test_a_panel_contraction_loads_each_row_tile_once_per_panel():
    """A PE's item is a row tile and a panel of columns: the row tile's K slabs are loaded by the
    panel's first column tile and reused by the others, so the activations are read once per panel,
    not once per output tile; sizes that divide nothing, on both targets, equal the IR interpreter."""
    b = Body(3)
    x = b.input("x", (1, 37, 45))
    w = b.input("fc.weight", (70, 45))
    bias = b.input("fc.bias", (70,))
    node, arrays = b.region(b("gelu", b("linear", x, w, bias)), kind="contraction"), b.arrays
    for target in ("tiny", "rngd"):
        gk = _check(node, arrays, target)
        assert "for ns in fl.range(fl.tiles(ps, tn)" in gk.source and "not in x_slabs" in gk.source
    k = gk.kernel()
    args = gk.arguments(arrays)
    interpreted = k(*args, target="tiny", tm=16, tp=40, tn=8, tk=16)
    result = k.simulate(*args, target="tiny", tm=16, tp=40, tn=8, tk=16)
    np.testing.assert_allclose(k.last_trace.unpack(result.outputs), interpreted, rtol=1e-6)
    np.testing.assert_allclose(interpreted, gk.run(arrays)[0].reshape(37, 70), rtol=1e-5, atol=1e-5)
    x_loaded = sum(c.ref.size for c in result.program.commands if isinstance(c, Load) and c.ref.tensor.name == "x")
    assert x_loaded == 37 * 45 * 2      # two panels of 40 columns, five column tiles each



@pytest.mark.parametrize("M, tiles, steps", [(37, dict(tm=16, tp=48, tn=16), 1),
                                             (2050, dict(tm=512, tp=48, tr=256, tn=16), 2)])
def test_a_norm_fed_panel_normalizes_its_rows_once_for_all_its_column_tiles(M, tiles, steps):
    """A layer norm into a projection of few columns (not staged through DRAM) runs on a panel
    item's whole rows once, before the item's column tiles, which contract the normed rows kept in
    SRAM: the rows are loaded and normalized once per item (or row step), the norm's weight and
    bias once per item, not once per output tile; an item of many rows streams them in steps (tr),
    each normed on its own, the weights kept. Sizes that divide nothing equal the IR interpreter,
    interpreted and simulated."""
    b = Body(11)
    x = b.input("x", (1, M, 45))
    g, beta = b.input("ln.weight", (45,)), b.input("ln.bias", (45,))
    w, bias = b.input("fc.weight", (70, 45)), b.input("fc.bias", (70,))
    y = b("linear", b("layer_norm", x, g, beta, eps=1e-5), w, bias)
    node, arrays = b.region(b("gelu", y), kind="contraction"), b.arrays
    gk = _check(node, arrays, "rngd")   # 70 columns: one tile, not staged
    src = gk.source
    assert "fl.scratch(" not in src and "tp: int" in src and ("tr: int" in src) == (steps > 1)
    assert src.index("fl.rsqrt(") < src.index("for ns in fl.range(fl.tiles(ps, tn)")
    k = gk.kernel()
    args = gk.arguments(arrays)
    interpreted = k(*args, target="rngd", **tiles)
    result = k.simulate(*args, target="rngd", **tiles)
    np.testing.assert_allclose(k.last_trace.unpack(result.outputs), interpreted, rtol=1e-6)
    np.testing.assert_allclose(interpreted, gk.run(arrays)[0].reshape(M, 70), rtol=1e-5, atol=1e-5)
    cmds = result.program.commands
    row_tiles = -(-M // tiles["tm"])
    items = row_tiles * 2                                       # panels of 48 and 22 columns
    row_steps = items * steps - 2 * (steps > 1)                 # 2050 rows: the last item's 2 rows, one step
    loaded = collections.Counter(c.ref.tensor.name for c in cmds if isinstance(c, Load))
    assert loaded["ln_weight"] == loaded["ln_bias"] == items    # once per item, for all its column tiles
    assert loaded["x"] == row_steps
    assert sum(c.ref.size for c in cmds if isinstance(c, Load) and c.ref.tensor.name == "x") == M * 45 * 2
    assert sum(isinstance(c, Vector) and c.name == "rsqrt" for c in cmds) == row_steps
    assert loaded["fc_weight"] == row_tiles * (3 + 2)           # column tiles of 16: 3 in 48, 2 in 22; kept
                                                                # for every row step


@pytest.mark.parametrize("M, N, K, siblings", [(512, 768, 3072, 1), (512, 512, 2048, 1), (512, 2048, 5472, 1),
                                               (512, 5472, 2048, 2), (37, 70, 1100, 1), (64, 4096, 8192, 1)])
def test_a_long_k_slab_moves_more_than_its_dma_start_up_costs(M, N, K, siblings):
    """A K step loads one weight tile per sibling contraction: its slab grows until that load moves
    at least twice what the DMA start-up costs (rngd: 500 cycles x 256 B/cycle), or is all of K;
    a narrow panel's 512-deep slab of 192 columns spent as long starting as transferring."""
    cfg = get_target("rngd")
    tm, tp, tn, tk = panel_tiles(M, N, K, 2, cfg, "bf16", 2, siblings=siblings)
    assert tk <= K
    assert tk == K or siblings * tn * tk * 2 >= amortizing_bytes(cfg), (tm, tp, tn, tk)


@pytest.mark.parametrize("target, M, N, K", [("rngd", 512, 2304, 768), ("rngd", 512, 3072, 768),
                                             ("rngd", 512, 10944, 2048), ("rngd", 64, 1000, 512),
                                             ("tiny", 37, 70, 45), ("tiny", 64, 300, 96)])
def test_a_panel_is_cut_into_column_tiles_of_one_width(target, M, N, K):
    """No sliver of a last column tile (a 288-column panel as 128 + 128 + 32 paid a whole DMA
    start-up for 32 columns): the panel's tiles cover it with less than one native column tile
    of slack per tile."""
    cfg = get_target(target)
    nn = cfg.native_tile("bf16")[1]
    tm, tp, tn, tk = panel_tiles(M, N, K, 2, cfg, "bf16", 2)
    columns = -(-tp // tn)
    assert columns * tn - tp < columns * nn, (tp, tn)
    if (target, N) == ("rngd", 2304):
        assert (tp, tn) == (288, 96)


@pytest.mark.parametrize("M, N, K, streams", [(512, 3072, 768, True), (512, 768, 3072, True),
                                              (1024, 14336, 4096, False), (100, 3072, 768, False)])
def test_a_panel_streams_its_rows_only_within_the_sram_of_whole_row_tiles(M, N, K, streams):
    """Streaming keeps a panel's weight tiles for the whole item: GPT-2's projections stream (a
    chain of kernels pipelines), a Llama-8B MLP projection does not (its kept weights would crowd
    out the intermediates the schedule keeps on chip), nor a row tile of a few native tiles."""
    cfg = get_target("rngd")
    tm, tp, tn, tk = panel_tiles(M, N, K, 2, cfg, "bf16", 2)
    tr = streamed_rows(tm, tp, tn, tk, K, 2, cfg, "bf16", 2)
    assert (tr is not None) == streams, (tm, tp, tn, tk, tr)
    if tr is not None:
        assert tr < tm and tr % cfg.native_tile("bf16")[0] == 0
        kept = 2 * K * tp * 2 + 2 * tr * K * 2
        assert kept <= 2 * tm * K * 2 + 2 * 2 * tk * tn * 2 + 2 * tm * tn * 8


@pytest.mark.parametrize("target", TARGETS)
def test_a_long_k_contraction_simulates_to_what_it_interprets(target):
    """Odd sizes with a K long enough to be cut into slabs (a short last one) under a residual
    epilogue: the simulator's functional outputs equal the kernel-language interpreter's, which
    equal the IR interpreter's."""
    b = Body(5)
    K = 1100 if target == "rngd" else 333
    x = b.input("x", (1, 37, K))
    w = b.input("fc.weight", (70, K))
    bias = b.input("fc.bias", (70,))
    res = b.input("res", (1, 37, 70))
    node, arrays = b.region(b("add", b("linear", x, w, bias), res), kind="contraction"), b.arrays
    gk = _check(node, arrays, target)
    k = gk.kernel()
    tk = k.__wrapped__.__kwdefaults__["tk"]
    args = gk.arguments(arrays)
    small = {} if K % tk else {"tk": 256 if target == "rngd" else 16}   # slabs with a short last one
    assert K % small.get("tk", tk)
    interpreted = k(*args, target=target, **small)
    result = k.simulate(*args, target=target, **small)
    np.testing.assert_allclose(k.last_trace.unpack(result.outputs), interpreted, rtol=1e-6)
    np.testing.assert_allclose(interpreted, gk.run(arrays)[0].reshape(37, 70), rtol=1e-4, atol=1e-4)

def _linear_region(M, K, N, norm):
    b = Body()
    x = b.input("x", (1, M, K), data=np.zeros((1, M, K)))
    w = b.input("w", (N, K), data=np.zeros((N, K)))
    g = b.input("g", (K,), data=np.zeros(K))
    r = b.input("r", (1, M, N), data=np.zeros((1, M, N)))
    h = b("rms_norm", x, g) if norm else x
    return b.region(b("add", b("linear", h, w), r), kind="contraction")


@pytest.mark.parametrize("target, M, K, N, norm", [("rngd", 512, 4096, 11008, False), ("rngd", 512, 4096, 4096, True),
                                                   ("tiny", 256, 1024, 512, False), ("tiny", 64, 256, 96, True)])
def test_tiles_fit_the_targets_sram(target, M, K, N, norm):
    """Real sizes, traced without data: the tile sizes the generator picks fit one PE's SRAM
    (the kernel language's planner would raise SRAMOverflowError otherwise)."""
    gk = codegen.generate(_linear_region(M, K, N, norm), target)
    k = gk.kernel()
    trace = k.trace(*[lang.spec(p.shape, "f32") for p in gk.params])
    assert 0 < max(trace.plan.peak) <= trace.target.sram_bytes_per_pe
    if norm:   # the norm needs whole rows: one K slab, or normalized once into a DRAM scratch first
        assert k.__wrapped__.__kwdefaults__["tk"] == K or "fl.scratch(" in gk.source


def test_rows_too_long_for_sram_are_refused_not_overflowed():
    with pytest.raises(UnsupportedRegionError, match="rms_norm .*do not fit one PE's SRAM on tiny"):
        codegen.generate(_linear_region(64, 2048, 96, True), "tiny")
    b = Body()
    x = b.input("x", (16, 8192), data=np.zeros((16, 8192)))
    # split rows take one reduction along the row: a norm then a softmax of its result is two
    with pytest.raises(UnsupportedRegionError, match="softmax.*split rows take one reduction along the row, not 2"):
        codegen.generate(b.region(b("softmax", b("layer_norm", x), axis=-1)), "tiny")


def _long_row_norm(op):
    """A row op over rows of 3,000 elements (tiny's SRAM holds a few thousand f32 per tile, double
    buffered, with the region's other tiles), with an elementwise prologue and epilogue, a
    per-row operand, a per-column one, and the prologue's value a result too."""
    b = Body(21)
    x = b.input("x", (2, 3, 3000))
    col = b.input("col", (2, 3, 1))
    g = b.input("g", (3000,))
    beta = b.input("beta", (3000,))
    pre = b("add", b("mul", x, b.const("k", 3.0)), col)      # a large offset: centring matters
    if op == "layer_norm":
        y = b("layer_norm", pre, g, beta, eps=1e-5)
    elif op == "rms_norm":
        y = b("rms_norm", pre, g, eps=1e-6)
    elif op in ("softmax", "log_softmax"):
        y = b(op, pre, axis=-1)
    elif op == "var":
        y = b("var", pre, axes=(-1,), keepdim=True, correction=1)
    else:
        y = b(op, pre, axes=(-1,), keepdim=op != "sum")
    post = b("tanh", b("mul", y, g)) if op in ("layer_norm", "rms_norm", "softmax", "log_softmax") \
        else b("add", y, b.const("one", 1.0))
    return b.region(post, pre, kind="norm"), [a + 40.0 if i == 1 else a for i, a in enumerate(b.arrays)]


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "softmax", "log_softmax", "sum", "mean", "amax", "var"])
def test_rows_too_long_for_sram_are_split_into_column_chunks(op):
    """On tiny, a row of 3,000 f32 with its tiles does not fit SRAM: the kernel takes the row in
    chunks of columns, its statistics in passes over them, and equals the IR interpreter; on rngd
    the same region is written on whole rows."""
    node, arrays = _long_row_norm(op)
    gk = _check(node, arrays, "tiny")
    assert "split rows" in gk.parts and "for cs in fl.range(fl.tiles(C, cols)" in gk.source
    k = gk.kernel()
    cols = k.__wrapped__.__kwdefaults__["cols"]
    assert cols < 3000 and cols % 16 == 0
    trace = k.trace(*gk.arguments(arrays))
    assert 0 < max(trace.plan.peak) <= trace.target.sram_bytes_per_pe
    assert "split rows" not in _check(node, arrays, "rngd").parts


def test_a_long_elementwise_row_is_taken_in_column_chunks_and_simulates_as_it_interprets():
    b = Body(22)
    x = b.input("x", (3, 5000))
    row = b.input("row", (5000,))
    node = b.region(b("gelu", b("add", x, row), approximate="tanh"), kind="elementwise")
    gk = _check(node, b.arrays, "tiny")
    assert "split rows" in gk.parts
    k = gk.kernel()
    args = gk.arguments(b.arrays)
    interpreted = k(*args)
    simulated = k.last_trace.unpack(k.simulate(*args).outputs)
    np.testing.assert_array_equal(simulated, interpreted)


def _operand_data(op_name, rng, shape):
    """Inputs inside each op's domain (acosh needs >= 1, atanh (-1, 1), pow a positive base, shifts
    small counts): outside it both sides give NaN, which says nothing about the op."""
    x = rng.standard_normal(shape)
    if op_name in ("acosh",):
        return np.abs(x) + 1.0
    if op_name in ("asin", "acos", "atanh"):
        return np.tanh(x) * 0.9
    if op_name in ("log", "log2", "log10", "log1p", "sqrt", "rsqrt", "pow"):
        return np.abs(x) + 0.1
    return x


@pytest.mark.parametrize("name", sorted(vector_mod.SAME_NAME))
def test_every_same_name_elementwise_op_as_a_kernel_equals_the_ir(name):
    """One kernel per vector-unit op the table maps, on odd-sized operands (one broadcast along
    rows): the generated kernel equals the IR interpreter, so a wrong entry in either table fails."""
    op = get_op(name)
    b = Body(11)
    ints = name.startswith("bitwise")
    bools = name.startswith("logical") or name == "where"
    shapes = [(5, 37), (1, 37), (5, 37)][:op.arity]
    ins = []
    for i, shape in enumerate(shapes):
        if ints:
            data = b.rng.integers(0 if "shift" in name else -50, 6 if "shift" in name else 50, shape)
            ins.append(b.input(f"x{i}", shape, DType.i32, data=data))
        elif bools and (name != "where" or i == 0):
            ins.append(b.input(f"x{i}", shape, DType.bool, data=b.rng.random(shape) < 0.5))
        else:
            ins.append(b.input(f"x{i}", shape, data=_operand_data(name, b.rng, shape)))
    node = b.region(b(name, *ins), kind="elementwise")
    for target in ("rngd", "tiny"):
        _check(node, b.arrays, get_target(target))


CONV_GEOMETRIES = {   # (x shape, weight shape, attrs): every way an offset's rows can be read
    "3x3 pad 1": ((2, 6, 9, 11), (5, 6, 3, 3), dict(padding=(1, 1))),
    "stride 2 divides": ((1, 4, 12, 10), (6, 4, 3, 3), dict(stride=(2, 2), padding=(1, 1))),
    "stride 2 leaves a partial window": ((1, 3, 15, 13), (4, 3, 3, 3), dict(stride=(2, 2), padding=(1, 0))),
    "dilated": ((1, 5, 14, 18), (7, 5, 3, 3), dict(stride=(2, 2), padding=(2, 1), dilation=(2, 1))),
    "grouped": ((1, 8, 7, 9), (6, 4, 3, 3), dict(padding=(1, 1), groups=2)),
    "depthwise": ((1, 6, 8, 10), (6, 1, 3, 3), dict(padding=(2, 2), dilation=(2, 2), groups=6)),
    "1x1 stride 2": ((1, 4, 10, 10), (6, 4, 1, 1), dict(stride=(2, 2))),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("geometry", sorted(CONV_GEOMETRIES))
def test_a_convolution_loads_each_items_input_window_once_and_slices_it_per_offset(geometry, target):
    xs, ws, attrs = CONV_GEOMETRIES[geometry]
    b = Body(20)
    y = b("conv2d", b.input("x", xs), b.input("conv.weight", ws), b.input("conv.bias", (ws[0],)), **attrs)
    node, arrays = b.region(b("relu", y), kind="contraction"), b.arrays
    gk = _check(node, arrays, target)   # equals the IR interpreter, interpreted and simulated
    assert "for kh, p0, p1 in rows_in:" in gk.source
    k = gk.kernel()
    k(*gk.arguments(arrays))
    trace = k.last_trace
    x_param, w_param = gk.params[0].name, gk.params[1].name
    loads = collections.Counter(op.src.tensor.name for op in trace.ops if op.kind == "load")
    items = sum(1 for op in trace.ops if op.kind == "store")
    taps = sum(1 for op in trace.ops if op.kind in ("contract", "vector") and
               any(t.base is not None and t.base.name == "xw" for t in op.reads()))
    # one window load per band of output rows (a band wholly in the padding loads none); the
    # weights once per item (a tile of channels and a group of bands), before its bands
    assert 0 < loads[w_param] <= loads[x_param] <= items
    assert taps >= loads[x_param] * (min(ws[2:]) if geometry != "1x1 stride 2" else 1)


@pytest.mark.parametrize("xs, ws, attrs", [
    ((1, 1280, 2, 2), (24, 1280, 1, 1), {}),                        # a segmentation head's 1x1 over a concat
    ((1, 640, 3, 5), (12, 640, 3, 3), dict(padding=(1, 1))),
    ((1, 1200, 2, 3), (8, 600, 3, 3), dict(padding=(1, 1), groups=2)),
])
def test_a_convolution_whose_offset_patch_of_all_input_channels_overflows_tiles_the_channels(xs, ws, attrs):
    b = Body(21)
    y = b("conv2d", b.input("x", xs), b.input("conv.weight", ws), b.input("conv.bias", (ws[0],)), **attrs)
    node, arrays = b.region(b("relu", y), kind="contraction"), b.arrays
    gk = _check(node, arrays, "tiny")   # equals the IR interpreter, interpreted and simulated
    k = gk.kernel()
    tc = k.__wrapped__.__kwdefaults__["tc"]
    assert tc < ws[1]
    k(*gk.arguments(arrays))
    trace = k.last_trace
    assert max(trace.plan.peak) <= trace.target.sram_bytes_per_pe
    w_param = gk.params[1].name
    weight_loads = [op for op in trace.ops if op.kind == "load" and op.src.tensor.name == w_param]
    assert {op.src.shape[1] for op in weight_loads} >= {tc}         # a tile of channels per load
    assert "tc" not in codegen.generate(node, "rngd").kernel().__wrapped__.__kwdefaults__   # fits whole there


@pytest.mark.parametrize("target", TARGETS)
def test_a_per_channel_scale_over_small_images_takes_channels_in_tiles(target):
    """A squeeze-and-excite scale, (1, C, 1, 1) over (1, C, H, W) features of a late CNN stage: the
    channels cannot merge with the rows (the scale varies along them), and one channel per item
    would be a few hundred bytes per DMA, all start-up. The kernel takes the channels in tiles
    (`tb`): far fewer, larger DMAs, and the same values."""
    b = Body(22)
    x, s = b.input("x", (1, 96, 7, 7)), b.input("s", (1, 96, 1, 1))
    node, arrays = b.region(b("mul", x, b("sigmoid", s)), kind="elementwise"), b.arrays
    gk = _check(node, arrays, target)
    k = gk.kernel()
    tb = k.__wrapped__.__kwdefaults__["tb"]
    assert tb > 1
    args = gk.arguments(arrays)
    tiled = k.simulate(*args)
    tiled_out = k.last_trace.unpack(tiled.outputs)[0]
    one_at_a_time = k.simulate(*args, tb=1)
    dmas = lambda r: sum(1 for c in r.program.commands if c.engine == 0)   # noqa: E731
    assert dmas(tiled) * (tb // 2) <= dmas(one_at_a_time)
    if target == "rngd":   # where a DMA's start-up dwarfs a channel's bytes
        assert tiled.cycles * 4 < one_at_a_time.cycles
    np.testing.assert_array_equal(tiled_out, k.last_trace.unpack(one_at_a_time.outputs)[0])


def test_a_convolution_epilogue_reads_a_relaid_out_residual():
    """A residual add whose other operand is a region input relaid out to the convolution's
    channels-last layout (MobileViTV2's attention out-projection): the relayout is a free view to the
    kernel, which loads the input itself. It was a codegen crash (the relayout had no tile)."""
    b = Body(23)
    x, res = b.input("x", (1, 8, 4, 6)), b.input("res", (1, 8, 4, 6))
    order = (0, 2, 3, 1)
    y = b("conv2d", b("relayout", x, order=order), b.input("conv.weight", (8, 8, 1, 1)), b.input("conv.bias", (8,)))
    node, arrays = b.region(b("add", y, b("relayout", res, order=order)), kind="contraction"), b.arrays
    for target in TARGETS:
        gk = _check(node, arrays, target)
        assert gk.kind == "convolution" and sum(p.name.startswith("res") for p in gk.params) == 1


def test_a_convolution_region_passes_on_an_input_it_does_not_compute():
    """A region split to fit SRAM may hand a value it does not compute to the piece after it (UperNet's
    FPN lateral conv on tiny: conv, relu, and the upsampled level relaid out for the next piece's
    add), relaid or as it is. The kernel stores that input's tiles; it stored none (FK170)."""
    b = Body(24)
    x, up, skip = b.input("x", (1, 8, 6, 5)), b.input("up", (1, 16, 6, 5)), b.input("skip", (1, 16, 6, 5))
    y = b("conv2d", b("relayout", x, order=(0, 2, 3, 1)), b.input("conv.weight", (16, 8, 1, 1)),
          b.input("conv.bias", (16,)))
    node, arrays = b.region(b("relu", y), b("relayout", up, order=(0, 2, 3, 1)), skip, kind="contraction"), b.arrays
    for target in TARGETS:
        gk = _check(node, arrays, target)
        assert gk.kind == "convolution" and len(gk.results) == 3
    b = Body(26)   # a contraction's region likewise
    x, skip = b.input("x", (2, 7, 12)), b.input("skip", (2, 7, 5))
    node = b.region(b("relu", b("linear", x, b.input("w", (5, 12)), b.input("bias", (5,)))), skip,
                    kind="contraction")
    for target in TARGETS:
        assert _check(node, b.arrays, target).kind == "contraction"
    # an output of another shape is not a tile of the convolution's: refused, and split by the stage
    b = Body(25)
    y = b("conv2d", b.input("x", (1, 8, 6, 5)), b.input("conv.weight", (16, 8, 1, 1)))
    node = b.region(y, b.input("row", (1, 16, 1, 5)), kind="contraction")
    with pytest.raises(UnsupportedRegionError, match="region output of shape \\[1, 16, 1, 5\\]"):
        codegen.generate(node, "tiny")
