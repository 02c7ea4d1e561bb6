"""How much a one-ulp difference in rounding moves each output: the f32 model run again with every
computed value moved by one ulp, up or down at random.

The oracle's f64 twin measures eager's own rounding error, and a stage may differ from eager by a
multiple of it. Where eager's rounding happens to be exact, that bound collapses to the dtype's
fixed tolerance although the output is still sensitive to rounding. Fuzz seed 2020216: the column
means of ``eye(4) + x`` are equal in exact arithmetic and, by the order its kernel sums in, in
eager too, so a LayerNorm over them gives its bias and eager's error is 0; the interpreter sums
in another order, the means differ by an ulp, and the norm's 1/sqrt(eps) turns that into 1.4e-5,
past f32's 1e-5. A correct compile failed.

Rerunning the model with each op's result re-rounded (one ulp of random sign, what two correct
implementations of one op may differ by) measures that sensitivity whatever eager's own rounding
happened to be. ``rerounding_distance`` returns per output max |re-rounded run - eager|. The
oracle counts a quarter of it as noise (``numeric.REROUNDED_SHARE``): one ulp of random sign is
about 3.5 times the spread of round-to-nearest (uniform within half an ulp either way).

Ops whose result is exact in any correct implementation are left alone: data movement, creation,
comparisons and selections (min, max, sort, top-k, where). So are values that are 0 or not finite,
so signs and zeros, and with them masks and ReLU's zeros, stay as eager has them. A distance over
``DECISION_SHARE`` of the output's scale is not rounding: a one-ulp move flipped a decision (a tie
in a top-k whose index picks values elsewhere, a comparison, a floor), which any compile makes the
way eager does unless it is wrong. Then the estimate is not used.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .eager_modes import eager_under, output_tensors, runs_higher_order_ops

# A re-rounded distance above this share of max(1, max|output|) is a flipped decision (see the module).
DECISION_SHARE = 1e-3

# Ops (by name, any overload) whose float result every correct implementation gives exactly.
EXACT_OPS = frozenset({
    # data movement
    "clone", "_to_copy", "copy", "cat", "stack", "index", "index_select", "gather",
    "take", "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter", "index_put",
    "masked_scatter", "constant_pad_nd", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
    "replication_pad1d", "replication_pad2d", "replication_pad3d", "repeat", "repeat_interleave",
    "roll", "flip", "rot90", "tril", "triu", "embedding", "lift_fresh_copy", "_unsafe_view",
    "view_copy", "expand_copy", "permute_copy", "unfold_copy", "alias_copy", "pixel_shuffle",
    "pixel_unshuffle", "channel_shuffle",
    # creation
    "zeros", "ones", "full", "empty", "empty_strided", "empty_permuted", "eye", "arange",
    "scalar_tensor", "zeros_like", "ones_like", "full_like", "empty_like", "new_zeros", "new_ones",
    "new_full", "new_empty", "new_empty_strided", "fill",
    # comparisons and selections
    "relu", "abs", "neg", "where", "minimum", "maximum", "fmin", "fmax", "clamp", "clamp_min",
    "clamp_max", "hardtanh", "threshold", "sign", "sgn", "floor", "ceil", "round", "trunc",
    "masked_fill", "max", "min", "amax", "amin", "sort", "topk", "kthvalue", "median", "nanmedian",
    "mode", "cummax", "cummin", "max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices",
    "max_pool3d_with_indices", "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d",
    "nan_to_num", "copysign",
})


@runs_higher_order_ops
class _ReRounded(TorchDispatchMode):
    """Moves each f32 value an op computes by one ulp, up or down at random (``generator``);
    exact ops (``EXACT_OPS``), ops that write or return a view of their input, and values that
    are 0 or not finite run as they are."""

    def __init__(self, generator: torch.Generator):
        super().__init__()
        self.generator = generator

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        schema = func._schema
        if schema.is_mutable or any(r.alias_info is not None for r in schema.returns) \
                or (func.overloadpacket.__name__ in EXACT_OPS and not _accumulates(func, args, kwargs)):
            return out
        return pytree.tree_map(self._moved, out)

    def _moved(self, t):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() == 0:
            return t
        return one_ulp_off(t, self.generator)


# The bit patterns of the floats `one_ulp_off` steps (torch.nextafter has no float8)
_BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
         torch.float8_e4m3fn: torch.int8}


def one_ulp_off(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """`t` with each nonzero finite value moved one ulp of its dtype up or down at random
    (`generator`), where the move stays finite: a step of the bit pattern, which is sign and
    magnitude, so a step away from zero adds one to it."""
    up = torch.rand(t.shape, generator=generator) < 0.5
    wide = t.float()
    bits = t.view(_BITS[t.dtype])
    step = torch.where(up == (wide > 0), 1, -1).to(bits.dtype)
    moved = (bits + step).view(t.dtype)
    keep = (wide == 0) | ~torch.isfinite(wide) | ~torch.isfinite(moved.float())
    return torch.where(keep, t, moved)


def _accumulates(func, args, kwargs) -> bool:
    """index_put with accumulate=True adds (and rounds) where it writes."""
    if func.overloadpacket.__name__ != "index_put":
        return False
    return bool(args[3] if len(args) > 3 else (kwargs or {}).get("accumulate", False))


def rerounding_distance(model, leaves: list, spec, outs: list[torch.Tensor], seed: int) -> list[float] | None:
    """Per output, max |the model re-rounded (``_ReRounded``) - eager's ``outs``| on the flat
    inputs `leaves` (0 for outputs of no f32, and where a decision flipped: see the module);
    None when the re-rounded run raises or gives other outputs. The run gets its own copy of the
    inputs: a decode step appends to the cache it is given."""
    args = pytree.tree_unflatten([x.clone() if isinstance(x, torch.Tensor) else x for x in leaves], spec)
    try:
        with torch.no_grad(), eager_under(_ReRounded(torch.Generator().manual_seed(seed))):
            again = model(*args)
    except Exception:  # noqa: BLE001 - a model that breaks under the mode: no estimate
        return None
    got = output_tensors(again)
    if len(got) != len(outs) or any(a.shape != b.shape for a, b in zip(got, outs)):
        return None
    from .numeric import _max_diffs   # numeric imports this module: its distance, not a second one

    eager = [o.detach() for o in outs]
    return [d if o.dtype == torch.float32 and d <= DECISION_SHARE * output_scale(o) else 0.0
            for d, o in zip(_max_diffs(eager, got), eager)]


def output_scale(t: torch.Tensor) -> float:
    """max(1, max |t|) over its finite values: what a decision's distance is judged against."""
    finite = t[torch.isfinite(t)]
    return max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
