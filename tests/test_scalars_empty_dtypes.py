"""0-d tensors, empty tensors and every dtype real models carry are ordinary citizens: they enter,
flow through every stage, and come out of the CompiledModel with eager's dtypes and values."""

import pytest
import torch
import torch.nn.functional as F

import fexplore
from fexplore.ir import DType, parse
from fexplore.pipeline.convert import ir_dtype


def _compile_and_check(model, inputs):
    cm = fexplore.compile(model, inputs)
    assert cm.verification["ok"].all()
    got, want = cm(*inputs), model(*inputs)
    got_leaves = torch.utils._pytree.tree_leaves(got)
    want_leaves = torch.utils._pytree.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.is_floating_point:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(g, w)
    for r in cm.stages:
        assert parse(str(r.after), payloads=r.after.payloads) == r.after
    return cm


class OnlyAScalar(torch.nn.Module):
    def forward(self, x):
        return (x * x).sum()


class BoolInput(torch.nn.Module):
    def forward(self, x, keep):
        return torch.where(keep, x, -x).relu() + keep.float(), keep.logical_not()


class EmptyInput(torch.nn.Module):
    def forward(self, x):
        return torch.cat([x, x * 2], 0).sum(0), x.exp()


def test_a_model_whose_only_output_is_0d():
    cm = _compile_and_check(OnlyAScalar(), (torch.randn(3, 4),))
    assert cm.graph.outputs[0].type.shape == ()
    assert cm(torch.randn(3, 4)).shape == ()


def test_a_model_with_a_bool_input():
    x, keep = torch.randn(3, 4), torch.rand(3, 4) > 0.5
    cm = _compile_and_check(BoolInput(), (x, keep))
    assert cm.graph.inputs[1].type.dtype == DType.bool


def test_a_model_with_an_empty_input():
    cm = _compile_and_check(EmptyInput(), (torch.randn(0, 4),))
    assert cm.graph.inputs[0].type.shape == (0, 4)


_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
           torch.float16, torch.bfloat16, torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_every_dtype_has_an_ir_counterpart_and_flows_through(dtype):
    class Passes(torch.nn.Module):
        def forward(self, x):
            return x.clone(), (x.to(torch.float64) * 3).to(dtype)

    if dtype == torch.bool:
        x = torch.rand(2, 3) > 0.5
    elif dtype.is_floating_point:
        x = torch.randn(2, 3).to(dtype)
    else:
        x = torch.randint(0, 40, (2, 3), dtype=dtype)
    assert ir_dtype(dtype).numpy.itemsize == torch.tensor([], dtype=dtype).element_size()
    _compile_and_check(Passes(), (x,))


def test_mixed_integer_promotion_matches_torch():
    class Mixed(torch.nn.Module):
        def forward(self, u, i, s):
            return u + i, u * s, i.to(torch.int32) - s, (u > 3) & (i < 0)

    u = torch.randint(0, 255, (5,), dtype=torch.uint8)
    i = torch.randint(-100, 100, (5,), dtype=torch.int8)
    s = torch.randint(-1000, 1000, (5,), dtype=torch.int16)
    _compile_and_check(Mixed(), (u, i, s))


def test_f64_is_computed_in_f64():
    class Precise(torch.nn.Module):
        def forward(self, x):
            return (x + 1e-12) - x  # 1e-12 survives only in f64

    x = torch.rand(4, dtype=torch.float64) + 1.0
    cm = _compile_and_check(Precise(), (x,))
    assert (cm(x) > 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_norms_of_narrow_floats_are_computed_wide_as_torch_does(dtype):
    """torch's vector norm of f16/bf16 values sums their squares in f32 and rounds once: squares
    rounded to f16 overflow above 256 and underflow below ~2e-4 (fuzz seed 1190247:
    F.normalize of a single f16 value of 4e-4 gave 0.95, not 1)."""
    class Norms(torch.nn.Module):
        def forward(self, x):
            return (F.normalize(x, dim=-1), torch.linalg.vector_norm(x, dim=-1),
                    torch.linalg.vector_norm(x, 3, dim=0), torch.linalg.vector_norm(x, dtype=torch.float32))

    x = torch.tensor([[300.0, -400.0, 500.0], [4e-4, 0.0, 0.0], [3e-4, -2e-4, 1e-4]], dtype=dtype)
    want = Norms()(x)
    assert torch.isfinite(want[1]).all() and want[0][1, 0] == 1   # what eager gives, for the record
    cm = fexplore.compile(Norms(), (x,))
    for g, w in zip(cm(x), want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g.float(), w.float(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-3, atol=0)


def test_a_softmax_with_a_dtype_computes_in_that_dtype():
    """softmax(x, dim, dtype) casts x first and computes in dtype; its dtype is positional in
    aten.softmax.int, and was taken for _softmax's half_to_float: the softmax ran in f16 and its
    result was cast (OpInfo softmax.with_dtype in f16: 2e-4 off, against f32's 1e-5)."""
    class WithDtype(torch.nn.Module):
        def forward(self, x):
            return (torch.softmax(x, -1, dtype=torch.float32), torch.log_softmax(x, 0, torch.float32),
                    F.softmin(x, 1, dtype=torch.float32), torch.softmax(x.float(), -1, dtype=torch.float16))

    x = torch.randn(5, 7, dtype=torch.float16) * 4
    cm = fexplore.compile(WithDtype(), (x,))
    assert cm.verification["ok"].all()
    for g, w in zip(cm(x), WithDtype()(x)):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_means_and_pools_of_narrow_floats_run_on_the_chip(dtype):
    """A mean's kernel divides its f32 sum and casts the quotient: it wrote ``acc / K.astype(..)``,
    which does not trace, and the node fell back to the host (ResNet, ConvNeXt and BiT from
    Hugging Face in bf16 or f16; seen only in ``codegen_bugs``)."""
    class Means(torch.nn.Module):
        def forward(self, x):
            return F.adaptive_avg_pool2d(x, 1), x.mean(dim=(2, 3)), x.mean(1, keepdim=True)

    x = torch.randn(2, 8, 7, 7, dtype=dtype)
    cm = fexplore.compile(Means(), (x,))
    assert cm.verification["ok"].all()
    assert not cm["lower"].stats.get("codegen_bugs") and not cm.lowering.host_ops
    for g, w in zip(cm(x), Means()(x)):
        torch.testing.assert_close(g, w, rtol=1e-2, atol=1e-2)


def test_an_f16_output_folded_into_a_constant_is_held_to_f16s_tolerance():
    """torch's f16 linspace computes in f16 steps; the fold stage computes the constant exactly and
    rounds once: an ulp apart. The graph after folding has no node that carries f16, only its
    output, which was held to f32's tolerance (OpInfo linspace in f16)."""
    class Lin(torch.nn.Module):
        def forward(self, x):
            return torch.linspace(-3.3, 7.1, 50, dtype=torch.float16), x + 1

    x = torch.randn(3)
    cm = fexplore.compile(Lin(), (x,))
    assert cm.verification["ok"].all()
    # f16's tolerance, relative to the largest value (7.1): eager's steps drift by ~9 ulps near 1
    torch.testing.assert_close(cm(x)[0], Lin()(x)[0], rtol=1e-3, atol=1e-3 * 7.1)


class F64Rotary(torch.nn.Module):
    """Rotary angles in f64, as Hugging Face's Ergo makes them (f32 angles lose their phase at long
    positions): positions times inverse frequencies, each repeated twice (an expand and a reshape),
    cos and sin, cast to the activations' f32."""
    def __init__(self, seq: int = 8, dim: int = 8):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim))
        self.seq = seq

    def forward(self, x):
        pos = torch.arange(self.seq)[None, :]
        freqs = pos[..., None].double() * self.inv_freq.double()
        emb = torch.repeat_interleave(freqs, 2, dim=-1)
        return x * emb.cos().to(x.dtype) + x.flip(-1) * emb.sin().to(x.dtype)


@pytest.mark.parametrize("target", ["rngd", "tiny"])
def test_tables_computed_in_f64_from_constants_fold_and_leave_no_host_op(target):
    """The chip has no f64 datapath, so an f64 table left in the graph runs on the host on every
    call. Broadcasts of constants stay lazy (cheaper to regenerate than to store), but in f64 only
    the host could regenerate them: the repeat's expand was kept, and with it cos, sin and both
    casts went to the host. Folded, the tables are f32 constants and the kernel reads them."""
    x = torch.randn(1, 8, 8)
    cm = fexplore.compile(F64Rotary(), (x,), target=target)
    assert cm.verification["ok"].all()   # through lower and schedule: the kernels and the program
    assert not cm.lowering.host_ops
    assert not any(v.type.dtype == DType.f64 for n in cm["fold"].after.nodes for v in n.outputs)
    torch.testing.assert_close(cm(x), F64Rotary()(x), rtol=1e-5, atol=1e-6)


def test_empty_operands_are_refused_by_name_not_a_generator_crash():
    """A mean of nothing (nan) and a matmul over K = 0 (zeros plus the bias) have no tile to load:
    the generators crashed on them (a box of no elements, a division by zero) and the nodes went
    to the host as codegen bugs; they are refused clearly, and the interpreter gives torch's values."""
    class Empty(torch.nn.Module):
        def forward(self, x, a, b, bias):
            return torch.var_mean(x, unbiased=False), torch.addmm(bias, a, b)

    args = (torch.randn(0), torch.randn(3, 0), torch.randn(0, 4), torch.randn(4))
    cm = fexplore.compile(Empty(), args)
    assert not cm.codegen_bugs
    assert cm.lowering.host_ops and all("empty operand" in h.reason for h in cm.lowering.host_ops)
    for g, w in zip(torch.utils._pytree.tree_leaves(cm(*args)), torch.utils._pytree.tree_leaves(Empty()(*args))):
        torch.testing.assert_close(g, w, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_arithmetic_on_scalars_alone_runs_on_the_chip(dtype):
    """A bound computed from a statistic (T5 in f16 clamps its activations by finfo.max - 1000
    where any is inf): its scalar ops were host ops, for want of a tile shape."""
    class Clamp(torch.nn.Module):
        def forward(self, x):
            m = x.abs().amax()
            c = torch.where(torch.isinf(x).any(), m - 1000, m)
            return torch.clamp(x, min=-c, max=c), (m * 2 + 1).neg(), c

    x = torch.randn(4, 6, dtype=dtype) * 3
    cm = fexplore.compile(Clamp(), (x,))
    assert cm.verification["ok"].all()
    assert not cm.lowering.host_ops and not cm["lower"].stats.get("codegen_bugs")
    scalar_kernels = [k for k in cm.kernels if k.kernel.kind == "vector" and "one element: one PE" in k.kernel.source]
    assert scalar_kernels
    for g, w in zip(cm(x), Clamp()(x)):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w)


def test_a_0d_tensor_input_and_0d_intermediates_used_again():
    class Temperature(torch.nn.Module):
        def forward(self, logits, t):
            peak = logits.amax()  # 0-d, used again below
            return torch.softmax((logits - peak) / t, -1), peak * t

    _compile_and_check(Temperature(), (torch.randn(2, 5), torch.tensor(0.7)))


def test_topk_sort_max_and_min_of_a_0d_tensor_along_its_one_axis():
    """torch takes dim 0 or -1 of a 0-d tensor as its one element (OpInfo's topk sample #7, and
    max/min with a dim: the value itself and index 0)."""
    class Ranks(torch.nn.Module):
        def forward(self, x):
            values, where = torch.topk(x, 1)
            top, at = torch.max(x, dim=0)
            low, at_low = torch.min(x.int(), dim=-1, keepdim=True)
            return values * 2.0, where, torch.sort(x, descending=True).values, top + 1.0, at, low, at_low

    _compile_and_check(Ranks(), (torch.tensor(-8.5),))


class IntegerBits(torch.nn.Module):
    """Integer elementwise work of every kind: bit operations, shifts, wrapping arithmetic,
    comparisons, a select and a sum, with constants that need more than 24 bits."""

    def forward(self, a, b, w):
        bits = ((a & b) | 0x1234567) ^ (~a >> 3)
        wrapped = a * 3 + b - 16777217 + (b << 7)
        picked = torch.where(a == b + 1, a, torch.maximum(a, b))
        return bits, wrapped, picked, (a > b), w * 1000003 + w.sum(-1, keepdim=True)


def test_integer_elementwise_ops_on_the_chip_are_exact_above_2_24():
    # f32 holds integers exactly only up to 2^24: an integer op computed through it loses the
    # low bits of these values (and a == b + 1 turns true for neighbours that differ)
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-2**31, 2**31 - 1, (4, 64), dtype=torch.int32, generator=g)
    b = torch.randint(-2**31, 2**31 - 1, (4, 64), dtype=torch.int32, generator=g)
    b[0] = a[0] - 1   # neighbours: equal when rounded to f32
    w = torch.randint(-2**40, 2**40, (4, 64), dtype=torch.int64, generator=g)
    cm = _compile_and_check(IntegerBits(), (a, b, w))
    # it really ran as kernels on the chip (no op left to the host), through the vector unit
    assert (cm.report()["how"] != "host").all()
    assert cm(a, b, w)[2][0].equal(a[0])


def test_gather_with_0d_and_empty_operands():
    """torch.gather takes a 0-d input or index as one element, and an empty index reads nothing
    whatever the ranks (OpInfo's gather samples #3 to #6)."""
    class Gathers(torch.nn.Module):
        def forward(self, scalar, row, at, at_0d, empty):
            return (torch.gather(scalar, 0, at_0d) * 2.0, torch.gather(scalar, 0, at) + 1.0,
                    torch.gather(row, 0, at_0d + 2) - 1.0, torch.gather(row, 0, empty))

    inputs = (torch.tensor(-8.5), torch.randn(5, generator=torch.Generator().manual_seed(0)),
              torch.tensor([0, 0]), torch.tensor(0), torch.zeros(2, 0, dtype=torch.long))
    _compile_and_check(Gathers(), inputs)


def test_scatter_add_of_0d_tensors_and_a_cat_of_empty_ones():
    """OpInfo's scatter_add #6 (every operand 0-d: one element) and cat #4 (two empty (0,)
    tensors, which torch's legacy rule drops: an empty result)."""
    class Odd(torch.nn.Module):
        def forward(self, x, at, src, e1, e2):
            return torch.scatter_add(x, 0, at, src) * 2.0, torch.cat([e1, e2]) + 1.0

    inputs = (torch.tensor(1.5), torch.tensor(0), torch.tensor(-4.0), torch.zeros(0), torch.zeros(0))
    _compile_and_check(Odd(), inputs)


@pytest.mark.parametrize("target", ["rngd", "tiny"])
def test_values_with_no_elements_inside_a_model_fold_away(target):
    """Hugging Face models at small configs make empty values inside forward: a rotary half of
    zero width rotated and concatenated back (GPT-NeoX-Japanese: the schedule declared a DRAM
    tensor of shape (1, 4, 8, 0), FX501), a concat with an empty operand (DeepSeek-V4: a host op),
    a strided slice assignment that takes nothing from an axis of one (Qwen3.5's rotary: the
    converter stated the slice's end as 1 - 3 + 1, FX403). Empty values are constants."""
    class Empties(torch.nn.Module):
        def forward(self, x, y):
            rot, rest = x[..., :0], x[..., 0:]
            rot = rot * 2 + torch.cat([-rot, rot], -1)[..., :0]
            h = torch.cat([rot, rest], -1)
            z = y.clone()
            z[..., 1:33:3] = y[..., 1:33:3] * 3     # nothing on an axis of one
            return torch.softmax(h @ h.transpose(-1, -2), -1) @ h, z + 1, x[:, :, :0].sum(-1)

    g = torch.Generator().manual_seed(0)
    inputs = (torch.randn(1, 4, 8, 8, generator=g), torch.randn(3, 1, generator=g))
    cm = fexplore.compile(Empties(), inputs, target=target)
    assert cm.verification["ok"].all(), cm.verification
    assert not cm.lowering.host_ops and not cm.codegen_bugs
    for got, want in zip(cm(*inputs), Empties()(*inputs)):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert cm["fold"].stats["empty_values"] >= 3


def test_integer_products_with_float_scalars_sums_with_a_dtype_bool_pads_and_broadcast_masks():
    """From OpInfo with more samples per entry: addmv/addbmm/addmm on integers take float beta and
    alpha as integers (2.6 is 2); an int32 sum with dtype=int32 stays int32; a bool tensor padded
    with True; masked_scatter where the mask has more axes than the input (they broadcast)."""
    class Mixed(torch.nn.Module):
        def forward(self, i, m, v, b1, b2, small, flags, x, mask, src):
            return (torch.addmv(i, m, v, beta=1.7, alpha=2.6), torch.addmv(i, m, v, beta=0.2, alpha=0.6),
                    torch.addbmm(small, b1, b2, beta=1.6, alpha=2.2), torch.addmm(small, m.int(), b2[0], alpha=3.5),
                    (m.int() * 3).sum(dim=1, dtype=torch.int32),
                    torch.nn.functional.pad(flags, (1, 2), value=True),
                    torch.masked_scatter(x, mask, src))

    g = torch.Generator().manual_seed(0)
    inputs = (torch.tensor([5, 10, -7]), torch.tensor([[1, 2], [3, 4], [5, 6]]), torch.tensor([3, 1]),
              torch.randint(-4, 5, (2, 3, 2), dtype=torch.int32, generator=g),
              torch.randint(-4, 5, (2, 2, 3), dtype=torch.int32, generator=g),
              torch.full((3, 3), 5, dtype=torch.int32), torch.tensor([[True, False], [False, True]]),
              torch.randn(5, generator=g), torch.rand(2, 5, generator=g) > 0.5, torch.randn(2, 5, generator=g))
    _compile_and_check(Mixed(), inputs)


def test_integer_powers_on_the_chip_follow_torch():
    """Integer pow runs on integer lanes with torch's meaning: a negative exponent gives 1 or -1 for
    bases 1 and -1 and 0 otherwise (f32 lanes gave inf and fractions), and results above 2^24 are
    exact (OpInfo's __rpow__ on int64 and int32)."""
    class Powers(torch.nn.Module):
        def forward(self, base, exponent):
            return base ** exponent, 3 ** exponent

    base = torch.tensor([[0, 1, -1, 2, -3, 7, 5, -1], [2, 1, -1, 0, 3, 13, -7, 1]])
    exponent = torch.tensor([[-1, -5, -3, -2, 3, 9, 11, 2], [0, 7, -4, 4, 15, 7, 9, -8]])
    cm = _compile_and_check(Powers(), (base, exponent))
    assert (cm.report()["how"] != "host").all()
    assert cm(base, exponent)[0][0].tolist() == [0, 1, -1, 0, -27, 40353607, 48828125, 1]


def test_unsigned_with_signed_promotes_to_a_type_holding_both_or_refuses():
    from fexplore.ir.types import promote_pair

    assert promote_pair(DType.u16, DType.i16) == DType.i32
    assert promote_pair(DType.u32, DType.i8) == DType.i64
    assert promote_pair(DType.u16, DType.i64) == DType.i64
    assert promote_pair(DType.u8, DType.u32) == DType.u32
    assert promote_pair(DType.bool, DType.u64) == DType.u64
    with pytest.raises(TypeError, match="no integer type holds both u64 and i64"):
        promote_pair(DType.u64, DType.i64)   # numpy would give f64 and round the values
