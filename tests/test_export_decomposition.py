"""Ingestion decomposes what torch.export captures with torch's core-ATen table minus the ops whose
intent the chip keeps (`INTENT_OPS`). Its table and torch's scan for composite-implicit ops are
built once per state of torch's op registry and reused; the programs must be the ones torch's own
``run_decompositions`` gives with a freshly built table, also after a new op is defined."""

import torch

from fexplore.models import ZOO
from fexplore.pipeline.export import INTENT_OPS, _overload, export_model


def _torchs_own(model, args):
    """torch.export and ``run_decompositions`` with a table built afresh, nothing reused."""
    table = torch.export.default_decompositions()
    for name in INTENT_OPS:
        table.pop(_overload(name), None)
    with torch.no_grad():
        ep = torch.export.export(model, args, strict=False)
    return ep.run_decompositions(table)


def _targets(ep) -> list[str]:
    return [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]


def test_reused_tables_decompose_as_a_fresh_table_does():
    for name in ("gpt", "cnn", "gpt"):   # the second gpt runs on what the first two left
        model, inputs = ZOO[name]()
        ours, torchs = export_model(model, inputs), _torchs_own(model, inputs)
        assert _targets(ours) == _targets(torchs), name
        assert "aten.linear.default" in _targets(ours) or name == "cnn"   # an intent op kept


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
        ours, torchs = export_model(Model(), (x,)), _torchs_own(Model(), (x,))
        assert _targets(ours) == _targets(torchs)
        assert not any("scaled_softplus" in t for t in _targets(ours))
        torch.testing.assert_close(ours.module()(x), Model()(x))
    finally:
        lib._destroy()
    # and once it is gone again, the tables built while it existed are not used
    model, inputs = ZOO["mlp"]()
    assert _targets(export_model(model, inputs)) == _targets(_torchs_own(model, inputs))
