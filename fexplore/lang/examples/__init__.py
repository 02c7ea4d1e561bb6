"""Example kernels, each a `fexplore.lang.Kernel`: call it on numpy arrays (interpreter) or
``.simulate(..., target="rngd")`` (cycle simulator). Their numpy references are in `reference`.

    matmul, matmul_bias_gelu        contraction + fused epilogue      (linear.py)
    matmul_residual                 ... + bias + residual add         (linear.py)
    layer_norm_matmul               layer norm prologue + contraction (linear.py)
    softmax, layer_norm, rms_norm   row-wise, DMA-bound               (normalization.py)
    flash_attention                 streaming softmax over key blocks (attention.py)
    conv2d                          a contraction over patches        (conv.py)
"""

from fexplore.lang.examples import reference
from fexplore.lang.examples.attention import flash_attention
from fexplore.lang.examples.conv import conv2d
from fexplore.lang.examples.linear import layer_norm_matmul, matmul, matmul_bias_gelu, matmul_residual
from fexplore.lang.examples.normalization import layer_norm, rms_norm, softmax

KERNELS = {k.name: k for k in (matmul, matmul_bias_gelu, matmul_residual, layer_norm_matmul, softmax, layer_norm,
                               rms_norm, flash_attention, conv2d)}
REFERENCES = {name: getattr(reference, name) for name in KERNELS}

__all__ = ["KERNELS", "REFERENCES", "conv2d", "flash_attention", "layer_norm", "layer_norm_matmul", "matmul",
           "matmul_bias_gelu", "matmul_residual", "reference", "rms_norm", "softmax"]
