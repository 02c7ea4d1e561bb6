"""Verification of lowering: a generated kernel, run by the kernel-language interpreter, equals
its node run by the IR interpreter (`fexplore.ir.evaluate_node`) on the same inputs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fexplore.ir import Node, evaluate_node

# |got - want| <= atol * max(1, max|want|) + rtol * |want|, by the dtype of the output. The vector
# unit computes in f32 where the IR interpreter computes transcendentals and sums in f64, and the
# kernel sums K in slabs: a few f32 ulps per op, summed over a region's ops.
TOLERANCE = {"f32": (1e-5, 1e-5), "f16": (2e-3, 2e-3), "bf16": (1.6e-2, 1.6e-2), "fp8": (1.25e-1, 1.25e-1)}


@dataclass
class KernelCheck:
    name: str
    ok: bool
    max_abs_error: float
    limit_exceeded_by: float      # the worst |got - want| / allowed (<= 1 when ok)
    outputs: int

    def __repr__(self) -> str:
        return (f"<KernelCheck {self.name}: {'ok' if self.ok else 'MISMATCH'}, max abs error "
                f"{self.max_abs_error:.2g} ({self.limit_exceeded_by:.2f} of the tolerance)>")


def check_kernel(node: Node, generated, inputs, kernel=None) -> KernelCheck:
    """Run `generated` (a GeneratedKernel for `node`) in the kernel-language interpreter and
    `node` in the IR interpreter on `inputs` (the node's inputs, numpy); compare every output."""
    arrays = [np.asarray(x) for x in inputs]
    want = evaluate_node(node, arrays)
    computes_in = _narrowest_float(node)
    got = generated.run(arrays, kernel)
    ok, worst, ratio = True, 0.0, 0.0
    for g, wv, v in zip(got, want, node.outputs):
        if g is None or np.shape(g) != np.shape(wv):
            return KernelCheck(generated.name, False, float("inf"), float("inf"), len(want))
        if v.type.dtype.name == "bool" or not v.type.dtype.is_float:
            same = np.array_equal(np.asarray(g, np.float64), np.asarray(wv, np.float64))
            ok &= bool(same)
            worst = max(worst, 0.0 if same else float("inf"))
            ratio = max(ratio, 0.0 if same else float("inf"))
            continue
        # by the dtype the region computes in: an f32 result of bf16 operands is as good as bf16
        atol, rtol = max(TOLERANCE.get(v.type.dtype.name, TOLERANCE["f32"]), TOLERANCE[computes_in])
        g64, w64 = np.asarray(g, np.float64), np.asarray(wv, np.float64)
        finite = np.isfinite(w64)
        if not np.array_equal(np.isfinite(g64), finite) or \
                not np.array_equal(g64[~finite], w64[~finite], equal_nan=True):   # NaN where NaN is due
            return KernelCheck(generated.name, False, float("inf"), float("inf"), len(want))
        if not finite.any():
            continue
        diff = np.abs(g64 - w64)[finite]
        scale = max(1.0, float(np.abs(w64[finite]).max()))
        limit = atol * scale + rtol * np.abs(w64[finite])
        worst = max(worst, float(diff.max()))
        ratio = max(ratio, float((diff / limit).max()))
        ok &= bool((diff <= limit).all())
    return KernelCheck(generated.name, bool(ok), worst, ratio, len(want))


def _narrowest_float(node: Node) -> str:
    """The least precise float dtype among the values the node (its body, for a region) computes."""
    values = list(node.inputs) + list(node.outputs)
    for r in node.regions:
        values += [v for n in r.walk() for v in list(n.inputs) + list(n.outputs)]
    order = ["f32", "f16", "bf16", "fp8"]
    seen = {v.type.dtype.name for v in values if v.type.dtype.name in order}
    return max(seen, key=order.index, default="f32")
