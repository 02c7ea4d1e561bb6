"""Golden IR text for every rewrite rule of the graph stages, each paired with a numeric check:
the input graph and the rewritten graph, run by the interpreter on random inputs, agree. A pretty
but wrong rewrite fails here.

The expected texts were produced by the stages and read line by line when they were written;
regenerate them only after checking the new text by eye."""

import numpy as np
import pytest

import fexplore
from fexplore import ir
from fexplore.pipeline.options import CompileOptions
from fexplore.pipeline.stages import fold, fusion, layout, precision, simplify

STAGES = {"fold": fold, "simplify": simplify, "layout": layout, "fusion": fusion,
          "precision": precision}

CASES = {}

CASES['fold-constant'] = dict(
    stage='fold', options={}, rules=['fold-constant'],
    before="""\
graph @g(%x: f32[2, 3]) {
  const %w: f32[3, 2] = dense [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
  %wt: f32[2, 3] = permute(%w) {perm=[1, 0]}
  %y: f32[2, 3] = mul(%x, %wt)
  return %y
}
""",
    after="""\
graph @g(%x: f32[2, 3]) {
  const %wt: f32[2, 3] = dense [1.0, 3.0, 5.0, 2.0, 4.0, 6.0]
  %y: f32[2, 3] = mul(%x, %wt)
  return %y
}
""")

CASES['fold-conv-batchnorm'] = dict(
    stage='fold', options={}, rules=['fold-conv-batchnorm'],
    before="""\
graph @g(%x: f32[1, 1, 3, 3]) {
  const %w: f32[2, 1, 1, 1] = dense [0.5, -2.0]
  const %gamma: f32[2] = dense [1.5, 0.25]
  const %beta: f32[2] = dense [0.1, -0.3]
  const %mean: f32[2] = dense [0.2, 1.0]
  const %var: f32[2] = dense [4.0, 0.5]
  %c: f32[1, 2, 3, 3] = conv2d(%x, %w) {dilation=[1, 1], groups=1, out_dtype=none, padding=[0, 0], stride=[1, 1]}
  %y: f32[1, 2, 3, 3] = batch_norm(%c, %gamma, %beta, %mean, %var) {eps=1e-05}
  return %y
}
""",
    after="""\
graph @g(%x: f32[1, 1, 3, 3]) {
  const %y.weight: f32[2, 1, 1, 1] = dense [0.37499952, -0.70709974]
  const %y.bias: f32[2] = dense [-0.049999814, -0.65354985]
  %y: f32[1, 2, 3, 3] = conv2d(%x, %y.weight, %y.bias)
  return %y
}
""")

CASES['simplify-where-constant-condition'] = dict(
    stage='simplify', options={}, rules=['broadcast-in-the-op', 'pick-where-branch-of-a-constant-condition'],
    before="""\
graph @g(%x: f32[2, 3], %y: f32[3]) {
  const %yes: bool[] = dense true
  const %no: bool[1, 3] = dense [false, false, false]
  %a: f32[2, 3] = where(%yes, %y, %x)
  %b: f32[2, 3] = where(%no, %y, %x)
  %c: f32[2, 3] = add(%a, %b)
  return %c, %a
}
""",
    after="""\
graph @g(%x: f32[2, 3], %y: f32[3]) {
  %a: f32[2, 3] = expand(%y) {shape=[2, 3]}
  %c: f32[2, 3] = add(%y, %x)
  return %c, %a
}
""")

CASES['simplify-all'] = dict(
    stage='simplify', options={}, rules=['cancel-transpose-pair', 'collapse-reshape-chain', 'cse', 'dce', 'dedupe-constant', 'drop-add-zero', 'drop-full-slice', 'drop-identity-permute', 'drop-multiply-by-one', 'drop-noop-cast', 'drop-noop-expand', 'drop-single-concat', 'drop-where-same-branches'],
    before="""\
graph @g(%x: f32[2, 3, 4]) {
  const %one: f32[] = dense 1.0
  const %zero: f32[] = dense 0.0
  const %one2: f32[] = dense 1.0
  %a: f32[6, 4] = reshape(%x) {shape=[6, 4]}
  %b: f32[24] = reshape(%a) {shape=[24]}
  %c: f32[2, 3, 4] = reshape(%b) {shape=[2, 3, 4]}
  %d: f32[4, 3, 2] = permute(%c) {perm=[2, 1, 0]}
  %e: f32[2, 3, 4] = permute(%d) {perm=[2, 1, 0]}
  %f: f32[2, 3, 4] = permute(%e) {perm=[0, 1, 2]}
  %g1: f32[2, 3, 4] = expand(%f) {shape=[2, 3, 4]}
  %h: f32[2, 3, 4] = cast(%g1) {dtype=f32}
  %i: f32[2, 3, 4] = slice(%h) {axis=1, end=3, start=0, step=1}
  %j: f32[2, 3, 4] = concat(%i) {axis=0}
  %k: f32[2, 3, 4] = mul(%j, %one)
  %l: f32[2, 3, 4] = add(%zero, %k)
  %m: f32[2, 3, 4] = exp(%l)
  %n: f32[2, 3, 4] = exp(%l)
  %o: f32[2, 3, 4] = add(%m, %n)
  %p: f32[2, 3, 4] = mul(%o, %one2)
  %unused: f32[2, 3, 4] = neg(%o)
  %q: bool[2, 3, 4] = gt(%p, %zero)
  %r: f32[2, 3, 4] = where(%q, %p, %p)
  return %r
}
""",
    after="""\
graph @g(%x: f32[2, 3, 4]) {
  %m: f32[2, 3, 4] = exp(%x)
  %o: f32[2, 3, 4] = add(%m, %m)
  return %o
}
""")

# x.view(-1, K) @ W, then a bias and a scale, unflattened and added to a residual (GPT-2's Conv1D):
# the matmul runs over x's own rows and the chain moves with it; with the heads merged into K (h)
# the rows are unflattened first; a flat result something else reads too (m2) stays as it is;
# q kᵀ over batch and heads flattened into one axis (XGLM, BLOOM), softmax and unflatten: the
# batched matmul over [B, H] and the softmax over its last axis, kᵀ a permute of k's own view
CASES['simplify-unflattened-rows'] = dict(
    stage='simplify', options={}, rules=['collapse-reshape-chain', 'contract-unflattened-rows', 'dce'],
    before="""\
graph @g(%x: f32[2, 3, 4], %h: f32[2, 3, 2, 2], %x2: f32[2, 3, 4], %r: f32[2, 3, 4], %t: f32[6, 4], %q: f32[1, 2, 3, 4], %k: f32[1, 2, 3, 4]) {
  const %w: f32[4, 4] = dense [0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8, 0.9, 1.0, -1.1, 1.2, 1.3, -1.4, 1.5, 1.6]
  const %b: f32[4] = dense [0.5, -1.0, 0.25, 2.0]
  const %half: f32[] = dense 0.5
  %xf: f32[6, 4] = reshape(%x) {shape=[6, 4]}
  %mm: f32[6, 4] = matmul(%xf, %w)
  %mb: f32[6, 4] = add(%b, %mm)
  %ms: f32[6, 4] = mul(%mb, %half)
  %y: f32[2, 3, 4] = reshape(%ms) {shape=[2, 3, 4]}
  %o: f32[2, 3, 4] = add(%y, %r)
  %hf: f32[6, 4] = reshape(%h) {shape=[6, 4]}
  %mh: f32[6, 4] = matmul(%hf, %w)
  %u: f32[2, 3, 4] = reshape(%mh) {shape=[2, 3, 4]}
  %o2: f32[2, 3, 4] = add(%u, %r)
  %x2f: f32[6, 4] = reshape(%x2) {shape=[6, 4]}
  %m2: f32[6, 4] = matmul(%x2f, %w)
  %u2: f32[2, 3, 4] = reshape(%m2) {shape=[2, 3, 4]}
  %z: f32[6, 4] = add(%m2, %t)
  %qf: f32[2, 3, 4] = reshape(%q) {shape=[2, 3, 4]}
  %kf: f32[2, 3, 4] = reshape(%k) {shape=[2, 3, 4]}
  %kt: f32[2, 4, 3] = permute(%kf) {perm=[0, 2, 1]}
  %s: f32[2, 3, 3] = matmul(%qf, %kt)
  %p: f32[2, 3, 3] = softmax(%s) {axis=-1}
  %pu: f32[1, 2, 3, 3] = reshape(%p) {shape=[1, 2, 3, 3]}
  return %o, %o2, %u2, %z, %pu
}
""",
    after="""\
graph @g(%x: f32[2, 3, 4], %h: f32[2, 3, 2, 2], %x2: f32[2, 3, 4], %r: f32[2, 3, 4], %t: f32[6, 4], %q: f32[1, 2, 3, 4], %k: f32[1, 2, 3, 4]) {
  const %w: f32[4, 4] = dense [0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8, 0.9, 1.0, -1.1, 1.2, 1.3, -1.4, 1.5, 1.6]
  const %b: f32[4] = dense [0.5, -1.0, 0.25, 2.0]
  const %half: f32[] = dense 0.5
  %mm_rows: f32[2, 3, 4] = matmul(%x, %w)
  %mb_rows: f32[2, 3, 4] = add(%b, %mm_rows)
  %y: f32[2, 3, 4] = mul(%mb_rows, %half)
  %o: f32[2, 3, 4] = add(%y, %r)
  %hf_rows: f32[2, 3, 4] = reshape(%h) {shape=[2, 3, 4]}
  %u: f32[2, 3, 4] = matmul(%hf_rows, %w)
  %o2: f32[2, 3, 4] = add(%u, %r)
  %x2f: f32[6, 4] = reshape(%x2) {shape=[6, 4]}
  %m2: f32[6, 4] = matmul(%x2f, %w)
  %u2: f32[2, 3, 4] = reshape(%m2) {shape=[2, 3, 4]}
  %z: f32[6, 4] = add(%m2, %t)
  %kt_rows: f32[1, 2, 4, 3] = permute(%k) {perm=[0, 1, 3, 2]}
  %s_rows: f32[1, 2, 3, 3] = matmul(%q, %kt_rows)
  %pu: f32[1, 2, 3, 3] = softmax(%s_rows) {axis=3}
  return %o, %o2, %u2, %z, %pu
}
""")

# q * c and k / c' before the heads are split out: the factors move into attention's scale (the
# views are re-made from the unscaled slice); a factor on v cannot, and stays
CASES['simplify-scale-into-attention'] = dict(
    stage='simplify', options={}, rules=['dce', 'fold-query-key-scale-into-attention'],
    before="""\
graph @g(%qkv: f32[1, 4, 24], %m: f32[1, 1, 4, 4]) {
  const %s: f32[] = dense 0.25
  const %two: f32[] = dense 2.0
  %q: f32[1, 4, 8] = slice(%qkv) {axis=2, end=8, start=0}
  %k: f32[1, 4, 8] = slice(%qkv) {axis=2, end=16, start=8}
  %v: f32[1, 4, 8] = slice(%qkv) {axis=2, end=24, start=16}
  %qs: f32[1, 4, 8] = mul(%q, %s)
  %qh: f32[1, 4, 2, 4] = reshape(%qs) {shape=[1, 4, 2, 4]}
  %qt: f32[1, 2, 4, 4] = permute(%qh) {perm=[0, 2, 1, 3]}
  %kh: f32[1, 4, 2, 4] = reshape(%k) {shape=[1, 4, 2, 4]}
  %kt: f32[1, 2, 4, 4] = permute(%kh) {perm=[0, 2, 1, 3]}
  %ks: f32[1, 2, 4, 4] = div(%kt, %two)
  %vh: f32[1, 4, 2, 4] = reshape(%v) {shape=[1, 4, 2, 4]}
  %vt: f32[1, 2, 4, 4] = permute(%vh) {perm=[0, 2, 1, 3]}
  %vs: f32[1, 2, 4, 4] = mul(%vt, %two)
  %o: f32[1, 2, 4, 4] = attention(%qt, %ks, %vs, %m) {scale=1.0}
  return %o
}
""",
    after="""\
graph @g(%qkv: f32[1, 4, 24], %m: f32[1, 1, 4, 4]) {
  const %two: f32[] = dense 2.0
  %q: f32[1, 4, 8] = slice(%qkv) {axis=2, end=8, start=0}
  %k: f32[1, 4, 8] = slice(%qkv) {axis=2, end=16, start=8}
  %v: f32[1, 4, 8] = slice(%qkv) {axis=2, end=24, start=16}
  %kh: f32[1, 4, 2, 4] = reshape(%k) {shape=[1, 4, 2, 4]}
  %kt: f32[1, 2, 4, 4] = permute(%kh) {perm=[0, 2, 1, 3]}
  %vh: f32[1, 4, 2, 4] = reshape(%v) {shape=[1, 4, 2, 4]}
  %vt: f32[1, 2, 4, 4] = permute(%vh) {perm=[0, 2, 1, 3]}
  %vs: f32[1, 2, 4, 4] = mul(%vt, %two)
  %qh_unscaled: f32[1, 4, 2, 4] = reshape(%q) {shape=[1, 4, 2, 4]}
  %qt_unscaled: f32[1, 2, 4, 4] = permute(%qh_unscaled) {perm=[0, 2, 1, 3]}
  %o: f32[1, 2, 4, 4] = attention(%qt_unscaled, %kt, %vs, %m) {scale=0.125}
  return %o
}
""")

# a scale per row of a (and per column of b) moves to the product; a scalar, a scale along the
# contracted axis and a scaled operand read by another op too stay where they are
CASES['simplify-scale-rows-after-the-matmul'] = dict(
    stage='simplify', options={}, rules=['cse', 'dce', 'scale-rows-after-the-matmul'],
    before="""\
graph @g(%a: f32[2, 4, 3], %b: f32[2, 3, 5], %r: f32[2, 4, 1], %c: f32[1, 5], %k: f32[1, 3]) {
  const %s: f32[] = dense 0.5
  %ar: f32[2, 4, 3] = mul(%a, %r)
  %y: f32[2, 4, 5] = matmul(%ar, %b)
  %bc: f32[2, 3, 5] = mul(%c, %b)
  %x: f32[2, 4, 5] = matmul(%a, %bc)
  %as: f32[2, 4, 3] = mul(%a, %s)
  %z: f32[2, 4, 5] = matmul(%as, %b)
  %ak: f32[2, 4, 3] = mul(%a, %k)
  %w: f32[2, 4, 5] = matmul(%ak, %b)
  %a2: f32[2, 4, 3] = mul(%r, %a)
  %v: f32[2, 4, 5] = matmul(%a2, %b)
  %u: f32[2, 4, 3] = add(%a2, %a)
  return %y, %x, %z, %w, %v, %u
}
""",
    after="""\
graph @g(%a: f32[2, 4, 3], %b: f32[2, 3, 5], %r: f32[2, 4, 1], %c: f32[1, 5], %k: f32[1, 3]) {
  const %s: f32[] = dense 0.5
  %y_unscaled: f32[2, 4, 5] = matmul(%a, %b)
  %y: f32[2, 4, 5] = mul(%y_unscaled, %r)
  %x: f32[2, 4, 5] = mul(%y_unscaled, %c)
  %as: f32[2, 4, 3] = mul(%a, %s)
  %z: f32[2, 4, 5] = matmul(%as, %b)
  %ak: f32[2, 4, 3] = mul(%a, %k)
  %w: f32[2, 4, 5] = matmul(%ak, %b)
  %a2: f32[2, 4, 3] = mul(%r, %a)
  %v: f32[2, 4, 5] = matmul(%a2, %b)
  %u: f32[2, 4, 3] = add(%a2, %a)
  return %y, %x, %z, %w, %v, %u
}
""")

# a grouped matmul of transposed matrices reads them transposed in place; a permute of another
# axis stays a permute
CASES['simplify-grouped-matrices-transposed'] = dict(
    stage='simplify', options={}, rules=['dce', 'read-grouped-matrices-transposed'],
    before="""\
graph @g(%x: f32[6, 4], %w: f32[3, 5, 4], %q: f32[4, 3, 5]) {
  const %ends: i64[3] = dense [2, 2, 5]
  %wt: f32[3, 4, 5] = permute(%w) {perm=[0, 2, 1]}
  %y: f32[6, 5] = grouped_matmul(%x, %wt, %ends)
  %qt: f32[3, 4, 5] = permute(%q) {perm=[1, 0, 2]}
  %z: f32[6, 5] = grouped_matmul(%x, %qt, %ends)
  return %y, %z
}
""",
    after="""\
graph @g(%x: f32[6, 4], %w: f32[3, 5, 4], %q: f32[4, 3, 5]) {
  const %ends: i64[3] = dense [2, 2, 5]
  %y: f32[6, 5] = grouped_matmul(%x, %w, %ends) {transpose_w=true}
  %qt: f32[3, 4, 5] = permute(%q) {perm=[1, 0, 2]}
  %z: f32[6, 5] = grouped_matmul(%x, %qt, %ends)
  return %y, %z
}
""")

# the loop of row updates over a strictly lower triangle (rows 1 and 2 of 3, as torch.export
# writes Hugging Face's delta-rule loop) is (I + A)(I + A^2) - I
CASES['simplify-forward-substitution'] = dict(
    stage='simplify', options={}, rules=['broadcast-in-the-op', 'dce', 'raise-forward-substitution'],
    before="""\
graph @g(%u: f32[2, 3, 3]) {
  const %lower: bool[3, 3] = dense [false, false, false, true, false, false, true, true, false]
  const %zero: f32[] = dense 0.0
  const %row1: bool[1, 3, 1] = dense [false, true, false]
  const %row2: bool[1, 3, 1] = dense [false, false, true]
  %t: f32[2, 3, 3] = where(%lower, %u, %zero)
  %a: f32[2, 3, 3] = neg(%t)
  %r1: f32[2, 3] = select(%a) {axis=1, index=1}
  %row_1: f32[2, 1] = slice(%r1) {axis=1, end=1, start=0}
  %top_1: f32[2, 1, 3] = slice(%a) {axis=1, end=1, start=0}
  %sub_1: f32[2, 1, 1] = slice(%top_1) {axis=2, end=1, start=0}
  %col_1: f32[2, 1, 1] = reshape(%row_1) {shape=[2, 1, 1]}
  %prod_1: f32[2, 1, 1] = mul(%col_1, %sub_1)
  %sum_1: f32[2, 1] = sum(%prod_1) {axes=[1]}
  %new_1: f32[2, 1] = add(%row_1, %sum_1)
  %w1: f32[2, 3] = slice_scatter(%r1, %new_1) {axis=1, end=1, start=0}
  %w1r: f32[2, 1, 3] = reshape(%w1) {shape=[2, 1, 3]}
  %w1e: f32[2, 3, 3] = expand(%w1r) {shape=[2, 3, 3]}
  %a1: f32[2, 3, 3] = where(%row1, %w1e, %a)
  %r2: f32[2, 3] = select(%a1) {axis=1, index=2}
  %row_2: f32[2, 2] = slice(%r2) {axis=1, end=2, start=0}
  %top_2: f32[2, 2, 3] = slice(%a1) {axis=1, end=2, start=0}
  %sub_2: f32[2, 2, 2] = slice(%top_2) {axis=2, end=2, start=0}
  %col_2: f32[2, 2, 1] = reshape(%row_2) {shape=[2, 2, 1]}
  %prod_2: f32[2, 2, 2] = mul(%col_2, %sub_2)
  %sum_2: f32[2, 2] = sum(%prod_2) {axes=[1]}
  %new_2: f32[2, 2] = add(%row_2, %sum_2)
  %w2: f32[2, 3] = slice_scatter(%r2, %new_2) {axis=1, end=2, start=0}
  %w2r: f32[2, 1, 3] = reshape(%w2) {shape=[2, 1, 3]}
  %w2e: f32[2, 3, 3] = expand(%w2r) {shape=[2, 3, 3]}
  %a2: f32[2, 3, 3] = where(%row2, %w2e, %a1)
  return %a2
}
""",
    after="""\
graph @g(%u: f32[2, 3, 3]) {
  const %lower: bool[3, 3] = dense [false, false, false, true, false, false, true, true, false]
  const %zero: f32[] = dense 0.0
  const %eye: f32[3, 3] = dense [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
  %t: f32[2, 3, 3] = where(%lower, %u, %zero)
  %a: f32[2, 3, 3] = neg(%t)
  %a2_series: f32[2, 3, 3] = add(%a, %eye)
  %a2_pow2: f32[2, 3, 3] = matmul(%a, %a)
  %a2_term2: f32[2, 3, 3] = add(%a2_pow2, %eye)
  %a2_series.1: f32[2, 3, 3] = matmul(%a2_series, %a2_term2)
  %a2: f32[2, 3, 3] = sub(%a2_series.1, %eye)
  return %a2
}
""")

# an elementwise op broadcasts an operand itself when its others give the full shape: the expand
# in front of it goes; an expand read by a unary op, or that gives the result its shape, stays
CASES['simplify-broadcast-in-the-op'] = dict(
    stage='simplify', options={}, rules=['broadcast-in-the-op'],
    before="""\
graph @g(%s: f32[2, 3, 4], %d: f32[2, 1, 1], %m: bool[2, 3, 4]) {
  %de: f32[2, 3, 4] = expand(%d) {shape=[2, 3, 4]}
  %a: f32[2, 3, 4] = mul(%s, %de)
  %b: f32[2, 3, 4] = where(%m, %de, %s)
  %e: f32[2, 3, 4] = exp(%de)
  %c: f32[2, 3, 4] = add(%de, %d)
  return %a, %b, %e, %c
}
""",
    after="""\
graph @g(%s: f32[2, 3, 4], %d: f32[2, 1, 1], %m: bool[2, 3, 4]) {
  %de: f32[2, 3, 4] = expand(%d) {shape=[2, 3, 4]}
  %a: f32[2, 3, 4] = mul(%s, %d)
  %b: f32[2, 3, 4] = where(%m, %d, %s)
  %e: f32[2, 3, 4] = exp(%de)
  %c: f32[2, 3, 4] = add(%de, %d)
  return %a, %b, %e, %c
}
""")

# the second pool's indices are read by nothing: it becomes a plain max pool; the first one's
# are read, and it keeps them
CASES['simplify-drop-unused-pool-indices'] = dict(
    stage='simplify', options={}, rules=['drop-unused-pool-indices'],
    before="""\
graph @g(%x: f32[1, 2, 5, 5]) {
  %y: f32[1, 2, 3, 3], %where: i64[1, 2, 3, 3] = max_pool2d_with_indices(%x) {kernel=[3, 3], padding=[1, 1], stride=[2, 2]}
  %z: f32[1, 2, 2, 2], %at: i64[1, 2, 2, 2] = max_pool2d_with_indices(%y) {kernel=[2, 2], stride=[1, 1]}
  %i: f32[1, 2, 3, 3] = cast(%where) {dtype=f32}
  %s: f32[1, 2, 3, 3] = add(%y, %i)
  return %z, %s
}
""",
    after="""\
graph @g(%x: f32[1, 2, 5, 5]) {
  %y: f32[1, 2, 3, 3], %where: i64[1, 2, 3, 3] = max_pool2d_with_indices(%x) {kernel=[3, 3], padding=[1, 1], stride=[2, 2]}
  %z: f32[1, 2, 2, 2] = max_pool2d(%y) {kernel=[2, 2], stride=[1, 1]}
  %i: f32[1, 2, 3, 3] = cast(%where) {dtype=f32}
  %s: f32[1, 2, 3, 3] = add(%y, %i)
  return %z, %s
}
""")

CASES['layout'] = dict(
    stage='layout', options={}, rules=['insert-relayout'],
    before="""\
graph @g(%x: f32[1, 2, 4, 4]) {
  const %w1: f32[2, 2, 1, 1] = dense [1.0, 0.5, -0.5, 2.0]
  const %w2: f32[2, 2, 1, 1] = dense [0.25, -1.0, 1.5, 0.75]
  %c1: f32[1, 2, 4, 4] = conv2d(%x, %w1) {dilation=[1, 1], groups=1, out_dtype=none, padding=[0, 0], stride=[1, 1]}
  %r1: f32[1, 2, 4, 4] = relu(%c1)
  %c2: f32[1, 2, 4, 4] = conv2d(%r1, %w2) {dilation=[1, 1], groups=1, out_dtype=none, padding=[0, 0], stride=[1, 1]}
  %s: f32[1, 2, 4, 4] = add(%c2, %r1)
  %f: f32[1, 32] = reshape(%s) {shape=[1, 32]}
  return %f
}
""",
    after="""\
graph @g(%x: f32[1, 2, 4, 4]) {
  const %w1.nhwc: f32[2, 2, 1, 1]{0,2,3,1} = dense [1.0, 0.5, -0.5, 2.0]
  const %w2.nhwc: f32[2, 2, 1, 1]{0,2,3,1} = dense [0.25, -1.0, 1.5, 0.75]
  %x.nhwc: f32[1, 2, 4, 4]{0,2,3,1} = relayout(%x) {order=[0, 2, 3, 1]}
  %c1: f32[1, 2, 4, 4]{0,2,3,1} = conv2d(%x.nhwc, %w1.nhwc)
  %r1: f32[1, 2, 4, 4]{0,2,3,1} = relu(%c1)
  %c2: f32[1, 2, 4, 4]{0,2,3,1} = conv2d(%r1, %w2.nhwc)
  %s: f32[1, 2, 4, 4]{0,2,3,1} = add(%c2, %r1)
  %s.rowmajor: f32[1, 2, 4, 4] = relayout(%s) {order=[0, 1, 2, 3]}
  %f: f32[1, 32] = reshape(%s.rowmajor) {shape=[1, 32]}
  return %f
}
""")

CASES['fusion'] = dict(
    stage='fusion', options={}, rules=['fuse-attention', 'fuse-contraction', 'fuse-elementwise', 'fuse-norm'],
    before="""\
graph @g(%x: f32[4, 4], %q: f32[1, 2, 4, 4], %k: f32[1, 2, 4, 4], %v: f32[1, 2, 4, 4]) {
  const %w: f32[4, 4] = dense [0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8, 0.9, 1.0, -1.1, 1.2, 1.3, -1.4, 1.5, 1.6]
  const %g: f32[4] = dense [1.0, 0.5, 2.0, 1.5]
  %h: f32[4, 4] = linear(%x, %w) {out_dtype=none}
  %a: f32[4, 4] = gelu(%h) {approximate="none"}
  %n: f32[4, 4] = layer_norm(%a, %g) {eps=1e-05, ndim=1}
  %kt: f32[1, 2, 4, 4] = permute(%k) {perm=[0, 1, 3, 2]}
  %s: f32[1, 2, 4, 4] = matmul(%q, %kt) {out_dtype=none}
  %sc: f32[1, 2, 4, 4] = mul(%s, %s)
  %p: f32[1, 2, 4, 4] = softmax(%sc) {axis=-1}
  %o: f32[1, 2, 4, 4] = matmul(%p, %v) {out_dtype=none}
  %e1: f32[4, 4] = exp(%n)
  %e2: f32[4, 4] = tanh(%e1)
  %t1: f32[4, 4] = sigmoid(%x)
  %t2: f32[4, 4] = mul(%t1, %x)
  return %e2, %o, %t2
}
""",
    after="""\
graph @g(%x: f32[4, 4], %q: f32[1, 2, 4, 4], %k: f32[1, 2, 4, 4], %v: f32[1, 2, 4, 4]) {
  const %w: f32[4, 4] = dense [0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8, 0.9, 1.0, -1.1, 1.2, 1.3, -1.4, 1.5, 1.6]
  const %g: f32[4] = dense [1.0, 0.5, 2.0, 1.5]
  %a: f32[4, 4] = region(%x, %w) {kind="contraction"} {
    graph @contraction_h(%x: f32[4, 4], %w: f32[4, 4]) {
      %h: f32[4, 4] = linear(%x, %w)
      %a: f32[4, 4] = gelu(%h)
      return %a
    }
  }
  %e2: f32[4, 4] = region(%a, %g) {kind="norm"} {
    graph @norm_n(%a: f32[4, 4], %g: f32[4]) {
      %n: f32[4, 4] = layer_norm(%a, %g)
      %e1: f32[4, 4] = exp(%n)
      %e2: f32[4, 4] = tanh(%e1)
      return %e2
    }
  }
  %o: f32[1, 2, 4, 4] = region(%k, %q, %v) {kind="attention"} {
    graph @attention_p(%k: f32[1, 2, 4, 4], %q: f32[1, 2, 4, 4], %v: f32[1, 2, 4, 4]) {
      %kt: f32[1, 2, 4, 4] = permute(%k) {perm=[0, 1, 3, 2]}
      %s: f32[1, 2, 4, 4] = matmul(%q, %kt)
      %sc: f32[1, 2, 4, 4] = mul(%s, %s)
      %p: f32[1, 2, 4, 4] = softmax(%sc) {axis=-1}
      %o: f32[1, 2, 4, 4] = matmul(%p, %v)
      return %o
    }
  }
  %t2: f32[4, 4] = region(%x) {kind="elementwise"} {
    graph @elementwise_t1(%x: f32[4, 4]) {
      %t1: f32[4, 4] = sigmoid(%x)
      %t2: f32[4, 4] = mul(%t1, %x)
      return %t2
    }
  }
  return %e2, %o, %t2
}
""")

CASES['precision-bf16'] = dict(
    stage='precision', options={'precision': 'bf16'}, rules=['narrow-to-bf16'],
    before="""\
graph @g(%x: f32[2, 4]) {
  const %w: f32[3, 4] = dense [0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8, 0.9, 1.0, -1.1, 1.2]
  const %b: f32[3] = dense [0.5, -0.5, 0.25]
  %y: f32[2, 3] = linear(%x, %w, %b) {out_dtype=none}
  %z: f32[2, 3] = relu(%y)
  return %z
}
""",
    after="""\
graph @g(%x: f32[2, 4]) {
  const %b: f32[3] = dense [0.5, -0.5, 0.25]
  const %w.bf16: bf16[3, 4] = dense [0.100097656, -0.20019531, 0.30078125, 0.40039062, -0.5, 0.6015625, 0.69921875, -0.80078125, 0.8984375, 1.0, -1.1015625, 1.203125]
  %x.bf16: bf16[2, 4] = cast(%x) {dtype=bf16}
  %y: f32[2, 3] = linear(%x.bf16, %w.bf16, %b) {out_dtype=f32}
  %z: f32[2, 3] = relu(%y)
  return %z
}
""")


# A row-wise result read both ways (a norm whose rows the residual reads in f32 and a projection in
# bf16) is written both ways by its kernel: the narrow copy is one more result of the norm's region,
# not a cast kernel reading the f32 rows back. A norm left outside any region becomes a region of
# itself and the cast.
CASES['precision-bf16-narrow-copy-at-producer'] = dict(
    stage='precision', options={'precision': 'bf16'}, rules=['narrow-copy-at-producer-bf16', 'narrow-to-bf16'],
    before="""\
graph @g(%x: f32[2, 4], %r: f32[2, 4]) {
  const %g: f32[4] = dense [1.1, 0.9, 1.2, 0.8]
  const %w: f32[3, 4] = dense [0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8, 0.9, 1.0, -1.1, 1.2]
  %s: f32[2, 4], %n: f32[2, 4] = region(%x, %r, %g) {kind="norm"} {
    graph @norm_n(%x: f32[2, 4], %r: f32[2, 4], %g: f32[4]) {
      %s: f32[2, 4] = add(%x, %r)
      %n: f32[2, 4] = rms_norm(%s, %g) {eps=1e-06}
      return %s, %n
    }
  }
  %p: f32[2, 3] = linear(%n, %w)
  %m: f32[2, 4] = layer_norm(%n)
  %q: f32[2, 3] = linear(%m, %w)
  %y: f32[2, 4] = add(%n, %m)
  return %p, %q, %y
}
""",
    after="""\
graph @g(%x: f32[2, 4], %r: f32[2, 4]) {
  const %g: f32[4] = dense [1.1, 0.9, 1.2, 0.8]
  const %w.bf16: bf16[3, 4] = dense [0.100097656, -0.20019531, 0.30078125, 0.40039062, -0.5, 0.6015625, 0.69921875, -0.80078125, 0.8984375, 1.0, -1.1015625, 1.203125]
  %s: f32[2, 4], %n: f32[2, 4], %n.bf16: bf16[2, 4] = region(%x, %r, %g) {kind="norm"} {
    graph @norm_n(%x: f32[2, 4], %r: f32[2, 4], %g: f32[4]) {
      %s: f32[2, 4] = add(%x, %r)
      %n: f32[2, 4] = rms_norm(%s, %g) {eps=1e-06}
      %n.bf16: bf16[2, 4] = cast(%n) {dtype=bf16}
      return %s, %n, %n.bf16
    }
  }
  %p: f32[2, 3] = linear(%n.bf16, %w.bf16) {out_dtype=f32}
  %m: f32[2, 4], %m.bf16: bf16[2, 4] = region(%n) {kind="norm"} {
    graph @norm_m(%n: f32[2, 4]) {
      %m: f32[2, 4] = layer_norm(%n)
      %m.bf16: bf16[2, 4] = cast(%m) {dtype=bf16}
      return %m, %m.bf16
    }
  }
  %q: f32[2, 3] = linear(%m.bf16, %w.bf16) {out_dtype=f32}
  %y: f32[2, 4] = add(%n, %m)
  return %p, %q, %y
}
""")


# A region's result that its only consumer casts to bf16 on entry is cast in its producer instead:
# half the bytes between the two kernels, and the consumer no longer casts each re-read tile.
CASES['precision-bf16-narrow-at-producer'] = dict(
    stage='precision', options={'precision': 'bf16'}, rules=['narrow-at-producer-bf16', 'narrow-to-bf16'],
    before="""\
graph @g(%x: f32[2, 4]) {
  const %w1: f32[3, 4] = dense [0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8, 0.9, 1.0, -1.1, 1.2]
  const %w2: f32[4, 3] = dense [0.3, -0.1, 0.2, 0.5, 0.4, -0.6, -0.7, 0.8, 0.1, 0.2, -0.3, 0.9]
  %a: f32[2, 3] = region(%x, %w1) {kind="contraction"} {
    graph @contraction_h(%x: f32[2, 4], %w1: f32[3, 4]) {
      %h: f32[2, 3] = linear(%x, %w1)
      %a: f32[2, 3] = gelu(%h)
      return %a
    }
  }
  %y: f32[2, 4] = region(%a, %w2, %x) {kind="contraction"} {
    graph @contraction_y(%a: f32[2, 3], %w2: f32[4, 3], %x: f32[2, 4]) {
      %l: f32[2, 4] = linear(%a, %w2)
      %y: f32[2, 4] = add(%l, %x)
      return %y
    }
  }
  return %y
}
""",
    after="""\
graph @g(%x: f32[2, 4]) {
  const %w1.bf16: bf16[3, 4] = dense [0.100097656, -0.20019531, 0.30078125, 0.40039062, -0.5, 0.6015625, 0.69921875, -0.80078125, 0.8984375, 1.0, -1.1015625, 1.203125]
  const %w2.bf16: bf16[4, 3] = dense [0.30078125, -0.100097656, 0.20019531, 0.5, 0.40039062, -0.6015625, -0.69921875, 0.80078125, 0.100097656, 0.20019531, -0.30078125, 0.8984375]
  %a: bf16[2, 3] = region(%x, %w1.bf16) {kind="contraction"} {
    graph @contraction_h(%x: f32[2, 4], %w1.bf16: bf16[3, 4]) {
      %x.bf16: bf16[2, 4] = cast(%x) {dtype=bf16}
      %h: f32[2, 3] = linear(%x.bf16, %w1.bf16) {out_dtype=f32}
      %a.wide: f32[2, 3] = gelu(%h)
      %a: bf16[2, 3] = cast(%a.wide) {dtype=bf16}
      return %a
    }
  }
  %y: f32[2, 4] = region(%a, %w2.bf16, %x) {kind="contraction"} {
    graph @contraction_y(%a: bf16[2, 3], %w2.bf16: bf16[4, 3], %x: f32[2, 4]) {
      %l: f32[2, 4] = linear(%a, %w2.bf16) {out_dtype=f32}
      %y: f32[2, 4] = add(%l, %x)
      return %y
    }
  }
  return %y
}
""")


# A batch norm no convolution absorbs (inference statistics) is a per-channel scale and shift.
CASES['fold-batchnorm-as-scale-shift'] = dict(
    stage='fold', options={}, rules=['batchnorm-as-scale-shift'],
    before="""\
graph @g(%x: f32[1, 2, 2, 2]) {
  const %w: f32[2] = dense [1.5, -1.0]
  const %b: f32[2] = dense [0.0, 0.25]
  const %mean: f32[2] = dense [0.5, -0.25]
  const %var: f32[2] = dense [2.0, 0.5]
  %y: f32[1, 2, 2, 2] = batch_norm(%x, %w, %b, %mean, %var) {eps=1e-05}
  %z: f32[1, 2, 2, 2] = relu(%y)
  return %z
}
""",
    after="""\
graph @g(%x: f32[1, 2, 2, 2]) {
  const %y.scale: f32[2, 1, 1] = dense [1.0606575, -1.4141995]
  const %y.shift: f32[2, 1, 1] = dense [-0.53032875, -0.10354985]
  %y_scaled: f32[1, 2, 2, 2] = mul(%x, %y.scale)
  %y: f32[1, 2, 2, 2] = add(%y_scaled, %y.shift)
  %z: f32[1, 2, 2, 2] = relu(%y)
  return %z
}
""")

# A max pool between two convolutions that narrows nothing itself: its consumer's cast moves in
# front of it (a max commutes with rounding), and from there into the region that makes its input.
CASES['precision-bf16-narrow-through-max-pool'] = dict(
    stage='precision', options={'precision': 'bf16'},
    rules=['narrow-at-producer-bf16', 'narrow-through-max_pool2d-bf16', 'narrow-to-bf16'],
    before="""\
graph @g(%x: f32[1, 2, 4, 4]) {
  const %w1: f32[3, 2, 1, 1] = dense [0.1, -0.2, 0.3, 0.4, -0.5, 0.6]
  const %w2: f32[2, 3, 1, 1] = dense [0.3, -0.1, 0.2, 0.5, 0.4, -0.6]
  %a: f32[1, 3, 4, 4] = region(%x, %w1) {kind="contraction"} {
    graph @contraction_a(%x: f32[1, 2, 4, 4], %w1: f32[3, 2, 1, 1]) {
      %c: f32[1, 3, 4, 4] = conv2d(%x, %w1)
      %a: f32[1, 3, 4, 4] = relu(%c)
      return %a
    }
  }
  %m: f32[1, 3, 2, 2] = max_pool2d(%a) {kernel=[2, 2], stride=[2, 2]}
  %y: f32[1, 2, 2, 2] = conv2d(%m, %w2)
  return %y
}
""",
    after="""\
graph @g(%x: f32[1, 2, 4, 4]) {
  const %w1.bf16: bf16[3, 2, 1, 1] = dense [0.100097656, -0.20019531, 0.30078125, 0.40039062, -0.5, 0.6015625]
  const %w2.bf16: bf16[2, 3, 1, 1] = dense [0.30078125, -0.100097656, 0.20019531, 0.5, 0.40039062, -0.6015625]
  %a: bf16[1, 3, 4, 4] = region(%x, %w1.bf16) {kind="contraction"} {
    graph @contraction_a(%x: f32[1, 2, 4, 4], %w1.bf16: bf16[3, 2, 1, 1]) {
      %x.bf16: bf16[1, 2, 4, 4] = cast(%x) {dtype=bf16}
      %c: f32[1, 3, 4, 4] = conv2d(%x.bf16, %w1.bf16) {out_dtype=f32}
      %a.wide: f32[1, 3, 4, 4] = relu(%c)
      %a: bf16[1, 3, 4, 4] = cast(%a.wide) {dtype=bf16}
      return %a
    }
  }
  %m: bf16[1, 3, 2, 2] = max_pool2d(%a) {kernel=[2, 2], stride=[2, 2]}
  %y: f32[1, 2, 2, 2] = conv2d(%m, %w2.bf16) {out_dtype=f32}
  return %y
}
""")


def test_narrowing_through_a_max_pool_changes_no_value_and_stops_at_a_wide_reader():
    """The max pool on narrowed inputs computes exactly what the narrowed max pool did; a pool
    result also returned in f32 keeps the pool wide."""
    from fexplore.pipeline.stages.precision import _Policy, narrow_through_exact_ops
    case = CASES['precision-bf16-narrow-through-max-pool']
    before = ir.parse(case["before"])
    policy = _Policy(ir.DType.bf16).apply(before, top=True)
    moved, rewrites = narrow_through_exact_ops(policy, ir.DType.bf16)
    assert [r.rule for r in rewrites] == ["narrow-through-max_pool2d-bf16"]
    _assert_same_values(before, moved, policy)
    wide = ir.parse(case["before"].replace("  return %y\n}", "  return %y, %m\n}"))
    kept, rewrites = narrow_through_exact_ops(_Policy(ir.DType.bf16).apply(wide, top=True), ir.DType.bf16)
    assert rewrites == [] and "max_pool2d(%a)" in str(kept) and "%m: f32" in str(kept)


def test_narrowing_through_a_relu_in_channels_last_keeps_the_layout():
    """A relu between two convolutions runs in their channels-last layout; the cast that narrows
    its input in front of it computes in that layout too (a row-major one would be invalid IR),
    while its input, read again wide by the residual add, stays f32. Found in DPT's fusion
    blocks. Straight on the first convolution, the relu is that convolution's epilogue, which
    writes its result both wide (for the add) and narrow (for the second convolution), both in
    the channels-last layout; behind a pool it is a kernel of its own with the cast in front."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self, pool):
            super().__init__()
            self.a = torch.nn.Conv2d(8, 8, 3, padding=1)
            self.b = torch.nn.Conv2d(8, 8, 3, padding=1)
            self.pool = pool

        def forward(self, x):
            y = self.a(x)
            y = torch.nn.functional.max_pool2d(y, 3, 1, 1) if self.pool else y
            return self.b(torch.relu(y)) + y

    torch.manual_seed(0)
    x = torch.randn(1, 8, 4, 4)
    for pool in (True, False):
        model = Block(pool).eval()
        for target in ("rngd", "tiny"):
            cm = fexplore.compile(model, (x,), target=target, precision="bf16")
            assert bool(cm.verification["ok"].all())
            final = cm.stages[-1].after
            if pool:
                casts = [n for n in final.nodes if n.op.name == "cast" and n.outputs[0].name.endswith("_narrow")]
            else:
                (conv,) = [n for n in final.nodes if n.regions and "relu" in [m.op.name for m in n.regions[0].nodes]]
                casts = [m for m in conv.regions[0].nodes if m.op.name == "cast" and m.inputs[0].type.dtype == ir.DType.f32
                         and m.inputs[0].type.rank == 4]
                assert [v.type.dtype for v in conv.outputs] == [ir.DType.f32, ir.DType.bf16]
            assert casts and all(c.outputs[0].type.layout == c.inputs[0].type.layout is not None for c in casts)
            torch.testing.assert_close(cm(x).float(), model(x), rtol=2e-2, atol=2e-2)


def _assert_same_values(before, got_graph, want_graph):
    """Both graphs compute exactly the same values on `before`'s random inputs."""
    for seed in range(3):
        xs = _random_inputs(before, seed)
        for got, want in zip(ir.run(got_graph, xs), ir.run(want_graph, xs)):
            np.testing.assert_array_equal(got, want)


def _random_inputs(g, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(v.type.shape).astype(v.type.dtype.numpy) for v in g.inputs]


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_rewrite(name):
    case = CASES[name]
    before = ir.parse(case["before"])
    ir.verify(before)
    result = STAGES[case["stage"]](before, CompileOptions(**case["options"]))
    after = result.graph
    assert str(after) == case["after"]
    assert sorted({r.rule for r in result.rewrites}) == case["rules"]
    ir.verify(after)
    assert ir.parse(str(after)) == after
    # the numbers: the rewritten graph computes what the original does
    rtol = 1.6e-2 if case["options"].get("precision") == "bf16" else 1.3e-6
    atol = 1.6e-2 if case["options"].get("precision") == "bf16" else 1e-6
    for seed in range(3):
        xs = _random_inputs(before, seed)
        for got, want in zip(ir.run(after, xs), ir.run(before, xs)):
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    # and the stage is idempotent
    again = STAGES[case["stage"]](after, CompileOptions(**case["options"])).graph
    assert ir.graph_diff(after, again) is None


def test_narrowing_at_the_producer_changes_no_value_and_keeps_a_value_read_wide():
    """The cast moved into the producer computes exactly what it computed in the consumer; a
    result that some other op also reads in f32 stays f32."""
    from fexplore.pipeline.stages.precision import _Policy, narrow_at_producers
    case = CASES['precision-bf16-narrow-at-producer']
    before = ir.parse(case["before"])
    narrowed_in_consumer = _Policy(ir.DType.bf16).apply(before, top=True)
    moved, rewrites = narrow_at_producers(narrowed_in_consumer, ir.DType.bf16)
    assert [r.result for r in rewrites] == [("a",)]
    _assert_same_values(before, moved, narrowed_in_consumer)
    # a second reader in f32 (a relu of %a returned too): %a stays f32 and its cast stays put
    wide = ir.parse(case["before"].replace("  return %y\n}", "  %r: f32[2, 3] = relu(%a)\n  return %y, %r\n}"))
    kept, rewrites = narrow_at_producers(_Policy(ir.DType.bf16).apply(wide, top=True), ir.DType.bf16)
    assert rewrites == [] and "cast(%a)" in str(kept)
