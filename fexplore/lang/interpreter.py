"""The numpy interpreter: the meaning of the kernel IR, one op at a time.

It runs while the kernel is traced (``k(a, b)``), so a breakpoint or a ``print(t.numpy())`` inside
the kernel sees real values. Numerics are the chip's, taken from the NPU's own definitions: a
contraction widens its operands to f32 (i32 for integer modes) and accumulates there, like the
simulator's functional mode; vector ops are `fexplore.npu.vector_ops.apply` (one meaning for both);
every write rounds to the destination's dtype. Fresh tiles and DRAM outputs are NaN-filled (ints:
their minimum), so a read of memory nothing wrote shows up in the result.
"""

from __future__ import annotations

import numpy as np

from fexplore.lang import ir
from fexplore.lang.values import DramTensor, Tile
from fexplore.lang.errors import OutOfBoundsError
from fexplore.npu.errors import IndexOutOfRangeError
from fexplore.npu.functional import _fresh, gather_rows, scatter_rows
from fexplore.npu.vector_ops import VECTOR_OPS, apply


class Interpreter:
    def __init__(self, inputs: dict[str, np.ndarray]):
        self.dram: dict[str, np.ndarray] = dict(inputs)   # already converted copies (see kernel.py)
        self.tiles: dict[int, np.ndarray] = {}

    def _dram(self, t: DramTensor) -> np.ndarray:
        arr = self.dram.get(t.name)
        if arr is None:
            arr = self.dram[t.name] = _fresh(t.shape, t.dtype.name)
        return arr

    def value(self, t: Tile) -> np.ndarray:
        if t.base is not None:   # a slice: a numpy view of its base's value (read, never written)
            return self.value(t.base)[t.index]
        arr = self.tiles.get(t.id)
        if arr is None:
            arr = self.tiles[t.id] = _fresh(t.shape, t.dtype.name)
        return arr

    def _write(self, t: Tile, res) -> None:
        out = self.value(t)
        out[...] = (res != 0) if out.dtype == np.bool_ else res

    def run(self, op: ir.Op) -> None:
        if isinstance(op, ir.Load):
            src = self._dram(op.src.tensor)[op.src.slices]
            self.value(op.dst)[...] = src.reshape(op.dst.shape)
        elif isinstance(op, ir.Store):
            self._dram(op.dst.tensor)[op.dst.slices] = self.value(op.src).reshape(op.dst.sizes)
        elif isinstance(op, ir.Gather):
            box = self._dram(op.src.tensor)[op.src.slices].reshape(op.src.shape)
            res = self._indexed(op, lambda: gather_rows(box, tuple(map(self.value, op.idx)), op.axis, op.mode, what="fl.gather"))
            self.value(op.dst)[...] = res
        elif isinstance(op, ir.Scatter):
            box = self._dram(op.dst.tensor)[op.dst.slices].reshape(op.dst.shape)   # a view: written in place
            self._indexed(op, lambda: scatter_rows(box, tuple(map(self.value, op.idx)), self.value(op.src), op.axis, op.mode,
                                                   op.reduce, what="fl.scatter"))
        elif isinstance(op, ir.Transpose):
            self.value(op.out)[...] = np.transpose(self.value(op.src), op.perm)
        elif isinstance(op, ir.Contract):
            acc_t = np.float32 if op.out.dtype.is_float else np.int32
            res = np.einsum(op.spec, self.value(op.a).astype(acc_t), self.value(op.b).astype(acc_t))
            if op.accumulate:
                res = self.value(op.out).astype(acc_t) + res
            self._write(op.out, res)
        elif isinstance(op, ir.Vector):
            args = [self.value(x) if isinstance(x, Tile) else x for x in op.operands]
            axis = op.axis if op.axis is not None else -1
            self._write(op.out, apply(VECTOR_OPS[op.op], args, axis, op.keepdims))
        elif isinstance(op, ir.Fill):
            self._write(op.out, op.value if isinstance(op.value, int) else np.float32(op.value))
        elif isinstance(op, ir.Broadcast):
            self._write(op.out, np.broadcast_to(self.value(op.src), op.out.shape))
        # Wait: an ordering point for the chip; nothing to compute

    @staticmethod
    def _indexed(op, run):
        """An index value outside the box is the author's data error: FK140 on their line."""
        try:
            return run()
        except IndexOutOfRangeError as e:
            box = op.src if isinstance(op, ir.Gather) else op.dst
            ns = [box.shape[op.axis + j] for j in range(len(op.idx))]
            raise OutOfBoundsError(e.message, expected="index values in " + ", ".join(f"[-{n}, {n})" for n in ns)
                                   + f" along axis {op.axis}{'...' if len(ns) > 1 else ''} of {box}",
                                   given="the values of tile " + ", ".join(repr(t.name) for t in op.idx), loc=op.loc,
                                   hint="torch raises on such an index too: check the indices fed to the kernel"
                                   ) from None

    def outputs(self, trace: ir.KernelTrace) -> dict[str, np.ndarray]:
        return {t.name: self._dram(t) for t in trace.outputs}
