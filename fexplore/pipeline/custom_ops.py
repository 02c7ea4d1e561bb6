"""``fexplore.register_op``: torch.library custom ops enter the IR through the same door as
built-in ops, as one OpDef each.

From the op's schema: tensor arguments become IR inputs, the rest typed attributes. Unless given,
the type rule comes from torch's fake (meta) kernel, and the numpy reference calls the op's eager
implementation, so registering is one line for most ops.

An op that updates some of its arguments in place (``mutates_args``: a cache write, an
accumulation) is pure in the IR: its results are its returns, then the new values of the
arguments it updates. torch.export writes a call of it as ``auto_functionalized_v2``, which
names the base tensor each updated argument is (or is a slice of); the conversion computes the
op on that argument and writes its new value back into the base.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from fexplore.errors import RegistrationError, UnsupportedOperatorError
from fexplore.ir import AttrSpec, Category, Cost, DType, OpDef, TensorType, register
from fexplore.ir.opdef import REQUIRED, io_bytes

from .convert import CONVERTERS, ConvertContext, converter, ir_dtype, torch_dtype
from .numeric import to_numpy, to_torch

_ATTR_KINDS = {"int": "int", "float": "float", "bool": "bool", "str": "str", "SymInt": "dim",
               "int[]": "ints", "SymInt[]": "dims", "Scalar": "number", "ScalarType": "dtype"}


def register_op(op, *, reference: Callable | None = None, infer: Callable | None = None,
                cost: Callable | None = None, category: Category = Category.opaque) -> OpDef:
    """Make a torch.library custom op (``torch.ops.mylib.foo`` or ``.default``) compilable.

    ``reference(*arrays, **attrs) -> array or tuple`` (numpy) is the op's meaning in the IR;
    ``infer(types, attrs) -> list[TensorType]`` its type rule; ``cost(in_types, out_types, attrs)
    -> Cost``. Registering again replaces the earlier definition (re-running a notebook cell)."""
    overload = op.default if isinstance(op, torch._ops.OpOverloadPacket) else op
    if not isinstance(overload, torch._ops.OpOverload):
        raise RegistrationError(f"register_op takes a torch.ops custom op, got {op!r}",
                                hint="define it with @torch.library.custom_op('mylib::myop', "
                                     "mutates_args=()) and pass torch.ops.mylib.myop")
    key = str(overload)  # "mylib.foo.default", the key ingestion looks up
    schema = overload._schema
    name, tensor_args, attr_args, updated_names = _signature(overload)

    def call_torch(args, attrs):
        kwargs = dict(attrs)
        for k, v in kwargs.items():
            if isinstance(v, DType):
                kwargs[k] = torch_dtype(v)
        with torch.no_grad():
            out = overload(*args, **kwargs)
        return out

    def returned(out) -> list:
        return [] if out is None else list(out) if isinstance(out, (tuple, list)) else [out]

    def default_reference(arrays, attrs):
        args = [to_torch(np.ascontiguousarray(x)) for x in arrays]   # copies: the op may update them
        out = call_torch(args, attrs)
        return [to_numpy(o) for o in returned(out) + [args[tensor_args.index(n)] for n in updated_names]]

    def user_reference(arrays, attrs):
        arrays = [np.array(x, copy=True) for x in arrays]   # it may update them in place, as the op
        out = reference(*arrays, **dict(attrs))
        return returned(out) + [arrays[tensor_args.index(n)] for n in updated_names]

    def default_infer(types, attrs):
        if not all(t.is_static for t in types):
            raise TypeError(f"{name}: give register_op(..., infer=...) to compile this op with "
                            "dynamic shapes")
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            fakes = [torch.empty(t.shape, dtype=torch_dtype(t.dtype)) for t in types]
            kwargs = {k: (torch_dtype(v) if isinstance(v, DType) else v)
                      for k, v in attrs.items()}
            out = overload(*fakes, **kwargs)
        outs = returned(out) + [fakes[tensor_args.index(n)] for n in updated_names]
        return [TensorType(tuple(o.shape), ir_dtype(o.dtype)) for o in outs]

    def default_cost(ins, outs, attrs) -> Cost:
        return Cost(0, io_bytes(ins, outs))

    opdef = OpDef(name, category, infer or default_infer,
                  user_reference if reference is not None else default_reference,
                  cost or default_cost, attrs=tuple(attr_args), arity=len(tensor_args),
                  doc=f"custom op {key}: {schema}")
    register(opdef, replace=True)

    def convert(ctx: ConvertContext):
        args = list(ctx.args) + [None] * (len(schema.arguments) - len(ctx.args))
        values = dict(zip([a.name for a in schema.arguments], args))
        values.update(ctx.kwargs)
        inputs = [values[n] for n in tensor_args]
        attrs = _attrs(attr_args, values)
        n_out = len(schema.returns) + len(updated_names)
        return ctx.emit(name, inputs, attrs, n_results=n_out if n_out > 1 else None)

    CONVERTERS[key] = convert
    return opdef


def _signature(overload):
    """(the IR op's name, its tensor arguments, its attributes, the arguments it updates in
    place) from a custom op's schema."""
    schema, key = overload._schema, str(overload)
    name = key.rsplit(".", 1)[0] if key.endswith(".default") else key
    tensor_args, attr_args = [], []
    for a in schema.arguments:
        t = str(a.type)
        if t in ("Tensor", "Tensor?"):
            tensor_args.append(a.name)
        elif t.rstrip("?") in _ATTR_KINDS:
            attr_args.append(AttrSpec(a.name, _ATTR_KINDS[t.rstrip("?")],
                                      a.default_value if a.has_default_value() else REQUIRED,
                                      optional=t.endswith("?")))
        else:
            raise RegistrationError(f"{key}: argument {a.name} of type {t} is not supported",
                                    hint="a custom op's arguments are tensors or attributes of kinds "
                                         f"{', '.join(sorted(_ATTR_KINDS))}")
    updated = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if any(n not in tensor_args for n in updated):
        raise RegistrationError(f"{key} updates an argument that is not a tensor", hint="an op updates tensors in place")
    return name, tensor_args, attr_args, updated


@converter("higher_order.auto_functionalized_v2")
def _auto_functionalized(ctx: ConvertContext):
    """A call of an op that updates arguments in place, as torch.export writes it: the op's
    returns (None for none), then the new value of each base tensor. An updated argument is
    base ``_<arg>_base_index`` of ``_all_bases`` itself, or its slice ``_<arg>_slice_dim/start/
    end``."""
    overload = ctx.args[0]
    key = str(overload)
    if key not in CONVERTERS:   # register_op puts its converter there
        raise UnsupportedOperatorError(key, loc=ctx.loc, reason="a custom op that updates its arguments in place, not registered",
                                       hint=f"register it: fexplore.register_op(torch.ops.{key.rsplit('.', 1)[0]})")
    name, tensor_args, attr_args, updated_names = _signature(overload)
    kw = dict(ctx.kwargs)
    bases = list(kw["_all_bases"])
    views = {}
    for arg in updated_names:
        base = bases[kw[f"_{arg}_base_index"]]
        if f"_{arg}_slice_dim" in kw:
            views[arg] = ctx.emit("slice", [base], _slice_attrs(kw, arg, base))
        elif any(f"_{arg}_{k}" in kw for k in ("size", "stride", "storage_offset")):
            raise NotImplementedError(f"{key} updates {arg}, a strided view of a tensor (not the tensor "
                                      "or a slice of it)")
        else:
            views[arg] = base
    inputs = [views[n] if n in views else kw.get(n) for n in tensor_args]
    attrs = _attrs(attr_args, kw)
    n_returns = len(overload._schema.returns)
    outs = ctx.emit(name, inputs, attrs, n_results=n_returns + len(updated_names))
    returns, new = list(outs[:n_returns]), dict(zip(updated_names, outs[n_returns:]))
    for arg in updated_names:   # each new value written into its base
        i = kw[f"_{arg}_base_index"]
        if f"_{arg}_slice_dim" in kw:
            new[arg] = ctx.emit("slice_scatter", [bases[i], new[arg]], _slice_attrs(kw, arg, bases[i]))
        bases[i] = new[arg]
    return tuple((returns or [None]) + bases)


def _attrs(attr_args, values: dict) -> dict:
    """The op's attributes from a call's arguments by name, as the IR holds them."""
    attrs = {}
    for a in attr_args:
        v = values.get(a.name)
        if v is not None:
            attrs[a.name] = ir_dtype(v) if isinstance(v, torch.dtype) else tuple(v) if isinstance(v, list) else v
    return attrs


def _slice_attrs(kw: dict, arg: str, base) -> dict:
    """The slice of its base an updated argument is (auto_functionalized_v2's ``_<arg>_slice_*``)."""
    axis = kw[f"_{arg}_slice_dim"]
    start, end = kw.get(f"_{arg}_slice_start"), kw.get(f"_{arg}_slice_end")
    size = base.type.shape[axis]
    start = 0 if start is None else start + size if start < 0 else start
    end = size if end is None else end + size if end < 0 else min(end, size)
    return {"axis": axis, "start": start, "end": end}
