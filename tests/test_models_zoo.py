"""The model zoo: every factory builds, is deterministic, runs, and exports to an equal program."""

from __future__ import annotations

import pytest
import torch

from fexplore.errors import ConfigError
from fexplore.models import DYNAMIC_SEQ, ZOO, llama_prefill_cache
from fexplore.models.gpt import gpt
from fexplore.models.llama import llama, llama_decode_step

# Raised inside torch.export's own pytree handling on torch 2.13; nothing the zoo can change.
pytestmark = pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)`:FutureWarning")

NAMES = sorted(ZOO)

# Output shapes at the factories' default sizes.
EXPECTED_SHAPES = {
    "mlp": [(4, 16)],
    "cnn": [(2, 10)],
    "gpt": [(1, 16, 128)],
    "llama": [(1, 16, 128)],
    # logits, then caches one longer than past_len=8: (layers, batch, kv_heads, 9, head_dim)
    "llama_decode": [(1, 1, 128), (2, 1, 2, 9, 16), (2, 1, 2, 9, 16)],
    "vit": [(2, 10)],
    "vla": [(1, 4, 7)],
}


def _as_list(out) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _run(model, inputs):
    with torch.no_grad():
        return model(*inputs)


@pytest.fixture(scope="module")
def exported():
    """``exported(name)`` -> the decomposed ExportedProgram of ``ZOO[name]()``, built once per run."""
    cache: dict[str, torch.export.ExportedProgram] = {}

    def get(name: str) -> torch.export.ExportedProgram:
        if name not in cache:
            model, inputs = ZOO[name]()
            ep = torch.export.export(model, inputs, strict=False)
            cache[name] = ep.run_decompositions()
        return cache[name]

    return get


def test_zoo_has_the_documented_names():
    assert set(ZOO) == {"mlp", "cnn", "gpt", "llama", "llama_decode", "vit", "vla"}
    assert set(DYNAMIC_SEQ) == {"gpt", "llama"}
    assert set(EXPECTED_SHAPES) == set(ZOO)


@pytest.mark.parametrize("name", NAMES)
def test_factory_builds_an_eval_model_with_finite_outputs_of_the_right_shape(name):
    model, inputs = ZOO[name]()
    assert isinstance(inputs, tuple) and all(isinstance(t, torch.Tensor) for t in inputs)
    assert not any(m.training for m in model.modules())
    outputs = _as_list(_run(model, inputs))
    assert [tuple(o.shape) for o in outputs] == EXPECTED_SHAPES[name]
    for o in outputs:
        assert o.dtype == torch.float32
        assert torch.isfinite(o).all()
        assert o.abs().max() > 0


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_model_and_inputs_other_seed_different(name):
    a, inputs_a = ZOO[name](seed=0)
    b, inputs_b = ZOO[name](seed=0)
    c, inputs_c = ZOO[name](seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys() == sc.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key
        if sa[key].is_floating_point():  # every weight, embedding and BatchNorm statistic
            assert not torch.equal(sa[key], sc[key]), key
    for x, y in zip(inputs_a, inputs_b, strict=True):
        assert torch.equal(x, y)
    assert any(not torch.equal(x, z) for x, z in zip(inputs_a, inputs_c, strict=True))
    for x, y in zip(_as_list(_run(a, inputs_a)), _as_list(_run(b, inputs_b)), strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("name", NAMES)
def test_factories_leave_the_global_rng_alone(name):
    before = torch.get_rng_state()
    ZOO[name]()
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("name", NAMES)
def test_decomposed_export_equals_eager(name, exported):
    ep = exported(name)
    model, inputs = ZOO[name]()
    torch.testing.assert_close(ep.module()(*inputs), _run(model, inputs))
    # Other input values through the same program: nothing about the example inputs was baked in.
    _, other_inputs = ZOO[name](seed=1)
    torch.testing.assert_close(ep.module()(*other_inputs), _run(model, other_inputs))


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_dynamic_seq_export_runs_at_several_lengths(name):
    # One layer: symbolic tracing and decomposition cost scale with depth, and every layer is alike.
    model, inputs = ZOO[name](layers=1)
    dynamic_shapes = DYNAMIC_SEQ[name](model)
    seq = dynamic_shapes[0][1]
    assert seq.__name__ == "seq" and seq.min == 2
    # gpt stops one short of max_seq: see fexplore.models.gpt_dynamic_seq
    assert seq.max == model.config.max_seq - (1 if name == "gpt" else 0)
    ep = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes, strict=False)
    ep = ep.run_decompositions()
    (token_range,) = ep.range_constraints.values()
    assert (token_range.lower, token_range.upper) == (2, seq.max)
    generator = torch.Generator().manual_seed(7)
    for length in (8, 16, seq.max):
        token_ids = torch.randint(0, model.config.vocab, (1, length), generator=generator)
        out = ep.module()(token_ids)
        assert out.shape == (1, length, model.config.vocab)
        torch.testing.assert_close(out, _run(model, (token_ids,)))


def test_llama_decode_steps_agree_with_the_full_sequence_model():
    sizes = dict(layers=2, width=64, heads=4, kv_heads=2, batch=2, seq_len=12)
    full, (tokens,) = llama(**sizes)
    T = tokens.shape[1]
    decode, _ = llama_decode_step(past_len=T - 2, **{k: v for k, v in sizes.items() if k != "seq_len"})
    # Same seed and sizes -> the same weights, so prefill and decode describe one model.
    for key, value in full.state_dict().items():
        assert torch.equal(decode.state_dict()["llama." + key], value), key

    expected_logits = _run(full, (tokens,))
    k_cache, v_cache = llama_prefill_cache(full, tokens[:, : T - 2])
    assert k_cache.shape == (2, 2, 2, T - 2, 16)
    # Two steps, so the second reads a cache the first grew; positions per sequence, then a scalar.
    for t, position in ((T - 2, torch.full((tokens.shape[0],), T - 2)), (T - 1, torch.tensor(T - 1))):
        logits, k_cache, v_cache = _run(decode, (tokens[:, t : t + 1], position, k_cache, v_cache))
        torch.testing.assert_close(logits[:, 0], expected_logits[:, t])
    full_k, full_v = llama_prefill_cache(decode, tokens)
    torch.testing.assert_close(k_cache, full_k)
    torch.testing.assert_close(v_cache, full_v)


def test_exported_decode_step_continues_a_real_prompt(exported):
    full, (tokens,) = llama()
    decode, _ = llama_decode_step()  # past_len=8, the shape the exported program was traced at
    k_cache, v_cache = llama_prefill_cache(full, tokens[:, :8])
    position = torch.tensor([8])
    logits, _, _ = exported("llama_decode").module()(tokens[:, 8:9], position, k_cache, v_cache)
    torch.testing.assert_close(logits[:, 0], _run(full, (tokens[:, :9],))[:, 8])


def test_gpt_lm_head_is_tied_and_mask_is_causal():
    model, (tokens,) = gpt()
    assert model.lm_head.weight is model.wte.weight
    # Changing a later token must not change earlier logits.
    changed = tokens.clone()
    changed[0, -1] = (changed[0, -1] + 1) % model.config.vocab
    a, b = _run(model, (tokens,)), _run(model, (changed,))
    torch.testing.assert_close(a[:, :-1], b[:, :-1])
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_cnn_batchnorms_are_not_the_identity():
    model, _ = ZOO["cnn"]()
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(bns) == 6  # stem, 2 per block, 1 on the projected skip
    for bn in bns:
        assert bn.running_mean.abs().min() > 0
        assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
        assert not torch.allclose(bn.weight, torch.ones_like(bn.weight))


@pytest.mark.parametrize("factory, sizes", [
    (gpt, dict(width=66, heads=4)),
    (gpt, dict(seq_len=65, max_seq=64)),
    (llama, dict(heads=4, kv_heads=3)),
    (llama_decode_step, dict(past_len=64, max_seq=64)),
    (ZOO["vit"], dict(image_size=30, patch=8)),
    (ZOO["mlp"], dict(activation="tanh")),
])
def test_invalid_sizes_raise_config_errors(factory, sizes):
    with pytest.raises(ConfigError):
        factory(**sizes)
