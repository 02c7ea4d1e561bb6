"""The kernel IR, the SRAM plan, the interpreter's behaviour, lowering details, and rendering."""

import subprocess
import sys

import numpy as np
import pytest

from fexplore import lang as fl
from fexplore.lang import errors as E
from fexplore.lang import examples as ex
from fexplore.lang.interpreter import Interpreter
from fexplore.lang.schedule import list_schedule
from fexplore.npu.commands import DMA, VECTOR


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@fl.kernel
def centered_scale(x: fl.f32["R", "C"], w: fl.f32["C"]):
    R, C = x.shape
    Y = fl.output(fl.bf16["R", "C"])
    for rs in fl.parallel(fl.tiles(R, 4)):
        wt = fl.load(w)
        xt = fl.load(x[rs, :])
        y = fl.mul(xt - xt.max(axis="C"), wt, dtype=fl.bf16)
        fl.store(Y[rs, :], y)
    return Y


GOLDEN = """\
kernel centered_scale on tiny
  in  x: f32[R:6, C:8]
  in  w: f32[C:8]
  out Y: bf16[R:6, C:8]
  pe0 %wt.0 = load w : sram f32[C:8]                    # line {L1}
  pe0 %xt.0 = load x[0:4, 0:8] : sram f32[R:4, C:8]     # line {L2}
  pe0 %max.0 = max(%xt.0, axis=C) : sram f32[R:4, 1]    # line {L3}
  pe0 %sub.0 = sub(%xt.0, %max.0) : sram f32[R:4, C:8]  # line {L3}
  pe0 %y.0 = mul(%sub.0, %wt.0) : sram bf16[R:4, C:8]   # line {L3}
  pe0 store Y[0:4, 0:8] <- %y.0                         # line {L4}
  pe1 %wt.1 = load w : sram f32[C:8]                    # line {L1}
  pe1 %xt.1 = load x[4:6, 0:8] : sram f32[R:2, C:8]     # line {L2}
  pe1 %max.1 = max(%xt.1, axis=C) : sram f32[R:2, 1]    # line {L3}
  pe1 %sub.1 = sub(%xt.1, %max.1) : sram f32[R:2, C:8]  # line {L3}
  pe1 %y.1 = mul(%sub.1, %wt.1) : sram bf16[R:2, C:8]   # line {L3}
  pe1 store Y[4:6, 0:8] <- %y.1                         # line {L4}
  return Y"""


def test_golden_ir_text_and_its_numbers():
    first = centered_scale.fn.__code__.co_firstlineno
    lines = {f"L{i}": first + 4 + i for i in range(1, 5)}
    x, w = f32(6, 8), f32(8, seed=1)
    trace = centered_scale.trace(x, w, target="tiny")
    assert trace.format(with_source=False) == GOLDEN.format(**lines)
    assert "# line %d: y = fl.mul(" % lines["L3"] in str(trace)   # with the author's source
    # the golden program also computes the right numbers, in both back ends
    ref = ((x - x.max(axis=1, keepdims=True)) * w).astype(fl.bf16.numpy)
    y = centered_scale(x, w, target="tiny")
    np.testing.assert_array_equal(y, ref)
    np.testing.assert_array_equal(centered_scale.simulate(x, w, target="tiny").outputs["Y"], y)


def test_traces_are_cached_per_shapes_target_and_static_args():
    x, w = f32(6, 8), f32(8)
    t1 = centered_scale.trace(x, w, target="tiny")
    assert centered_scale.trace(fl.spec((6, 8)), fl.spec((8,)), target="tiny") is t1
    assert centered_scale.trace(x, w, target="rngd") is not t1
    assert centered_scale.trace(f32(10, 8), w, target="tiny") is not t1


# ---- the SRAM plan ------------------------------------------------------------------------------


@fl.kernel
def running_sum(x: fl.f32["R", "C"], *, stages: int = 1):
    R, C = x.shape
    Y = fl.output(fl.f32[1, "C"])
    total = fl.zeros((1, C), axes=(None, "C"))
    for r in fl.range(R, stages=stages):
        row = fl.load(x[r:r + 1, :])
        total = total + row          # a loop-carried value
    fl.store(Y, total)
    return Y


def _buffers(trace, name):
    return [b for b in trace.plan.buffers if b.name == name]


def test_plan_reuses_one_buffer_per_site_when_serial_and_two_when_pipelined():
    x = f32(6, 8)
    serial = running_sum.trace(x, stages=1)
    piped = running_sum.trace(x, stages=2)
    assert len(_buffers(serial, "row")) == 1      # the next load waits for the last reader
    assert len(_buffers(piped, "row")) == 2       # double buffering
    # `total = total + row` reads the old total while writing the new: in place, one buffer
    assert len(_buffers(serial, "total")) == 2    # the zeros + the loop's site (reused in place)
    np.testing.assert_allclose(running_sum(x), x.sum(axis=0, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(running_sum.simulate(x, stages=2).outputs["Y"], running_sum(x))


def test_loop_carried_values_get_a_second_buffer_automatically():
    q, k, v = (f32(1, 16, 8, seed=s) for s in range(3))
    trace = ex.flash_attention.trace(q, k, v, bq=16, bk=4, stages=1, target="tiny")
    # m_new of block j is read after m_new of block j+1 is made: two buffers, alternating
    made_by_maximum = {op.out.id for op in trace.ops if getattr(op, "op", None) == "maximum"}
    running_max = [b for b in trace.plan.buffers if b.tiles[0].id in made_by_maximum]
    assert len(running_max) == 2
    assert [t.id for t in running_max[0].tiles] == sorted(made_by_maximum)[0::2]
    assert len(_buffers(trace, "kt")) == 1


def test_plan_text_lists_sites_with_their_lines():
    text = str(running_sum.trace(f32(6, 8), stages=2).plan)
    assert text.startswith("SRAM plan on rngd: peak")
    assert "row" in text and "f32[1, C:8]" in text


# ---- interpreter --------------------------------------------------------------------------------


def test_tile_values_are_visible_while_the_interpreter_runs():
    seen = {}

    @fl.kernel
    def peek(x: fl.f32["R", "C"]):
        Y = fl.output(fl.f32["R", "C"])
        t = fl.exp(fl.load(x))
        seen["t"] = t.numpy()          # what a breakpoint here would show
        fl.store(Y, t)
        return Y

    x = f32(3, 4)
    peek(x)
    np.testing.assert_allclose(seen["t"], np.exp(x), rtol=1e-6)
    with pytest.raises(E.TraceError, match="only when the numpy interpreter"):
        peek.simulate(f32(5, 4))     # a fresh trace for the simulator computes no values


def test_fresh_memory_is_nan_filled():
    trace = centered_scale.trace(f32(6, 8), f32(8))
    interp = Interpreter({})
    assert np.isnan(interp.value(trace.tiles[0])).all()


def test_where_compare_broadcast_scratch_and_two_outputs():
    @fl.kernel
    def k(x: fl.f32["R", "C"], b: fl.f32[1, "C"]):
        R, C = x.shape
        P = fl.output(fl.f32["R", "C"])
        N = fl.output(fl.f32["R", "C"])
        S = fl.scratch(fl.f32["R", "C"])
        xt = fl.load(x)
        pos = fl.where(xt > 0, xt, 0.0)
        fl.store(S, pos)
        again = fl.load(S)                    # read back what was stored (DRAM hazard)
        wide = fl.broadcast_to(fl.load(b), (R, C))
        fl.store(P, again + wide)
        fl.store(N, fl.minimum(xt, 0.0))
        return P, N

    x, b = f32(5, 6), f32(1, 6, seed=1)
    p, n = k(x, b)
    np.testing.assert_allclose(p, np.maximum(x, 0) + b, rtol=1e-6)
    np.testing.assert_array_equal(n, np.minimum(x, 0))
    res = k.simulate(x, b, target="tiny")
    np.testing.assert_array_equal(res.outputs["P"], p)
    np.testing.assert_array_equal(res.outputs["N"], n)
    assert "S" not in res.outputs


def test_waits_order_without_changing_results():
    @fl.kernel
    def k(x: fl.f32["R", "C"]):
        Y = fl.output(fl.f32["R", "C"])
        for rs in fl.tiles(8, 2):
            fl.store(Y[rs, :], fl.exp(fl.load(x[rs, :]))).wait()
        return Y

    x = f32(8, 4)
    res = k.simulate(x)
    np.testing.assert_allclose(res.outputs["Y"], np.exp(x), rtol=1e-6)
    assert sum(c.kind == "sync" for c in res.program.commands) == 4

    @fl.kernel
    def k2(x: fl.f32["R", "C"]):
        Y = fl.output(fl.f32["R", "C"])
        t = fl.load(x)
        fl.wait(t)                               # wait on a loaded tile
        fl.store(Y, t * 2.0)
        return Y

    prog = k2.lower(x)
    sync = next(c for c in prog.commands if c.kind == "sync")
    assert all(sync.id in c.deps for c in prog.commands if c.id > sync.id)
    np.testing.assert_array_equal(k2.simulate(x).outputs["Y"], 2 * x)


def test_torch_tensors_and_float64_arrays_are_accepted():
    import torch

    a = torch.randn(16, 8)
    b = np.random.default_rng(0).standard_normal((8, 12))   # float64 -> f32, like a copy to the chip
    y = ex.matmul(a, b)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, a.numpy() @ b.astype(np.float32), rtol=1e-5, atol=1e-5)


# ---- lowering -----------------------------------------------------------------------------------


def test_zeroing_an_accumulator_costs_nothing():
    @fl.kernel
    def k(a: fl.f32["M", "K"], b: fl.f32["K", "N"]):
        C = fl.output(fl.f32["M", "N"])
        acc = fl.zeros((a.shape[0], b.shape[1]), space=fl.ACC)
        for ks in fl.tiles(a.shape[1], 4):
            fl.contract("mk,kn->mn", fl.load(a[:, ks]), fl.load(b[ks, :]), acc=acc)
        fl.store(C, acc)
        return C

    a, b = f32(8, 12), f32(12, 8, seed=1)
    prog = k.lower(a, b)
    assert not any(c.kind == "vector" for c in prog.commands)          # the fill is gone ...
    first = next(c for c in prog.commands if c.kind == "contract")
    assert not first.accumulate                                         # ... the first contract overwrites
    np.testing.assert_array_equal(k.simulate(a, b).outputs["C"], k(a, b))


def test_cycles_are_attributed_to_kernel_lines():
    a, b = f32(128, 96), f32(96, 64, seed=1)
    res = ex.matmul.simulate(a, b, target="tiny")
    table = ex.matmul.last_trace.cycles_by_line(res)
    top = table.iloc[0]
    assert "fl.contract" in top["source"] and top["tensor"] > 0
    loads = table[table["source"].str.contains("fl.load")]
    assert (loads["dma"] > 0).all() and len(loads) == 2
    assert {e.loc.file for e in res.timeline.events} == {ex.linear.__file__}


def test_scheduler_issues_a_load_the_compute_waits_for_before_a_store_nothing_waits_for():
    # one PE: 0 load A, 1 compute on A, 2 store the result, 3 load B into A's buffer (so after 1),
    # 4 compute on B. The store and the load can both start at 150; the load is on the longer path.
    engines = [DMA, VECTOR, DMA, DMA, VECTOR]
    deps = [[], [0], [1], [1], [3]]
    order = list_schedule([0] * 5, engines, [100, 50, 100, 100, 50], deps, num_pes=1)
    assert order.index(3) < order.index(2)
    assert all(order.index(d) < order.index(i) for i, ds in enumerate(deps) for d in ds)


# ---- rendering ----------------------------------------------------------------------------------


def test_kernel_renders_ir_plan_and_timeline():
    @fl.kernel
    def k(x: fl.f32["R", "C"]):
        Y = fl.output(fl.f32["R", "C"])
        fl.store(Y, fl.exp(fl.load(x)))
        return Y

    assert "not traced yet" in k._repr_html_()
    assert repr(k) == "<Kernel k(x: f32[R, C]) on rngd>"
    k.simulate(f32(4, 4))
    html = k._repr_html_()
    assert "<pre" in html and "= exp(" in html          # the kernel IR
    assert "SRAM plan on rngd" in html                   # the plan
    assert "<img" in html and "busy cycles by kernel line" in html   # the timeline


def test_headless_use_imports_no_plotting_or_widgets():
    code = ("import sys, numpy as np\n"
            "from fexplore import lang as fl\n"
            "a = np.ones((16, 8), np.float32)\n"
            "fl.examples.matmul(a, a.T)\n"
            "r = fl.examples.matmul.simulate(a, a.T, target='tiny')\n"
            "str(fl.examples.matmul.last_trace); str(fl.examples.matmul.last_trace.plan); r.cycles\n"
            "bad = [m for m in ('matplotlib', 'ipywidgets') if m in sys.modules]\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_integer_tiles_keep_every_bit_in_the_interpreter_and_the_simulator():
    # values above 2^24, where an f32 datapath would round them; an immediate too wide for f32
    @fl.kernel
    def k(a: fl.i32["M", "N"], b: fl.i32["M", "N"]):
        C = fl.output(fl.i32["M", "N"])
        x, y = fl.load(a), fl.load(b)
        mixed = fl.bitwise_xor(fl.bitwise_and(x, y, dtype=fl.i32), 0x1234567, dtype=fl.i32)
        fl.store(C, fl.add(mixed, fl.bitwise_left_shift(y, 3, dtype=fl.i32), dtype=fl.i32))
        return C

    rng = np.random.default_rng(0)
    a, b = (rng.integers(-2**31, 2**31, (16, 16)).astype(np.int32) for _ in range(2))
    with np.errstate(over="ignore"):
        want = ((a & b) ^ 0x1234567) + (b << 3)
    np.testing.assert_array_equal(k(a, b), want)
    np.testing.assert_array_equal(k.simulate(a, b, target="tiny").outputs["C"], want)
