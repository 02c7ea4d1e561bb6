"""The simulator's hazard check (`npu.racecheck`): a run that lets a command overtake one it
conflicts with, or keeps two live buffers at one SRAM address, is refused; correct programs pass."""

import numpy as np
import pytest

from fexplore.npu import HazardError, ProgramBuilder, examples
from fexplore.npu.program import Program
from fexplore.npu.racecheck import check_run
from fexplore.npu.simulator import run_timing


def _rebuilt(prog: Program, drop: dict[int, set[int]] = (), offsets: dict[int, int] = ()) -> Program:
    """The same commands with some dependencies dropped and some SRAM offsets moved: the faults a
    wrong hazard inference or a wrong allocator would make."""
    for cid, gone in dict(drop).items():
        c = prog.commands[cid]
        c.deps = tuple(d for d in c.deps if d not in gone)
    for bid, off in dict(offsets).items():
        prog.allocation.offset[bid] = off
    return Program(prog.name, prog.target, list(prog.commands), list(prog.buffers), prog.tensors,
                   prog.allocation)


def _load_exp_store():
    b = ProgramBuilder("rngd")
    A, C = b.input("A", (64, 64)), b.output("C", (64, 64))
    a, e = b.alloc("a", (64, 64)), b.alloc("e", (64, 64))
    b.load(a, A)
    b.vector(e, "exp", a)
    b.store(C, e)
    return b.build()


@pytest.mark.parametrize("target", ["rngd", "tiny"])
def test_correct_programs_pass(target):
    prog = examples.tiled_matmul(target, 80, 72, 100, tile=(32, 32, 32))
    assert check_run(prog, run_timing(prog)) == []
    a, bm = np.ones((80, 100), np.float32), np.ones((100, 72), np.float32)
    np.testing.assert_allclose(prog.simulate({"A": a, "B": bm}).outputs["C"], a @ bm)


def test_a_read_that_overtakes_its_write_is_refused():
    prog = _load_exp_store()
    load, vec = prog.commands[0], prog.commands[1]
    assert load.id in vec.deps
    bad = _rebuilt(prog, drop={vec.id: {load.id}})
    found = check_run(bad, run_timing(bad))
    assert len(found) == 1 and "reads SRAM buffer 'a'" in found[0]
    with pytest.raises(HazardError, match="FX503"):
        bad.simulate({"A": np.zeros((64, 64), np.float32)})


def test_a_store_read_back_before_it_lands_is_refused():
    b = ProgramBuilder("rngd")
    A, S, C = b.input("A", (64, 64)), b.scratch("S", (64, 64)), b.output("C", (64, 64))
    x, y = b.alloc("x", (64, 64)), b.alloc("y", (64, 64), pe=1)
    b.load(x, A)
    st = b.store(S, x)
    ld = b.load(y, S)           # on another PE: only the DRAM hazard orders it after the store
    b.store(C, y)
    prog = b.build()
    assert st.id in ld.deps
    bad = _rebuilt(prog, drop={ld.id: {st.id}})
    found = check_run(bad, run_timing(bad))
    assert any("reads DRAM it writes: S" in f for f in found)


def test_a_read_of_a_stack_that_overtakes_one_pieces_store_is_refused():
    """A piece stored through a view at an offset (a concatenation written in place) is checked in
    its run of the storage: reads of that run before the store landed are found."""
    from test_npu_builder import _stacked_by_two_pieces

    prog, s0, s1, part, both = _stacked_by_two_pieces()
    assert check_run(prog, run_timing(prog)) == []
    bad = _rebuilt(prog, drop={part.id: {s1.id}, both.id: {s1.id}})
    found = check_run(bad, run_timing(bad))
    assert found and all("reads DRAM it writes: Y" in f for f in found)
    # the whole read not waiting for the first piece's store: nothing is early, that store landed
    # long before (the check compares the times of the run, not the dependencies)
    prog, s0, s1, part, both = _stacked_by_two_pieces()
    in_time = _rebuilt(prog, drop={both.id: {s0.id}})
    assert check_run(in_time, run_timing(in_time)) == []


def test_live_buffers_sharing_sram_are_refused():
    prog = _load_exp_store()
    a, e = prog.buffers
    assert prog.allocation.offset[a.id] != prog.allocation.offset[e.id]
    bad = _rebuilt(prog, offsets={e.id: prog.allocation.offset[a.id]})
    found = check_run(bad, run_timing(bad))
    assert len(found) == 1 and "overlap while both are alive" in found[0]


def test_zero_dim_tensors_are_tracked():
    b = ProgramBuilder("rngd")
    A, S, C = b.input("A", ()), b.scratch("S", ()), b.output("C", ())
    x, y = b.alloc("x", ()), b.alloc("y", (), pe=1)
    b.load(x, A)
    st = b.store(S, x)
    ld = b.load(y, S)
    b.store(C, y)
    prog = b.build()
    assert check_run(prog, run_timing(prog)) == []
    assert np.asarray(prog.simulate({"A": np.float32(3.0)}).outputs["C"]) == 3.0
    bad = _rebuilt(prog, drop={ld.id: {st.id}})
    assert any("reads DRAM it writes: S" in f for f in check_run(bad, run_timing(bad)))
