"""What the score ops of an attention region cost less as: a scalar scale of the scores folded
into q once per query block, and a constant causal mask turned into the kernel's causal block
structure (key blocks above the diagonal skipped, the mask applied on diagonal blocks only).

On the chip the vector unit bounds attention, and each score op is a pass over every block of
scores; a scale folded into q is a pass over a (bq, D) tile once instead (where that is exact; else
the kernel puts it in the exponent, see ``attention._place_scale``), and a constant mask that
is the causal triangle is a load and a pass per block that the causal structure does not need.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from fexplore.ir import Constant, DType, Node

# an additive mask entry at or below this masks its key: exp of the shifted score underflows to 0
# in f32 for any score a model can make (HF masks with the dtype's lowest finite value)
MASKED_BELOW = -1e30


def fold_scale(score_ops: list[Node], score_names: set[str], constant) -> tuple[float | None, list[Node]]:
    """The scalar the first score op multiplies the raw scores by (``s * c``, ``c * s``, ``s / c``)
    and the score ops left without it; (None, score_ops) when it is not such an op. `score_names`
    gets the folded op's output, which is then the raw scores scaled. `constant(value)` is the
    payload of a region input that is a constant, else None."""
    if not score_ops:
        return None, score_ops
    first = score_ops[0]
    if first.op.name not in ("mul", "div") or len(first.inputs) != 2:
        return None, score_ops
    a, b = first.inputs
    if first.op.name == "mul" and b.name in score_names:
        a, b = b, a
    if a.name not in score_names:
        return None, score_ops
    c = _scalar(constant(b))
    if c is None or c == 0.0 or not np.isfinite(c):
        return None, score_ops
    score_names.add(first.outputs[0].name)
    return (c if first.op.name == "mul" else 1.0 / c), score_ops[1:]


def causal_mask_op(score_ops: list[Node], score_names: set[str], constant, S: int, T: int):
    """(mask, how) when the last score op masks the scores with a constant that is the causal
    triangle (key j kept for query i iff j <= i), else None: ``where(keep, s, -inf)`` (how
    "keep"), ``where(drop, -inf, s)`` ("drop") or ``s + mask`` ("additive"). Only the last op: an
    op after the mask could map a masked -inf to something else."""
    if not score_ops:
        return None
    last = score_ops[-1]
    ins = last.inputs
    scores = score_names | _chain(score_ops)
    if last.op.name == "where" and len(ins) == 3:
        cond, a, b = (constant(x) for x in ins)
        if cond is None:
            return None
        if ins[1].name in scores and _masks(b) and is_causal(np.asarray(cond) != 0, S, T):
            return ins[0], "keep"
        if ins[2].name in scores and _masks(a) and is_causal(np.asarray(cond) == 0, S, T):
            return ins[0], "drop"
        return None
    if last.op.name == "add" and len(ins) == 2:
        for x, m in ((ins[0], ins[1]), (ins[1], ins[0])):
            if x.name in scores and is_causal_additive(constant(m), S, T):
                return m, "additive"
    return None


def mask_how(mask) -> str:
    """How an SDPA mask (a constant payload) masks: a bool one keeps True, a float one is added."""
    return "keep" if np.asarray(mask).dtype == np.bool_ else "additive"


def is_causal_constant(mask, S: int, T: int) -> bool:
    """A mask as SDPA takes it (a bool one keeps True, a float one is added) that is the causal
    triangle; False for None (not a constant)."""
    keep = _kept(mask)
    return keep is not None and is_causal(keep, S, T)


def is_causal_additive(mask, S: int, T: int) -> bool:
    """An additive mask of 0 where a key is kept and -inf (or a huge negative) where it is not,
    in the causal triangle."""
    return mask is not None and _is_float(np.asarray(mask)) and is_causal_constant(mask, S, T)


def _kept(mask):
    """Which keys a constant mask as SDPA takes it keeps (a bool one keeps True; a float one
    of 0 and -inf, or a huge negative, is added), or None: not a constant, or a float mask that
    adds anything else."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.dtype == np.bool_:
        return mask
    if not _is_float(mask):
        return None
    kept, dropped = mask.astype(np.float64) == 0, _masked(mask)
    return kept if bool((kept | dropped).all()) else None


def is_causal(keep, S: int, T: int) -> bool:
    """`keep` (..., S, T), every leading slice the causal triangle: key j kept for query i iff
    j <= i (torch's ``is_causal``, aligned at the top left)."""
    keep = np.asarray(keep)
    if keep.ndim < 2 or tuple(keep.shape[-2:]) != (S, T):
        return False
    return bool((keep.reshape(-1, S, T) == np.tri(S, T, dtype=bool)).all())


def band_width(mask, S: int, T: int) -> int | None:
    """W when a constant mask (a bool one keeps True, a float one is added) keeps, in every
    leading slice, key j for query i iff 0 <= i - j < W with W < S: a sliding window of W keys
    ending at the query's own; else None. (W >= S is the causal triangle: `is_causal_constant`.)"""
    keep = _kept(mask)
    if keep is None or keep.ndim < 2 or tuple(keep.shape[-2:]) != (S, T):
        return None
    first = keep.reshape(-1, S, T)[0]
    w = int(first[-1].sum()) if S else 0   # the last query keeps the whole window
    if not 0 < w < S:
        return None
    i, j = np.arange(S)[:, None], np.arange(T)[None, :]
    band = (i - j >= 0) & (i - j < w)
    return w if bool((keep.reshape(-1, S, T) == band).all()) else None


def constant_payload(node: Node, index: dict[str, int]):
    """`constant(value)` for a region `node`: the payload of the region input a body input stands
    for when it is a constant, else None."""
    def constant(v):
        i = index.get(v.name)
        outer = node.inputs[i] if i is not None else None
        return outer.payload if isinstance(outer, Constant) and outer.payload is not None else None
    return constant


def _masks(payload) -> bool:
    v = _scalar(payload)
    return v is not None and bool(_masked(np.asarray(payload)).all())


def _masked(values: np.ndarray) -> np.ndarray:
    """Where an additive mask drops its key: at or below MASKED_BELOW, or at the dtype's lowest
    finite value (an f16 model masks with -65504; exp of it underflows in f32 all the same)."""
    values = np.asarray(values)
    floor = MASKED_BELOW
    if _is_float(values):
        floor = max(floor, float(ml_dtypes.finfo(values.dtype).min))
    return values.astype(np.float64) <= floor


def _is_float(values: np.ndarray) -> bool:
    """A float array, bf16 and fp8 (ml_dtypes, numpy kind 'V') included."""
    try:
        return DType.from_numpy(values.dtype).is_float
    except TypeError:   # no IR dtype (complex)
        return False


def _scalar(payload) -> float | None:
    if payload is None:
        return None
    arr = np.asarray(payload)
    if arr.size != 1 or not (arr.dtype.kind in "iu" or _is_float(arr)):
        return None
    v = float(arr.astype(np.float64).reshape(()))
    return v if not np.isnan(v) else None


def _chain(score_ops: list[Node]) -> set[str]:
    """The values the score ops make (the input of the last one, among them)."""
    return {o.name for n in score_ops[:-1] for o in n.outputs}
