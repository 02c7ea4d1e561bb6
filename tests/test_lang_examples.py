"""Every example kernel matches its numpy reference in the interpreter, and the simulator computes
exactly what the interpreter does, on both presets. Sizes are not multiples of the tiles, so edge
tiles are exercised; on `tiny` the tiling really splits the work over its two PEs."""

import ml_dtypes
import numpy as np
import pytest

from fexplore import lang as fl
from fexplore.lang import examples as ex
from fexplore.npu import SimResult


def arrays(*shapes, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(dtype) for s in shapes)


CASES = {
    "matmul": arrays((80, 100), (100, 72)),
    "matmul_bias_gelu": arrays((64, 48), (48, 40), (40,), seed=1),
    "matmul_residual": arrays((70, 48), (48, 36), (36,), (70, 36), seed=7),
    "layer_norm_matmul": arrays((50, 40), (40,), (40,), (40, 28), seed=8),
    "softmax": arrays((50, 96), seed=2),
    "layer_norm": arrays((40, 64), (64,), (64,), seed=3),
    "rms_norm": arrays((40, 64), (64,), seed=4),
    "flash_attention": arrays((2, 48, 16), (2, 40, 16), (2, 40, 16), seed=5),
    "conv2d": arrays((2, 10, 9, 3), (3, 3, 3, 8), seed=6),
}


def test_every_example_is_covered():
    assert set(CASES) == set(ex.KERNELS) == {"matmul", "matmul_bias_gelu", "matmul_residual", "layer_norm_matmul",
                                             "softmax", "layer_norm", "rms_norm", "flash_attention", "conv2d"}
    assert all(isinstance(getattr(fl.examples, name), fl.Kernel) for name in CASES)


@pytest.mark.parametrize("target", ["rngd", "tiny"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_example_matches_reference_in_interpreter_and_simulator(name, target):
    kernel, args = ex.KERNELS[name], CASES[name]
    expected = ex.REFERENCES[name](*args)
    got = kernel(*args, target=target)                      # numpy interpreter
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-5)
    res = kernel.simulate(*args, target=target)             # lowered, scheduled, simulated
    assert isinstance(res, SimResult) and res.functional and res.cycles > 0
    (sim,) = res.outputs.values()
    np.testing.assert_array_equal(sim, got)                 # same numbers, bit for bit
    used = {c.pe for c in res.program.commands}
    if target == "tiny":
        assert used == {0, 1}, "the work is spread over both PEs"


def test_bf16_matmul_and_attention_on_rngd():
    a, b = arrays((256, 192), (192, 320), dtype=ml_dtypes.bfloat16)
    c = ex.matmul(a, b)
    assert c.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(c.astype(np.float32), ex.reference.matmul(a, b), rtol=1.6e-2, atol=1e-1)
    q, k, v = arrays((2, 128, 64), (2, 192, 64), (2, 192, 64), seed=7, dtype=ml_dtypes.bfloat16)
    res = ex.flash_attention.simulate(q, k, v)
    out = res.outputs["O"].astype(np.float32)
    np.testing.assert_allclose(out, ex.reference.flash_attention(q, k, v), rtol=3e-2, atol=2e-2)
    assert res.utilization["tensor"] > 0 and res.utilization["vector"] > 0


@pytest.mark.parametrize("target", ["rngd", "tiny"])
def test_residual_stream_kernels_in_mixed_precision(target):
    # bf16 operands on the tensor unit, an f32 residual stream in and out, as the kernels bench
    # sets them beside the generated ones
    bf = ml_dtypes.bfloat16
    a, b = arrays((96, 80), (80, 72), seed=9, dtype=bf)
    bias, residual = arrays((72,), (96, 72), seed=10)
    res = ex.matmul_residual.simulate(a, b, bias, residual, target=target)
    out = res.outputs["C"]
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ex.reference.matmul_residual(a, b, bias, residual), rtol=1e-4, atol=1e-3)
    x, gamma, beta = arrays((64, 80), (80,), (80,), seed=11)
    res = ex.layer_norm_matmul.simulate(x, gamma, beta, b, target=target)
    out = res.outputs["C"]
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ex.reference.layer_norm_matmul(x, gamma, beta, b), rtol=3e-2, atol=1e-1)
    np.testing.assert_array_equal(out, ex.layer_norm_matmul(x, gamma, beta, b, target=target))


def test_contract_on_the_public_api():
    a, b = CASES["matmul"]
    y = fl.examples.matmul(a, b)
    r = fl.examples.matmul.simulate(a, b, target="rngd")
    assert set(r.utilization) == {"dma", "tensor", "vector"}
    assert len(r.timeline) > 0 and r.cycles > 0
    np.testing.assert_array_equal(r.outputs["C"], y)


def test_timing_only_simulation_needs_no_data():
    spec = fl.spec((1024, 1024), "bf16")
    res = ex.matmul.simulate(spec, spec)
    assert not res.functional and res.outputs == {}
    assert res.roofline.flops == 2 * 1024 ** 3
