"""Real sizes without weights: a model's parameters on the meta device, its buffers kept.

Parameters are what a real-size model's gigabytes are; buffers are mostly structure a compiler
should see: a causal mask, a rotary table, position ids. ``torch.nn.Module.to("meta")`` drops both,
and the compile then treats a causal mask as an unknown mask (loaded and applied block by block).
``weights_on_meta`` keeps the buffers' values, as accelerate's ``init_empty_weights`` does when a
model is built; fexplore compiles such a model with its buffers as known constants.
"""

from __future__ import annotations

import torch


def weights_on_meta(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with its parameters moved to the meta device (in place, like ``.to``) and its
    buffers left where they are, values and all. Tied parameters stay tied (``.to("meta")`` makes
    one meta copy per module that holds a shared parameter)."""
    twins: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                if id(p) not in twins:
                    twins[id(p)] = torch.nn.Parameter(p.to("meta"), requires_grad=p.requires_grad)
                module._parameters[name] = twins[id(p)]
    return model
