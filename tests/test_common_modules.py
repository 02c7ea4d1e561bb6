"""Modules and functions real models use beyond the zoo: each compiles, verifies after every
stage, and matches eager. (The project is measured on real models; these are their parts.)"""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fexplore


class Fn(nn.Module):
    def __init__(self, fn, *mods):
        super().__init__()
        self.fn = fn
        self.mods = nn.ModuleList(mods)

    def forward(self, *xs):
        return self.fn(self, *xs)


class GroupedMM(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("offs", torch.tensor([3, 3, 8], dtype=torch.int32))  # group 1 empty

    def forward(self, x, w):
        return F.grouped_mm(x, w, offs=self.offs)


def _filled(out, a, b):
    out[..., :2].copy_(a)
    out[..., 2:].copy_(b)
    return out * 2


def _buckets(x):
    edges = torch.arange(1 / 8, 1.0, 1 / 8)
    return torch.bucketize(x, edges, right=True) * 10 + torch.bucketize(x, edges)


def _cases():
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    with torch.random.fork_rng():
        torch.manual_seed(0)
        return {
            "multihead_attention": (Fn(lambda s, x: s.mods[0](x, x, x, need_weights=False)[0],
                                       nn.MultiheadAttention(16, 4, batch_first=True)),
                                    (r(2, 5, 16),)),
            "transformer_encoder_layer": (Fn(lambda s, x: s.mods[0](x), nn.TransformerEncoderLayer(
                16, 4, 32, batch_first=True, dropout=0.0)), (r(2, 5, 16),)),
            "group_norm": (Fn(lambda s, x: s.mods[0](x), nn.GroupNorm(2, 4)), (r(2, 4, 3, 3),)),
            "interpolate_nearest": (Fn(lambda s, x: F.interpolate(x, scale_factor=2)),
                                    (r(1, 2, 3, 3),)),
            "interpolate_bilinear": (Fn(lambda s, x: F.interpolate(
                x, size=(5, 7), mode="bilinear", align_corners=False)), (r(1, 2, 3, 3),)),
            "interpolate_bilinear_aligned": (Fn(lambda s, x: F.interpolate(
                x, scale_factor=2, mode="bilinear", align_corners=True)), (r(1, 2, 3, 4),)),
            # antialiased resizing (a vision model resizing its position embeddings or an image):
            # shrinking averages every cell an output covers, growing interpolates; once FX400
            "interpolate_antialias_bilinear": (Fn(lambda s, x: F.interpolate(
                x, size=(5, 11), mode="bilinear", antialias=True) + F.interpolate(
                x, size=(16, 3), mode="bilinear", antialias=True, align_corners=True).sum()),
                (r(2, 3, 9, 7),)),
            "interpolate_antialias_bicubic": (Fn(lambda s, x: F.interpolate(
                x, scale_factor=(0.37, 1.7), mode="bicubic", antialias=True)), (r(1, 2, 19, 13),)),
            "einsum": (Fn(lambda s, a, b: torch.einsum("bij,bjk->bik", a, b)),
                       (r(2, 3, 4), r(2, 4, 5))),
            "flip_roll": (Fn(lambda s, x: torch.flip(x, [1]) + torch.roll(x, 1, 0)), (r(3, 4),)),
            "topk_sort": (Fn(lambda s, x: torch.topk(x, 2, dim=-1).values.sum(-1)
                             + torch.sort(x, -1).values[:, 0]), (r(3, 5),)),
            "normalize_prod_std": (Fn(lambda s, x: F.normalize(x, dim=-1).prod(-1) + x.std(-1)),
                                   (r(3, 5),)),
            "index_put_cache": (Fn(lambda s, c, x, i: c.index_put((i,), x)),
                                (torch.zeros(6, 4), r(2, 4), torch.tensor([1, 4]))),
            "slice_assignment": (Fn(lambda s, c, x: torch.slice_scatter(c, x, 1, 2, 4)),
                                 (torch.zeros(3, 6), r(3, 2))),
            "depthwise_conv_hardswish": (Fn(lambda s, x: F.hardswish(s.mods[0](x)),
                                            nn.Conv2d(4, 4, 3, padding=1, groups=4)),
                                         (r(1, 4, 5, 5),)),
            "padding_embedding": (Fn(lambda s, i: s.mods[0](i).mean(1),
                                     nn.Embedding(10, 4, padding_idx=0)),
                                  (torch.tensor([[0, 3, 5]]),)),
            "activations": (Fn(lambda s, x: F.elu(x) + F.leaky_relu(x) + F.softplus(x)
                               + F.mish(x) + F.hardsigmoid(x)), (r(3, 4),)),
            "lstm": (Fn(lambda s, x: s.mods[0](x)[0], nn.LSTM(4, 8, batch_first=True)),
                     (r(2, 3, 4),)),
            "baddbmm": (Fn(lambda s, a, b, c: torch.baddbmm(c, a, b)),
                        (r(2, 3, 4), r(2, 4, 5), r(2, 3, 5))),
            "conv_transpose": (Fn(lambda s, x: s.mods[0](x), nn.ConvTranspose2d(
                2, 3, 3, stride=2, padding=1, output_padding=1)), (r(1, 2, 4, 5),)),
            "conv_transpose_grouped": (Fn(lambda s, x: s.mods[0](x), nn.ConvTranspose2d(
                4, 6, (2, 3), stride=(2, 1), groups=2, dilation=(1, 2))), (r(2, 4, 3, 3),)),
            # the boolean causal mask Hugging Face models build: full(True) then tril
            "bool_full_causal_mask": (Fn(lambda s, x: x.masked_fill(
                ~torch.full((4, 4), True, dtype=torch.bool).tril(), -1e9).softmax(-1)),
                (r(2, 4, 4),)),
            # a runtime check on a tensor condition (torch._check_tensor_all)
            "tensor_condition_check": (Fn(lambda s, x: (torch._check_tensor_all(
                x.abs() < 1e6, lambda: "too big"), x * 2)[1]), (r(3, 4),)),
            # how a vision-language model writes image features into its placeholder tokens
            "masked_scatter": (Fn(lambda s, x, src: x.masked_scatter(x[..., :1] > 0, src)),
                               (r(2, 5, 3), r(2, 5, 3) + 10)),
            "masked_scatter_same_shape_mask": (Fn(lambda s, x, src: x.masked_scatter(
                x > 0.5, src)), (r(3, 4), r(12) - 10)),
            # a negative pad crops: RWKV's time shift is ZeroPad2d((0, 0, 1, -1))
            "negative_pad_time_shift": (Fn(lambda s, x: s.mods[0](x) + F.pad(x, (-1, 1, 2, -2)),
                                           nn.ZeroPad2d((0, 0, 1, -1))), (r(2, 5, 4),)),
            # batch norm over the input's own statistics (BiT's weight standardization)
            "batch_statistics_norm": (Fn(lambda s, x: F.batch_norm(
                x, None, None, training=True, eps=1e-6) + F.batch_norm(
                x, None, None, s.mods[0].weight, s.mods[0].bias, training=True),
                nn.BatchNorm2d(3)), (r(2, 3, 4, 5) * 3 + 1,)),
            # an empty tensor filled by slice copies (how DeepSeek-V3 assembles its keys)
            "new_empty_filled_by_copies": (Fn(lambda s, a, b: _filled(a.new_empty(2, 3, 5), a, b)),
                                           (r(2, 3, 2), r(2, 3, 3))),
            # how MoE layers count tokens per expert: histc over float expert ids, and over
            # values with some outside [min, max] and some exactly at max
            "histc_tokens_per_expert": (Fn(lambda s, x: torch.histc(
                torch.topk(x, 2, dim=-1).indices.flatten().float(), bins=4, min=0, max=3)
                * torch.histc(x, bins=4, min=-1.0, max=1.0)), (r(6, 4),)),
            "cumsum_to_i32": (Fn(lambda s, x: torch.cumsum(x, 0, dtype=torch.int32) * 3),
                              (torch.tensor([2.0, 0.0, 1.0, 5.0]),)),
            # MoE experts over tokens sorted by expert (torch's kernel takes bf16 only)
            "grouped_mm": (GroupedMM(), (r(8, 16).bfloat16(), r(3, 16, 8).bfloat16())),
            "histc_at_max": (Fn(lambda s, x: torch.histc(x.clamp(-2, 1.5), bins=5, min=-1.0,
                                                          max=1.5)), (r(20),)),
            # position ids of a patch grid (Idefics3/SmolVLM vision embeddings): bucketize over
            # fixed boundaries, values exactly on a boundary included; searchsorted per row of a
            # sequence the model sorts itself (a random input would not be sorted)
            "bucketize_patch_grid": (Fn(lambda s, x: _buckets(torch.cat([x, torch.arange(0.0, 1.0, 0.25)]))),
                                     (torch.rand(6),)),
            "searchsorted_rows": (Fn(lambda s, seq, x: torch.searchsorted(
                torch.sort(seq, -1).values, x, right=True, out_int32=True).to(torch.int64)
                + torch.searchsorted(torch.sort(seq, -1).values, x)), (r(3, 9), r(3, 4))),
            # the boundaries passed in, sorted: the random input set must keep them sorted
            # (torch's answer on unsorted boundaries is unspecified; OpInfo's bucketize samples)
            "bucketize_sorted_input": (Fn(lambda s, x, edges: torch.bucketize(x, edges, right=True)),
                                       (r(4, 5), torch.sort(r(7)).values)),
            # EfficientNet's head: AvgPool2d(hidden_dim=2560, ceil_mode=True) over a 2x2 map, one
            # window far larger than the input (the reference once padded the input to 2560^2)
            "pool_window_beyond_the_input": (Fn(lambda s, x: s.mods[0](x) + s.mods[1](x), nn.AvgPool2d(
                2560, ceil_mode=True), nn.MaxPool2d(2560, ceil_mode=True)), (r(1, 8, 2, 3),)),
            # multi-query attention: one key/value head broadcast over the query heads
            "attention_shared_kv_head": (Fn(lambda s, q, k, v: F.scaled_dot_product_attention(
                q, k, v)), (r(2, 4, 5, 8), r(2, 1, 5, 8), r(2, 1, 5, 8))),
        }


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_common_module_compiles_and_matches_eager(name):
    model, inputs = CASES[name]
    model.eval()
    cm = fexplore.compile(model, inputs)
    assert all(r.verification.ok for r in cm.stages)
    with torch.no_grad():
        torch.testing.assert_close(cm(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)


def test_an_unsupported_form_is_a_clear_error_on_the_users_line():
    model = Fn(lambda s, x: x[x > 0].sum()).eval()  # a boolean mask: data-dependent size
    with pytest.raises(fexplore.errors.FexploreError) as info:
        fexplore.compile(model, (torch.randn(8),))
    assert info.value.code.startswith("FX4")
    assert "boolean-mask" in str(info.value)
    assert info.value.loc is not None and info.value.loc.file == __file__



@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_batch_norm_in_training_mode_compiles_and_matches_eager(dtype):
    """Batch statistics of a half input, as torch's decomposition takes them: in f32, only the
    output rounded (the converter had kept the half dtype throughout)."""
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3, track_running_stats=False)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([0.5, 2.0, -1.0]))
        bn.bias.copy_(torch.tensor([0.1, -0.3, 4.0]))
    model = Fn(lambda s, x: s.mods[0](x) * 2, bn).to(dtype).train()
    x = (torch.randn(2, 3, 6, 5) * 3 + 1).to(dtype)
    cm = fexplore.compile(model, (x,))
    assert all(r.verification.ok for r in cm.stages)
    with torch.no_grad():
        want = model(x)
    tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(cm(x), want, rtol=tol, atol=tol)


def test_a_half_batch_norm_updating_its_running_statistics_carries_them_as_state():
    """torch returns the functional form's updated running statistics in f32 for a half input
    (the converter gave them the input's dtype: FX403), then writes them into the bf16 buffers.
    The buffers are state the compiled model carries: after two calls they are eager's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).to(torch.bfloat16).train()
    cm = fexplore.compile(model, (torch.randn(2, 3, 6, 6, dtype=torch.bfloat16),))
    assert all(r.verification.ok for r in cm.stages)
    twin = copy.deepcopy(model)
    for _ in range(2):
        x = torch.randn(2, 3, 6, 6, dtype=torch.bfloat16)
        with torch.no_grad():
            want = twin(x)
        torch.testing.assert_close(cm(x), want, rtol=2e-2, atol=2e-2)
    for name, value in twin.named_buffers():
        assert cm.state[name].dtype == value.dtype
        torch.testing.assert_close(cm.state[name], value, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("precision, bound", [("bf16", 0.02), ("fp8", 0.15)])
def test_an_antialiased_resize_under_a_narrow_policy_is_held_to_eagers_error_under_it(mode, precision, bound):
    """Ingest makes the resize two matmuls, which the policy narrows: eager's twin under the policy
    rounds the resize's input as well (policy_noise), or the check holds the chip's narrowed
    contractions to f32's tolerance (FX301 at the precision stage)."""
    model = Fn(lambda s, x: F.interpolate(x, size=(6, 5), mode=mode, antialias=True)).eval()
    x = torch.randn(1, 4, 13, 9)
    cm = fexplore.compile(model, (x,), precision=precision, target="tiny")
    assert cm.verification["ok"].all(), cm.verification
    err = float((cm(x) - model(x)).abs().max())
    assert 0 < err < bound
