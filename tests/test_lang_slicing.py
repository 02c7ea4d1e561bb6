"""Slicing a tile already in SRAM (``a[:, ks]``): a read-only view of the tile's buffer, no copy and
no DMA. A kernel loads whole rows once and feeds the tensor unit K slabs of them; the interpreter,
the SRAM plan, the lowering and the simulator all agree on what a slice is, and writing into one is
a clear error on the author's line."""

import inspect

import numpy as np
import pytest

from fexplore import lang as fl
from fexplore.lang import errors as E
from fexplore.npu import ProgramBuilder, get_target
from fexplore.npu.errors import ProgramError


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def line_of(fn, mark="# <- here") -> int:
    fn = getattr(fn, "fn", fn)
    lines, start = inspect.getsourcelines(fn)
    return next(start + i for i, text in enumerate(lines) if mark in text)


@fl.kernel
def rows_once(A: fl.f32["M", "K"], B: fl.f32["K", "N"], *, tm: int = 16, tk: int = 16):
    """C = A @ B + A[:, :1]: each row tile of A is loaded once, whole, and sliced into K slabs."""
    M, K = A.shape
    C = fl.output((M, B.shape[1]), fl.f32)
    for ms in fl.parallel(fl.tiles(M, tm)):
        a = fl.load(A[ms, :])
        acc = None
        for ks in fl.range(fl.tiles(K, tk), stages=2):
            acc = fl.contract("mk,kn->mn", a[:, ks], fl.load(B[ks, :]), acc=acc)
        fl.store(C[ms, :], acc + a[:, 0:1])
    return C


@pytest.mark.parametrize("target", ["tiny", "rngd"])
@pytest.mark.parametrize("M,K,N,tk", [(40, 48, 24, 16), (13, 37, 5, 8), (1, 20, 3, 7)])
def test_k_slabs_of_a_whole_row_tile_equal_numpy_interpreted_and_simulated(target, M, K, N, tk):
    A, B = f32(M, K), f32(K, N, seed=1)
    want = A @ B + A[:, :1]
    np.testing.assert_allclose(rows_once(A, B, target=target, tk=tk), want, rtol=1e-5, atol=1e-5)
    tr = rows_once.trace(fl.spec(A.shape, "f32"), fl.spec(B.shape, "f32"), target=target, tk=tk)
    res = tr.program().simulate({"A": A, "B": B})
    np.testing.assert_allclose(res.outputs["C"], want, rtol=1e-5, atol=1e-5)
    # a slice moves nothing: one load of A per row tile, however many K slabs read it
    row_tiles = -(-M // 16)
    assert sum(1 for op in tr.ops if op.kind == "load" and op.src.tensor.name == "A") == row_tiles


def test_interpreter_equals_numpy_and_the_ir_shows_slices_of_the_base():
    A, B = f32(40, 48), f32(48, 24, seed=1)
    np.testing.assert_allclose(rows_once(A, B), A @ B + A[:, :1], rtol=1e-5, atol=1e-5)
    text = str(rows_once.trace(fl.spec(A.shape, "f32"), fl.spec(B.shape, "f32")))
    assert "(%a.0[0:16, 16:32], %b" in text and "add(%acc.0, %a.0[0:16, 0:1])" in text


def test_a_slice_keeps_its_tiles_buffer_alive_until_its_last_use():
    A, B = f32(16, 48), f32(48, 8, seed=1)
    tr = rows_once.trace(fl.spec(A.shape, "f32"), fl.spec(B.shape, "f32"))
    load_a = next(op for op in tr.ops if op.kind == "load" and op.src.tensor.name == "A")
    last_read = max(op.index for op in tr.ops if any(t.base is load_a.dst for t in op.reads()))
    buf = tr.plan.buffer_of[load_a.dst.id]
    assert buf.last == last_read > load_a.index
    assert all(t.base is None for b in tr.plan.buffers for t in b.tiles)   # slices take no buffer


@fl.kernel
def nested(X: fl.f32["M", "N"]):
    """Slices of slices, ints that drop axes, negative indices; stored straight from a slice."""
    M, N = X.shape
    Y = fl.output((M // 2, 3), fl.f32)
    Z = fl.output((N,), fl.f32)
    x = fl.load(X[:, :])
    top = x[0:M // 2, :]
    fl.store(Y[:, :], top[:, -4:-1] * 2.0)
    fl.store(Z[:], x[-1])
    return Y, Z


@pytest.mark.parametrize("target", ["tiny", "rngd"])
def test_slices_compose_and_ints_drop_axes(target):
    X = f32(6, 10)
    y, z = nested(X)
    np.testing.assert_array_equal(y, X[:3, 6:9] * 2.0)
    np.testing.assert_array_equal(z, X[-1])
    res = nested.trace(fl.spec(X.shape, "f32"), target=target).program().simulate({"X": X})
    np.testing.assert_array_equal(res.outputs["Y"], y)
    np.testing.assert_array_equal(res.outputs["Z"], z)


@fl.kernel
def sees_later_writes(A: fl.f32["M", "K"], B: fl.f32["K", "N"]):
    """A slice is a view: taken before its accumulator is added onto, it reads the sum."""
    M, K = A.shape
    C = fl.output((M, 2), fl.f32)
    a, b = fl.load(A[:, :]), fl.load(B[:, :])
    acc = fl.contract("mk,kn->mn", a[:, 0:4], b[0:4, :])
    first_cols = acc[:, 0:2]
    acc = fl.contract("mk,kn->mn", a[:, 4:8], b[4:8, :], acc=acc)
    fl.store(C[:, :], first_cols + 0.0)
    return C


@pytest.mark.parametrize("target", ["tiny", "rngd"])
def test_a_slice_reads_its_base_when_used_in_the_interpreter_and_on_the_chip(target):
    A, B = f32(8, 8), f32(8, 5, seed=1)
    want = (A @ B)[:, :2]
    np.testing.assert_allclose(sees_later_writes(A, B), want, rtol=1e-5, atol=1e-5)
    tr = sees_later_writes.trace(fl.spec(A.shape, "f32"), fl.spec(B.shape, "f32"), target=target)
    res = tr.program().simulate({"A": A, "B": B})
    np.testing.assert_allclose(res.outputs["C"], want, rtol=1e-5, atol=1e-5)


# ---- writing into a slice ----------------------------------------------------------------------
@fl.kernel
def into_parts(A: fl.f32["M", "K"], B: fl.f32["K", "N"]):
    """Each K half accumulates into its own part of one accumulator (a border tap of a convolution
    adds into the output columns it reaches); a vector op and a load write into parts of a tile."""
    M, K = A.shape
    N = B.shape[1]
    C = fl.output((M, N), fl.f32)
    D = fl.output((M, K), fl.f32)
    a, b = fl.load(A[:, :]), fl.load(B[:, :])
    acc = fl.zeros((M, N), space=fl.ACC)
    fl.contract("mk,kn->mn", a[:, 0:4], b[0:4, 0:3], acc=acc[:, 0:3])
    fl.contract("mk,kn->mn", a[:, 4:8], b[4:8, 1:N], acc=acc[:, 1:N])
    fl.store(C[:, :], acc + 0.0)
    d = fl.load(A[:, :])
    fl.exp(a[:, 0:2], out=d[:, 0:2])
    fl.load(A[:, 6:8], into=d[:, 2:4])
    fl.store(D[:, :], d)
    return C, D


@pytest.mark.parametrize("target", ["tiny", "rngd"])
def test_writes_into_slices_land_in_their_part_of_the_tile(target):
    A, B = f32(5, 8), f32(8, 6, seed=1)
    want_c = np.zeros((5, 6), np.float32)
    want_c[:, 0:3] += A[:, 0:4] @ B[0:4, 0:3]
    want_c[:, 1:6] += A[:, 4:8] @ B[4:8, 1:6]
    want_d = A.copy()
    want_d[:, 0:2] = np.exp(A[:, 0:2])
    want_d[:, 2:4] = A[:, 6:8]
    c, d = into_parts(A, B, target=target)
    np.testing.assert_allclose(c, want_c, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d, want_d, rtol=1e-6)
    tr = into_parts.trace(fl.spec(A.shape, "f32"), fl.spec(B.shape, "f32"), target=target)
    res = tr.program().simulate({"A": A, "B": B})
    np.testing.assert_allclose(res.outputs["C"], want_c, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res.outputs["D"], want_d, rtol=1e-6)
    # the zero fill stays: a contraction into part of the accumulator does not overwrite all of it
    assert any(c.kind == "vector" and c.op.name == "fill" for c in tr.program().commands)


# ---- errors, on the author's line ----------------------------------------------------------------
@pytest.mark.parametrize("index, error", [
    ("a[0:9, :]", E.OutOfBoundsError),      # leaves the tile
    ("a[:, 8:0:-1]", E.OutOfBoundsError),   # a negative step
    ("a[:, 0:0]", E.OutOfBoundsError),      # empty
    ("a[3, 1, 0]", E.OutOfBoundsError),     # more indices than axes
    ("a[a, :]", E.TraceError),              # boxes are fixed at trace time
])
def test_a_bad_slice_is_a_clear_error(index, error):
    src = (f"def bad(A: fl.f32['M', 'N']):\n    Y = fl.output((8, 8), fl.f32)\n    a = fl.load(A[:, :])\n"
           f"    fl.store(Y[:, :], {index} + 0.0)\n    return Y\n")
    scope = {"fl": fl}
    exec(compile(src, "<slicing>", "exec"), scope)
    with pytest.raises(error) as ei:
        fl.kernel(scope["bad"])(f32(8, 8))
    assert ei.value.loc is not None and ei.value.loc.line == 4


def test_slicing_a_tile_nothing_wrote_is_an_uninitialized_read():
    @fl.kernel
    def unwritten(A: fl.f32["M", "N"]):
        Y = fl.output((4, 4), fl.f32)
        t = fl.empty((8, 8), fl.f32)
        fl.store(Y[:, :], t[0:4, 0:4])  # <- here
        return Y

    with pytest.raises(E.UninitializedReadError) as ei:
        unwritten(f32(8, 8))
    assert ei.value.loc.line == line_of(unwritten)


# ---- the NPU's buffer views, which slices lower to -----------------------------------------------
def test_buffer_views_are_read_in_place_and_order_against_their_buffer():
    b = ProgramBuilder(get_target("tiny"), name="views")
    A, W, O = b.input("A", (8, 32), "f32"), b.input("W", (32, 16), "f32"), b.output("O", (8, 16), "f32")
    a, w, acc = b.alloc("a", (8, 32)), b.alloc("w", (32, 16)), b.alloc("acc", (8, 16))
    load_a = b.load(a, A)
    b.load(w, W)
    firsts = [b.contract(acc, "mk,kn->mn", a[:, k:k + 8], w[k:k + 8], accumulate=k > 0) for k in range(0, 32, 8)]
    b.store(O, acc)
    reload = b.load(a, A)   # overwrites the buffer the views read: waits for every reader
    assert load_a.id in firsts[0].deps
    assert set(c.id for c in firsts) <= set(reload.deps)
    assert firsts[1].a.shape == (8, 8) and firsts[1].reads[0] is a   # a view reads its whole buffer
    x, y = f32(8, 32), f32(32, 16, seed=1)
    out = b.build().simulate({"A": x, "W": y}).outputs["O"]
    np.testing.assert_allclose(out, x @ y, rtol=1e-5, atol=1e-5)


def test_buffer_views_stay_inside_their_buffer_and_writes_order_against_it():
    b = ProgramBuilder(get_target("tiny"))
    q = b.alloc("q", (4, 4))
    top = b.vector(q[0:2], "fill", 0.0)
    bottom = b.vector(q[2:4], "fill", 1.0)
    assert top.writes[0] is q and top.id in bottom.deps   # conservative: one buffer, one writer at a time
    with pytest.raises(ProgramError, match="outside"):
        q[4]
    with pytest.raises(ProgramError, match="positive step"):
        q[:, ::-1]
    assert q[1:3][1].shape == (4,) and q[1:3][1].index == (2, slice(0, 4, 1))
    assert q[:, 1::2][1:, 1].index == (slice(1, 4, 1), 3)   # a view of a stepped view, in the buffer



@fl.kernel
def strided(X: fl.f32["M", "N"]):
    """Stepped slices (a pooling window's columns, every other row), and slices of them."""
    M, N = X.shape
    Y = fl.output((3, 4), fl.f32)
    x = fl.load(X[:, :])
    every_other = x[1::2, ::3]          # rows 1, 3, 5, ...; columns 0, 3, 6, ...
    fl.store(Y[:, :], every_other[0:3, 1:5] + x[0:6:2, 2:10:2])
    return Y


@pytest.mark.parametrize("target", ["tiny", "rngd"])
def test_stepped_slices_equal_numpy_interpreted_and_simulated(target):
    X = f32(9, 16)
    want = X[1::2, ::3][0:3, 1:5] + X[0:6:2, 2:10:2]
    np.testing.assert_array_equal(strided(X), want)
    tr = strided.trace(fl.spec(X.shape, "f32"), target=target)
    np.testing.assert_array_equal(tr.program().simulate({"X": X}).outputs["Y"], want)
    assert "%x.0[1:6:2, 3:13:3], %x.0[0:5:2, 2:9:2]" in str(tr)   # the composed view, in the tile's own coordinates
