"""The builder: inferred dependencies, explicit ones, barriers, and errors in the user's terms."""

import numpy as np
import pytest

from fexplore.errors import SourceLoc
from fexplore.npu import ProgramBuilder, ProgramError


def _buf(b, name, shape=(8, 8), dtype="f32", pe=0):
    return b.alloc(name, shape, dtype, pe=pe)


def test_dependencies_are_inferred_from_reads_and_writes():
    b = ProgramBuilder("tiny")
    A, C = b.input("A", (8, 8)), b.output("C", (8, 8))
    x, y = _buf(b, "x"), _buf(b, "y")
    ld = b.load(x, A)
    ex = b.vector(y, "exp", x)              # reads x: after the load (RAW)
    ld2 = b.load(x, A)                      # overwrites x: after exp has read it (WAR)
    st = b.store(C, y)                      # reads y: after exp (RAW)
    st2 = b.store(C, x)                     # same DRAM box: after the first store (WAW)
    b.build()
    assert ex.deps == (ld.id,)
    assert ex.id in ld2.deps
    assert st.deps == (ex.id,)
    assert st.id in st2.deps and ld2.id in st2.deps


def test_dram_dependencies_follow_boxes_across_pes():
    b = ProgramBuilder("tiny")
    H = b.scratch("H", (16, 8))
    p0, p1 = _buf(b, "p0", pe=0), _buf(b, "p1", pe=1)
    q1 = _buf(b, "q1", (16, 8), pe=1)
    b.vector(p0, "fill", 1.0)
    b.vector(p1, "fill", 2.0)
    s0 = b.store(H[0:8], p0)
    s1 = b.store(H[8:16], p1)               # a disjoint tile: independent of s0
    ld = b.load(q1, H)                      # reads both tiles: waits for both stores
    b.build()
    assert s0.id not in s1.deps
    assert {s0.id, s1.id} <= set(ld.deps)


def test_tiles_stored_through_a_view_stay_independent_and_conflicts_across_views_are_found():
    b = ProgramBuilder("tiny")
    Y = b.output("Y", (1, 16, 8))            # a model's output, written by a kernel as [16, 8]
    Y2 = b.view("Y2", Y, (16, 8))
    F = b.view("F", Y, (128,))               # and read back flat by another
    p0, p1 = _buf(b, "p0", (16, 4), pe=0), _buf(b, "p1", (16, 4), pe=1)
    b.vector(p0, "fill", 1.0)
    b.vector(p1, "fill", 2.0)
    s0 = b.store(Y2[:, 0:4], p0)
    s1 = b.store(Y2[:, 4:8], p1)             # the other columns: independent of s0
    ld = b.load(_buf(b, "q", (4,), pe=1), F[68:72])               # row 8, columns 4..7: s1's
    ld_y = b.load(_buf(b, "r", (1, 8, 4), pe=0), Y[:, 0:8, 0:4])  # s0's
    b.build()
    assert s0.id not in s1.deps
    assert s1.id in ld.deps and s0.id not in ld.deps
    assert s0.id in ld_y.deps and s1.id not in ld_y.deps


def _stacked_by_two_pieces():
    """Y (2, 4, 8) made as two (4, 8) pieces stored through views at element offsets 0 and 32 (a
    stack whose pieces are stored in place), then read back: one piece's rows and the whole."""
    b = ProgramBuilder("tiny")
    Y, C = b.output("Y", (2, 4, 8)), b.output("C", (2, 4, 8))
    P0 = b.view("P0", Y, (4, 8), offset=0)
    P1 = b.view("P1", Y, (1, 4, 8), offset=32)
    p0, p1 = _buf(b, "p0", (4, 8), pe=0), _buf(b, "p1", (1, 4, 8), pe=1)
    b.vector(p0, "fill", 1.0)
    slow = _buf(b, "slow", (64, 64), pe=1)   # the second piece is late: vector work before it
    b.vector(slow, "fill", 0.0)
    for _ in range(4):
        b.vector(slow, "exp", slow)
    b.vector(p1, "fill", 2.0)
    s0, s1 = b.store(P0, p0), b.store(P1, p1)
    part = b.load(_buf(b, "q", (1, 2, 8), pe=0), Y[1:2, 2:4, :])   # rows of the second piece
    whole = _buf(b, "w", (2, 4, 8), pe=0)
    both = b.load(whole, Y)
    b.store(C, whole)
    return b.build(), s0, s1, part, both


def test_pieces_stored_through_views_at_offsets_fill_their_runs_and_order_only_their_readers():
    prog, s0, s1, part, both = _stacked_by_two_pieces()
    assert s0.id not in s1.deps
    assert s1.id in part.deps and s0.id not in part.deps
    assert {s0.id, s1.id} <= set(both.deps)
    out = prog.simulate(functional=True).outputs
    want = np.stack([np.full((4, 8), 1.0), np.full((4, 8), 2.0)]).astype(np.float32)
    np.testing.assert_array_equal(out["Y"], want)
    np.testing.assert_array_equal(out["C"], want)
    # the pieces' bytes are the result's: Y written once (by its two pieces), C written; reading Y
    # back is not compulsory (Y is no input: a kernel could read the pieces where they were made)
    assert prog.compulsory_bytes() == 2 * want.nbytes


def test_a_view_past_the_end_of_its_base_is_refused():
    b = ProgramBuilder("tiny")
    Y = b.output("Y", (2, 4, 8))
    b.view("last", Y, (4, 8), offset=32)   # the last run: fine
    with pytest.raises(ProgramError, match="not all among its 64"):
        b.view("past", Y, (4, 8), offset=40)
    with pytest.raises(ProgramError, match="has 16 elements"):
        b.view("reshape", Y, (4, 4))        # no offset: a reshape of the whole


@pytest.mark.parametrize("shape", [(1, 12, 10), (1, 1, 9, 6), (7, 1, 5), (1,), (3, 4, 1, 5, 6)])
def test_the_box_index_finds_exactly_the_conflicts_a_scan_of_every_box_finds(shape, monkeypatch):
    """The tracker indexes a tensor's boxes along its first axes longer than 1 (up to three: the
    last shape has a fourth, compared box by box) so an access is compared with nearby boxes only.
    Random reads and writes of one tensor (and a view of it) get the same dependencies as from a
    comparison with every box."""
    import fexplore.npu.hazards as hazards

    rng = np.random.default_rng(sum(shape))

    def random_box():
        offsets, sizes = [], []
        for d in shape:
            lo = int(rng.integers(0, d))
            offsets.append(lo)
            sizes.append(int(rng.integers(1, d - lo + 1)))
        return tuple(slice(o, o + n) for o, n in zip(offsets, sizes))

    accesses = [(random_box(), bool(rng.integers(0, 2))) for _ in range(200)]

    def deps_of_program():
        b = ProgramBuilder("tiny")
        T = b.scratch("T", shape)
        flat = b.view("flat", T, (int(np.prod(shape)),))
        out = []
        for i, (box, write) in enumerate(accesses):
            ref = T[box]
            buf = _buf(b, f"b{i}", tuple(x.stop - x.start for x in box))
            out.append((b.store(ref, buf) if write else b.load(buf, ref)).id)
        b.load(_buf(b, "all", (int(np.prod(shape)),)), flat)
        prog = b.build()
        return [sorted(d for d in prog.commands[c].deps if prog.commands[d].kind in ("load", "store"))
                for c in out]

    indexed = deps_of_program()
    monkeypatch.setattr(hazards, "_index_axes", lambda ref: ())   # no axis indexed: every box compared
    assert indexed == deps_of_program()
    assert any(indexed) and not all(indexed)   # some accesses conflict, some do not


def test_explicit_deps_sync_and_barrier():
    b = ProgramBuilder("tiny")
    x0, x1 = _buf(b, "x0", pe=0), _buf(b, "x1", pe=1)
    f0 = b.vector(x0, "fill", 0.0)
    f1 = b.vector(x1, "fill", 1.0)
    join = b.sync(f0, f1)
    after = b.vector(x0, "add", x0, 1.0, deps=[join])
    assert join.deps == (f0.id, f1.id) and join.id in after.deps
    bar = b.barrier()
    g1 = b.vector(x1, "mul", x1, 3.0)        # on PE1: must wait for everything before the barrier
    assert bar.id in g1.deps and after.id in bar.deps
    res = b.build().simulate()
    ev = {e.cmd: e for e in res.timeline.events}
    assert ev[g1.id].start >= max(ev[after.id].end, ev[f1.id].end)


def test_commands_carry_source_locations():
    b = ProgramBuilder("tiny")
    x = _buf(b, "x")
    c = b.vector(x, "fill", 0.0)
    assert c.loc.file.endswith("test_npu_builder.py") and c.loc.line > 0
    given = SourceLoc("model.py", 12, "model.layers.0.mlp")
    c2 = b.vector(x, "add", x, 1.0, loc=given)
    assert c2.loc is given
    prog = b.build()
    assert "model.py:12 in model.layers.0.mlp" in str(prog)
    assert ProgramBuilder("tiny", capture_locs=False).vector  # capture can be switched off
    nb = ProgramBuilder("tiny", capture_locs=False)
    assert nb.vector(_buf(nb, "y"), "fill", 0.0).loc is None


@pytest.mark.parametrize("make,match", [
    (lambda b: b.load(_buf(b, "x", (4, 4)), b.input("A", (8, 8))), "shapes differ"),
    (lambda b: b.load(_buf(b, "x", dtype="bf16"), b.input("A", (8, 8))), "dtypes differ"),
    (lambda b: b.contract(_buf(b, "o"), "mk,kn->mn", _buf(b, "a"), _buf(b, "c", pe=1)), "different PEs"),
    (lambda b: b.contract(_buf(b, "o"), "mk,kn->mn", _buf(b, "a", (8, 4)), _buf(b, "c")), "index 'k'"),
    (lambda b: b.contract(_buf(b, "o", (8, 4)), "mk,kn->mn", _buf(b, "a"), _buf(b, "c")), "result shape"),
    (lambda b: b.contract(_buf(b, "o"), "mk,kn", _buf(b, "a"), _buf(b, "c")), "not of the form"),
    (lambda b: b.contract(_buf(b, "o"), "mk,kn->mn", _buf(b, "a", dtype="i32"), _buf(b, "c", dtype="i32")),
     "no i32 mode"),
    (lambda b: b.vector(_buf(b, "o"), "softplus", _buf(b, "a")), "unknown vector op"),
    (lambda b: b.vector(_buf(b, "o"), "add", _buf(b, "a")), "takes 2 operand"),
    (lambda b: b.vector(_buf(b, "o", (8, 1)), "add", _buf(b, "a"), 1.0), "does not match output"),
    (lambda b: b.vector(_buf(b, "o", (8, 1)), "sum", _buf(b, "a"), axis=2), "out of range"),
    (lambda b: _buf(b, "x", pe=2), "PE 2 does not exist"),
    (lambda b: b.vector(_buf(b, "o"), "add", _buf(b, "a"), "x"), "neither"),
    (lambda b: b.stage(b.scratch("S", (8, 8)), b.input("A", (8, 8))), "not a resident tensor"),
    (lambda b: b.stage(b.resident("S", (8, 4)), b.input("A", (8, 8))), "must be a DRAM tensor of f32"),
])
def test_malformed_commands_raise_program_error(make, match):
    b = ProgramBuilder("tiny")
    with pytest.raises(ProgramError, match=match) as err:
        make(b)
    assert err.value.code == "FX501"
    assert err.value.loc is not None  # points at the user's line


def test_a_builder_builds_once_and_rejects_foreign_handles():
    b1, b2 = ProgramBuilder("tiny"), ProgramBuilder("tiny")
    x = _buf(b1, "x")
    with pytest.raises(ProgramError, match="not an SRAM buffer of this program"):
        b2.vector(x, "fill", 0.0)
    b1.vector(x, "fill", 0.0)
    b1.build()
    with pytest.raises(ProgramError, match="already built"):
        b1.vector(x, "fill", 1.0)


def test_program_text_lists_memory_and_commands():
    b = ProgramBuilder("tiny", name="demo", capture_locs=False)
    A, C = b.input("A", (8, 8)), b.output("C", (8, 8))
    x = _buf(b, "x")
    b.load(x, A[0:8, 0:8])
    b.vector(x, "exp", x)
    b.store(C, x)
    text = str(b.build())
    assert text.splitlines() == [
        "program demo on tiny:",
        "  dram.input A<8x8 f32>",
        "  dram.output C<8x8 f32>",
        "  sram pe0.x<8x8 f32> @0x0",
        "  %0 = pe0.dma load A -> x",
        "  %1 = pe0.vector x = exp(x)  after(%0)",
        "  %2 = pe0.dma store x -> C  after(%1)",
    ]


def test_a_staged_tensor_is_read_from_dram_once_and_its_loads_wait_for_the_copy():
    from fexplore.npu import Stage, simulate

    b = ProgramBuilder("tiny")
    W, X = b.input("W", (64, 64)), b.input("X", (4, 64, 64))
    Y = b.output("Y", (4, 64, 64))
    Ws = b.resident("W@sram", (64, 64), pe=1)
    st = b.stage(Ws, W)
    loads = []
    for i in range(4):   # W is read four times: on-chip copies after the one DRAM read
        w, x, y = (b.alloc(f"{n}{i}", (64, 64)) for n in "wxy")
        loads.append(b.load(w, Ws))
        b.load(x, X[i])
        b.contract(y, "mk,kn->mn", x, w)
        b.store(Y[i], y)
    prog = b.build()
    assert isinstance(st, Stage) and all(st.id in ld.deps for ld in loads)
    w, x = np.random.rand(64, 64).astype(np.float32), np.random.rand(4, 64, 64).astype(np.float32)
    res = simulate(prog, {"W": w, "X": x})
    np.testing.assert_allclose(res.outputs["Y"], x @ w, rtol=1e-5)
    assert res.dram_bytes == prog.compulsory_bytes() == (64 * 64 + 2 * 4 * 64 * 64) * 4


def test_a_resident_box_read_in_place_waits_for_its_own_store_only():
    """A command reading a box of a resident tensor through its SRAM (`resident_view`, no copy)
    depends on the store that wrote that box and not on the store of another box; a later store
    to the box waits for it; the simulator computes with what the store put there, and the run
    keeps program order."""
    from fexplore.npu import simulate
    from fexplore.npu.commands import resident_view
    from fexplore.npu.racecheck import check_run

    b = ProgramBuilder("tiny")
    X = b.input("X", (8, 16))
    Y = b.output("Y", (8, 16))
    R = b.resident("R", (8, 16), pe=0)
    stores = []
    for i in range(2):   # R written box by box: rows 0:4, then rows 4:8
        t = b.alloc(f"t{i}", (4, 16))
        b.load(t, X[4 * i:4 * i + 4])
        b.vector(t, "exp", t)
        stores.append(b.store(R[4 * i:4 * i + 4], t))
    top = resident_view(R[0:4], (True, True), (4, 16), "f32")
    assert top is not None and top.shape == (4, 16) and top.base is R.backing
    y = b.alloc("y", (4, 16))
    use = b.vector(y, "mul", top, 2.0)
    b.store(Y[0:4], y)
    again = b.store(R[0:4], y)   # overwrites the box the in-place read read
    z = b.alloc("z", (4, 16))
    b.load(z, X[4:8])
    b.store(Y[4:8], z)
    prog = b.build()
    assert stores[0].id in use.deps and stores[1].id not in use.deps
    assert use.id in again.deps
    x = np.random.rand(8, 16).astype(np.float32)
    res = simulate(prog, {"X": x})
    np.testing.assert_allclose(res.outputs["Y"][:4], 2 * np.exp(x[:4]), rtol=1e-6)
    assert check_run(prog, res.trace) == []
    # a box whose tile would keep a dim the buffer has not, or of another dtype: no view
    assert resident_view(R[0:4], (True, True), (1, 4, 16), "f32") is None
    assert resident_view(R[0:4], (True, True), (4, 16), "bf16") is None


def test_compulsory_bytes_count_inputs_and_results_not_scratch():
    """An intermediate spilled to DRAM is traffic a schedule chose, not compulsory traffic; a
    result the caller reads through a view of a computed tensor is."""
    b = ProgramBuilder("tiny")
    X = b.input("X", (64, 64))
    T = b.scratch("T", (64, 64))          # spilled between two steps
    U = b.scratch("U", (64, 64))          # computed, then returned as a view
    R = b.view("R", U, (4096,), returned=True)
    x, t = b.alloc("x", (64, 64)), b.alloc("t", (64, 64))
    b.load(x, X)
    b.store(T, x)
    b.load(t, T)
    b.store(U, t)
    prog = b.build()
    assert R.returned and not T.returned
    assert prog.compulsory_bytes() == 2 * 64 * 64 * 4                        # X read, U (as R) written
    assert prog.simulate().dram_bytes == 4 * 64 * 64 * 4                     # the spill moves T twice


def test_vector_operand_shapes_broadcast_or_are_refused():
    """Equal shapes and scalars need no broadcast (the common case, answered without numpy);
    shapes that broadcast give the broadcast shape; shapes that do not are a ProgramError."""
    b = ProgramBuilder("tiny")
    out, same = b.alloc("out", (4, 8), "f32"), b.alloc("same", (4, 8), "f32")
    col, row, odd = b.alloc("col", (4, 1), "f32"), b.alloc("row", (1, 8), "f32"), b.alloc("odd", (3, 8), "f32")
    b.vector(out, "add", same, 2.0)
    b.vector(out, "add", col, row)
    with pytest.raises(ProgramError, match="do not fit"):
        b.vector(out, "add", same, odd)
    with pytest.raises(ProgramError, match="does not match output"):
        b.vector(out, "add", col, 1.0)
