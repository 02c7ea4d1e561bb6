"""The timing model, checked against hand-computed cycle counts."""

import math

import pytest

from fexplore.npu import ProgramBuilder, get_target, simulate
from fexplore.npu import cost, examples

RNGD, TINY = get_target("rngd"), get_target("tiny")


def _events(res):
    return {e.cmd: e for e in res.timeline.events}


def test_lone_dma_is_startup_plus_bytes_over_bandwidth():
    b = ProgramBuilder(RNGD)
    A = b.input("A", (512, 1024), "f32")  # 2 MiB, one contiguous run
    a = b.alloc("a", (512, 1024), "f32")
    ld = b.load(a, A)
    res = b.build().simulate()
    n = 512 * 1024 * 4
    assert res.cycles == RNGD.dma_startup_cycles + n / RNGD.dma_bytes_per_cycle == 500 + 8192
    assert res.dram_bytes == n
    ev = _events(res)[ld.id]
    assert (ev.start, ev.end, ev.engine) == (0, 8692, "dma")


def test_dma_rounds_each_contiguous_run_up_to_256_bytes():
    b = ProgramBuilder(RNGD)
    A = b.input("A", (64, 1024), "f32")
    a = b.alloc("a", (64, 10), "f32")
    ld = b.load(a, A[:, 0:10])              # 64 runs of 40 bytes each, strided by 4096 bytes
    assert A[:, 0:10].strides == (4096, 4)
    prog = b.build()
    assert prog.moved_bytes[ld.id] == 64 * 256
    assert simulate(prog).cycles == 500 + 64 * 256 / 256
    # full rows merge into one run: 8 rows x 4096 bytes, a multiple of 256
    assert cost.dma_moved_bytes(A[8:16, :], RNGD) == 8 * 4096


def _one_contraction(target, m, n, k, dtype="bf16", spec="mk,kn->mn"):
    b = ProgramBuilder(target)
    x = b.alloc("x", (m, k), dtype)
    y = b.alloc("y", (k, n), dtype)
    out = b.alloc("out", (m, n), "f32")
    b.vector(x, "fill", 1.0)  # something must write the operands; costs nothing on the tensor unit
    b.vector(y, "fill", 1.0)
    c = b.contract(out, spec, x, y)
    res = b.build().simulate()
    ev = _events(res)[c.id]
    return ev.end - ev.start


def test_contraction_is_macs_over_throughput_with_tile_quantization():
    tm, tn, tk = RNGD.native_tile("bf16")
    assert (tm, tn, tk) == (64, 16, 16) and tm * tn * tk == RNGD.macs_per_cycle("bf16")
    lat = RNGD.tensor_latency_cycles
    # exact multiples of the native tile run at the peak rate
    assert _one_contraction(RNGD, 128, 128, 128) == 128**3 / 16_384 + lat
    # a 100x100x100 matmul is padded to 128x112x112: it costs exactly what that one costs
    padded = math.ceil(100 / tm) * math.ceil(100 / tn) * math.ceil(100 / tk) + lat
    assert _one_contraction(RNGD, 100, 100, 100) == padded == _one_contraction(RNGD, 128, 112, 112)
    assert padded > 100**3 / 16_384 + lat
    # fp8 has twice the k depth, f32 a quarter
    assert _one_contraction(RNGD, 128, 128, 128, "fp8") == 128**3 / 32_768 + lat
    assert _one_contraction(RNGD, 128, 128, 128, "f32") == 128**3 / 4_096 + lat


def test_batched_contraction_groups_indices():
    b = ProgramBuilder(TINY)
    q = b.alloc("q", (2, 8, 4), "bf16")
    k = b.alloc("k", (2, 6, 4), "bf16")
    s = b.alloc("s", (2, 8, 6), "f32")
    c = b.contract(s, "bmd,bnd->bmn", q, k)
    assert c.sizes == (2, 8, 6, 4) and c.macs == 2 * 8 * 6 * 4
    # batch 2 x ceil(8/4) x ceil(6/4) x ceil(4/4) tiles on tiny's 4x4x4 unit
    assert cost.contract_cycles(c, TINY) == 2 * 2 * 2 * 1 + TINY.tensor_latency_cycles


def test_vector_cycles_follow_elements_and_lanes():
    b = ProgramBuilder(RNGD)
    x = b.alloc("x", (64, 1000), "f32")
    r = b.alloc("r", (64, 1), "f32")
    add = b.vector(x, "add", x, 1.0)
    ex = b.vector(x, "exp", x)
    red = b.vector(r, "sum", x)       # a reduction costs its input's elements
    ev = _events(b.build().simulate())
    lat = RNGD.vector_latency_cycles
    assert ev[add.id].end - ev[add.id].start == math.ceil(64_000 / 256) + lat
    assert ev[ex.id].end - ev[ex.id].start == math.ceil(2 * 64_000 / 256) + lat  # transcendental: 2 passes
    assert ev[red.id].end - ev[red.id].start == math.ceil(64_000 / 256) + lat


def _k_loop(buffers: int, n_iter: int = 8):
    """acc[1024, 1024] += At[k, :]^T @ B[k, :] over K tiles of 64, with 1 or 2 SRAM slots per
    operand. A is stored K-major so every tile load is one contiguous run."""
    M = N = 1024
    tk = 64
    b = ProgramBuilder(RNGD)
    At = b.input("At", (tk * n_iter, M), "bf16")
    B = b.input("B", (tk * n_iter, N), "bf16")
    acc = b.alloc("acc", (M, N), "f32")
    a = [b.alloc(f"a{i}", (tk, M), "bf16") for i in range(buffers)]
    w = [b.alloc(f"w{i}", (tk, N), "bf16") for i in range(buffers)]
    for i in range(n_iter):
        s = i % buffers
        b.load(a[s], At[i * tk:(i + 1) * tk, :])
        b.load(w[s], B[i * tk:(i + 1) * tk, :])
        b.contract(acc, "km,kn->mn", a[s], w[s], accumulate=i > 0)
    return b.build().simulate()


def test_double_buffered_compute_bound_loop_hides_its_dma():
    n_iter = 8
    load = 500 + 1024 * 64 * 2 / 256                                      # one operand tile: 1012 cycles
    compute = (1024 // 64) * (1024 // 16) * (64 // 16) + RNGD.tensor_latency_cycles  # 4128 per step
    assert 2 * load < compute                                             # compute-bound
    res = _k_loop(buffers=2, n_iter=n_iter)
    # only the first pair of loads is exposed; every later load runs under a contraction
    assert res.cycles == 2 * load + n_iter * compute
    assert res.utilization["tensor"] * RNGD.num_pes == pytest.approx(n_iter * compute / res.cycles)
    serial = _k_loop(buffers=1, n_iter=n_iter)
    assert serial.cycles == n_iter * (2 * load + compute)                 # nothing overlaps
    assert res.roofline.ratio > serial.roofline.ratio


def _parallel_loads(target, sizes):
    b = ProgramBuilder(target)
    cmds = []
    for pe, nbytes in enumerate(sizes):
        T = b.input(f"T{pe}", (nbytes // 256, 64), "f32")
        buf = b.alloc(f"t{pe}", (nbytes // 256, 64), "f32", pe=pe)
        cmds.append(b.load(buf, T))
    ev = _events(b.build().simulate())
    return [ev[c.id].end - ev[c.id].start for c in cmds]


def test_two_pes_contending_for_dram_each_get_half():
    n = 6144
    startup = TINY.dma_startup_cycles
    alone = _parallel_loads(TINY, [n])[0]
    assert alone == startup + n / TINY.dma_bytes_per_cycle                 # 64 B/cycle engine
    both = _parallel_loads(TINY, [n, n])
    assert both == [startup + n / (TINY.dram_bytes_per_cycle / 2)] * 2     # 48 B/cycle each
    # fair sharing is re-evaluated when a transfer ends: the longer one speeds up for its rest
    long_, short = _parallel_loads(TINY, [2 * n, n])
    assert short == startup + n / 48
    assert long_ == startup + n / 48 + n / 64


def test_eight_pes_share_rngd_dram():
    n = 1500 * 1024                                # 8 x 256 B/cycle > 1500 B/cycle: DRAM-bound
    times = _parallel_loads(RNGD, [n] * 8)
    assert times == [500 + n / (1500 / 8)] * 8
    assert _parallel_loads(RNGD, [n] * 4) == [500 + n / 256] * 4  # 4 x 256 < 1500: engine-bound


def test_results_are_identical_across_runs():
    def run():
        prog = examples.tiled_matmul(TINY, 80, 72, 100, tile=(32, 32, 32))
        res = simulate(prog)
        return res.cycles, [tuple(e) for e in res.timeline.events], res.timeline.dram_bandwidth()

    first = run()
    assert run() == first
    prog = examples.tiled_matmul(TINY, 80, 72, 100, tile=(32, 32, 32))
    assert simulate(prog).trace.end == simulate(prog).trace.end


def test_roofline_bound_and_ratio():
    res = examples.tiled_matmul(RNGD, 512, 512, 512, tile=(256, 256, 256), dtype="bf16").simulate()
    r = res.roofline
    assert r.flops == 2 * 512**3
    assert r.tensor_cycles == pytest.approx(2 * 512**3 / RNGD.peak_flops_per_cycle("bf16"))
    assert r.compulsory_bytes == 2 * 512 * 512 * 2 + 512 * 512 * 4     # A, B read once; C written once
    assert r.memory_cycles == pytest.approx(r.compulsory_bytes / 1500)
    assert r.bound_cycles == max(r.tensor_cycles, r.vector_cycles, r.memory_cycles)
    assert 0 < r.ratio <= 1 and r.ratio == pytest.approx(r.bound_cycles / res.trace.makespan)
    assert res.dram_bytes >= r.compulsory_bytes
    assert res.latency_s == pytest.approx(res.cycles / 1e9)
    assert set(res.utilization) == {"dma", "tensor", "vector"}
    assert all(0 <= u <= 1 for u in res.utilization.values())
