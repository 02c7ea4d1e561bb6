"""The attention kernel: softmax(q kᵀ · scale + mask) v, streaming over key blocks with a running
max and sum (flash attention), so the score matrix never exists whole.

Composed from what the region holds: the ``attention`` op (scale, mask, grouped-query heads), or
the same written out (matmul -> elementwise score ops -> softmax -> matmul), whose score ops run on
each block of scores as `vector.VectorEmitter` lines. q, k and v are views of region inputs
(`views.ViewMap`): head splits, permutes, the split of a fused qkv projection are read straight
from the projection's output, one unit-stride box per block, with no copy.
"""

from __future__ import annotations

import math

from fexplore.ir import DType, Node
from fexplore.lang.examples.attention import _blocks

from . import vector
from .common import Inputs, body_of, header, kernel_name, region_label
from .domain import aligned
from .errors import UnsupportedRegionError
from .generated import GeneratedKernel, Param, Result
from .source import Names, Writer, fl_dtype, literal
from .views import VIEW_OPS, ViewMap

STAGES = 2


def generate_attention(node: Node, cfg) -> GeneratedKernel:
    body = body_of(node)
    label = region_label(node)
    inputs = Inputs.of(node, body)
    producer = {v.name: n for n in body.nodes for v in n.outputs}
    users: dict[str, list] = {}
    for n in body.nodes:
        for x in n.inputs:
            users.setdefault(x.name, []).append(n)
    params_in = {v.name: v for v in body.inputs if v.name not in inputs.literals}

    def fail(n, why):
        raise UnsupportedRegionError(n.op.name if n is not None else "attention", label, why,
                                     loc=n.loc if n is not None else node.loc)

    sdpa = [n for n in body.nodes if n.op.name == "attention"]
    score_ops, mask, scale, swap_k = [], None, None, False
    if sdpa:
        core = sdpa[0]
        if core.attrs["causal"]:
            fail(core, "causal attention (the causal part is not written yet)")
        q, k, v = core.inputs[:3]
        mask = core.inputs[3] if len(core.inputs) == 4 else None
        scale = core.attrs["scale"] if core.attrs["scale"] is not None else 1.0 / math.sqrt(q.type.shape[-1])
        gqa = core.attrs["gqa"]
        result = core.outputs[0]
        core_nodes = {id(core)}
    else:
        sm = next((n for n in body.nodes if n.op.name == "softmax"), None)
        if sm is None or sm.attrs["axis"] % sm.inputs[0].type.rank != sm.inputs[0].type.rank - 1:
            fail(sm or body.nodes[0], "not an attention pattern")
        m2 = users.get(sm.outputs[0].name, [None])[0]
        if m2 is None or m2.op.name != "matmul" or m2.inputs[0].name != sm.outputs[0].name:
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
        swap_k, gqa = True, False
        score_ops, result = path, m2.outputs[0]
        core_nodes = {id(m1), id(sm), id(m2)} | {id(p) for p in path}
        scale = None
    if list(body.outputs) != [result] and [o.name for o in body.outputs] != [result.name]:
        fail(producer.get(body.outputs[0].name), "the region exports values besides the attention output "
                                                 "(a KV cache)")
    qm = ViewMap.of(q, producer, params_in, fail)
    km = ViewMap.of(k, producer, params_in, fail)
    vm = ViewMap.of(v, producer, params_in, fail)
    if swap_k:   # the matmul reads kᵀ: (..., D, T) -> (..., T, D)
        r = len(km.shape)
        km = ViewMap(km.source, km.shape[:-2] + (km.shape[-1], km.shape[-2]),
                     km._substitute(lambda i: (0, [(1, r - 1 if i == r - 2 else r - 2 if i == r - 1 else i)])))
    # every body node must be a view of q, k, v, a score op or the core
    seen = set(core_nodes)
    for val in (q, k, v):
        y = val
        while y.name in producer:
            seen.add(id(producer[y.name]))
            y = producer[y.name].inputs[0]
    for n in body.nodes:
        if id(n) not in seen:
            fail(n, "beside the attention (only views of q, k and v and score ops are handled)")

    *lead, S, D = qm.shape
    *klead, T, Dk = km.shape
    Dv = vm.shape[-1]
    if Dk != D or any(not isinstance(d, int) for d in qm.shape + km.shape + vm.shape):
        fail(q and producer.get(q.name), "q and k of different depths, or symbolic sizes")
    lead, klead = tuple(lead), aligned(tuple(klead), len(lead))
    names = Names({"qt", "kt", "vt", "s", "m", "l", "o", "p", "m_new", "m_safe", "alpha", "ts", "qs", "b", "h",
                   "bq", "bk", "stages", *(f"i{i}" for i in range(8))})
    fname = kernel_name(node)
    names.taken.add(fname)
    lv = [("b" if i == 0 and len(lead) > 1 else "h" if i == len(lead) - 1 else f"i{i}") for i in range(len(lead))]
    q_index = {i: (lv[i] if lead[i] != 1 else "0") for i in range(len(lead))}

    def kv_index(kl):
        out = {}
        for i, d in enumerate(kl):
            if d == lead[i] or d == 1:
                out[i] = q_index[i] if d == lead[i] else "0"
            elif gqa and lead[i] % d == 0:
                out[i] = f"{q_index[i]} // {lead[i] // d}"    # grouped-query: heads share k and v
            else:
                fail(None, f"k and v heads {kl} do not fit q heads {lead}")
        return out

    kp = len(lead) - (len(km.shape) - 2)
    k_index = {i - kp: e for i, e in kv_index(klead).items() if i >= kp}
    vp = len(lead) - (len(vm.shape) - 2)
    v_index = {i - vp: e for i, e in kv_index(aligned(tuple(vm.shape[:-2]), len(lead))).items() if i >= vp}

    # parameters: each distinct region input once, with its own shape and no axis names (q, k and
    # v often share one input, whose token axis is both S and T)
    kparams, specs, header_params, pnames = [], [], [], {}

    def param(v):
        if v.name not in pnames:
            pn = names.new(v.name)
            pnames[v.name] = pn
            kparams.append(Param(pn, inputs.index[v.name], tuple(v.type.shape)))
            specs.append(f"{pn}: {fl_dtype(v.type.dtype)}[{', '.join(str(d) for d in v.type.shape)}]")
            header_params.append((pn, v, tuple(v.type.shape)))
        return pnames[v.name]

    def box(m, index, seq_axis, seq, depth_axis, depth):
        text, order = m.box(index, {seq_axis: (f"{seq}.start", f"{seq}.stop"), depth_axis: ("0", str(depth))})
        return f"{param(m.source)}[{text}]", order

    try:
        n_lead = len(lead)
        q_box, q_order = box(qm, q_index, n_lead, "qs", n_lead + 1, D)
        k_box, k_order = box(km, k_index, len(km.shape) - 2, "ts", len(km.shape) - 1, D)
        v_box, v_order = box(vm, v_index, len(vm.shape) - 2, "ts", len(vm.shape) - 1, Dv)
    except ValueError:
        fail(core_nodes and next(n for n in body.nodes if id(n) in core_nodes), "q, k or v is not a unit-stride box "
             "of its input")
    q_letters = "".join("s" if a == n_lead else "d" for a in q_order)
    k_letters = "".join("t" if a == len(km.shape) - 2 else "d" for a in k_order)
    v_letters = "".join("t" if a == len(vm.shape) - 2 else "e" for a in v_order)

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
    bq, bk = _blocks(math.prod(lead) or 1, S, T, max(D, Dv), 4, cfg, STAGES)

    w = Writer()
    header(w, node, body, "streaming attention", header_params, inputs.literals)
    w(f'@fl.kernel(target="{cfg.name}")')
    w(f"def {fname}({', '.join(specs)}, *, bq: int = {bq}, bk: int = {bk}, stages: int = {STAGES}):")
    with w.indent():
        w(f"S, T = {S}, {T}")
        out = names.new(result.name + "_out").upper()
        axes = " ".join(["_"] * len(lead) + ["S", "_"])
        w(f"{out} = fl.output(({', '.join(str(d) for d in lead + (S, Dv))}), {fl_dtype(result.type.dtype)}, "
          f'axes="{axes}")')
        grid = [f"range({d})" for d, e in zip(lead, lv) if d != 1] + ["fl.tiles(S, bq)"]
        gvars = [e for d, e in zip(lead, lv) if d != 1] + ["qs"]
        w(f"for {', '.join(gvars)} in fl.parallel({', '.join(grid)}):")
        with w.indent():
            qdt = fl_dtype(q.type.dtype)
            if scale is not None:
                w(f"qt = fl.mul(fl.load({q_box}), {literal(scale)}, dtype={qdt})   # the scale folded into q once")
            else:
                w(f"qt = fl.load({q_box})")
            w('m = fl.full((qs, 1), float("-inf"))   # running row max')
            w("l = o = None                         # running row sum, output (ACC)")
            w("for ts in fl.range(fl.tiles(T, bk), stages=stages):")
            with w.indent():
                w(f"kt = fl.load({k_box})")
                w(f"vt = fl.load({v_box})")
                w(f's = fl.contract("{q_letters},{k_letters}->st", qt, kt)')
                tiles = dict(inputs.literals)
                for name, b in operand_boxes.items():
                    t = names.new(name + "_t")
                    w(f"{t} = fl.load({b})")
                    tiles[name] = t
                cur = "s"
                if score_ops:
                    tiles[score_ops[0].inputs[0].name] = "s"
                    for x in score_ops[0].inputs:
                        if x.name in producer and producer[x.name].op.name == "matmul":
                            tiles[x.name] = "s"
                    emit = vector.VectorEmitter(w, names, label)
                    for p in score_ops:
                        cur = emit.node(p, [tiles[x.name] for x in p.inputs], p.inputs[0].type.rank - 1)
                        tiles[p.outputs[0].name] = cur
                if mask is not None:
                    if mask.type.dtype == DType.bool:
                        w(f's = fl.where({tiles[mask.name]}, s, float("-inf"))   # the mask keeps True')
                    else:
                        w(f"s = s + {tiles[mask.name]}")
                w(f"m_new = fl.maximum(m, {cur}.max(axis=-1))")
                w('m_safe = fl.where(m_new == float("-inf"), 0.0, m_new)   # rows masked so far stay 0')
                w(f"p = fl.exp({cur} - m_safe, dtype={fl_dtype(v.type.dtype)})")
                w("if o is not None:")
                with w.indent():
                    w("alpha = fl.exp(m - m_safe)   # how much the old max shrinks by")
                    w("fl.mul(o, alpha, out=o)")
                    w("l = fl.add(l * alpha, p.sum(axis=-1))")
                w("else:")
                with w.indent():
                    w("l = p.sum(axis=-1)")
                w(f'o = fl.contract("st,{v_letters}->se", p, vt, acc=o)')
                w("m = m_new")
            idx = ", ".join([q_index[i] for i in range(len(lead))] + ["qs", ":"])
            w(f"fl.store({out}[{idx}], fl.div(o, l, dtype={fl_dtype(result.type.dtype)}))")
        w(f"return {out}")
    results = (Result(0, tuple(node.outputs[0].type.shape)),)
    parts = ("view", "attention") + (("score ops",) if score_ops else ())
    return GeneratedKernel(fname, "attention", w.text(), cfg, tuple(kparams), results, parts)
