"""Ops that own subgraphs: ``region`` (a fused region or kernel call) and ``cond`` (torch.cond).

Regions are closed: everything a region body uses comes in through its inputs, so the same
printer, verifier and interpreter handle a body as a graph of its own.
"""

from __future__ import annotations

from ..opdef import AttrSpec, Category, Cost, OpDef
from ..opset import register
from ..types import DType
from .rules import TypeRuleError


def _body_types(body):
    return [v.type for v in body.outputs]


def region_type(ins, attrs, regions):
    (body,) = regions
    _check_operands(ins, body, "region")
    return _body_types(body)


def cond_type(ins, attrs, regions):
    pred, operands = ins[0], ins[1:]
    if pred.dtype != DType.bool or pred.rank != 0:
        raise TypeRuleError(f"cond: predicate must be a 0-d bool, got {pred}")
    then_g, else_g = regions
    _check_operands(operands, then_g, "cond (then)")
    _check_operands(operands, else_g, "cond (else)")
    t, e = _body_types(then_g), _body_types(else_g)
    if len(t) != len(e) or any(not a.same_as(b) for a, b in zip(t, e)):
        raise TypeRuleError(f"cond: branches return different types: {t} vs {e}")
    return t


def _check_operands(ins, body, what):
    if len(ins) != len(body.inputs):
        raise TypeRuleError(f"{what}: {len(ins)} operands for {len(body.inputs)} region inputs")
    for i, (t, v) in enumerate(zip(ins, body.inputs)):
        if not t.same_as(v.type):
            raise TypeRuleError(f"{what}: operand {i} is {t} but the region takes {v.type}")


def _run_region(inputs, attrs, regions, run_graph):
    return run_graph(regions[0], inputs)


def _run_cond(inputs, attrs, regions, run_graph):
    branch = regions[0] if bool(inputs[0]) else regions[1]
    return run_graph(branch, inputs[1:])


def _sum_of_body_costs(ins, outs, attrs):
    # The cost of a region is filled in by the passes that make regions (they know its body);
    # on its own the op moves its operands and results once.
    from ..opdef import io_bytes

    return Cost(0, io_bytes(ins, outs))


register(OpDef("region", Category.region, region_type, None, _sum_of_body_costs,
               attrs=(AttrSpec("kind", "str", "fused"),), arity=None,
               run_regions=_run_region, num_regions=1,
               doc="a fused region or kernel call owning one body graph"))
register(OpDef("cond", Category.region, cond_type, None, _sum_of_body_costs,
               arity=None, min_inputs=1, run_regions=_run_cond, num_regions=2,
               doc="torch.cond: (pred, operands...) with a then-region and an else-region"))
