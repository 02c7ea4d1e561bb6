"""The convolution kernel: conv2d (NCHW, OIHW; any stride, padding, dilation; groups 1) as a
contraction over the channels per kernel offset, with an elementwise epilogue (bias, activation,
residual add; several convolutions of one output shape, e.g. a residual block's shortcut, each
with its own accumulator).

out[b, o, p, q] = sum over (kh, kw, c) of x[b, c, p*s + kh*d - pad, q*s + kw*d - pad] * w[o, c, kh, kw]

For one kernel offset (kh, kw) and a band of output rows and columns, the input elements are one
box of x: unit-stride after viewing x as (B, C, H/s, s, W/s, s) (a free reshape), where a row
p*s + r is (p + r // s, r % s). Padding needs no padded copy: output rows and columns are cut into
bands at the points where an offset starts or stops reading inside the image, so within a band
each offset reads wholly inside (it contributes) or wholly in the zero padding (it is skipped).
"""

from __future__ import annotations

import math

from fexplore.ir import Node
from fexplore.lang.examples._tiling import big_tile

from . import vector
from .common import Inputs, Signature, body_of, header, kernel_name, region_label
from .domain import aligned
from .errors import UnsupportedRegionError
from .generated import GeneratedKernel, Result
from .source import Names, Writer, cast_to, fl_dtype

STAGES = 2

HELPERS = '''\
def bands(n, cuts, size):
    """[0, n) in tiles of at most `size` rows that do not straddle any of `cuts`."""
    edges = sorted({0, n, *(c for c in cuts if 0 < c < n)})
    return [slice(i, min(i + size, hi)) for lo, hi in zip(edges, edges[1:]) for i in range(lo, hi, size)]


def taps(band, n, k, stride, dilation, pad):
    """The kernel offsets that read inside the input (size n) for every output row of `band`."""
    return [t for t in range(k)
            if band.start * stride + t * dilation - pad >= 0 and (band.stop - 1) * stride + t * dilation - pad < n]
'''


def generate_conv(node: Node, cfg) -> GeneratedKernel:
    body = body_of(node)
    label = region_label(node)
    inputs = Inputs.of(node, body)
    producer = {v.name: n for n in body.nodes for v in n.outputs}
    body_inputs = {v.name for v in body.inputs}

    def fail(n, why):
        raise UnsupportedRegionError(n.op.name, label, why, loc=n.loc, node=n)

    def source(v, n):
        while v.name in producer and producer[v.name].op.name in ("relayout", "cast"):
            if producer[v.name].op.name == "cast":
                casts.add(id(producer[v.name]))
            v = producer[v.name].inputs[0]
        if v.name not in body_inputs or v.name in inputs.literals:
            fail(n, "a convolution operand computed inside the region")
        return v

    casts: set = set()   # operand casts (the precision stage's): applied after the load
    convs = [n for n in body.nodes if n.op.name == "conv2d"]
    out_shape = tuple(convs[0].outputs[0].type.shape)
    specs = []
    for c in convs:
        if c.attrs["groups"] != 1:
            fail(c, f"a grouped convolution (groups={c.attrs['groups']})")
        if tuple(c.outputs[0].type.shape) != out_shape:
            fail(c, "convolutions of different output shapes in one region")
        x, w = source(c.inputs[0], c), source(c.inputs[1], c)
        bias = source(c.inputs[2], c) if len(c.inputs) == 3 else None
        (sh, sw), (ph, pw), (dh, dw) = c.attrs["stride"], c.attrs["padding"], c.attrs["dilation"]
        B, C, H, W = x.type.shape
        if (sh > 1 and H % sh) or (sw > 1 and W % sw):
            fail(c, f"a stride {sh}x{sw} that does not divide the input {H}x{W}")
        if c.inputs[0].type.dtype != c.inputs[1].type.dtype:
            fail(c, "input and weights of different dtypes")
        specs.append((c, x, w, bias))
    used = {id(c) for c in convs}
    epilogue = []
    for n in body.nodes:
        if id(n) in used or id(n) in casts or n.op.name == "relayout" and n.inputs[0].name in body_inputs:
            continue
        if n.op.name not in vector.SAME_NAME | vector.COMPOSED | vector.IDENTITY:
            fail(n, "in a convolution's epilogue (elementwise ops are handled)")
        epilogue.append(n)
    Bo, O, P, Q = out_shape

    # bands of output rows and columns, cut where an offset starts or stops reading the image
    rcuts, ccuts = set(), set()
    for c, x, w, _ in specs:
        (sh, sw), (ph, pw), (dh, dw) = c.attrs["stride"], c.attrs["padding"], c.attrs["dilation"]
        H, W = x.type.shape[2:]
        for t in range(w.type.shape[2]):
            rcuts |= {math.ceil((ph - t * dh) / sh), math.ceil((H + ph - t * dh) / sh)}
        for t in range(w.type.shape[3]):
            ccuts |= {math.ceil((pw - t * dw) / sw), math.ceil((W + pw - t * dw) / sw)}
    rcuts = sorted(c for c in rcuts if 0 < c < P)
    ccuts = sorted(c for c in ccuts if 0 < c < Q)
    Cmax = max(x.type.shape[1] for _, x, _, _ in specs)
    rows, to = max(1, big_tile(cfg) // Q), min(O, big_tile(cfg))
    rows = min(rows, P)
    while Bo * math.ceil(P / rows) * math.ceil(O / to) < cfg.num_pes and rows > 1:
        rows //= 2

    def footprint(r, t):
        return (2 * STAGES * (Cmax * r * Q + t * Cmax) * len(specs) + 2 * t * r * Q * (len(specs) + 1 + len(epilogue))) * 4

    while footprint(rows, to) > cfg.sram_bytes_per_pe // 2 and (rows > 1 or to > 4):
        if rows > 1:
            rows //= 2
        else:
            to = max(4, to // 2)
    if footprint(rows, to) > cfg.sram_bytes_per_pe // 2:
        fail(convs[0], f"one output row of {Q} columns does not fit one PE's SRAM on {cfg.name}")

    names = Names({"bands", "taps", "rows", "to", "stages", "b", "ps", "qs", "os_", "kh", "kw", "r", "rp", "c",
                   "cp"})
    fname = kernel_name(node)
    names.taken.add(fname)
    sig = Signature(names, inputs)
    add_param = sig.add

    conv_params = []
    for i, (c, x, w, bias) in enumerate(specs):
        cname = '"C"' if i == 0 else f'"C{i}"'   # each convolution contracts its own channels
        B, C, H, W = x.type.shape
        (sh, sw) = c.attrs["stride"]
        if sh > 1 or sw > 1:
            xshape = (B, C, H // sh, sh, W // sw, sw)
            xspec = ['"B"', cname, str(H // sh), str(sh), str(W // sw), str(sw)]
        else:
            xshape, xspec = (B, C, H, W), ['"B"', cname, str(H), str(W)]
        xn = add_param(x, xshape, xspec)
        wn = add_param(w, w.type.shape, ['"O"', cname, str(w.type.shape[2]), str(w.type.shape[3])])
        bn = add_param(bias, (O, 1, 1), ['"O"', "1", "1"]) if bias is not None else None
        conv_params.append((c, x, w, xn, wn, bn))
    epi_boxes = {}
    for n in epilogue:
        for v in n.inputs:
            if v.name in body_inputs and v.name not in inputs.literals and v.name not in epi_boxes:
                if v.type.rank > 4:
                    fail(n, "an epilogue operand with more axes than the result")
                sh = aligned(tuple(v.type.shape), 4)
                spec = [f'"{a}"' if s == d and d != 1 else str(s) for s, d, a in zip(sh, out_shape, "BOPQ")]
                full = [s == d and d != 1 for s, d in zip(sh, out_shape)]
                idx = ["b" if full[0] else "0"] + [var if f else "0:1" for var, f in zip(("os_", "ps", "qs"), full[1:])]
                pn = add_param(v, sh, spec)
                epi_boxes[v.name] = f"{pn}[{', '.join(idx)}]"

    w_ = Writer()
    header(w_, node, body, "convolution", sig.header, inputs.literals)
    for line in HELPERS.splitlines():
        w_(line)
    w_()
    w_()
    w_(f'@fl.kernel(target="{cfg.name}")')
    w_(f"def {fname}({', '.join(sig.annotations)}, *, rows: int = {rows}, to: int = {to}, stages: int = {STAGES}):")
    with w_.indent():
        w_(f"B, O, P, Q = {Bo}, {O}, {P}, {Q}")
        onames = []
        results = []
        for i, o in enumerate(body.outputs):
            on = names.new(o.name + "_out").upper()
            onames.append(on)
            results.append(Result(i, tuple(node.outputs[i].type.shape)))
            w_(f'{on} = fl.output((B, O, P, Q), {fl_dtype(o.type.dtype)}, axes="B O P Q")')
        w_(f"# output rows and columns in bands: in each, a kernel offset reads all inside the input or "
           f"all in the padding")
        w_(f"for b, ps, qs, os_ in fl.parallel(range(B), bands(P, {tuple(rcuts)}, rows), "
           f"bands(Q, {tuple(ccuts)}, Q), fl.tiles(O, to), stages=stages):")
        with w_.indent():
            tiles = dict(inputs.literals)
            for c, x, w, xn, wn, bn in conv_params:
                acc = names.new("acc")
                (sh, sw), (ph, pw), (dh, dw) = c.attrs["stride"], c.attrs["padding"], c.attrs["dilation"]
                B, C, H, W = x.type.shape
                KH, KW = w.type.shape[2:]
                w_(f"{acc} = None")
                w_(f"for kh, kw in fl.range([(kh, kw) for kh in taps(ps, {H}, {KH}, {sh}, {dh}, {ph}) "
                   f"for kw in taps(qs, {W}, {KW}, {sw}, {dw}, {pw})], stages=stages):")
                with w_.indent():
                    if sh > 1 or sw > 1:
                        w_(f"r, rp = divmod({_offset('kh', dh, ph)}, {sh})   # input row of output row p: "
                           f"{sh} * (p + r) + rp")
                        w_(f"c, cp = divmod({_offset('kw', dw, pw)}, {sw})")
                        box = f"{xn}[b, :, ps.start + r:ps.stop + r, rp, qs.start + c:qs.stop + c, cp]"
                    else:
                        w_(f"r, c = {_offset('kh', dh, ph)}, {_offset('kw', dw, pw)}")
                        box = f"{xn}[b, :, ps.start + r:ps.stop + r, qs.start + c:qs.stop + c]"
                    patch = cast_to(f"fl.load({box})", x.type.dtype, c.inputs[0].type.dtype)
                    wt = cast_to(f"fl.load({wn}[os_, :, kh, kw])", w.type.dtype, c.inputs[1].type.dtype)
                    w_(f'{acc} = fl.contract("cpq,oc->opq", {patch}, {wt}, acc={acc})')
                w_(f"if {acc} is None:   # every offset reads padding: the band is zeros")
                with w_.indent():
                    w_(f"{acc} = fl.zeros((os_, ps, qs), space=fl.ACC)")
                val = acc
                if bn is not None:
                    bt = names.new(bn + "_t")
                    val = names.new(c.outputs[0].name)
                    w_(f"{bt} = fl.load({bn}[os_, :, :])")
                    w_(f"{val} = {acc} + {bt}")
                if c.outputs[0].type.dtype.name != "f32":
                    cast = names.new(val + "_c")
                    w_(f"{cast} = {val}.astype({fl_dtype(c.outputs[0].type.dtype)})")
                    val = cast
                tiles[c.outputs[0].name] = val
            for n in body.nodes:
                if n.op.name == "relayout" and n.inputs[0].name in body_inputs:
                    tiles[n.outputs[0].name] = None
            for name, box in epi_boxes.items():
                t = names.new(box.split("[")[0] + "_t")
                w_(f"{t} = fl.load({box})")
                tiles[name] = t
            emit = vector.VectorEmitter(w_, names, label)
            for n in epilogue:
                tiles[n.outputs[0].name] = emit.node(n, [tiles[v.name] for v in n.inputs], -1)
            for o, on in zip(body.outputs, onames):
                w_(f"fl.store({on}[b, os_, ps, qs], {tiles[o.name]})")
        w_(f"return {', '.join(onames)}")
    parts = ("convolution", "epilogue") if epilogue or any(s[3] for s in specs) else ("convolution",)
    return GeneratedKernel(fname, "convolution", w_.text(), cfg, tuple(sig.params), tuple(results), parts)


def _offset(var: str, dilation: int, pad: int) -> str:
    """``kh * d - pad``, written without the terms that do nothing."""
    text = var if dilation == 1 else f"{var} * {dilation}"
    return text if pad == 0 else f"{text} - {pad}"
