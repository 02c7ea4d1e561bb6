"""A plain multilayer perceptron: the smallest model in the zoo.

Mirrors the feed-forward classifiers of tutorials and the MLP heads of larger models: a stack of
``Linear`` + activation, then an output ``Linear``. It is the model to read a graph of first, since
every node maps to one line of the module.
"""

from __future__ import annotations

import torch
from torch import nn

from fexplore.errors import ConfigError

_ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}


class MLP(nn.Module):
    def __init__(self, in_features: int, hidden: int, out_features: int, layers: int,
                 activation: str = "gelu"):
        super().__init__()
        blocks: list[nn.Module] = []
        width = in_features
        for _ in range(layers):
            blocks += [nn.Linear(width, hidden), _ACTIVATIONS[activation]()]
            width = hidden
        blocks.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def mlp(*, in_features: int = 32, hidden: int = 64, out_features: int = 16, layers: int = 2,
        activation: str = "gelu", batch: int = 4, seed: int = 0) -> tuple[nn.Module, tuple]:
    """``layers`` hidden ``Linear`` + ``activation`` blocks, then an output ``Linear``.

    Returns ``(model, (x,))`` with ``x`` of shape ``(batch, in_features)``; the model is in eval mode.
    """
    if activation not in _ACTIVATIONS:
        raise ConfigError(f"unknown activation {activation!r}",
                          hint=f"use one of {sorted(_ACTIVATIONS)}")
    if layers < 0:
        raise ConfigError(f"layers must be >= 0, got {layers}")
    # fork_rng: PyTorch's default init draws from the global RNG; forking keeps the caller's
    # random state untouched while making the weights a function of ``seed`` alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MLP(in_features, hidden, out_features, layers, activation)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, in_features, generator=generator)
    return model.eval(), (x,)
