"""A small model zoo for tutorials and tests.

Every factory takes size keyword arguments with small defaults and a ``seed``, and returns
``(model, example_inputs)``: the model in eval mode, the inputs a tuple of tensors. The same seed
gives the same weights and inputs, without touching the global RNG. Every model exports with
``torch.export.export(model, inputs, strict=False)``.

``ZOO`` maps a short name to each factory. ``DYNAMIC_SEQ`` maps the language models' names to a
function of the built model returning the ``dynamic_shapes`` that make the sequence length a
``torch.export.Dim("seq", min=2, max=...)`` (``max_seq`` for llama, ``max_seq - 1`` for gpt: see
``gpt_dynamic_seq``)::

    model, inputs = ZOO["gpt"]()
    ep = torch.export.export(model, inputs, dynamic_shapes=DYNAMIC_SEQ["gpt"](model), strict=False)
"""

from __future__ import annotations

from typing import Callable

import torch

from fexplore.models.cnn import resnet_cnn
from fexplore.models.gpt import gpt
from fexplore.models.llama import llama, llama_decode_step, llama_prefill_cache
from fexplore.models.meta import weights_on_meta
from fexplore.models.mlp import mlp
from fexplore.models.vit import vit
from fexplore.models.vla import vla

ZOO: dict[str, Callable[..., tuple]] = {
    "mlp": mlp,
    "cnn": resnet_cnn,
    "gpt": gpt,
    "llama": llama,
    "llama_decode": llama_decode_step,
    "vit": vit,
    "vla": vla,
}


def _seq_dim(max_seq: int) -> tuple:
    # min=2: export specializes sizes 0 and 1, so a range starting at 1 cannot be dynamic.
    return ({1: torch.export.Dim("seq", min=2, max=max_seq)},)


def gpt_dynamic_seq(model: torch.nn.Module) -> tuple:
    """``dynamic_shapes`` for ``gpt``: ``token_ids`` dim 1 is ``seq`` in ``[2, max_seq - 1]``.

    One short of ``max_seq``, and this is a torch.export limit, not the model's: the causal mask is
    the ``[:T, :T]`` corner of a ``max_seq`` x ``max_seq`` buffer, which is a contiguous view only
    when ``T == max_seq``, so tracing any op on it guards ``T != max_seq``. With ``max=max_seq``
    export fails ("Not all values of seq ... satisfy the generated guard ... != 64");
    ``Dim.DYNAMIC`` accepts the range but the program then rejects ``T == max_seq`` at run time.
    nanoGPT and older Hugging Face GPT-2 code have the same buffer and hit the same limit.
    """
    return _seq_dim(model.config.max_seq - 1)


def llama_dynamic_seq(model: torch.nn.Module) -> tuple:
    """``dynamic_shapes`` for ``llama``: ``token_ids`` dim 1 is ``seq`` in ``[2, max_seq]`` (rotary
    tables and the causal mask are computed from ``T``, so there is no buffer to slice)."""
    return _seq_dim(model.config.max_seq)


DYNAMIC_SEQ: dict[str, Callable[[torch.nn.Module], tuple]] = {
    "gpt": gpt_dynamic_seq,
    "llama": llama_dynamic_seq,
}

__all__ = [
    "DYNAMIC_SEQ",
    "ZOO",
    "gpt",
    "gpt_dynamic_seq",
    "llama",
    "llama_decode_step",
    "llama_dynamic_seq",
    "llama_prefill_cache",
    "mlp",
    "resnet_cnn",
    "vit",
    "vla",
    "weights_on_meta",
]
