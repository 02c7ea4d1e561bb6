"""Data-dependent DMA and relayout in the kernel language: `fl.gather`, `fl.scatter`, `fl.transpose`
through every layer (trace-time checks, interpreter, lowering, simulator: functional, cost), and the
codegen parts built on them (embedding, index, gather, index_put, scatter, permute), on plain IR
nodes and inside compiled models."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import fexplore
from fexplore import lang as fl
from fexplore.errors import SourceLoc
from fexplore.ir import Constant, DType, Node, TensorType, Value, evaluate_node
from fexplore.lang import codegen
from fexplore.npu import IndexOutOfRangeError, ProgramBuilder

TARGETS = ["rngd", "tiny"]
rng = np.random.default_rng(0)


# ---- kernels written by hand --------------------------------------------------------------------
@fl.kernel
def embed(table: fl.f32["V", "D"], ids: fl.i64["N"], *, rows: int = 4):
    N, D = ids.shape[0], table.shape[1]
    O = fl.output(fl.f32["N", "D"])
    for ns in fl.parallel(fl.tiles(N, rows)):
        i = fl.load(ids[ns])
        fl.store(O[ns, :], fl.gather(table, i))
    return O


@fl.kernel
def columns(x: fl.f32["M", "K"], ids: fl.i32["N"]):
    """Gather along axis 1 of a box: x[2:5][:, ids]."""
    O = fl.output(fl.f32[3, "N"])
    i = fl.load(ids)
    fl.store(O, fl.gather(x[2:5, :], i, axis=1))
    return O


@fl.kernel
def take_along(x: fl.f32["M", "K"], ids: fl.i64["M", "J"]):
    O = fl.output(fl.f32["M", "J"])
    fl.store(O, fl.gather(x, fl.load(ids), axis=1, mode="elements"))
    return O


@fl.kernel
def put_rows(base: fl.f32["V", "D"], ids: fl.i64["N"], src: fl.f32["N", "D"], *, add: bool = False):
    O = fl.output(fl.f32["V", "D"])
    fl.store(O, fl.load(base))
    fl.scatter(O, fl.load(ids), fl.load(src), reduce="add" if add else None)
    return O


@fl.kernel
def turn(x: fl.f32["A", "B", "C"]):
    O = fl.output(fl.f32["C", "A", "B"])
    fl.store(O, fl.load(x).transpose("C", "A", "B"))
    return O


def _sim(k, *args, target="tiny"):
    tr = k.trace(*args, target=target)
    names = [t.name for t in tr.params]
    return tr, tr.simulate(dict(zip(names, args)))


@pytest.mark.parametrize("target", TARGETS)
def test_gather_rows_interpreter_and_simulator_equal_numpy(target):
    t = rng.standard_normal((37, 19)).astype(np.float32)
    ids = np.array([3, 0, 36, 3, -1, 2, 7, 5, 9], np.int64)   # repeats and a negative index
    np.testing.assert_array_equal(embed(t, ids, target=target), t[ids])
    tr, res = _sim(embed, t, ids, target=target)
    np.testing.assert_array_equal(tr.unpack(res.outputs), t[ids])
    x = rng.standard_normal((6, 10)).astype(np.float32)
    ids = np.array([9, 0, 4, 4], np.int32)
    np.testing.assert_array_equal(columns(x, ids, target=target), x[2:5][:, ids])
    tr, res = _sim(columns, x, ids, target=target)
    np.testing.assert_array_equal(tr.unpack(res.outputs), x[2:5][:, ids])


@pytest.mark.parametrize("target", TARGETS)
def test_gather_elements_scatter_and_transpose_equal_numpy(target):
    x = rng.standard_normal((5, 8)).astype(np.float32)
    ids = rng.integers(0, 8, (5, 3))
    want = np.take_along_axis(x, ids, axis=1)
    np.testing.assert_array_equal(take_along(x, ids, target=target), want)
    tr, res = _sim(take_along, x, ids, target=target)
    np.testing.assert_array_equal(tr.unpack(res.outputs), want)

    base = rng.standard_normal((7, 5)).astype(np.float32)
    ids = np.array([1, 6, 1, 0])
    src = rng.standard_normal((4, 5)).astype(np.float32)
    added = base.copy()
    np.add.at(added, ids, src)
    np.testing.assert_allclose(put_rows(base, ids, src, add=True, target=target), added, rtol=1e-6)
    put = base.copy()
    put[[6, 0]], put[1] = src[[1, 3]], src[2]   # duplicate index 1: the last write wins
    np.testing.assert_array_equal(put_rows(base, ids, src, target=target), put)
    tr = put_rows.trace(base, ids, src, target=target)
    res = tr.simulate({"base": base, "ids": ids, "src": src})
    np.testing.assert_array_equal(tr.unpack(res.outputs), put)

    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(turn(x, target=target), x.transpose(2, 0, 1))
    tr, res = _sim(turn, x, target=target)
    np.testing.assert_array_equal(tr.unpack(res.outputs), x.transpose(2, 0, 1))
    assert "transpose" in str(tr) and "gather" in str(embed.trace(base, ids, target=target))


def test_an_index_outside_the_table_is_fk140_in_the_interpreter_and_fx502_in_the_simulator():
    t = np.zeros((10, 4), np.float32)
    with pytest.raises(fl.errors.OutOfBoundsError) as e:
        embed(t, np.array([1, 10]))
    assert e.value.code == "FK140" and "index value 10" in str(e.value) and "fl.gather" in str(e.value)
    tr = embed.trace(t, np.array([1, 10]), target="tiny")
    with pytest.raises(IndexOutOfRangeError) as e:
        tr.simulate({"table": t, "ids": np.array([1, 10])})
    assert e.value.code == "FX502"


def _trace_error(src: str, *args):
    ns = {"fl": fl}
    exec(compile(src, "<dma kernel>", "exec"), ns)  # noqa: S102 - a test kernel
    with pytest.raises(fl.KernelError) as e:
        ns["k"](*args)
    return e.value


@fl.kernel
def update_rows(cache: fl.f32["B", "S", "D"], rows: fl.f32["B", "N", "D"], at: fl.i64["N"]):
    B, S, D = cache.shape
    OUT = fl.output(fl.f32["B", "S", "D"], init=cache)
    for b in fl.parallel(B):
        fl.scatter(OUT[b, :, :], fl.load(at), fl.load(rows[b, :, :]))
    return OUT


@pytest.mark.parametrize("target", TARGETS)
def test_an_output_that_starts_as_a_parameter_is_copied_unless_given_its_bytes(target):
    """`fl.output(init=cache)`: the output starts as the cache (a KV-cache update scatters its new
    rows in). Run alone, the kernel copies the cache block by block over the PEs, and the
    interpreter and the simulator agree with numpy. Emitted with the output bound to the cache's
    own storage, as the schedule binds an update whose table nothing reads after it, the copy is
    gone: the DMA moves the new rows, not the cache, and the cache's tensor holds the result."""
    from fexplore.lang.lowering import KernelPart, emit

    rng = np.random.default_rng(0)
    cache = rng.standard_normal((3, 301, 24)).astype(np.float32)   # blocks that do not divide it
    rows = rng.standard_normal((3, 2, 24)).astype(np.float32)
    at = np.array([5, -1])
    want = cache.copy()
    want[:, at] = rows
    np.testing.assert_array_equal(update_rows(cache, rows, at, target=target), want)

    tr, alone = _sim(update_rows, cache, rows, at, target=target)
    np.testing.assert_array_equal(tr.unpack(alone.outputs), want)
    (param, ops), = tr.initial.values()
    num_pes = fexplore.npu.get_target(target).num_pes
    assert param == "cache" and len({tr.ops[i].pe for i in ops}) == min(num_pes, len(ops) // 2)
    stored = [tr.ops[i].dst for i in ops if isinstance(tr.ops[i], fl.ir.Store)]
    assert sum(int(np.prod(box.sizes)) for box in stored) == cache.size   # every element, once

    b = ProgramBuilder(fexplore.npu.get_target(target), name="in_place")
    dram = {"cache": b.input("cache", cache.shape, "f32"), "rows": b.input("rows", rows.shape, "f32"),
            "at": b.input("at", at.shape, "i64")}
    dram["OUT"] = b.view("OUT", dram["cache"], cache.shape, returned=True)
    prog = emit(b, [KernelPart(tr, dram)])
    res = prog.simulate({"cache": cache, "rows": rows, "at": at}, functional=True)
    np.testing.assert_array_equal(res.dram["OUT"], want)
    moved = {kind: sum(prog.moved_bytes[c.id] for c in prog.commands if c.kind == kind)
             for kind in ("load", "store", "scatter")}
    assert moved["store"] == 0 and moved["load"] < cache.nbytes / 20, moved
    # what the step must move: the new rows and their positions read, the rows written
    assert prog.compulsory_bytes() == 2 * rows.nbytes + at.nbytes
    assert len(prog.commands) == len(alone.program.commands) - len(ops)   # the copy, and only it


@pytest.mark.parametrize("rows, pes", [(8, 1), (512, 8)])
def test_an_initial_copy_spreads_over_the_pes_only_blocks_worth_a_dma(rows, pes):
    """A table of a few hundred bytes (a histogram of 8 experts' counts) is copied by one PE: cut
    for every PE, each block would be mostly its DMA start-up, and a buffer for a few bytes on
    every PE fragmented their SRAM (Mixtral's two layers then overflowed interleaved, and ran
    serial at 1.6x the cycles). A table of 512 KB is cut for all 8 PEs of rngd."""
    tr = update_rows.trace(fl.spec((1, rows, 256), "f32"), fl.spec((1, 1, 256), "f32"), fl.spec((1,), "i64"),
                           target="rngd")
    (_, ops), = tr.initial.values()
    assert len({tr.ops[i].pe for i in ops}) == pes


@pytest.mark.parametrize("init, code", [("rows", "FK110"), ("O2", "FK180"), ("cache[0]", "FK180"), ("3", "FK180")])
def test_an_output_started_as_something_other_than_a_whole_parameter_of_its_shape_is_refused(init, code):
    src = ("@fl.kernel\n"
           "def k(cache: fl.f32['S', 'D'], rows: fl.f32[2, 'D']):\n"
           "    O2 = fl.output(fl.f32['S', 'D'])\n"
           f"    O = fl.output(fl.f32['S', 'D'], init={init})\n"
           "    return O\n")
    err = _trace_error(src, np.zeros((6, 4), np.float32), np.zeros((2, 4), np.float32))
    assert err.code == code, str(err)
    assert err.line == 4 and err.expected and err.given and err.hint


@pytest.mark.parametrize("body, code", [
    ("fl.store(O, fl.gather(t, fl.load(f)))", "FK120"),                  # float index
    ("fl.store(O, fl.gather(t, i))", "FK130"),                           # index still in DRAM
    ("fl.store(O, fl.gather(fl.load(t), fl.load(i)))", "FK130"),        # table in SRAM
    ("fl.store(O, fl.gather(t, fl.load(i), axis=2))", "FK112"),          # no such axis
    ("fl.scatter(O, fl.load(i), fl.load(t))", "FK110"),                  # rows do not fit the index
    ("fl.scatter(t, fl.load(i), fl.load(t[0:3, :]))", "FK180"),          # into a parameter
    ("fl.scatter(O, fl.load(i), fl.load(t[0:3, :]), reduce='mean')", "FK170"),  # not applied on write
    ("fl.scatter(O, fl.load(i), fl.load(t[0:3, :]), reduce='add')", "FK150"),   # adds onto nothing
    ("fl.scatter(O, fl.load(i), fl.load(t[0:3, :]), reduce='max')", "FK150"),   # maxes into nothing
    ("fl.store(O, fl.transpose(fl.load(t[0:3, :]), (0, 0)))", "FK112"),
])
def test_trace_time_errors_have_codes(body, code):
    src = ("@fl.kernel\n"
           "def k(t: fl.f32['V', 'D'], i: fl.i64[3], f: fl.f32[3]):\n"
           "    O = fl.output(fl.f32[3, 'D'])\n"
           f"    {body}\n"
           "    return O\n")
    err = _trace_error(src, np.zeros((6, 4), np.float32), np.zeros(3, np.int64), np.zeros(3, np.float32))
    assert err.code == code, str(err)
    assert err.line == 4 and err.expected and err.given


def test_gather_cost_is_one_startup_and_a_line_per_row():
    cfg = fexplore.npu.get_target("rngd")

    def program(n, cols=16):
        b = ProgramBuilder(cfg)
        T, I = b.input("T", (4096, cols), "f32"), b.input("I", (n,), "i32")
        i, r = b.alloc("i", (n,), "i32"), b.alloc("r", (n, cols), "f32")
        b.load(i, I)
        b.gather(r, T, i)
        return b.build()

    few, many = program(8), program(512)
    assert few.moved_bytes[1] == 8 * 256 and many.moved_bytes[1] == 512 * 256   # 64 B rows: a line each
    assert program(8, cols=100).moved_bytes[1] == 8 * 512                         # 400 B rows: two lines
    assert many.simulate().cycles > few.simulate().cycles
    assert few.duration[1] == cfg.dma_startup_cycles                             # start-up once per command


def test_transpose_costs_by_the_assumed_transpose_rate():
    cfg = fexplore.npu.get_target("tiny")
    b = ProgramBuilder(cfg)
    x, y = b.alloc("x", (32, 16), "f32"), b.alloc("y", (16, 32), "f32")
    b.vector(x, "fill", 1.0)
    b.transpose(y, x, (1, 0))
    prog = b.build()
    assert prog.duration[1] == 32 * 16 // cfg.transpose_elements_per_cycle + cfg.vector_latency_cycles
    slower = prog.duration[1]
    b = ProgramBuilder(cfg.replace(transpose_elements_per_cycle=2))
    x, y = b.alloc("x", (32, 16), "f32"), b.alloc("y", (16, 32), "f32")
    b.vector(x, "fill", 1.0)
    b.transpose(y, x, (1, 0))
    assert b.build().duration[1] > slower


# ---- codegen parts on hand-built nodes --------------------------------------------------------------
def _v(name, shape, dt):
    return Value(name, TensorType(tuple(shape), dt))


def _data(v):
    if v.type.dtype in (DType.i64, DType.i32):
        raise AssertionError("index data is given explicitly")
    return rng.standard_normal(v.type.shape).astype(v.type.dtype.numpy)


def _node(op, ins, attrs, dtype):
    dtype = ins[0].type.dtype if ins[0].type.dtype == DType.bool else dtype
    y = Value("y", TensorType(tuple(evaluate_shape(op, ins, attrs)), dtype))
    return Node(op, ins, attrs, [y], SourceLoc("/some/dir/model.py", 7, "blk.op"))


def evaluate_shape(op, ins, attrs):
    from fexplore.ir import get_op

    return get_op(op).infer_types([v.type for v in ins], attrs)[0].shape


def _cases(dt):
    f = lambda n, s: _v(n, s, dt)  # noqa: E731
    i64 = lambda n, s: _v(n, s, DType.i64)  # noqa: E731
    x3 = f("x", (4, 9, 6))
    return [
        ("embedding", [f("w", (37, 19)), i64("ids", (3, 5))], {}, [None, rng.integers(0, 37, (3, 5))]),
        ("embedding", [f("w", (11, 300)), i64("ids", ())], {}, [None, np.array(4)]),          # 0-d index
        ("index", [x3, i64("i", (7,))], {"axes": (1,)}, [None, rng.integers(-9, 9, 7)]),
        ("index", [x3, i64("i", ())], {"axes": (0,)}, [None, np.array(2)]),
        ("index", [x3, i64("i", (2, 3))], {"axes": (2,)}, [None, rng.integers(0, 6, (2, 3))]),
        ("index_put", [x3, f("v", (4, 7, 6)), i64("i", (7,))], {"axes": (1,), "accumulate": True},
         [None, None, rng.integers(0, 9, 7)]),
        ("index_put", [x3, f("v", (2, 9, 6)), i64("i", (2,))], {"axes": (0,), "accumulate": False},
         [None, None, np.array([3, 1])]),
        ("index", [f("y", (3, 4, 5, 6)), i64("j0", (2, 3)), i64("j1", (2, 3))], {"axes": (1, 2)},
         [None, rng.integers(-4, 4, (2, 3)), rng.integers(0, 5, (2, 3))]),                 # x[:, i, j]
        ("index", [f("y", (3, 4, 5)), i64("j0", (2,)), i64("j1", (2,))], {"axes": (0, 1)},
         [None, np.array([2, 0]), np.array([3, 3])]),                                       # x[i, j]
        ("index_put", [f("y", (3, 4, 5, 6)), f("v", (3, 2, 3, 6)), i64("j0", (2, 3)), i64("j1", (2, 3))],
         {"axes": (1, 2), "accumulate": True}, [None, None, rng.integers(0, 4, (2, 3)), rng.integers(0, 5, (2, 3))]),
        ("index", [_v("mask", (2, 8), DType.bool), i64("b", (2, 1, 1, 1)), i64("t", (1, 1, 1, 8))],
         {"axes": (0, 1)}, [rng.random((2, 8)) > 0.5, np.arange(2).reshape(2, 1, 1, 1),
                            np.arange(8).reshape(1, 1, 1, 8)]),                        # broadcast indices
        ("index", [f("y", (3, 4, 5, 6)), i64("c0", (2, 1)), i64("c1", (3,))], {"axes": (1, 2)},
         [None, rng.integers(0, 4, (2, 1)), rng.integers(-5, 5, 3)]),
        # index_put with broadcast indices (MobileViTV2's fold: y[:, rows[:, None], cols[None, :]] = v);
        # accumulated with repeated pairs, and overwritten with distinct ones
        ("index_put", [f("y", (3, 4, 5, 6)), f("v", (3, 2, 3, 6)), i64("c0", (2, 1)), i64("c1", (3,))],
         {"axes": (1, 2), "accumulate": True}, [None, None, np.array([[1], [1]]), np.array([0, 4, 0])]),
        ("index_put", [f("y", (4, 9, 6)), f("v", (3, 2, 6)), i64("r0", (3, 1)), i64("r1", (1, 2))],
         {"axes": (0, 1), "accumulate": False}, [None, None, np.array([[3], [0], [2]]), np.array([[8, -2]])]),
        ("scatter", [f("x", (8, 2)), i64("g", (8, 1)), Constant("zero", TensorType((), dt), np.array(0.0, dt.numpy))],
         {"axis": 1, "reduce": "none", "include_self": True}, [None, rng.integers(0, 2, (8, 1)), np.array(0.0)]),
        ("scatter", [f("x", (8, 2)), i64("g", (8, 1)), f("s", ())],
         {"axis": 1, "reduce": "add", "include_self": True}, [None, rng.integers(0, 2, (8, 1)), None]),
        ("gather", [x3, i64("g", (4, 5, 6))], {"axis": 1}, [None, rng.integers(0, 9, (4, 5, 6))]),
        ("gather", [x3, i64("g", (3, 2, 5))], {"axis": -1}, [None, rng.integers(0, 6, (3, 2, 5))]),
        ("scatter", [x3, i64("g", (4, 5, 6)), f("s", (4, 5, 6))],
         {"axis": 1, "reduce": "add", "include_self": True}, [None, rng.integers(0, 9, (4, 5, 6)), None]),
        ("scatter", [x3, i64("g", (2, 1, 6)), f("s", (3, 2, 6))],
         {"axis": 0, "reduce": "none", "include_self": True},
         [None, np.stack([rng.permutation(4)[:2] for _ in range(6)], 1)[:, None, :], None]),
        # scatter_reduce's reductions the DMA engine applies on write, repeated indices; without
        # include_self the picked places start from the identity, every one before any combining
        # (along axis 0 the index tiles write one box: the order is the program's)
        ("scatter", [x3, i64("g", (4, 5, 6)), f("s", (4, 5, 6))],
         {"axis": 1, "reduce": "amax", "include_self": False}, [None, rng.integers(0, 3, (4, 5, 6)), None]),
        ("scatter", [f("x", (6, 5)), i64("g", (8, 5)), f("s", (8, 5))],
         {"axis": 0, "reduce": "amin", "include_self": True}, [None, rng.integers(0, 3, (8, 5)), None]),
        ("scatter", [f("x", (6, 5)), i64("g", (8, 5)), f("s", (8, 5))],
         {"axis": 0, "reduce": "mul", "include_self": False}, [None, rng.integers(0, 3, (8, 5)), None]),
        ("scatter", [f("x", (6, 5)), i64("g", (8, 5)), f("s", (8, 5))],
         {"axis": 0, "reduce": "add", "include_self": False}, [None, rng.integers(0, 3, (8, 5)), None]),
        # a mean: the sums divided by a count per place scatter-added beside them; places no value
        # reaches (index 3..5) keep their own
        ("scatter", [f("x", (6, 5)), i64("g", (8, 5)), f("s", (8, 5))],
         {"axis": 0, "reduce": "mean", "include_self": False}, [None, rng.integers(0, 3, (8, 5)), None]),
        ("scatter", [x3, i64("g", (4, 5, 6)), f("s", (4, 5, 6))],
         {"axis": 1, "reduce": "mean", "include_self": True}, [None, rng.integers(0, 3, (4, 5, 6)), None]),
        ("permute", [f("p", (1, 5, 3, 7))], {"perm": (0, 2, 1, 3)}, [None]),                  # heads split
        ("permute", [f("p", (2, 5, 3, 7))], {"perm": (0, 3, 1, 2)}, [None]),                  # NHWC -> NCHW
        ("permute", [f("p", (33, 70))], {"perm": (1, 0)}, [None]),
        ("permute", [f("p", (2, 3, 4, 5, 6))], {"perm": (3, 4, 0, 1, 2)}, [None]),
        ("permute", [f("p", (2, 3, 1, 5, 6))], {"perm": (4, 0, 2, 3, 1)}, [None]),
        ("permute", [f("p", (9, 1))], {"perm": (1, 0)}, [None]),                              # a copy
    ]


@pytest.mark.parametrize("dtype", [DType.f32, DType.bf16])
@pytest.mark.parametrize("target", TARGETS)
def test_codegen_parts_equal_the_ir_interpreter_and_simulate(target, dtype):
    for op, ins, attrs, given in _cases(dtype):
        node = _node(op, ins, attrs, dtype)
        data = [g if g is not None else _data(v) for v, g in zip(ins, given)]
        gk = codegen.generate(node, target)
        assert gk.kind in ("gather", "relayout") and "# from blk.op (model.py:7)" in gk.source
        check = codegen.check_kernel(node, gk, data)
        assert check.ok, f"{op} {attrs}\n{check}\n{gk.source}"
        args = gk.arguments(data)
        tr = gk.kernel().trace(*args, target=target)
        res = tr.simulate({p.name: a for p, a in zip(gk.params, args)})
        got = np.asarray(tr.unpack(res.outputs), np.float64).reshape(node.outputs[0].type.shape)
        want = np.asarray(evaluate_node(node, data)[0], np.float64)
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2, err_msg=f"{op} {attrs}\n{gk.source}")


def test_a_scatter_mean_of_integers_is_refused_naming_why():
    # torch floors an integer mean; the vector unit has no floor division
    node = _node("scatter", [_v("x", (6, 5), DType.i32), _v("g", (8, 5), DType.i64), _v("s", (8, 5), DType.i32)],
                 {"axis": 0, "reduce": "mean", "include_self": True}, DType.i32)
    with pytest.raises(codegen.UnsupportedRegionError, match="reduce='mean' of integers"):
        codegen.generate(node, "tiny")


def test_index_tensors_on_axes_that_are_not_adjacent_are_refused_naming_why():
    x = _v("x", (3, 4, 5), DType.f32)
    node = _node("index", [x, _v("i", (2,), DType.i64), _v("j", (2,), DType.i64)], {"axes": (0, 2)}, DType.f32)
    with pytest.raises(codegen.UnsupportedRegionError, match="not adjacent"):
        codegen.generate(node, "tiny")


@fl.kernel
def pairs(x: fl.f32["A", "B", "C"], i: fl.i64["N"], j: fl.i64["N"]):
    O = fl.output(fl.f32["N", "C"])
    fl.store(O, fl.gather(x, (fl.load(i), fl.load(j))))
    return O


def test_two_index_tiles_gather_along_two_axes_each_checked_against_its_own():
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    i, j = np.array([2, -1, 0]), np.array([3, 0, 1])
    np.testing.assert_array_equal(pairs(x, i, j, target="tiny"), x[i, j])
    tr, res = _sim(pairs, x, i, j)
    np.testing.assert_array_equal(tr.unpack(res.outputs), x[i, j])
    with pytest.raises(fl.errors.OutOfBoundsError, match="index value 4"):   # 4 < 3 * 4 rows, but not < 4
        pairs(x, i, np.array([3, 4, 1]))


def test_permute_that_keeps_the_last_axis_has_no_transpose_and_one_that_moves_it_does():
    keep = _node("permute", [_v("x", (2, 8, 4, 16), DType.f32)], {"perm": (0, 2, 1, 3)}, DType.f32)
    move = _node("permute", [_v("x", (2, 8, 4, 16), DType.f32)], {"perm": (0, 3, 1, 2)}, DType.f32)
    assert "fl.transpose" not in codegen.generate(keep, "tiny").source
    assert "fl.transpose" in codegen.generate(move, "tiny").source


def test_tiles_respect_a_small_sram():
    node = _node("permute", [_v("x", (300, 500), DType.f32)], {"perm": (1, 0)}, DType.f32)
    gk = codegen.generate(node, "tiny")
    x = rng.standard_normal((300, 500)).astype(np.float32)
    tr = gk.kernel().trace(x, target="tiny")
    assert max(tr.plan.peak) <= fexplore.npu.get_target("tiny").sram_bytes_per_pe
    assert codegen.check_kernel(node, gk, [x]).ok
    node = _node("embedding", [_v("w", (50, 4000), DType.f32), _v("i", (40,), DType.i64)], {}, DType.f32)
    gk = codegen.generate(node, "tiny")
    assert codegen.check_kernel(node, gk, [rng.standard_normal((50, 4000)).astype(np.float32),
                                           rng.integers(0, 50, 40)]).ok


# ---- compiled models -------------------------------------------------------------------------------------
class Lookup(torch.nn.Module):
    """An embedding, advanced indexing, a head split (permute), a last-axis-moving permute, a
    torch.gather and an index_add."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(23, 12)

    def forward(self, ids, pick, g):
        h = self.emb(ids)                                    # (B, S, 12)
        heads = h.view(h.shape[0], h.shape[1], 3, 4).permute(0, 2, 1, 3)   # (B, 3, S, 4)
        chw = h.permute(0, 2, 1)                             # (B, 12, S)
        rows = h[:, pick]                                    # (B, P, 12)
        gathered = torch.gather(h, 2, g)                     # (B, S, 5)
        acc = h.index_add(1, pick, rows)
        return heads * 2.0, chw + 1.0, rows, gathered, acc


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("batch, seq", [(1, 7), (2, 5)])
def test_compiled_lookups_lower_without_host_ops(target, precision, batch, seq):
    torch.manual_seed(0)
    ids = torch.randint(0, 23, (batch, seq))
    pick = torch.tensor([seq - 1, 0, 2])
    g = torch.randint(0, 12, (batch, seq, 5))
    cm = fexplore.compile(Lookup(), (ids, pick, g), target=target, precision=precision)
    rec = cm["lower"]
    host = {x.op for x in cm.lowering.host_ops}
    assert not host & {"embedding", "index", "permute", "gather", "index_put", "scatter"}, \
        [(x.op, x.reason) for x in cm.lowering.host_ops]
    assert rec.verification.ok and rec.verification.kernels.ok, rec.verification.kernels
    assert cm["schedule"].verification.ok       # the kernels linked into one program, simulated
    assert any(k.kind == "gather" for k in cm.kernels) and any(k.kind == "relayout" for k in cm.kernels)


class MessagePassing(torch.nn.Module):
    """A graph network's aggregations over the edges into each node: max, min, product, sum and
    mean of the messages (torch.scatter_reduce, with and without the node's own state)."""

    def __init__(self):
        super().__init__()
        self.msg = torch.nn.Linear(6, 6)

    def forward(self, nodes, src, dst):
        m = self.msg(nodes[src])                                  # (E, 6) one message per edge
        at = dst[:, None].expand(-1, 6)
        peak = nodes.scatter_reduce(0, at, m, "amax", include_self=False)
        low = nodes.scatter_reduce(0, at, m, "amin")
        prod = torch.ones_like(nodes).scatter_reduce(0, at, torch.tanh(m), "prod", include_self=False)
        total = nodes.scatter_reduce(0, at, m, "sum", include_self=False)
        average = nodes.scatter_reduce(0, at, m, "mean", include_self=False)
        return peak, low, prod, total, average


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("target", TARGETS)
def test_scatter_reductions_of_a_graph_network_run_on_the_chip(target, precision):
    torch.manual_seed(0)
    model = MessagePassing().eval()
    nodes = torch.randn(9, 6)
    src, dst = torch.randint(0, 9, (20,)), torch.randint(0, 7, (20,))   # nodes 7 and 8 get none
    cm = fexplore.compile(model, (nodes, src, dst), target=target, precision=precision)
    assert not cm.lowering.host_ops, [(x.op, x.reason) for x in cm.lowering.host_ops]
    assert sum("element scatter" in k.kernel.parts for k in cm.kernels) == 5
    assert cm["schedule"].verification.ok   # every stage was checked against eager, this one too
    with torch.no_grad():
        want = model(nodes, src, dst)
    for g, w in zip(cm(nodes, src, dst), want):
        torch.testing.assert_close(g, w, rtol=2e-2 if precision == "bf16" else 1e-5,
                                   atol=2e-2 if precision == "bf16" else 1e-5)


class LongIndexRows(torch.nn.Module):
    """torch.gather and scatter_reduce along the middle axis with index rows of 12 x 300 elements:
    on tiny one row does not fit a quarter of a PE's SRAM (BigBird's block-sparse attention
    gathers such rows), nor does a row of x the mean copies first (with its count), so that
    kernel cuts both along their last axis too; the other scatters start their output as x
    (`fl.output(init=)`), a copy in blocks that fit."""

    def forward(self, x, idx, src):
        picked = torch.gather(x, 1, idx)
        total = x.scatter_reduce(1, idx, src, "sum")
        peak = x.scatter_reduce(1, idx, src, "amax", include_self=False)
        average = x.scatter_reduce(1, idx, src, "mean")
        return picked * 2.0, total, peak, average


def test_gathers_and_scatters_with_index_rows_longer_than_sram_are_cut_along_the_row():
    torch.manual_seed(0)
    x, idx = torch.randn(2, 14, 300), torch.randint(0, 14, (2, 12, 300))
    src = torch.randn(2, 12, 300)
    cm = fexplore.compile(LongIndexRows(), (x, idx, src), target="tiny")
    assert not cm.lowering.host_ops, [(h.op, h.reason) for h in cm.lowering.host_ops]
    cut = [k for k in cm.kernels if k.kind == "gather"]
    assert len(cut) == 4 and all("for cs in fl.range(" in k.source for k in cut)
    assert sum("for ccs in fl.range(" in k.source for k in cut) == 1   # the mean's copy of x, cut too
    assert sum("init=x" in k.source for k in cut) == 2
    assert cm["schedule"].verification.ok
    for g, w in zip(cm(x, idx, src), LongIndexRows()(x, idx, src)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
