"""Ops with no converter of their own but an ONNX function body (CenterCropPad, AffineGrid,
RotaryEmbedding...): the schema's function, instantiated for this node, stands in for it.

The onnx package defines many ops as functions of simpler ones, some depending on the node's
attributes and input types (a *context-dependent* function). The body's nodes are renamed under
a prefix unique to the node (its inputs and outputs keep the node's names) and its attribute
references take the node's attribute values; the importer then converts them as if the model
held them, each keeping the original node's provenance.
"""

from __future__ import annotations


def function_body(node, opset: int, input_types) -> tuple[list, dict] | None:
    """(the body's nodes for this node, the body's opset imports), or None when the op has no
    function at this opset."""
    import onnx
    from onnx import FunctionProto

    try:
        schema = onnx.defs.get_schema(node.op_type, opset, domain=node.domain)
    except Exception:
        return None
    fn = None
    versions = [v for v in schema.function_opset_versions if v <= opset]
    if versions:
        fn = FunctionProto()
        fn.ParseFromString(schema.get_function_with_opset_version(max(versions)))
    else:
        versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
        if not versions:
            return None
        try:
            raw = schema.get_context_dependent_function_with_opset_version(
                max(versions), node.SerializeToString(),
                [t.SerializeToString() for t in input_types])
        except Exception:
            return None
        fn = FunctionProto()
        fn.ParseFromString(raw)
    prefix = f"{node.name or node.output[0]}::{node.op_type}::"
    names = {}
    for i, formal in enumerate(fn.input):
        names[formal] = node.input[i] if i < len(node.input) else ""
    for i, formal in enumerate(fn.output):
        if i < len(node.output) and node.output[i]:
            names[formal] = node.output[i]
    attrs = {a.name: a for a in node.attribute}
    defaults = {a.name: a for a in fn.attribute_proto}

    def rename(n: str) -> str:
        return names.get(n, prefix + n if n else "")

    def rename_graph(g) -> None:
        # a branch's names are renamed the same way: its own values consistently, and the
        # function's values it reads from outside as they are outside
        for vi in list(g.input) + list(g.output):
            vi.name = rename(vi.name)
        for init in g.initializer:
            init.name = rename(init.name)
        for n in g.node:
            n.input[:] = [rename(x) for x in n.input]
            n.output[:] = [rename(x) for x in n.output]
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    rename_graph(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sg in a.graphs:
                        rename_graph(sg)

    body = []
    for inner in fn.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        copy.name = prefix + (inner.name or inner.output[0])
        del copy.input[:]
        copy.input.extend(rename(n) for n in inner.input)
        del copy.output[:]
        copy.output.extend(rename(n) for n in inner.output)
        kept = []
        for a in copy.attribute:
            if a.ref_attr_name:   # an attribute of the function: the node's value, or its default
                src = attrs.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                if src is None:
                    continue
                b = onnx.AttributeProto()
                b.CopyFrom(src)
                b.name = a.name
                kept.append(b)
            else:
                if a.type == onnx.AttributeProto.GRAPH:
                    rename_graph(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sg in a.graphs:
                        rename_graph(sg)
                kept.append(a)
        del copy.attribute[:]
        copy.attribute.extend(kept)
        body.append(copy)
    return body, {o.domain: o.version for o in fn.opset_import}
