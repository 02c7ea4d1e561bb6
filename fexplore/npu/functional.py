"""Functional mode: run the commands with numpy so the simulated chip computes real numbers.

DRAM is a dict of named numpy arrays: inputs copied in (never the caller's arrays), outputs and
scratch filled with NaN; a view shares its storage's array. Each SRAM buffer is a fresh array
filled with NaN at its first use, so a read of memory nothing wrote shows up as NaN in the result
rather than as plausible garbage, and is dropped after its last.
Contractions widen to f32 (i32 for integer modes) and accumulate there, as the tensor unit does;
vector ops compute in f32 (see `vector_ops`); every write casts to the destination's dtype.
"""

from __future__ import annotations

import numpy as np

from fexplore.errors import InputError
from fexplore.npu import dtypes
from fexplore.npu.commands import (Buffer, BufferView, Contract, Gather, Host, Load, Scatter, Stage, Store,
                                    Transpose, Vector)
from fexplore.npu.errors import IndexOutOfRangeError
from fexplore.npu.program import Program
from fexplore.npu.vector_ops import apply


def _fresh(shape, dtype_name: str) -> np.ndarray:
    dt = dtypes.numpy_dtype(dtype_name)
    if dtypes.is_float(dtype_name):
        return np.full(shape, np.nan, dtype=dt)
    if dtype_name == "bool":
        return np.zeros(shape, dtype=dt)
    return np.full(shape, np.iinfo(dt).min, dtype=dt)  # ints have no NaN: a loud sentinel


def prepare_dram(program: Program, inputs: dict) -> dict[str, np.ndarray]:
    expected = program.inputs
    unknown = sorted(set(inputs) - set(program.tensors))
    missing = sorted(set(expected) - set(inputs))
    if unknown or missing:
        raise InputError(f"program {program.name!r}: "
                         + (f"missing inputs {missing}" if missing else "")
                         + ("; " if missing and unknown else "")
                         + (f"unknown inputs {unknown}" if unknown else ""),
                         hint=f"inputs are {sorted(expected)}")
    dram = {}
    written = _written_storages(program)
    for name, t in program.tensors.items():
        if t.kind == "view":
            continue
        if name in inputs:
            arr = np.asarray(inputs[name])
            if tuple(arr.shape) != t.shape:
                raise InputError(f"input {name!r}: expected shape {t.shape}, got {tuple(arr.shape)}")
            want = dtypes.numpy_dtype(t.dtype)
            if name in written or arr.dtype != want:
                # in row-major order, as DRAM holds it: a copy of a transposed array keeps its
                # strides, and a reshaped view of it (a free view the program writes through, as
                # an update written into its table's storage does) would be a copy the writes miss
                dram[name] = arr.astype(want, order="C", copy=True)
            else:
                # only read (the weights): the caller's array itself, read-only, not a copy of
                # every weight per call; a command that wrote it would raise, not change the model
                dram[name] = arr.view()
                dram[name].flags.writeable = False
        else:
            dram[name] = _fresh(t.shape, t.dtype)
    for name, t in program.tensors.items():  # a view shares its storage's array
        if t.kind == "view":
            dram[name] = t.of_storage(dram[t.storage])
    return dram


def _written_storages(program: Program) -> set[str]:
    """The DRAM storages some command writes (stores, scatters, host ops' results)."""
    out = set()
    for c in program.commands:
        if isinstance(c, Host):
            out.update(r.tensor.storage for r in c.dst)
        elif isinstance(c, (Store, Scatter)):
            out.add(c.dst.tensor.storage)
    return out


def execute(program: Program, inputs: dict, order) -> dict[str, np.ndarray]:
    """Run the commands in `order` (command ids; syncs may be left out) and return the DRAM."""
    dram = prepare_dram(program, inputs)
    sram: dict[int, np.ndarray] = {}
    for t in program.tensors.values():   # a resident tensor's SRAM is its array: views read it in place
        if t.backing is not None and t.kind != "view":
            sram[t.backing.id] = dram[t.name]

    def buf(b):
        if isinstance(b, BufferView):   # a numpy view of its buffer's array: read in place
            return buf(b.base)[b.index]
        arr = sram.get(b.id)
        if arr is None:
            arr = sram[b.id] = _fresh(b.shape, b.dtype)
        return arr

    commands = program.commands
    # a buffer's array is dropped after the last command that touches it (a resident tensor's is
    # its DRAM array, kept): the run holds the SRAM alive at a point, not every buffer it used
    last = {b.id: pos for pos, cid in enumerate(order) for b in (*commands[cid].reads, *commands[cid].writes)}
    resident = set(sram)
    for pos, cid in enumerate(order):
        c = commands[cid]
        if isinstance(c, Stage):   # into the resident tensor (its SRAM, seen as its array here)
            dram[c.into.tensor.name][c.into.slices] = dram[c.src.tensor.name][c.src.slices]
        elif isinstance(c, Load):
            buf(c.dst)[...] = dram[c.src.tensor.name][c.src.slices].reshape(c.dst.shape)
        elif isinstance(c, Store):
            dram[c.dst.tensor.name][c.dst.slices] = buf(c.src).reshape(c.dst.shape)
        elif isinstance(c, Contract):
            acc_t = np.float32 if dtypes.is_float(c.dtype) else np.int32
            res = np.einsum(c.spec, buf(c.a).astype(acc_t), buf(c.b).astype(acc_t))
            out = buf(c.out)
            if c.accumulate:
                res = out.astype(acc_t) + res
            out[...] = res
        elif isinstance(c, Gather):
            buf(c.dst)[...] = gather_rows(dram[c.src.tensor.name][c.src.slices], tuple(buf(i) for i in c.index), c.axis, c.mode,
                                          what=c.name, loc=c.loc).reshape(c.dst.shape)
        elif isinstance(c, Scatter):
            scatter_rows(dram[c.dst.tensor.name][c.dst.slices], tuple(buf(i) for i in c.index), buf(c.src), c.axis, c.mode,
                         c.reduce, what=c.name, loc=c.loc)
        elif isinstance(c, Transpose):
            buf(c.out)[...] = np.transpose(buf(c.src), c.perm)
        elif isinstance(c, Vector):
            args = [buf(x) if isinstance(x, Buffer) else x for x in c.operands]
            res = apply(c.op, args, c.axis, c.keepdims)
            out = buf(c.out)
            with np.errstate(invalid="ignore"):   # -inf or NaN into an int tile: torch's cast gives junk too
                out[...] = res if out.dtype != np.bool_ else (res != 0)
        elif isinstance(c, Host):
            got = c.fn(*[dram[r.tensor.name][r.slices].reshape(r.shape) for r in c.src])
            for r, y in zip(c.dst, got):
                dram[r.tensor.name][r.slices] = np.asarray(y).reshape(r.shape)
        for b in (*c.reads, *c.writes):
            if last[b.id] == pos and b.id not in resident:
                sram.pop(b.id, None)
    return dram


# ---- indexed DMA: one meaning, shared with the kernel-language interpreter ----------------------------
def checked_index(index: np.ndarray, n: int, what, loc=None) -> np.ndarray:
    """Index values as int64 in [0, n): negative ones count from the end; anything outside [-n, n)
    raises `IndexOutOfRangeError` (`what` names the command or op, for the message)."""
    idx = np.asarray(index).astype(np.int64)
    bad = (idx < -n) | (idx >= n)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise IndexOutOfRangeError(
            f"{what}: index value {int(idx[first])} at position {list(first)} is outside [-{n}, {n})",
            loc=loc, hint="indices pick rows of the DRAM box; check the index data (torch raises here too)")
    return np.where(idx < 0, idx + n, idx)


def _key(box: np.ndarray, indices, axis: int, what, loc) -> tuple:
    """The numpy index of the rows `indices` (a tuple, one per dim from `axis` on) pick."""
    idxs = tuple(checked_index(ix, box.shape[axis + j], what, loc) for j, ix in enumerate(indices))
    return (slice(None),) * axis + idxs


def gather_rows(box: np.ndarray, indices, axis: int, mode: str, *, what, loc=None) -> np.ndarray:
    indices = tuple(indices) if isinstance(indices, (tuple, list)) else (indices,)
    if mode == "rows":
        return box[_key(box, indices, axis, what, loc)]
    idx = checked_index(indices[0], box.shape[axis], what, loc)
    box = box[tuple(slice(None) if d == axis else slice(0, k) for d, k in enumerate(idx.shape))]
    return np.take_along_axis(box, idx, axis=axis)


def scatter_rows(box: np.ndarray, indices, src: np.ndarray, axis: int, mode: str, reduce, *, what,
                 loc=None) -> None:
    """Write `src` into `box` (a view of DRAM) in place. reduce=None: of duplicate indices the last
    write wins (the DMA writes in index order); "add" and "mul" accumulate, in f32 for float data
    (int64 for integers), rounded once to the tensor's dtype; "max" and "min" keep the larger
    (smaller) value, exactly in any dtype (a NaN wins, as torch's amax)."""
    indices = tuple(indices) if isinstance(indices, (tuple, list)) else (indices,)
    k = len(indices)
    if mode == "rows":
        key = _key(box, indices, axis, what, loc)
        shape = np.shape(indices[0])
        src = np.asarray(src).reshape(box.shape[:axis] + shape + box.shape[axis + k:])
    else:
        idx = checked_index(indices[0], box.shape[axis], what, loc)
        grids = list(np.indices(idx.shape, sparse=True))
        grids[axis] = idx
        key = tuple(grids)
        src = np.asarray(src).reshape(idx.shape)
    if reduce is None:
        if mode == "rows":   # numpy's fancy assignment is last-wins only in practice: make it explicit
            flat = [i.reshape(-1) for i in key[axis:]]
            lin = np.ravel_multi_index(flat, box.shape[axis:axis + k])
            order = np.arange(lin.size)
            last = np.full(int(np.prod(box.shape[axis:axis + k])), -1, dtype=np.int64)
            np.maximum.at(last, lin, order)
            keep = last[lin] == order
            s = np.moveaxis(src.reshape(box.shape[:axis] + (lin.size,) + box.shape[axis + k:]), axis, 0)
            np.moveaxis(box, tuple(range(axis, axis + k)), tuple(range(k)))[tuple(f[keep] for f in flat)] = s[keep]
        else:
            box[key] = src
        return
    if reduce in ("max", "min"):
        (np.maximum if reduce == "max" else np.minimum).at(box, key, src.astype(box.dtype))
        return
    acc_t = np.float32 if dtypes.is_float(dtypes.dtype_name(box.dtype)) else np.int64
    acc = box.astype(acc_t)
    (np.multiply if reduce == "mul" else np.add).at(acc, key, src.astype(acc_t))
    box[...] = acc
