"""Forking an exploration: ``ex.fork(**changed_options)`` shares the stages already run that read
none of the changed options and runs the rest. What a stage reads is its declaration
(`Stage.reads`), held here to what the stages really read; a fork must compile exactly what a
fresh compile with its options does."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
import torch.utils._pytree as pytree

import fexplore
from fexplore.errors import ConfigError
from fexplore.models import DYNAMIC_SEQ, ZOO
from fexplore.pipeline.driver import INGEST_READS, Exploration
from fexplore.pipeline.options import CompileOptions
from fexplore.pipeline.stage import Stage
from fexplore.pipeline.stages import GRAPH_STAGE_LIST

FIELDS = {f.name for f in dataclasses.fields(CompileOptions)}
_reading: list[set] = []   # the stage running now: the option fields it has read


class _Tracked(CompileOptions):
    """CompileOptions that note each field read while a stage runs (``chip`` reads ``target``)."""

    def __getattribute__(self, name):
        if name in FIELDS and _reading:
            _reading[-1].add(name)
        return super().__getattribute__(name)


def _tracking(stage: Stage, seen: dict) -> Stage:
    def run(graph, options, **kw):
        _reading.append(seen.setdefault(stage.name, set()))
        try:
            return stage.run(graph, options, **kw)
        finally:
            _reading.pop()
    return dataclasses.replace(stage, run=run)


def _compile_tracked(model, inputs, seen, **opts):
    options = _Tracked(**opts)
    stages = [_tracking(s, seen) for s in GRAPH_STAGE_LIST]
    return Exploration(model, inputs, options, stages=stages).result


def test_every_stage_reads_the_options_it_declares_and_no_other():
    """Compiles that make every stage read what it can (a dynamic dim scheduled on buckets, each
    target and precision, PE fusion) and, per stage, the fields read equal its `reads`."""
    seen: dict[str, set] = {}
    torch.manual_seed(0)
    gpt, gpt_in = ZOO["gpt"]()
    for target, precision in [("rngd", "fp32"), ("tiny", "bf16")]:
        _compile_tracked(gpt, gpt_in, seen, target=target, precision=precision)
    _compile_tracked(gpt, gpt_in, seen, target="rngd", pe_fusion=2)
    llama, (ids,) = ZOO["llama"](layers=1)
    _compile_tracked(llama, (ids,), seen, dynamic_shapes=DYNAMIC_SEQ["llama"](llama),
                     buckets={"seq": [8, 16]}, pad_safe=True)
    for stage in GRAPH_STAGE_LIST:
        assert seen[stage.name] == stage.reads, (stage.name, seen[stage.name], stage.reads)
    # what ingestion and the checks read is the driver's, not a stage's
    assert not INGEST_READS & set().union(*seen.values()) - {"dynamic_shapes"}


def _frame(cm):
    v = cm.verification.drop(columns=[c for c in cm.verification.columns if c.endswith("_s")])
    return v.reset_index(drop=True)


@pytest.mark.parametrize("target, precision", [("rngd", "bf16"), ("tiny", "fp32"), ("tiny", "bf16")])
def test_a_fork_compiles_what_a_fresh_compile_does(target, precision):
    torch.manual_seed(0)
    model, inputs = ZOO["gpt"]()
    ex = fexplore.explore(model, inputs)
    ex["fusion"]
    parent = [(r.name, r.after) for r in ex.records]

    fork = ex.fork(target=target, precision=precision)
    first = "layout" if target != "rngd" else "precision"
    assert fork.shared == fork.stage_names.index(first)
    for mine, theirs in zip(fork.records, ex.records[:fork.shared]):
        assert mine.after is theirs.after and mine.options.precision == precision
    cm = fork.result
    fresh = fexplore.compile(model, inputs, target=target, precision=precision)

    assert [str(r.after) for r in cm.stages] == [str(r.after) for r in fresh.stages]
    pd.testing.assert_frame_equal(_frame(cm), _frame(fresh))   # the policy noise re-measured
    assert cm.verification["ok"].all()
    for got, want in zip(pytree.tree_leaves(cm(*inputs)), pytree.tree_leaves(fresh(*inputs))):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert cm.simulate().cycles == fresh.simulate().cycles
    # the parent is as it was
    assert [(r.name, r.after) for r in ex.records] == parent and ex.options.precision == "fp32"
    assert ex.result.options.chip.name == "rngd"


def test_what_a_fork_shares_follows_what_it_changes():
    torch.manual_seed(0)
    model, inputs = ZOO["mlp"]()
    ex = fexplore.explore(model, inputs)
    ex.run_all(progress=False)
    assert ex.fork().shared == 9 and ex.fork(precision="fp32", target="rngd").shared == 9
    assert ex.fork(pad_safe=False).shared == 9               # read by the compiled model only
    assert ex.fork(pe_fusion=2).shared == ex.stage_names.index("lower")
    assert ex.fork(fold_limit_bytes=1 << 20).shared == 1
    assert ex.fork(target=fexplore.npu.get_target("rngd")).shared == 9   # the preset by its config
    for changes in ({"verify": False}, {"seed": 1}, {"random_input_sets": 2}):
        f = ex.fork(**changes)
        assert f.shared == 0 and f.records == []
    f = ex.fork(fold_limit_bytes=1 << 20)
    assert f.result.verification["ok"].all()
    assert "1 shared with the exploration it was forked from" in repr(f)
    # a stage of one's own that does not say what it reads is run again by every fork
    own = Stage("mine", lambda g, o: fexplore.pipeline.stage.StageResult(g))
    ex2 = Exploration(model, inputs, CompileOptions(), stages=[GRAPH_STAGE_LIST[0], own])
    ex2.run_all(progress=False)
    assert ex2.fork(precision="bf16").shared == 2   # ingest and fold


def test_a_fork_of_an_onnx_model(tmp_path):
    torch.manual_seed(0)
    model, (x,) = ZOO["mlp"]()
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=True)
    x = x.numpy()
    ex = fexplore.explore(str(path), (x,))
    ex["shapes"]
    cm = ex.fork(target="tiny").result
    fresh = fexplore.compile(str(path), (x,), target="tiny")
    assert [str(r.after) for r in cm.stages] == [str(r.after) for r in fresh.stages]
    np.testing.assert_array_equal(cm(x)[0], fresh(x)[0])


def test_fork_refuses_what_is_not_an_option():
    model, inputs = ZOO["mlp"]()
    ex = fexplore.explore(model, inputs)
    with pytest.raises(ConfigError, match="fork\\(\\) takes compile options; got colour") as info:
        ex.fork(colour="red")
    assert "precision" in info.value.hint
    with pytest.raises(ConfigError, match="unknown precision"):
        ex.fork(precision="fp16")
