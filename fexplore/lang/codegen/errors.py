"""The one error of the kernel generator: a region holds something no generator part handles yet."""

from __future__ import annotations

from fexplore.errors import FexploreError


class UnsupportedRegionError(FexploreError, NotImplementedError):
    """The generator has no part for an op (or an arrangement) in a region. The lower stage turns
    such a node into a host op, or splits the region around ``.node`` (the IR node named, when the
    generator knows it); ``.op`` names the op, ``.region`` the region."""

    code = "FK190"

    def __init__(self, op: str, region: str, why: str, *, loc=None, node=None):
        self.op = op
        self.region = region
        self.node = node
        super().__init__(f"no kernel generator for {op} in {region}: {why}", loc=loc,
                         hint="the lower stage runs this node on the host; or register a kernel for it")
