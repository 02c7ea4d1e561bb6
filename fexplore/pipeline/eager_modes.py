"""Running a user's model in eager: what its outputs are to the checks (``output_tensors``), and
running it under one of fexplore's dispatch modes (the f64 twin's exact narrow ops, the precision
policy's rounding) when the model uses ``torch.cond``.

In eager, ``torch.cond`` compiles itself with dynamo and dispatches the ``cond`` higher-order op.
Under a Python dispatch mode that has no rule for the op, it raises; worse, the failed compile
leaves dynamo's cache so that the user's own later eager calls of the model fail too. So a mode
used here gets a rule (the branch the predicate picks runs under the mode, which sees its ops),
and while the mode is on, ``cond`` calls itself directly instead of through dynamo.
"""

from __future__ import annotations

import contextlib

import torch
import torch.utils._pytree as pytree


def runs_cond_branches(mode_cls):
    """Class decorator for a TorchDispatchMode: ``cond`` under it runs the branch its predicate
    picks, with the mode on."""
    cond = getattr(torch.ops.higher_order, "cond", None)
    if cond is not None:
        @cond.py_impl(mode_cls)
        def _cond(mode, pred, true_fn, false_fn, operands):
            with mode:
                return (true_fn if bool(pred) else false_fn)(*operands)
    return mode_cls


@contextlib.contextmanager
def eager_under(mode):
    """``with mode:``, with ``torch.cond`` kept out of dynamo (where this torch has the hook;
    elsewhere the mode's rule alone applies)."""
    try:
        import torch._higher_order_ops.utils as hop_utils
    except ImportError:  # pragma: no cover - torch without higher-order ops
        hop_utils = None
    compile_and_call = getattr(hop_utils, "_hop_compile_and_call", None)
    if compile_and_call is not None:
        hop_utils._hop_compile_and_call = lambda fn, args, kwargs=None: fn(*args, **(kwargs or {}))
    try:
        with mode:
            yield mode
    finally:
        if compile_and_call is not None:
            hop_utils._hop_compile_and_call = compile_and_call


def output_tensors(out) -> list[torch.Tensor]:
    """A model's outputs as the compiled graph has them: its tensors, and each number it returns
    (a size, ``x.shape[1] + 1``, or a constant) as a 0-d tensor, in pytree order."""
    return [o if isinstance(o, torch.Tensor) else torch.tensor(o) for o in pytree.tree_leaves(out)
            if isinstance(o, (torch.Tensor, bool, int, float))]
