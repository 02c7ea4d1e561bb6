"""Differential fuzzing: a seeded batch of random modules, each compiled through every stage, run
on the simulated NPU on two input sets and compared with eager, must pass or be clearly refused.
``bench/fuzz.py`` runs the long campaigns; what they found is kept in ``tests/fuzz_regressions/``.
The harness itself is tested too: it must see a wrong result, a crash and a refusal for what they
are, and its shrinker must keep a failure while making the module smaller."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from fexplore.testing import fuzz, fuzz_check, fuzz_shrink
from fexplore.testing.fuzz_check import CaseResult

BATCH_SEED = 20261201
BATCH = 50


@pytest.fixture(scope="module")
def batch():
    programs = [fuzz.generate(BATCH_SEED + i) for i in range(BATCH)]
    return programs, [fuzz_check.check(p, timeout=120) for p in programs]


def test_the_seeded_batch_passes_or_is_clearly_refused(batch):
    programs, results = batch
    bad = [(p.seed, r) for p, r in zip(programs, results) if r.outcome not in ("pass", "refused")]
    listing = "\n".join(f"seed {s}: {r.outcome} in {r.stage} [{r.code}] {r.detail}" for s, r in bad)
    assert not bad, "fuzz cases that crash or differ from eager (shrink them with " \
                    "fexplore.testing.fuzz_shrink.shrink):\n" + listing
    assert Counter(r.outcome for r in results)["pass"] >= BATCH * 3 // 4


def test_the_batch_covers_the_op_kinds_models_use(batch):
    programs, _ = batch
    used = {op.kind for p in programs for op in p.ops}
    assert {"binary", "matmul", "reduce", "view", "slice", "norm", "attention", "conv", "cast",
            "compare", "inplace", "const", "route"} <= used


def test_generation_is_deterministic_and_the_source_is_the_module():
    a, b = fuzz.generate(7), fuzz.generate(7)
    assert a == b and a.source() == b.source()
    assert fuzz.generate(8) != a
    model, inputs = a.build()
    again, inputs2 = fuzz.build_from_source(a.source(), a.seed)
    assert all(torch.equal(x, y) for x, y in zip(inputs, inputs2))
    out, out2 = model(*inputs), again(*inputs2)
    out = out if isinstance(out, tuple) else (out,)
    out2 = out2 if isinstance(out2, tuple) else (out2,)
    assert all(torch.equal(x, y) for x, y in zip(out, out2))


def test_generation_leaves_torchs_random_state_alone():
    torch.manual_seed(3)
    want = torch.rand(4)
    torch.manual_seed(3)
    fuzz.generate(11)
    assert torch.equal(torch.rand(4), want)


def test_a_program_that_does_not_run_in_eager_is_invalid():
    p = fuzz.generate(5)
    broken = fuzz.Program(p.seed, p.inputs, p.ops, ("nowhere",))
    with pytest.raises(fuzz.InvalidProgram):
        broken.source()
    assert fuzz_check.check(broken).outcome == "invalid"


# -- the harness classifies what it sees ------------------------------------------------------

class _Scaled(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x * 2, -1)


def test_a_compiled_model_that_differs_from_eager_is_wrong(monkeypatch):
    from fexplore.pipeline.compiled import CompiledModel

    real = CompiledModel.__call__
    monkeypatch.setattr(CompiledModel, "__call__", lambda self, *a: real(self, *a) * 1.01)
    x = torch.randn(3, 5)
    r = fuzz_check.check_model(_Scaled(), [x, torch.randn(3, 5)])
    assert r.outcome == "wrong" and r.stage == "run" and "example inputs" in r.detail


def test_a_stage_that_raises_is_a_crash_naming_the_stage(monkeypatch):
    import dataclasses

    from fexplore.pipeline import driver

    def broken(*a, **k):
        raise KeyError("a bug")

    stages = [dataclasses.replace(s, run=broken) if s.name == "fusion" else s
              for s in driver.GRAPH_STAGES]
    monkeypatch.setattr(driver, "GRAPH_STAGES", stages)
    r = fuzz_check.check_model(_Scaled(), [torch.randn(3, 5), torch.randn(3, 5)])
    assert r.outcome == "crash" and r.stage == "fusion" and "KeyError" in r.detail, r


def test_a_kernel_generator_that_raises_is_a_crash_though_the_host_fallback_is_right(softmax_generator_raises):
    r = fuzz_check.check_model(_Scaled(), [torch.randn(3, 5), torch.randn(3, 5)])
    assert r.outcome == "crash" and r.stage == "lower" and "codegen bug" in r.detail, r


def test_an_unsupported_op_is_a_refusal():
    class Dropout(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.dropout(x, 0.5, training=True)

    r = fuzz_check.check_model(Dropout(), [torch.randn(4), torch.randn(4)])
    assert r.outcome == "refused" and r.code in fuzz_check.REFUSAL_CODES, r


def test_a_case_over_its_time_limit_is_a_timeout(monkeypatch):
    import time

    from fexplore.pipeline.compiled import CompiledModel

    monkeypatch.setattr(CompiledModel, "__call__", lambda self, *a: time.sleep(60))
    r = fuzz_check.check_model(_Scaled(), [torch.randn(3, 5)], timeout=4)
    assert r.outcome == "timeout" and r.stage == "run", r


# -- the shrinker -----------------------------------------------------------------------------

def _fails_with_softmax(p: fuzz.Program) -> CaseResult:
    """A stand-in compiler bug: any program holding a softmax 'fails'."""
    if any(op.kind == "softmax" for op in p.ops):
        return CaseResult("wrong", "softmax differs", stage="fusion")
    return CaseResult("pass")


def test_the_shrinker_keeps_the_failure_and_drops_the_rest():
    program = next(p for p in map(fuzz.generate, range(200))
                   if len(p.ops) >= 6 and any(op.kind == "softmax" for op in p.ops))
    s = fuzz_shrink.shrink(program, check_fn=_fails_with_softmax)
    assert [op.kind for op in s.program.ops] == ["softmax"]
    assert s.result.signature == _fails_with_softmax(program).signature
    assert all(d == 1 for spec in s.program.inputs for d in spec.shape)
    assert "shrunk" in s.program.source() and "softmax" in s.program.source()


def test_the_shrinker_never_trades_one_failure_for_another():
    program = next(p for p in map(fuzz.generate, range(200))
                   if {"softmax", "unary"} <= {op.kind for op in p.ops})

    def two_bugs(p):  # softmax is one failure; a program without it fails another way
        if any(op.kind == "softmax" for op in p.ops):
            return CaseResult("wrong", "softmax differs", stage="fusion")
        return CaseResult("crash", "KeyError: other", stage="lower")

    s = fuzz_shrink.shrink(program, check_fn=two_bugs)
    assert s.result.outcome == "wrong" and any(op.kind == "softmax" for op in s.program.ops)


def test_a_shrunk_case_prints_as_a_runnable_regression_test():
    program = fuzz.generate(2)
    failure = CaseResult("crash", "KeyError: x", stage="fusion")
    text = fuzz_shrink.regression_source(program, failure, xfail="a known bug")
    assert "xfail(strict=True, reason='a known bug')" in text
    assert "crash in stage 'fusion'" in text
    scope: dict = {"__name__": "case"}
    exec(compile(text, "case.py", "exec"), scope)
    scope["test_compiles_and_matches_eager"]()  # this program compiles and equals eager


def test_a_dynamic_program_runs_at_a_second_batch_size_in_exports_range():
    from torch.export import Dim

    class Rows(torch.nn.Module):
        def forward(self, x):
            return x.softmax(-1) * torch.arange(x.shape[0], dtype=torch.float32)[:, None]

    seen = []

    def resize(n):
        seen.append(n)
        return (torch.randn(n, 5),)

    r = fuzz_check.check_model(Rows(), [(torch.randn(3, 5),), (torch.randn(3, 5),)], resize,
                               dynamic_shapes=({0: Dim.AUTO},))
    assert r.outcome == "pass" and seen == [4], (r, seen)


def test_a_compile_that_changes_the_users_model_is_a_crash(monkeypatch):
    from fexplore.pipeline import driver

    real = driver.export_model

    def meddling(model, *a, **k):
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        return real(model, *a, **k)

    monkeypatch.setattr(driver, "export_model", meddling)
    r = fuzz_check.check_model(torch.nn.Linear(4, 3), [torch.randn(2, 4), torch.randn(2, 4)])
    assert r.outcome == "crash" and "changed the user's model" in r.detail, r
