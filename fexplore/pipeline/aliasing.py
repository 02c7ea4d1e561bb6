"""Outputs that are views of the caller's inputs, made again on the caller's tensors.

Eager returns ``x.reshape(-1)``, ``x.transpose(0, 1)``, ``x[1:]`` or ``x.detach()`` as a view: a new
tensor over the input's memory, so a write through one shows in the other. The compiled program
computes values, not views. Where torch's exported program makes an output from a user input
by view ops alone (ops whose schema says their result aliases their input), the compiled model
replays those ops on the caller's tensor, so the output is the view eager's is. Anything else
(a view of a computed value, a size the replay cannot work out, a view the call's strides do
not allow) keeps the computed values.
"""

from __future__ import annotations

import operator

import torch

# size arithmetic torch.export writes between sym_size and a view's shape argument
_SIZE_OPS = (operator.add, operator.sub, operator.mul, operator.floordiv, operator.neg)


class _NoReplay(Exception):
    pass


def is_view_op(target) -> bool:
    """Whether an exported node's op returns a view of its first input (its schema's first result
    aliases it, and nothing is written)."""
    schema = getattr(target, "_schema", None)
    if schema is None or schema.is_mutable or not schema.returns or not schema.arguments:
        return False
    out, first = schema.returns[0].alias_info, schema.arguments[0].alias_info
    return out is not None and first is not None and not out.is_write and out.before_set == first.before_set


def view_of_input(nodes: dict[str, torch.fx.Node], name: str, given: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """Output `name` of an exported graph (`nodes`: its nodes by name) made again on the caller's
    tensors (`given`, by placeholder name), when it is a chain of view ops on one of them; else
    None."""
    node, chain = nodes.get(name), []
    while node is not None and node.op == "call_function" and is_view_op(node.target) and node.args:
        chain.append(node)
        node = node.args[0] if isinstance(node.args[0], torch.fx.Node) else None
    if not chain or node is None or node.op != "placeholder" or node.name not in given:
        return None
    value = given[node.name]
    try:
        for n in reversed(chain):
            rest = [_size(a, given) for a in n.args[1:]]
            kwargs = {k: _size(v, given) for k, v in n.kwargs.items()}
            value = n.target(value, *rest, **kwargs)
    except (_NoReplay, RuntimeError):   # a size not worked out, or strides the view cannot take
        return None
    return value


def _size(arg, given):
    """A view op's non-tensor argument on this call: constants as they are; a size read from an
    input (``sym_size``) and arithmetic on such sizes, worked out."""
    if isinstance(arg, (list, tuple)):
        return type(arg)(_size(a, given) for a in arg)
    if not isinstance(arg, torch.fx.Node):
        return arg
    if arg.target is torch.ops.aten.sym_size.int and arg.args[0].name in given:
        return given[arg.args[0].name].shape[arg.args[1]]
    if arg.target in _SIZE_OPS:
        return arg.target(*(_size(a, given) for a in arg.args))
    raise _NoReplay(arg.name)
