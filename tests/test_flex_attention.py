"""flex_attention (torch.nn.attention.flex_attention) compiles to what eager computes: a score_mod
that leaves the score alone, adds a term of the indices or masks it becomes the IR's attention
op with a mask (a flash-attention kernel); any other is written out; mask_mods, captured
buffers, grouped heads, the log-sum-exp and a dynamic length all as torch's dense reference."""

import warnings

import pytest
import torch
from torch.export import Dim
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import fexplore


def causal(b, h, q, k):
    return q >= k


def sliding_window(b, h, q, k):
    return (q >= k) & (q - k < 5)


def causal_by_score(score, b, h, q, k):
    return torch.where(q >= k, score, -float("inf"))


def softcap(score, b, h, q, k):
    return torch.tanh(score / 20.0) * 20.0


class Flex(torch.nn.Module):
    """flex_attention with a score_mod and/or a mask_mod; ``alibi`` and ``documents`` read
    buffers of the module (a per-head slope, a document id per position)."""

    def __init__(self, score_mod=None, mask_mod=None, *, alibi=False, documents=False, lse=False, gqa=False):
        super().__init__()
        self.score_mod, self.mask_mod, self.lse, self.gqa = score_mod, mask_mod, lse, gqa
        self.alibi, self.documents = alibi, documents
        self.register_buffer("slopes", torch.tensor([0.5, 0.25, 0.125, 0.0625]))
        self.register_buffer("doc", torch.arange(64) // 24)

    def forward(self, q, k, v):
        score_mod, mask_mod = self.score_mod, self.mask_mod
        if self.alibi:
            slopes = self.slopes
            score_mod = lambda s, b, h, qi, ki: s + slopes[h] * (ki - qi)   # noqa: E731
        if self.documents:
            doc = self.doc
            mask_mod = lambda b, h, qi, ki: (doc[qi] == doc[ki]) & (qi >= ki)   # noqa: E731
        block = None if mask_mod is None else create_block_mask(mask_mod, None, None, q.shape[2], k.shape[2],
                                                                 device="cpu")
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block, return_lse=self.lse,
                              enable_gqa=self.gqa)


def _qkv(seq=64, kv_heads=4, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 4, seq, 16, generator=g, dtype=dtype),
            torch.randn(2, kv_heads, seq, 16, generator=g, dtype=dtype),
            torch.randn(2, kv_heads, seq, 16, generator=g, dtype=dtype))


CASES = {   # name: (module, kv heads, how the scores are computed)
    "default": (lambda: Flex(), 4, "attention"),
    "causal mask_mod": (lambda: Flex(mask_mod=causal), 4, "attention"),
    "sliding window": (lambda: Flex(mask_mod=sliding_window), 4, "attention"),
    "causal by score_mod": (lambda: Flex(score_mod=causal_by_score), 4, "attention"),
    "alibi (a buffer by head)": (lambda: Flex(alibi=True), 4, "attention"),
    "alibi and causal": (lambda: Flex(alibi=True, mask_mod=causal), 4, "attention"),
    "documents (a buffer by position)": (lambda: Flex(documents=True), 4, "attention"),
    "grouped heads": (lambda: Flex(mask_mod=causal, gqa=True), 2, "attention"),
    "softcap": (lambda: Flex(score_mod=softcap, mask_mod=causal), 4, "written out"),
    "log-sum-exp": (lambda: Flex(mask_mod=causal, lse=True), 4, "attention"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_flex_attention_compiles_to_what_eager_computes(name):
    make, kv_heads, how = CASES[name]
    model = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch's advice to torch.compile flex_attention
        cm = fexplore.compile(model, _qkv(kv_heads=kv_heads))
        assert cm.verification["ok"].all(), cm.verification
        assert not cm.lowering.host_ops, [h.reason for h in cm.lowering.host_ops]
        ops = cm.stages[0].after.op_counts()
        if how == "attention":
            assert ops.get("attention") == 1, ops
        else:
            assert "attention" not in ops and ops.get("matmul") == 2 and "tanh" in ops, ops
        args = _qkv(kv_heads=kv_heads, seed=1)
        with torch.no_grad():
            want = model(*args)
        torch.testing.assert_close(cm(*args), want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("name", ["causal mask_mod", "softcap"])
def test_flex_attention_in_bf16_on_the_small_chip(name):
    make, kv_heads, _ = CASES[name]
    model = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = fexplore.compile(model, _qkv(kv_heads=kv_heads), target="tiny", precision="bf16")
        assert cm.verification["ok"].all(), cm.verification
        assert not cm.lowering.host_ops
        args = _qkv(kv_heads=kv_heads, seed=2)
        with torch.no_grad():
            want = model(*args)
        err = float((cm(*args) - want).abs().max())
        assert 0 < err < 0.05, err


@pytest.mark.parametrize("mask", ["block mask", "score_mod"])
def test_flex_attention_over_a_dynamic_length(mask):
    """A BlockMask made at a symbolic length holds sizes rounded up to whole blocks; what reads
    them only is not converted (the op's meaning is the mask_mod's)."""
    model = Flex(mask_mod=causal) if mask == "block mask" else Flex(score_mod=causal_by_score)
    seq = Dim("seq", min=2, max=128)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = fexplore.compile(model, _qkv(), dynamic_shapes=({2: seq}, {2: seq}, {2: seq}))
        assert cm.verification["ok"].all(), cm.verification
        for n in (16, 100):
            args = _qkv(seq=n, seed=n)
            with torch.no_grad():
                want = model(*args)
            torch.testing.assert_close(cm(*args), want, rtol=1e-5, atol=2e-6)


def test_a_sliding_window_skips_the_key_blocks_before_it():
    """A constant band mask (keys i - W < j <= i): the flash kernel skips the key blocks wholly
    outside the windows of a query block, and still equals eager (tiny's small blocks: most key
    blocks are skipped)."""
    def window(b, h, q, k):
        return (q >= k) & (q - k < 32)

    model = Flex(mask_mod=window)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = fexplore.compile(model, _qkv(seq=256), target="tiny")
        assert cm.verification["ok"].all(), cm.verification
        (kernel,) = [k for k in cm.kernels if k.kind == "attention"]
        assert "a sliding window of 32 keys" in kernel.source
        args = _qkv(seq=256, seed=3)
        with torch.no_grad():
            want = model(*args)
        torch.testing.assert_close(cm(*args), want, rtol=1e-5, atol=2e-6)
        full = fexplore.compile(Flex(), _qkv(seq=256), target="tiny", verify=False)
    assert cm.simulate().cycles < 0.5 * full.simulate().cycles
