"""``fexplore.register_op``: torch.library custom ops enter the IR through the same door as
built-in ops, as one OpDef each.

From the op's schema: tensor arguments become IR inputs, the rest typed attributes. Unless given,
the type rule comes from torch's fake (meta) kernel, and the numpy reference calls the op's eager
implementation, so registering is one line for most ops.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from fexplore.errors import RegistrationError
from fexplore.ir import AttrSpec, Category, Cost, DType, OpDef, TensorType, register
from fexplore.ir.opdef import REQUIRED, io_bytes

from .convert import CONVERTERS, ConvertContext, ir_dtype, torch_dtype
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
    schema = overload._schema
    key = str(overload)  # "mylib.foo.default", the key ingestion looks up
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

    def call_torch(arrays, attrs):
        kwargs = dict(attrs)
        args = [to_torch(np.ascontiguousarray(x)) for x in arrays]
        for k, v in kwargs.items():
            if isinstance(v, DType):
                kwargs[k] = torch_dtype(v)
        with torch.no_grad():
            out = overload(*args, **kwargs)
        return out

    def default_reference(arrays, attrs):
        out = call_torch(arrays, attrs)
        outs = out if isinstance(out, (tuple, list)) else [out]
        return [to_numpy(o) for o in outs]

    def user_reference(arrays, attrs):
        out = reference(*arrays, **dict(attrs))
        return list(out) if isinstance(out, (tuple, list)) else [out]

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
        outs = out if isinstance(out, (tuple, list)) else [out]
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
        attrs = {a.name: values[a.name] for a in attr_args if values.get(a.name) is not None}
        for a in attr_args:
            if isinstance(attrs.get(a.name), torch.dtype):
                attrs[a.name] = ir_dtype(attrs[a.name])
            if isinstance(attrs.get(a.name), list):
                attrs[a.name] = tuple(attrs[a.name])
        n_out = len(schema.returns)
        return ctx.emit(name, inputs, attrs, n_results=n_out if n_out > 1 else None)

    CONVERTERS[key] = convert
    return opdef
