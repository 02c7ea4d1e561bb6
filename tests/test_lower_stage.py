"""The lower stage: every node of the final graph a kernel-language kernel, a free view or an
explicit host op; the program run the chip way verifies against eager; user kernels replace
generated ones and are checked like them; cm.kernels and cm.save show the kernels."""

import os

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree

import fexplore
from fexplore import lang as fl
from fexplore.errors import NumericMismatchError
from fexplore.models import ZOO
from variants import explored, matrix_params


@pytest.fixture(autouse=True)
def _no_user_kernels():
    fexplore.unregister_kernels()
    yield
    fexplore.unregister_kernels()


# each zoo model on both targets and in both precisions: all four variants under `make test-full`,
# two under `make test` (`variants.matrix`), so each model runs on `tiny` and in bf16 either way
ZOO_VARIANTS = matrix_params(sorted(ZOO))


@pytest.mark.parametrize("name, target, precision", ZOO_VARIANTS)
def test_every_zoo_model_lowers_and_verifies(name, target, precision):
    """Every zoo model lowers on both targets and precisions and verifies. On `tiny` (64 KiB of
    SRAM per PE: real tiling, rows split into chunks, channels into tiles) every op is a kernel or
    a free view, none a host op, and the program run on the simulated chip equals eager within
    the precision's tolerance."""
    def explore():
        torch.manual_seed(0)
        return fexplore.explore(*ZOO[name]())
    ex = explored(("zoo", name), explore)   # the four variants fork one export
    model, inputs = ex.model, ex.example_inputs
    cm = ex.fork(target=target, precision=precision).result
    rec = cm["lower"]
    low = cm.lowering
    assert [r.name for r in cm.stages][-3:] == ["precision", "lower", "schedule"]
    assert rec.verification.ok and rec.verification.kernels.ok, rec.verification.kernels
    # every top-level node is accounted for, exactly once
    assert len(low.nodes) == len(cm.graph.nodes)
    assert {id(x.node) for x in low.nodes} == {id(n) for n in cm.graph.nodes}
    assert all(x.how in ("generated", "free view", "host", "split") for x in low.nodes)
    assert all(y.how in ("generated", "free view", "host") for x in low.splits for y in x.pieces)
    assert rec.stats["kernels"] == len(cm.kernels) >= 1
    assert rec.stats["host_ops"] == len(low.host_ops) == sum(rec.stats["host_ops_by_op"].values())
    assert all(x.reason for x in low.host_ops)  # a host op says why it is one
    assert f"{len(cm.kernels)} kernels" in rec.summary and f"{len(low.host_ops)} host ops" in rec.summary
    names = [k.name for k in cm.kernels]
    assert len(set(names)) == len(names), "kernel names are unique per compile"
    for k in cm.kernels:
        assert f"def {k.name}(" in k.source and k.region is k.node
    assert rec.verification.kernels.kernels_run >= 1
    assert cm.verification["ok"].all(), cm.verification
    if target == "tiny":
        assert not low.host_ops, [(h.op, h.reason) for h in low.host_ops]
        with torch.no_grad():
            want = pytree.tree_leaves(model(*inputs))
        for g, w in zip(pytree.tree_leaves(cm(*inputs)), want):
            scale = max(1.0, float(w.abs().max()))
            tol = 2e-5 if precision == "fp32" else 0.05
            assert float((g.float() - w.float()).abs().max()) <= tol * scale


# each zoo model loaded in bf16 (weights and activations: the residual stream, norms' outputs and
# the result bf16, as a model deployed in bf16 runs), on alternate targets
IN_BF16 = [(name, ("rngd", "tiny")[i % 2]) for i, name in enumerate(sorted(ZOO))]


@pytest.mark.parametrize("name, target", IN_BF16, ids=["-".join(v) for v in IN_BF16])
def test_every_zoo_model_loaded_in_bf16_lowers_and_equals_eager(name, target):
    torch.manual_seed(0)
    model, inputs = ZOO[name]()
    model = model.to(torch.bfloat16)
    inputs = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs)
    with torch.no_grad():
        want = pytree.tree_leaves(model(*inputs))
    cm = fexplore.compile(model, inputs, target=target)
    assert cm.verification["ok"].all(), cm.verification
    assert not cm.lowering.host_ops, [(h.op, h.reason) for h in cm.lowering.host_ops]
    assert any(p.type.dtype.name == "bf16" for k in cm.kernels for p in k.node.outputs)
    for g, w in zip(pytree.tree_leaves(cm(*inputs)), want):
        assert g.dtype == w.dtype == torch.bfloat16 and g.shape == w.shape
        scale = max(1.0, float(w.float().abs().max()))
        assert float((g.float() - w.float()).abs().max()) <= 0.02 * scale   # a few roundings of 2^-8


def test_regions_and_plain_ops_lower_free_views_are_free(zoo_compiled):
    _, _, cm = zoo_compiled("llama_decode")
    low = cm.lowering
    assert any(x.node.op.name == "region" for x in low.kernels)
    assert all(x.node.op.name == "reshape" for x in low.free_views) and low.free_views
    assert "embedding" not in {x.op for x in low.host_ops}   # a DMA gather kernel now
    assert "kernels:" in cm.summary() and "host ops:" in cm.summary()


def test_two_regions_of_one_module_get_distinct_names():
    model, inputs = ZOO["vit"]()
    cm = fexplore.compile(model, inputs, target="tiny")
    names = [k.name for k in cm.kernels]
    assert len(set(names)) == len(names)
    assert any(n.endswith("_2") for n in names)  # tiny splits regions: one module, several kernels
    for k in cm.kernels:
        k.kernel.kernel()  # each source defines the function it names


def _linear(sign):
    @fl.kernel(target="tiny")
    def user_linear(x: fl.f32["M", "K"], w: fl.f32["N", "K"], b: fl.f32["N"], *, tm: int = 4,
                    tn: int = 8, tk: int = 32):
        M, K = x.shape
        N = w.shape[0]
        OUT = fl.output((M, N), fl.f32, axes="M N")
        for ms, ns in fl.parallel(fl.tiles(M, tm), fl.tiles(N, tn)):
            acc = None
            for ks in fl.range(fl.tiles(K, tk)):
                acc = fl.contract("mk,nk->mn", fl.load(x[ms, ks]), fl.load(w[ns, ks]), acc=acc)
            y = acc + fl.load(b[ns]) * sign
            fl.store(OUT[ms, ns], y)
        return OUT
    return user_linear


def test_a_right_user_kernel_replaces_the_generated_one():
    fexplore.register_kernel("linear", _linear(1.0))
    model, inputs = ZOO["mlp"]()
    cm = fexplore.compile(model, inputs, target="tiny")
    low = cm.lowering
    assert [x.label for x in low.replaced] == ["linear %linear_2"]  # the unfused last linear
    assert cm["lower"].stats["replaced"] == ["linear %linear_2"]
    user = low.replaced[0]
    assert user.how == "user" and user.kind == "user" and "def user_linear(" in user.source
    assert "user kernels: user_linear for linear %linear_2" in cm.summary()
    assert cm["lower"].verification.ok


def test_a_wrong_user_kernel_fails_verification_naming_region_and_kernel():
    fexplore.register_kernel(lambda n: n.op.name == "linear", _linear(-1.0))
    model, inputs = ZOO["mlp"]()
    ex = fexplore.explore(model, inputs, target="tiny")
    rec = ex["lower"]
    k = rec.verification.kernels
    assert not rec.verification.ok and not k.ok
    assert k.first_divergent == "kernel user_linear (user, for linear %linear_2)"
    with pytest.raises(NumericMismatchError, match=r"user_linear.*linear %linear_2"):
        ex.result


def test_cm_kernels_and_save(tmp_path, zoo_compiled):
    _, _, cm = zoo_compiled("gpt")
    k = cm.kernels[0]
    assert k.name and k.kind and k.region is not None and "@fl.kernel" in k.source
    cm.save(tmp_path, report=False)
    saved = sorted(os.listdir(tmp_path / "kernels"))
    assert saved == sorted(f"{k.name}.py" for k in cm.kernels)
    text = (tmp_path / "kernels" / f"{k.name}.py").read_text()
    assert text == k.source


def test_each_kernel_equals_its_region_on_the_example_inputs(zoo_compiled):
    from fexplore.ir import run
    from fexplore.lang.codegen import check_kernel

    _, inputs, cm = zoo_compiled("llama")
    g = cm.graph
    env = {v.name: np.asarray(x) for v, x in zip(g.inputs, inputs)}
    env.update({c.name: c.payload for c in g.constants})
    run(g, [np.asarray(x) for x in inputs],
        hook=lambda n, outs: env.update({v.name: o for v, o in zip(n.outputs, outs)}))
    for k in cm.kernels:
        got = check_kernel(k.node, k.kernel, [env[v.name] for v in k.node.inputs])
        assert got.ok, (k.name, got)


def test_the_lower_stage_view_lists_every_kernel_with_its_source(zoo_compiled):
    _, _, cm = zoo_compiled("gpt")
    html = cm["lower"]._repr_html_()
    assert "<summary>kernels</summary>" in html and "why on the host" in html
    for k in cm.kernels:
        assert f"{k.name} (generated, {k.kind})" in html
    assert "free view" in html or not cm.lowering.free_views
    # gpt's embedding is a DMA gather kernel now; what is left on the host is marked as such
    assert ('<span class="bad">host</span>' in html) == bool(cm.lowering.host_ops)


class _SqueezeExcite(__import__("torch").nn.Module):
    """A convolution whose result scales a larger tensor (squeeze-and-excitation, as in RegNet and
    EfficientNet): a pooled [1, C, 1, 1] attention broadcast over the [1, C, H, W] features."""

    def __init__(self):
        import torch

        super().__init__()
        self.features = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.squeeze = torch.nn.Conv2d(8, 4, 1)
        self.excite = torch.nn.Conv2d(4, 8, 1)

    def forward(self, x):
        import torch

        h = torch.relu(self.features(x))   # features in the convolutions' layout: the mul fuses
        a = torch.sigmoid(self.excite(torch.relu(self.squeeze(torch.nn.functional.adaptive_avg_pool2d(h, 1)))))
        return h * a


@pytest.mark.parametrize("target", ["rngd", "tiny"])
def test_an_epilogue_that_broadcasts_the_result_is_its_own_kernel(target):
    """The fused region (excite conv -> sigmoid -> mul with the features) has an epilogue larger
    than the convolution's output: the generator refuses it with the reason, the region is split,
    and every piece runs on the chip (before: a kernel whose output was the conv's size)."""
    import torch

    torch.manual_seed(0)
    m, x = _SqueezeExcite().eval(), torch.randn(1, 3, 6, 5)
    cm = fexplore.compile(m, (x,), target=target)
    assert cm["lower"].stats["host_ops"] == 0 and cm["lower"].stats["split_regions"] == 1
    np.testing.assert_allclose(cm(x).numpy(), m(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_cnn_on_the_meta_device_folds_its_batch_norms_and_runs_no_host_op():
    """Without weights the batch norms still fold into their convolutions (on structure alone),
    as they do with weights; before, every batch norm of a meta-device ResNet was a host op."""
    import torch

    from fexplore.models.cnn import resnet_cnn

    model, (x,) = resnet_cnn(channels=8, blocks=2, image_size=32, batch=1)
    with_weights = fexplore.compile(model, (x,), precision="bf16", verify=False)
    meta = fexplore.compile(model.to("meta"), (x.to("meta"),), precision="bf16")
    assert meta["fold"].stats["conv_batchnorm_folded"] == with_weights["fold"].stats["conv_batchnorm_folded"] > 0
    assert meta["lower"].stats["host_ops"] == 0
    assert meta.simulate().cycles > 0 and torch.device("meta") == next(model.parameters()).device


@pytest.mark.parametrize("a_shape, b_shape", [((4,), (2, 4, 3)), ((2, 3, 4), (4,)), ((5, 4), (4,)), ((4,), (4,)),
                                              ((4,), (4, 6))])
def test_a_matmul_with_a_vector_operand_runs_on_the_chip(a_shape, b_shape):
    """torch.matmul's vector cases (ONNX's MatMul 1d x 3d, addmv): the contraction kernel read the
    vector as a matrix of another shape and did not trace, so the node went to the host. simplify
    makes the vector a row or a column and drops the axis from the result again."""
    class MatMul(torch.nn.Module):
        def forward(self, a, b):
            return torch.matmul(a, b) * 2

    a, b = torch.randn(a_shape), torch.randn(b_shape)
    cm = fexplore.compile(MatMul(), (a, b))
    assert cm.verification["ok"].all()
    assert not cm.lowering.host_ops and not cm["lower"].stats.get("codegen_bugs")
    assert "vector-matmul-as-matrix" in cm["simplify"].stats["rules_fired"]
    torch.testing.assert_close(cm(a, b), MatMul()(a, b))


def test_an_integer_matmul_is_an_explicit_host_op_not_a_codegen_bug():
    """The tensor unit takes no i64 (nor i32, u8) operands: the generator says so, and the node is
    a host op with that reason (it raised a ConfigError before, a codegen bug)."""
    class Bmm(torch.nn.Module):
        def forward(self, a, b):
            return torch.bmm(a, b)

    a, b = torch.randint(-5, 5, (2, 3, 4)), torch.randint(-5, 5, (2, 4, 5))
    cm = fexplore.compile(Bmm(), (a, b))
    assert not cm["lower"].stats.get("codegen_bugs")
    (host,) = cm.lowering.host_ops
    assert "no i64 rate" in host.reason
    assert torch.equal(cm(a, b), Bmm()(a, b))



def test_a_kernel_whose_trace_passes_the_op_limit_is_a_host_op_with_that_reason(monkeypatch):
    """A kernel too big to trace (FK171) is refused, not called a codegen bug: its region is split
    and what still passes the limit runs on the host, saying why; the rest stays on the chip."""
    import fexplore.lang.tracer as tracer

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = torch.nn.Linear(64, 512), torch.nn.Linear(512, 8)

        def forward(self, x):
            return self.down(torch.relu(self.up(x)))

    torch.manual_seed(0)
    model, x = Mlp().eval(), torch.randn(64, 64)
    # each kernel's ops at its default tiles, as the lower stage traces it (the schedule retiles)
    lowered = fexplore.explore(model, (x,), target="tiny")["lower"].lowering
    ops = sorted(len(k.traced.last_trace.ops) for k in lowered.kernels)
    assert len(ops) == 3 and ops[-2] < ops[-1]
    monkeypatch.setattr(tracer, "MAX_TRACE_OPS", ops[-1] - 1)   # only the biggest passes it
    cm = fexplore.compile(model, (x,), target="tiny")
    assert not cm["lower"].stats.get("codegen_bugs")
    (host,) = cm.lowering.host_ops
    assert host.reason.startswith("[FK171]") and f"more than {ops[-1] - 1:,} ops" in host.reason
    assert len(cm.lowering.kernels) == 2   # the kernels under the limit still run on the chip
    torch.testing.assert_close(cm(x), model(x), atol=1e-4, rtol=1e-4)

def test_codegen_bugs_lists_a_generator_that_raised_whose_node_ran_on_the_host(softmax_generator_raises):
    """A generator that raises is a bug of fexplore, not a refusal: the node still runs (on the
    host, right), and CompiledModel.codegen_bugs names it for the harnesses and the user."""
    class Soft(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x * 2, -1)

    x = torch.randn(3, 5)
    cm = fexplore.compile(Soft(), (x,))
    # the region, then the op it was split down to
    assert cm.codegen_bugs and all("softmax" in b and "AttributeError" in b for b in cm.codegen_bugs)
    assert len(cm.lowering.host_ops) == 1
    torch.testing.assert_close(cm(x), Soft()(x))


class _NegativeScaleAttention(torch.nn.Module):
    """sdpa takes any scale: here q * -1.5 (which simplify folds into the scale) under a float
    causal mask, and an explicit negative scale under a boolean one (fuzz seed 2250575)."""

    def forward(self, x, y):
        s = x.shape[1]
        causal = torch.zeros(s, s).masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        a = torch.nn.functional.scaled_dot_product_attention(x * -1.5, -x, -x, attn_mask=causal)
        keep = torch.ones(s, s, dtype=torch.bool).tril()
        return a, torch.nn.functional.scaled_dot_product_attention(y, a, a, attn_mask=keep, scale=-0.3)


@pytest.mark.parametrize("target,precision", [("rngd", "fp32"), ("tiny", "bf16")])
def test_attention_with_a_negative_scale_keeps_its_masked_keys_masked(target, precision):
    """The masks write -inf into the raw scores; a negative scale applied after them made those
    +inf (every masked key won the softmax: inf in the output). The sign goes on q, exactly."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(1, 40, 16, generator=g), torch.randn(1, 40, 16, generator=g)
    cm = fexplore.compile(_NegativeScaleAttention(), (x, y), target=target, precision=precision)
    assert cm.verification["ok"].all() and not cm.lowering.host_ops
    tol = 3e-2 if precision == "bf16" else 1e-5
    for got, want in zip(cm(x, y), _NegativeScaleAttention()(x, y)):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


class _FewQueriesExportedKeys(torch.nn.Module):
    """Causal attention with fewer queries than keys, over keys computed in its region and read
    after it too (fuzz seed 2270271): top-left causal, no query sees the last keys."""

    def forward(self, x, y):
        k = x - y
        return torch.nn.functional.scaled_dot_product_attention(x[:, 0::3], k, k, is_causal=True), k.select(2, 0)


def test_keys_a_causal_attention_never_visits_are_not_exported_from_its_kernel():
    """The kernel leaves out the key blocks after the last query, so keys it also exports were never stored
    there (a codegen bug behind a host fallback): such a region is refused by name and split."""
    x, y = torch.randn(1, 4, 6), torch.randn(1, 4, 1)
    cm = fexplore.compile(_FewQueriesExportedKeys(), (x, y))
    assert cm.verification["ok"].all()
    assert not cm.lowering.host_ops and not cm["lower"].stats.get("codegen_bugs")
    for got, want in zip(cm(x, y), _FewQueriesExportedKeys()(x, y)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
