"""Ingestion's result check accepts a dim torch's guards pin, and only such a dim.

torch keeps some result sizes as expressions that the program can only run with at one value
(the last chunk of a dynamic batch broadcast against a static 2 is ``s - ceil(s/2)``, guarded
equal to 2). A converter that gives the pinned value is right; one that gives the example
input's size for a dim that really varies is a converter bug and must still raise FX403.
"""

import pytest
import torch
from torch.export import Dim

import fexplore
from fexplore.errors import InputError
from fexplore.pipeline.convert import CONVERTERS, converter
from fexplore.pipeline.ingest import IngestionError
from fexplore.pipeline.symbols import build_symbol_table


class ChunkBroadcast(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(2, 5))

    def forward(self, x):
        return torch.minimum(torch.chunk(x, 2, 0)[-1], self.w)


def test_a_dim_pinned_by_a_guard_is_accepted_and_computes_like_eager():
    model, x = ChunkBroadcast().eval(), torch.randn(4, 1)
    cm = fexplore.compile(model, (x,), dynamic_shapes=({0: Dim.AUTO},))
    for batch in (4, 5):   # the sizes whose last chunk has 2 rows
        xb = torch.randn(batch, 1)
        torch.testing.assert_close(cm(xb), model(xb))
    # the compile relies on the guard, so it refuses a batch where it fails, as torch's
    # exported program does (eager would broadcast a last chunk of 1 row)
    with pytest.raises(InputError):
        cm(torch.randn(3, 1))
    with pytest.raises(Exception, match="Guard failed"):
        torch.export.export(model, (x,), dynamic_shapes=({0: Dim.AUTO},)).module()(torch.randn(3, 1))


def test_proves_equal_only_what_the_guards_pin():
    ep = torch.export.export(ChunkBroadcast().eval(), (torch.randn(4, 1),),
                             dynamic_shapes=({0: Dim.AUTO},))
    fakes = {n.name: n.meta["val"] for n in ep.graph.nodes if "val" in n.meta}
    last_chunk, batch = fakes["minimum"].shape[0], fakes["x"].shape[0]
    assert isinstance(last_chunk, torch.SymInt) and isinstance(batch, torch.SymInt)
    table = build_symbol_table(ep, [fakes["x"]], ({0: Dim.AUTO},), ChunkBroadcast.forward)
    assert table.proves_equal(2, last_chunk)
    assert not table.proves_equal(3, last_chunk)
    assert not table.proves_equal(4, batch)   # the example size is not a fact about the batch
    assert table.proves_equal(table.dim(batch), batch)


@torch.library.custom_op("fexplore_guarded::rows", mutates_args=())
def rows(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@rows.register_fake
def _(x):
    return torch.empty_like(x)


class UsesRows(torch.nn.Module):
    def forward(self, x):
        return torch.ops.fexplore_guarded.rows(x)


def test_a_static_dim_for_a_dim_that_varies_is_still_a_converter_bug():
    @converter("fexplore_guarded.rows.default")
    def example_sized(ctx):   # bakes in the example batch: torch says the batch varies
        return ctx.emit("slice", [ctx.arg(0)], {"axis": 0, "start": 0, "end": 4})

    try:
        with pytest.raises(IngestionError) as e:
            fexplore.compile(UsesRows(), (torch.randn(4, 3),), dynamic_shapes=({0: Dim.AUTO},))
    finally:
        CONVERTERS.pop("fexplore_guarded.rows.default")
    assert e.value.code == "FX403"
    assert "produced f32[4, 3]" in str(e.value)
