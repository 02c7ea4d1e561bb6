"""The convolution kernel: conv2d (NCHW, OIHW; any stride, padding, dilation and groups; a conv1d
arrives as a conv2d of height 1) as a contraction over the channels per kernel offset, with an
elementwise epilogue (bias, activation, residual add; several convolutions of one output shape,
e.g. a residual block's shortcut, each with its own accumulator). A zero `pad` of the input inside
the region is folded into the convolution's own padding (top/left shift the offsets; bottom/right
only make the output larger, which its shape already says).

out[b, o, p, q] = sum over (kh, kw, c) of x[b, c, p*s + kh*d - pad, q*s + kw*d - pad] * w[o, c, kh, kw]

For one kernel offset (kh, kw) and a band of output rows and columns, the input elements are one
box of x: unit-stride after viewing x as (B, C, H/s, s, W/s, s) (a free reshape), where a row
p*s + r is (p + r // s, r % s). The boxes of all the offsets of a band lie in one window of that
view. An item (a tile of output channels and a group of output rows, sized by a per-PE model of
weight and window bytes against MACs) loads its weights for every offset once, and each of its
bands loads the window once; each offset's contraction reads slices of them in SRAM (no copy): a
3x3 convolution moves its input about once instead of nine times, in one DMA instead of nine.
Padding needs no padded copy: near a border an offset adds only into the part of the accumulator
whose inputs lie inside the image (`covered`, a contraction into a slice of the accumulator).
When a window does not fit a small SRAM, each offset loads its own patch instead, and bands are
cut where an offset starts or stops reading inside the image (`taps`), so within one each offset
reads wholly inside or wholly in the zero padding. If even one offset's patch of every input
channel does not fit (a 1x1 convolution over a concat of a thousand channels on `tiny`), each
offset loads tiles of `tc` input channels, all accumulating into the item's accumulator.

A stride that does not divide the input (a 37-pixel image, stride 2: the last window is partial)
has no such free view; along that axis the bands are one output row (or column) wide, and the
offsets read a unit-stride run of input rows, x[..., p*s + min r : p*s + max r + 1, ...]: correct,
and priced honestly (more, smaller DMA and tensor-unit commands).

Groups: output channels are tiled inside a group, and the tile reads its group's input channels.
A depthwise convolution (one input channel per group, one output per group) would give the tensor
unit a contraction of length 1, so it runs on the vector unit instead, as a real compiler would:
a multiply-accumulate of the window, `to` channels at a time.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

from fexplore.ir import DType, Node, Value
from fexplore.lang.examples._tiling import big_tile, grow_back

from . import vector
from .common import Inputs, Signature, body_of, header, kernel_name, region_label
from .domain import aligned
from .errors import UnsupportedRegionError
from .generated import GeneratedKernel, Result
from .source import Names, Writer, cast_to, fl_dtype

STAGES = 2

COVERED = '''\
def covered(band, n, k, stride, dilation, pad):
    """Per kernel offset t that reads inside the input (size n) for some output row of `band`:
    (t, first, stop), the output rows p of the band whose input row p * stride + t * dilation - pad
    is inside; the others read the padding, which adds nothing."""
    out = []
    for t in range(k):
        off = t * dilation - pad
        first, stop = max(band.start, -(off // stride)), min(band.stop, -((off - n) // stride))
        if first < stop:
            out.append((t, first, stop))
    return out
'''

HELPERS = '''\
def bands(span, cuts, size):
    """`span` (a slice, or n for [0, n)) in tiles of at most `size` rows that do not straddle any of `cuts`."""
    first, last = (0, span) if isinstance(span, int) else (span.start, span.stop)
    edges = sorted({first, last, *(c for c in cuts if first < c < last)})
    return [slice(i, min(i + size, hi)) for lo, hi in zip(edges, edges[1:]) for i in range(lo, hi, size)]


def taps(band, n, k, stride, dilation, pad):
    """The kernel offsets that read inside the input (size n) for every output row of `band`."""
    return [t for t in range(k)
            if band.start * stride + t * dilation - pad >= 0 and (band.stop - 1) * stride + t * dilation - pad < n]


def reach(offsets, stride, dilation, pad):
    """The input window the `covered` offsets read, in the input seen as (rows // stride, stride):
    (first row, stop row, first phase, stop phase); a stride of 1 has the one phase 0."""
    spans = [(first + r, stop + r, p) for t, first, stop in offsets for r, p in [divmod(t * dilation - pad, stride)]]
    return (min(a for a, _, _ in spans), max(b for _, b, _ in spans),
            min(p for _, _, p in spans), max(p for _, _, p in spans) + 1)


def group_tiles(groups, per_group, size):
    """Tiles of the output channels that stay inside one group (`per_group` channels each)."""
    return [slice(g * per_group + i, g * per_group + min(i + size, per_group))
            for g in range(groups) for i in range(0, per_group, size)]
'''


@dataclass
class _Conv:
    """One conv2d of the region, with the region inputs it reads and its geometry."""

    node: Node
    x: Value            # the region input read as the convolution's input (before a folded pad)
    x_shape: tuple      # its (B, C, H, W): a reshape of it is a free view (a conv1d's added height)
    w: Value
    bias: Value | None
    stride: tuple[int, int]
    pad: tuple[int, int]        # top and left: the conv's own padding plus a folded pad's
    dilation: tuple[int, int]
    groups: int
    split: tuple[bool, bool]    # the stride divides the input along this axis: read through a free view

    @property
    def depthwise(self) -> bool:
        C, O = self.x_shape[1], self.w.type.shape[0]
        return self.groups > 1 and self.groups == C == O


def generate_conv(node: Node, cfg) -> GeneratedKernel:
    body = body_of(node)
    label = region_label(node)
    inputs = Inputs.of(node, body)
    producer = {v.name: n for n in body.nodes for v in n.outputs}
    body_inputs = {v.name for v in body.inputs}

    def fail(n, why):
        raise UnsupportedRegionError(n.op.name, label, why, loc=n.loc, node=n)

    folded: set = set()   # operand casts (the precision stage's, applied after the load) and zero pads

    def source(v, n, pads=None):
        reshaped = False
        while v.name in producer and producer[v.name].op.name in ("relayout", "cast", "pad", "reshape"):
            p = producer[v.name]
            if p.op.name == "reshape":
                reshaped = True
            elif p.op.name == "pad":
                if reshaped:
                    fail(p, "a pad before a reshape into a convolution's input")
                if pads is None:
                    fail(p, "a pad of a convolution's weights")
                pp = list(p.attrs["pads"]) + [0] * (4 - len(p.attrs["pads"]))
                if float(p.attrs["value"]) != 0.0 or any(pp[4:]) or p.inputs[0].type.rank != 4:
                    fail(p, "a pad before a convolution other than zeros around the image")
                pads[0] += pp[2]
                pads[1] += pp[0]
                pads_hw[0].append(pp[2] + pp[3])
                pads_hw[1].append(pp[0] + pp[1])
            folded.add(id(p))
            v = p.inputs[0]
        if v.name not in body_inputs or v.name in inputs.literals:
            fail(n, "a convolution operand computed inside the region (only casts, relayouts and zero "
                    "pads are folded)")
        return v

    convs = [n for n in body.nodes if n.op.name == "conv2d"]
    out_shape = tuple(convs[0].outputs[0].type.shape)
    specs: list[_Conv] = []
    for c in convs:
        if tuple(c.outputs[0].type.shape) != out_shape:
            fail(c, "convolutions of different output shapes in one region")
        pads, pads_hw = [0, 0], ([], [])
        x, w = source(c.inputs[0], c, pads), source(c.inputs[1], c)
        bias = source(c.inputs[2], c) if len(c.inputs) == 3 else None
        if w.type.shape != c.inputs[1].type.shape:
            fail(c, "reshaped convolution weights")
        (sh, sw), (ph, pw) = c.attrs["stride"], c.attrs["padding"]
        B, C, Hp, Wp = c.inputs[0].type.shape
        H, W = Hp - sum(pads_hw[0]), Wp - sum(pads_hw[1])
        if c.inputs[0].type.dtype != c.inputs[1].type.dtype:
            fail(c, "input and weights of different dtypes")
        specs.append(_Conv(c, x, (B, C, H, W), w, bias, (sh, sw), (ph + pads[0], pw + pads[1]), tuple(c.attrs["dilation"]),
                           c.attrs["groups"], (sh == 1 or H % sh == 0, sw == 1 or W % sw == 0)))
    if len({(s.groups, s.depthwise) for s in specs}) > 1:
        fail(convs[1], "convolutions of different groups in one region")
    groups, depthwise = specs[0].groups, specs[0].depthwise
    used = {id(c) for c in convs}
    epilogue = []
    for n in body.nodes:
        if id(n) in used or id(n) in folded or n.op.name == "relayout" and n.inputs[0].name in body_inputs:
            continue
        if n.op.name not in vector.SAME_NAME | vector.COMPOSED | vector.IDENTITY:
            fail(n, "in a convolution's epilogue (elementwise ops are handled)")
        if math.prod(n.outputs[0].type.shape) > math.prod(out_shape):
            fail(n, "an epilogue that broadcasts the convolution's result to a larger shape (a squeeze-"
                    "and-excitation scale): the kernel's tiles are the convolution's output")
        epilogue.append(n)
    Bo, O, P, Q = out_shape
    Og = O // groups

    # bands of output rows and columns, cut where an offset starts or stops reading the image
    rcuts, ccuts = set(), set()
    for sp in specs:
        (sh, sw), (ph, pw), (dh, dw) = sp.stride, sp.pad, sp.dilation
        H, W = sp.x_shape[2:]
        for t in range(sp.w.type.shape[2]):
            rcuts |= {math.ceil((ph - t * dh) / sh), math.ceil((H + ph - t * dh) / sh)}
        for t in range(sp.w.type.shape[3]):
            ccuts |= {math.ceil((pw - t * dw) / sw), math.ceil((W + pw - t * dw) / sw)}
    rcuts = sorted(c for c in rcuts if 0 < c < P)
    ccuts = sorted(c for c in ccuts if 0 < c < Q)
    Cmax = max(sp.x_shape[1] // sp.groups for sp in specs)
    one_row = not all(sp.split[0] for sp in specs)      # a stride that does not divide the height
    one_col = not all(sp.split[1] for sp in specs)
    cols = 1 if one_col else Q
    # a depthwise convolution's groups are one channel each: its tiles span channels (every one of
    # them its own group), not the channels of one group
    rows, to = max(1, big_tile(cfg) // cols), min(O if depthwise else Og, big_tile(cfg))
    rows = 1 if one_row else min(rows, P)
    while Bo * math.ceil(P / rows) * groups * math.ceil(Og / to) < cfg.num_pes and rows > 1:
        rows //= 2

    halo = max((sp.w.type.shape[2] - 1) * sp.dilation[0] + 1 for sp in specs), \
        max((sp.w.type.shape[3] - 1) * sp.dilation[1] + 1 for sp in specs)
    smax = max(sp.stride[0] for sp in specs), max(sp.stride[1] for sp in specs)
    taps_max = max(sp.w.type.shape[2] * sp.w.type.shape[3] for sp in specs)

    # copies of a loaded input tile: the load, and one per cast after it (to the operand dtype; a
    # depthwise one on to f32 for the vector unit). An f32 input narrowed to bf16 for a depthwise
    # convolution is three windows, not one: counted once, 128 channels at 28 x 28 overflowed tiny
    copies = max(1 + (sp.x.type.dtype != sp.node.inputs[0].type.dtype) +
                 (depthwise and sp.node.inputs[0].type.dtype != DType.f32) for sp in specs)
    # per output tile: the accumulator, each epilogue op's result and, depthwise, a tap's product
    per_output = len(specs) + 1 + len(epilogue) + int(depthwise)

    def footprint(r, t, window, c=Cmax):
        x_rows = t if depthwise else c   # a depthwise tap reads the tile's own channels
        w_cols = 1 if depthwise else c
        if window:   # the input window and all the offsets' weights of an item, double buffered by items
            operands = STAGES * (copies * x_rows * (r * smax[0] + halo[0]) * (cols * smax[1] + halo[1]) +
                                 t * w_cols * taps_max) * len(specs)
        else:        # a patch and an offset's weights, double buffered by the offset loop, per item
            operands = 2 * STAGES * (copies * x_rows * r * cols + t * w_cols) * len(specs)
        return (operands + 2 * t * r * cols * per_output) * 4

    def fit(window, tile_channels=False, start=(rows, to)):
        # every try starts from the same tiles (`start`: the call below rebinds rows and to)
        r, t, c = *start, Cmax
        budget = cfg.sram_bytes_per_pe // 2
        while footprint(r, t, window, c) > budget and (r > 1 or t > 4 or tile_channels and c > 4):
            if r > 1:
                r //= 2
            elif tile_channels and c > 4 and (c >= t or t <= 4):
                c = -(-c // 2)
            else:
                t = max(4, t // 2)
        if footprint(r, t, window, c) > budget:
            return r, t, c, False
        # give back what the order of the cuts took without need: the rows and output channels
        # are cut before the input channels, so with many input channels the output tile went to
        # 4 although halving the channel tile once more would have fitted
        r, t, c = grow_back([r, t, c], [*start, Cmax if tile_channels else c],
                            lambda r, t, c: footprint(r, t, window, c) <= budget)
        return r, t, c, True

    # a window per item when one fits (it moves the input about once, not once per offset); else
    # (a small SRAM, many input channels) a load per offset; and if an offset's patch of every
    # input channel does not fit either, a load per offset and tile of input channels (`tc`)
    rows_w, to_w, _, window = fit(True)
    rows, to, tc, fits = (rows_w, to_w, Cmax, True) if window else fit(False)
    if not fits and not depthwise:
        rows, to, tc, fits = fit(False, tile_channels=True)
    if not fits:
        fail(convs[0], f"one output row of {Q} columns does not fit one PE's SRAM on {cfg.name}")
    channel_tiles = tc < Cmax
    if window:
        split = _split_over_pes(specs, out_shape, one_row, one_col, depthwise, cfg,
                                lambda r, t: footprint(r, t, True) <= cfg.sram_bytes_per_pe // 2)
        if split is not None:
            rows, to = split

    names = Names({"bands", "taps", "reach", "group_tiles", "rows", "to", "stages", "b", "ps", "qs", "os_", "kh",
                   "kw", "r", "rp", "c", "cp", "c0", "xt", "wt", "rw", "cw", "xw", "pg", "covered", "rows_in",
                   "cols_in", "p0", "p1", "q0", "q1", "part", "cs", "tc"})
    fname = kernel_name(node)
    names.taken.add(fname)
    sig = Signature(names, inputs)
    add_param = sig.add

    conv_params = []
    for i, sp in enumerate(specs):
        cname = '"C"' if i == 0 else f'"C{i}"'   # each convolution contracts its own channels
        if sp.depthwise:   # channel c of x meets weight row c: one axis, so a tile of channels lines up
            cname = '"O"'
        B, C, H, W = sp.x_shape
        xshape, xspec = [B, C], ['"B"', cname]
        for n, s, split in ((H, sp.stride[0], sp.split[0]), (W, sp.stride[1], sp.split[1])):
            dims = (n // s, s) if s > 1 and split else (n,)
            xshape += dims
            xspec += [str(d) for d in dims]
        xn = add_param(sp.x, tuple(xshape), xspec)
        O_, Cg, KH, KW = sp.w.type.shape
        if depthwise:   # (O, 1, KH, KW) viewed as (O, KH, KW, 1, 1): a tap is a column of weights per channel
            wn = add_param(sp.w, (O_, KH, KW, 1, 1), ['"O"', str(KH), str(KW), "1", "1"])
        else:
            wn = add_param(sp.w, sp.w.type.shape, ['"O"', cname if groups == 1 else str(Cg), str(KH), str(KW)])
        bn = add_param(sp.bias, (O, 1, 1), ['"O"', "1", "1"]) if sp.bias is not None else None
        conv_params.append((sp, xn, wn, bn))
    # a relayout of a region input is a free view to the kernel (it reads values, not layouts): the
    # epilogue reads the input itself (a residual add of a value made in another layout)
    relaid = {n.outputs[0].name: n.inputs[0] for n in body.nodes
              if n.op.name == "relayout" and n.inputs[0].name in body_inputs}
    for o in body.outputs:   # every output is stored as a tile of the convolution's output shape
        if tuple(o.type.shape) != out_shape:
            fail(producer.get(o.name, convs[0]), f"a region output of shape {list(o.type.shape)} beside the "
                 f"convolution's {list(out_shape)}")
    # the region inputs the epilogue reads, and those an output passes on (relaid or not: a region
    # split to fit SRAM hands a value it does not compute to the piece after it), loaded as tiles
    read = [(n, v) for n in epilogue for v in n.inputs] + \
        [(producer.get(o.name, convs[0]), o) for o in body.outputs if o.name in relaid or o.name in body_inputs]
    epi_boxes = {}
    for n, v in read:
        v = relaid.get(v.name, v)
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
    for line in (COVERED + '\n\n' + HELPERS).splitlines():   # read here: a mutant may patch either
        w_(line)
    w_()
    w_()
    w_(f'@fl.kernel(target="{cfg.name}")')
    # a stride that does not divide the height reads one input row per band: `rows` is fixed at 1
    # then, not a tiling parameter the schedule's search may change
    row_param = f"rows: int = {rows}, " if window or not one_row else ""
    channel_param = f"tc: int = {tc}, " if channel_tiles else ""
    w_(f"def {fname}({', '.join(sig.annotations)}, *, {row_param}to: int = {to}, {channel_param}"
       f"stages: int = {STAGES}):")
    with w_.indent():
        w_(f"B, O, P, Q = {Bo}, {O}, {P}, {Q}")
        onames = []
        results = []
        for i, o in enumerate(body.outputs):
            on = names.new(o.name + "_out").upper()
            onames.append(on)
            results.append(Result(i, tuple(node.outputs[i].type.shape)))
            w_(f'{on} = fl.output((B, O, P, Q), {fl_dtype(o.type.dtype)}, axes="B O P Q")')
        otiles = "fl.tiles(O, to)" if groups == 1 or depthwise else f"group_tiles({groups}, {Og}, to)"
        col_bands = f"bands(Q, {tuple(ccuts)}, {'1' if one_col else 'Q'})"
        band_loop = contextlib.ExitStack()
        if window:
            w_("# an item: a tile of output channels and a group of output rows, whose weights load once")
            w_(f"for b, pg, os_ in fl.parallel(range(B), fl.tiles(P, rows), {otiles}, stages=stages):")
        else:
            w_("# output rows and columns in bands: in each, a kernel offset reads all inside the input or "
               "all in the padding")
            w_(f"for b, ps, qs, os_ in fl.parallel(range(B), bands(P, {tuple(rcuts)}, {'1' if one_row else 'rows'}), "
               f"{col_bands}, {otiles}, stages=stages):")
        with w_.indent(), band_loop:
            tiles = dict(inputs.literals)
            if groups > 1 and not depthwise:
                Cg = specs[0].w.type.shape[1]
                w_(f"c0 = os_.start // {Og} * {Cg}   # the group's first input channel")
            weights, biases = [], []
            for sp, xn, wn, bn in conv_params:
                wt = None
                if window:
                    wt = names.new("ww")
                    wbox = f"{wn}[os_, :, :]" if depthwise else f"{wn}[os_, :, :, :]"
                    w_(f"{wt} = {_operand_casts(f'fl.load({wbox})', sp.w.type.dtype, sp.node.inputs[1].type.dtype, depthwise)}")
                weights.append(wt)
                bt = None
                if bn is not None:
                    bt = names.new(bn + "_t")
                    w_(f"{bt} = fl.load({bn}[os_, :, :])")
                biases.append(bt)
            if window:
                if one_row or one_col:
                    w_("# bands of one output row (column) where the stride does not divide the input")
                w_(f"for ps, qs in fl.range([(ps, qs) for ps in bands(pg, (), {'1' if one_row else 'P'}) "
                   f"for qs in bands(Q, (), {'1' if one_col else 'Q'})], stages=stages):")
                band_loop.enter_context(w_.indent())
            rounded = set()   # casts the convolutions' values were written through
            for (sp, xn, wn, bn), wt, bt in zip(conv_params, weights, biases):
                c = sp.node
                acc = names.new("acc")
                B, C, H, W = sp.x_shape
                channels = "os_" if depthwise else (":" if groups == 1 else f"c0:c0 + {C // groups}")
                xdt, wdt = c.inputs[0].type.dtype, c.inputs[1].type.dtype
                if window:
                    w_(f"{acc} = fl.zeros((os_, ps, qs){'' if depthwise else ', space=fl.ACC'})")
                    _window_taps(w_, sp, xn, wt, acc, channels, depthwise, xdt)
                else:
                    w_(f"{acc} = None")
                    _tap_loads(w_, sp, xn, wn, acc, channels, depthwise, xdt, wdt, channel_tiles)
                    w_(f"if {acc} is None:   # every offset reads padding: the band is zeros")
                    with w_.indent():
                        w_(f"{acc} = fl.zeros((os_, ps, qs){'' if depthwise else ', space=fl.ACC'})")
                cast = vector.contraction_value(w_, names, acc, bt, c, body, body.outputs, tiles)
                if cast is not None:
                    rounded.add(id(cast))
            for name, box in epi_boxes.items():
                t = names.new(box.split("[")[0] + "_t")
                w_(f"{t} = fl.load({box})")
                tiles[name] = t
            for out, v in relaid.items():   # (a convolution's own operand's relayout is read by no epilogue)
                tiles[out] = tiles.get(v.name)
            emit = vector.VectorEmitter(w_, names, label)
            for n in (n for n in epilogue if id(n) not in rounded):
                tiles[n.outputs[0].name] = emit.node(n, [tiles[v.name] for v in n.inputs], -1)
            for o, on in zip(body.outputs, onames):
                w_(f"fl.store({on}[b, os_, ps, qs], {tiles[o.name]})")
        w_(f"return {', '.join(onames)}")
    parts = ("convolution", "epilogue") if epilogue or any(sp.bias for sp in specs) else ("convolution",)
    if depthwise:
        parts = ("depthwise",) + parts[1:]
    return GeneratedKernel(fname, "convolution", w_.text(), cfg, tuple(sig.params), tuple(results), parts)


def _offset(var: str, dilation: int, pad: int) -> str:
    """``kh * d - pad``, written without the terms that do nothing."""
    text = var if dilation == 1 else f"{var} * {dilation}"
    return text if pad == 0 else f"{text} - {pad}"


def _operand_casts(load: str, stored, op_dt, depthwise: bool) -> str:
    """A loaded operand in the convolution's operand dtype; a depthwise one then widened to f32 for
    the vector unit (rounded to the operand dtype first, as the tensor unit would)."""
    return cast_to(cast_to(load, stored, op_dt), op_dt, DType.f32) if depthwise else cast_to(load, stored, op_dt)


def _window_taps(w_, sp: _Conv, xn: str, ww: str, acc: str, channels: str, depthwise: bool, xdt) -> None:
    """One load of the input window the band's kernel offsets read; each offset's patch, and its
    weights in the item's weight tile `ww`, are slices (views in SRAM, no copy), and it adds into
    the part of the accumulator whose inputs lie inside the image (near a border, an offset reads
    the zero padding for some output rows: they get nothing from it, and no padded copy is made).
    Along an axis the stride divides, the window is read through the free view (rows // s, s), all
    of a column's phases (so a window row is one contiguous run in DRAM, not an element every s);
    along one it does not, the band is one output row, whose offsets read a unit-stride run."""
    (sh, sw), (ph, pw), (dh, dw) = sp.stride, sp.pad, sp.dilation
    B, C, H, W = sp.x_shape
    KH, KW = sp.w.type.shape[2:]
    axes = []
    for var, cov, win, band, n, k, s, d, pad, split in (("r", "rows_in", "rw", "ps", H, KH, sh, dh, ph, sp.split[0]),
                                                        ("c", "cols_in", "cw", "qs", W, KW, sw, dw, pw, sp.split[1])):
        if s > 1 and not split:   # the input rows of the band's one output row, unit stride
            w_(f"{band}_in = slice({band}.start * {s}, {band}.start * {s} + 1)   # where output {band}.start reads from")
            band, s = f"{band}_in", 1
        w_(f"{cov} = covered({band}, {n}, {k}, {s}, {d}, {pad})   # (offset, first, stop output row) inside the input")
        axes.append((var, cov, win, band, s, d, pad))
    w_(f"if {axes[0][1]} and {axes[1][1]}:   # one load of the input window they read, sliced per offset")
    with w_.indent():
        box = []
        for var, cov, win, band, s, d, pad in axes:
            w_(f"{win} = reach({cov}, {s}, {d}, {pad})")
            box.append(f"{win}[0]:{win}[1]" + ("" if s == 1 else ", :" if var == "c" else f", {win}[2]:{win}[3]"))
        xbox = f"{xn}[b, {channels}, {', '.join(box)}]"
        w_(f"xw = {_operand_casts(f'fl.load({xbox})', sp.x.type.dtype, xdt, depthwise)}")
        (_, rcov, rw, rband, rs, _, _), (_, ccov, cw, cband, cs, _, _) = axes
        w_(f"for kh, p0, p1 in {rcov}:")
        with w_.indent():
            w_(f"for kw, q0, q1 in {ccov}:")
            with w_.indent():
                idx = []
                for var, cov, win, band, s, d, pad in axes:
                    lo, hi = ("p0", "p1") if var == "r" else ("q0", "q1")
                    off = _offset("kh" if var == "r" else "kw", d, pad)
                    w_(f"{var}, {var}p = divmod({off}, {s})" if s > 1 else f"{var} = {off}")
                    rows = f"{lo} + {var} - {win}[0]:{hi} + {var} - {win}[0]"
                    idx.append(rows if s == 1 else f"{rows}, {var}p" if var == "c" else f"{rows}, {var}p - {win}[2]")
                part = f"{acc}[:, p0 - {rband}.start:p1 - {rband}.start, q0 - {cband}.start:q1 - {cband}.start]"
                patch = f"xw[:, {', '.join(idx)}]"
                if depthwise:   # the vector unit: f32 multiply-accumulate over the window
                    w_(f"part = {part}")
                    w_(f"fl.add(part, {patch} * {ww}[:, kh, kw], out=part)")
                else:
                    w_(f'fl.contract("cpq,oc->opq", {patch}, {ww}[:, :, kh, kw], acc={part})')


def _tap_loads(w_, sp: _Conv, xn: str, wn: str, acc: str, channels: str, depthwise: bool, xdt, wdt,
               channel_tiles: bool = False) -> None:
    """Per kernel offset, a load of its patch and of its weights, double buffered by the offset loop
    (when an item's window does not fit the SRAM); with `channel_tiles`, per offset and tile of
    `tc` input channels (when not even one offset's patch of every channel fits), all accumulating
    into the one accumulator."""
    (sh, sw), (ph, pw), (dh, dw) = sp.stride, sp.pad, sp.dilation
    B, C, H, W = sp.x_shape
    KH, KW = sp.w.type.shape[2:]
    offsets = f"taps(ps, {H}, {KH}, {sh}, {dh}, {ph}) for kw in taps(qs, {W}, {KW}, {sw}, {dw}, {pw})"
    w_channels = ":"
    if channel_tiles:
        Cg = sp.w.type.shape[1]
        w_(f"for kh, kw, cs in fl.range([(kh, kw, cs) for kh in {offsets} "
           f"for cs in fl.tiles({Cg}, tc)], stages=stages):")
        channels = "cs" if channels == ":" else "c0 + cs.start:c0 + cs.stop"
        w_channels = "cs"
    else:
        w_(f"for kh, kw in fl.range([(kh, kw) for kh in {offsets}], stages=stages):")
    with w_.indent():
        boxes = []
        for var, band, s, d, pad, split in (("r", "ps", sh, dh, ph, sp.split[0]),
                                            ("c", "qs", sw, dw, pw, sp.split[1])):
            off = _offset("kh" if var == "r" else "kw", d, pad)
            if s == 1:
                w_(f"{var} = {off}")
                boxes.append(f"{band}.start + {var}:{band}.stop + {var}")
            elif split:
                what = "row" if var == "r" else "column"
                w_(f"{var}, {var}p = divmod({off}, {s})   # input {what} of output {what} p: "
                   f"{s} * (p + {var}) + {var}p")
                boxes.append(f"{band}.start + {var}:{band}.stop + {var}, {var}p")
            else:   # the stride does not divide the input: a band is one row (column) wide
                w_(f"{var} = {band}.start * {s} + {off}")
                boxes.append(f"{var}:{var} + 1")
        box = f"{xn}[b, {channels}, {', '.join(boxes)}]"
        wbox = f"{wn}[os_, kh, kw]" if depthwise else f"{wn}[os_, {w_channels}, kh, kw]"
        patch = _operand_casts(f"fl.load({box})", sp.x.type.dtype, xdt, depthwise)
        wt = _operand_casts(f"fl.load({wbox})", sp.w.type.dtype, wdt, depthwise)
        if depthwise:   # the vector unit: f32 multiply-accumulate over the window
            w_(f"xt, wt = {patch}, {wt}")
            w_(f"{acc} = xt * wt if {acc} is None else {acc} + xt * wt")
        else:
            w_(f'{acc} = fl.contract("cpq,oc->opq", {patch}, {wt}, acc={acc})')


def _split_over_pes(specs, out_shape, one_row: bool, one_col: bool, depthwise: bool, cfg, fits):
    """(rows, to): the group of output rows and the tile of output channels of one item that
    finishes first by a per-PE model, or None if no candidate fits. Each PE's DMA engine brings an
    item's weights for every offset once and the input window of each of its bands (the whole
    group, or one row or column per band where the stride does not divide the input): a late layer
    of few pixels and many channels wants whole images and few channels per item, an early one the
    reverse; the tensor unit (the vector unit, depthwise) does its MACs; and a PE with one item
    more than another makes the others wait (rounds)."""
    Bo, O, P, Q = out_shape
    groups = specs[0].groups
    per_group = O if depthwise else O // groups
    candidates_rows = sorted({min(P, 1 << i) for i in range(P.bit_length() + 1)} | {P})
    candidates_to, t = [], per_group
    while True:
        candidates_to.append(t)
        if t <= 8:
            break
        t = -(-t // 2)
    band_cols = 1 if one_col else Q
    best = None
    for r in candidates_rows:
        band_rows = 1 if one_row else r
        bands = (r if one_row else 1) * (Q if one_col else 1)   # per item
        for t in candidates_to:
            if not fits(r if not one_row else 1, t):
                continue
            items = Bo * -(-P // r) * (1 if depthwise else groups) * -(-per_group // t)
            rounds = -(-items // cfg.num_pes)
            nbytes, work = 0, 0.0
            for sp in specs:
                (sh, sw), (dh, dw) = sp.stride, sp.dilation
                KH, KW = sp.w.type.shape[2:]
                cin = t if depthwise else sp.x_shape[1] // groups
                window = cin * ((band_rows - 1) * sh + (KH - 1) * dh + 1) * (band_cols * sw + (KW - 1) * dw)
                nbytes += bands * window * max(sp.x.type.dtype.itemsize, 1) + \
                    t * (1 if depthwise else cin) * KH * KW * max(sp.w.type.dtype.itemsize, 1)
                dt = sp.node.inputs[0].type.dtype.name
                work += (2 * KH * KW * t * r * Q / cfg.vector_lanes if depthwise else
                         KH * KW * t * r * Q * cin / cfg.macs_per_cycle(dt))
            nbytes += t * r * Q * 4
            dma = rounds * (nbytes / cfg.dma_bytes_per_cycle + (len(specs) * (1 + bands) + 1) * cfg.dma_startup_cycles)
            cost = (max(dma, rounds * work), -r)   # ties: taller groups (fewer weight re-reads)
            if best is None or cost < best[0]:
                best = (cost, r, t)
    return None if best is None else best[1:]
