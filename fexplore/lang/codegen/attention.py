"""The attention kernel: softmax(q kᵀ · scale + mask) v, streaming over key blocks with a running
max and sum (flash attention), so the score matrix never exists whole.

Composed from what the region holds: the ``attention`` op (scale, mask, grouped-query heads), or
the same written out (matmul -> elementwise score ops -> softmax -> matmul), whose score ops run on
each block of scores as `vector.VectorEmitter` lines. q, k and v are views of region inputs
(`views.ViewMap`): head splits, permutes, the split of a fused qkv projection are read straight
from the projection's output, one unit-stride box per block, with no copy.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import replace

from fexplore.ir import DType, Node
from fexplore.lang.examples.attention import _blocks, blocks_fit

from . import scores, vector
from .attention_blocks import Work, count_work, default_blocks, pe_cycles
from .common import Inputs, Signature, body_of, header, kernel_name, region_label
from .domain import aligned
from .errors import UnsupportedRegionError
from .generated import GeneratedKernel, Result
from .source import Names, Writer, cast_to, fl_dtype, literal
from .views import VIEW_OPS, ViewMap, part_start

STAGES = 2
# the running row max starts at the lowest finite f32, not -inf: a row whose keys are all masked so
# far then has exp(-inf - m) = 0 and exp(m - m_new) = 1, where -inf - -inf would be NaN, so no
# per-block guard for such rows is needed (their o and l stay 0; the division at the end keeps 0)
LOWEST = "-3.4028234663852886e+38"


def generate_attention(node: Node, cfg) -> GeneratedKernel:
    """The streaming attention kernel of region `node`. With grouped-query heads and fewer groups
    than PEs, two kernels can be written: a grid item per key head (its keys and values loaded
    once for the group's query heads, some PEs idle) or one per query head (every PE busy, each
    key and value block loaded once per query head). A decode step (one query, a long cache) is
    all loads; a short prefill is compute. Both are written and the per-PE model of
    `attention_blocks` (`pe_cycles`, over each kernel's loads and vector lines as written) keeps
    the faster."""
    kernel, modelled = _generate(node, cfg, per_query_head=False)
    if modelled is None:   # no choice to make
        return kernel
    other, other_modelled = _generate(node, cfg, per_query_head=True)
    return kernel if modelled <= other_modelled else other


def _generate(node: Node, cfg, per_query_head: bool) -> tuple[GeneratedKernel, float | None]:
    """The kernel, and its modelled cycles when its grid had a choice between items of key
    heads and items of query heads (`per_query_head`: take the latter), else None."""
    body = body_of(node)
    label = region_label(node)
    inputs = Inputs.of(node, body)
    producer = {v.name: n for n in body.nodes for v in n.outputs}
    users: dict[str, list] = {}
    for n in body.nodes:
        for x in n.inputs:
            users.setdefault(x.name, []).append(n)
    params_in = {v.name: v for v in body.inputs if v.name not in inputs.literals}
    constant = scores.constant_payload(node, inputs.index)
    score_names: set[str] = set()
    causal_mask = None   # (constant mask, how it masks) that the causal structure stands for

    def fail(n, why):
        raise UnsupportedRegionError(n.op.name if n is not None else "attention", label, why,
                                     loc=n.loc if n is not None else node.loc, node=n)

    sdpa = [n for n in body.nodes if n.op.name == "attention"]
    expanded = []   # expands of the mask, read through
    score_ops, mask, scale, swap_k, causal = [], None, None, False, False
    window = None   # a constant sliding-window mask's width (keys i - W < j <= i)
    if sdpa:
        core = sdpa[0]
        causal = core.attrs["causal"]
        q, k, v = core.inputs[:3]
        op_dt = {x.name: x.type.dtype for x in (q, k, v)}
        mask = core.inputs[3] if len(core.inputs) == 4 else None
        while mask is not None and mask.name in producer and producer[mask.name].op.name == "expand":
            # a mask broadcast to the scores: the scores read the unexpanded one, which broadcasts
            expanded.append(producer[mask.name])
            mask = expanded[-1].inputs[0]
        scale = core.attrs["scale"] if core.attrs["scale"] is not None else 1.0 / math.sqrt(q.type.shape[-1])
        if mask is not None and not causal and \
                scores.is_causal_constant(constant(mask), q.type.shape[-2], k.type.shape[-2]):
            # a constant causal triangle: the causal block structure instead, the diagonal
            # blocks' mask read from the constant
            causal_mask, mask, causal = (mask, scores.mask_how(constant(mask))), None, True
        elif mask is not None and not causal:
            # a constant sliding window: the key blocks wholly before a query block's window are
            # masked whole and skipped; the others read the mask as before
            window = scores.band_width(constant(mask), q.type.shape[-2], k.type.shape[-2])
        gqa = core.attrs["gqa"]
        result = core.outputs[0]
        core_nodes = {id(core)} | {id(n) for n in expanded}
        dts = [x.type.dtype for x in (q, k, v)]
        q, k, v = (_uncast(x, producer, core_nodes) for x in (q, k, v))
        # grouped-query heads written as Hugging Face's repeat_kv (expand, then a reshape merging
        # the copies into the head axis): read the unrepeated k and v, a query head h using
        # key head h // copies
        kr, vr = (_repeat_kv(x, producer, core_nodes) for x in (k, v))
        if kr is not None and vr is not None:
            k, v, gqa = _uncast(kr, producer, core_nodes), _uncast(vr, producer, core_nodes), True
        op_dt = {x.name: d for x, d in zip((q, k, v), dts)}
    else:
        sm = next((n for n in body.nodes if n.op.name == "softmax"), None)
        if sm is None or sm.attrs["axis"] % sm.inputs[0].type.rank != sm.inputs[0].type.rank - 1:
            fail(sm or body.nodes[0], "not an attention pattern")
        p_val = sm.outputs[0]
        m2 = users.get(p_val.name, [None])[0]
        if m2 is not None and m2.op.name == "cast":   # P in the operand dtype (the precision stage's)
            p_cast, p_val = m2, m2.outputs[0]
            m2 = users.get(p_val.name, [None])[0]
        else:
            p_cast = None
        if m2 is None or m2.op.name != "matmul" or m2.inputs[0].name != p_val.name:
            fail(sm, "a softmax not feeding a matmul")
        x, path = sm.inputs[0], []
        while x.name in producer and producer[x.name].op.name != "matmul":
            p = producer[x.name]
            if p.op.name not in vector.SAME_NAME | vector.COMPOSED:
                fail(p, "a score op that is not elementwise")
            path.insert(0, p)
            inner = [y for y in p.inputs if y.name in producer and producer[y.name].op.name not in VIEW_OPS]
            if len(inner) != 1:
                fail(p, "a score op combining two computed values")
            x = inner[0]
        if x.name not in producer:
            fail(sm, "softmax of no matmul")
        m1 = producer[x.name]
        q, k, v = m1.inputs[0], m1.inputs[1], m2.inputs[1]
        op_dt = {x.name: x.type.dtype for x in (q, k, v)}
        swap_k, gqa = True, False
        score_ops, result = path, m2.outputs[0]
        # the names the raw scores go by: the matmul's result, then a scale folded into q
        score_names = {x.name}
        scale, score_ops = scores.fold_scale(score_ops, score_names, constant)
        causal_mask = scores.causal_mask_op(score_ops, score_names, constant, *x.type.shape[-2:])
        if causal_mask:
            score_ops, causal = score_ops[:-1], True
        core_nodes = {id(m1), id(sm), id(m2)} | {id(p) for p in path} | ({id(p_cast)} if p_cast else set())
        q_dt, k_dt, v_dt = q.type.dtype, k.type.dtype, v.type.dtype
        q, k, v = (_uncast(x, producer, core_nodes) for x in (q, k, v))
        pk = producer.get(k.name)
        r = k.type.rank
        if pk is not None and pk.op.name == "permute" and \
                tuple(pk.attrs["perm"]) == tuple(range(r - 2)) + (r - 1, r - 2):   # kᵀ as a transpose of k
            core_nodes.add(id(pk))
            k, swap_k = _uncast(pk.inputs[0], producer, core_nodes), False
        kr, vr = (_repeat_kv(x, producer, core_nodes) for x in (k, v))
        if kr is not None and vr is not None:   # grouped-query heads, as in the attention op
            k, v, gqa = _uncast(kr, producer, core_nodes), _uncast(vr, producer, core_nodes), True
        op_dt = {q.name: q_dt, k.name: k_dt, v.name: v_dt}
    # the result narrowed on its way out (the precision stage's cast for a narrow consumer): the
    # kernel writes it in that dtype
    out_names = {o.name for o in body.outputs}
    narrowed = [n for n in users.get(result.name, []) if n.op.name == "cast" and n.outputs[0].name in out_names]
    if len(users.get(result.name, [])) == 1 and narrowed and result.name not in out_names:
        core_nodes.add(id(narrowed[0]))
        result = narrowed[0].outputs[0]
    exports = [o for o in body.outputs if o.name != result.name]
    for o in exports:
        if not sdpa or o.name not in (k.name, v.name):
            fail(producer.get(o.name), "the region exports values besides the attention output and its keys "
                                       "and values")
    if exports and causal and k.type.shape[-2] > q.type.shape[-2]:
        # a causal kernel skips the key blocks after the last query; exported keys or values are
        # stored from the blocks it visits, so those would never be written
        fail(producer.get(exports[0].name), "keys or values exported past the last query of a causal attention")
    k_parts, v_parts = _seq_parts(k, producer), _seq_parts(v, producer)
    cache = len(k_parts) > 1 or len(v_parts) > 1 or bool(exports)   # keys and values in parts along T
    if cache and [(a, b) for a, b, _ in k_parts] != [(a, b) for a, b, _ in v_parts]:
        fail(producer.get(k.name), "keys and values concatenated at different points")
    computed = {x.name for x in (q, k) if not _is_view(x, producer)}
    if swap_k and k.name in computed:
        fail(producer.get(k.name), "keys computed in the region and read transposed")
    if cache:
        computed = {q.name, k.name}
    qm = ViewMap.of(q, producer, params_in, fail) if q.name not in computed else None
    km = ViewMap.of(k, producer, params_in, fail) if k.name not in computed else None
    vm = ViewMap.of(v, producer, params_in, fail) if not cache else None
    if swap_k and km is not None:   # the matmul reads kᵀ: (..., D, T) -> (..., T, D)
        r = len(km.shape)
        km = ViewMap(km.source, km.shape[:-2] + (km.shape[-1], km.shape[-2]),
                     km._substitute(lambda i: (0, [(1, r - 1 if i == r - 2 else r - 2 if i == r - 1 else i)])))
    # every body node must be a view of q, k, v, a score op or the core
    seen = set(core_nodes)
    stack = [q, k, v]
    while stack:
        y = stack.pop()
        if y.name in producer and id(producer[y.name]) not in seen:
            seen.add(id(producer[y.name]))
            stack.extend(producer[y.name].inputs)
    for n in body.nodes:
        if id(n) not in seen:
            fail(n, "beside the attention (only views of q, k and v and score ops are handled)")

    q_scale, s_scale, exp_scale, additive = _place_scale(scale, score_ops, mask)
    q_shape = qm.shape if qm is not None else tuple(q.type.shape)
    k_shape = km.shape if km is not None else tuple(k.type.shape)
    *lead, S, D = q_shape
    *klead, T, Dk = k_shape
    v_shape = vm.shape if vm is not None else tuple(v.type.shape)
    Dv = v_shape[-1]
    if Dk != D or any(not isinstance(d, int) for d in q_shape + k_shape + v_shape):
        fail(q and producer.get(q.name), "q and k of different depths, or symbolic sizes")
    lead, klead = tuple(lead), aligned(tuple(klead), len(lead))
    names = Names({"qt", "kt", "vt", "s", "m", "l", "o", "p", "m_new", "ones", "alpha", "ts", "qs", "b", "h",
                   "bq", "bk", "stages", "g", "j", "tri", "key", "grid", "item", "balanced", "per", "q_of", "m_of", "l_of", "o_of", *(f"i{i}" for i in range(8))})
    fname = kernel_name(node)
    names.taken.add(fname)
    lv = [("b" if i == 0 and len(lead) > 1 else "h" if i == len(lead) - 1 else f"i{i}") for i in range(len(lead))]
    q_index = {i: (lv[i] if lead[i] != 1 else "0") for i in range(len(lead))}
    # grouped-query heads: the query heads that share a key head run in one grid item, over the
    # key heads, so each key and value block is loaded once for its group, not once per query head
    gaxes = [i for i, d in enumerate(klead) if d not in (1, lead[i])]
    group = None   # (axis, query heads per key head, key heads)
    chose = False   # whether the grid had a choice between key heads and query heads
    if gqa and len(gaxes) == 1 and aligned(tuple(v_shape[:-2]), len(lead)) == klead and \
            lead[gaxes[0]] % klead[gaxes[0]] == 0:
        group = (gaxes[0], lead[gaxes[0]] // klead[gaxes[0]], klead[gaxes[0]])
    heads = math.prod(lead) or 1
    if group:
        bq, bk = _blocks(heads // group[1], S, T, max(D, Dv), 4, cfg, STAGES, group=group[1])
        if heads // group[1] * math.ceil(S / bq) < cfg.num_pes:   # too few groups to keep every PE busy
            chose = True
            if per_query_head:
                group = None
    if not group:
        bq, bk = _blocks(heads, S, T, max(D, Dv), 4, cfg, STAGES)
    gvar = "g" if group and group[2] > 1 else "0"

    def kv_index(kl):
        out = {}
        for i, d in enumerate(kl):
            if d == lead[i] or d == 1:
                out[i] = q_index[i] if d == lead[i] else "0"
            elif group is not None and i == group[0]:
                out[i] = gvar    # the grid runs over key heads
            elif gqa and lead[i] % d == 0:
                out[i] = f"{q_index[i]} // {lead[i] // d}"    # grouped-query: heads share k and v
            else:
                fail(None, f"k and v heads {kl} do not fit q heads {lead}")
        return out

    kp = len(lead) - (len(k_shape) - 2)
    k_index = {i - kp: e for i, e in kv_index(klead).items() if i >= kp}
    vp = len(lead) - (len(v_shape) - 2)
    v_index = {i - vp: e for i, e in kv_index(aligned(tuple(v_shape[:-2]), len(lead))).items() if i >= vp}

    # parameters: each distinct region input once, with its own shape and no axis names (q, k and
    # v often share one input, whose token axis is both S and T)
    sig, pnames = Signature(names, inputs), {}

    def param(v):
        if v.name not in pnames:
            pnames[v.name] = sig.add(v, v.type.shape, [str(d) for d in v.type.shape])
        return pnames[v.name]

    def box(m, index, seq_axis, seq, depth_axis, depth):
        text, order = m.box(index, {seq_axis: (f"{seq}.start", f"{seq}.stop"), depth_axis: ("0", str(depth))})
        return f"{param(m.source)}[{text}]", order

    n_lead = len(lead)
    try:
        if qm is not None:
            q_box, q_order = box(qm, q_index, n_lead, "qs", n_lead + 1, D)
        if km is not None:
            k_box, k_order = box(km, k_index, len(k_shape) - 2, "ts", len(k_shape) - 1, D)
        if vm is not None:
            v_box, v_order = box(vm, v_index, len(v_shape) - 2, "ts", len(v_shape) - 1, Dv)
    except ValueError:
        fail(next(n for n in body.nodes if id(n) in core_nodes), "q, k or v is not a unit-stride box of its input")
    q_letters = "".join("s" if a == n_lead else "d" for a in q_order) if qm is not None else "sd"
    k_letters = "".join("t" if a == len(k_shape) - 2 else "d" for a in k_order) if km is not None else "td"
    v_letters = "".join("t" if a == len(v_shape) - 2 else "e" for a in v_order) if vm is not None else "te"
    if min(len(q_letters), len(k_letters), len(v_letters)) < 2:   # a box read its one-element axis away
        fail(next(n for n in body.nodes if id(n) in core_nodes), "q, k or v of depth 1 read as a vector")
    # pieces of D: computed q and k (rotary embedding) are made per piece between the cuts where
    # their graphs slice and concatenate D, and contracted piece by piece; a rotation of
    # interleaved pairs (GPT-J, GLM) takes each piece's even and odd positions apart
    made_of = [x for x in (q, k) if x.name in computed]
    found, paired = _concat_cuts(made_of, producer, D)
    bounds = sorted({0, D} | found)
    cuts = []
    for a, b in zip(bounds, bounds[1:]):
        if any(lo <= a < hi for lo, hi in paired):   # even and odd positions apart
            cuts += [p for p in ((a, 2, (b - a + 1) // 2), (a + 1, 2, (b - a) // 2)) if p[2]]
        else:
            cuts.append((a, 1, b - a))
    cuts = tuple(cuts)

    # score operands (a mask): region inputs aligned to the scores (lead..., S, T)
    score_rank = len(lead) + 2
    operand_boxes = {}

    def operand(x):
        if x.name in inputs.literals:
            return None
        if x.name not in params_in:
            fail(producer.get(x.name), "a score operand computed inside the region")
        sh = aligned(tuple(x.type.shape), score_rank)
        full = [s == d and d != 1 for s, d in zip(sh, lead + (S, T))]
        idx = [q_index[i] if full[i] else "0" for i in range(len(lead))] + \
            ["qs" if full[-2] else "0:1", "ts" if full[-1] else "0:1"]
        idx = idx[score_rank - x.type.rank:]
        operand_boxes[x.name] = f"{param(x)}[{', '.join(idx)}]"

    for p in score_ops:
        for x in p.inputs:
            if x.name in params_in or x.name in inputs.literals:
                operand(x)
    if mask is not None:
        operand(mask)
    # q, k and v's sources were registered by box(); the output
    if causal:   # query and key blocks of one size, so a block on the diagonal starts where its queries do
        bq = bk = min(bq, bk)

    w = Writer()   # the body first: computed q and k add parameters as they are written
    w.depth = 1
    if causal_mask:
        cm_value, cm_how = causal_mask
        cm_lead = ", ".join(["0"] * (cm_value.type.rank - 2) + [""])
        w("tri = {}   # (PE, queries, keys) -> a diagonal block's mask, in SRAM: the constant's first block")
        tri_src = f"fl.load({param(cm_value)}[{cm_lead}0:key[1], 0:key[2]])" + \
            (" == 0.0" if cm_how == "additive" else "")
    elif causal:
        # the positions 0, 1, ..., bq - 1 made once in DRAM by doubling ([n:2n] = [0:n] + n: a few
        # DMAs, not one per position); each PE then makes the mask of a diagonal block from them
        # once and keeps it in SRAM (`tri`), not a DMA per diagonal block
        kpos, n = names.new("KPOS"), names.new("n")
        w("# the positions 0, 1, ..., bq - 1 of a block's keys, by doubling: [n:2n] = [0:n] + n")
        w(f"{kpos} = fl.scratch((1, bq), fl.f32)")
        w(f"fl.store({kpos}[:, 0:1], fl.zeros((1, 1)))")
        w(f"{n} = 1")
        w(f"while {n} < bq:")
        with w.indent():
            w(f"fl.store({kpos}[:, {n}:min(2 * {n}, bq)], fl.load({kpos}[:, 0:min({n}, bq - {n})]) + {n})")
            w(f"{n} *= 2")
        w("tri = {}   # (PE, queries, keys) -> the mask of a diagonal block, key j <= query i, in SRAM")
        tri_src = f"fl.load({kpos}[:, 0:key[2]]) <= fl.transpose(fl.load({kpos}[:, 0:key[1]]), (1, 0))"
    w(f"S, T = {S}, {T}")
    out = names.new(result.name + "_out").upper()
    axes = " ".join(["_"] * len(lead) + ["S", "_"])
    w(f"{out} = fl.output(({', '.join(str(d) for d in lead + (S, Dv))}), {fl_dtype(result.type.dtype)}, "
      f'axes="{axes}")')
    export_names = {}
    for o in exports:
        export_names[o.name] = names.new(o.name + "_out").upper()
        w(f"{export_names[o.name]} = fl.output(({', '.join(str(d) for d in o.type.shape)}), "
          f"{fl_dtype(o.type.dtype)})")
    grid_axes = [(group[2], "g") if group and i == group[0] else (d, e) for i, (d, e) in enumerate(zip(lead, lv))]
    grid = [f"range({d})" for d, e in grid_axes if d != 1] + ["fl.tiles(S, bq)"]
    gvars = [e for d, e in grid_axes if d != 1] + ["qs"]
    w("ones = {}   # (PE, keys) -> a column of ones, for the row sums on the tensor unit")
    item_axes = [(d, e) for d, e in grid_axes if d != 1]
    shared_heads = len(item_axes) == 1 and item_axes[0][0] % cfg.num_pes == 0   # heads alone, a share each
    if shared_heads:
        # the heads in contiguous shares, one per PE, each PE's in order, dealt in turn: the
        # share a producer making the heads PE by PE (a fused projection's head groups) gives it,
        # so each item starts as soon as its head is made, on the PE that made it; for a causal
        # mask every PE gets every query block of its heads, a like share of the key blocks
        (hd, hv_), = item_axes
        w(f"per = {hd} // fl.num_pes()")
        w(f"grid = [({hv_}, qs) for i in range(per) for qs in fl.tiles(S, bq) for p in range(fl.num_pes()) "
          f"for {hv_} in [p * per + i]]")
        w(f"for {hv_}, qs in fl.parallel(grid):")
    elif causal:
        # a query block works on the key blocks up to its last query: the grid, heavy items
        # first, dealt to the PEs back and forth, so each PE gets a like share of the key blocks
        # (round-robin in grid order gave every late query block to the same PEs)
        loops = " ".join(f"for {e} in {it}" for e, it in zip(gvars, grid))
        item, last = (f"({', '.join(gvars)})", "item[-1]") if len(gvars) > 1 else (gvars[0], "item")
        w(f"grid = balanced([{item} {loops}], lambda item: {last}.stop, fl.num_pes())")
        w(f"for {', '.join(gvars)} in fl.parallel(grid):")
    else:
        w(f"for {', '.join(gvars)} in fl.parallel({', '.join(grid)}):")
    if group:
        hv, r = q_index[group[0]], group[1]
        heads = f"range({r} * g, {r} * g + {r})" if gvar == "g" else f"range({r})"
    with w.indent():
        hoist = None
        if group:
            w("q_of, m_of, l_of, o_of = [], [], [], []   # per query head of the group")
            hoist = _Hoist(w, hv)
            w(f"for {hv} in {heads}:   # the query heads sharing key head {gvar}")
            w.depth += 1
        if q.name in computed:
            qp = _Pieces(w, names, label, producer, params_in, inputs.literals, param, lead, q_index, "qs", fail,
                         hoist=hoist)
            q_tiles = qp.pieces(q, cuts)
            if q_scale is None and op_dt[q.name] != q.type.dtype:
                for t in q_tiles:
                    w(f"{t} = {cast_to(t, q.type.dtype, op_dt[q.name])}")
            if q_scale is not None:
                for j, t in enumerate(q_tiles):
                    w(f"{t} = fl.mul({t}, {literal(q_scale)}, dtype={fl_dtype(op_dt[q.name])})   # the scale folded into q once")
        elif q_scale is not None:
            w(f"qt = fl.mul(fl.load({q_box}), {literal(q_scale)}, dtype={fl_dtype(op_dt[q.name])})   # the scale folded into q once")
        else:
            w(f"qt = {cast_to(f'fl.load({q_box})', q.type.dtype, op_dt[q.name])}")
        q_names = q_tiles if q.name in computed else ["qt"]
        if group:
            w(f"q_of.append({'(' + ', '.join(q_names) + ')' if len(q_names) > 1 else q_names[0]})")
            w(f'm_of.append(fl.full((qs, 1), {LOWEST}))   # running row max')
            w("l_of.append(None)                             # running row sum")
            w("o_of.append(None)                             # output (ACC)")
            w.depth -= 1
        else:
            w(f'm = fl.full((qs, 1), {LOWEST})   # running row max')
            w("l = o = None                         # running row sum, output (ACC)")
        t_cuts = tuple(b for _, b, _ in k_parts[:-1])
        keys = f"bands(T, {t_cuts}, bk)" if cache else "fl.tiles(T, bk)"
        # what computing k loads that no key block indexes (a norm's weight) is loaded once,
        # before the key loop, not a DMA per key block
        k_hoist = _Hoist(w, "ts")
        if causal:   # key blocks after the block's last query are masked whole: skipped
            w(f"for ts in fl.range([ts for ts in {keys} if ts.start < qs.stop], stages=stages):")
        elif window and not cache:   # and those wholly before its first query's window
            w(f"for ts in fl.range([ts for ts in {keys} if ts.start < qs.stop and ts.stop > qs.start - {window - 1}], "
              "stages=stages):   # a sliding window of " + f"{window} keys")
        else:
            w(f"for ts in fl.range({keys}, stages=stages):")
        with w.indent():
            if cache:
                kidx = {i - kp: e for i, e in kv_index(klead).items() if i >= kp}
                first_head = " and ".join(f"{q_index[i]} % {lead[i] // d} == 0" for i, d in enumerate(klead)
                                          if d not in (1, lead[i]) and q_index[i] != "0"
                                          and not (group and i == group[0]))
                for j, ((a, b_, kx), (_, _, vx)) in enumerate(zip(k_parts, v_parts)):
                    cond = f"ts.start < {b_}" if j < len(k_parts) - 1 else None
                    w(("if " if j == 0 else "elif ") + f"{cond}:   # keys {a}:{b_} of %{kx.name}" if cond
                      else ("else:" if j else "if True:") + f"   # keys {a}:{b_} of %{kx.name}")
                    with w.indent():
                        kpc = _Pieces(w, names, label, producer, params_in, inputs.literals, param,
                                      tuple(k_shape[:-2]), kidx, "ts", fail, offset=a, hoist=k_hoist)
                        k_raw = kpc.pieces(kx, cuts)
                        k_tiles = [_cast_line(w, names, t, kx.type.dtype, op_dt[k.name]) for t in k_raw]
                        vpc = _Pieces(w, names, label, producer, params_in, inputs.literals, param,
                                      tuple(v_shape[:-2]), v_index, "ts", fail, offset=a)
                        (vtile,) = vpc.pieces(vx, ((0, 1, Dv),))
                        v_raw = vtile
                        vtile = _cast_line(w, names, vtile, vx.type.dtype, op_dt[v.name])
                        w(f"vt = {vtile}")
                        if group:   # the group's heads contract it below
                            w(f"kt = [{', '.join(k_tiles)}]")
                        else:
                            for jj, (qa, kb) in enumerate(zip(q_tiles, k_tiles)):
                                acc = "" if jj == 0 else ", acc=s"
                                w(f's = fl.contract("sd,td->st", {qa}, {kb}{acc})   # D[{_piece_text(cuts[jj])}]')
                        if exports:
                            cond = " and ".join(c for c in (first_head, "qs.start == 0") if c)
                            w(f"if {cond}:   # the keys and values leave the region: stored once")
                            with w.indent():
                                for val, tiles_, pc, idx_ in ((k, k_raw, cuts, kidx), (v, [v_raw], ((0, 1, Dv),), v_index)):
                                    if val.name not in export_names:
                                        continue
                                    if any(step != 1 for _, step, _ in pc):
                                        fail(producer.get(val.name), "keys exported in interleaved pieces (a DRAM box "
                                                                     "does not stride)")
                                    lead_idx = [idx_.get(i, "0") for i in range(len(val.type.shape) - 2)]
                                    for t_, (c0, _, cn) in zip(tiles_, pc):
                                        w(f"fl.store({export_names[val.name]}[{', '.join(lead_idx + ['ts', f'{c0}:{c0 + cn}'])}], {t_})")
            elif k.name in computed:
                kidx = {i - kp: e for i, e in kv_index(klead).items() if i >= kp}
                kpc = _Pieces(w, names, label, producer, params_in, inputs.literals, param,
                              tuple(k_shape[:-2]), kidx, "ts", fail, hoist=k_hoist)
                k_tiles = [_cast_line(w, names, t, k.type.dtype, op_dt[k.name]) for t in kpc.pieces(k, cuts)]
            else:
                w(f"kt = {cast_to(f'fl.load({k_box})', k.type.dtype, op_dt[k.name])}")
            if not cache:
                w(f"vt = {cast_to(f'fl.load({v_box})', v.type.dtype, op_dt[v.name])}")
            group_tiles = {}   # score operands the group's query heads share (a mask over heads): loaded once
            if group:
                shared = _Hoist(w, hv)   # before the loop over the group's heads, written next
                for name, b in operand_boxes.items():
                    if shared.outside(b):
                        group_tiles[name] = names.new(name + "_t")
                        shared(f"{group_tiles[name]} = fl.load({b})   # the same for every query head of the group")
            if group:   # each query head of the group, on the block loaded once
                w(f"for j, {hv} in enumerate({heads}):")
                w.depth += 1
                w(f"{', '.join(q_names)} = q_of[j]")
                w("m, l, o = m_of[j], l_of[j], o_of[j]")
            if cache and group:
                for jj, qa in enumerate(q_tiles):
                    acc = "" if jj == 0 else ", acc=s"
                    w(f's = fl.contract("sd,td->st", {qa}, kt[{jj}]{acc})   # D[{_piece_text(cuts[jj])}]')
            elif cache:   # the scores were made part by part above
                pass
            elif q.name in computed or k.name in computed:
                # one of them computed in pieces of D (a rotary q over keys read from a cache the
                # keys were rotated into before): the other, loaded whole, is sliced in SRAM
                qs_ = q_tiles if q.name in computed else [_d_piece("qt", q_letters, c, cuts) for c in cuts]
                ks_ = k_tiles if k.name in computed else [_d_piece("kt", k_letters, c, cuts) for c in cuts]
                ql = "sd" if q.name in computed else q_letters
                kl = "td" if k.name in computed else k_letters
                for j, (a, b_) in enumerate(zip(qs_, ks_)):
                    acc = "" if j == 0 else ", acc=s"
                    w(f's = fl.contract("{ql},{kl}->st", {a}, {b_}{acc})   # D[{_piece_text(cuts[j])}]')
            else:
                w(f's = fl.contract("{q_letters},{k_letters}->st", qt, kt)')
            if causal:
                w("if ts.stop - 1 > qs.start:   # on the diagonal: keys after a query are masked")
                with w.indent():
                    w("key = (fl.pe(), qs.stop - qs.start, ts.stop - ts.start)")
                    w("if key not in tri:")
                    with w.indent():
                        w(f"tri[key] = {tri_src}")
                    if causal_mask and causal_mask[1] == "drop":
                        w('s = fl.where(tri[key], float("-inf"), s)   # the constant marks the masked keys')
                    else:
                        w('s = fl.where(tri[key], s, float("-inf"))')
            tiles = dict(inputs.literals, **group_tiles)
            for name, b in operand_boxes.items():
                if name in group_tiles:
                    continue
                t = names.new(name + "_t")
                w(f"{t} = fl.load({b})")
                tiles[name] = t
            cur = "s"
            tiles.update({name: "s" for name in score_names})
            if s_scale is not None and not exp_scale and not (score_ops == [] and additive):
                w(f"s = fl.mul(s, {literal(s_scale)})   # the scale, on the scores: q * scale would round")
            if score_ops:
                emit = vector.VectorEmitter(w, names, label)
                for p in score_ops:
                    cur = emit.node(p, [tiles[x.name] for x in p.inputs], p.inputs[0].type.rank - 1)
                    tiles[p.outputs[0].name] = cur
            if mask is not None:
                if mask.type.dtype == DType.bool:
                    w(f's = fl.where({tiles[mask.name]}, s, float("-inf"))   # the mask keeps True')
                elif s_scale is not None and not score_ops:
                    w(f"s = fl.fma(s, {literal(s_scale)}, {tiles[mask.name]})   # the scale and the mask in one pass")
                else:
                    w(f"s = s + {tiles[mask.name]}")
            # the vector unit is attention's bottleneck: per block it makes only the row max, the
            # shifted scores and their exp (4 passes over the block); the row sums are a
            # contraction with a column of ones, on the tensor unit, which has time to spare
            p_dt = fl_dtype(op_dt[v.name])
            if exp_scale:   # the scale where the shift is: one pass either way, and exact
                w(f"m_new = fl.maximum(m, {cur}.max(axis=-1) * {literal(s_scale)})   # the scaled scores' row max")
                w(f"p = fl.exp(fl.fma({cur}, {literal(s_scale)}, -m_new), dtype={p_dt})")
            else:
                w(f"m_new = fl.maximum(m, {cur}.max(axis=-1))")
                w(f"p = fl.exp({cur} - m_new, dtype={p_dt})")
            w("if o is not None:")
            with w.indent():
                w("alpha = fl.exp(m - m_new)   # how much the old max shrinks by")
                w("fl.mul(o, alpha, out=o)")
                w("fl.mul(l, alpha, out=l)")
            w("if (fl.pe(), ts.stop - ts.start) not in ones:")
            with w.indent():
                w(f"ones[fl.pe(), ts.stop - ts.start] = fl.full((ts, 1), 1.0, dtype={p_dt})")
            w('l = fl.contract("st,tx->sx", p, ones[fl.pe(), ts.stop - ts.start], acc=l)   # row sums')
            w(f'o = fl.contract("st,{v_letters}->se", p, vt, acc=o)')
            w("m = m_new")
            if group:
                w("m_of[j], l_of[j], o_of[j] = m, l, o")
                w.depth -= 1
        idx = ", ".join([q_index[i] for i in range(len(lead))] + ["qs", ":"])
        if group:
            w(f"for j, {hv} in enumerate({heads}):")
            w.depth += 1
            w("l, o = l_of[j], o_of[j]")
        # a query row with every key masked out has o = 0 and l = 0: it is 0, as torch's SDPA
        w('l = fl.where(l == 0.0, 1.0, l)   # rows with nothing to attend to stay 0')
        w(f"fl.store({out}[{idx}], fl.div(o, l, dtype={fl_dtype(result.type.dtype)}))")
        if group:
            w.depth -= 1
    order = {result.name: out, **export_names}
    w(f"return {', '.join(order[o.name] for o in body.outputs)}")
    # the defaults, from a per-PE model of the kernel as written (its loads per block and item)
    g_heads = group[1] if group else 1
    work = Work((math.prod(lead) or 1) // g_heads, g_heads, S, T, D, Dv, op_dt[k.name].itemsize,
                op_dt[k.name].name, causal, positions=causal and not causal_mask, **count_work(w.lines, g_heads))
    if causal:   # measured: the model's choice is the simulated best there; with a mask and no
        # causal structure the fixed rule above was as good or better (the model misjudges the
        # mask's loads), so it stays
        bq, bk = default_blocks(work, cfg, lambda a, b: blocks_fit(a, b, max(D, Dv), 4, cfg, STAGES, g_heads))
    text = Writer()
    header(text, node, body, "streaming attention", sig.header, inputs.literals)
    for helper in ((BANDS,) if cache else ()) + ((BALANCED,) if causal and not shared_heads else ()):
        for line in helper.splitlines():
            text(line)
        text()
        text()
    text(f'@fl.kernel(target="{cfg.name}")')
    if causal:
        # one block size for queries and keys, not two tiling parameters: the diagonal mask `tri`
        # is right only for a key block that starts where its query block does, so a tile search
        # that set bk apart from bq would mask the wrong keys
        text(f"def {fname}({', '.join(sig.annotations)}, *, bq: int = {bq}, stages: int = {STAGES}):")
        text("    bk = bq   # key blocks are the query blocks (causal)")
    else:
        text(f"def {fname}({', '.join(sig.annotations)}, *, bq: int = {bq}, bk: int = {bk}, stages: int = {STAGES}):")
    text.lines += w.lines
    w = text
    results = tuple(Result(i, tuple(node.outputs[i].type.shape)) for i in range(len(body.outputs)))
    made = _computing_ops(made_of, producer)
    norms = made & {"rms_norm", "layer_norm"}
    parts = ("view",) + (("norm",) if norms else ()) + (("rotary",) if made - norms else ()) + ("attention",) + \
        (("score ops",) if score_ops else ()) + (("causal",) if causal else ()) + (("kv cache",) if cache else ())
    modelled = None
    if chose:   # as the defaults above, but with the bytes the keys and values are loaded in
        modelled = pe_cycles(replace(work, itemsize=k.type.dtype.itemsize), cfg, bq, bk)
    return GeneratedKernel(fname, "attention", w.text(), cfg, tuple(sig.params), results, parts), modelled


def _place_scale(scale, score_ops, mask) -> tuple:
    """Where the kernel applies the scores' scale: (on q, on the scores, in the exponent, additive
    mask). Folded into q it is a pass over a (bq, D) tile once instead of one per block of scores,
    but q * scale is rounded to q's operand dtype, which moves large scores by more than the
    dtype's tolerance unless the scale is a power of two. Any other scale goes on the f32 scores:
    with the row max and the shift in the exponent (``exp(s * c - max)``, a multiply-add in the
    pass the shift takes anyway) when nothing else touches the scores, with an additive mask in
    one multiply-add where that is all, else as a pass of its own before the score ops.
    A negative scale (sdpa takes any) puts its sign on q, which is exact: the masks write -inf
    into the raw scores, and a negative factor after them would make those +inf."""
    if scale is None:
        return None, None, False, False
    additive = mask is not None and mask.type.dtype != DType.bool
    if scale != 0 and math.frexp(abs(scale))[0] == 0.5:   # a power of two: q * scale is exact
        return scale, None, False, additive
    magnitude = abs(scale)
    return -1.0 if scale < 0 else None, magnitude, magnitude > 0 and not score_ops and not additive, additive


def heads_read(node: Node) -> dict:
    """How attention region `node` reads its inputs head by head: {outer value name: (parts,
    heads, depth)} for each input whose last axis the region splits into equal `parts` (q, k and v
    of a fused projection), each reshaped into (heads, depth). The producer of such a value can
    make it head by head (`contraction.generate_contraction`'s head groups)."""
    body = body_of(node)
    outer = {b.name: o.name for b, o in zip(body.inputs, node.inputs)}
    users: dict[str, list] = {}
    for n in body.nodes:
        for x in n.inputs:
            users.setdefault(x.name, []).append(n)
    producer = {v.name: n for n in body.nodes for v in n.outputs}
    found = {}
    for n in body.nodes:
        x = n.inputs[0] if n.inputs else None
        if n.op.name != "split" or x is None or x.type.rank < 1 or \
                n.attrs["axis"] % x.type.rank != x.type.rank - 1 or len(set(n.attrs["sizes"])) != 1:
            continue
        while x.name in producer and producer[x.name].op.name == "reshape" and \
                producer[x.name].inputs[0].type.rank and \
                producer[x.name].inputs[0].type.shape[-1] == x.type.shape[-1]:   # rows merged or split
            x = producer[x.name].inputs[0]
        if x.name not in outer:
            continue
        shapes = set()
        for o in n.outputs:
            r = users.get(o.name, [])
            if len(r) != 1 or r[0].op.name != "reshape":
                break
            out = tuple(r[0].outputs[0].type.shape)
            if len(out) != o.type.rank + 1 or out[:-2] != tuple(o.type.shape[:-1]):
                break
            shapes.add(out[-2:])
        else:
            if len(shapes) == 1:
                (h, d), = shapes
                found[outer[x.name]] = (len(n.outputs), h, d)
    return found


BANDS = '''\
def bands(n, cuts, size):
    """[0, n) in tiles of at most `size` that do not straddle any of `cuts`."""
    edges = sorted({0, n, *(c for c in cuts if 0 < c < n)})
    return [slice(i, min(i + size, hi)) for lo, hi in zip(edges, edges[1:]) for i in range(lo, hi, size)]
'''

BALANCED = '''\
def balanced(items, work, pes):
    """`items` reordered so that fl.parallel, dealing them round-robin, gives each of `pes` PEs a
    like share of `work`: the heaviest first, every other round dealt in reverse."""
    items = sorted(items, key=work, reverse=True)
    rounds = [items[i:i + pes] for i in range(0, len(items), pes)]
    return [x for r, chunk in enumerate(rounds) for x in (chunk if r % 2 == 0 else chunk[::-1])]
'''

def _seq_parts(v, producer) -> list:
    """(start, stop, value) of the parts `v` concatenates along its sequence axis (one part if none)."""
    n = producer.get(v.name)
    if n is not None and n.op.name == "concat" and n.attrs["axis"] % v.type.rank == v.type.rank - 2:
        out, off = [], 0
        for x in n.inputs:
            out.append((off, off + x.type.shape[-2], x))
            off += x.type.shape[-2]
        return out
    return [(0, v.type.shape[-2], v)]


def _uncast(x, producer, core_nodes):
    """The value a cast to the operand dtype (the precision stage's) reads; the cast joins the core."""
    n = producer.get(x.name)
    if n is not None and n.op.name == "cast":
        core_nodes.add(id(n))
        return n.inputs[0]
    return x


def _repeat_kv(x, producer, core_nodes):
    """The (..., Hkv, T, D) value that ``x`` = reshape(expand(reshape(it, (..., Hkv, 1, T, D)),
    (..., Hkv, r, T, D)), (..., Hkv * r, T, D)) repeats, its three views joining the core; None
    when ``x`` is not made so."""
    chain, v = [], x
    for op in ("reshape", "expand", "reshape"):
        n = producer.get(v.name)
        if n is None or n.op.name != op:
            return None
        chain.append(n)
        v = n.inputs[0]
    *lead, H, T, D = x.type.shape
    src = tuple(v.type.shape)
    if len(src) != len(lead) + 3 or src[:len(lead)] != tuple(lead) or src[-2:] != (T, D):
        return None
    hkv = src[-3]
    if not isinstance(hkv, int) or not isinstance(H, int) or hkv == 0 or H % hkv:
        return None
    if tuple(chain[2].outputs[0].type.shape) != (*lead, hkv, 1, T, D) or \
            tuple(chain[1].outputs[0].type.shape) != (*lead, hkv, H // hkv, T, D):
        return None
    core_nodes.update(id(n) for n in chain)
    return v


def _canonical_box(text: str) -> tuple:
    """A box's index text in a form equal for equal boxes however its bounds are spelled
    (``128 * g + 64:128 * g + 128`` and ``64 + 128 * g:64 + 128 * g + 64`` are one box, the half
    of D a rotary embedding reads twice): each bound as a sympy expression; the text itself when a
    bound does not parse."""
    try:
        return tuple(tuple(_bound_expr(b) for b in part.split(":")) for part in text.split(", "))
    except Exception:  # noqa: BLE001 - any text sympy cannot read is its own key
        return (text,)


@functools.lru_cache(maxsize=4096)   # sympy's parser is slow, and a head's bounds recur in every layer
def _bound_expr(bound: str):
    import sympy

    return sympy.sympify(bound.replace(".", "__"))


def _cast_line(w, names, tile, src, dst) -> str:
    if src == dst:
        return tile
    t = names.new(tile + "_op")
    w(f"{t} = {cast_to(tile, src, dst)}")
    return t


def _is_view(v, producer) -> bool:
    while v.name in producer:
        if producer[v.name].op.name not in VIEW_OPS:
            return False
        v = producer[v.name].inputs[0]
    return True


def _d_piece(tile: str, letters: str, piece, cuts) -> str:
    """A piece of D of a tile loaded whole (its axes named by `letters`), as a slice in SRAM; the
    tile itself when D is one piece."""
    if len(cuts) == 1 and piece[1] == 1:
        return tile
    return f"{tile}[{', '.join(_piece_text(piece) if a == 'd' else ':' for a in letters)}]"


def _piece_text(piece) -> str:
    """A piece of D as a slice: ``0:32`` or, every other position, ``1:32:2``."""
    a, step, n = piece
    return f"{a}:{a + step * (n - 1) + 1}" + (f":{step}" if step != 1 else "")


def _flattens_pairs(n) -> bool:
    """Whether `n` is a reshape of (..., m, 2) into (..., 2m): pairs stacked on a last axis and
    flattened back into D (``torch.stack((a, b), -1).flatten(-2)``); `_Pieces._pair` checks the
    stacking where it reads the pairs."""
    if n.op.name != "reshape" or not n.inputs:
        return False
    y, v = n.inputs[0], n.outputs[0]
    return y.type.rank == v.type.rank + 1 and tuple(y.type.shape[-1:]) == (2,) and \
        v.type.shape[-1] == 2 * y.type.shape[-2] and tuple(y.type.shape[:-2]) == tuple(v.type.shape[:-1])


def _computing_ops(values, producer) -> set[str]:
    """The ops other than views that compute `values` in the region (a norm, a rotation)."""
    ops, stack, seen = set(), list(values), set()
    while stack:
        n = producer.get(stack.pop().name)
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        if n.op.name not in VIEW_OPS:
            ops.add(n.op.name)
        stack.extend(n.inputs)
    return ops


def _concat_cuts(values, producer, D) -> tuple[set, list]:
    """Where the graphs of `values` concatenate along the last axis, in D's coordinates: a slice of
    D shifts them (partial rotary embedding concatenates halves of a slice of D), elementwise ops
    keep them. Behind a slice or a split only the cuts within the part it takes count (the
    other parts of a fused projection have cuts of their own). Also the ranges of D made of
    interleaved pairs stacked and flattened (a rotation of interleaved pairs), whose pieces must
    take even and odd positions apart; their ends are cuts."""
    cuts, paired, stack, seen = set(), [], [(v, 0, 0, D) for v in values], set()
    while stack:
        v, off, lo, hi = stack.pop()
        if (v.name, off, lo, hi) in seen or v.name not in producer or v.type.rank == 0:
            continue
        seen.add((v.name, off, lo, hi))
        n = producer[v.name]
        last = v.type.rank - 1

        def cut(c):
            if lo < c < hi:
                cuts.add(c)

        if _flattens_pairs(n):   # pairs: positions 2i and 2i + 1 of two values
            paired.append((off, off + v.type.shape[-1]))
            cut(off)
            cut(off + v.type.shape[-1])
        elif n.op.name == "concat" and n.attrs["axis"] % v.type.rank == last:
            at = off
            for x in n.inputs:
                stack.append((x, at, lo, hi))
                at += x.type.shape[-1]
                cut(at)
        elif n.op.name in ("slice", "split") and n.attrs["axis"] % v.type.rank == last and \
                n.attrs.get("step", 1) == 1:
            start = part_start(n, v)
            cut(off)
            cut(off + v.type.shape[-1])
            stack.append((n.inputs[0], off - start, max(lo, off), min(hi, off + v.type.shape[-1])))
        elif n.op.name == "slice_scatter" and n.attrs["axis"] % v.type.rank == last and n.attrs["step"] == 1:
            cut(off + n.attrs["start"])   # the written part replaces a range
            cut(off + n.attrs["end"])
            stack += [(n.inputs[0], off, lo, hi), (n.inputs[1], off + n.attrs["start"], lo, hi)]
        else:
            stack.extend((x, off, lo, hi) for x in n.inputs if x.type.rank and x.type.shape[-1] == v.type.shape[-1])
    return {c for c in cuts if 0 < c < D}, paired


class _Hoist:
    """Lines written before a loop already written past: a load the loop's variable does not
    index (the rotary tables of a query block, read by every query head of a group) is made once,
    not once per iteration, each a DMA start-up."""

    def __init__(self, w, var: str):
        self.w, self.var = w, var
        self.at, self.depth = len(w.lines), w.depth

    def outside(self, text: str) -> bool:
        return re.search(rf"\b{re.escape(self.var)}\b", text) is None

    def __call__(self, line: str) -> None:
        self.w.lines.insert(self.at, "    " * self.depth + line)
        self.at += 1


SEQ = "<the sequence block>"   # a `_Pieces` axis role: the axis the kernel tiles the sequence along


def _aligned_axes(axes: tuple, rank: int) -> tuple:
    """The roles of an operand of rank `rank` broadcast against a value whose axes (all but D)
    have roles `axes`: aligned on the right, as broadcasting aligns them."""
    return axes[len(axes) - (rank - 1):] if rank >= 1 else ()


class _Pieces:
    """q or k computed in the region from views of its inputs (rotary embedding: halves of D
    swapped, negated, scaled by cos and sin tables; a norm over D before it), written piece by
    piece along D: a view is loaded per piece, an elementwise op runs per piece, a slice or concat
    of D only picks pieces, a norm sums its statistics over the pieces of the row."""

    def __init__(self, w, names, label, producer, params_in, literals, param, lead, index, seq, fail, offset=0,
                 hoist=None):
        self.offset = offset   # where this part starts along the sequence axis
        self.hoist = hoist     # a `_Hoist`: loads that do not depend on its loop go before it
        self.w, self.names, self.label = w, names, label
        self.producer, self.params_in, self.literals = producer, params_in, literals
        self.param, self.lead, self.index, self.seq, self.fail = param, lead, index, seq, fail
        self.emit = vector.VectorEmitter(w, names, label)
        self.memo: dict = {}
        self.loaded: dict = {}
        self.norms: dict = {}   # (norm, pieces, axes) -> (its pieces, 1 / RMS, normalized pieces made)

    def pieces(self, v, cuts: tuple, axes: tuple | None = None) -> list[str]:
        """The tiles of `v` at `cuts`, pieces of D as (start, step, count) (step 1: a range; 2:
        every other position), each a block of the sequence. `axes` says what each axis of `v`
        but the last is: `SEQ`, or the index expression of the grid item it is fixed at; by
        default `v`'s axes are the kernel's lead axes and then the sequence, aligned on the right
        (a permute of a computed value reorders them)."""
        if axes is None:
            rank = v.type.rank
            shift = len(self.lead) - (rank - 2)
            axes = tuple(self.index.get(i + shift, "0") for i in range(rank - 2)) + ((SEQ,) if rank >= 2 else ())
        key = (v.name, cuts, axes)
        if key not in self.memo:
            self.memo[key] = self._pieces(v, cuts, axes)
        return self.memo[key]

    def _pieces(self, v, cuts, axes):
        n_pieces = len(cuts)
        if v.name in self.literals:
            return [self.literals[v.name]] * n_pieces
        if v.type.shape[-1] == 1 and cuts != ((0, 1, 1),):   # broadcast along D: one tile serves every piece
            return self.pieces(v, ((0, 1, 1),), axes) * n_pieces
        n = self.producer.get(v.name)
        last = v.type.rank - 1
        if n is not None and n.op.name in ("slice", "split") and n.attrs["axis"] % v.type.rank == last:
            # a slice of D (with a step: every other position) or a part of a split picks
            # positions of its input's D
            start, st = part_start(n, v), n.attrs.get("step", 1)
            return self.pieces(n.inputs[0], tuple((start + st * a, st * step, count) for a, step, count in cuts), axes)
        if n is not None and n.op.name == "slice_scatter" and n.attrs["axis"] % v.type.rank == last and \
                n.attrs["step"] == 1:
            # a range of D written over (DeepSeek's rotated part put back into q): each piece
            # is the written values' or the base's, whole
            lo, hi = n.attrs["start"], n.attrs["end"]
            out = []
            for a, step, count in cuts:
                inside = [lo <= a + step * k < hi for k in range(count)]
                if all(inside):
                    out += self.pieces(n.inputs[1], ((a - lo, step, count),), axes)
                elif not any(inside):
                    out += self.pieces(n.inputs[0], ((a, step, count),), axes)
                else:
                    self.fail(n, "a piece of D across a range written over")
            return out
        if _is_view(v, self.producer):
            return [self._load(v, piece, axes) for piece in cuts]
        op = n.op.name
        if op == "concat" and n.attrs["axis"] % v.type.rank == last:
            out, off = [], 0
            bounds = []
            for x in n.inputs:
                bounds.append((off, off + x.type.shape[-1], x))
                off += x.type.shape[-1]
            for a, step, count in cuts:
                part = next(((lo, hi, x) for lo, hi, x in bounds if lo <= a and a + step * (count - 1) < hi), None)
                if part is None:
                    self.fail(n, "a piece of D across a concat boundary")
                lo, _, x = part
                out += self.pieces(x, ((a - lo, step, count),), axes)
            return out
        if _flattens_pairs(n):
            return [self._pair(n, piece, axes) for piece in cuts]
        if op == "permute" and n.attrs["perm"][-1] % v.type.rank == last:
            # axes reordered, D kept last (heads and tokens swapped after a norm of each head):
            # the input's axis perm[i] is the result's axis i
            inner = [None] * last
            for i, p in enumerate(n.attrs["perm"][:-1]):
                inner[p % v.type.rank] = axes[i]
            return self.pieces(n.inputs[0], cuts, tuple(inner))
        if op == "expand" and n.inputs[0].type.rank and n.inputs[0].type.shape[-1] == v.type.shape[-1]:
            # heads (or batch) broadcast from one, D kept: each item reads the one there is (its
            # size-1 axes are read at 0 where the pieces are loaded)
            return self.pieces(n.inputs[0], cuts, _aligned_axes(axes, n.inputs[0].type.rank))
        if op in vector.SAME_NAME | vector.COMPOSED | vector.IDENTITY:
            args = [self.pieces(x, cuts if x.type.rank == 0 or x.type.shape[-1] != 1 else ((0, 1, 1),),
                                _aligned_axes(axes, x.type.rank))
                    if x.name in self.literals or x.type.rank > 0 else self.fail(n, "a scalar tensor operand")
                    for x in n.inputs]
            args = [a * n_pieces if len(a) == 1 and n_pieces > 1 else a for a in args]
            return [self.emit.node(n, [a[j] for a in args], n.inputs[0].type.rank - 1) for j in range(n_pieces)]
        if op in ("rms_norm", "layer_norm") and n.attrs["ndim"] == 1:
            return self._norm(n, cuts, axes)
        self.fail(n, "in the computation of q or k (views, elementwise ops, norms over D, slices and concats "
                     "of D, interleaved pairs are handled)")

    def _load(self, v, piece, axes) -> str:
        """The tile of view `v` at `piece`: the box from its first position to its last, loaded
        once however many views and pieces read it, and every other column of it for a piece of
        every other position (SRAM is read with strides; a DRAM box is not)."""
        a, step, count = piece
        m = ViewMap.of(v, self.producer, self.params_in, self.fail)
        off = f" - {self.offset}" if self.offset else ""
        index, seq = {}, {}
        for i, role in enumerate(axes):
            if role is SEQ:   # a view of size 1 there broadcasts over the sequence
                seq[i] = (f"{self.seq}.start{off}", f"{self.seq}.stop{off}") if m.shape[i] != 1 else ("0", "1")
            else:
                index[i] = role if m.shape[i] != 1 else "0"
        rank = len(m.shape)
        # every other position: the box of whole pairs (even and odd positions share its load)
        pairs = step > 1 and count > 1 and a - a % step + step * count <= m.shape[-1]
        lo, hi = (a - a % step, a - a % step + step * count) if pairs else (a, a + step * (count - 1) + 1)
        try:
            text, order = m.box(index, {**seq, rank - 1: (str(lo), str(hi))})
        except ValueError:
            self.fail(self.producer.get(v.name), "a view that is not a unit-stride box of its input")
        if order != sorted(order):
            self.fail(self.producer.get(v.name), "a view whose D comes before its sequence axis")
        src = f"{self.param(m.source)}[{text}]"
        key = (m.source.name, _canonical_box(text))
        if key not in self.loaded:   # one load per box, however many views read it
            self.loaded[key] = self.names.new(v.name + "_t")
            self._line(f"{self.loaded[key]} = fl.load({src})", src)
        tile = self.loaded[key]
        if step == 1 or count == 1:
            return tile
        strided = (tile, a - lo, step)
        if strided not in self.loaded:
            self.loaded[strided] = self.names.new(tile + ("_even" if a % 2 == 0 else "_odd"))
            first = a - lo or ""
            self._line(f"{self.loaded[strided]} = {tile}[{', '.join([':'] * (len(order) - 1) + [f'{first}::{step}'])}]", src)
        return self.loaded[strided]

    def _line(self, line: str, src: str) -> None:
        """A line reading DRAM box `src`: before the loop `hoist` stands for when the loop's
        variable does not index it, else here."""
        if self.hoist is not None and self.hoist.outside(src):
            self.hoist(line)
        else:
            self.w(line)

    def _pair(self, n, piece, axes) -> str:
        """A piece of pairs stacked and flattened into D: position 2i + j is the i-th of part j,
        so every other position from an even or odd start is one part's run."""
        a, step, count = piece
        y = n.inputs[0]
        cat = self.producer.get(y.name)
        if cat is None or cat.op.name != "concat" or cat.attrs["axis"] % y.type.rank != y.type.rank - 1 or \
                len(cat.inputs) != 2 or any(u.type.shape[-1] != 1 for u in cat.inputs):
            self.fail(n, "a reshape merging D's pairs that are not two values stacked")
        if step % 2 and count > 1:
            self.fail(n, "a piece of D across interleaved pairs")
        part = cat.inputs[a % 2]
        unsq = self.producer.get(part.name)
        if unsq is None or unsq.op.name != "reshape" or tuple(unsq.inputs[0].type.shape) != tuple(part.type.shape[:-1]):
            self.fail(n, "a stacked pair whose parts are not values of D's half")
        (tile,) = self.pieces(unsq.inputs[0], ((a // 2, max(step // 2, 1), count),), axes)
        return tile

    def _norm(self, n, cuts: tuple, axes: tuple) -> list[str]:
        """A norm over D (QK-norm) piece by piece: its row statistics summed over every piece of
        the row, then each piece asked for normalized with its part of the weight and bias. The
        statistics and each normalized piece are written once, however many slices of D (a
        rotation's halves) ask for them."""
        D = n.inputs[0].type.shape[-1]
        if all(step == 1 for _, step, _ in cuts):   # ranges: the row cut at every range's ends
            ends = sorted({0, D} | {e for a, _, c in cuts for e in (a, a + c) if 0 < e < D})
            full = tuple((a, 1, b - a) for a, b in zip(ends, ends[1:]))
        else:   # every other position: the row's even and odd positions
            full = tuple(p for p in ((0, 2, (D + 1) // 2), (1, 2, D // 2)) if p[2])
        if any(p not in full for p in cuts):
            self.fail(n, "a norm over D asked for pieces that do not partition the row")
        key = (n.outputs[0].name, full, axes)
        if key not in self.norms:
            self.norms[key] = (*self._norm_statistics(n, full, axes), {})
        xs, r, made = self.norms[key]
        params = [self.pieces(p, full, _aligned_axes(axes, p.type.rank)) for p in n.inputs[1:]]
        kw = self.emit.dtype_kw(n.outputs[0].type.dtype, DType.f32)
        for piece in cuts:
            j = full.index(piece)
            if j not in made:
                made[j] = self.names.new(n.outputs[0].name + "_t")
                self.emit.affine(made[j], (xs[j], r), [p[j] for p in params], kw)
        return [made[full.index(piece)] for piece in cuts]

    def _norm_statistics(self, n, full: tuple, axes: tuple) -> tuple[list[str], str]:
        """(the row's pieces `full`, centred for a layer norm; the reciprocal of its RMS)."""
        D = n.inputs[0].type.shape[-1]
        xs = self.pieces(n.inputs[0], full, axes)
        w, new, base = self.w, self.names.new, n.outputs[0].name
        inv_d = literal(1.0 / D)

        def row_mean(tiles: list[str], square: bool) -> str:
            m = new(base + ("_meansq" if square else "_mean"))
            w(f"{m} = ({' + '.join(f'({t} * {t}).sum(axis=-1)' if square else f'{t}.sum(axis=-1)' for t in tiles)}) "
              f"* {inv_d}")
            return m

        if n.op.name == "layer_norm":
            # centred twice, as `vector.VectorEmitter` does a whole row: the second pass takes
            # out the f32 residue of the first mean
            once, mu = [], row_mean(xs, False)
            for t in xs:
                once.append(new(t + "_centered_once"))
                w(f"{once[-1]} = {t} - {mu}")
            mu2, xs = row_mean(once, False), []
            for t in once:
                xs.append(new(t[:-len("_once")]))
                w(f"{xs[-1]} = {t} - {mu2}")
        stat = row_mean(xs, True)
        r = new(base + "_rstd")
        w(f"{r} = fl.rsqrt({stat} + {vector.norm_eps(n)})")
        return xs, r
