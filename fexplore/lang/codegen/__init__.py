"""Kernel-language source from IR: one IR node (a fused region or a plain op) -> one `fl` kernel.

    from fexplore.lang import codegen
    gk = codegen.generate(node, "rngd")     # GeneratedKernel: .name .kind .source .params .results
    print(gk.source)                        # ordinary fl code; pastes into a %%furiosa_kernel cell
    k = gk.kernel()                         # the traced fexplore.lang.Kernel
    codegen.check_kernel(node, gk, inputs)  # interpreter vs the IR interpreter on the node

A kernel is composed from parts, chosen by what the region holds, never by a whole-model pattern:

    rowwise.py      elementwise chains (every elementwise OpDef but tril/triu), norms, softmax,
                    last-axis reductions
    contraction.py  linear / matmul / batched matmul with a prologue (activations.py: free views, a
                    slice of rows, a norm, heads merged by a permute) and an epilogue chain
    conv.py         conv2d (and conv1d), any stride / padding / dilation / groups (depthwise on the
                    vector unit), a zero pad folded in, several per region, with an epilogue
    attention.py    streaming (flash) attention: the attention op or written out, masks, causal,
                    grouped-query heads, q and k computed in the region (rotary), a KV cache
    gather.py       embedding, index, gather, index_put, scatter: DMA gathers and scatters
    permute.py      permute: box copies, or tiles turned on the transpose engine
    vector.py       the vector-unit lines of one IR node, which all of the above write with
    views.py        views of a region input as index maps: a view is read as a box, never copied
    movement.py     slice, select, split, concat, pad, expand (plain ops) as DMA box copies; tril/triu
    reduce.py       reductions (var too) over any neighbouring axes, argmax/argmin, cumsum/cumprod,
                    topk, sort, global average pooling
    pool.py         max / avg / adaptive-avg pooling: windowed reductions over (W / stride, stride) views, bins of unequal sizes as separable sums
    boxes.py        the free views, tile sizes and tile loops those box copies walk
    domain.py       the iteration space, leading axes merged when every operand allows it

Anything without a part raises `UnsupportedRegionError` (a NotImplementedError, code FK190)
naming the op; the lower stage will run such a node on the host.
"""

from __future__ import annotations

from fexplore.ir import DType, Node
from fexplore.ir.types import names_a_symbol
from fexplore.npu import get_target

from .check import KernelCheck, check_kernel
from .common import body_of, region_label
from .attention import generate_attention
from .contraction import CONTRACTIONS, generate_contraction
from .grouped import generate_grouped_matmul
from .conv import generate_conv
from .errors import UnsupportedRegionError
from .gather import GATHERS, generate_gather
from .generated import GeneratedKernel, Param, Result
from .movement import MOVEMENT, generate_movement
from .permute import generate_permute
from .pool import POOLS, generate_pool
from .reduce import generate_reduction, takes as reduction_takes
from .rowwise import generate_vector
from .vector import check_table

# dtypes the chip has no datapath for: a value of one is host work (fold computes such values at
# compile time where it can, rather than leave a lazy broadcast of them to the host)
NO_DATAPATH = frozenset({DType.f64})

_NOT_YET = {"embedding": "gather", "gather": "gather", "index": "gather", "permute": "relayout", "concat": "relayout",
            "max_pool2d": "pooling", "avg_pool2d": "pooling", "adaptive_avg_pool2d": "pooling"}


def generate(node: Node, target="rngd", head_layout: tuple | None = None) -> GeneratedKernel:
    """The kernel for `node` on `target` (a preset name or an NPUConfig). `head_layout`: how an
    attention reads the node's output (see `attention.heads_read`), for a contraction to make
    it head by head."""
    cfg = get_target(target)
    values = list(node.inputs) + list(node.outputs) + \
        [v for n in (node.regions[0].nodes if node.regions else []) for v in n.outputs]
    nodes = [node] + (list(node.regions[0].nodes) if node.regions else [])
    if any(not isinstance(d, int) for v in values for d in v.type.shape) or \
            any(names_a_symbol(a) for n in nodes for a in n.attrs.values()):
        # a symbolic graph's schedule is made per size, from the graph specialized to it (a
        # static shape with a symbolic attribute, a slice of a mask buffer from the cache
        # length on, is as unknown until then: its kernel would name a size it is not given)
        raise UnsupportedRegionError(node.op.name, region_label(node), "symbolic sizes (specialize the "
                                     "shapes first)", loc=node.loc)
    no_datapath = sorted({v.type.dtype.value for v in values if v.type.dtype in NO_DATAPATH})
    if no_datapath:
        raise UnsupportedRegionError(node.op.name, region_label(node),
                                     f"{no_datapath[0]}: the chip has no {no_datapath[0]} datapath", loc=node.loc)
    if all(any(d == 0 for d in v.type.shape) for v in node.outputs):
        raise UnsupportedRegionError(node.op.name, region_label(node), "its outputs are empty: nothing to "
                                     "compute", loc=node.loc)
    if any(d == 0 for v in node.inputs for d in v.type.shape):   # a mean of nothing, a matmul over K = 0
        raise UnsupportedRegionError(node.op.name, region_label(node), "an empty operand: no tile to load",
                                     loc=node.loc)
    if node.op.name in GATHERS:      # plain ops; inside a region they are still host work (below)
        return generate_gather(node, cfg)
    if node.op.name == "permute":
        return generate_permute(node, cfg)
    body = body_of(node)
    contraction = any(n.op.name in CONTRACTIONS for n in body.nodes)
    rates = dict(cfg.tensor_dtype_rates)
    for n in body.nodes:
        if n.op.name in CONTRACTIONS or n.op.name in ("conv2d", "grouped_matmul"):
            dt = n.inputs[0].type.dtype
            if dt.name not in rates:   # i32/i64/u8 operands: the tensor unit does not take them
                raise UnsupportedRegionError(n.op.name, region_label(node), f"{dt.name} operands: the "
                                             f"tensor unit of {cfg.name} has no {dt.name} rate", loc=n.loc, node=n)
    if node.op.name == "grouped_matmul":
        return generate_grouped_matmul(node, cfg)
    if _is_attention(body):
        return generate_attention(node, cfg)
    if node.op.name in MOVEMENT:        # a plain op (a region's op name is "region")
        return generate_movement(node, cfg)
    if reduction_takes(node):
        return generate_reduction(node, cfg)
    if node.op.name in POOLS:
        return generate_pool(node, cfg)
    for n in body.nodes:
        if n.op.name in _NOT_YET and not (contraction and n.op.name == "permute"):   # a prologue view
            raise UnsupportedRegionError(n.op.name, region_label(node),
                                         f"the {_NOT_YET[n.op.name]} part is not written yet", loc=n.loc, node=n)
    if any(n.op.name == "conv2d" for n in body.nodes):
        if contraction:
            raise UnsupportedRegionError("conv2d", region_label(node), "a convolution beside a matmul", loc=node.loc)
        return generate_conv(node, cfg)
    if contraction:
        return generate_contraction(node, cfg, head_layout)
    return generate_vector(node, cfg)


def _is_attention(body) -> bool:
    """The attention op, or a softmax between two matmuls (attention written out)."""
    if any(n.op.name == "attention" for n in body.nodes):
        return True
    made_by = {v.name: n.op.name for n in body.nodes for v in n.outputs}
    reads = {v.name: n.inputs[0].name for n in body.nodes for v in n.outputs if n.op.name == "cast"}
    return any(n.op.name == "matmul" and made_by.get(reads.get(n.inputs[0].name, n.inputs[0].name)) == "softmax"
               for n in body.nodes)


__all__ = ["GeneratedKernel", "KernelCheck", "Param", "Result", "UnsupportedRegionError", "check_kernel",
           "check_table", "generate"]
