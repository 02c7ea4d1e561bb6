"""Acceptance: every zoo model compiles, matches eager, verifies after every stage, and every
stage's graph round-trips through its text form. The user's model is never changed."""

import pytest
import torch
import torch.utils._pytree as pytree

import fexplore
from fexplore import ir
from fexplore.models import ZOO


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_compiles_and_matches_eager(name, zoo_compiled):
    model, inputs, cm = zoo_compiled(name)
    with torch.no_grad():
        want = model(*inputs)
    got = cm(*inputs)
    want_leaves, want_spec = pytree.tree_flatten(want)
    got_leaves, got_spec = pytree.tree_flatten(got)
    assert got_spec == want_spec  # same output structure (tuples, dicts...)
    for g, w in zip(got_leaves, want_leaves):
        torch.testing.assert_close(g, w, rtol=1.3e-6, atol=2e-5)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_verification_after_every_stage(name, zoo_compiled):
    _, _, cm = zoo_compiled(name)
    table = cm.verification
    assert list(table["stage"]) == [r.name for r in cm.stages]
    assert table["ok"].all(), table
    assert table["structural"].all()
    assert (table["input_sets"] >= 2).all()  # example inputs plus fresh random ones
    assert (table["max_abs_err"] < 1e-3).all()
    assert "codegen_bugs" not in cm["lower"].stats   # no generator failure hidden by a fallback


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_every_stage_round_trips_through_text(name, zoo_compiled):
    _, _, cm = zoo_compiled(name)
    for rec in cm.stages:
        g = rec.after
        text = str(g)
        back = ir.parse(text)
        assert ir.graph_diff(g, back) is None
        assert back == g
        assert str(back) == text
        # bound to the same payloads, the parsed graph computes the same thing
        ir.verify(back.bind(g.payloads))


@pytest.mark.parametrize("name", ["gpt", "cnn", "llama"])
def test_compile_leaves_the_user_model_unchanged(name):
    model, inputs = ZOO[name]()
    model.train(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ptrs = {k: v.data_ptr() for k, v in model.state_dict().items()}
    flags = [m.training for m in model.modules()]
    fexplore.compile(model, inputs)
    after = model.state_dict()
    assert before.keys() == after.keys()
    for k in before:
        assert torch.equal(before[k], after[k]), k
        assert after[k].data_ptr() == ptrs[k], k  # same storage: nothing replaced either
    assert [m.training for m in model.modules()] == flags


def test_constants_share_the_models_storage(zoo_compiled):
    model, _, cm = zoo_compiled("mlp")
    g = cm.stages[0].after
    by_source = {c.source: c for c in g.constants}
    for name, p in model.named_parameters():
        c = by_source[name]
        assert c.payload.ctypes.data == p.data_ptr()  # shared, not copied
        assert not c.payload.flags.writeable  # and read-only from our side


def test_nodes_carry_user_source_lines_and_module_paths(zoo_compiled):
    _, _, cm = zoo_compiled("gpt")
    g = cm.stages[0].after
    linears = [n for n in g.nodes if n.op.name == "linear"]
    assert linears
    for n in linears:
        assert n.loc.file.endswith("gpt.py")  # the model's line, not torch.nn's
        assert n.loc.line > 0
    modules = {n.loc.module for n in linears}
    assert "h.0.attn.c_attn" in modules and "lm_head" in modules


def test_kept_intent_ops_arrive_whole(zoo_compiled):
    """linear, layer_norm, softmax, gelu, conv2d are not decomposed into primitives."""
    def ingested_ops(name):
        return set(zoo_compiled(name)[2].stages[0].after.op_counts())

    assert {"linear", "layer_norm", "softmax", "gelu", "matmul"} <= ingested_ops("gpt")
    assert "attention" in ingested_ops("llama")
    cnn_ops = ingested_ops("cnn")
    assert {"conv2d", "batch_norm", "max_pool2d", "adaptive_avg_pool2d", "linear"} <= cnn_ops


def test_compiled_model_rejects_wrong_inputs(zoo_compiled):
    _, inputs, cm = zoo_compiled("mlp")
    with pytest.raises(fexplore.errors.InputError, match="shape"):
        cm(torch.randn(3, 5))
    with pytest.raises(fexplore.errors.InputError, match="structure"):
        cm(inputs[0], inputs[0])
    with pytest.raises(fexplore.errors.InputError, match="f32"):
        cm(inputs[0].double())


def test_demo_prints_a_readable_summary(capsys):
    from fexplore.cli import main

    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "ingest" in out and "✓" in out
    assert "linear" in out and "max |compiled - eager|" in out


def test_compiled_model_indexes_its_stages_by_name(zoo_compiled):
    cm = zoo_compiled("mlp")[2]
    assert cm["fusion"] is next(r for r in cm.stages if r.name == "fusion")
    with pytest.raises(KeyError, match="stages are"):
        cm["nope"]
