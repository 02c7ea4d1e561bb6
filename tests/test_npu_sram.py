"""The SRAM allocator: lifetimes, address reuse, and the overflow error."""

import numpy as np
import pytest

from fexplore.errors import FexploreError
from fexplore.npu import ProgramBuilder, SRAMOverflowError, get_target

TINY = get_target("tiny")   # 64 KiB per PE


def _three_live_buffers():
    b = ProgramBuilder(TINY)
    X = b.input("X", (3, 96, 64), "f32")
    Y = b.output("Y", (96, 64), "f32")
    bufs = [b.alloc(name, (96, 64), "f32") for name in ("x0", "x1", "x2")]  # 24 KiB each
    for i, buf in enumerate(bufs):
        b.load(buf, X[i])
    b.vector(bufs[0], "add", bufs[0], bufs[1])
    b.vector(bufs[0], "add", bufs[0], bufs[2])
    b.store(Y, bufs[0])
    return b


def test_tiny_rejects_live_buffers_beyond_sram():
    b = _three_live_buffers()
    with pytest.raises(SRAMOverflowError) as err:
        b.build()
    e = err.value
    msg = str(e)
    assert e.code == "FX500" and isinstance(e, FexploreError)
    assert "'x2'" in msg and "24576 bytes" in msg             # the buffer and its size
    assert "65536" in msg                                       # the capacity
    assert "x0" in msg and "x1" in msg                          # what was live
    assert "PE 0" in msg and e.hint
    assert e.loc is not None and e.loc.file.endswith("test_npu_sram.py")  # the command's line


def test_the_same_program_fits_rngd():
    b = ProgramBuilder("rngd")
    X = b.input("X", (3, 96, 64), "f32")
    bufs = [b.alloc(f"x{i}", (96, 64), "f32") for i in range(3)]
    for i, buf in enumerate(bufs):
        b.load(buf, X[i])
    b.vector(bufs[0], "add", bufs[1], bufs[2])
    prog = b.build()
    assert prog.allocation.peak[0] == 3 * 96 * 64 * 4


def test_a_buffer_larger_than_sram_is_rejected_at_alloc():
    b = ProgramBuilder(TINY)
    with pytest.raises(SRAMOverflowError, match="'huge'.*larger than the whole SRAM"):
        b.alloc("huge", (256, 256), "f32")


def test_buffers_live_only_from_first_to_last_use():
    """Four 24 KiB buffers used one after another fit in 64 KiB: each takes space freed by an
    earlier one, and that reuse waits for the earlier buffer's last reader. Space freed longest ago
    is taken first, so the vector unit can fill one tile while the DMA stores the previous one."""
    b = ProgramBuilder(TINY)
    Y = b.output("Y", (4, 96, 64), "f32")
    fills, stores = [], []
    for i in range(4):
        buf = b.alloc(f"t{i}", (96, 64), "f32")
        fills.append(b.vector(buf, "fill", float(i)))
        stores.append(b.store(Y[i], buf))
    prog = b.build()
    alloc = prog.allocation
    assert alloc.peak[0] == 24576                                # in program order one is live at a time
    assert alloc.offset[0] != alloc.offset[1]                    # t1 takes fresh space: no wait on t0
    assert alloc.offset[2] == alloc.offset[0]                    # t2 reuses t0's space ...
    assert stores[0].id in fills[2].deps                         # ... after t0's store has read it
    assert fills[1].deps == ()
    res = prog.simulate({})
    expect = np.broadcast_to(np.arange(4, dtype=np.float32)[:, None, None], (4, 96, 64))
    np.testing.assert_array_equal(res.outputs["Y"], expect)
    # in the run two tiles share SRAM (one stored while the next is filled), never more than fits
    assert res.sram_peak == [2 * 24576, 0]
    ev = {e.cmd: e for e in res.timeline.events}
    assert ev[fills[1].id].start < ev[stores[0].id].end


def test_buffers_are_aligned():
    b = ProgramBuilder(TINY)
    X = b.input("X", (10,), "f32")
    small = [b.alloc(f"s{i}", (10,), "f32") for i in range(3)]    # 40 bytes each
    for s in small:
        b.load(s, X)
    b.vector(small[0], "add", small[1], small[2])
    alloc = b.build().allocation
    assert [alloc.offset[s.id] for s in small] == [0, 64, 128]


def test_fresh_placement_after_a_pe_empties_still_orders_the_reuse():
    """With `fresh_placement_when_empty`, a buffer made after every earlier one on its PE has died
    is placed as in fresh SRAM (first fit, over the space the earlier ones used), and its first
    writer still waits for the last reader of the buffer whose space it takes."""
    placed = {}
    for fresh in (False, True):
        b = ProgramBuilder(TINY)
        b.fresh_placement_when_empty = fresh
        X, Y = b.input("X", (16, 64), "f32"), b.output("Y", (16, 64), "f32")
        p, q = b.alloc("p", (16, 64), "f32"), b.alloc("q", (16, 64), "f32")
        b.load(p, X)
        last_reader = b.store(Y, p)         # p dies here: the PE's SRAM is empty
        first_writer = b.load(q, X)
        b.store(Y, q)
        prog = b.build()
        a = prog.allocation
        placed[fresh] = a.offset[q.id]
        overlaps = a.offset[q.id] < a.offset[p.id] + a.size[p.id] and a.offset[p.id] < a.offset[q.id] + a.size[q.id]
        # an overlap is always ordered; without one there is nothing to wait for
        assert (last_reader.id in prog.commands[first_writer.id].deps) == overlaps
        np.testing.assert_array_equal(prog.simulate({"X": np.ones((16, 64), np.float32)}).outputs["Y"], 1.0)
    assert placed[False] != 0      # by default: never-used space first, so no wait
    assert placed[True] == 0       # fresh: first fit, over p, after p's reader


def _churning_program():
    """Buffers of mixed sizes opened and closed in a random order on TINY: the free space splits
    into many segments and every placement has freed ranges of many ages to choose among."""
    rng = np.random.default_rng(7)
    b = ProgramBuilder(TINY)
    X, Y = b.input("X", (64, 64), "f32"), b.output("Y", (64, 64), "f32")
    live, used = [], 0
    for i in range(300):
        rows = int(rng.choice([2, 4, 8, 16]))
        while live and (used + rows * 256 > 48 * 1024 or rng.random() < 0.45):
            buf = live.pop(int(rng.integers(len(live))))
            b.store(Y[: buf.shape[0]], buf)      # its last use: the buffer dies here
            used -= buf.shape[0] * 256
        buf = b.alloc(f"t{i}", (rows, 64), "f32")
        b.load(buf, X[:rows])
        live.append(buf)
        used += rows * 256
    return b.build()


def test_remembered_best_places_match_a_search_from_scratch(monkeypatch):
    """The allocator remembers each free segment's best place per buffer size until the segment
    changes; forgetting everything before every placement must give the same addresses and the
    same reuse dependencies."""
    from fexplore.npu import sram

    remembered = _churning_program().allocation
    searched = sram._PESpace.place

    def from_scratch(space, size):
        space._best.clear()
        return searched(space, size)

    monkeypatch.setattr(sram._PESpace, "place", from_scratch)
    fresh = _churning_program().allocation
    assert len(set(remembered.offset)) > 20 and remembered.reuse_deps   # space was reused, a lot
    assert remembered.offset == fresh.offset
    assert remembered.reuse_deps == fresh.reuse_deps


def test_every_writer_of_a_resident_tensor_waits_for_the_space_it_takes():
    """A resident tensor is written box by box by DMAs that do not follow one another (here from
    two PEs); placed over a dead buffer, each of them, not only the first, waits for that buffer's
    last reader, or the second would overwrite it while it is still being read out."""
    b = ProgramBuilder(TINY)
    X, Y = b.input("X", (240, 64), "f32"), b.output("Y", (240, 64), "f32")
    Z = b.output("Z", (16, 64), "f32")
    t0, t1 = b.alloc("t0", (8, 64), "f32"), b.alloc("t1", (8, 64), "f32", pe=1)
    b.load(t0, X[:8])
    b.load(t1, X[8:16])
    p = b.alloc("p", (240, 64), "f32")      # 60 KiB: with t0, all but 2 KiB of PE 0's 64 KiB
    b.load(p, X)
    last_reader = b.store(Y, p)             # p dies; a long store
    R = b.resident("R", (16, 64), "f32", pe=0)
    writers = [b.store(R[:8], t0), b.store(R[8:], t1)]
    r = b.alloc("r", (16, 64), "f32")
    b.load(r, R)
    b.store(Z, r)
    prog = b.build()
    a = prog.allocation
    assert a.offset[R.backing.id] < a.offset[p.id] + a.size[p.id]   # R took p's space
    for w in writers:
        assert last_reader.id in prog.commands[w.id].deps
    x = np.arange(240 * 64, dtype=np.float32).reshape(240, 64)
    out = prog.simulate({"X": x}).outputs                            # the race check passes
    np.testing.assert_array_equal(out["Z"], x[:16])
    np.testing.assert_array_equal(out["Y"], x)


def test_a_reuse_waits_for_the_last_reader_per_queue_only():
    """A buffer placed over many dead tiles waits for each engine queue's last reader of them, not
    for every reader: a queue runs its commands one at a time in order, so the last one's end
    implies the others'. The run is the one every dependency would give (the race check passes and
    the result is right), and the program carries a dependency per queue, not one per tile (a
    resident tensor written box by box over a long model's dead tiles had millions)."""
    b = ProgramBuilder(TINY)
    X, Y = b.input("X", (8, 32, 64), "f32"), b.output("Y", (8, 32, 64), "f32")
    Z = b.output("Z", (256, 64), "f32")
    stores = []
    for i in range(8):   # eight 8 KiB tiles, each loaded and stored: 64 KiB of PE 0 used once
        t = b.alloc(f"t{i}", (32, 64), "f32")
        b.load(t, X[i])
        stores.append(b.store(Y[i], t))
    big = b.alloc("big", (256, 64), "f32")   # all of PE 0's SRAM: over every dead tile
    fill = b.vector(big, "fill", 2.0)
    b.store(Z, big)
    prog = b.build()
    dma_deps = [d for d in prog.commands[fill.id].deps if prog.commands[d].engine == 0]
    assert dma_deps == [stores[-1].id]           # not the eight stores: the last one implies them
    x = np.arange(8 * 32 * 64, dtype=np.float32).reshape(8, 32, 64)
    out = prog.simulate({"X": x}).outputs
    np.testing.assert_array_equal(out["Y"], x)
    np.testing.assert_array_equal(out["Z"], np.full((256, 64), 2.0, np.float32))
