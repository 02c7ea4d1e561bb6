"""Model families that bring their own ops, written as they are in the wild: mixture-of-experts
routing, rotary embeddings with complex numbers, multimodal token merging (masked_scatter and
boolean-mask assignment), multi-query attention, audio (1-d) and video (3-d) convolution,
transposed convolution and pooling, ``empty`` with a memory format, and module and parameter
names with any characters. Each compiles through every stage (``fexplore.compile`` verifies
structure and numerics after each), matches eager, and its IR text round-trips. Data-dependent
forms (MoE gathering tokens with ``torch.where(mask)``, bincount) are refused clearly."""

import inspect
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fexplore
from fexplore.errors import ExportError, UnsupportedOperatorError
from fexplore.ir import parse


def _compile_and_match(model, inputs, min_magnitude=1e-2):
    model.eval()
    with torch.no_grad():
        want = model(*inputs)
    cm = fexplore.compile(model, inputs)
    assert bool(cm.verification["ok"].all())
    got = cm(*inputs)
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    assert len(gots) == len(wants)
    for g, w in zip(gots, wants):
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.dtype.is_floating_point:
            # a result near zero would match a wrong program too: insist on a real signal
            assert w.abs().max() > min_magnitude
            scale = max(1.0, w.abs().max().item())
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * scale)
        else:
            assert torch.equal(g, w)
    for rec in cm.stages:  # every stage's IR reads back exactly
        graph = rec.after
        assert parse(str(graph), payloads=graph.payloads) == graph, rec.name
    return cm


def _ops(graph):
    return [n.op.name for n in graph.walk()]


def _line_of(fn, text):
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, ln in enumerate(lines) if text in ln)


# -- rotary embeddings with complex numbers (Meta's Llama) ------------------------------------------

def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64


def reshape_for_broadcast(freqs_cis, x):
    ndim = x.ndim
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class LlamaAttention(nn.Module):
    """Llama-1 attention: the complex freqs_cis table is a constant of the module."""

    def __init__(self, dim=32, n_heads=4, max_seq_len=16):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.freqs_cis = precompute_freqs_cis(self.head_dim, max_seq_len * 2)

    def forward(self, x):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        self.freqs_cis = self.freqs_cis.to(xq.device)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=self.freqs_cis[:seqlen])
        xq, xk, xv = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        scores = torch.matmul(xq, xk.transpose(2, 3)) / math.sqrt(self.head_dim)
        mask = torch.full((seqlen, seqlen), float("-inf")).triu(1)
        scores = F.softmax((scores + mask).float(), dim=-1).type_as(xq)
        out = torch.matmul(scores, xv).transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(out)


class RotaryInForward(nn.Module):
    """The table computed in forward: polar, view_as_complex and the product all in the graph."""

    def forward(self, x):
        b, s, h, d = x.shape
        freqs_cis = precompute_freqs_cis(d, s)
        xc = torch.view_as_complex(x.reshape(b, s, h, d // 2, 2))
        return torch.view_as_real(xc * freqs_cis.view(1, s, 1, d // 2)).flatten(3)


def test_llama_rotary_attention_with_complex_freqs():
    torch.manual_seed(0)
    cm = _compile_and_match(LlamaAttention(), (torch.randn(2, 8, 32),))
    g = cm.stages[0].after
    # the complex table is a real constant in view_as_real's layout, shared with the model
    (table,) = [c for c in g.constants if c.source == "freqs_cis"]
    assert table.type.shape == (32, 4, 2) and table.type.dtype.value == "f32"
    assert all("complex" not in str(v.type) for n in g.nodes for v in n.outputs)


def test_llama_rotary_attention_with_a_dynamic_sequence_length():
    torch.manual_seed(0)
    model = LlamaAttention().eval()
    seq = torch.export.Dim("seq", min=2, max=16)
    cm = fexplore.compile(model, (torch.randn(2, 8, 32),), dynamic_shapes={"x": {1: seq}})
    for n in (3, 16):
        x = torch.randn(2, n, 32)
        torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-5)


def test_rotary_table_made_in_forward_with_polar():
    torch.manual_seed(0)
    cm = _compile_and_match(RotaryInForward(), (torch.randn(1, 6, 2, 8),))
    ops = _ops(cm.stages[0].after)
    assert "cos" in ops and "sin" in ops  # polar became r*cos, r*sin


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _c(x):
    return torch.view_as_complex(x)


def _r(z):
    return torch.view_as_real(z)


def _complex_cases():
    g = torch.Generator().manual_seed(1)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    return {
        "complex_div": (lambda a, b, c, d: _r(torch.complex(a, b) / torch.complex(c, d)),
                        (r(3, 4), r(3, 4), r(3, 4), r(3, 4))),
        "conj_exp_abs": (lambda x: _r(_c(x).conj() * _c(x).exp()).sum(-1) + _c(x).abs(),
                         (r(3, 4, 2),)),
        "real_imag": (lambda x: _c(x).real * 2 + _c(x).imag, (r(3, 4, 2),)),
        "sum_mean": (lambda x: _r(_c(x).sum(-1)) + _r(_c(x).mean(0)).sum(), (r(3, 4, 2),)),
        "cat_transpose_permute": (lambda x: _r(torch.cat(
            [_c(x), _c(x).transpose(0, 1)[:3, :3]], dim=-1).permute(1, 0)).flatten(1),
            (r(3, 3, 2),)),
        "stack_neg_negative_dims": (lambda x: _r(torch.stack([_c(x), -_c(x)], dim=-1))[..., -1, :],
                                    (r(3, 4, 2),)),
        "python_complex_and_real_operands": (
            lambda x, y: _r(_c(x) * 1j + y - _c(x) / 2 - 1), (r(3, 4, 2), r(3, 4))),
        "real_0d_tensor_operand": (lambda x, s: _r(_c(x) * s - s), (r(3, 4, 2), torch.tensor(1.5))),
        "complex128": (lambda x: _r(_c(x).to(torch.complex128) * 2).float(), (r(3, 4, 2),)),
        "where_ones_like": (lambda x: _r(torch.where(x[..., 0] > 0, _c(x), torch.ones_like(_c(x)))),
                            (r(3, 4, 2),)),
        "real_to_complex": (lambda x: _r(x.to(torch.complex64) * torch.polar(torch.ones_like(x), x)),
                            (r(3, 4),)),
        "complex_matmul": (lambda x: _r(_c(x) @ _c(x).T @ x[..., 0].to(torch.complex64)),
                           (r(3, 3, 2),)),
        "reciprocal_rsub_rdiv": (lambda x: _r(1 - _c(x)) + _r(2 / _c(x)) + _r(_c(x).reciprocal()),
                                 (r(3, 4, 2),)),
        "integer_powers": (lambda x: _r(_c(x) ** 2 + _c(x) ** -3 + _c(x) ** 5 + _c(x) ** 0),
                           (r(3, 4, 2),)),
        "sgn_full_reduction": (lambda x: _r(_c(x).sgn()) + _r(_c(x).sum()), (r(3, 4, 2),)),
        "creation_and_indexing": (lambda x, i: _r((torch.zeros(3, 4, dtype=torch.cfloat)
                                                   + _c(x))[i].chunk(2, dim=-1)[1]),
                                  (r(3, 4, 2), torch.tensor([2, 0]))),
        "roll_flip_expand": (lambda x: _r(_c(x).roll(1, -1).flip(0)[..., None]
                                          .expand(3, 4, 2).reshape(-1)), (r(3, 4, 2),)),
        # discrete Fourier transforms: contractions with constant cos / sin tables
        "fftn_real_part": (lambda x: torch.fft.fftn(x, dim=(-1, -2)).real, (r(2, 8, 12),)),  # FNet's mixing
        "fft_ortho_of_complex": (lambda x: _r(torch.fft.fft(_c(x), norm="ortho")), (r(3, 10, 2),)),
        "rfft_magnitude": (lambda x: torch.fft.rfft(x).abs(), (r(4, 12),)),
        "rfft2_scaled_irfft2": (lambda x: torch.fft.irfft2(torch.fft.rfft2(x) * 0.5, s=x.shape[-2:]),
                                (r(2, 6, 10),)),
        "irfft_odd_length": (lambda x: torch.fft.irfft(torch.fft.rfft(x) * 1j, n=9), (r(3, 9),)),
        "fft2_zero_padded_and_complex_pad": (lambda x: _r(torch.fft.fft2(x, s=(8, 10)))[:, :5] + _r(
            torch.nn.functional.pad(torch.fft.fft2(x), (1, 2), value=1.5)), (r(2, 5, 7),)),
        "ifft_of_fft_forward_norm": (lambda x: _r(torch.fft.ifft(torch.fft.fft(x, dim=0, norm="forward"), dim=0,
                                                                 norm="forward")), (r(5, 7),)),
    }


COMPLEX_CASES = _complex_cases()


@pytest.mark.parametrize("name", sorted(COMPLEX_CASES))
def test_complex_arithmetic_decomposes_to_real(name):
    fn, inputs = COMPLEX_CASES[name]
    _compile_and_match(Fn(fn), inputs)


def test_complex_values_at_the_model_boundary_and_unknown_complex_ops_are_refused():
    x = torch.randn(3, 4, 2)
    with pytest.raises(ExportError, match="output 0 is a complex tensor"):
        fexplore.compile(Fn(lambda x: _c(x) * 2), (x,))
    with pytest.raises(ExportError, match="input .* is a complex tensor"):
        fexplore.compile(Fn(lambda z: _r(z * 2)), (_c(x),))
    with pytest.raises(UnsupportedOperatorError) as info:
        fexplore.compile(Fn(lambda x: torch.angle(_c(x))), (x,))
    assert info.value.op == "aten.angle.default" and "on complex tensors" in str(info.value)
    assert "complex_converter" in info.value.hint


# -- mixture of experts ---------------------------------------------------------------------------

class Expert(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.w1 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)
        self.w3 = nn.Linear(d, f, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MixtralDenseMoE(nn.Module):
    """Mixtral routing (softmax, top-2, renormalize), computed densely: every expert on every
    token, weighted by its gathered routing weight; expert load from one_hot and histc."""

    def __init__(self, d=16, f=32, n_experts=4, top_k=2):
        super().__init__()
        self.gate = nn.Linear(d, n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(d, f) for _ in range(n_experts))
        self.n_experts, self.top_k = n_experts, top_k

    def forward(self, hidden_states):
        b, s, d = hidden_states.shape
        h = hidden_states.view(-1, d)
        routing_weights = F.softmax(self.gate(h), dim=1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
        routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
        expert_mask = F.one_hot(selected_experts, num_classes=self.n_experts)  # (t, k, e)
        per_expert = (routing_weights.unsqueeze(-1) * expert_mask).sum(1)  # (t, e)
        out = torch.zeros_like(h)
        for i, expert in enumerate(self.experts):
            out = out + expert(h) * per_expert[:, i:i + 1]
        tokens_per_expert = expert_mask.sum((0, 1))
        load = torch.histc(selected_experts.float(), bins=self.n_experts, min=0,
                           max=self.n_experts - 1)
        return out.view(b, s, d), tokens_per_expert, load


class SwitchScatterMoE(nn.Module):
    """Switch-style top-1 routing into fixed-capacity expert slots: a token's slot is a running
    count (cumsum of the one-hot), tokens go in with index_add, results come back with gather
    and scatter_add. All shapes are static."""

    def __init__(self, d=16, f=32, n_experts=4, capacity=8):
        super().__init__()
        self.gate = nn.Linear(d, n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(d, f) for _ in range(n_experts))
        self.n_experts, self.capacity = n_experts, capacity

    def forward(self, x):
        t, d = x.shape
        probs = F.softmax(self.gate(x), dim=-1)
        gate, expert_index = probs.max(dim=-1)
        one_hot = F.one_hot(expert_index, self.n_experts)
        position = (torch.cumsum(one_hot, dim=0) * one_hot).sum(-1) - 1
        position = position.clamp(max=self.capacity - 1)
        slot = expert_index * self.capacity + position
        buf = torch.zeros(self.n_experts * self.capacity, d, dtype=x.dtype)
        buf = buf.index_add(0, slot, x).view(self.n_experts, self.capacity, d)
        outs = torch.stack([e(buf[i]) for i, e in enumerate(self.experts)]).view(-1, d)
        y = outs.gather(0, slot.unsqueeze(-1).expand(t, d))
        rows = torch.arange(t).unsqueeze(-1).expand(t, d)
        y = torch.zeros_like(x).scatter_add(0, rows, y)
        return y * gate.unsqueeze(-1), torch.histc(expert_index.float(), bins=self.n_experts)


class SharedExpertScatterMoE(nn.Module):
    """DeepSeek/Qwen-MoE style: top-k weights scattered into a dense (tokens, experts) routing
    matrix, expert outputs combined with einsum, plus a sigmoid-gated shared expert."""

    def __init__(self, d=16, f=24, n_experts=4, top_k=2):
        super().__init__()
        self.gate = nn.Linear(d, n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(d, f) for _ in range(n_experts))
        self.shared_expert = Expert(d, 2 * f)
        self.shared_expert_gate = nn.Linear(d, 1, bias=False)
        self.top_k = top_k

    def forward(self, x):
        scores = self.gate(x).softmax(dim=-1)
        topk_weight, topk_idx = torch.topk(scores, self.top_k, dim=-1, sorted=False)
        routing = torch.zeros_like(scores).scatter(1, topk_idx, topk_weight)
        expert_out = torch.stack([e(x) for e in self.experts], dim=1)  # (t, e, d)
        y = torch.einsum("te,ted->td", routing, expert_out)
        return y + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


class MixtralSparseMoE(nn.Module):
    """The Hugging Face Mixtral loop: each expert's tokens found with torch.where(mask)."""

    def __init__(self, d=16, f=32, n_experts=4):
        super().__init__()
        self.gate = nn.Linear(d, n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(d, f) for _ in range(n_experts))
        self.n_experts = n_experts

    def forward(self, x):
        w, sel = torch.topk(F.softmax(self.gate(x), -1), 2, -1)
        expert_mask = F.one_hot(sel, self.n_experts).permute(2, 1, 0)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            idx, top_x = torch.where(expert_mask[i])
            out.index_add_(0, top_x, expert(x[top_x]) * w[top_x, idx, None])
        return out


class BincountLoad(nn.Module):
    def forward(self, logits):
        return torch.bincount(logits.argmax(-1), minlength=4)


def test_mixtral_dense_moe_with_expert_counts():
    torch.manual_seed(0)
    model = MixtralDenseMoE()
    x = torch.randn(2, 5, 16)
    cm = _compile_and_match(model, (x,))
    _, counts, load = cm(x)
    assert counts.sum() == 20 and load.sum() == 20  # 10 tokens, 2 experts each


def test_switch_moe_scatters_tokens_to_capacity_slots():
    torch.manual_seed(0)
    _compile_and_match(SwitchScatterMoE(), (torch.randn(10, 16),))


def test_shared_expert_moe_with_scattered_routing_weights():
    torch.manual_seed(0)
    _compile_and_match(SharedExpertScatterMoE(), (torch.randn(10, 16),))


@pytest.mark.parametrize("bins,lo,hi", [(4, 0, 3), (5, -1.0, 1.0), (3, 0, 0)])
def test_histc_matches_torch(bins, lo, hi):
    x = torch.tensor([[-2.0, -1.0, -0.5, 0.0], [0.25, 0.5, 1.0, 3.0], [2.0, 1.5, 0.75, -0.25]])
    _compile_and_match(Fn(lambda x: torch.histc(x, bins=bins, min=lo, max=hi)), (x,))


def test_moe_gathering_tokens_with_where_is_refused_on_the_users_line():
    model = MixtralSparseMoE().eval()
    with pytest.raises(UnsupportedOperatorError) as info:
        fexplore.compile(model, (torch.randn(10, 16),))
    err = info.value
    assert err.op == "aten.nonzero.default"
    assert "depends on the values" in str(err) and "torch.where(mask)" in str(err)
    assert err.loc.file == __file__
    assert err.loc.line == _line_of(MixtralSparseMoE.forward, "torch.where(expert_mask[i])")


def test_bincount_is_refused_with_a_dense_alternative():
    with pytest.raises(UnsupportedOperatorError) as info:
        fexplore.compile(BincountLoad().eval(), (torch.randn(6, 4),))
    assert info.value.op == "aten.bincount.default"
    assert "largest input value" in str(info.value) and "one_hot" in info.value.hint


class PositionsFromACounter(torch.nn.Module):
    """BERT-family decoders over a static cache: ``position_ids[:, n:n + seq]`` with ``n`` the
    cache's counter read by ``.item()``, a slice of a static length from a position read at run
    time."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(64.0).reshape(1, 64) * 0.5)

    def forward(self, x, counter):
        n = counter.item()
        return x + self.table[:, n:n + x.shape[1]]


class RollsByACounter(torch.nn.Module):
    def forward(self, x, counter):
        return x.roll(counter.item(), 1)   # THE ROLL LINE


def test_a_slice_from_a_position_read_from_a_tensor_is_taken_at_run_time():
    """The slice's start was torch's placeholder for the value (``u0``), read as 0: a silently
    wrong ingest, caught only by the numeric check. It is a gather at start + arange(length) now,
    right at every counter."""
    model = PositionsFromACounter()
    x = torch.randn(1, 3)
    cm = fexplore.compile(model, (x, torch.tensor(5)))
    assert cm.verification["ok"].all()
    for n in (0, 7, 61):
        torch.testing.assert_close(cm(x, torch.tensor(n)), model(x, torch.tensor(n)))


class RowAtACounter(torch.nn.Module):
    """The row (and the column) at a position read by ``.item()``: a token's embedding at the
    cache's counter, counted from the end when negative."""

    def forward(self, x, counter):
        i = counter.item()
        torch._check(i >= -x.shape[0])
        torch._check(i < x.shape[0])
        return x[i] * 2, x[:, i]


def test_the_element_at_a_position_read_from_a_tensor_is_taken_at_run_time():
    """``x[i]`` with ``i`` read by ``.item()`` was refused (FX400); it is a gather of the one row
    at i (from the end when negative) now, right at every counter."""
    model = RowAtACounter()
    x = torch.randn(5, 6)
    cm = fexplore.compile(model, (x, torch.tensor(1)))
    assert cm.verification["ok"].all() and not cm.lowering.host_ops
    for n in (0, 4, -1, -5):
        got, want = cm(x, torch.tensor(n)), model(x, torch.tensor(n))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)


def test_another_op_given_a_value_read_from_a_tensor_is_refused_by_name_and_line():
    """A value read by ``.item()`` anywhere else than a slice's start or a select is refused clearly (it was a
    raw 'Cannot convert symbols to int' out of a converter)."""
    with pytest.raises(UnsupportedOperatorError) as info:
        fexplore.compile(RollsByACounter(), (torch.randn(1, 5), torch.tensor(1)))
    err = info.value
    assert "read from a tensor's contents" in str(err) and "index_select" in err.hint
    assert err.loc.file == __file__ and err.loc.line == _line_of(RollsByACounter.forward, "THE ROLL LINE")


# -- multimodal token merging (LLaVA) --------------------------------------------------------------

class LlavaMerge(nn.Module):
    def __init__(self, vocab=20, d=16, vision_dim=12, image_token_index=3):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.multi_modal_projector = nn.Sequential(nn.Linear(vision_dim, d), nn.GELU(),
                                                   nn.Linear(d, d))
        self.image_token_index = image_token_index

    def forward(self, input_ids, image_features):
        inputs_embeds = self.embed_tokens(input_ids)
        image_features = self.multi_modal_projector(image_features)
        special_image_mask = (input_ids == self.image_token_index).unsqueeze(-1)
        special_image_mask = special_image_mask.expand_as(inputs_embeds)
        image_features = image_features.to(inputs_embeds.device, inputs_embeds.dtype)
        return inputs_embeds.masked_scatter(special_image_mask, image_features)


def test_llava_merges_image_features_with_masked_scatter():
    torch.manual_seed(0)
    ids = torch.tensor([[1, 3, 3, 5, 3, 7], [3, 2, 3, 3, 9, 1]])
    feats = torch.randn(2, 3, 12)
    _compile_and_match(LlavaMerge(), (ids, feats))


class PromptTemplateMerge(nn.Module):
    """Image features written over a fixed prompt's image tokens by boolean-mask assignment, as
    older LLaVA code and VLA policies with a fixed instruction template do."""

    def __init__(self, d=16, vision_dim=12, image_token_index=3):
        super().__init__()
        self.embed_tokens = nn.Embedding(20, d)
        self.projector = nn.Linear(vision_dim, d)
        self.register_buffer("prompt_ids", torch.tensor([[1, 3, 3, 5, 3, 7], [3, 2, 3, 3, 9, 1]]))
        self.image_token_index = image_token_index

    def forward(self, image_features):
        inputs_embeds = self.embed_tokens(self.prompt_ids)
        image_mask = self.prompt_ids == self.image_token_index
        inputs_embeds[image_mask] = self.projector(image_features).reshape(-1, inputs_embeds.shape[-1])
        return inputs_embeds


def test_image_features_by_boolean_mask_assignment():
    torch.manual_seed(0)
    _compile_and_match(PromptTemplateMerge(), (torch.randn(2, 3, 12),))


class MaskedAssignments(nn.Module):
    def forward(self, x, keep, row):
        x = x.clone()
        x[x > 1.0] = 1.0  # a scalar over a mask of every axis
        x[keep] = row  # one (d,) row for every true position
        return x


def test_boolean_mask_assignment_of_broadcast_values():
    torch.manual_seed(0)
    _compile_and_match(MaskedAssignments(), (torch.randn(2, 3, 4), torch.randn(2, 3) > 0,
                                             torch.randn(4)))


# -- multi-query attention -------------------------------------------------------------------------

class MultiQueryAttention(nn.Module):
    """One shared key/value head (Falcon, StarCoder), broadcast to the query heads."""

    def __init__(self, d=32, n_heads=4, broadcast="expand", use_sdpa=True, max_len=16):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d // n_heads
        self.q_proj = nn.Linear(d, d)
        self.kv_proj = nn.Linear(d, 2 * self.head_dim)
        self.o_proj = nn.Linear(d, d)
        self.broadcast, self.use_sdpa = broadcast, use_sdpa
        self.register_buffer("bias", torch.tril(torch.ones(max_len, max_len))
                             .view(1, 1, max_len, max_len))

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k, v = self.kv_proj(x).split(self.head_dim, dim=-1)
        k, v = k.unsqueeze(1), v.unsqueeze(1)  # (b, 1, t, hd): one head
        if self.broadcast == "expand":
            k = k.expand(b, self.n_heads, t, self.head_dim)
            v = v.expand(b, self.n_heads, t, self.head_dim)
        elif self.broadcast == "repeat_interleave":
            k = k.repeat_interleave(self.n_heads, dim=1)
            v = v.repeat_interleave(self.n_heads, dim=1)
        if self.use_sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               enable_gqa=self.broadcast == "gqa")
        else:  # by hand; a single k/v head broadcasts in the matmuls
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            if self.broadcast == "none":  # nanoGPT's causal buffer
                causal = self.bias[:, :, :t, :t] != 0
            else:
                causal = torch.ones(t, t, dtype=torch.bool).tril()
            att = att.masked_fill(~causal, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).contiguous().view(b, t, -1))


@pytest.mark.parametrize("broadcast,use_sdpa", [
    ("expand", True), ("repeat_interleave", True), ("gqa", True),
    ("expand", False), ("repeat_interleave", False), ("none", False)])
def test_multi_query_attention(broadcast, use_sdpa):
    torch.manual_seed(0)
    _compile_and_match(MultiQueryAttention(broadcast=broadcast, use_sdpa=use_sdpa),
                       (torch.randn(2, 6, 32),))


# -- audio (1-d) and video (3-d) convolution and pooling -------------------------------------------

class AudioEncoder(nn.Module):
    """A Whisper/wav2vec-like front end over (batch, channels, time)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(2, 8, 3, padding=1)
        self.conv2 = nn.Conv1d(8, 8, 5, stride=2, padding=2, groups=2)
        self.pool = nn.MaxPool1d(3, stride=2, padding=1)
        self.avg = nn.AvgPool1d(2)
        self.head = nn.AdaptiveAvgPool1d(5)

    def forward(self, x):
        x = F.gelu(self.conv1(x))
        x = self.pool(F.gelu(self.conv2(x)))
        return self.head(self.avg(x))


class VideoNet(nn.Module):
    """An R3D/I3D-like stem over (batch, channels, time, height, width)."""

    def __init__(self, n_classes=5):
        super().__init__()
        self.stem = nn.Conv3d(3, 8, (3, 5, 5), stride=(1, 2, 2), padding=(1, 2, 2), bias=False)
        self.bn = nn.BatchNorm3d(8)
        self.pool = nn.MaxPool3d((1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))
        self.conv = nn.Conv3d(8, 8, 3, padding=1, groups=2)
        self.avg = nn.AvgPool3d(2)
        self.head_pool = nn.AdaptiveAvgPool3d(1)
        self.fc = nn.Linear(8, n_classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.stem(x))))
        x = self.avg(F.relu(self.conv(x)))
        return self.fc(self.head_pool(x).flatten(1))


def test_audio_encoder_1d():
    torch.manual_seed(0)
    _compile_and_match(AudioEncoder(), (torch.randn(2, 2, 40),))


def test_video_net_3d_is_one_contraction_per_conv3d():
    torch.manual_seed(0)
    model = VideoNet()
    model.bn.running_mean.uniform_(-0.5, 0.5)
    model.bn.running_var.uniform_(0.5, 1.5)
    cm = _compile_and_match(model, (torch.randn(1, 3, 4, 16, 16),))
    assert _ops(cm.stages[0].after).count("conv2d") == 2
    # MaxPool3d exports with its indices, unused here: simplify makes both of its 2-d passes plain
    # max pools (the cheaper kernel; the indices form carries positions too)
    assert cm["simplify"].stats["rules_fired"]["drop-unused-pool-indices"] == 2
    assert "max_pool2d_with_indices" not in _ops(cm["simplify"].after)
    assert not cm.lowering.host_ops, [(h.op, h.reason) for h in cm.lowering.host_ops]


def test_max_pool_indices_stay_where_they_are_read():
    """Indices that something reads keep the indices form (unpooling needs them): the rule looks
    at uses, not at the op alone."""
    def pool(x):
        y, where = F.max_pool2d(x, 2, return_indices=True)
        return F.max_unpool2d(y * 2, where, 2), F.max_pool2d(x, 3, 1, 1, return_indices=True)[0]

    cm = _compile_and_match(Fn(pool), (torch.randn(1, 2, 6, 6),))
    ops = _ops(cm["simplify"].after)
    assert ops.count("max_pool2d_with_indices") == 1 and ops.count("max_pool2d") == 1


def _nd_cases():
    g = torch.Generator().manual_seed(2)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    torch.manual_seed(2)
    conv3d = nn.Conv3d(4, 6, (3, 2, 3), stride=(2, 1, 2), padding=(2, 1, 0), dilation=(2, 1, 1),
                       groups=2, bias=False)
    conv1d = nn.Conv1d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2)
    return {
        "conv3d_strided_dilated_grouped": (conv3d, (r(2, 4, 7, 5, 6),)),
        "conv3d_pointwise": (nn.Conv3d(2, 3, 1), (r(1, 2, 3, 4, 4),)),
        "conv1d_strided_dilated_grouped": (conv1d, (r(2, 4, 11),)),
        "max_pool3d_ceil_dilated": (Fn(lambda x: F.max_pool3d(
            x, (3, 2, 3), stride=(2, 1, 2), padding=1, dilation=(1, 2, 1), ceil_mode=True)),
            (r(2, 3, 7, 6, 7),)),
        "avg_pool3d_ceil_exclude_pad": (Fn(lambda x: F.avg_pool3d(
            x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
            (r(1, 2, 6, 7, 5),)),
        "avg_pool3d_ceil_include_pad": (Fn(lambda x: F.avg_pool3d(
            x, 3, stride=2, padding=1, ceil_mode=True)), (r(1, 2, 6, 7, 5),)),
        "avg_pool3d_divisor_override": (Fn(lambda x: F.avg_pool3d(x, 2, divisor_override=3)),
                                        (r(1, 2, 4, 4, 4),)),
        "adaptive_avg_pool3d_uneven": (Fn(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 2))),
                                       (r(1, 2, 5, 7, 5),)),
        "max_pool1d_ceil": (Fn(lambda x: F.max_pool1d(x, 3, 2, 1, ceil_mode=True)),
                            (r(2, 3, 10),)),
        "avg_pool1d_exclude_pad": (Fn(lambda x: F.avg_pool1d(
            x, 4, 3, 2, ceil_mode=True, count_include_pad=False)), (r(2, 3, 10),)),
        "adaptive_avg_pool1d": (Fn(lambda x: F.adaptive_avg_pool1d(x, 4)), (r(2, 3, 10),)),
        "conv1d_unbatched": (nn.Conv1d(3, 4, 3, padding=1), (r(3, 10),)),
        # adaptive max pooling: overlapping uneven windows, with the indices, and ties (few
        # distinct values) that torch resolves to the first cell in row-major order
        "adaptive_max_pool2d_uneven_indices_ties": (Fn(lambda x: F.adaptive_max_pool2d(
            x, (3, 4), return_indices=True)), (torch.randint(0, 3, (2, 3, 7, 9), generator=g).float(),)),
        "adaptive_max_pool2d_divisible": (Fn(lambda x: F.adaptive_max_pool2d(x, (2, 3))), (r(1, 4, 8, 9),)),
        "adaptive_max_pool2d_unbatched_uneven": (Fn(lambda x: F.adaptive_max_pool2d(x, 3)), (r(4, 5, 7),)),
        "adaptive_max_pool1d_indices": (Fn(lambda x: F.adaptive_max_pool1d(x, 4, return_indices=True)),
                                        (torch.randint(0, 4, (2, 3, 10), generator=g).float(),)),
        "adaptive_max_pool3d_uneven_indices": (Fn(lambda x: F.adaptive_max_pool3d(
            x, (2, 3, 2), return_indices=True)), (torch.randint(0, 5, (1, 2, 5, 7, 5), generator=g).float(),)),
        # Tensor.unfold: sliding windows as a new last axis (PatchTST's patching), overlapping,
        # along a middle axis, more windows than elements per window and the reverse, 0-d
        "unfold_overlapping_patches": (Fn(lambda x: x.unfold(-1, 16, 8) * 2.0), (r(2, 3, 40),)),
        "unfold_middle_axis": (Fn(lambda x: x.unfold(1, 5, 1) + 1.0), (r(3, 9, 4),)),
        "unfold_many_small_windows": (Fn(lambda x: x.unfold(0, 2, 2) - 1.0), (r(9, 7),)),
        "unfold_0d": (Fn(lambda x: x.unfold(0, 1, 1) * 3.0), (torch.tensor(1.5),)),
        # nearest upsampling by a scale factor: torch's source index is dst / scale (in float32),
        # not dst * in / out; an axis whose size does not change (3 * 1.3 -> 3) is a copy
        "nearest_scale_1_7": (Fn(lambda x: F.interpolate(x, scale_factor=1.7) * 1.0), (r(2, 3, 4, 4),)),
        "nearest_scale_0_6": (Fn(lambda x: F.interpolate(x, scale_factor=0.6) * 1.0), (r(2, 3, 4, 4),)),
        "nearest_scales_per_axis": (Fn(lambda x: F.interpolate(x, scale_factor=(1.3, 2.9)) * 1.0),
                                    (r(1, 2, 3, 9),)),
        "adaptive_max_pool3d_divisible": (Fn(lambda x: F.adaptive_max_pool3d(x, (2, 2, 1))), (r(1, 2, 4, 6, 5),)),
        "conv_transpose1d_vocoder_upsample": (nn.ConvTranspose1d(4, 6, 16, stride=8, padding=4,
                                                                 groups=2), (r(2, 4, 5),)),
        "conv_transpose1d_crop_unbatched": (nn.ConvTranspose1d(3, 2, 3, stride=2, padding=3,
                                                               output_padding=1), (r(3, 6),)),
        "conv_transpose3d": (nn.ConvTranspose3d(4, 2, (2, 3, 3), stride=(2, 2, 1),
                                                padding=(0, 1, 1), output_padding=(1, 0, 0)),
                             (r(1, 4, 3, 4, 4),)),
        "conv3d_unbatched": (nn.Conv3d(3, 4, 3, padding=1), (r(3, 4, 5, 5),)),
    }


ND_CASES = _nd_cases()


@pytest.mark.parametrize("name", sorted(ND_CASES))
def test_nd_convolution_and_pooling(name):
    model, inputs = ND_CASES[name]
    _compile_and_match(model, inputs)


# -- empty with a memory format --------------------------------------------------------------------

class ChannelsLastBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        buf = torch.empty(x.shape, memory_format=torch.channels_last)
        buf.copy_(x * 2)
        ones = torch.empty_like(x, memory_format=torch.channels_last)
        ones.fill_(1.0)
        y = self.conv(buf + ones)
        out = torch.empty((x.shape[0], 4) + tuple(x.shape[2:]),
                          memory_format=torch.channels_last)
        out[:, :, 1:] = y[:, :, 1:]
        out[:, :, :1] = -y[:, :, :1]
        return out


def test_empty_with_memory_format_then_filled():
    torch.manual_seed(0)
    _compile_and_match(ChannelsLastBuffers(), (torch.randn(2, 3, 5, 5),))


# -- names with any characters ---------------------------------------------------------------------

class OddlyNamed(nn.Module):
    def __init__(self):
        super().__init__()
        self.add_module("block-1", nn.Linear(8, 8))
        self.params = nn.ParameterDict({"w-1": nn.Parameter(torch.randn(8)),
                                        "scale x:y": nn.Parameter(torch.rand(8) + 0.5)})
        self.register_buffer("offset-0", torch.arange(8.0))

    def forward(self, x):
        y = getattr(self, "block-1")(x) * self.params["w-1"] * self.params["scale x:y"]
        return y + getattr(self, "offset-0")


def test_names_with_any_characters_round_trip_through_the_ir_text():
    torch.manual_seed(0)
    cm = _compile_and_match(OddlyNamed(), (torch.randn(3, 8),))
    g = cm.stages[0].after
    text = str(g)
    assert 'const %"block-1.weight": f32[8, 8] = param "block-1.weight"' in text
    assert '%"params.scale x:y"' in text and '%"offset-0"' in text
    assert "%x: f32[3, 8]" in text  # plain names stay unquoted
    back = parse(text, payloads=g.payloads)
    assert back == g
    assert {c.name for c in back.constants} >= {"block-1.weight", "params.w-1", "offset-0"}


def test_any_value_name_reads_back():
    from fexplore.ir import Attrs, DType, Graph, Node, TensorType, Value, get_op

    t = TensorType((2,), DType.f32)
    x = Value('in "quoted" é\\n', t)
    y = Value("layers-0.out#1", t)
    neg = get_op("neg")
    g = Graph("forward", [x], [], [Node(neg, [x], Attrs(neg.complete_attrs({})), [y], None)],
              [y], {})
    text = str(g)
    assert '%"layers-0.out#1"' in text
    assert parse(text) == g


@pytest.mark.parametrize("name", ["llama_rotary", "mixtral_moe", "video"])
def test_families_compile_with_bf16_precision(name):
    torch.manual_seed(0)
    model, inputs = {"llama_rotary": (LlamaAttention(), (torch.randn(2, 8, 32),)),
                     "mixtral_moe": (MixtralDenseMoE(), (torch.randn(2, 5, 16),)),
                     "video": (VideoNet(), (torch.randn(1, 3, 4, 16, 16),))}[name]
    cm = fexplore.compile(model.eval(), inputs, precision="bf16")
    assert bool(cm.verification["ok"].all())


def test_unbatched_3d_pooling_runs_as_a_batch_of_one():
    """(C, D, H, W) video clips without a batch axis: max (with indices), average and adaptive
    pooling, as torch takes them."""
    F = torch.nn.functional

    class Clip(torch.nn.Module):
        def forward(self, x):
            peak, where = F.max_pool3d(x, 2, return_indices=True)
            return (F.adaptive_avg_pool3d(x, (2, 3, 2)), F.avg_pool3d(x, 2), peak, where,
                    F.max_pool3d(x, 3, 1, 1))

    x = torch.randn(3, 4, 6, 5)
    model = Clip()
    cm = fexplore.compile(model, (x,))
    for got, want in zip(cm(x), model(x)):
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got, want)


class StridedViews(nn.Module):
    """``as_strided`` views as sliding-window attention writes them: overlapping chunks of a
    contiguous tensor, one with a storage offset, one of a transpose nobody copied (its storage
    is the untransposed tensor's), and one of a slice that starts past the storage's start."""

    def forward(self, x):
        chunks = x.as_strided((3, 4, 2), (8, 2, 1))            # windows of 4 rows of 2, 2 apart
        shifted = x.view(2, 16).as_strided((2, 2, 4), (16, 4, 1), 4)
        untransposed = x.transpose(0, 1).as_strided((3, 4), (2, 1))
        tail = x.reshape(-1)[2:].as_strided((4,), (3,))
        return chunks * 2.0, shifted + 1.0, untransposed, tail


@pytest.mark.parametrize("target", ["rngd", "tiny"])
def test_as_strided_views_are_row_gathers_equal_to_eager(target):
    x = torch.randn(4, 8)
    cm = fexplore.compile(StridedViews(), (x,), target=target)
    assert bool(cm.verification["ok"].all()) and not cm.lowering.host_ops
    for g, w in zip(cm(x), StridedViews()(x)):
        assert torch.equal(g, w)


def test_longformers_sliding_chunk_attention_compiles_and_matches_eager():
    """transformers' Longformer (local attention: its chunks are as_strided views of the queries
    and keys), on the chip, equal to eager."""
    import transformers

    class LocalAttention(nn.Module):   # the encoder without global tokens (whose count is data)
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            h = self.m.embeddings(input_ids=ids)
            mask = torch.zeros(ids.shape, dtype=h.dtype)
            for layer in self.m.encoder.layer:
                h = layer(h, attention_mask=mask, is_index_masked=mask < 0, is_index_global_attn=mask > 0,
                          is_global_attn=False)[0]
            return h

    torch.manual_seed(0)
    c = transformers.LongformerConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, max_position_embeddings=66, attention_window=4,
                                      pad_token_id=1)
    model = LocalAttention(transformers.LongformerModel(c).eval())
    ids = torch.randint(2, 96, (1, 16))
    cm = fexplore.compile(model, (ids,))
    assert bool(cm.verification["ok"].all()) and not cm.lowering.host_ops
    with torch.no_grad():
        torch.testing.assert_close(cm(ids), model(ids), rtol=1.3e-6, atol=2e-5)
