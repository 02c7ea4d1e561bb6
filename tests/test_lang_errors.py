"""The kernel language's error catalog: one bad kernel per code, each caught at trace time, naming the
author's line (marked `# <- here` below), saying what was expected and what was given, and showing
the catalog's fixed example."""

import inspect

import numpy as np
import pytest

from fexplore import lang as fl
from fexplore.errors import FexploreError
from fexplore.lang import errors as E
from fexplore.npu.errors import SRAMOverflowError as NPUSRAMOverflowError

HERE = __file__


def marked_line(fn) -> int:
    fn = getattr(fn, "fn", fn)
    lines, start = inspect.getsourcelines(fn)
    hits = [start + i for i, text in enumerate(lines) if "# <- here" in text]
    assert len(hits) == 1, "mark exactly one line"
    return hits[0]


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def check(err: E.KernelError, cls, line: int):
    assert type(err) is cls
    assert err.code == cls.code and str(err).startswith(f"[{cls.code}]")
    assert isinstance(err, FexploreError)
    assert err.loc is not None and err.loc.file == HERE and err.loc.line == line, (err.loc, line)
    text = str(err)
    assert "expected:" in text and "given:" in text
    assert "example:" in text and cls.example.splitlines()[0] in text
    assert f"{HERE}:{line}" in text
    # IPython shows exactly the message (no traceback into fexplore)
    assert err._render_traceback_()[0].startswith(f"{cls.__name__}: [{cls.code}]")


def test_catalog_is_complete_and_codes_are_unique():
    codes = [c for c, _, _ in E.catalog_table()]
    assert codes == sorted(codes) and len(set(codes)) == len(codes) == 13
    assert all(summary for _, _, summary in E.catalog_table())
    assert all(cls.example for cls in E.CATALOG.values())


def test_FK100_a_dtype_without_axes():
    def k(a: fl.f32):  # <- here
        return a

    with pytest.raises(E.KernelDefinitionError) as ei:
        fl.kernel(k)
    check(ei.value, E.KernelDefinitionError, marked_line(k))


@fl.kernel
def add(x: fl.f32["M", "N"], y: fl.f32["M", "N"]):
    Y = fl.output(fl.f32["M", "N"])
    fl.store(Y, fl.load(x) + fl.load(y))
    return Y


def test_FK101_axis_sizes_disagree_between_arguments():
    with pytest.raises(E.ArgumentError) as ei:
        add(f32(4, 8), f32(4, 6))  # <- here
    check(ei.value, E.ArgumentError, marked_line(test_FK101_axis_sizes_disagree_between_arguments))
    assert "N is 8 in 'x' but 6 in 'y'" in str(ei.value)


def test_FK110_elementwise_shapes_do_not_broadcast():
    @fl.kernel
    def k(x: fl.f32["M", "N"], y: fl.f32["P", "Q"]):
        Y = fl.output(fl.f32["M", "N"])
        z = fl.load(x) * fl.load(y)  # <- here
        fl.store(Y, z)
        return Y

    with pytest.raises(E.ShapeError) as ei:
        k(f32(16, 8), f32(8, 16))
    check(ei.value, E.ShapeError, marked_line(k))


def test_FK111_contraction_index_sizes_disagree():
    @fl.kernel
    def k(a: fl.f32["M", "K"], b: fl.f32["P", "N"]):
        C = fl.output(fl.f32["M", "N"])
        acc = fl.contract("mk,kn->mn", fl.load(a), fl.load(b))  # <- here
        fl.store(C, acc)
        return C

    with pytest.raises(E.ContractionError) as ei:
        k(f32(16, 8), f32(4, 8))
    check(ei.value, E.ContractionError, marked_line(k))
    assert "'k' = 8 in both operands" in str(ei.value)


def test_FK112_transposed_operand_caught_by_axis_names_even_when_sizes_agree():
    @fl.kernel
    def k(q: fl.f32["S", "D"], kk: fl.f32["T", "D"]):
        O = fl.output(fl.f32["S", "T"])
        s = fl.contract("sd,dt->st", fl.load(q), fl.load(kk))  # <- here
        fl.store(O, s)
        return O

    with pytest.raises(E.AxisError) as ei:
        k(f32(8, 8), f32(8, 8))   # square: only the names tell the bug
    check(ei.value, E.AxisError, marked_line(k))


def test_FK112_reduction_over_an_axis_the_tile_does_not_have():
    @fl.kernel
    def k(x: fl.f32["R", "C"]):
        Y = fl.output(fl.f32["R", 1])
        m = fl.load(x).max(axis="D")  # <- here
        fl.store(Y, m)
        return Y

    with pytest.raises(E.AxisError) as ei:
        k(f32(4, 8))
    check(ei.value, E.AxisError, marked_line(k))


def test_FK120_contraction_operand_dtypes_differ():
    @fl.kernel
    def k(a: fl.bf16["M", "K"], b: fl.f32["K", "N"]):
        C = fl.output(fl.f32["M", "N"])
        acc = fl.contract("mk,kn->mn", fl.load(a), fl.load(b))  # <- here
        fl.store(C, acc)
        return C

    with pytest.raises(E.DTypeError) as ei:
        k(f32(16, 16), f32(16, 16))
    check(ei.value, E.DTypeError, marked_line(k))


def test_FK120_store_without_cast():
    @fl.kernel
    def k(a: fl.bf16["M", "K"], b: fl.bf16["K", "N"]):
        C = fl.output(fl.bf16["M", "N"])
        acc = fl.contract("mk,kn->mn", fl.load(a), fl.load(b))
        fl.store(C, acc)  # <- here
        return C

    with pytest.raises(E.DTypeError) as ei:
        k(f32(16, 16), f32(16, 16))
    check(ei.value, E.DTypeError, marked_line(k))
    assert "acc.astype(fl.bf16)" in str(ei.value)


def test_FK120_bit_operation_on_a_float_tile():
    @fl.kernel
    def k(a: fl.f32["M", "N"]):
        C = fl.output(fl.i32["M", "N"])
        fl.store(C, fl.bitwise_and(fl.load(a), 255, dtype=fl.i32))  # <- here
        return C

    with pytest.raises(E.DTypeError) as ei:
        k(f32(16, 16))
    check(ei.value, E.DTypeError, marked_line(k))
    assert "x.astype(fl.i32)" in str(ei.value)


def test_FK130_contracting_a_dram_tensor():
    @fl.kernel
    def k(a: fl.f32["M", "K"], b: fl.f32["K", "N"]):
        C = fl.output(fl.f32["M", "N"])
        acc = fl.contract("mk,kn->mn", a, fl.load(b))  # <- here
        fl.store(C, acc)
        return C

    with pytest.raises(E.MemorySpaceError) as ei:
        k(f32(16, 8), f32(8, 16))
    check(ei.value, E.MemorySpaceError, marked_line(k))
    assert "DRAM tensor 'a'" in str(ei.value)


def test_FK130_contracting_an_accumulator():
    @fl.kernel
    def k(a: fl.f32["M", "K"], b: fl.f32["K", "N"]):
        C = fl.output(fl.f32["M", "N"])
        s = fl.contract("mk,kn->mn", fl.load(a), fl.load(b))
        t = fl.contract("mn,nk->mk", s, fl.load(b))  # <- here
        fl.store(C, t)
        return C

    with pytest.raises(E.MemorySpaceError) as ei:
        k(f32(16, 16), f32(16, 16))
    check(ei.value, E.MemorySpaceError, marked_line(k))
    assert "astype" in ei.value.hint


def test_FK130_a_tile_used_on_another_pe():
    @fl.kernel
    def k(x: fl.f32["R", "C"], w: fl.f32["C"]):
        Y = fl.output(fl.f32["R", "C"])
        wt = fl.load(w)                    # on PE 0, outside the parallel loop
        for rs in fl.parallel(fl.tiles(8, 2)):
            y = fl.load(x[rs, :]) * wt  # <- here
            fl.store(Y[rs, :], y)
        return Y

    with pytest.raises(E.MemorySpaceError) as ei:
        k(f32(8, 4), f32(4), target="tiny")
    check(ei.value, E.MemorySpaceError, marked_line(k))


def test_FK140_tile_slice_out_of_bounds():
    @fl.kernel
    def k(x: fl.f32["R", "C"]):
        Y = fl.output(fl.f32["R", "C"])
        for r in range(0, 16, 8):
            t = fl.load(x[r:r + 8, 0:16])  # <- here
            fl.store(Y[r:r + 8, :], t)
        return Y

    with pytest.raises(E.OutOfBoundsError) as ei:
        k(f32(16, 12))
    check(ei.value, E.OutOfBoundsError, marked_line(k))
    assert "0 <= start < stop <= 12" in str(ei.value)


def test_FK150_reading_a_tile_before_it_is_loaded():
    @fl.kernel
    def k(x: fl.f32["R", "C"]):
        Y = fl.output(fl.f32["R", "C"])
        t = fl.empty((4, 8))
        y = fl.exp(t)  # <- here
        fl.load(x, into=t)
        fl.store(Y, y)
        return Y

    with pytest.raises(E.UninitializedReadError) as ei:
        k(f32(4, 8))
    check(ei.value, E.UninitializedReadError, marked_line(k))
    assert "fl.empty at line" in str(ei.value)


def test_FK160_sram_overflow_on_the_target():
    @fl.kernel
    def k(x: fl.f32["R", "C"], y: fl.f32["R", "C"]):
        Y = fl.output(fl.f32["R", "C"])
        a = fl.load(x)
        b = fl.load(y)  # <- here
        fl.store(Y, a + b)
        return Y

    big = f32(128, 128)   # 64 KiB each: one fits tiny's 64 KiB SRAM, two do not
    with pytest.raises(E.SRAMOverflowError) as ei:
        k(big, big, target="tiny")
    check(ei.value, E.SRAMOverflowError, marked_line(k))
    assert isinstance(ei.value, NPUSRAMOverflowError)   # the chip's error class catches it too
    assert "65,536 bytes" in str(ei.value) and "live buffers" in str(ei.value)
    k(big, big, target="rngd")   # the same kernel fits a real chip


def test_FK170_python_if_on_a_tile_value():
    @fl.kernel
    def k(x: fl.f32["R", "C"]):
        Y = fl.output(fl.f32["R", "C"])
        t = fl.load(x)
        if t > 0:  # <- here
            t = -t
        fl.store(Y, t)
        return Y

    with pytest.raises(E.TraceError) as ei:
        k(f32(4, 8))
    check(ei.value, E.TraceError, marked_line(k))
    assert "fl.where" in str(ei.value)


def test_FK170_builtin_outside_a_kernel():
    with pytest.raises(E.TraceError) as ei:
        fl.zeros((4, 4))  # <- here
    check(ei.value, E.TraceError, marked_line(test_FK170_builtin_outside_a_kernel))


def test_FK170_tiles_of_a_stepped_span():
    """fl.tiles tiles a span a loop is already over (a panel's columns), but only a step-1 slice."""
    assert fl.tiles(slice(4, 10), 4) == [slice(4, 8), slice(8, 10)]

    @fl.kernel
    def k(x: fl.f32["R", "C"]):
        Y = fl.output(fl.f32["R", "C"])
        for cs in fl.tiles(slice(0, 8, 2), 4):  # <- here
            fl.store(Y[:, cs], fl.load(x[:, cs]))
        return Y

    with pytest.raises(E.TraceError) as ei:
        k(f32(4, 8))
    check(ei.value, E.TraceError, marked_line(k))



def test_FK171_a_trace_of_tiles_far_too_small(monkeypatch):
    import fexplore.lang.tracer as tracer

    monkeypatch.setattr(tracer, "MAX_TRACE_OPS", 1000)   # the real limit, in millions, takes a minute

    @fl.kernel
    def k(x: fl.f32["R", "C"], *, tile: int = 1):
        R, C = x.shape
        Y = fl.output(fl.f32["R", "C"])
        for rs in fl.tiles(R, tile):
            for cs in fl.tiles(C, tile):
                fl.store(Y[rs, cs], fl.load(x[rs, cs]))  # <- here
        return Y

    with pytest.raises(E.TraceLimitError) as ei:
        k(f32(64, 64))
    check(ei.value, E.TraceLimitError, marked_line(k))
    assert isinstance(ei.value, E.TraceError) and "1,000 ops" in str(ei.value)
    x = f32(64, 64)
    np.testing.assert_array_equal(k(x, tile=16), x)   # tiles, not elements: 32 ops

def test_FK180_output_partly_stored():
    @fl.kernel
    def k(x: fl.f32["R", "C"]):
        Y = fl.output(fl.f32["R", "C"])  # <- here
        for rs in fl.tiles(12, 4)[:-1]:
            fl.store(Y[rs, :], fl.load(x[rs, :]))
        return Y

    with pytest.raises(E.OutputError) as ei:
        k(f32(12, 4))
    check(ei.value, E.OutputError, marked_line(k))
    assert "16 of 48 elements are never stored" in str(ei.value) and "Y[8, 0]" in str(ei.value)


def test_errors_leave_no_trace_state_behind():
    with pytest.raises(E.ArgumentError):
        add(f32(4, 8), f32(4, 6))
    # a bad call must not leave a tracer active: builtins outside a kernel still fail cleanly
    with pytest.raises(E.TraceError):
        fl.load(None)
    np.testing.assert_array_equal(add(f32(4, 8), f32(4, 8, seed=1)), f32(4, 8) + f32(4, 8, seed=1))
