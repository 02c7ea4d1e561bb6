"""The IR's text form. ``parse(print_graph(g)) == g``, exactly; see ``parser.py`` for the reader.

    graph @forward(%input_ids: i64[1, seq]) {
      symbol seq in [2, 64]
      source f0 = "models/gpt.py"
      const %wte: f32[128, 64] = param "wte.weight" #1f0c3a9be2d47a10
      const %scale: f32[] = dense 0.125
      %x: f32[1, seq, 64] = embedding(%wte, %input_ids) loc(f0:41 "wte")
      %p: f32[1, seq, 64] = softmax(%x) {axis=-1} loc(f0:57 "h.0.attn")
      return %p
    }

Big constants appear by name and content digest; small ones (16 elements or fewer, with no model
source) are written out. Source files are listed once and referred to as ``f0``, ``f1``, ...
A value name of other characters than letters, digits, ``_`` and ``.`` is quoted as a JSON string
(``%"block-1.weight"``), since a PyTorch module or parameter name may hold any character but ``.``.
"""

from __future__ import annotations

import json
import re
from typing import Iterable

import numpy as np
import sympy

from fexplore.errors import SourceLoc

from .graph import Constant, Graph, Node
from .types import DType, TensorType, dim_str


def print_graph(g: Graph) -> str:
    files = _source_files(g)
    lines: list[str] = []
    _print(g, lines, "", files, top=True)
    return "\n".join(lines) + "\n"


def _source_files(g: Graph) -> dict[str, str]:
    out: dict[str, str] = {}
    for n in g.walk():
        if n.loc is not None and n.loc.file and n.loc.file not in out:
            out[n.loc.file] = f"f{len(out)}"
    return out


def _print(g: Graph, lines: list[str], ind: str, files: dict[str, str], top: bool) -> None:
    args = ", ".join(f"{value_ref(v.name)}: {type_str(v.type)}" for v in g.inputs)
    lines.append(f"{ind}graph @{g.name}({args}) {{")
    body = ind + "  "
    for name, (lo, hi) in g.symbols.items():
        lines.append(f"{body}symbol {name} in [{lo}, {'inf' if hi is None else hi}]")
    if top:
        for path, key in files.items():
            lines.append(f"{body}source {key} = {json.dumps(path)}")
    for c in g.constants:
        lines.append(f"{body}{constant_str(c)}")
    for n in g.nodes:
        lines.append(f"{body}{node_str(n, files)}" + (" {" if n.regions else ""))
        for r in n.regions:
            _print(r, lines, body + "  ", files, top=False)
        if n.regions:
            lines.append(f"{body}}}")
    lines.append(f"{body}return " + ", ".join(value_ref(v.name) for v in g.outputs))
    lines.append(f"{ind}}}")


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.]+")


def value_ref(name: str) -> str:
    """``%name``; a name with other characters (a module registered as ``"block-1"``, say) is
    quoted as a JSON string, ``%"block-1.weight"``, so any name reads back."""
    return f"%{name}" if _PLAIN_NAME.fullmatch(name) else "%" + json.dumps(name)


def type_str(t: TensorType) -> str:
    return str(t)


def constant_str(c: Constant) -> str:
    head = f"const {value_ref(c.name)}: {type_str(c.type)} = "
    if c.is_inline and c.payload is not None:
        return head + "dense " + dense_str(c.payload, c.type.dtype)
    if c.source is not None:
        return head + f"param {json.dumps(c.source)} {digest_str(c.digest)}"
    return head + f"data {digest_str(c.digest)}"


_PLAIN_DIGEST = re.compile(r"[A-Za-z0-9_.+-]+")


def digest_str(digest: str) -> str:
    """``#`` and the digest: 16 hex digits for a payload's hash, or what a meta-device weight is
    known by (``meta-768x768``, ``meta-folded-NAME``); one of other characters (a folded
    constant named ``"block-1"`` with a quote, say) is written as a JSON string, ``#"..."``."""
    return f"#{digest}" if _PLAIN_DIGEST.fullmatch(digest) else "#" + json.dumps(digest)


def dense_str(a: np.ndarray, dtype: DType) -> str:
    if a.ndim == 0:
        return scalar_str(a[()], dtype)
    return "[" + ", ".join(scalar_str(x, dtype) for x in a.reshape(-1)) + "]"


def scalar_str(x, dtype: DType) -> str:
    if dtype == DType.bool:
        return "true" if bool(x) else "false"
    if dtype.is_int:
        return str(int(x))
    if dtype == DType.f64:
        return repr(float(x))
    # numpy's shortest repr that reads back to the same f32 (bf16/fp8 values are exact in f32)
    return str(np.float32(x))


def attr_str(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)  # 1.0 stays 1.0, distinct from the int 1; repr round-trips exactly
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, DType):
        return v.value
    if isinstance(v, tuple):
        return "[" + ", ".join(attr_str(x) for x in v) + "]"
    if isinstance(v, sympy.Expr):
        return dim_str(v)
    raise TypeError(f"cannot print attribute value {v!r}")


def loc_str(loc: SourceLoc | None, files: dict[str, str]) -> str:
    if loc is None or (not loc.file and not loc.module):
        return ""
    parts = []
    if loc.file:
        parts.append(f"{files[loc.file]}:{loc.line or 0}")
    if loc.module is not None:
        parts.append(json.dumps(loc.module))
    return " loc(" + " ".join(parts) + ")"


def node_str(n: Node, files: dict[str, str] | None = None) -> str:
    files = files if files is not None else {}
    outs = ", ".join(f"{value_ref(v.name)}: {type_str(v.type)}" for v in n.outputs)
    ins = ", ".join(value_ref(v.name) for v in n.inputs)
    s = f"{outs} = {n.op.name}({ins})"
    # attributes at their OpDef default are left out (the parser puts them back)
    shown = [(k, v) for k, v in n.attrs.items() if not n.op.is_default(k, v)]
    if shown:
        s += " {" + ", ".join(f"{k}={attr_str(v)}" for k, v in shown) + "}"
    if n.loc is not None and n.loc.file and n.loc.file not in files:
        files = {**files, n.loc.file: json.dumps(n.loc.file)}  # printed alone: spell the path
    return s + loc_str(n.loc, files)


def node_lines(nodes: Iterable[Node]) -> list[str]:
    return [node_str(n) for n in nodes]
