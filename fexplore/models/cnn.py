"""A small ResNet: the zoo's convolutional model.

Mirrors torchvision's ResNet-18/34 (He et al., 2015) at toy size: a conv + BatchNorm + ReLU + max-pool
stem, residual *basic* blocks (conv-bn-relu-conv-bn plus a skip connection; a 1x1 conv + BatchNorm
projects the skip when a block changes resolution or width), global average pooling and a linear
classifier. Convolutions feeding a BatchNorm have no bias, as in torchvision.
"""

from __future__ import annotations

import torch
from torch import nn

from fexplore.errors import ConfigError


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNetCNN(nn.Module):
    def __init__(self, channels: int, blocks: int, num_classes: int, in_channels: int = 3):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        # The first block keeps resolution and width; each later one halves the resolution and
        # doubles the width, so every block after the first exercises the projected skip.
        layers = []
        width = channels
        for i in range(blocks):
            out_width = width if i == 0 else width * 2
            layers.append(BasicBlock(width, out_width, stride=1 if i == 0 else 2))
            width = out_width
        self.layers = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layers(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def _randomize_batchnorm(model: nn.Module) -> None:
    """Give every BatchNorm non-trivial affine parameters and running statistics.

    Fresh BatchNorms are the identity in eval mode (mean 0, var 1, weight 1, bias 0), so a compiler
    that folds them wrongly (swaps mean and bias, forgets eps, uses var for std) would still pass.
    """
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(1.0 + 0.2 * torch.randn_like(m.weight))
                m.bias.copy_(0.2 * torch.randn_like(m.bias))
                m.running_mean.copy_(0.2 * torch.randn_like(m.running_mean))
                m.running_var.copy_(0.5 + torch.rand_like(m.running_var))


def resnet_cnn(*, channels: int = 16, blocks: int = 2, image_size: int = 32, num_classes: int = 10,
               batch: int = 2, seed: int = 0) -> tuple[nn.Module, tuple]:
    """A ResNet with ``blocks`` basic blocks over RGB images of ``image_size`` x ``image_size``.

    Returns ``(model, (images,))`` with ``images`` of shape ``(batch, 3, image_size, image_size)``;
    the output is ``(batch, num_classes)`` logits. The model is in eval mode.
    """
    if blocks < 1:
        raise ConfigError(f"blocks must be >= 1, got {blocks}")
    # stem max-pool halves once, each block after the first halves again
    if image_size < 2 ** blocks:
        raise ConfigError(f"image_size {image_size} is too small for {blocks} blocks",
                          hint=f"use image_size >= {2 ** blocks}")
    # fork_rng: default init and the BatchNorm statistics draw from the global RNG; forking keeps
    # the caller's random state untouched while making the weights a function of ``seed`` alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ResNetCNN(channels, blocks, num_classes)
        _randomize_batchnorm(model)
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, image_size, image_size, generator=generator)
    return model.eval(), (images,)
