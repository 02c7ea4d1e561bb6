"""Mutation testing, a quick subset (bench/mutants.py runs every mutant): representative faults
injected into the passes are caught by the check meant for them, and with no fault the same cases
pass, so the harness is not "catching" everything."""

import inspect

import pytest

from fexplore.testing.mutants import BY_NAME, MUTANTS, Patch, detect

# mutant -> (the cases to run, the check that must fire first)
REPRESENTATIVE = {
    "epilogue-op-dropped": (["mlp"], "lower check (kernels in the interpreter)"),
    "transpose-axes-swapped": (["permutes"], "numeric check of simplify"),
    "fusion-non-convex": (["scan-between"], "stage fusion raised"),
    "fold-batchnorm-without-eps": (["conv-bn"], "numeric check of fold"),
    "reduction-wrong-identity": (["reductions"], "lower check (kernels in the interpreter)"),
    "hazard-write-ignored": (["mlp"], "simulator hazard check (schedule)"),
    "sram-offset-wrong": (["mlp"], "simulator hazard check (schedule)"),
    "broadcast-axes-merged": (["broadcasts"], "lower stage: codegen bug behind the host fallback"),
    "layout-transpose-forgotten": (["conv-bn"], "structural verifier after layout"),
    "precision-weights-at-fp8": (["gpt-bf16"], "numeric check of precision"),
    "window-last-row-dropped": (["conv-bn"], "lower check (kernels in the interpreter)"),
    "streamed-weights-stale": (["streamed-linear"], "lower check (kernels in the interpreter)"),
    "qk-norm-of-one-piece": (["normed-attention"], "lower check (kernels in the interpreter)"),
    "narrow-copy-of-the-input": (["post-norm-bf16"], "numeric check of precision"),
    "fused-linear-split-same-rows": (["fused-gate-up"], "numeric check of fold"),
    "unflattened-softmax-axis-kept": (["flat-heads-attention"], "numeric check of simplify"),
    "query-scale-lost": (["flat-projections"], "numeric check of simplify"),
    "series-last-factor-dropped": (["delta-rule-chunks"], "numeric check of simplify"),
    "row-scale-squared-product": (["delta-rule-chunks"], "numeric check of simplify"),
    "split-row-statistics-short": (["long-rows@tiny"], "lower check (kernels in the interpreter)"),
    "sram-reuse-wait-missing": (["reuse-before-last-reader@tiny"], "simulator hazard check (program)"),
    "sram-reuse-wait-first-writer-only": (["resident-over-reused-sram@tiny"], "simulator hazard check (program)"),
    "update-in-place-before-a-later-reader": (["cache-updates"], "schedule check (simulator vs eager)"),
}
CASES = sorted({c for cases, _ in REPRESENTATIVE.values() for c in cases})


def test_without_a_mutant_the_cases_pass():
    out = detect(None, CASES)
    assert out.caught is None, out.caught
    assert out.cases_run == CASES


@pytest.mark.parametrize("name", sorted(REPRESENTATIVE))
def test_mutant_is_caught_by_its_check(name):
    cases, check = REPRESENTATIVE[name]
    out = detect(BY_NAME[name], cases)
    assert out.caught is not None, f"{name} survived {cases}"
    assert out.caught.check.startswith(check), out.caught


def test_every_mutant_still_applies_to_the_code():
    """Each patch's text is found exactly once: a mutant never silently becomes the original."""
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    for m in MUTANTS:
        assert m.breaks and m.description
        for p in m.patches:
            target = p.target()
            if isinstance(target, str):
                assert p.edited(target) != target
            else:
                fn, code = p.compiled()
                assert code is not fn.__code__


def test_a_mutant_is_undone_even_when_the_run_fails():
    from fexplore.lang import builtins

    original = builtins.tiles.__code__
    with pytest.raises(RuntimeError, match="boom"):
        with BY_NAME["tile-bound-off-by-one"].active():
            assert builtins.tiles.__code__ is not original
            assert builtins.tiles(10, 4)[-1] == slice(8, 9)   # the fault is live
            raise RuntimeError("boom")
    assert builtins.tiles.__code__ is original
    assert builtins.tiles(10, 4)[-1] == slice(8, 10)


def test_a_patch_whose_text_is_gone_refuses_to_apply():
    p = Patch("fexplore.lang.builtins:tiles", "text that is not in the function", "x")
    with pytest.raises(RuntimeError, match="occurs 0 times"):
        p.compiled()
    assert "text that is not in the function" not in inspect.getsource(p.target())
