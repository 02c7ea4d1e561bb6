"""The grouped contraction of a mixture of experts (``grouped_matmul``, torch's grouped_mm): the IR
op's semantics, its generated kernel against the IR interpreter over routings the kernel cannot see
when it is traced, a whole sorted-experts layer compiled and run, and what the kernel moves."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fexplore
from fexplore.ir import Attrs, DType, Node, TensorType, Value, get_op
from fexplore.lang.codegen import generate
from fexplore.npu.config import get_target
from fexplore.testing.mutants import SortedExperts

OP = get_op("grouped_matmul")


def _node(S, K, N, G, transposed=False, dtype=DType.f32, out=DType.f32):
    attrs = Attrs(OP.complete_attrs({"transpose_w": transposed, "out_dtype": out}))
    w = (G, N, K) if transposed else (G, K, N)
    ins = [Value("x", TensorType((S, K), dtype)), Value("w", TensorType(w, dtype)),
           Value("ends", TensorType((G,), DType.i64))]
    return Node(OP, ins, attrs, [Value("y", TensorType((S, N), out))], None), attrs


def test_rows_past_the_last_end_are_zero_and_the_rest_are_torchs():
    torch.manual_seed(0)
    x, w = torch.randn(10, 16).bfloat16(), torch.randn(3, 16, 8).bfloat16()
    offs = torch.tensor([3, 3, 8], dtype=torch.int32)
    want = F.grouped_mm(x, w, offs=offs).float()[:8]
    (got,) = OP.reference([x.float().numpy(), w.float().numpy(), offs.numpy()], Attrs(OP.complete_attrs({})))
    torch.testing.assert_close(torch.from_numpy(got[:8]), want, rtol=2e-2, atol=2e-2)
    assert not got[8:].any()


def test_ends_that_decrease_are_refused_when_run():
    with pytest.raises(ValueError, match="must not decrease"):
        OP.reference([np.ones((4, 2), np.float32), np.ones((2, 2, 3), np.float32), np.array([3, 1])],
                     Attrs(OP.complete_attrs({})))


# (S, K, N, G, ends, transposed, target, tm): tm None is the generator's choice; small ones make
# row tiles that two or more groups share, and tiles past the last end
KERNEL_CASES = {
    "one-tile-empty-group": (8, 16, 8, 3, [3, 3, 8], False, "rngd", None),
    "all-rows-in-the-last-group": (8, 16, 8, 3, [0, 0, 8], True, "rngd", None),
    "no-rows-at-all": (8, 16, 8, 3, [0, 0, 0], False, "rngd", None),
    "ends-past-the-rows": (9, 12, 20, 4, [2, 5, 11, 40], False, "rngd", 4),
    "odd-sizes-on-tiny": (37, 24, 50, 5, [0, 9, 9, 30, 33], True, "tiny", None),
    "tile-of-one-row": (13, 8, 12, 4, [1, 1, 7, 13], False, "tiny", 1),
    "groups-sharing-tiles": (40, 16, 24, 9, [2, 3, 5, 8, 13, 21, 22, 23, 31], True, "rngd", 8),
    "more-groups-than-rows": (5, 16, 8, 16, [0, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 4, 5, 5, 5, 5], False, "rngd", None),
    "many-tiles-tiny": (100, 64, 96, 7, [0, 0, 0, 0, 0, 0, 3], False, "tiny", 16),
    # a mixture of 512 experts (Qwen3-Next) on tiny: the step table is worked out a block of groups
    # at a time (all 512 at once do not fit its SRAM beside a block of steps)
    "512-groups-on-tiny": (48, 16, 8, 512, sorted(np.random.default_rng(1).integers(0, 49, 512).tolist()),
                           True, "tiny", None),
    # an expert's down projection from a wide hidden layer (Solar-Open's 1,280) on tiny: a step's
    # rows of x are 4 x 1,280 f32, every K slab of them more than half a PE's SRAM twice over; in a
    # panel of one column tile each slab is used once and its buffer reused
    "wide-experts-down-on-tiny": (12, 1280, 24, 4, [3, 3, 9, 12], False, "tiny", None),
}


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul")   # the row of inf, on purpose
@pytest.mark.parametrize("name", sorted(KERNEL_CASES))
def test_generated_kernel_equals_the_interpreter(name):
    S, K, N, G, ends, transposed, target, tm = KERNEL_CASES[name]
    node, attrs = _node(S, K, N, G, transposed)
    cfg = get_target(target)
    gk = generate(node, cfg)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((S, K)).astype(np.float32)
    w = rng.standard_normal(node.inputs[1].type.shape).astype(np.float32)
    x[S // 2] = np.inf   # one row's inf reaches that row's result only, never another group's rows
    ends = np.array(ends, np.int64)
    (want,) = OP.reference([x, w, ends], attrs)
    k = gk.kernel()
    got = np.asarray(k(*gk.arguments([x, w, ends]), target=cfg, **({"tm": tm} if tm else {})))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_wide_panels_past_the_unroll_limit_give_way_to_narrower_ones():
    """128 experts of 2 x 1,280 columns (Solar-Open's gate and up projections) over 64 routed rows
    on tiny: the widest panels that fit SRAM take tiles of 4 columns, 25,280 steps a PE, past what
    the kernel unrolls; narrower panels with wider tiles are taken instead."""
    from fexplore.lang.codegen.grouped import MAX_STEPS, steps_per_pe
    from fexplore.pipeline.stages.tiles import tile_params

    node, _ = _node(64, 64, 2560, 128, transposed=True)
    cfg = get_target("tiny")
    t = tile_params(generate(node, cfg).kernel())
    assert steps_per_pe(64, 2560, 64, 128, cfg, **t) <= MAX_STEPS and t["tp"] < 2560 // cfg.num_pes, t


def test_bf16_operands_accumulate_in_f32_and_write_bf16():
    node, attrs = _node(24, 32, 16, 3, dtype=DType.bf16, out=DType.bf16)
    gk = generate(node, get_target("rngd"))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((24, 32)).astype(DType.bf16.numpy)
    w = rng.standard_normal((3, 32, 16)).astype(DType.bf16.numpy)
    ends = np.array([5, 17, 24])
    (want,) = OP.reference([x.astype(np.float32), w.astype(np.float32), ends], attrs)
    got = gk.run([x, w, ends])[0]
    assert got.dtype == DType.bf16.numpy
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("target,precision", [("rngd", "fp32"), ("tiny", "bf16")])
def test_sorted_experts_compile_to_grouped_kernels_and_run_on_the_chip(target, precision):
    """transformers' default expert layer (tokens sorted by expert, histc offsets, grouped_mm):
    each projection is one generated grouped kernel, nothing runs on the host, and every stage,
    the kernels and the simulated program agree with eager (the compile verifies them)."""
    g = torch.Generator().manual_seed(0)
    model = SortedExperts(g).eval()
    x = torch.randn(12, 16, generator=g).bfloat16()
    cm = fexplore.compile(model, (x,), target=target, precision=precision)
    lower = cm["lower"].stats
    assert lower["host_ops"] == 0 and not lower.get("codegen_bugs")
    grouped = [k for k in cm.kernels if k.node.op.name == "grouped_matmul" and k.how == "generated"]
    assert len(grouped) == 2
    assert bool(cm.verification["ok"].all())
    torch.testing.assert_close(cm(x), model(x), rtol=3e-2, atol=3e-2)


def test_the_experts_weights_move_a_few_times_per_call_not_once_per_row():
    """At a real width (meta device, timing only): the program reads each expert's weights a few
    times (a static grid's boundary steps re-read a group's matrix), where a gather of every row's
    own expert matrix read them once per row. The bound the test holds: all DRAM traffic of the
    layer under four times its expert weights."""
    with torch.device("meta"):
        model = SortedExperts(width=512, experts=8, hidden=512).eval()
    x = torch.empty(128, 512, dtype=torch.bfloat16, device="meta")
    cm = fexplore.compile(model, (x,), target="rngd", verify=False)
    res = cm.simulate()
    weights = sum(p.numel() * p.element_size() for p in (model.gate_up, model.down))
    assert res.dram_bytes < 4 * weights
    assert sum(k.node.op.name == "grouped_matmul" and k.how == "generated" for k in cm.kernels) == 2
