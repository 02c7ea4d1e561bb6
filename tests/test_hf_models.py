"""Real models from the ecosystem: Hugging Face ``transformers`` architectures, each built from a
tiny config with random weights (nothing is downloaded), compiled through every stage.

For each model, on both targets (rngd, and tiny whose small SRAM forces tiling) and in fp32 and
bf16: every stage verifies (structure, and numbers against eager on the example inputs and fresh
random ones), the compiled model matches eager (bf16 within bf16's tolerance), and every stage's
graph round-trips through its text. Random-init networks can output
near-zero values that any comparison would pass, so the outputs' spread is asserted, and the
convolutional nets get variance-preserving weights and non-trivial batch-norm statistics.
"""

from __future__ import annotations

import copy
import inspect
import math

import re
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree
import transformers as T
from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model

import fexplore
from fexplore import cli, ir, lang
from variants import explored, matrix, matrix_params

VOCAB = 96
SEQ = 8


def _ids(s: int = SEQ, b: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, s))


class Out(torch.nn.Module):
    """Runs a Hugging Face model and returns plain tensors: one field of its output (or several)."""

    def __init__(self, model, *fields: str):
        super().__init__()
        self.model = model
        self.fields = fields or ("logits",)

    def forward(self, *args):
        out = self.model(*args)
        got = tuple(out[f] for f in self.fields)
        return got[0] if len(got) == 1 else got


def _llm(cls, config_cls, **extra):
    cfg = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
               use_cache=False)
    cfg.update(extra)
    return Out(cls(config_cls(**cfg)).eval()), (_ids(),)


def _conditioned(model: torch.nn.Module) -> torch.nn.Module:
    """Variance-preserving conv/linear weights and batch norms with real statistics: a deep
    random-init CNN otherwise outputs values near zero, which any comparison passes."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) / math.sqrt(fan_in))
                if m.bias is not None:
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
            elif isinstance(m, torch.nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(0.2 * torch.randn(n, generator=g))
                m.running_var.copy_(0.5 + torch.rand(n, generator=g))
                m.weight.copy_(0.5 + torch.rand(n, generator=g))
                m.bias.copy_(0.1 * torch.randn(n, generator=g))
    return model.eval()


# -- decoder LLMs -------------------------------------------------------------------------------

def gpt2():
    c = T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                     use_cache=False, bos_token_id=0, eos_token_id=0)
    return Out(T.GPT2LMHeadModel(c).eval()), (_ids(),)


def llama():
    return _llm(T.LlamaForCausalLM, T.LlamaConfig)


class WithMask(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        return self.model(input_ids=ids, attention_mask=mask).logits


def llama_left_padded():  # a batch of two, the first left-padded: padding queries see nothing
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[0, :3] = 0
    return WithMask(_llm(T.LlamaForCausalLM, T.LlamaConfig)[0].model), (_ids(b=2), mask)


def qwen2():
    return _llm(T.Qwen2ForCausalLM, T.Qwen2Config)


def qwen3():
    return _llm(T.Qwen3ForCausalLM, T.Qwen3Config, head_dim=8)


def mistral():
    return _llm(T.MistralForCausalLM, T.MistralConfig, sliding_window=4)


def phi():
    return _llm(T.PhiForCausalLM, T.PhiConfig)


def phi3():
    return _llm(T.Phi3ForCausalLM, T.Phi3Config, pad_token_id=0)


def gemma():
    return _llm(T.GemmaForCausalLM, T.GemmaConfig, head_dim=8)


def gemma2():
    return _llm(T.Gemma2ForCausalLM, T.Gemma2Config, head_dim=8, sliding_window=4)


def olmo():
    return _llm(T.OlmoForCausalLM, T.OlmoConfig, pad_token_id=0)


def starcoder2():
    return _llm(T.Starcoder2ForCausalLM, T.Starcoder2Config)


def gpt_neox():
    c = T.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=64, use_cache=False)
    return Out(T.GPTNeoXForCausalLM(c).eval()), (_ids(),)


def gptj():
    c = T.GPTJConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                     n_positions=64, use_cache=False, bos_token_id=0, eos_token_id=0)
    return Out(T.GPTJForCausalLM(c).eval()), (_ids(),)


def falcon():  # multi-query attention: one key/value head broadcast over the query heads
    c = T.FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, use_cache=False)
    return Out(T.FalconForCausalLM(c).eval()), (_ids(),)


def bloom():  # ALiBi positions
    c = T.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4, use_cache=False)
    return Out(T.BloomForCausalLM(c).eval()), (_ids(),)


def opt():
    c = T.OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                    num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32,
                    use_cache=False)
    return Out(T.OPTForCausalLM(c).eval()), (_ids(),)


def gpt_bigcode():  # multi-query attention, fused qkv
    c = T.GPTBigCodeConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                           multi_query=True, use_cache=False)
    return Out(T.GPTBigCodeForCausalLM(c).eval()), (_ids(),)


# decoder blocks built otherwise than Llama's: each exercises a path the ones above do not

def cohere():  # attention and MLP in parallel off one LayerNorm (no bias), logits scaled
    return _llm(T.CohereForCausalLM, T.CohereConfig, logit_scale=1.0)


def olmo2():  # RMSNorm of the whole q and k projections, norms after attention and MLP
    return _llm(T.Olmo2ForCausalLM, T.Olmo2Config, pad_token_id=0)


def nemotron():  # LayerNorm1P (weight + 1), squared-ReLU MLP without a gate, partial rotary
    return _llm(T.NemotronForCausalLM, T.NemotronConfig)


def diffllama():  # differential attention: two softmaxes of split heads, subtracted with a learnt λ
    return _llm(T.DiffLlamaForCausalLM, T.DiffLlamaConfig)


def lfm2():  # a hybrid: gated short causal convolutions between attention layers
    return _llm(T.Lfm2ForCausalLM, T.Lfm2Config)


def mpt():  # ALiBi: a per-head linear bias on the scores instead of positions
    return _llm(T.MptForCausalLM, T.MptConfig)


def xglm():  # sinusoidal positions made in forward, a scaled embedding
    return _llm(T.XGLMForCausalLM, T.XGLMConfig)


def gemma3():  # q and k norms, local sliding-window layers beside global ones
    return _llm(T.Gemma3ForCausalLM, T.Gemma3TextConfig, head_dim=8, sliding_window=4, pad_token_id=0)


# -- mixture of experts: transformers' default expert kernel (tokens sorted by expert, counted
# with histc, one grouped matmul) and its batched_mm one (each token gathers its experts' weights)

def mixtral():
    return _llm(T.MixtralForCausalLM, T.MixtralConfig, num_local_experts=4, num_experts_per_tok=2)


def mixtral_batched_mm():
    return _llm(T.MixtralForCausalLM, T.MixtralConfig, num_local_experts=4, num_experts_per_tok=2,
                experts_implementation="batched_mm")


def qwen2_moe():
    return _llm(T.Qwen2MoeForCausalLM, T.Qwen2MoeConfig, num_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=32, shared_expert_intermediate_size=32)


def phimoe():  # sparsemixer routing: the second expert picked with the first masked out
    return _llm(T.PhimoeForCausalLM, T.PhimoeConfig, num_local_experts=4, num_experts_per_tok=2)


def olmoe():  # top-k routing without renormalized weights, q and k norms
    return _llm(T.OlmoeForCausalLM, T.OlmoeConfig, num_experts=4, num_experts_per_tok=2)


def deepseek_v3():  # multi-head latent attention, grouped top-k routing, a shared expert
    return _llm(T.DeepseekV3ForCausalLM, T.DeepseekV3Config, num_key_value_heads=4,
                moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
                topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16,
                qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8)


# -- state-space and recurrent models --------------------------------------------------------------

def mamba():
    c = T.MambaConfig(vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=1,
                      expand=2, conv_kernel=4, use_cache=False)
    return Out(T.MambaForCausalLM(c).eval()), (_ids(),)


def rwkv():
    c = T.RwkvConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                     attention_hidden_size=32, intermediate_size=64, context_length=16,
                     use_cache=False)
    model = T.RwkvForCausalLM(c).eval()
    with torch.no_grad():  # RWKV rescales its weights in place on its first inference call
        model(_ids(4))
    return Out(model), (_ids(4),)  # its time mixing runs token by token: a short sequence


# -- a decode step on a real KV cache -------------------------------------------------------------

def _cache_keyword(model) -> str:
    """transformers 5 renames past_key_values to cache; either way the output's field 1."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class DecodeStep(torch.nn.Module):
    """One token on top of a prompt's cache: (logits, the updated DynamicCache)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, cache):
        out = self.model(ids, use_cache=True, **{_cache_keyword(self.model): cache})
        return out.logits, out[1]


def llama_decode_dynamic_cache():
    """A DynamicCache in and out, as transformers' own torch.export support registers it."""
    m = _llm(T.LlamaForCausalLM, T.LlamaConfig, use_cache=True)[0].model
    register_cache_pytrees_for_model(m)
    with torch.no_grad():
        cache = m(_ids(), use_cache=True)[1]
    return DecodeStep(m), (_ids(1), cache)


class TensorCacheDecodeStep(torch.nn.Module):
    """The cache as stacked tensors (layers, batch, kv heads, positions, head dim), the way a
    serving stack keeps it: (logits, keys, values) with the new position appended."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, keys, values):
        cache = T.DynamicCache(config=self.model.config)
        for i in range(keys.shape[0]):
            cache.update(keys[i], values[i], i)
        out = self.model(ids, use_cache=True, **{_cache_keyword(self.model): cache})
        layers = out[1].layers
        return (out.logits, torch.stack([c.keys for c in layers]),
                torch.stack([c.values for c in layers]))


def qwen2_decode_tensor_cache():
    m = _llm(T.Qwen2ForCausalLM, T.Qwen2Config, use_cache=True)[0].model
    with torch.no_grad():
        layers = m(_ids(), use_cache=True)[1].layers
    keys = torch.stack([c.keys for c in layers])
    values = torch.stack([c.values for c in layers])
    return TensorCacheDecodeStep(m), (_ids(1), keys, values)


# -- encoders -------------------------------------------------------------------------------------

_ENC = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64)


def bert():  # with a padding mask
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[1, -3:] = 0
    return Out(T.BertModel(T.BertConfig(**_ENC)).eval(), "last_hidden_state"), (_ids(b=2), mask)


def roberta():
    return Out(T.RobertaModel(T.RobertaConfig(**_ENC, pad_token_id=1)).eval(),
               "last_hidden_state"), (_ids(),)


def distilbert():
    c = T.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                           max_position_embeddings=64)
    return Out(T.DistilBertModel(c).eval(), "last_hidden_state"), (_ids(),)


def albert():
    return Out(T.AlbertModel(T.AlbertConfig(**_ENC, embedding_size=16)).eval(),
               "last_hidden_state"), (_ids(),)


def deberta_v2():  # disentangled relative-position attention
    c = T.DebertaV2Config(**_ENC, relative_attention=True, position_buckets=16,
                          pos_att_type=["p2c", "c2p"])
    return Out(T.DebertaV2Model(c).eval(), "last_hidden_state"), (_ids(),)


def fnet():  # token mixing by the real part of a 2-D Fourier transform, no attention
    c = T.FNetConfig(**{k: v for k, v in _ENC.items() if k != "num_attention_heads"},
                     use_tpu_fourier_optimizations=False)
    return Out(T.FNetModel(c).eval(), "last_hidden_state"), (_ids(),)


# -- vision ---------------------------------------------------------------------------------------

def _image(size: int = 32) -> torch.Tensor:
    return torch.randn(1, 3, size, size)


_VIT = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=64)


def vit():
    return Out(T.ViTForImageClassification(T.ViTConfig(**_VIT, num_labels=10)).eval()), (_image(),)


def deit():
    return Out(T.DeiTModel(T.DeiTConfig(**_VIT)).eval(), "last_hidden_state"), (_image(),)


def dinov2():
    c = T.Dinov2Config(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, mlp_ratio=2)
    return Out(T.Dinov2Model(c).eval(), "last_hidden_state"), (_image(),)


def swin():
    c = T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                     window_size=4, num_labels=10)
    return Out(T.SwinForImageClassification(c).eval()), (_image(),)


def convnext():
    c = T.ConvNextConfig(num_channels=3, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1],
                         num_labels=10)
    return Out(_conditioned(T.ConvNextForImageClassification(c))), (_image(),)


def resnet():
    c = T.ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                       layer_type="bottleneck", num_labels=10)
    return Out(_conditioned(T.ResNetForImageClassification(c))), (_image(),)


def bit():  # weight-standardized convolutions (batch norm over the weights' own statistics)
    c = T.BitConfig(embedding_size=32, hidden_sizes=[32, 64], depths=[1, 1], num_groups=8,
                    layer_type="preactivation", global_padding="SAME", num_labels=10)
    return Out(T.BitForImageClassification(c).eval()), (_image(),)


def segformer():  # overlapping patch embeddings, efficient attention, an upsampling decode head
    c = T.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                          hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                          decoder_hidden_size=32, patch_sizes=[7, 3], strides=[4, 2],
                          mlp_ratios=[2, 2], num_labels=4)
    return Out(_conditioned(T.SegformerForSemanticSegmentation(c))), (_image(),)


def upernet():  # pyramid pooling over a 2x2 map into 1, 2, 3 and 6 bins (3 and 6 do not divide it)
    backbone = T.ConvNextConfig(num_channels=3, num_stages=4, hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1],
                                out_features=["stage1", "stage2", "stage3", "stage4"])
    c = T.UperNetConfig(backbone_config=backbone, hidden_size=16, use_auxiliary_head=False, num_labels=4,
                        pool_scales=[1, 2, 3, 6])
    return Out(_conditioned(T.UperNetForSemanticSegmentation(c))), (_image(64),)


# -- speech ---------------------------------------------------------------------------------------

def whisper():  # encoder over mel features, and a decoder step over its output
    c = T.WhisperConfig(vocab_size=VOCAB, num_mel_bins=16, d_model=32, encoder_layers=1,
                        decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                        encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=16,
                        max_target_positions=16, pad_token_id=0, bos_token_id=1,
                        eos_token_id=2, decoder_start_token_id=1, use_cache=False)
    return (Out(T.WhisperForConditionalGeneration(c).eval()),
            (torch.randn(1, 16, 32), None, _ids(4)))


_W2V = dict(vocab_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
            intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
            num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4)


def wav2vec2():
    c = T.Wav2Vec2Config(**_W2V, do_stable_layer_norm=True, feat_extract_norm="layer")
    return Out(T.Wav2Vec2ForCTC(c).eval()), (torch.randn(1, 400),)


def hubert():  # group-norm feature extractor
    return Out(T.HubertModel(T.HubertConfig(**_W2V)).eval(), "last_hidden_state"), \
        (torch.randn(1, 400),)


# -- multimodal -----------------------------------------------------------------------------------

def clip():
    text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=4, max_position_embeddings=16)
    vision = dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
                  num_hidden_layers=1, num_attention_heads=4)
    c = T.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    return Out(T.CLIPModel(c).eval(), "logits_per_image", "text_embeds", "image_embeds"), \
        (_ids(b=2), _image())


IMAGE_TOKEN = 100


class ImagePrompt(torch.nn.Module):
    """A LLaVA prompt: two text tokens, the image's placeholder tokens, then the rest of the text.
    (Built inside the model, so fresh random token ids keep the placeholder count right.)"""

    def __init__(self, model, image_tokens: int):
        super().__init__()
        self.model = model
        self.image_tokens = image_tokens

    def forward(self, text, pixels):
        img = torch.full((text.shape[0], self.image_tokens), IMAGE_TOKEN, dtype=text.dtype)
        ids = torch.cat([text[:, :2], img, text[:, 2:]], dim=1)
        return self.model(ids, pixels).logits


def llava():
    vision = T.CLIPVisionConfig(image_size=16, patch_size=8, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=1, num_attention_heads=4)
    text = T.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    c = T.LlavaConfig(vision_config=vision, text_config=text, image_token_id=IMAGE_TOKEN,
                      vision_feature_layer=-1, image_seq_length=4)
    return ImagePrompt(T.LlavaForConditionalGeneration(c).eval(), 4), (_ids(6), _image(16))


# -- encoder-decoder ------------------------------------------------------------------------------

def t5():
    c = T.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                   num_decoder_layers=1, num_heads=4, use_cache=False)
    return Out(T.T5ForConditionalGeneration(c).eval()), (_ids(), None, _ids(4))


class EncoderDecoderStep(torch.nn.Module):
    """One decoder token given the encoder's output and an EncoderDecoderCache (self- and
    cross-attention keys and values): (logits, the updated cache)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, encoded, ids, cache):
        out = self.model(encoder_outputs=(encoded,), decoder_input_ids=ids, use_cache=True,
                         **{_cache_keyword(self.model): cache})
        return out.logits, out[1]


def t5_decode_step():
    c = T.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                   num_decoder_layers=1, num_heads=4, use_cache=True)
    m = T.T5ForConditionalGeneration(c).eval()
    register_cache_pytrees_for_model(m)
    with torch.no_grad():
        encoded = m.get_encoder()(_ids()).last_hidden_state
        cache = m(encoder_outputs=(encoded,), decoder_input_ids=_ids(3), use_cache=True)[1]
    return EncoderDecoderStep(m), (encoded, _ids(1), cache)


def bart():
    c = T.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                     decoder_ffn_dim=64, max_position_embeddings=32, use_cache=False)
    return Out(T.BartForConditionalGeneration(c).eval()), (_ids(), None, _ids(4))


FACTORIES = {f.__name__: f for f in [
    # decoder LLMs, mixtures of experts, recurrent models, decode steps on a KV cache
    gpt2, llama, llama_left_padded, qwen2, qwen3, mistral, phi, phi3, gemma, gemma2, olmo,
    starcoder2, gpt_neox, gptj, falcon, bloom, opt, gpt_bigcode, cohere, olmo2, nemotron, diffllama,
    lfm2, mpt, xglm, gemma3, mixtral, mixtral_batched_mm, qwen2_moe, phimoe, olmoe, deepseek_v3, mamba, rwkv, llama_decode_dynamic_cache, qwen2_decode_tensor_cache,
    # encoders, vision, speech, multimodal, encoder-decoders
    bert, roberta, distilbert, albert, deberta_v2, fnet, vit, deit, dinov2, swin, convnext, resnet,
    bit, segformer, upernet, whisper, wav2vec2, hubert, clip, llava, t5, t5_decode_step, bart]}


def build(name):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return FACTORIES[name]()


def _leaves(x):
    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _eager(model, inputs):
    # on a copy: a DynamicCache input grows in place when the model runs
    with torch.no_grad():
        return model(*copy.deepcopy(inputs))


def _assert_spread(want):
    """Outputs a comparison can fail on: finite, and not all (near) one value."""
    for w in _leaves(want):
        if w.dtype.is_floating_point:
            assert torch.isfinite(w).all()
            assert float(w.float().std()) > 1e-2, "near-constant: a comparison proves nothing"


# Each architecture on both targets and in both precisions (the lower stage's acceptance: tiny's
# 64 KiB of SRAM forces real tiling). One export per architecture: its compiles are forks of one
# exploration run through `shapes`, each stepping on from the first stage its options change (tiny
# at layout, bf16 at precision) and checked as a fresh compile is.
#
# `make test` runs each architecture on two of the four variants, both targets and both precisions
# (`variants.matrix`); `make test-full` runs all four.
MATRIX = matrix(sorted(FACTORIES))


@pytest.mark.parametrize("name, target, precision", matrix_params(sorted(FACTORIES)))
def test_hf_model_lowers_verifies_and_runs(name, target, precision):
    ex = explored(("hf", name), lambda: fexplore.explore(*build(name)))   # one export for its variants
    inputs = ex.example_inputs
    want = _eager(ex.model, inputs)
    _assert_spread(want)
    fork = ex.fork(target=target, precision=precision)
    cm = fork.result
    # a generator that raises or writes a kernel the language rejects is a bug the fallbacks hide
    assert not cm["lower"].stats.get("codegen_bugs"), cm["lower"].stats.get("codegen_bugs")
    # every op on the chip: a kernel or a free view, none left to the host
    assert not cm.lowering.host_ops, [(h.op, h.reason) for h in cm.lowering.host_ops]

    table = cm.verification
    assert list(table["stage"]) == [r.name for r in cm.stages]
    assert table["ok"].all() and table["structural"].all(), table
    assert (table["input_sets"] >= 2).all()

    got = cm(*copy.deepcopy(inputs))
    assert pytree.tree_structure(got) == pytree.tree_structure(want)
    errs = []
    for g, w in zip(_leaves(got), _leaves(want)):
        scale = max(1.0, float(w.abs().max()))
        if precision == "fp32":
            torch.testing.assert_close(g, w, rtol=1.3e-6, atol=2e-5 * scale)
        elif w.dtype.is_floating_point:
            err = float((g.float() - w.float()).abs().max())
            assert err <= 0.05 * scale, (err, scale)  # a few bf16 roundings (2^-8 each) deep
            errs.append(err)
    if precision == "bf16":
        assert max(errs) > 0  # the bf16 compile really computed in bf16

    # every stage's graph round-trips through its text (the shared ones once, in the first variant)
    first = next(v for n, *v in MATRIX if n == name)
    for rec in cm.stages if [target, precision] == first else cm.stages[fork.shared:]:
        g = rec.after
        assert ir.parse(str(g), payloads=g.payloads) == g, rec.name



# QK-norm: q and k normalized per head after projecting them (Qwen 3, Gemma 3). The q, k and v
# projections are still one linear, and the attention kernel computes each head's norm as it loads
# q and k from the merged result. OLMo 2 and OLMoE normalize q and k over all heads' width, which
# the attention kernel cannot, so their projections stay apart (a norm reading a slice of the
# merged result would read it through a copy, which costs more than the merge saves).
APART = ("olmo2", "olmoe")


@pytest.mark.parametrize("name, target, precision", [("qwen3", "rngd", "fp32"), ("qwen3", "tiny", "bf16"),
                                                     ("gemma3", "tiny", "bf16"), ("olmoe", "rngd", "bf16"),
                                                     ("olmo2", "rngd", "fp32")])
def test_qk_norms_are_computed_by_the_attention_kernel_of_merged_projections(name, target, precision,
                                                                              monkeypatch):
    import importlib

    model, inputs = build(name)
    cm = fexplore.compile(model, inputs, target=target, precision=precision)
    layers = model.model.config.num_hidden_layers
    merged = [len(r.nodes) for r in cm["fold"].rewrites if r.rule == "merge-parallel-linears"]
    kernels = [k.kernel for k in cm.kernels if k.kernel is not None]
    if name in APART:
        assert merged == [] and any("q_norm" in k.name for k in kernels)
    else:
        assert merged == [3] * layers
        names = [k.name for k in kernels]
        assert not [n for n in names if n.endswith(("q_norm", "k_norm", "q_proj", "k_proj"))], names
        assert not [k.name for k in kernels if k.kind == "movement"]
        attention = [k for k in kernels if k.kind == "attention"]
        assert len(attention) == layers and all("norm" in k.parts for k in attention), [k.parts for k in attention]
    assert not cm.lowering.host_ops and not cm["lower"].stats.get("split_regions")
    assert cm.verification["ok"].all()
    want, got = _eager(model, inputs), cm(*inputs)
    scale = max(1.0, float(want.abs().max()))
    tol = 2e-5 if precision == "fp32" else 0.05
    assert float((got.float() - want).abs().max()) <= tol * scale
    if name not in APART:   # what it bought on the simulated chip: against the projections apart
        fold = importlib.import_module("fexplore.pipeline.stages.fold")
        monkeypatch.setattr(fold, "merge_parallel_linears", lambda g: (g, []))
        apart = fexplore.compile(model, inputs, target=target, precision=precision, verify=False)
        assert len(apart.schedule.kernels) > len(cm.schedule.kernels)
        assert apart.simulate(*inputs).cycles > cm.simulate(*inputs).cycles


@pytest.mark.parametrize("name", ["bert", "olmo2"])
def test_a_norm_read_wide_and_narrow_writes_both_and_leaves_no_cast_kernel(name):
    """A post-norm encoder's layer norm (BERT) and OLMo 2's residual sum are read in f32 by the next
    residual add and in bf16 by the next projections: their kernel writes the rows both ways,
    where a cast kernel read the f32 rows back before."""
    model, inputs = build(name)
    cm = fexplore.compile(model, inputs, target="rngd", precision="bf16")
    copies = [r for r in cm["precision"].rewrites if r.rule == "narrow-copy-at-producer-bf16"]
    assert copies
    casts = [k.name for k in cm.schedule.kernels if k.name.startswith("cast_") and k.how == "generated"]
    made_by_gather = [c for c in casts if "embedding" in c]   # a gather's result: not a row-wise kernel
    assert casts == made_by_gather, casts
    assert cm.verification["ok"].all() and not cm.lowering.host_ops
    want, got = _eager(model, inputs), cm(*inputs)
    assert float((got.float() - want).abs().max()) <= 0.05 * max(1.0, float(want.abs().max()))


# A decoder layer is its projections and its attention, and nothing else on the vector unit but a
# norm two projections share. GPT-2's Conv1D flattens the rows around each matmul (x.view(-1, K) @
# W), and its bias, GELU (tanh form, reading its input three times) and residual add stood behind
# the unflatten as kernels of their own; the parallel blocks of GPT-NeoX, Phi, GPT-J and Falcon
# summed the attention and MLP outputs in a kernel of their own; OPT scaled q before splitting
# the heads, a movement and a vector kernel beside the attention; Gemma's residual add after the
# norm of each projection's result (its sandwich norms) was a kernel apart from that norm; BLOOM's
# attention, written out over batch and heads flattened into one axis for its bmm, was ten kernels.
LEAN_LAYERS = {"gpt2": "_h_", "gpt_neox": "_layers_", "phi": "_layers_", "gptj": "_h_", "falcon": "_h_",
               "opt": "_layers_", "gemma2": "_layers_", "gemma3": "_layers_", "bloom": "_h_"}


@pytest.mark.parametrize("name, target, precision", [("gpt2", "rngd", "bf16"), ("gpt2", "tiny", "fp32"),
                                                     ("gpt_neox", "rngd", "bf16"), ("phi", "tiny", "bf16"),
                                                     ("gptj", "rngd", "fp32"), ("falcon", "tiny", "bf16"),
                                                     ("opt", "rngd", "bf16"), ("gemma2", "tiny", "bf16"),
                                                     ("gemma3", "rngd", "fp32"), ("bloom", "tiny", "bf16")])
def test_a_decoder_layer_is_its_projections_and_attention(name, target, precision):
    model, inputs = build(name)
    cm = fexplore.compile(model, inputs, target=target, precision=precision)
    layers = [k.kernel for k in cm.kernels if k.kernel is not None and LEAN_LAYERS[name] in k.name]
    kinds = [k.kind for k in layers]
    others = [(k.name, k.kind, k.parts) for k in layers if k.kind not in ("contraction", "attention")]
    n = kinds.count("attention")
    assert n == model.model.config.num_hidden_layers and kinds.count("contraction") == 4 * n, kinds
    # (GPT-J's first layer also gathers its rotary table's rows for the positions: movement)
    assert all(kind == "vector" and "norm" in parts or name == "gptj" and "_h_0_" in k for k, kind, parts in others), others
    assert not cm.lowering.host_ops and not cm["lower"].stats.get("split_regions")
    assert cm.verification["ok"].all()
    want, got = _eager(model, inputs), cm(*inputs)
    tol = 2e-5 if precision == "fp32" else 0.05
    assert float((got.float() - want).abs().max()) <= tol * max(1.0, float(want.abs().max()))


# A sequence length decided per call, as a serving stack runs prompts: one compile with the
# sequence axis of the token ids (and mask) dynamic, each length then lowered and scheduled on its
# own, every op on the chip at every length (phi3: a zero-width rotary half of [1, heads, seq, 0])
DYNAMIC_SEQUENCE = ["gpt2", "llama_left_padded", "mixtral", "bert", "deepseek_v3", "phi3"]


def _at_length(inputs, length: int):
    """The inputs at another sequence length: fresh token ids, and a mask whose second row is
    left-padded by a third."""
    g = torch.Generator().manual_seed(length)
    ids = torch.randint(0, VOCAB, (inputs[0].shape[0], length), generator=g)
    if len(inputs) == 1:
        return (ids,)
    mask = torch.ones_like(ids)
    mask[-1, :length // 3] = 0
    return ids, mask


@pytest.mark.parametrize("name", DYNAMIC_SEQUENCE)
def test_hf_model_with_a_dynamic_sequence_length(name):
    model, inputs = build(name)
    seq = torch.export.Dim("seq", min=2, max=48)
    spec = tuple({1: seq} for _ in inputs)
    cm = fexplore.compile(model, inputs, dynamic_shapes=spec if "mask" in inspect.signature(
        model.forward).parameters else (spec,))
    assert cm.graph.symbols["seq"][0] >= 2 and cm.verification["ok"].all()
    for length in (5, 13):
        args = _at_length(inputs, length)
        want = _eager(model, args)
        _assert_spread(want)
        torch.testing.assert_close(cm(*args), want, rtol=1.3e-6, atol=2e-5)
        made = cm.schedules.for_inputs([a.numpy() for a in args])
        assert not [k.name for k in made.schedule.kernels if k.how == "host"], length
    assert not cm.codegen_bugs, cm.codegen_bugs


def _with_flex_attention(model):
    """The model with attn_implementation="flex_attention" (its config, and its modules' own)."""
    for sub in model.modules():
        config = getattr(sub, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            config._attn_implementation = "flex_attention"
    return model


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")   # their flex advice
@pytest.mark.parametrize("name, target, precision", [
    ("llama", "rngd", "fp32"), ("llama", "tiny", "bf16"), ("mistral", "rngd", "fp32"),
    ("gemma2", "rngd", "fp32"), ("gemma2", "tiny", "bf16"), ("t5_decode_step", "rngd", "fp32")])
def test_hf_decoder_with_flex_attention(name, target, precision):
    """Hugging Face's flex_attention path: a BlockMask of its causal (Mistral: sliding-window)
    mask_mod, Gemma 2's softcap and T5's relative bias as score_mods; exported for inference.
    Hugging Face torch.compiles flex_attention in eager, and for T5's decode step torch's CPU
    code generator writes C++ that does not build: the reference runs compiled functions eagerly,
    as fexplore's oracle does."""
    model, inputs = build(name)
    model = _with_flex_attention(model)
    with torch.compiler.set_stance("force_eager"):
        want = _eager(model, inputs)
    cm = fexplore.compile(model, inputs, target=target, precision=precision)
    assert "flex_attention" in str(cm._ingested.exported.graph)
    assert cm.verification["ok"].all(), cm.verification
    assert not cm.lowering.host_ops, [(h.op, h.reason) for h in cm.lowering.host_ops]
    got = cm(*copy.deepcopy(inputs))
    assert pytree.tree_structure(got) == pytree.tree_structure(want)
    pairs = list(zip(_leaves(got), _leaves(want)))   # the logits (a decode step: then its cache)
    if precision == "fp32":
        for g, w in pairs:
            torch.testing.assert_close(g, w, rtol=1.3e-6, atol=2e-5)
        # the attention is a flash kernel, Gemma 2's softcapped scores included: as fast as the
        # model's eager attention
        assert "attention" in {k.kind for k in cm.kernels}
    else:
        g, w = pairs[0]
        assert 0 < float((g - w).abs().max()) < 0.05 * max(1.0, float(w.abs().max()))


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_hf_encoder_decoder_with_dynamic_source_and_target_lengths(name):
    """Two symbols, each length its own. T5's relative-position buckets, a constant at static
    lengths, are computed on the chip here: the log of a zero distance is -inf, cast to an int
    and then not chosen, as in torch, and the simulator says nothing of it (it warned)."""
    model, inputs = build(name)
    src, tgt = torch.export.Dim("src", min=2, max=32), torch.export.Dim("tgt", min=2, max=32)
    cm = fexplore.compile(model, inputs, dynamic_shapes=(({1: src}, None, {1: tgt}),))
    assert set(cm.graph.symbols) == {"src", "tgt"} and cm.verification["ok"].all()
    g = torch.Generator().manual_seed(0)
    for n_src, n_tgt in ((11, 3), (5, 9)):
        args = (torch.randint(0, VOCAB, (1, n_src), generator=g), None,
                torch.randint(0, VOCAB, (1, n_tgt), generator=g))
        want = _eager(model, args)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            got = cm(*args)
        torch.testing.assert_close(got, want, rtol=1.3e-6, atol=2e-5)
        made = cm.schedules.for_inputs([a.numpy() for a in args if a is not None])
        assert not [k.name for k in made.schedule.kernels if k.how == "host"]


@pytest.mark.parametrize("name", ["resnet", "convnext", "segformer"])
def test_hf_vision_model_with_a_dynamic_image_size(name):
    """One compile for every image size in the range: strided convs and pools over symbolic
    sizes (ResNet's stem nests two floors), and SegFormer's decode head, which resizes each stage's
    features to the first stage's size with bilinear interpolation (refused before: the
    interpolation matrices depend on the sizes)."""
    model, (image,) = build(name)
    h, w = torch.export.Dim("h", min=16, max=96), torch.export.Dim("w", min=16, max=96)
    cm = fexplore.compile(model, (image,), dynamic_shapes=(({2: h, 3: w},),))
    assert set(cm.graph.symbols) == {"h", "w"} and cm.verification["ok"].all()
    g = torch.Generator().manual_seed(0)
    for size in ((40, 32), (24, 56)):
        x = torch.randn(image.shape[0], image.shape[1], *size, generator=g)
        want = _eager(model, (x,))
        _assert_spread(want)
        for got, ref in zip(_leaves(cm(x)), _leaves(want)):
            torch.testing.assert_close(got, ref, rtol=1.3e-6, atol=2e-5)
        made = cm.schedules.for_inputs([x.numpy()])
        assert not [k.name for k in made.schedule.kernels if k.how == "host"], size
    assert not cm.codegen_bugs, cm.codegen_bugs


# A decode step whose cache length is decided per call, as a serving stack runs it: one compile
# with the cache's position axis dynamic (``Dim.AUTO``, as transformers' own export helpers give
# it), then every step's length lowered and scheduled on its own
def _decoder(name):
    common = dict(vocab_size=VOCAB, max_position_embeddings=64, use_cache=True)
    if name == "qwen2":
        return T.Qwen2ForCausalLM(T.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                num_attention_heads=4, num_key_value_heads=2, **common))
    if name == "gpt_neo":   # its causal mask buffer is sliced from the cache length on
        return T.GPTNeoForCausalLM(T.GPTNeoConfig(hidden_size=32, num_layers=2, num_heads=4,
                                                  attention_types=[[["global", "local"], 1]],
                                                  window_size=256, **common))
    # Blenderbot at d_model 32 over 32 heads: a head dim of 1
    return T.BlenderbotForCausalLM(T.BlenderbotConfig(d_model=32, encoder_layers=1, decoder_layers=1, decoder_attention_heads=32,
                                                      decoder_ffn_dim=64, **common))


def _tensor_cache(model, length: int, seed: int):
    with torch.no_grad():
        layers = model(torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed)),
                       use_cache=True)[1].layers
    return torch.stack([c.keys for c in layers]), torch.stack([c.values for c in layers])


@pytest.mark.parametrize("name", ["qwen2", "gpt_neo", "blenderbot"])
def test_hf_decode_step_with_a_dynamic_cache_length(name):
    """The key and value caches get a symbol each from torch (its trace of attention does not
    guard that they agree): every such decode step was refused (FX403), and they are one length
    now. GPT-Neo's mask slice from the cache length on was a codegen bug in the symbolic
    compile; Blenderbot's head dim of 1 another, at every length."""
    torch.manual_seed(0)
    decoder = _decoder(name).eval()
    step = TensorCacheDecodeStep(decoder)
    keys, values = _tensor_cache(decoder, 6, 0)
    auto = torch.export.Dim.AUTO
    cm = fexplore.compile(step, (_ids(1), keys, values), dynamic_shapes=(None, {3: auto}, {3: auto}))
    assert len(cm.graph.symbols) == 1 and cm.verification["ok"].all()
    for length in (3, 17):
        args = (_ids(1),) + _tensor_cache(decoder, length, length)
        want = _eager(step, args)
        _assert_spread(want[0])
        for got, ref in zip(cm(*args), want):
            torch.testing.assert_close(got, ref, rtol=1.3e-6, atol=2e-5)
        made = cm.schedules.for_inputs([a.numpy() for a in args])
        assert not [k.name for k in made.schedule.kernels if k.how == "host"], length
    assert not cm.codegen_bugs, cm.codegen_bugs


def test_hf_decode_step_on_a_dynamic_cache_object_of_dynamic_length():
    """The DynamicCache itself as the input, its spec following its flat children: four cache
    tensors, one length."""
    model, (ids, cache) = build("llama_decode_dynamic_cache")
    children = pytree.SUPPORTED_NODES[type(cache)].flatten_fn(cache)[0]
    cm = fexplore.compile(model, (ids, cache), dynamic_shapes=(None, [{2: torch.export.Dim.AUTO}] * len(children)))
    assert len(cm.graph.symbols) == 1 and cm.verification["ok"].all()
    for length in (3, 17):
        with torch.no_grad():
            cache = model.model(_ids(length), use_cache=True)[1]
        args = (_ids(1), cache)
        want = _eager(model, args)
        for got, ref in zip(_leaves(cm(*args)), _leaves(want)):
            torch.testing.assert_close(got, ref, rtol=1.3e-6, atol=2e-5)
    assert not cm.codegen_bugs, cm.codegen_bugs


def _prefilled_static_cache(decoder, positions: int):
    """A StaticCache of `positions` for `decoder`, its first 6 positions filled by a prompt."""
    register_cache_pytrees_for_model(decoder)
    cache = T.StaticCache(config=decoder.config, max_cache_len=positions)
    with torch.no_grad():
        decoder(_ids(6), use_cache=True, **{_cache_keyword(decoder): cache})
    return cache


def _static_cache_decoder(name):
    if name == "llama":
        return _llm(T.LlamaForCausalLM, T.LlamaConfig, use_cache=True)[0].model
    # a BERT decoder reads its position ids from the cache's counter (.item()) at run time
    return T.BertLMHeadModel(T.BertConfig(**_ENC, is_decoder=True, use_cache=True)).eval()


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_hf_decode_steps_on_a_static_cache_updated_in_place(name):
    """transformers' StaticCache, the serving kind: fixed-size key and value tensors and a
    position counter, all updated in place by the step (torch.export: USER_INPUT_MUTATION, which
    was refused). One static compile serves every step; three steps in a row, each on the cache
    the one before wrote, match eager's, logits and the cache alike, every op on the chip. BERT's
    positions, sliced at the counter read by .item(), were read from position 0 (FX301)."""
    torch.manual_seed(0)
    decoder = _static_cache_decoder(name)
    cache = _prefilled_static_cache(decoder, 16)
    step = DecodeStep(decoder)
    ours, theirs = copy.deepcopy(cache), copy.deepcopy(cache)
    cm = fexplore.compile(step, (_ids(1), cache))
    assert cm.verification["ok"].all() and len(cm._ingested.input_mutations) == 6
    assert not [k.name for k in cm.schedule.kernels if k.how == "host"]
    # each layer's key and value rows are scattered into the caches' own storage (nothing reads
    # a cache as it was after its update): no copy of the caches
    assert [why.split(" (")[0] for what, why in cm.schedule.decisions if what == "updated in place"] == \
        ["4 updates write into their tables' own storage"], cm.schedule.decisions
    for _ in range(3):
        ids = _ids(1)
        got = cm(ids, ours)
        with torch.no_grad():
            want = step(ids, theirs)
        _assert_spread(want[0])
        torch.testing.assert_close(got[0], want[0], rtol=1.3e-6, atol=2e-5)
        for a, b in zip(_leaves(ours), _leaves(theirs)):
            torch.testing.assert_close(a, b, rtol=1.3e-6, atol=2e-5)
    assert int(ours.layers[0].cumulative_length) == 9


@pytest.mark.parametrize("width, heads, kv_heads", [(512, 8, 2), (1024, 16, 4)])
def test_a_static_cache_decode_step_attends_in_one_kernel(width, heads, kv_heads):
    """A decode step on a StaticCache of 2048 positions with grouped-query heads, bf16 on rngd.
    The cache update (index_put) is a kernel of its own; the attention kernel rotates q as it
    loads it and reads the updated caches with its heads grouped (no expand of each cache to every
    query head, materialized). Before, the attention region took the index_put in, no generator
    took it whole, and it was split into dozens of kernels (at Llama-1B-like widths the step moved
    twice its compulsory bytes). With fewer key heads than PEs the kernel's grid may run over key
    heads (each cache loaded once for its query heads) or over query heads (every PE busy, each
    cache loaded once per query head): both kernels are written and the faster modelled kept. At
    8 heads over 2 the query heads fill the 8 PEs in one round and win; at 16 over 4 they take two
    rounds and the groups win. The one kept is as fast alone as the other, within 5%."""
    from fexplore.lang.codegen import attention as codegen_attention
    from fexplore.npu import get_target

    torch.manual_seed(0)
    decoder = _llm(T.LlamaForCausalLM, T.LlamaConfig, use_cache=True, hidden_size=width, intermediate_size=256,
                   num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=2048)[0].model
    cache = _prefilled_static_cache(decoder, 2048)
    step = DecodeStep(decoder)
    ours, theirs = copy.deepcopy(cache), copy.deepcopy(cache)
    cm = fexplore.compile(step, (_ids(1), cache), precision="bf16")
    assert cm.verification["ok"].all()
    assert not [x for x in cm["lower"].lowering.nodes if x.how == "split"]
    attention = [k for k in cm.kernels if k.kernel.kind == "attention"]
    assert len(attention) == 2 and all("rotary" in k.kernel.parts for k in attention)
    assert not [k.name for k in cm.kernels if k.kernel.kind == "movement" and "expand" in k.kernel.parts]

    kept = attention[0]
    grouped = "for g, qs in fl.parallel(" in kept.kernel.source
    cycles = {}
    for per_query_head in (False, True):
        gk, _ = codegen_attention._generate(kept.node, get_target("rngd"), per_query_head=per_query_head)
        specs = [lang.spec(p.shape, kept.node.inputs[p.index].type.dtype.name) for p in gk.params]
        res = gk.kernel().trace(*specs, target="rngd").program().simulate()
        cycles[per_query_head] = res.cycles
        if per_query_head != grouped:   # the kept one: each cache loaded once per grid item
            loads = {}
            for c in res.program.commands:
                if type(c).__name__ == "Load" and c.ref.tensor.shape[-2:] == (2048, width // heads):
                    loads[c.ref.tensor.name] = loads.get(c.ref.tensor.name, 0) + res.program.moved_bytes[c.id]
            once = kv_heads * 2048 * (width // heads) * 4
            assert sorted(loads.values()) == [once * (1 if grouped else heads // kv_heads)] * 2, loads
    assert cycles[not grouped] <= 1.05 * min(cycles.values()), cycles
    assert grouped == (heads > 8)

    ids = _ids(1)
    got = cm(ids, ours)
    with torch.no_grad():
        want = step(ids, theirs)
    _assert_spread(want[0])
    torch.testing.assert_close(got[0].float(), want[0].float(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("target, precision", [("rngd", "fp32"), ("tiny", "bf16")])
def test_a_gemma2_decode_step_on_a_static_cache_attends_in_one_kernel_a_layer(target, precision):
    """Gemma 2 writes its attention out (soft-capped scores), and in a decode step on a StaticCache
    its sliding-window layers build their mask from the cache position. Fusion counted that mask a
    second computed operand of the scores and formed no attention region: the scores and the
    values became contraction regions reading every query head's copy of the caches (an expand),
    split apart. A mask made from positions alone is now a kernel of its own, loaded by the
    attention kernel as a mask given as an input is."""
    torch.manual_seed(0)
    decoder = gemma2()[0].model
    cache = _prefilled_static_cache(decoder, 16)
    step = DecodeStep(decoder)
    ours, theirs = copy.deepcopy(cache), copy.deepcopy(cache)
    cm = fexplore.compile(step, (_ids(1), cache), target=target, precision=precision)
    assert cm.verification["ok"].all(), cm.verification
    assert not cm.lowering.host_ops
    kinds = [k.kernel.kind for k in cm.kernels if "_self_attn" in k.name]
    assert kinds.count("attention") == decoder.config.num_hidden_layers, kinds
    assert not [k.name for k in cm.kernels if k.kernel.kind == "movement" and "expand" in k.kernel.parts]
    if target == "rngd":
        assert not cm["lower"].stats.get("split_regions")
    ids = _ids(1)
    got = cm(ids, ours)
    with torch.no_grad():
        want = step(ids, theirs)
    _assert_spread(want[0])
    tol = dict(rtol=1.3e-6, atol=2e-5) if precision == "fp32" else dict(rtol=0.05, atol=0.05)
    torch.testing.assert_close(got[0].float(), want[0].float(), **tol)
    for a, b in zip(_leaves(ours), _leaves(theirs)):
        torch.testing.assert_close(a.float(), b.float(), **tol)


def test_a_static_cache_decode_step_on_tiny_keeps_its_attention_whole():
    """On tiny (64 KB of SRAM a PE) fusion counted every view in the attention region (the caches'
    unsqueeze, expand and reshape to every query head) as a tile of its own, found the region too
    big, gave the attention back, and the expands of the caches became kernels. A view is its
    source's tile read another way: the attention region now fits and reads the caches grouped."""
    torch.manual_seed(0)
    decoder = _llm(T.LlamaForCausalLM, T.LlamaConfig, use_cache=True, hidden_size=256, intermediate_size=256,
                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)[0].model
    cache = _prefilled_static_cache(decoder, 512)
    cm = fexplore.compile(DecodeStep(decoder), (_ids(1), cache), target="tiny", precision="bf16")
    assert cm.verification["ok"].all()
    assert not [s for s in cm["fusion"].stats["split_for_sram"] if s["kind"] == "attention"]
    attention = [k for k in cm.kernels if k.kernel.kind == "attention"]
    assert len(attention) == 2 and all("rotary" in k.kernel.parts for k in attention)
    assert not [k.name for k in cm.kernels if k.kernel.kind == "movement" and "expand" in k.kernel.parts]


def _export_module(name):
    """transformers' own module for exporting a decoder LLM (``integrations.executorch``, what
    ExecuTorch and Optimum export): it holds a StaticCache of 16 positions and registers the
    cache's key, value and counter tensors as its buffers; the model reaches them through the
    cache object. (The decoder-only wrapper around it drops ``cache_position`` in this
    transformers; the static-cache module it builds is the one exported.)"""
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    cls, config_cls, extra = {
        "llama": (T.LlamaForCausalLM, T.LlamaConfig, {}),
        "mistral": (T.MistralForCausalLM, T.MistralConfig, {"sliding_window": 4}),
        "gemma3": (T.Gemma3ForCausalLM, T.Gemma3TextConfig,
                   {"head_dim": 8, "sliding_window": 4, "pad_token_id": 0}),
    }[name]
    model = _llm(cls, config_cls, use_cache=True, **extra)[0].model
    model.generation_config.cache_implementation = "static"
    model.generation_config.cache_config = {"batch_size": 1, "max_cache_len": 16}
    return TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=16).model.eval()


EXPORT_MODULE = [("llama", "rngd", "fp32"), ("mistral", "rngd", "bf16"), ("gemma3", "tiny", "bf16")]


@pytest.mark.parametrize("name, target, precision", EXPORT_MODULE, ids=["-".join(v) for v in EXPORT_MODULE])
def test_hf_export_module_decodes_on_the_static_cache_it_holds(name, target, precision):
    """Non-strict torch.export sees the module's buffers, but not that the cache object's
    tensors are the same ones: it lifted them as constants, wrote into the user's tensors while
    tracing (the counter moved, the caches kept autograd history), and the program could not be
    decomposed (FX401). A program that writes into constants is now exported again with dynamo,
    which follows them to the buffers, and the user's tensors are restored after tracing. Eight
    steps, past the sliding window of four (Mistral's, Gemma 3's local layers), each match
    eager, every op on the chip."""
    torch.manual_seed(0)
    module = _export_module(name)
    before = [(b, b.detach().clone(), b.requires_grad) for b in module.buffers()]
    eager = copy.deepcopy(module)
    cm = fexplore.compile(module, (_ids(1), None, torch.tensor([0])), target=target, precision=precision)
    assert cm.verification["ok"].all(), cm.verification
    assert not cm.lowering.host_ops and not cm.codegen_bugs
    for b, values, grad in before:   # the compile left the model's tensors as they were
        assert torch.equal(b, values) and b.is_leaf and b.requires_grad == grad
    g = torch.Generator().manual_seed(1)
    for step in range(8):
        ids, pos = torch.randint(0, VOCAB, (1, 1), generator=g), torch.tensor([step])
        got = cm(ids, None, pos)
        with torch.no_grad():
            want = eager(ids, None, pos)
        _assert_spread(want)
        scale = max(1.0, float(want.abs().max()))
        if precision == "fp32":
            torch.testing.assert_close(got, want, rtol=1.3e-6, atol=2e-5 * scale)
        else:
            assert float((got.float() - want.float()).abs().max()) <= 0.05 * scale
    # the compiled model carries the cache: its counter moved as eager's did
    assert int(cm.state["cumulative_length_0"]) == int(eager.cumulative_length_0) == 8


def test_hf_export_module_prefills_and_decodes_from_one_dynamic_compile():
    """The serving flow through transformers' export module: one compile with the token count
    dynamic, then a prompt of five tokens and decode steps of one and three on the cache it
    carries. Each length is made on its first call and checked against eager run from the
    carried cache (logits and the cache's new values), and each call matches eager."""
    torch.manual_seed(0)
    module = _export_module("llama")
    eager = copy.deepcopy(module)
    seq = torch.export.Dim("seq", min=1, max=8)
    cm = fexplore.compile(module, (_ids(4), None, torch.arange(4)), dynamic_shapes=({1: seq}, None, {0: seq}))
    g = torch.Generator().manual_seed(2)
    start = 0
    for n in (5, 1, 1, 3):
        ids, pos = torch.randint(0, VOCAB, (1, n), generator=g), torch.arange(start, start + n)
        got = cm(ids, None, pos)
        with torch.no_grad():
            want = eager(ids, None, pos)
        _assert_spread(want)
        torch.testing.assert_close(got, want, rtol=1.3e-6, atol=2e-5)
        start += n
    made = cm.schedules.made
    assert [m["seq"] for m in made.sizes] == [5, 1, 3]
    assert all(c.startswith("max abs err") for c in made.checked), made
    assert int(cm.state["cumulative_length_0"]) == int(eager.cumulative_length_0) == 10


# Models loaded in a narrow dtype themselves (``torch_dtype=torch.bfloat16``, or ``.half()``): every op
# reads and writes bf16/f16, the paths a float32 model under the bf16 policy never takes (a mean's
# cast, T5's f16 clamp, attention with the model's own operand dtype)
NATIVE = [("gpt2", torch.bfloat16), ("llama", torch.bfloat16), ("qwen2", torch.float16),
          ("gemma2", torch.bfloat16), ("mixtral", torch.bfloat16), ("bert", torch.float16),
          ("vit", torch.bfloat16), ("resnet", torch.bfloat16), ("convnext", torch.float16),
          ("swin", torch.bfloat16), ("whisper", torch.float16), ("t5", torch.float16)]


@pytest.mark.parametrize("name, dtype", NATIVE, ids=[f"{n}-{str(d).split('.')[1]}" for n, d in NATIVE])
def test_hf_model_loaded_in_a_narrow_dtype_runs_on_the_chip(name, dtype):
    model, inputs = build(name)
    model = model.to(dtype)
    inputs = tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
    want = _eager(model, inputs)
    cm = fexplore.compile(model, inputs)
    assert cm.verification["ok"].all(), cm.verification
    assert not cm["lower"].stats.get("codegen_bugs"), cm["lower"].stats.get("codegen_bugs")
    assert not cm.lowering.host_ops, [(h.op, h.reason) for h in cm.lowering.host_ops]
    for g, w in zip(_leaves(cm(*inputs)), _leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.is_floating_point:
            scale = max(1.0, float(w.float().abs().max()))
            assert float((g.float() - w.float()).abs().max()) <= 0.02 * scale   # a few roundings of 2^-8


def test_the_readmes_hugging_face_factory_compiles_from_the_command_line(tmp_path, monkeypatch,
                                                                          capsys):
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    block = re.search(r"```python\n# my_llm.py\n(.*?)```", readme, re.S)
    assert block, "the README's Hugging Face example is gone"
    (tmp_path / "my_llm.py").write_text(textwrap.dedent(block.group(1)))
    monkeypatch.chdir(tmp_path)
    with torch.random.fork_rng():
        assert cli.main(["compile", "my_llm:tiny_llama", "--no-report"]) == 0
    out = capsys.readouterr().out
    assert "compiled @forward" in out and "✓" in out and "✗" not in out


# Through the second front door: the architecture exported by torch.onnx (dynamo) and compiled
# from the .onnx file, every stage checked against ONNX Runtime (a decoder LLM, a state-space
# model, a segmentation net)
THROUGH_ONNX = [("llama", "rngd", "fp32"), ("mamba", "tiny", "bf16"), ("segformer", "rngd", "bf16")]


@pytest.mark.parametrize("name, target, precision", THROUGH_ONNX, ids=["-".join(v) for v in THROUGH_ONNX])
def test_hf_model_through_the_onnx_door(name, target, precision, tmp_path):
    import numpy as np
    from test_onnx_door import export

    from fexplore.pipeline.numeric import to_numpy

    model, inputs = build(name)
    path = export(model, inputs, tmp_path / f"{name}.onnx")
    arrays = [to_numpy(x) for x in inputs]
    cm = fexplore.compile(path, arrays, target=target, precision=precision)
    assert cm.verification["ok"].all() and not cm.lowering.host_ops and not cm.codegen_bugs, cm.verification
    want = _eager(model, inputs)
    _assert_spread(want)
    got = cm(*arrays)[0]
    scale = max(1.0, float(want.abs().max()))
    err = float(np.abs(got.astype(np.float64) - to_numpy(want).astype(np.float64)).max())
    assert err <= (2e-5 if precision == "fp32" else 0.05) * scale, err
