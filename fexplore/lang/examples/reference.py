"""numpy references for the example kernels (computed in f64, from the inputs as the kernel sees
them). The activation math is the IR's (`fexplore.ir.ops.elementwise`), not a second copy."""

from __future__ import annotations

import math

import numpy as np

from fexplore.ir.ops.elementwise import gelu


def _f64(*xs):
    return [np.asarray(x, dtype=np.float64) for x in xs]


def matmul(a, b):
    a, b = _f64(a, b)
    return a @ b


def matmul_bias_gelu(a, b, bias):
    a, b, bias = _f64(a, b, bias)
    return gelu(a @ b + bias)


def matmul_residual(a, b, bias, residual):
    a, b, bias, residual = _f64(a, b, bias, residual)
    return residual + (a @ b + bias)


def layer_norm_matmul(x, gamma, beta, b, eps=1e-5):
    (b,) = _f64(b)
    return layer_norm(x, gamma, beta, eps) @ b


def softmax(x):
    (x,) = _f64(x)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm(x, gamma, beta, eps=1e-5):
    x, gamma, beta = _f64(x, gamma, beta)
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def rms_norm(x, w, eps=1e-6):
    x, w = _f64(x, w)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def flash_attention(q, k, v, scale=None):
    q, k, v = _f64(q, k, v)
    scale = scale or 1.0 / math.sqrt(q.shape[-1])
    return softmax(np.einsum("hsd,htd->hst", q, k) * scale) @ v


def conv2d(x, w):
    x, w = _f64(x, w)
    B, H, W, C = x.shape
    KH, KW, _, O = w.shape
    P, Q = H - KH + 1, W - KW + 1
    out = np.zeros((B, P, Q, O))
    for kh in range(KH):
        for kw in range(KW):
            out += np.einsum("bpqc,co->bpqo", x[:, kh:kh + P, kw:kw + Q, :], w[kh, kw])
    return out
