"""Bucketed sizes: a call whose size lies between declared buckets runs on the next bucket up.

NPU serving stacks compile a few static sizes (prefill lengths 128, 256, 512, ...) and pad a
request to the next one, because a schedule is made for one static size and making one per request
costs a compile. Padding changes what a model computes unless the model ignores the padded part:
a causal language model's first ``s`` positions never see the positions after them; an encoder
with an attention mask that masks the padding does not either; a mean over the sequence does. Only
the caller knows, so padding is used only on their word (``pad_safe=True``); the values padded in
are ``pad_value`` (one for all inputs, or one per input: ids pad with a token, masks with 0).

Inputs are padded at the end of every dim whose size depends on a bucketed symbol (to that dim's
size at the bucket); outputs are sliced back to their size at the call's own values. What padding
cost is shown per call size: the share of the bucketed dims that is padding, the bucket's latency
and, on request (``Schedules.padding_cost()``), the latency of a schedule made for the exact size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from fexplore.errors import ConfigError, InputError
from fexplore.ir import Graph
from fexplore.ir.types import concrete_shape, symbol


def check_buckets(graph: Graph, buckets: Mapping | None) -> dict[str, tuple[int, ...]]:
    """The declared buckets, validated against the graph's symbolic dims: ``{name: sizes}``."""
    if not buckets:
        return {}
    out = {}
    for name, sizes in buckets.items():
        if name not in graph.symbols:
            raise ConfigError(f"buckets name a dim {name!r} the model does not have",
                              hint=f"its symbolic dims are {sorted(graph.symbols) or 'none'} "
                                   "(torch.export.Dim names given in dynamic_shapes)")
        lo, hi = graph.symbols[name]
        for s in sizes:
            if s < lo or (hi is not None and s > hi):
                raise ConfigError(f"bucket {name}={s} is outside the dim's range [{lo}, {hi}]",
                                  hint="pick buckets inside the range given to torch.export.Dim")
        out[name] = tuple(sorted(set(int(s) for s in sizes)))
    return out


def next_bucket(sizes: tuple, buckets: Mapping[str, tuple[int, ...]]) -> tuple | None:
    """The sizes rounded up to the buckets (symbols without buckets keep their value); None when
    a size is over its largest bucket (it gets a schedule of its own)."""
    out = []
    for name, val in sizes:
        if name in buckets:
            up = next((b for b in buckets[name] if b >= val), None)
            if up is None:
                return None
            out.append((name, up))
        else:
            out.append((name, val))
    return tuple(out)


def pad_inputs(graph: Graph, arrays: Sequence[np.ndarray], bucket: tuple, pad_value) -> list[np.ndarray]:
    """Each input padded at the end of each dim to its size at the bucket's values."""
    values = pad_values(pad_value, len(graph.inputs))
    at = {symbol(k): v for k, v in bucket}
    out = []
    for v, a, fill in zip(graph.inputs, arrays, values):
        target = concrete_shape(v.type.shape, at)
        widths = [(0, t - n) for t, n in zip(target, a.shape)]
        if any(w < 0 for _, w in widths):   # a dim that shrinks as the symbol grows: not paddable
            raise InputError(f"input %{v.name} ({v.type}) cannot be padded to {dict(bucket)}",
                             hint="call with a bucket's size, or compile without buckets")
        out.append(np.pad(a, widths, constant_values=np.asarray(fill).astype(a.dtype)) if any(
            w for _, w in widths) else a)
    return out


def real_shapes(graph: Graph, sizes: tuple) -> list[tuple[int, ...]]:
    """The outputs' shapes at the call's own symbol values."""
    at = {symbol(k): v for k, v in sizes}
    return [concrete_shape(v.type.shape, at) for v in graph.outputs]


def unpad(outputs: Sequence[np.ndarray], shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """Each output sliced back to its real shape (the padding is at the end of each dim)."""
    return [np.ascontiguousarray(o[tuple(slice(0, n) for n in s)]) for o, s in zip(outputs, shapes)]


def padding_share(sizes: tuple, bucket: tuple) -> float:
    """The share of the bucketed dims' elements that is padding: 1 - prod(size / bucket)."""
    real = np.prod([v for _, v in sizes], dtype=np.float64)
    padded = np.prod([v for _, v in bucket], dtype=np.float64)
    return float(1.0 - real / padded) if padded else 0.0


@dataclass
class PaddedCalls:
    """Calls of one size that ran on a bucket."""

    sizes: tuple
    bucket: tuple
    share: float        # of the bucketed dims' elements, padding
    calls: int = 0


def pad_values(pad_value, n: int) -> list:
    if isinstance(pad_value, (int, float, bool, np.number)):
        return [pad_value] * n
    values = list(pad_value)
    if len(values) != n:
        raise ConfigError(f"pad_value gives {len(values)} values for a model with {n} inputs",
                          hint="one number for every input, or one per input in the model's input order")
    return values
