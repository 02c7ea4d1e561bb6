"""Contraction and convolution shapes that real models hold and that once went to the host:
grouped and depthwise convolutions, strides that do not divide the image, a pad and a conv1d
folded into the kernel, weights tied to an embedding or transposed in the region, two matmuls in
a row, sizes that do not divide the tensor tile, a batch of one. Each compiles with every
contraction or convolution as a generated kernel, and every stage verifies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fexplore
from variants import compile_variant, matrix


class Depthwise(nn.Module):        # ConvNeXt's 7x7 depthwise conv, then an activation
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 16, 7, padding=3, groups=16)

    def forward(self, x):
        return F.gelu(self.c(x))


class Grouped(nn.Module):          # groups=4 with a stride, 2 output channels per input channel
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(16, 32, 3, padding=1, groups=4, stride=2)

    def forward(self, x):
        return self.c(x)


class OddStride(nn.Module):        # a 37x37 image, stride 2: the last window is partial
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, stride=2)

    def forward(self, x):
        return self.c(x)


class PadThenConv(nn.Module):      # "same" padding written as a pad before the conv
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(4, 8, 3, stride=2)

    def forward(self, x):
        return self.c(F.pad(x, (0, 1, 0, 1)))


class PositionalConv1d(nn.Module):  # Wav2Vec2's positional conv: a grouped conv1d
    def __init__(self):
        super().__init__()
        self.c = nn.Conv1d(16, 16, 5, padding=2, groups=4)

    def forward(self, x):
        return F.gelu(self.c(x))


class TiedHead(nn.Module):         # lm_head tied to the embedding table
    def __init__(self):
        super().__init__()
        self.e = nn.Embedding(50, 24)
        self.ln = nn.LayerNorm(24)

    def forward(self, i):
        return self.ln(self.e(i)) @ self.e.weight.t()


class TransposedRight(nn.Module):  # x @ y^T with y an activation (attention-like, no softmax)
    def forward(self, x, y):
        return x @ y.transpose(-1, -2) * 0.5


class TwoMatmuls(nn.Module):       # two matmuls in a row, odd sizes
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(20, 37)
        self.b = nn.Linear(37, 13)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class HeadsMerged(nn.Module):      # GPT-2's output projection: (1, H, T, D) -> (T, H*D) @ W
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(24, 24) * 0.2)

    def forward(self, a):
        return a.permute(0, 2, 1, 3).reshape(a.shape[2], -1) @ self.w


class CrossBroadcast(nn.Module):   # each operand broadcasts along the batch axis the other has
    def forward(self, a, b):
        return torch.matmul(a, b) + torch.matmul(a[..., :1, :], b[..., :1])


CASES = {
    "depthwise": (Depthwise, lambda: (torch.randn(1, 16, 13, 13),)),
    "groups4": (Grouped, lambda: (torch.randn(2, 16, 11, 11),)),
    "odd_stride": (OddStride, lambda: (torch.randn(1, 3, 37, 37),)),
    "pad_then_conv": (PadThenConv, lambda: (torch.randn(1, 4, 15, 15),)),
    "conv1d_grouped": (PositionalConv1d, lambda: (torch.randn(1, 16, 33),)),
    "tied_lm_head": (TiedHead, lambda: (torch.randint(0, 50, (1, 7)),)),
    "transposed_right": (TransposedRight, lambda: (torch.randn(2, 9, 20), torch.randn(2, 11, 20))),
    "two_matmuls": (TwoMatmuls, lambda: (torch.randn(1, 9, 20),)),
    "heads_merged": (HeadsMerged, lambda: (torch.randn(1, 4, 5, 6),)),
    # (1, 2) x (2, 1) batches: the weights' view kept a broadcast batch axis (fuzz seed 1270324)
    "cross_broadcast": (CrossBroadcast, lambda: (torch.randn(1, 2, 3, 5), torch.randn(2, 1, 5, 4))),
}


@pytest.mark.parametrize("case, target, precision", matrix(sorted(CASES)))
def test_contraction_and_convolution_gaps_are_generated_kernels(case, target, precision):
    make, inputs = CASES[case]

    def explore():
        torch.manual_seed(0)
        return fexplore.explore(make().eval(), inputs())
    cm = compile_variant(("contraction gaps", case), explore, target=target, precision=precision)
    low = cm.stages[-1].lowering
    host = [(x.op, x.reason) for x in low.host_ops if x.op != "embedding"]   # the gather is another part
    assert not host, host
    assert not cm.codegen_bugs, cm.codegen_bugs
    kinds = {k.kernel.kind for k in low.kernels}
    assert kinds & {"contraction", "convolution"}, kinds
    assert cm.verification["ok"].all(), cm.verification


def test_a_depthwise_convolution_runs_on_the_vector_unit():
    torch.manual_seed(0)
    cm = fexplore.compile(Depthwise().eval(), (torch.randn(1, 16, 13, 13),), target="rngd", verify=False)
    gk = next(k.kernel for k in cm.stages[-1].lowering.kernels if k.kernel.kind == "convolution")
    assert gk.parts[0] == "depthwise" and "fl.contract" not in gk.source


def test_a_weight_permute_other_than_a_transpose_is_refused_with_its_reason():
    from test_lang_codegen import Body

    from fexplore.lang import codegen

    b = Body()
    x = b.input("x", (2, 4, 6))
    w = b.input("w", (6, 2, 5))
    node = b.region(b("matmul", x, b("permute", w, perm=(1, 0, 2))), kind="contraction")
    with pytest.raises(codegen.UnsupportedRegionError, match="permute .*transpose of the last two axes"):
        codegen.generate(node, "tiny")


class OneRowEinsum(torch.nn.Module):
    """XLNet's decode step: one token, batch 1, its heads projected by an einsum with a weight."""

    def __init__(self, eq, wshape):
        super().__init__()
        self.eq = eq
        self.w = torch.nn.Parameter(torch.randn(*wshape) / 8)

    def forward(self, a):
        return torch.einsum(self.eq, a, self.w)


@pytest.mark.parametrize("eq, a, w", [("ibh,hnd->ibnd", (1, 1, 32), (32, 4, 8)),
                                      ("ibnd,hnd->ibh", (1, 1, 4, 8), (32, 4, 8))])
def test_a_one_row_einsum_is_a_kernel_or_a_clear_refusal_never_a_codegen_bug(eq, a, w):
    torch.manual_seed(0)
    cm = fexplore.compile(OneRowEinsum(eq, w).eval(), (torch.randn(*a),))
    assert not cm.codegen_bugs, cm.codegen_bugs   # before: NotImplementedError in the generator
    assert bool(cm.verification["ok"].all()), cm.verification


class SelectedRowLinear(torch.nn.Module):
    def __init__(self, k, pick):
        super().__init__()
        self.lin = torch.nn.Linear(k, 17)
        self.pick = pick

    def forward(self, x):
        return torch.relu(self.lin(self.pick(x))) + 1


@pytest.mark.parametrize("shape, pick", [((3, 5), lambda x: x.select(0, 2)), ((2, 3, 5), lambda x: x[1, 2]),
                                         ((4, 3, 40), lambda x: x[2])],
                         ids=["row_of_a_matrix", "vector_of_a_3d_tensor", "matrix_of_a_3d_tensor"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_linear_of_selected_rows_is_one_kernel(shape, pick, precision):
    """Every leading axis selected away (a vector into a linear) still leaves the box a row axis
    for the contraction's m (fuzz seed 1560162: the kernel did not trace and ran on the host)."""
    torch.manual_seed(0)
    model, x = SelectedRowLinear(shape[-1], pick).eval(), torch.randn(*shape)
    cm = fexplore.compile(model, (x,), target="tiny", precision=precision)
    assert not cm.codegen_bugs, cm.codegen_bugs
    assert [k.kernel.kind for k in cm.kernels] == ["contraction"]
    assert bool(cm.verification["ok"].all()), cm.verification


class OneSlicedRowAgainstABatch(torch.nn.Module):
    def forward(self, x, y):
        return x.narrow(0, 1, 1) @ y.transpose(-1, -2)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_sliced_activation_broadcast_along_the_batch_reads_its_own_row(precision):
    """x[1:2] against a batch of 2: the generator indexed the slice by the batch's loop variable
    plus the start, so batch b read x[b + 1] (a wrong kernel, caught by the lower stage's check;
    out of bounds for fuzz seed 720646). Such a region is now lowered as its parts."""
    torch.manual_seed(0)
    x, y = torch.randn(4, 3, 5), torch.randn(2, 6, 5)
    cm = fexplore.compile(OneSlicedRowAgainstABatch(), (x, y), precision=precision)
    assert not cm.codegen_bugs, cm.codegen_bugs
    assert bool(cm.verification["ok"].all()), cm.verification
    assert "contraction" in [k.kernel.kind for k in cm.kernels]


class PermutedVectorLinear(torch.nn.Module):
    def __init__(self, k):
        super().__init__()
        self.lin = torch.nn.Linear(k, 17)

    def forward(self, x):
        return self.lin(x.transpose(0, 1).flatten())


@pytest.mark.parametrize("shape", [(3, 4), (5, 1), (1, 1)])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_vector_flattened_from_a_transpose_is_one_contraction_kernel(shape, precision):
    """A linear of a 1-d vector made by permuting then flattening a matrix: every axis is K and the
    result has no row axis; the box reads the input in its own layout along a unit row axis (fuzz
    seed 1790371: IndexError in the generator, the linear on the host)."""
    torch.manual_seed(0)
    model, x = PermutedVectorLinear(shape[0] * shape[1]).eval(), torch.randn(*shape)
    cm = fexplore.compile(model, (x,), target="tiny", precision=precision)
    assert not cm.codegen_bugs, cm.codegen_bugs
    assert [k.kernel.kind for k in cm.kernels] == ["contraction"]
    assert bool(cm.verification["ok"].all()), cm.verification
    tol = dict(rtol=2e-2, atol=2e-2) if precision == "bf16" else {}
    torch.testing.assert_close(cm(x), model(x).detach(), **tol)


def test_a_depthwise_conv_narrowed_to_bf16_fits_tiny_with_its_casts_counted():
    """An f32 input narrowed to bf16 for a depthwise convolution is loaded, rounded and widened back
    for the vector unit: three copies of the window. Its tiles were sized for one, and PVTv2's MLP
    depthwise convolutions (128 and 512 channels at 28 x 28) overflowed tiny's SRAM and ran on the
    host. Now the kernel is generated and every stage through `lower` verifies."""
    torch.manual_seed(0)
    for channels in (128, 512):
        model = nn.Conv2d(channels, channels, 3, padding=1, groups=channels).eval()
        x = torch.randn(1, channels, 28, 28)
        # through `lower`, the stage that placed it on the host (each kernel run against its region)
        ex = fexplore.explore(model, (x,), target="tiny", precision="bf16")
        lower = ex["lower"].stats
        assert lower["host_ops"] == 0 and not lower.get("codegen_bugs"), lower.get("codegen_bugs")
        assert all(r.verification.ok for r in ex.records)
        assert ex["lower"].verification.kernels is not None
