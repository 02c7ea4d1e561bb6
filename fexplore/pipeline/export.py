"""Capture a model with torch.export, decomposed to core ATen but keeping the ops whose intent
matters to an NPU (`decomposition.py`): in one trace where it can, else torch.export and then the
decomposition, and with dynamo for a model that writes into tensors it does not register."""

from __future__ import annotations

import os
import traceback
import warnings

import torch

from fexplore.errors import ControlFlowError, ExportError, SourceLoc

from .decomposition import decompose, export_decomposed

def export_model(model: torch.nn.Module, args: tuple, *, kwargs: dict | None = None, dynamic_shapes=None):
    """torch.export (non-strict) decomposed with the intent-keeping table: one trace
    (`decomposition.export_decomposed`); when that fails, torch.export then the decomposition,
    whose errors the user sees (a failed trace's writes into tensors the model holds undone).

    A model partly on the meta device (parameters on meta, buffers real: what accelerate's
    ``init_empty_weights`` and ``torch.device("meta")`` builds with real buffers make) is exported
    with meta twins of its real tensors, as torch.export cannot mix devices; `real_state` gives
    their values back to ingestion, so a causal mask or a rotary table stays known."""
    args, kwargs = _unaliased((args, kwargs or {}))
    with warnings.catch_warnings(), _Restored(_tensors_outside_state(model)) as outside:
        # torch.export's own pytree deprecation chatter, not the user's business
        warnings.filterwarnings("ignore", category=FutureWarning, module="copyreg")
        made: dict[int, torch.Tensor] = {}   # one twin per tensor: tied weights stay tied
        twins = {name: made.setdefault(id(t), _meta_twin(t)) for name, t in real_state(model).items()}
        if not twins:
            return _export(model, args, kwargs, dynamic_shapes, outside)
        from torch.nn.utils.stateless import _reparametrize_module

        with _reparametrize_module(model, twins):   # the user's model is itself again after
            return _export(model, args, kwargs, dynamic_shapes, outside)


def _tensors_outside_state(model: torch.nn.Module, depth: int = 4) -> list[torch.Tensor]:
    """The tensors a module reaches other than as its own parameters and buffers: through an
    object it holds (a cache object's key and value tensors, which may also be registered as
    buffers), up to `depth` attributes, lists or dicts deep. Non-strict torch.export swaps a
    module's parameters and buffers for fake tensors while it traces, but a write into a tensor
    reached another way runs on the user's own tensor."""
    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()

    def walk(obj, left: int) -> None:
        if isinstance(obj, torch.Tensor):
            if not obj.is_meta:
                found.setdefault(id(obj), obj)
            return
        if left == 0 or id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None),
                                                            torch.nn.Module, type)):
            return
        seen.add(id(obj))
        if isinstance(obj, dict):
            items = obj.values()
        elif isinstance(obj, (list, tuple, set)):
            items = obj
        else:
            items = getattr(obj, "__dict__", {}).values()
        for x in items:
            walk(x, left - 1)

    for m in model.modules():
        for name, value in vars(m).items():
            if name not in _MODULE_OWN:
                walk(value, depth)
    return list(found.values())


# nn.Module's own bookkeeping: its parameters, buffers and submodules export sees as such
_MODULE_OWN = {"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"}


class _Restored:
    """Each of `tensors` as it was, after the block and on `restore()`: its values, and no autograd
    history (an in-place write into it while torch.export traced leaves one)."""

    def __init__(self, tensors: list[torch.Tensor]):
        self.saved = [(t, t.detach().clone(), t.requires_grad) for t in tensors]

    def __enter__(self) -> "_Restored":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def restore(self) -> None:
        with torch.no_grad():
            for t, values, grad in self.saved:
                if t.grad_fn is not None and not t._is_view():   # a view keeps its base's history
                    t.detach_()
                    t.requires_grad_(grad)
                if not torch.equal(t, values):
                    t.copy_(values)


def _unaliased(args):
    """The example inputs with each tensor that shares memory with an earlier one replaced by a
    copy of its values. torch.export traces inputs that alias as one tensor (``mha(x, x, x)``
    exports a program that reads ``v`` for ``q`` and ``k`` too), and a compiled model takes each
    input on its own: it must compute what eager does when they differ."""
    seen: set[int] = set()
    copied = False

    def one(a):
        nonlocal copied
        if not isinstance(a, torch.Tensor) or a.is_meta or a.numel() == 0:
            return a
        storage = a.untyped_storage().data_ptr()
        if storage in seen:
            copied = True
            return a.clone()
        seen.add(storage)
        return a
    out = torch.utils._pytree.tree_map(one, args)
    return out if copied else args   # a cache object rebuilt by the map is not the user's own


def _meta_twin(t: torch.Tensor) -> torch.Tensor:
    twin = torch.empty_like(t, device="meta")
    return torch.nn.Parameter(twin, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else twin


def real_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters and buffers (by qualified name) that hold values in a model whose other
    state is on the meta device; empty for a model wholly on one side."""
    state = dict(model.named_parameters(remove_duplicate=False))
    state.update(model.named_buffers(remove_duplicate=False))
    if not any(t.is_meta for t in state.values()):
        return {}
    return {name: t for name, t in state.items() if not t.is_meta}


def _export(model, args, kwargs, dynamic_shapes, outside: "_Restored"):
    for i, a in enumerate(torch.utils._pytree.tree_leaves((args, kwargs))):
        if isinstance(a, torch.Tensor) and a.is_complex():  # the IR holds complex values inside
            raise ExportError(f"model input {i} is a complex tensor ({a.dtype})",
                              hint="pass torch.view_as_real(x) and call torch.view_as_complex "
                                   "inside the model")
    # traced for inference, without autograd: an op with no backward on this device
    # (flex_attention on CPU) refuses to be traced for one
    try:
        with torch.no_grad():
            ep = export_decomposed(model, args, kwargs, dynamic_shapes)
        if ep is not None:
            return ep
    except Exception:  # noqa: BLE001 - the two steps below say why, with torch's messages for them
        outside.restore()   # a write the trace made into a tensor the model holds
    try:
        with torch.no_grad():
            ep = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as e:  # torch raises many kinds; the user needs the message, not our stack
        if _data_dependent(e):
            raise ControlFlowError(
                "the model's Python control flow depends on a tensor's values (an `if` on a "
                "tensor, `int(x)` or `.item()` used as a count or size): a compiled program "
                "takes the same path for every input",
                loc=_user_frame(e.__traceback__),
                hint="choose elementwise with torch.where(cond, a, b), or branch with "
                     "torch.cond(pred, true_fn, false_fn, (x,)); loop counts and sizes must be "
                     "Python ints or tensor shapes") from None
        raise ExportError(
            f"torch.export could not capture the model: {type(e).__name__}: "
            f"{_first_lines(str(e))}",
            hint="fexplore compiles what torch.export accepts; check that the model runs on the "
                 "example inputs, and for dynamic shapes that the Dim ranges are ones the model "
                 "supports (torch's message above names the guard that failed)") from None
    written = _written_constants(ep)
    if written:
        ep = _export_strict(model, args, kwargs, dynamic_shapes, written)
    try:
        return decompose(ep)
    except Exception as e:
        raise ExportError(f"decomposing the exported program failed: {type(e).__name__}: "
                          f"{_first_lines(str(e))}") from None


def _written_constants(ep) -> list:
    """The writes into tensor constants in the program, as (the constant's name, the node). Non-strict
    export sees a module's own parameters and buffers; a tensor it reaches another way (through
    a cache object, even one that is also registered as a buffer: transformers' static-cache
    export wrappers) is lifted as a constant, and a write into a constant cannot be made
    functional."""
    constants = ep.graph_signature.inputs_to_lifted_tensor_constants
    written = []
    for node in ep.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.is_mutable:
            continue
        for arg, value in zip(schema.arguments, node.args):
            name = getattr(value, "name", None)
            if arg.alias_info is not None and arg.alias_info.is_write and name in constants:
                written.append((constants[name], node))
    return written


def _export_strict(model, args, kwargs, dynamic_shapes, written: list):
    """torch.export with dynamo (strict), which follows a tensor to the buffer it is, however
    the model reaches it: for a model whose non-strict program writes into constants."""
    # dynamo's notes on side effects it saw in the model's libraries, not the user's business
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\._dynamo")
    try:
        with torch.no_grad():   # for inference, as `_export`
            ep = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=True)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds
        raise _writes_constants(written, f"; exporting it with dynamo, which would follow them to "
                                         f"the buffers they may be, failed: {type(e).__name__}: "
                                         f"{_first_lines(str(e), 2)}") from None
    left = _written_constants(ep)
    if left:
        raise _writes_constants(left, "")
    return ep


def _writes_constants(written: list, why: str) -> ExportError:
    from .ingest import source_loc

    names = sorted({name for name, _ in written})
    return ExportError(
        f"the model writes into tensors that are not its parameters or buffers "
        f"({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}): a compiled program cannot "
        f"update them{why}",
        loc=source_loc(written[0][1]),
        hint="register the tensors the model updates (a KV cache, a counter) as buffers of the module "
             "(register_buffer) and reach them as such, or pass them in as inputs and return their "
             "new values")


def _data_dependent(e: BaseException) -> bool:
    """torch.export met a Python decision on a traced tensor's value (a guard on an unbacked
    symbol: what `if x.sum() > 0` or `int(x.max())` becomes while tracing)."""
    names = {type(e).__name__ for e in _chain(e)}
    return bool(names & {"GuardOnDataDependentSymNode", "DataDependentOutputException"})


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_FEXPLORE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _user_frame(tb) -> SourceLoc | None:
    """The innermost frame of the traceback in the user's code (not torch's, not ours)."""
    frames = [f for f in traceback.extract_tb(tb)
              if not f.filename.startswith((_TORCH_DIR, _FEXPLORE_DIR, "<"))]
    if not frames:
        return None
    return SourceLoc(frames[-1].filename, frames[-1].lineno, None)


def _first_lines(s: str, n: int = 6) -> str:
    lines = [ln for ln in s.strip().splitlines() if ln.strip()]
    return "\n".join(lines[:n]) + ("\n..." if len(lines) > n else "")
