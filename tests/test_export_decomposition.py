"""Ingestion decomposes what torch.export captures with torch's core-ATen table minus the ops whose
intent the chip keeps (`INTENT_OPS`). It builds the table, and its plan of which composite-implicit
ops to override, once per state of torch's op registry, and overrides only the ops whose
decomposition is not their own kernel (`decomposition.decompose`). The programs must be the ones
torch's own ``run_decompositions`` gives with a table built afresh: the same code and signature, for
models with intent ops, views, casts, dynamic dims and buffers they update, also after a new op
is defined and removed."""

import torch

from fexplore.models import DYNAMIC_SEQ, ZOO
from fexplore.pipeline.decomposition import INTENT_OPS, _overload
from fexplore.pipeline.export import export_model


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


def _assert_torchs_own(model, args, dynamic_shapes=None):
    ours = export_model(model, args, dynamic_shapes=dynamic_shapes)
    torchs = _torchs_own(model, args, dynamic_shapes)
    assert ours.graph_module.code == torchs.graph_module.code
    assert str(ours.graph_signature) == str(torchs.graph_signature)
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
