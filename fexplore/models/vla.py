"""A vision-language-action (VLA) policy: image + instruction in, a chunk of robot actions out.

Mirrors the shape of pi0 (Physical Intelligence, 2024) and of PaliGemma-based policies at toy size:
image patches (a strided conv, as SigLIP) and instruction token embeddings are concatenated into one
sequence, followed by ``action_horizon`` learned action-query tokens (as ACT and pi0's action expert
read an action chunk from dedicated tokens). A modality-type embedding (image / text / action) and a
learned position embedding are added, a pre-LN transformer runs over the sequence, and an MLP action
head regresses continuous actions ``(batch, action_horizon, action_dim)`` from the action tokens.

Attention is pi0's *block* mask: the image + text prefix attends bidirectionally within itself (a
prefix-LM, as PaliGemma), and the action tokens attend to everything while nothing in the prefix
attends to them. The mask is a constant boolean buffer passed to ``scaled_dot_product_attention``,
so the model exercises a masked SDPA, unlike the unmasked ViT and the ``is_causal`` Llama.
"""

from __future__ import annotations

import torch
from torch import nn

from fexplore.errors import ConfigError
from fexplore.models.vit import EncoderBlock, PatchEmbed, randomize_layer_norms

IMAGE, TEXT, ACTION = 0, 1, 2  # modality types


class VLA(nn.Module):
    def __init__(self, image_size: int, patch: int, vocab: int, text_len: int, width: int,
                 layers: int, heads: int, action_dim: int, action_horizon: int, channels: int = 3):
        super().__init__()
        image_tokens = (image_size // patch) ** 2
        prefix = image_tokens + text_len
        seq = prefix + action_horizon
        self.patch_embed = PatchEmbed(patch, channels, width)
        self.embed_tokens = nn.Embedding(vocab, width)
        self.action_queries = nn.Parameter(0.02 * torch.randn(1, action_horizon, width))
        self.type_embed = nn.Embedding(3, width)
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, seq, width))
        self.blocks = nn.ModuleList(EncoderBlock(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.action_head = nn.Sequential(
            nn.Linear(width, width), nn.GELU(), nn.Linear(width, action_dim),
        )
        types = torch.tensor([IMAGE] * image_tokens + [TEXT] * text_len + [ACTION] * action_horizon)
        self.register_buffer("token_types", types, persistent=False)
        # True = may attend. Prefix rows see only the prefix; action rows see everything.
        mask = torch.ones(seq, seq, dtype=torch.bool)
        mask[:prefix, prefix:] = False
        self.register_buffer("attn_mask", mask, persistent=False)
        self.action_horizon = action_horizon
        randomize_layer_norms(self)

    def forward(self, images: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        B = images.shape[0]
        image_tokens = self.patch_embed(images)
        text_tokens = self.embed_tokens(token_ids)
        queries = self.action_queries.expand(B, -1, -1)
        x = torch.cat((image_tokens, text_tokens, queries), dim=1)
        x = x + self.type_embed(self.token_types) + self.pos_embed
        for block in self.blocks:
            x = block(x, self.attn_mask)
        actions = self.norm(x[:, -self.action_horizon:])
        return self.action_head(actions)


def vla(*, image_size: int = 32, patch: int = 8, vocab: int = 128, text_len: int = 8, width: int = 64,
        layers: int = 2, heads: int = 4, action_dim: int = 7, action_horizon: int = 4, batch: int = 1,
        seed: int = 0):
    """A VLA policy. Returns ``(model, (images, token_ids))`` with float32 ``images`` of shape
    ``(batch, 3, image_size, image_size)`` and int64 ``token_ids`` of shape ``(batch, text_len)``;
    the output is ``(batch, action_horizon, action_dim)`` actions. The model is in eval mode.
    """
    if image_size % patch:
        raise ConfigError(f"image_size {image_size} is not a multiple of patch {patch}")
    if width % heads:
        raise ConfigError(f"width {width} is not divisible by heads {heads}")
    if action_horizon < 1:
        raise ConfigError(f"action_horizon must be >= 1, got {action_horizon}")
    # fork_rng: default init draws from the global RNG; forking keeps the caller's random state
    # untouched while making the weights a function of ``seed`` alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = VLA(image_size, patch, vocab, text_len, width, layers, heads, action_dim,
                    action_horizon)
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, image_size, image_size, generator=generator)
    token_ids = torch.randint(0, vocab, (batch, text_len), generator=generator)
    return model.eval(), (images, token_ids)
