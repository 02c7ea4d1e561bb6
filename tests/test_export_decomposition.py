"""Ingestion decomposes what torch.export captures with torch's core-ATen table minus the ops whose
intent the chip keeps (`INTENT_OPS`). It builds the table, and its plan of which composite-implicit
ops to override, once per state of torch's op registry.

Two paths use them, and both must give what torch's own two steps give (torch.export, then
``run_decompositions`` with a table built afresh):
- `export_model` traces once, straight to core ATen (`decomposition.export_decomposed`). Its program
  is not torch's two-step program line for line (a tied weight is two placeholders, dead ops are
  gone), so the IR ingested from it must be the IR ingested from torch's, and compute the same.
- `decompose`, what the two steps take when the one trace cannot (a model writing into a tensor it
  does not register), overrides only the CIA ops whose decomposition is not their own kernel: its
  program must be torch's, the same code and signature.
The models have intent ops, tied weights, views, casts, dynamic dims and buffers they update; the
checks run again after a new op is defined and removed."""

import copy

import torch

from fexplore.ir.printer import print_graph
from fexplore.models import DYNAMIC_SEQ, ZOO
from fexplore.pipeline.decomposition import INTENT_OPS, _overload, decompose
from fexplore.pipeline.export import export_model
from fexplore.pipeline.ingest import ingest


def _torchs_own(model, args, dynamic_shapes=None):
    """torch.export and ``run_decompositions`` with a table built afresh, nothing reused."""
    table = torch.export.default_decompositions()
    for name in INTENT_OPS:
        table.pop(_overload(name), None)
    with torch.no_grad():
        ep = torch.export.export(model, args, dynamic_shapes=dynamic_shapes, strict=False)
    return ep.run_decompositions(table)


def _targets(ep) -> list[str]:
    return [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]


def _ir(ep, model, dynamic_shapes=None) -> str:
    return print_graph(ingest(ep, dynamic_shapes=dynamic_shapes, forward=model.forward).graph)


def _assert_torchs_own(model, args, dynamic_shapes=None):
    """Both paths against torch's two steps; returns the one trace's program."""
    eager = copy.deepcopy(model)   # as the model was, before any trace or run
    torchs = _torchs_own(model, args, dynamic_shapes)
    with torch.no_grad():
        two_steps = decompose(torch.export.export(model, args, dynamic_shapes=dynamic_shapes, strict=False))
    assert two_steps.graph_module.code == torchs.graph_module.code
    assert str(two_steps.graph_signature) == str(torchs.graph_signature)
    ours = export_model(model, args, dynamic_shapes=dynamic_shapes)
    assert "aten._assert_tensor_metadata.default" not in _targets(ours)   # the one trace's, not the two steps'
    assert _ir(ours, model, dynamic_shapes) == _ir(torchs, model, dynamic_shapes)
    with torch.no_grad():
        torch.testing.assert_close(ours.module()(*args), eager(*args))
    return ours


class _Counting(torch.nn.Module):
    """Updates a buffer, reshapes, casts and slices: CIA ops decomposed by their own kernels."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        y = self.proj(x).reshape(2, -1).to(torch.float64).flatten()
        return torch.nn.functional.dropout(y[1:], 0.5, training=False).float() * self.calls


def test_the_programs_are_torchs_own():
    for name in ("gpt", "cnn", "vit", "gpt"):   # the second gpt runs on what the others left
        model, inputs = ZOO[name]()
        ours = _assert_torchs_own(model, inputs)
        assert name == "cnn" or "aten.linear.default" in _targets(ours)   # an intent op kept
    # GPT's embedding and head share one weight: the one trace reads it under both names, and
    # ingestion makes them one constant, as the two steps' program (which reads one name) does
    assert model.lm_head.weight is model.wte.weight
    placeholders = {s.target for s in ours.graph_signature.input_specs}
    assert {"wte.weight", "lm_head.weight"} <= placeholders
    graph = ingest(ours, forward=model.forward).graph
    tied = [c for c in graph.constants if c.name in ("wte.weight", "lm_head.weight")]
    assert len(tied) == 1 and tied[0].payload.shape == tuple(model.wte.weight.shape)
    model, (ids,) = ZOO["llama"](layers=1)
    _assert_torchs_own(model, (ids,), DYNAMIC_SEQ["llama"](model))
    ours = _assert_torchs_own(_Counting(), (torch.randn(4, 8),))
    assert "aten.add.Tensor" in _targets(ours) and ours.graph_signature.buffers_to_mutate


def test_an_op_defined_after_a_compile_and_removed_is_decomposed_as_a_fresh_table_does():
    export_model(*ZOO["mlp"]())   # the table and the scan are built
    lib = torch.library.Library("fexplore_export_test", "DEF")
    try:
        # a composite op: torch decomposes it into what its kernel calls
        lib.define("scaled_softplus(Tensor x) -> Tensor")
        lib.impl("scaled_softplus", lambda x: torch.nn.functional.softplus(x) * 3.0,
                 "CompositeImplicitAutograd")

        class Model(torch.nn.Module):
            def forward(self, x):
                return torch.ops.fexplore_export_test.scaled_softplus(x) + 1

        x = torch.randn(4, 8)
        ours = _assert_torchs_own(Model(), (x,))
        assert not any("scaled_softplus" in t for t in _targets(ours))
        torch.testing.assert_close(ours.module()(x), Model()(x))
    finally:
        lib._destroy()
    # and once it is gone again, the tables built while it existed are not used
    _assert_torchs_own(*ZOO["mlp"]())
