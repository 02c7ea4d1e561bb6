"""One case on several targets and precisions from one export: the variants of a case run one
after another (pytest orders parametrized cases case-major), and each forks the case's
exploration, run through `shapes` once, at the first stage its options change
(`Exploration.fork`). A fork compiles what a fresh compile does (test_explore_fork.py)."""

from __future__ import annotations

import os

VARIANTS = [("rngd", "fp32"), ("rngd", "bf16"), ("tiny", "fp32"), ("tiny", "bf16")]
# `make test-full`: every case on every variant
FULL_MATRIX = os.environ.get("FEXPLORE_FULL_MATRIX", "") not in ("", "0")


def matrix(cases) -> list[tuple[str, str, str]]:
    """(case, target, precision) for each of `cases`: all four `VARIANTS` under `make test-full`;
    under `make test` two, on both targets and in both precisions: alternate cases take rngd fp32
    with tiny bf16, or rngd bf16 with tiny fp32, so each variant runs on half of them. The whole
    matrix doubles the time of the suites that run it, and most of what breaks on one target or
    precision breaks on its every variant."""
    pairs = [(VARIANTS[0], VARIANTS[3]), (VARIANTS[1], VARIANTS[2])]
    return [(c, t, p) for i, c in enumerate(cases)
            for t, p in (VARIANTS if FULL_MATRIX else pairs[i % 2])]


def matrix_params(cases) -> list:
    """`matrix(cases)` as pytest params, each named "case-target-precision"."""
    import pytest

    return [pytest.param(*v, id="-".join(v)) for v in matrix(cases)]


_last: dict = {}


def explored(key, explore):
    """The exploration ``explore()`` makes, run through `shapes`, kept for the next call with the
    same ``key`` (only the last key's: a case's variants are adjacent)."""
    if key not in _last:
        _last.clear()
        ex = explore()
        ex["shapes"]
        _last[key] = ex
    return _last[key]


def compile_variant(key, explore, **options):
    """``fexplore.compile`` of the case with these options, forked from its shared exploration."""
    return explored(key, explore).fork(**options).result
