"""One case on several targets and precisions from one export: the variants of a case run one
after another (pytest orders parametrized cases case-major), and each forks the case's
exploration, run through `shapes` once, at the first stage its options change
(`Exploration.fork`). A fork compiles what a fresh compile does (test_explore_fork.py)."""

from __future__ import annotations

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
