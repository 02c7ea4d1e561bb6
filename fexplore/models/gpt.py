"""A GPT-2-style decoder-only language model.

Mirrors GPT-2 (Radford et al., 2019) as written in nanoGPT and Hugging Face's ``GPT2LMHeadModel``:
learned token and position embeddings, pre-LayerNorm blocks, causal self-attention spelled out
(fused qkv projection, q·kᵀ, scale, a causal mask sliced from a registered ``tril`` buffer, softmax,
·v, output projection), a tanh-approximated GELU MLP, a final LayerNorm and an LM head whose weight
is the token embedding's.

The attention is written out rather than calling ``scaled_dot_product_attention`` on purpose: that is
how GPT-2 checkpoints' reference code looks, and it is the pattern a front end must re-recognize.
The mask is the ``[:T, :T]`` corner of a ``max_seq`` x ``max_seq`` buffer and positions come from
``torch.arange(T)``, as in the real code, so the sequence length can be exported as a dynamic dim
(up to ``max_seq - 1``: slicing the buffer whole is a case torch.export cannot merge with the others;
see ``fexplore.models.gpt_dynamic_seq``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from fexplore.errors import ConfigError


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 128
    layers: int = 2
    width: int = 64
    heads: int = 4
    max_seq: int = 64
    layer_norm_eps: float = 1e-5


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.heads = config.heads
        self.c_attn = nn.Linear(config.width, 3 * config.width)
        self.c_proj = nn.Linear(config.width, config.width)
        # Non-persistent, like nanoGPT/HF: the mask is derived, not a weight to load.
        mask = torch.tril(torch.ones(config.max_seq, config.max_seq, dtype=torch.bool))
        self.register_buffer("bias", mask.view(1, 1, config.max_seq, config.max_seq),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        head_dim = C // self.heads
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, heads, T, head_dim)
        q = q.view(B, T, self.heads, head_dim).transpose(1, 2)
        k = k.view(B, T, self.heads, head_dim).transpose(1, 2)
        v = v.view(B, T, self.heads, head_dim).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
        att = att.masked_fill(~self.bias[:, :, :T, :T], float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class GPTMLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.width, 4 * config.width)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's "gelu_new"
        self.c_proj = nn.Linear(4 * config.width, config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class GPTBlock(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.width, eps=config.layer_norm_eps)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.width, eps=config.layer_norm_eps)
        self.mlp = GPTMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab, config.width)
        self.wpe = nn.Embedding(config.max_seq, config.width)
        self.h = nn.ModuleList(GPTBlock(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.width, eps=config.layer_norm_eps)
        self.lm_head = nn.Linear(config.width, config.vocab, bias=False)
        self._init_weights()
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2

    def _init_weights(self) -> None:
        # PyTorch's default init, not GPT-2's std=0.02: at width 64 that would make every attention
        # row nearly uniform, and a wrong mask or scale would barely move the numbers. LayerNorms get
        # non-trivial affine parameters so that dropping or misplacing them shows.
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.LayerNorm):
                    m.weight.copy_(1.0 + 0.2 * torch.randn_like(m.weight))
                    m.bias.copy_(0.2 * torch.randn_like(m.bias))

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        T = token_ids.shape[1]
        positions = torch.arange(T, device=token_ids.device)
        x = self.wte(token_ids) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt(*, vocab: int = 128, layers: int = 2, width: int = 64, heads: int = 4, seq_len: int = 16,
        max_seq: int = 64, batch: int = 1, seed: int = 0) -> tuple[nn.Module, tuple]:
    """A GPT-2-style decoder. Returns ``(model, (token_ids,))`` with int64 ``token_ids`` of shape
    ``(batch, seq_len)``; the output is ``(batch, seq_len, vocab)`` logits. The model is in eval mode.
    """
    if width % heads:
        raise ConfigError(f"width {width} is not divisible by heads {heads}")
    if not 1 <= seq_len <= max_seq:
        raise ConfigError(f"seq_len {seq_len} must be in [1, max_seq={max_seq}]")
    config = GPTConfig(vocab=vocab, layers=layers, width=width, heads=heads, max_seq=max_seq)
    # fork_rng: default init draws from the global RNG; forking keeps the caller's random state
    # untouched while making the weights a function of ``seed`` alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(config)
    generator = torch.Generator().manual_seed(seed)
    token_ids = torch.randint(0, vocab, (batch, seq_len), generator=generator)
    return model.eval(), (token_ids,)
