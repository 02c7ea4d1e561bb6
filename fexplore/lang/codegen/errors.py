"""The one error of the kernel generator: a region holds something no generator part handles yet."""

from __future__ import annotations

from fexplore.errors import ErrorDoc, FexploreError


class UnsupportedRegionError(FexploreError, NotImplementedError):
    """The generator has no part for an op (or an arrangement) in a region. The lower stage turns
    such a node into a host op, or splits the region around ``.node`` (the IR node named, when the
    generator knows it); ``.op`` names the op, ``.region`` the region."""

    code = "FK190"
    doc = ErrorDoc(
        when="fexplore.lang.codegen.generate is asked for a kernel for a region holding an op "
             "(or an arrangement) no generator part handles: a sum over a leading axis, a "
             "convolution whose weight is computed inside the region. A compile never shows it: "
             "the lower stage catches it and runs that node on the host (or splits the region); "
             "it reaches a user who calls the generator directly.",
        example="codegen.generate(region_node_summing_axis_0, \"rngd\")",
        fix="Run the node on the host (what the lower stage does), reshape the computation so "
            "the reduced axis is last, or fexplore.register_kernel a kernel for the region.")

    def __init__(self, op: str, region: str, why: str, *, loc=None, node=None):
        self.op = op
        self.region = region
        self.node = node
        super().__init__(f"no kernel generator for {op} in {region}: {why}", loc=loc,
                         hint="the lower stage runs this node on the host; or register a kernel for it")
