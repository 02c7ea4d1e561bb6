"""Functional mode: run the commands with numpy so the simulated chip computes real numbers.

DRAM is a dict of named numpy arrays: inputs copied in (never the caller's arrays), outputs and
scratch filled with NaN; a view shares its storage's array. Each SRAM buffer is a fresh array filled with NaN at its first use, so a
read of memory nothing wrote shows up as NaN in the result rather than as plausible garbage.
Contractions widen to f32 (i32 for integer modes) and accumulate there, as the tensor unit does;
vector ops compute in f32 (see `vector_ops`); every write casts to the destination's dtype.
"""

from __future__ import annotations

import numpy as np

from fexplore.errors import InputError
from fexplore.npu import dtypes
from fexplore.npu.commands import Buffer, Contract, Host, Load, Store, Vector
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
    for name, t in program.tensors.items():
        if t.kind == "view":
            continue
        if name in inputs:
            arr = np.asarray(inputs[name])
            if tuple(arr.shape) != t.shape:
                raise InputError(f"input {name!r}: expected shape {t.shape}, got {tuple(arr.shape)}")
            dram[name] = arr.astype(dtypes.numpy_dtype(t.dtype), copy=True)
        else:
            dram[name] = _fresh(t.shape, t.dtype)
    for name, t in program.tensors.items():  # a view shares its storage's array
        if t.kind == "view":
            dram[name] = dram[t.storage].reshape(t.shape)
    return dram


def execute(program: Program, inputs: dict, order) -> dict[str, np.ndarray]:
    """Run the commands in `order` (command ids; syncs may be left out) and return the DRAM."""
    dram = prepare_dram(program, inputs)
    sram: dict[int, np.ndarray] = {}

    def buf(b):
        arr = sram.get(b.id)
        if arr is None:
            arr = sram[b.id] = _fresh(b.shape, b.dtype)
        return arr

    commands = program.commands
    for cid in order:
        c = commands[cid]
        if isinstance(c, Load):
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
        elif isinstance(c, Vector):
            args = [buf(x) if isinstance(x, Buffer) else x for x in c.operands]
            res = apply(c.op, args, c.axis, c.keepdims)
            out = buf(c.out)
            out[...] = res if out.dtype != np.bool_ else (res != 0)
        elif isinstance(c, Host):
            got = c.fn(*[dram[r.tensor.name][r.slices].reshape(r.shape) for r in c.src])
            for r, y in zip(c.dst, got):
                dram[r.tensor.name][r.slices] = np.asarray(y).reshape(r.shape)
    return dram
