"""Running a user's model in eager: what its outputs are to the checks (``output_tensors``), and
running it under one of fexplore's dispatch modes (the f64 twin's exact narrow ops, the precision
policy's rounding) when the model uses ``torch.cond`` or ``flex_attention``.

In eager, ``torch.cond`` and ``flex_attention`` compile themselves with dynamo and dispatch a
higher-order op. Under a Python dispatch mode that has no rule for the op, it raises; worse, the
failed compile leaves dynamo's cache so that the user's own later eager calls of the model (and
torch.export of it) fail too. So a mode used here gets a rule for each (cond runs the branch its
predicate picks, flex_attention torch's dense reference, with the mode on, which sees their
ops), and while the mode is on, they call the op directly instead of through dynamo, and whatever
the model compiles itself runs eagerly.
"""

from __future__ import annotations

import contextlib

import torch
import torch.utils._pytree as pytree


def runs_higher_order_ops(mode_cls):
    """Class decorator for a TorchDispatchMode: ``cond`` under it runs the branch its predicate
    picks, and ``flex_attention`` torch's dense reference, with the mode on."""
    cond = getattr(torch.ops.higher_order, "cond", None)
    if cond is not None:
        @cond.py_impl(mode_cls)
        def _cond(mode, pred, true_fn, false_fn, operands):
            with mode:
                return (true_fn if bool(pred) else false_fn)(*operands)
    try:
        from torch._higher_order_ops.flex_attention import flex_attention, sdpa_dense
    except ImportError:  # pragma: no cover - a torch without flex_attention
        return mode_cls

    @flex_attention.py_impl(mode_cls)
    def _flex_attention(mode, *args):
        with mode:
            return sdpa_dense(*args)
    return mode_cls


def eager_only():
    """A context in which what the model compiles itself (Hugging Face torch.compiles
    flex_attention) runs eagerly: eager is the reference, and a compile would trace under our
    modes with dynamo too, or meet a bug of torch's code generator on this machine."""
    stance = getattr(torch.compiler, "set_stance", None)
    return stance("force_eager") if stance is not None else contextlib.nullcontext()


@contextlib.contextmanager
def eager_under(mode):
    """``with mode:``, with ``torch.cond`` and ``flex_attention`` kept out of dynamo: compiled
    functions (flex_attention's own, the model's) run eagerly, and cond calls itself directly
    (where this torch has the hooks; elsewhere the mode's rules alone apply)."""
    try:
        import torch._higher_order_ops.utils as hop_utils
    except ImportError:  # pragma: no cover - torch without higher-order ops
        hop_utils = None
    compile_and_call = getattr(hop_utils, "_hop_compile_and_call", None)
    if compile_and_call is not None:
        hop_utils._hop_compile_and_call = lambda fn, args, kwargs=None: fn(*args, **(kwargs or {}))
    try:
        with eager_only(), mode:
            yield mode
    finally:
        if compile_and_call is not None:
            hop_utils._hop_compile_and_call = compile_and_call


def output_tensors(out) -> list[torch.Tensor]:
    """A model's outputs as the compiled graph has them: its tensors, and each number it returns
    (a size, ``x.shape[1] + 1``, or a constant) as a 0-d tensor, in pytree order."""
    return [o if isinstance(o, torch.Tensor) else torch.tensor(o) for o in pytree.tree_leaves(out)
            if isinstance(o, (torch.Tensor, bool, int, float))]
