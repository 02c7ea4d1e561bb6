"""A Vision Transformer classifier.

Mirrors ViT (Dosovitskiy et al., 2020) as written in timm's ``VisionTransformer`` and Hugging Face's
``ViTForImageClassification``: a strided ``Conv2d`` cuts the image into patch embeddings (flattened
and transposed to tokens), a learned class token is concatenated in front, a learned position
embedding is added, pre-LayerNorm encoder blocks (fused qkv, ``scaled_dot_product_attention`` without
a mask, exact-GELU MLP) follow, and a linear head reads the class token after a final LayerNorm.

``PatchEmbed`` and ``EncoderBlock`` are reused by the VLA model, as real VLAs reuse a ViT encoder.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fexplore.errors import ConfigError


class PatchEmbed(nn.Module):
    def __init__(self, patch: int, channels: int, width: int):
        super().__init__()
        self.proj = nn.Conv2d(channels, width, kernel_size=patch, stride=patch)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # (B, C, H, W) -> (B, width, H/p, W/p) -> (B, patches, width)
        return self.proj(images).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B, heads, N, head_dim)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.proj(out.transpose(1, 2).reshape(B, N, C))


class EncoderBlock(nn.Module):
    """Pre-LN transformer block; ``attn_mask`` (boolean, True = may attend) is optional."""

    def __init__(self, width: int, heads: int, mlp_ratio: int = 4):
        super().__init__()
        self.norm1 = nn.LayerNorm(width, eps=1e-6)
        self.attn = Attention(width, heads)
        self.norm2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(width, mlp_ratio * width),
            nn.GELU(),  # exact erf GELU, as ViT
            nn.Linear(mlp_ratio * width, width),
        )

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), attn_mask)
        return x + self.mlp(self.norm2(x))


def randomize_layer_norms(model: nn.Module) -> None:
    """Move LayerNorm affine parameters off (1, 0) so that dropping or misplacing them shows."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.copy_(1.0 + 0.2 * torch.randn_like(m.weight))
                m.bias.copy_(0.2 * torch.randn_like(m.bias))


class ViT(nn.Module):
    def __init__(self, image_size: int, patch: int, channels: int, width: int, layers: int,
                 heads: int, num_classes: int):
        super().__init__()
        patches = (image_size // patch) ** 2
        self.patch_embed = PatchEmbed(patch, channels, width)
        # std 0.02 as timm and HF initialize them
        self.cls_token = nn.Parameter(0.02 * torch.randn(1, 1, width))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, patches + 1, width))
        self.blocks = nn.ModuleList(EncoderBlock(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.head = nn.Linear(width, num_classes)
        randomize_layer_norms(self)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat((cls, x), dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def vit(*, image_size: int = 32, patch: int = 8, channels: int = 3, width: int = 64, layers: int = 2,
        heads: int = 4, num_classes: int = 10, batch: int = 2, seed: int = 0):
    """A ViT over ``channels`` x ``image_size`` x ``image_size`` images cut into ``patch``-sized patches.

    Returns ``(model, (images,))``; the output is ``(batch, num_classes)`` logits. The model is in
    eval mode.
    """
    if image_size % patch:
        raise ConfigError(f"image_size {image_size} is not a multiple of patch {patch}")
    if width % heads:
        raise ConfigError(f"width {width} is not divisible by heads {heads}")
    # fork_rng: default init draws from the global RNG; forking keeps the caller's random state
    # untouched while making the weights a function of ``seed`` alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ViT(image_size, patch, channels, width, layers, heads, num_classes)
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, channels, image_size, image_size, generator=generator)
    return model.eval(), (images,)
