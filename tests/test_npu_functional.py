"""Functional mode: hand-built command programs compute what numpy computes, on both presets."""

import ml_dtypes
import numpy as np
import pytest

from fexplore.errors import InputError
from fexplore.npu import ProgramBuilder, examples, get_target

PRESETS = ["rngd", "tiny"]


def _rng(seed=0):
    return np.random.default_rng(seed)


@pytest.mark.parametrize("target", PRESETS)
def test_tiled_matmul_f32_equals_numpy(target):
    # sizes that are not multiples of the tile, so edge tiles are exercised; tiles fit tiny's SRAM
    M, N, K = 80, 72, 100
    prog = examples.tiled_matmul(target, M, N, K, tile=(32, 32, 32))
    a, b = _rng().standard_normal((M, K), np.float32), _rng(1).standard_normal((K, N), np.float32)
    res = prog.simulate({"A": a, "B": b})
    np.testing.assert_allclose(res.outputs["C"], a @ b, rtol=1e-5, atol=1e-4)
    pes_used = {c.pe for c in prog.commands}
    assert pes_used == set(range(get_target(target).num_pes))  # the work is spread over every PE
    assert res.functional and res.cycles > 0


@pytest.mark.parametrize("target", PRESETS)
def test_tiled_matmul_bf16_accumulates_in_f32(target):
    M, N, K = 64, 48, 96
    prog = examples.tiled_matmul(target, M, N, K, tile=(32, 16, 32), dtype="bf16", out_dtype="bf16")
    a = _rng().standard_normal((M, K)).astype(ml_dtypes.bfloat16)
    b = _rng(1).standard_normal((K, N)).astype(ml_dtypes.bfloat16)
    out = prog.simulate({"A": a, "B": b}).outputs["C"]
    assert out.dtype == ml_dtypes.bfloat16
    ref = a.astype(np.float32) @ b.astype(np.float32)      # exact products, f32 sums
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("target", PRESETS)
def test_softmax_equals_numpy(target):
    x = _rng(2).standard_normal((50, 200), np.float32) * 4
    res = examples.softmax(target, 50, 200, rows=16).simulate({"X": x})
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(res.outputs["Y"], e / e.sum(axis=-1, keepdims=True), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("target", PRESETS)
def test_layer_norm_equals_numpy(target):
    x = _rng(3).standard_normal((40, 96), np.float32) * 3 + 1
    g, bt = _rng(4).standard_normal(96, np.float32), _rng(5).standard_normal(96, np.float32)
    res = examples.layer_norm(target, 40, 96, rows=16).simulate({"X": x, "gamma": g, "beta": bt})
    mu = x.mean(-1, keepdims=True)
    ref = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + bt
    np.testing.assert_allclose(res.outputs["Y"], ref, rtol=1e-5, atol=1e-5)


def test_gelu_and_where_on_the_vector_unit():
    b = ProgramBuilder("tiny")
    X, Y = b.input("X", (8, 32)), b.output("Y", (8, 32))
    x, m, y = b.alloc("x", (8, 32)), b.alloc("m", (8, 32), "bool"), b.alloc("y", (8, 32))
    b.load(x, X)
    b.vector(y, "gelu", x)
    b.vector(m, "gt", x, 0.0)
    b.vector(y, "where", m, y, -1.0)
    b.store(Y, y)
    x_np = np.linspace(-4, 4, 256, dtype=np.float32).reshape(8, 32)
    from math import erf
    gelu = np.array([0.5 * v * (1 + erf(v / 2**0.5)) for v in x_np.ravel()], np.float32).reshape(8, 32)
    out = b.build().simulate({"X": x_np}).outputs["Y"]
    np.testing.assert_allclose(out, np.where(x_np > 0, gelu, -1.0), rtol=1e-6, atol=1e-6)


def test_reading_unwritten_sram_shows_nan():
    b = ProgramBuilder("tiny")
    A, C = b.input("A", (8, 8)), b.output("C", (8, 8))
    a, acc = b.alloc("a", (8, 8)), b.alloc("acc", (8, 8))
    b.load(a, A)
    b.contract(acc, "mk,kn->mn", a, a, accumulate=True)   # acc was never initialised
    b.store(C, acc)
    out = b.build().simulate({"A": np.ones((8, 8), np.float32)}).outputs["C"]
    assert np.isnan(out).all()


def test_inputs_are_not_mutated_and_are_checked():
    prog = examples.softmax("tiny", 16, 32, rows=16)
    x = np.ones((16, 32), np.float32)
    prog.simulate({"X": x})
    assert (x == 1).all()
    with pytest.raises(InputError, match="missing inputs"):
        prog.simulate({})
    with pytest.raises(InputError, match="expected shape"):
        prog.simulate({"X": np.ones((16, 33), np.float32)})


def test_timing_mode_has_no_outputs_and_same_cycles():
    prog = examples.softmax("tiny", 32, 64, rows=16)
    timing = prog.simulate()
    functional = prog.simulate({"X": np.zeros((32, 64), np.float32)})
    assert timing.outputs == {} and not timing.functional
    assert timing.cycles == functional.cycles


def test_pipelined_schedule_equals_serial_one():
    """Two slots (pipelined) and one slot (serial) give the same numbers; only the time differs."""
    a, b = _rng().standard_normal((64, 64), np.float32), _rng(1).standard_normal((64, 64), np.float32)
    outs, cycles = [], []
    for slots in (1, 2):
        res = examples.tiled_matmul("tiny", 64, 64, 64, tile=(16, 16, 16), pes=1, slots=slots) \
            .simulate({"A": a, "B": b})
        outs.append(res.outputs["C"])
        cycles.append(res.cycles)
    np.testing.assert_array_equal(outs[0], outs[1])
    assert cycles[1] < cycles[0]


def test_inputs_only_read_are_not_copied_and_inputs_written_are():
    """Functional mode copied every input into its DRAM, the weights too: a call of a model with
    256 MB of weights peaked 307 MB higher, now 51 MB. An input the program only reads is the
    caller's array, read-only; one it writes (a cache updated in place) is copied, and the
    caller's array is unchanged."""
    from fexplore.npu.functional import prepare_dram

    b = ProgramBuilder("tiny")
    W, S, Y = b.input("W", (8, 32)), b.input("S", (8, 32)), b.output("Y", (8, 32))
    w, y = b.alloc("w", (8, 32)), b.alloc("y", (8, 32))
    b.load(w, W)
    b.vector(y, "mul", w, 2.0)
    b.store(S, y)      # written: S is updated in place
    b.store(Y, y)
    prog = b.build()
    weights, state = _rng().standard_normal((8, 32), np.float32), np.zeros((8, 32), np.float32)
    dram = prepare_dram(prog, {"W": weights, "S": state})
    assert np.shares_memory(dram["W"], weights) and not dram["W"].flags.writeable
    assert not np.shares_memory(dram["S"], state)
    out = prog.simulate({"W": weights, "S": state}).outputs["Y"]
    np.testing.assert_array_equal(out, weights * 2)
    assert not state.any()


def test_a_run_holds_the_memory_alive_at_a_point_not_all_it_ever_used():
    """A chain of scratch tensors, each written once and read by the next step: the hazard
    check's per-element tracks (8 bytes an element) and the SRAM tiles are dropped after their
    last command, so a run's peak is its DRAM and a few live tensors' tracks; it kept the tracks of
    every scratch tensor (three times their f32 bytes) and every tile to the end."""
    import tracemalloc

    rows, steps = 64, 12
    b = ProgramBuilder("tiny")
    src = b.input("X", (rows, 256), "f32")
    for i in range(steps):
        dst = b.output("Y", (rows, 256), "f32") if i == steps - 1 else b.scratch(f"s{i}", (rows, 256), "f32")
        for r in range(0, rows, 16):
            t = b.alloc(f"t{i}_{r}", (16, 256), "f32")
            b.load(t, src[r:r + 16])
            b.vector(t, "add", t, t)
            b.store(dst[r:r + 16], t)
        src = dst
    prog = b.build()
    x = np.ones((rows, 256), np.float32)
    dram_bytes = (steps + 1) * rows * 256 * 4
    tracemalloc.start()
    try:
        res = prog.simulate({"X": x})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(res.outputs["Y"], x * 2 ** steps)
    assert peak < 1.6 * dram_bytes, (peak, dram_bytes)
