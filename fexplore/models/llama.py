"""A Llama-style decoder-only language model, with a KV-cache decode step.

Mirrors Llama 2/3 as written in Hugging Face's ``LlamaForCausalLM``: RMSNorm (spelled out), rotary
position embeddings applied ``rotate_half`` style with cos/sin computed from the positions,
grouped-query attention (fewer key/value heads than query heads) through
``scaled_dot_product_attention(..., enable_gqa=True)``, a SwiGLU MLP, no biases anywhere and an
untied LM head.

Serving stacks compile a language model twice: *prefill* (the whole prompt, causal attention) and
*decode* (one new token attending to a cache of past keys and values). ``llama`` is the prefill
program; ``llama_decode_step`` is the decode program over the same weights, whose caches are explicit
tensors in and out, ``(layers, batch, kv_heads, past_len, head_dim)``, grown by ``torch.cat``.
``llama_prefill_cache`` fills such caches from a prompt, which is how the two are checked against
each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fexplore.errors import ConfigError


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 128
    layers: int = 2
    width: int = 64
    heads: int = 4
    kv_heads: int = 2
    max_seq: int = 64
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def intermediate(self) -> int:
        # Llama's rule: 2/3 of 4*width, rounded up to a multiple (256 in Llama; 32 at toy size).
        hidden = int(2 * 4 * self.width / 3)
        return 32 * ((hidden + 31) // 32)


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:   # a model in a narrow dtype normalizes in f32, as HF's does
            return self.weight * self._normed(x.float()).to(x.dtype)
        return self.weight * self._normed(x)

    def _normed(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for the given positions, computed on the fly (no ``max_seq`` table), as HF does."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: (batch or 1, T) integers -> cos, sin: (batch or 1, T, head_dim)
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # broadcast over heads
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.heads, config.kv_heads, config.head_dim
        self.q_proj = nn.Linear(config.width, config.heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.width, config.kv_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.width, config.kv_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.heads * config.head_dim, config.width, bias=False)

    def forward(self, x, cos, sin, past_k=None, past_v=None):
        """Returns ``(output, k, v)`` where ``k``/``v`` cover past and new positions (post-rotary)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)
        if past_k is not None:
            k = torch.cat((past_k, k), dim=2)
            v = torch.cat((past_v, v), dim=2)
        # With a cache the new tokens follow every cached one, so they see all keys and need no
        # mask; is_causal would be wrong there (PyTorch aligns its mask top-left).
        out = F.scaled_dot_product_attention(q, k, v, is_causal=past_k is None, enable_gqa=True)
        out = out.transpose(1, 2).reshape(B, T, self.heads * self.head_dim)
        return self.o_proj(out), k, v


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.width, config.intermediate, bias=False)
        self.up_proj = nn.Linear(config.width, config.intermediate, bias=False)
        self.down_proj = nn.Linear(config.intermediate, config.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.width, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.width, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, x, cos, sin, past_k=None, past_v=None):
        attn, k, v = self.self_attn(self.input_layernorm(x), cos, sin, past_k, past_v)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


class Llama(nn.Module):
    """The full-sequence (prefill) model: ``forward(token_ids) -> logits``."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab, config.width)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.width, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.width, config.vocab, bias=False)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)
        self._init_weights()

    def _init_weights(self) -> None:
        # PyTorch's default init for Linear/Embedding; RMSNorm weights moved off 1 so that dropping
        # or misplacing them shows in the numbers.
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, RMSNorm):
                    m.weight.copy_(1.0 + 0.2 * torch.randn_like(m.weight))

    def _run(self, token_ids, positions, k_cache=None, v_cache=None):
        """Shared body of prefill and decode: logits and every layer's (past + new) keys/values."""
        x = self.embed_tokens(token_ids)
        cos, sin = self.rotary(positions)
        if x.dtype != cos.dtype:   # a model in a narrow dtype rotates in its own dtype, as HF's does
            cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            past_k = None if k_cache is None else k_cache[i]
            past_v = None if v_cache is None else v_cache[i]
            x, k, v = layer(x, cos, sin, past_k, past_v)
            keys.append(k)
            values.append(v)
        return self.lm_head(self.norm(x)), keys, values

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        T = token_ids.shape[1]
        positions = torch.arange(T, device=token_ids.device).unsqueeze(0)
        logits, _, _ = self._run(token_ids, positions)
        return logits

    def prefill(self, token_ids: torch.Tensor):
        """``(logits, k_cache, v_cache)``, caches shaped ``(layers, batch, kv_heads, T, head_dim)``."""
        T = token_ids.shape[1]
        positions = torch.arange(T, device=token_ids.device).unsqueeze(0)
        logits, keys, values = self._run(token_ids, positions)
        return logits, torch.stack(keys), torch.stack(values)

    def decode_step(self, token_ids, position, k_cache, v_cache):
        """One new token per sequence against the caches; returns ``(logits, k_cache, v_cache)``
        with the caches one position longer."""
        positions = position.reshape(-1, 1)  # (batch,) or scalar -> (batch or 1, 1)
        logits, keys, values = self._run(token_ids, positions, k_cache, v_cache)
        return logits, torch.stack(keys), torch.stack(values)


class LlamaDecodeStep(nn.Module):
    """``forward(token_ids[batch, 1], position, k_cache, v_cache) -> (logits, k_cache, v_cache)``.

    Wraps (and shares every parameter with) a ``Llama``, so decode and prefill use one set of weights.
    """

    def __init__(self, llama: Llama):
        super().__init__()
        self.llama = llama

    def forward(self, token_ids, position, k_cache, v_cache):
        return self.llama.decode_step(token_ids, position, k_cache, v_cache)


def llama_prefill_cache(model: Llama | LlamaDecodeStep, token_ids: torch.Tensor):
    """The ``(k_cache, v_cache)`` a decode step needs after the prompt ``token_ids``."""
    llama = model.llama if isinstance(model, LlamaDecodeStep) else model
    with torch.no_grad():
        _, k_cache, v_cache = llama.prefill(token_ids)
    return k_cache, v_cache


def _build(vocab, layers, width, heads, kv_heads, max_seq, seed) -> Llama:
    if width % heads or (width // heads) % 2:
        raise ConfigError(f"width {width} must split into {heads} heads of an even head_dim")
    if heads % kv_heads:
        raise ConfigError(f"heads {heads} is not a multiple of kv_heads {kv_heads}")
    config = LlamaConfig(vocab=vocab, layers=layers, width=width, heads=heads, kv_heads=kv_heads,
                         max_seq=max_seq)
    # fork_rng: default init draws from the global RNG; forking keeps the caller's random state
    # untouched while making the weights a function of ``seed`` alone, so ``llama`` and
    # ``llama_decode_step`` with one seed hold the same weights.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Llama(config).eval()


def llama(*, vocab: int = 128, layers: int = 2, width: int = 64, heads: int = 4, kv_heads: int = 2,
          seq_len: int = 16, max_seq: int = 64, batch: int = 1, seed: int = 0):
    """A Llama-style decoder. Returns ``(model, (token_ids,))`` with int64 ``token_ids`` of shape
    ``(batch, seq_len)``; the output is ``(batch, seq_len, vocab)`` logits. The model is in eval mode.
    """
    if not 1 <= seq_len <= max_seq:
        raise ConfigError(f"seq_len {seq_len} must be in [1, max_seq={max_seq}]")
    model = _build(vocab, layers, width, heads, kv_heads, max_seq, seed)
    generator = torch.Generator().manual_seed(seed)
    token_ids = torch.randint(0, vocab, (batch, seq_len), generator=generator)
    return model, (token_ids,)


def llama_decode_step(*, vocab: int = 128, layers: int = 2, width: int = 64, heads: int = 4,
                      kv_heads: int = 2, past_len: int = 8, max_seq: int = 64, batch: int = 1,
                      seed: int = 0):
    """The decode program of ``llama(...)`` with the same sizes and seed (hence the same weights).

    Returns ``(model, (token_ids, position, k_cache, v_cache))``: ``token_ids`` int64
    ``(batch, 1)``, ``position`` int64 ``(batch,)`` equal to ``past_len``, and random caches of shape
    ``(layers, batch, kv_heads, past_len, head_dim)``; for caches of a real prompt use
    ``llama_prefill_cache``. The output is ``(logits (batch, 1, vocab), k_cache, v_cache)`` with the
    caches ``past_len + 1`` long. The model is in eval mode.
    """
    if not 1 <= past_len < max_seq:
        raise ConfigError(f"past_len {past_len} must be in [1, max_seq={max_seq}) to leave room for "
                          "the new token")
    model = LlamaDecodeStep(_build(vocab, layers, width, heads, kv_heads, max_seq, seed)).eval()
    head_dim = width // heads
    generator = torch.Generator().manual_seed(seed)
    token_ids = torch.randint(0, vocab, (batch, 1), generator=generator)
    position = torch.full((batch,), past_len, dtype=torch.int64)
    cache_shape = (layers, batch, kv_heads, past_len, head_dim)
    k_cache = torch.randn(cache_shape, generator=generator)
    v_cache = torch.randn(cache_shape, generator=generator)
    return model, (token_ids, position, k_cache, v_cache)
