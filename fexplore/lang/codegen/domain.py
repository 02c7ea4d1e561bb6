"""The iteration space of a kernel, and the DRAM boxes its operands are loaded from.

A region computes over a *domain*: the shape every value broadcasts into (a contraction's output,
a norm's input). The kernel loops over the domain's leading axes and keeps the last axis (or two)
whole or tiled. Leading axes merge when every operand treats them alike (all full, or all
broadcast): then a row-major operand's merged view is free, a reshape of the same DRAM bytes.
So ``x: f32[2, 17, 64] + b: f32[64]`` runs as rows ``R = 34`` of ``C = 64``, and
``x: f32[B, T, C] * s: f32[B, 1, C]`` keeps B and T apart (``s`` has one row per batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FULL, ONE, OWN = "full", "one", "own"   # an operand along a domain axis: spans it, broadcasts, or is special


def aligned(shape: tuple, rank: int) -> tuple:
    """`shape` right-aligned into `rank` axes (numpy broadcasting)."""
    return (1,) * (rank - len(shape)) + tuple(shape)


def pattern(shape: tuple, lead: tuple) -> tuple[str, ...]:
    """How an operand of domain-aligned `shape` treats each leading domain axis."""
    return tuple(FULL if s == d and d != 1 else ONE for s, d in zip(shape, lead))


@dataclass(frozen=True)
class Groups:
    """Leading domain axes merged into groups; the last group is the tiled one (rows or M)."""

    lead: tuple[int, ...]              # the leading domain sizes
    groups: tuple[tuple[int, ...], ...]   # indices of `lead` in each group (size-1 axes dropped)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(math.prod(self.lead[i] for i in g) for g in self.groups)

    def view(self, pat: tuple[str, ...]) -> tuple[int, ...]:
        """An operand's sizes over the groups, given its pattern over the leading axes."""
        return tuple(math.prod(self.lead[i] for i in g) if g[0] < len(pat) and pat[g[0]] == FULL else 1
                     for g in self.groups)


def group_axes(lead: tuple[int, ...], patterns: list[tuple[str, ...]]) -> Groups:
    """Merge neighbouring leading axes where every operand's pattern agrees (and is not OWN).
    Always at least one group (a domain of one row has a group of size 1)."""
    keep = [i for i, d in enumerate(lead) if d != 1]
    groups: list[list[int]] = []
    for i in keep:
        if groups and groups[-1][-1] == i - 1 and all(p[i] == p[i - 1] and p[i] != OWN for p in patterns):
            groups[-1].append(i)
        else:
            groups.append([i])
    if not groups:
        return Groups(tuple(lead) + (1,), ((len(lead),),))
    return Groups(tuple(lead), tuple(tuple(g) for g in groups))


def leading_broadcast(view: tuple[int, ...], sizes: tuple[int, ...]) -> int:
    """How many leading groups an operand broadcasts along (size 1 where the group is not)."""
    k = 0
    while k < len(view) and view[k] == 1 and sizes[k] != 1:
        k += 1
    return k


def trimmed(view: tuple[int, ...], tail: tuple[int, ...], sizes: tuple[int, ...]) -> tuple[int, ...]:
    """An operand's kernel shape: its group sizes then `tail`, without the leading run of
    broadcast groups, which numpy broadcasting adds back."""
    return tuple(view[leading_broadcast(view, sizes):]) + tuple(tail)
