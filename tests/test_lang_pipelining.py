"""Declared pipelining: the pipelined and the serial kernel compute the same numbers, and the
pipelined one takes fewer simulated cycles."""

import numpy as np
import pytest

from fexplore import lang as fl
from fexplore.lang import examples as ex


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@fl.kernel
def stream_rms(x: fl.f32["R", "D"], w: fl.f32["D"], *, rows: int = 16, stages: int = 2, eps: float = 1e-6):
    """RMS norm on one PE, streaming blocks of rows through one SRAM buffer each (in place): it
    moves 8 bytes per element for ~4 vector passes, so the DMA engine is the bottleneck."""
    R, D = x.shape
    Y = fl.output(fl.f32["R", "D"])
    wt = fl.load(w)
    for rs in fl.range(fl.tiles(R, rows), stages=stages):
        xt = fl.load(x[rs, :])
        r = fl.rsqrt((xt * xt).mean(axis="D") + eps)
        fl.mul(xt, r, out=xt)
        fl.mul(xt, wt, out=xt)
        fl.store(Y[rs, :], xt)
    return Y


@pytest.mark.parametrize("target, shape, rows", [("rngd", (1024, 2048), 32), ("tiny", (96, 64), 4)])
def test_dma_bound_kernel_pipelined_equals_serial_and_is_faster(target, shape, rows):
    x, w = f32(*shape), f32(shape[1], seed=1)
    serial = stream_rms.simulate(x, w, target=target, rows=rows, stages=1)
    piped = stream_rms.simulate(x, w, target=target, rows=rows, stages=2)
    assert serial.roofline.limiter != "tensor"
    np.testing.assert_array_equal(piped.outputs["Y"], serial.outputs["Y"])
    np.testing.assert_allclose(piped.outputs["Y"], ex.reference.rms_norm(x, w), rtol=1e-5, atol=1e-5)
    assert piped.cycles < 0.85 * serial.cycles
    # serial: the next load waits for this block's store, so the DMA engine idles during the math
    assert piped.utilization["dma"] > serial.utilization["dma"]
    if target == "rngd":
        assert serial.utilization_by_pe[(0, "dma")] < 0.8 < 0.95 < piped.utilization_by_pe[(0, "dma")]


def test_check_pipelining_runs_both_and_compares():
    x, w = f32(128, 64), f32(64, seed=1)
    check = ex.rms_norm.check_pipelining(x, w, rows=2, target="tiny")
    assert check.same and check.max_abs_diff == 0.0
    assert check.pipelined.cycles < check.serial.cycles and check.speedup > 1.1
    assert "identical outputs" in repr(check)
    # pipelining=False really turns every `stages=` into 1: one buffer per load site and PE
    serial_trace = ex.rms_norm.trace(x, w, rows=2, target="tiny", pipelining=False)
    piped_trace = ex.rms_norm.trace(x, w, rows=2, target="tiny")
    count = lambda tr: sum(b.name == "xt" for b in tr.plan.buffers)  # noqa: E731
    assert count(serial_trace) == 2 and count(piped_trace) == 4      # tiny has 2 PEs: 1 vs 2 each


def test_flash_attention_pipelined_equals_serial():
    # streaming softmax with loop-carried state (running max, sum, accumulator): the schedule may
    # overlap block j+1's scores with block j's softmax, and must not change a single bit
    q = f32(8, 128, 64)
    k, v = f32(8, 1024, 64, seed=1), f32(8, 1024, 64, seed=2)
    check = ex.flash_attention.check_pipelining(q, k, v, bq=128, bk=256)
    assert check.same
    assert check.pipelined.cycles <= check.serial.cycles
    np.testing.assert_allclose(check.pipelined.outputs["O"], ex.reference.flash_attention(q, k, v),
                               rtol=1e-4, atol=1e-5)


def test_double_buffered_matmul_reaches_the_tensor_roofline_on_rngd():
    a = fl.spec((2048, 2048), "bf16")
    res = ex.matmul.simulate(a, a)            # timing only: no data
    assert res.roofline.limiter == "tensor"
    assert res.roofline.flops_fraction >= 0.85


@fl.kernel
def banded_scale(x: fl.f32["R", "C"], *, bands: tuple = (), stages: int = 2):
    """Items of rows whose heights differ (`bands`), each streaming its columns in blocks of 16."""
    R, C = x.shape
    Y = fl.output(fl.f32["R", "C"])
    for rs in fl.parallel([slice(a, b) for a, b in bands], stages=stages):
        for cs in fl.range(fl.tiles(C, 16), stages=stages):
            xt = fl.load(x[rs, cs])
            fl.store(Y[rs, cs], xt * 2.0)
    return Y


def test_nested_pipelined_loops_keep_the_product_of_their_stages_in_buffers():
    # tiny deals items to its 2 PEs in turn; PE 0's items are tall, tall, short, tall, tall, short...:
    # its tall items are not all consecutive, so an inner loop may find buffers that neither loop's
    # stages bar and rotate through them all, leaving none for the next tall item (the buffers grew
    # by two every two tall items: TextNet's sibling convolutions overflowed tiny's SRAM this way)
    heights = [8, 8, 8, 8, 1, 1] * 6
    edges = np.cumsum([0] + heights)
    bands = tuple((int(a), int(b)) for a, b in zip(edges, edges[1:]))
    x = f32(int(edges[-1]), 128)
    trace = banded_scale.trace(x, bands=bands, target="tiny")
    per_shape = {}
    for b in trace.plan.buffers:
        if b.name == "xt":
            per_shape[b.pe, b.shape] = per_shape.get((b.pe, b.shape), 0) + 1
    assert set(per_shape) == {(0, (8, 16)), (0, (1, 16)), (1, (8, 16)), (1, (1, 16))}
    assert max(per_shape.values()) <= 4, per_shape          # 2 items in flight x 2 column blocks
    res = banded_scale.simulate(x, bands=bands, target="tiny")
    np.testing.assert_array_equal(res.outputs["Y"], 2.0 * x)


def _cycles_under(monkeypatch, rules, kernel, args, **tiles):
    from fexplore.lang import schedule
    from fexplore.lang.lowering import lower

    monkeypatch.setattr(schedule, "RULES", rules)
    return lower(kernel.trace(*args, target="rngd", **tiles)).simulate().cycles   # a fresh program


def test_the_issue_order_is_the_best_of_its_rules(monkeypatch):
    """No one meaning of "more urgent" wins everywhere: by the path after an op (tail), a layer
    norm's small weight and bias loads go before the big weight panel its contraction waits for
    anyway, where by the path including the op (height) the norm stalls behind the panel; in a
    short flash attention height's order is the faster. The scheduler issues the order whose
    estimated end is first, and is as fast as the better rule on each."""
    norm = (ex.layer_norm_matmul, (fl.spec((512, 768), "f32"), fl.spec((768,), "f32"), fl.spec((768,), "f32"),
                                   fl.spec((768, 512), "bf16")), {"tm": 128, "tn": 256})
    q = fl.spec((8, 512, 128), "bf16")
    attention = (ex.flash_attention, (q, q, q), {})
    for kernel, args, tiles in (norm, attention):
        by_rule = {r: _cycles_under(monkeypatch, (r,), kernel, args, **tiles) for r in ("height", "tail", "exchange")}
        best = _cycles_under(monkeypatch, ("height", "tail", "exchange"), kernel, args, **tiles)
        assert best == min(by_rule.values()), by_rule
        if kernel is ex.layer_norm_matmul:
            assert by_rule["tail"] < 0.97 * by_rule["height"], by_rule
        else:
            assert by_rule["height"] < 0.95 * by_rule["tail"], by_rule
