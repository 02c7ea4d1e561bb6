"""Ingestion: a torch.export ExportedProgram becomes an IR Graph.

Parameters and buffers become named constants sharing the model's storage; user inputs become
graph inputs with symbolic dims named after the user's ``torch.export.Dim``s; every call becomes
IR nodes through the converter registry, each node carrying the user's file:line and module path.
The model's input and output structure (tuples, dicts, dataclasses) is kept as pytree specs.
"""

from __future__ import annotations

import inspect
import operator
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from fexplore.errors import ErrorDoc, ExportError, FexploreError, SourceLoc, UnsupportedOperatorError
from fexplore.ir import Constant, Graph, TensorType, Value
from fexplore.ir.graph import unique_name
from fexplore.ir.types import dims_equal

from .convert import COMPLEX_CONVERTERS, CONVERTERS, ConvertContext, fake_type, ir_dtype, is_complex
from .convert.out_of_scope import random_draw_refusal
from .symbols import SymbolTable, build_symbol_table


class IngestionError(FexploreError):
    """A converter produced something other than what torch says the op computes."""

    code = "FX403"
    doc = ErrorDoc(
        when="A converter (fexplore's own, or one a user registered) produced a value of a "
             "different shape or dtype from what torch says the op computes, or an op result "
             "of a kind the IR cannot hold. A bug in that converter, caught at ingestion.",
        example='@fexplore.pipeline.convert.converter("mylib.halve.default")\n'
                "def halve(ctx):   # torch says halve gives f32; this builds i32\n"
                '    return ctx.emit("cast", [ctx.arg(0)], {"dtype": DType.i32})',
        fix="If the converter is your own (register_op / a CONVERTERS entry), make it return "
            "the type torch reports; otherwise report it with the op named in the message.")


@dataclass
class Ingested:
    graph: Graph
    in_spec: Any  # pytree spec of (args, kwargs)
    out_spec: Any  # pytree spec of the model's output
    exported: torch.export.ExportedProgram
    # the exported program's call nodes (by name) -> the IR value (or tuple) each became: how a
    # wrong ingest is traced to the op of the model it came from (`numeric.first_divergent_from_export`)
    values_of: dict = field(default_factory=dict)
    # torch's guards over several input sizes, which each call's inputs must meet
    # (`symbols.SymbolTable.relations`), and the forward's signature their code reads by
    size_relations: list = field(default_factory=list)
    signature: Any = None
    # the graph inputs the model updates in place, by input index, in the order their new values
    # follow the model's own outputs among the graph's outputs (torch's exported program writes
    # them back into the caller's tensors, and so does each call of the compiled model)
    input_mutations: list = field(default_factory=list)
    # the buffers the model updates in forward (a counter, a static KV cache): {qualified name:
    # value when compiled}, in order. Each is a graph input after the user's inputs, and its new
    # value a graph output after the inputs' updates; the compiled model carries it from call to
    # call, as the model carries its buffer
    state: dict = field(default_factory=dict)
    # the model's own outputs that are numbers (a size, a constant): {index: int, float or bool};
    # a 0-d tensor in the graph, a number again in what the compiled model returns
    number_outputs: dict = field(default_factory=dict)


def tensor_payload(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor's storage (no copy); bf16/fp8 reinterpret their bits."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ir_dtype(t.dtype).numpy)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy().view(ir_dtype(t.dtype).numpy)
    if t.is_complex():  # the IR's layout of a complex tensor: (..., 2) real pairs, still no copy
        return torch.view_as_real(t.resolve_conj()).numpy()
    return t.numpy()


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def source_loc(fx_node) -> SourceLoc | None:
    """The user's line (the innermost frame of torch.export's stack trace outside torch itself,
    so ``self.proj(x)`` points at the model, not at nn.Linear) and the module path."""
    file = line = None
    trace = fx_node.meta.get("stack_trace")
    if trace:
        frames = [(f, int(n)) for f, n in re.findall(r'File "([^"]+)", line (\d+)', trace)
                  if not f.startswith((_TORCH_DIR, "<"))]  # "<eval_with_key>": FX code
        if frames:
            file, line = frames[-1]
    module = None
    stack = fx_node.meta.get("nn_module_stack")
    if stack:
        module = _clean_module_path(list(stack.values())[-1][0])
    if file is None and module is None:
        return None
    return SourceLoc(file, line, module)


def _clean_module_path(path: str) -> str | None:
    # torch gives "h.0.attn" in recent versions and "L['self'].h[0].attn" in some older ones.
    path = re.sub(r"^L\['self'\]\.?", "", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path).strip(".")
    return path or None


class GraphBuilder:
    """Accumulates one graph's constants and nodes while converters emit into it."""

    def __init__(self, symbols: SymbolTable):
        self.symbols = symbols
        self.nodes: list = []
        self.constants: list[Constant] = []
        self._names: set[str] = set()

    def literal(self, array: np.ndarray, name: str) -> Constant:
        c = Constant(self._unique(name), TensorType(array.shape, _dtype_of(array)), array)
        self.constants.append(c)
        return c

    def param(self, name: str, tensor: torch.Tensor, source: str | None) -> Constant:
        if tensor.is_meta:   # a model built on the meta device: shapes and dtypes, no values
            shape = tuple(tensor.shape) + ((2,) if tensor.is_complex() else ())
            t = TensorType(shape, ir_dtype(tensor.dtype))
            c = Constant(self._unique(name), t, None, source=source,
                         digest=f"meta-{'x'.join(map(str, shape)) or 'scalar'}")
            self.constants.append(c)
            return c
        payload = tensor_payload(tensor)
        t = TensorType(tuple(payload.shape), _dtype_of(payload))
        c = Constant(self._unique(name), t, payload, source=source)
        self.constants.append(c)
        return c

    def _unique(self, name: str) -> str:
        return unique_name(name, self._names, sep="_")


def _dtype_of(a: np.ndarray):
    from fexplore.ir import DType

    return DType.from_numpy(a.dtype)


def ingest(ep: torch.export.ExportedProgram, *, name: str = "forward", dynamic_shapes=None,
           forward=None, values: dict | None = None) -> Ingested:
    """`values`: the real tensors of state exported as meta twins (`export.real_state`), by
    qualified name; they become the constants' payloads."""
    users = [n for n in ep.graph.nodes if n.op == "placeholder" and _input_kind(ep, n.name) == InputKind.USER_INPUT]
    user_fakes = [n.meta.get("val") for n in users]
    symbols = build_symbol_table(ep, user_fakes, dynamic_shapes, forward)
    symbols.hold_input_guards(getattr(ep, "_guards_code", None), {
        n.name: tuple(symbols.dim(d) for d in fake.shape) for n, fake in zip(users, user_fakes)
        if isinstance(fake, torch.Tensor)})
    _tie_attention_lengths(ep.graph_module, symbols)
    values_of: dict = {}
    mutations: list = []
    state: dict = {}
    graph = _convert_graph(ep.graph_module, ep, symbols, name, top=True, values=values or {}, made=values_of,
                           mutations=mutations, state=state)
    graph.symbols.update(symbols.ranges)
    signature = inspect.signature(forward) if forward is not None else None
    return Ingested(graph, ep.call_spec.in_spec, ep.call_spec.out_spec, ep, values_of,
                    symbols.relations, signature, mutations, state, _number_outputs(ep))


def _tie_attention_lengths(gm: torch.fx.GraphModule, symbols: SymbolTable) -> None:
    """Attention's key and value lengths are one length, but torch's trace of
    ``scaled_dot_product_attention`` does not guard it: a decode step whose key and value caches
    are exported with ``Dim.AUTO`` gets a symbol for each, and an attention over lengths that
    may differ has no meaning. The IR gives them one symbol (``SymbolTable.tie``), so the
    attention types and a call with caches that disagree is refused when its sizes are bound."""
    for node in gm.graph.nodes:
        if node.op == "get_attr" and isinstance(getattr(gm, node.target, None), torch.fx.GraphModule):
            _tie_attention_lengths(getattr(gm, node.target), symbols)
        if node.op != "call_function" or "scaled_dot_product" not in str(node.target):
            continue
        k, v = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in node.args[1:3])
        if isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.dim() >= 2 and v.dim() >= 2:
            symbols.tie(k.shape[-2], v.shape[-2])


def _input_kind(ep, placeholder_name: str):
    for spec in ep.graph_signature.input_specs:
        if spec.arg.name == placeholder_name:
            return spec.kind
    return None


def _convert_graph(gm: torch.fx.GraphModule, ep, symbols: SymbolTable, name: str,
                   top: bool, values: dict | None = None, made: dict | None = None,
                   mutations: list | None = None, state: dict | None = None) -> Graph:
    """`made`, if given, is filled with each call node's name -> the value(s) it became;
    `mutations` with the index of each input the model updates in place, in the order their
    new values are put after the model's outputs; `state` with each buffer the model updates
    (its value now), which becomes an input after the user's."""
    values = values or {}
    b = GraphBuilder(symbols)
    env: dict[str, Any] = {}
    inputs: list[Value] = []
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs} if top else {}
    outputs: list[Value] = []
    updated_buffers = set(ep.graph_signature.buffers_to_mutate.values()) if top else set()
    state_inputs: list[Value] = []
    tied: dict[int, Value] = {}   # id of a parameter's tensor -> its constant
    unread = _block_mask_only(gm.graph)

    for n in gm.graph.nodes:
        if n in unread:
            env[n.name] = None   # what reads it (the BlockMask's slots of flex_attention) ignores it
            continue
        if n.op == "placeholder":
            spec = specs.get(n.name)
            if spec is not None and spec.kind in (InputKind.PARAMETER, InputKind.BUFFER,
                                                  InputKind.CONSTANT_TENSOR):
                tensor = ep.state_dict.get(spec.target)
                if tensor is None:
                    tensor = ep.constants[spec.target]
                tensor = values.get(spec.target, tensor)
                if spec.target in updated_buffers:   # state: an input, not a constant to fold
                    if tensor.is_meta:
                        raise ExportError(f"the model updates its buffer {spec.target} in place, and it "
                                          "is on the meta device: there is no value to start from",
                                          hint="compile the model with real buffers")
                    v = Value(b._unique(spec.target.replace(".", "_")), _fake_type(n.meta["val"], symbols))
                    env[n.name] = v
                    state_inputs.append(v)
                    if state is not None:
                        state[spec.target] = tensor.detach().clone()
                    continue
                if id(tensor) not in tied:   # a weight tied under two names is one constant
                    tied[id(tensor)] = b.param(spec.target, tensor, spec.target)
                env[n.name] = tied[id(tensor)]
            elif spec is not None and spec.kind != InputKind.USER_INPUT:
                raise ExportError(f"unsupported model input kind {spec.kind.name} ({n.name})")
            else:
                val = n.meta.get("val")
                if not isinstance(val, torch.Tensor):
                    # non-tensor user inputs were specialized by export into the graph
                    env[n.name] = val if not isinstance(val, torch.SymInt) else symbols.dim(val)
                    continue
                if top and is_complex(val):
                    raise ExportError(f"model input {n.name} is a complex tensor",
                                      hint="pass torch.view_as_real(x) and call "
                                           "torch.view_as_complex inside the model")
                v = Value(b._unique(n.name), _fake_type(val, symbols))
                env[n.name] = v
                inputs.append(v)
        elif n.op == "get_attr":
            env[n.name] = getattr(gm, n.target)
        elif n.op == "call_function":
            env[n.name] = _convert_call(n, env, b, ep, symbols)
            if made is not None:
                made[n.name] = env[n.name]
        elif n.op == "output":
            inputs += state_inputs
            if top:
                _check_outputs(ep)
            flat = n.args[0] if isinstance(n.args[0], (tuple, list)) else (n.args[0],)   # a score_mod's one
            outputs = _outputs(flat, env, ep.graph_signature.output_specs if top else None, inputs,
                               mutations, state, b)
    used = {v.name for node in b.nodes for v in node.inputs} | {v.name for v in outputs}
    constants = [c for c in b.constants if c.name in used]  # tied weights leave orphans
    return Graph(name, inputs, constants, b.nodes, outputs, {})


def _block_mask_only(graph: torch.fx.Graph) -> set:
    """The call nodes whose results reach nothing but flex_attention's BlockMask tensors: its
    block counts and indices, which say where a fused kernel may skip work while the op's
    meaning reads the mask_mod alone (``convert/flex_attention.py``). They are not converted:
    with a dynamic length they are sizes rounded up to whole blocks, of no use to the IR."""
    flex = [n for n in graph.nodes if n.op == "call_function" and op_key(n.target) == "higher_order.flex_attention"]
    if not flex:
        return set()
    skipped = {id(n): {x for x in n.args[4][:-1] if isinstance(x, torch.fx.Node)} for n in flex}
    # from the output and side effects (not the checks of metadata torch adds: never converted)
    live, stack = set(), [n for n in graph.nodes if not n.users and not op_key(n.target).startswith(_SKIPPED)]
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack += [x for x in n.all_input_nodes if x not in skipped.get(id(n), ())]
    return {n for n in graph.nodes if n.op == "call_function" and n not in live}


def _outputs(flat, env, specs, inputs, mutations, state, b: GraphBuilder) -> list[Value]:
    """The graph's outputs: the model's own, then the new values of the inputs it updates in
    place (in input order, each index put in `mutations`), then those of the buffers it updates
    (in the order of `state`). `specs`: the exported program's output specs (None inside a
    subgraph, whose outputs are all its own). A number the model returns is a 0-d tensor
    (`_number_output`); the compiled model gives it back as a number."""
    own, updated, new_state = [], {}, {}
    for i, o in enumerate(flat):
        if isinstance(o, torch.fx.Node) and is_complex(o):
            raise ExportError(f"model output {i} is a complex tensor",
                              hint="return torch.view_as_real(z) instead")
        v = env.get(o.name) if isinstance(o, torch.fx.Node) else o
        v = _number_output(v, b, f"output{i}")
        if not isinstance(v, Value):
            raise ExportError(f"model output {i} is not a tensor ({v!r})",
                              hint="fexplore compiles models whose outputs are tensors "
                                   "(in tuples, lists, dicts or dataclasses)")
        kind = specs[i].kind if specs else OutputKind.USER_OUTPUT
        if kind == OutputKind.USER_INPUT_MUTATION:
            updated[inputs.index(env[specs[i].target])] = v
        elif kind == OutputKind.BUFFER_MUTATION:
            new_state[specs[i].target] = v
        else:
            own.append(v)
    if mutations is not None:
        mutations += sorted(updated)
    return own + [updated[i] for i in sorted(updated)] + [new_state[name] for name in (state or {})]


def _number_outputs(ep) -> dict:
    """{index among the model's own outputs: the Python type} of the outputs that are numbers."""
    (out,) = [n for n in ep.graph.nodes if n.op == "output"]
    own = [o for o, s in zip(out.args[0], ep.graph_signature.output_specs) if s.kind == OutputKind.USER_OUTPUT]
    symbolic = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}
    kinds = {}
    for i, o in enumerate(own):
        v = o.meta.get("val") if isinstance(o, torch.fx.Node) else o
        kind = symbolic.get(type(v)) or (type(v) if isinstance(v, (bool, int, float)) else None)
        if kind is not None:
            kinds[i] = kind
    return kinds


def _number_output(v, b: GraphBuilder, name: str):
    """A number output as a 0-d tensor of the dtype ``torch.tensor`` gives it (what the oracle
    compares, ``eager_modes.output_tensors``): a constant as a literal, a size (an int of the
    symbols, ``x.shape[1] + 1``) as ``full`` of that size, known once the size is."""
    import sympy

    from fexplore.ir import Attrs, DType, Node, get_op

    if isinstance(v, (bool, int, float)):
        return b.literal(torch.tensor(v).numpy(), name)
    if isinstance(v, sympy.Expr) and v.is_integer:
        full = get_op("full")
        out = Value(b._unique(name), TensorType((), DType.i64))
        b.nodes.append(Node(full, [], Attrs(full.complete_attrs({"shape": (), "value": v, "dtype": DType.i64})),
                            [out], None))
        return out
    return v


def _check_outputs(ep) -> None:
    for spec in ep.graph_signature.output_specs:
        if spec.kind not in (OutputKind.USER_OUTPUT, OutputKind.USER_INPUT_MUTATION,
                             OutputKind.BUFFER_MUTATION):
            what = spec.target or spec.arg.name
            raise ExportError(
                f"the model's output {what} is of a kind fexplore does not compile ({spec.kind.name})",
                hint="compile the model in eval mode for inference: outputs, inputs and buffers "
                     "it updates in place are compiled; gradients and losses are not")


def _fake_type(val: torch.Tensor, symbols: SymbolTable) -> TensorType:
    return fake_type(val, symbols.dim)  # complex64 -> f32[..., 2]


_SKIPPED = ("aten._assert_scalar", "aten._assert_tensor_metadata", "aten.sym_constrain_range",
            "aten._assert_async", "aten.sym_constrain_range_for_size", "aten._local_scalar_dense")


def _convert_call(n, env, b: GraphBuilder, ep, symbols: SymbolTable):
    if n.target is operator.getitem:
        seq, i = env[n.args[0].name], n.args[1]
        r = seq[i]
        if r is None:
            raise IngestionError(f"result {i} of {n.args[0].target} is not supported",
                                 loc=source_loc(n))
        return r
    val = n.meta.get("val")
    target = op_key(n.target)
    if target.startswith("aten._local_scalar_dense") and isinstance(val, torch.SymInt) and \
            val.node.expr.is_Symbol and isinstance(env.get(n.args[0].name), Value):
        symbols.read_from[val.node.expr] = env[n.args[0].name]   # .item(): the tensor it reads
    if target.startswith(_SKIPPED) or (val is None and "assert" in target):
        return None
    if isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool):
        return symbols.dim(val)  # size arithmetic: folded into the dims that use it
    if isinstance(val, (torch.SymBool, torch.SymFloat, bool, float)):
        return val
    loc = source_loc(n)
    _refuse_data_dependent(n, target, loc)
    _refuse_values_read_from_data(n, target, loc)
    if _touches_complex(n):
        conv = COMPLEX_CONVERTERS.get(target)
        if conv is None:
            raise UnsupportedOperatorError(
                target, loc=loc, reason="on complex tensors",
                hint="the IR holds a complex tensor as real pairs (view_as_real's layout); "
                     "fexplore.pipeline.convert.COMPLEX_CONVERTERS lists the ops it knows on "
                     "them. Add one with "
                     f"@fexplore.pipeline.convert.complex_converter({target!r})")
    else:
        conv = CONVERTERS.get(target)
    if conv is None:
        random_draw = random_draw_refusal(n.target, loc)
        if random_draw is not None:
            raise random_draw
        if target.startswith(("aten.", "prims.", "higher_order.")):
            hint = (f"fexplore has no converter for {target} yet; add one with "
                    f"@fexplore.pipeline.convert.converter({target!r})")
        else:
            hint = (f"register the custom op once before compiling: "
                    f"fexplore.register_op(torch.ops.{target}) (its eager kernel becomes the "
                    f"reference, its fake kernel the type rule; both can be given explicitly)")
        raise UnsupportedOperatorError(target, loc=loc, hint=hint)
    ctx = ConvertContext(b, n, _map(n.args, env), _map(n.kwargs, env), loc)
    ctx.graph_module_converter = lambda gm, nm: _convert_graph(gm, ep, symbols, nm, top=False)
    try:
        result = conv(ctx)
    except FexploreError:
        raise
    except NotImplementedError as e:
        # a converter's word that it does not take this use of its op (flip along a symbolic
        # dim, a pad mode): a refusal, not a converter gone wrong
        raise UnsupportedOperatorError(target, loc=loc, reason=str(e),
                                       hint="fexplore converts this op, but not this use of it "
                                            "yet") from None
    except (TypeError, ValueError) as e:
        raise IngestionError(f"cannot convert {target}: {e}", loc=loc,
                             hint="this use of the op is not supported yet") from None
    _check_result(ctx, result, target)
    return _pin_guarded_dims(ctx, result, symbols)


def _pin_guarded_dims(ctx: ConvertContext, result, symbols: SymbolTable):
    """A result dim torch knows to be one size (it made it static, or keeps it as an expression
    but pins it by a guard) becomes that size (a reshape, the identity wherever the program
    runs), so the ops reading it see what torch saw: a conv whose input channels are
    ``floor(s/2)``, pinned to its weight's 2."""
    fake = ctx.meta
    if not isinstance(result, Value) or not isinstance(fake, torch.Tensor) or is_complex(fake):
        return result
    shape = list(result.type.shape)
    for i, d in enumerate(fake.shape):
        if isinstance(shape[i], int):
            continue
        # a dim torch made static (the result check proved the IR's expression equal to it),
        # or one it keeps as an expression but pins by a guard
        size = int(d) if isinstance(d, int) else symbols.pinned(d)
        if size is not None:
            shape[i] = size
    if shape == list(result.type.shape):
        return result
    return ctx.emit("reshape", [result], {"shape": tuple(shape)})


def _touches_complex(n) -> bool:
    """Whether a node reads or makes a complex tensor (its converter then comes from the
    complex table: the real one would misread the real-pair layout)."""
    val = n.meta.get("val")
    outs = val if isinstance(val, (list, tuple)) else [val]
    return any(is_complex(v) for v in outs) or any(is_complex(a) for a in n.all_input_nodes)


# What a data-dependent op is, in the user's words (the reason names any other op plainly).
_DATA_DEPENDENT = {
    "aten.index.Tensor": "boolean-mask indexing (x[mask]) keeps as many elements as the mask has",
    "aten.nonzero.default": "nonzero (also torch.where(mask) with one argument) gives as many "
                            "indices as there are true elements",
    "aten.bincount.default": "bincount's length is the largest input value + 1",
    "aten.masked_select.default": "masked_select keeps as many elements as the mask has",
}


def _refuse_data_dependent(n, target: str, loc) -> None:
    """A result whose size torch could only name with an unbacked symbol (``u0``) depends on
    the values of the op's inputs (nonzero, boolean-mask indexing, bincount, unique...). The IR
    has static or input-derived shapes only, so such an op is refused here, by name and line."""
    val = n.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    for v in vals:
        if isinstance(v, torch.Tensor) and free_unbacked_symbols(tuple(v.shape)):
            what = _DATA_DEPENDENT.get(target, "this op")
            raise UnsupportedOperatorError(
                target, loc=loc,
                reason=f"{what}: the size of its result [{', '.join(map(str, v.shape))}] "
                       "depends on the values of its input, not only on its shape",
                hint="fexplore compiles programs whose shapes follow from the input shapes; "
                     "write it densely: torch.where(mask, x, 0) instead of x[mask], "
                     "F.one_hot(x, n).sum(0) or torch.histc instead of bincount, every expert "
                     "on every token weighted by its routing weight (or scatter/index_add into "
                     "fixed-capacity slots) instead of each expert's tokens from "
                     "torch.where(mask)")


# ops whose converter takes an argument read from a tensor's contents at run time
# (``convert.movement.read_position``): a slice of a static length from such a position, and
# the one element (row, ...) at it
_TAKE_VALUES_READ_FROM_DATA = ("aten.slice.Tensor", "aten.slice_copy.Tensor", "aten.select.int",
                               "aten.select_copy.int")


def _refuse_values_read_from_data(n, target: str, loc) -> None:
    """An argument torch names with an unbacked symbol (``u0``) was read from a tensor's contents
    (``.item()``): the value is only known when the program runs. A converter that cannot take
    it at run time would be handed torch's placeholder for it (a slice from ``u0`` read as from
    0), so such an op is refused here, by name and line."""
    if target.startswith(_TAKE_VALUES_READ_FROM_DATA):
        return
    for a in pytree.tree_leaves((n.args, n.kwargs)):
        v = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        if isinstance(v, torch.SymInt) and free_unbacked_symbols(v):
            raise UnsupportedOperatorError(
                target, loc=loc,
                reason=f"an argument of it ({a.name}) is a value read from a tensor's contents "
                       "(.item(), int(t)): the compiled program would fix it at the example's",
                hint="keep the value a tensor and compute with it (torch.gather or index_select "
                     "at positions made from it, a mask from a comparison with arange), or pass "
                     "it as a Python int when it does not change between calls")


def op_key(target) -> str:
    """The registry key of an FX call target: ``aten.add.Tensor``, ``mylib.foo.default``,
    ``higher_order.cond``."""
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    return str(target)


def _map(x, env):
    if isinstance(x, torch.fx.Node):
        return env[x.name]
    if isinstance(x, (list, tuple)):
        return type(x)(_map(a, env) for a in x)
    if isinstance(x, dict):
        return {k: _map(v, env) for k, v in x.items()}
    return x


def _same_type(got: TensorType, want: TensorType, fake: torch.Tensor, symbols: SymbolTable) -> bool:
    """The converter's type equals torch's: the same dtype and layout, and each dim equal
    symbolically or by a fact torch's guards pin (a dim torch keeps as an expression that the
    program only runs with at one size). A dim torch cannot prove equal is a mismatch."""
    if got.same_as(want):
        return True
    return (got.dtype == want.dtype and got.layout == want.layout and got.rank == want.rank
            and all(dims_equal(g, w) or _pinned_equal(g, w, d, symbols)
                    for g, w, d in zip(got.shape, want.shape, _torch_dims(fake))))


def _pinned_equal(got, want, torch_dim, symbols: SymbolTable) -> bool:
    """A static dim on one side and an expression on the other that torch's guards pin to it,
    or two expressions they make equal (a pinned slice's length inside a concatenation's,
    ``s + 1`` for torch's ``s + floor(s/3 + 1/3)``); the symbol is then held to the sizes where
    the guard holds."""
    if isinstance(got, int) and isinstance(want, int):
        return False
    if not isinstance(got, int) and not isinstance(want, int):
        return symbols.proves_equal(got, torch_dim) and symbols.rely_on(want - got, 0)
    size, expr = (got, want) if isinstance(got, int) else (want, got)
    return symbols.proves_equal(got, torch_dim) and symbols.rely_on(expr, size)


def _torch_dims(fake: torch.Tensor) -> tuple:
    """torch's dims of a fake result, as the IR lays it out (a complex tensor's real pairs add
    a last dim of 2)."""
    return tuple(fake.shape) + ((2,) if is_complex(fake) else ())


def _check_result(ctx: ConvertContext, result, target: str) -> None:
    """Compare what the converter built with torch's fake-tensor result: same dtype, same dims."""
    meta = ctx.meta
    pairs = []
    if isinstance(meta, torch.Tensor):
        pairs = [(result, meta)]
    elif isinstance(meta, (list, tuple)):
        pairs = [(r, m) for r, m in zip(result, meta) if r is not None and
                 isinstance(m, torch.Tensor)]
    for r, m in pairs:
        want = _fake_type(m, ctx.b.symbols)
        if not isinstance(r, Value) or not _same_type(r.type, want, m, ctx.b.symbols):
            got = r.type if isinstance(r, Value) else r
            raise IngestionError(f"converter for {target} produced {got}, torch computes {want}",
                                 loc=ctx.loc, hint="this is a bug in fexplore's converter")
