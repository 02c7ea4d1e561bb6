"""Reads the text form written by ``printer.py`` back into a Graph.

A small hand-written recursive-descent reader over a character cursor, so every error carries the
line and column where reading stopped (``fexplore.errors.ParseError``).

IR text may come from anywhere (a saved folder, a bug report), so reading it is safe by
construction: nothing is evaluated (symbolic dims go through ``dim_expr``'s closed grammar, not
sympy's ``eval``), and every size is bounded: the text, the nesting of regions and lists, integers,
ranks and element counts. Hostile input gets a ParseError with a line and column, never a hang, a
RecursionError or an exception from deep inside.
"""

from __future__ import annotations

import json
import math
import re
from typing import Mapping

import numpy as np
import sympy

from fexplore.errors import ParseError, SourceLoc

from .dim_expr import DimSyntaxError, parse_dim_expr
from .graph import Attrs, Constant, Graph, Node, Value
from .opset import get_op
from .types import DType, Layout, TensorType, canon_dim, symbol

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_NUMBER = re.compile(r"-?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)")
_INT = re.compile(r"-?\d+$")
_INT_AHEAD = re.compile(r"-?\d+")
_VALUE_NAME = re.compile(r"[A-Za-z0-9_.]+")
_LAYOUT_AHEAD = re.compile(r"\{\d")
_REGION_BRACE = re.compile(r" \{[ \t\r]*\n")
_FILE_KEY_AHEAD = re.compile(r"f\d+:")
_WORD_END = re.compile(r"(?:true|false|none)\b")
_FLOAT_ATTR = re.compile(r"-?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|inf|nan)(?=[,\]}\s])")
# A digest: 16 hex digits for real payloads; a meta-device weight's (no payload) is made of its
# shape or name (``meta-768x768``, ``meta-folded-h.0.w``, ``...bf16``); anything else is quoted.
_DIGEST = re.compile(r"#([A-Za-z0-9_.+-]+)")
# Control characters other than tab, newline and carriage return never appear in printed IR
# (strings are JSON, which escapes them).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_DTYPES = {d.value: d for d in DType}

MAX_CHARS = 64 * 2 ** 20   # 64 MiB: an 8B-parameter model's IR is a few MB (weights by digest)
MAX_DEPTH = 64             # regions inside regions, lists inside lists
MAX_RANK = 32
MAX_DIM = 2 ** 48          # beyond any memory
MAX_ELEMENTS = 2 ** 48
MAX_INT_DIGITS = 20        # i64 and u64 need at most 20


def parse(text: str, payloads: Mapping[str, np.ndarray] | None = None, *,
          max_chars: int = MAX_CHARS) -> Graph:
    """Parse IR text. ``payloads`` (name -> array) binds big constants, which the text holds only
    by digest; without it they stay unbound (printable and comparable, not runnable). Text longer
    than ``max_chars`` is refused before reading (a ParseError), as is anything malformed."""
    if not isinstance(text, str):
        raise ParseError(f"IR text must be a str, got {type(text).__name__}", line=1, column=1,
                         hint="decode bytes first: parse(data.decode('utf-8'))")
    if len(text) > max_chars:
        raise ParseError(f"the text is {len(text):,} characters, more than the limit of "
                         f"{max_chars:,}", line=1, column=1,
                         hint="pass a larger max_chars= if this really is one graph's IR")
    p = _Parser(text)
    bad = _CONTROL.search(text)
    if bad:
        p.pos = bad.start()
        p.error(f"control character {bad.group()!r} in IR text",
                hint="IR text holds printable characters; strings escape the others (JSON)")
    g = p.parse_top()
    return g.bind(payloads) if payloads else g


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.files: dict[str, str] = {}
        self.symbols: dict[str, sympy.Symbol] = {}
        self.depth = 0   # regions and attribute lists being read, for MAX_DEPTH

    # -- cursor ----------------------------------------------------------------------------

    def error(self, msg: str, hint: str | None = None):
        line = self.text.count("\n", 0, self.pos) + 1
        col = self.pos - (self.text.rfind("\n", 0, self.pos) + 1) + 1
        raise ParseError(msg, line=line, column=col, text=self.text, hint=hint)

    def skip_ws(self, newlines: bool = True):
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == "#" and self.text[self.pos - 1:self.pos] in (" ", "\n", ""):
                # a comment runs to the end of the line (a digest is read by digest(), which
                # does not skip comments)
                self.pos = self.text.find("\n", self.pos)
                if self.pos < 0:
                    self.pos = len(self.text)
                continue
            if c in " \t\r" or (newlines and c == "\n"):
                self.pos += 1
            else:
                return

    def peek(self, s: str) -> bool:
        self.skip_ws()
        return self.text.startswith(s, self.pos)

    def accept(self, s: str) -> bool:
        if self.peek(s):
            self.pos += len(s)
            return True
        return False

    def expect(self, s: str):
        if not self.accept(s):
            got = self.text[self.pos:self.pos + 12].split("\n")[0]
            self.error(f"expected {s!r}, found {got!r}")

    def ident(self) -> str:
        self.skip_ws()
        m = _IDENT.match(self.text, self.pos)
        if not m:
            self.error("expected a name")
        self.pos = m.end()
        return m.group()

    def value_name(self) -> str:
        self.expect("%")
        if self.text.startswith('"', self.pos):  # a quoted name (see printer.value_ref)
            name = self.string()
            if not name:
                self.error("a value name is empty")
            return name
        m = _VALUE_NAME.match(self.text, self.pos)
        if not m:
            self.error("expected a value name after '%'")
        self.pos = m.end()
        return m.group()

    def string(self) -> str:
        self.skip_ws()
        if not self.text.startswith('"', self.pos):
            self.error("expected a string")
        dec = json.JSONDecoder()
        try:
            s, end = dec.raw_decode(self.text, self.pos)
        except json.JSONDecodeError:
            self.error("unterminated or malformed string")
        self.pos = end
        return s

    def integer(self, lo: int = -2 ** 63, hi: int = 2 ** 64 - 1) -> int:
        self.skip_ws()
        m = _INT_AHEAD.match(self.text, self.pos)
        if not m:
            self.error("expected an integer")
        if len(m.group().lstrip("-")) > MAX_INT_DIGITS or not lo <= int(m.group()) <= hi:
            self.error(f"integer {_clip(m.group())} is outside [{lo}, {hi}]")
        self.pos = m.end()
        return int(m.group())

    def enter(self, what: str):
        """Count one more level of nesting; past MAX_DEPTH the text is refused (not a
        RecursionError)."""
        if self.depth >= MAX_DEPTH:
            self.error(f"{what} nested more than {MAX_DEPTH} deep")
        self.depth += 1

    # -- grammar ---------------------------------------------------------------------------

    def parse_top(self) -> Graph:
        g = self.graph(top=True)
        self.skip_ws()
        if self.pos != len(self.text):
            self.error("unexpected text after the graph")
        return g

    def graph(self, top: bool) -> Graph:
        self.expect("graph")
        self.expect("@")
        name = self.ident()
        self.expect("(")
        inputs: list[Value] = []
        env: dict[str, Value] = {}
        symbols: dict[str, tuple[int, int | None]] = {}
        # symbols are declared after the signature; remember where, and read types lazily
        sig_start = self.pos
        self._skip_balanced(")")
        self.expect("{")
        while self.peek("symbol "):
            self.expect("symbol")
            sname = self.ident()
            self.expect("in")
            self.expect("[")
            lo = self.integer(0, MAX_DIM)
            self.expect(",")
            hi = None if self.accept("inf") else self.integer(0, MAX_DIM)
            self.expect("]")
            symbols[sname] = (lo, hi)
            self.symbols[sname] = symbol(sname)
        body_pos = self.pos
        self.pos = sig_start
        while not self.accept(")"):
            if inputs:
                self.expect(",")
            v = Value(self.value_name(), (self.expect(":"), self.tensor_type())[1])
            self._define(env, v)
            inputs.append(v)
        self.pos = body_pos
        while self.peek("source "):
            if not top:
                self.error("source declarations belong to the top graph")
            self.expect("source")
            key = self.ident()
            self.expect("=")
            self.files[key] = self.string()
        constants: list[Constant] = []
        while self.peek("const "):
            c = self.constant()
            self._define(env, c)
            constants.append(c)
        nodes: list[Node] = []
        while not self.peek("return"):
            n = self.node(env)
            for v in n.outputs:
                self._define(env, v)
            nodes.append(n)
        self.expect("return")
        outputs = []
        if not self.peek("}"):
            while True:
                outputs.append(self._use(env))
                if not self.accept(","):
                    break
        self.expect("}")
        return Graph(name, inputs, constants, nodes, outputs, symbols)

    def _skip_balanced(self, close: str):
        depth = 0
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in "([{":
                depth += 1
            elif c in ")]}":
                if depth == 0 and c == close:
                    self.pos += 1
                    return
                depth -= 1
            self.pos += 1
        self.error("unbalanced brackets")

    def _define(self, env, v: Value):
        if v.name in env:
            self.error(f"%{v.name} is defined twice")
        env[v.name] = v

    def _use(self, env) -> Value:
        start = self.pos
        name = self.value_name()
        if name not in env:
            self.pos = start
            self.skip_ws()
            self.error(f"%{name} is used but not defined")
        return env[name]

    def tensor_type(self) -> TensorType:
        self.skip_ws()
        start = self.pos
        name = self.ident()
        if name not in _DTYPES:
            self.error(f"unknown dtype {name!r}", hint=f"one of {', '.join(_DTYPES)}")
        self.expect("[")
        dims = []
        while not self.accept("]"):
            if dims:
                self.expect(",")
            if len(dims) == MAX_RANK:
                self.error(f"a tensor of more than {MAX_RANK} dims")
            dims.append(self.dim())
        layout = None
        if _LAYOUT_AHEAD.match(self.text, self.pos):
            self.pos += 1
            order = [self.integer(0, MAX_RANK)]
            while self.accept(","):
                order.append(self.integer(0, MAX_RANK))
            tile: list[int] = []
            if self.accept("tile"):
                tile = [int(x) for x in self.ident_like(r"\d{1,9}(x\d{1,9}){0,%d}" % MAX_RANK).split("x")]
            self.expect("}")
            layout = Layout(tuple(order), tuple(tile))
            if sorted(order) != list(range(len(dims))):
                self.error(f"layout {layout} is not an order of the {len(dims)} dims")
        static = [d for d in dims if isinstance(d, int)]
        if math.prod(static) > MAX_ELEMENTS:   # exact: at most MAX_RANK ints of 2**48
            self.pos = start
            self.error(f"a tensor of {' x '.join(map(str, dims))} elements is beyond any memory")
        return TensorType(tuple(dims), _DTYPES[name], layout)

    def ident_like(self, pattern: str) -> str:
        self.skip_ws()
        m = re.compile(pattern).match(self.text, self.pos)
        if not m:
            self.error(f"expected {pattern}")
        self.pos = m.end()
        return m.group()

    def dim(self, signed: bool = False):
        """An int or a symbolic expression, up to the next ',' or closing bracket at depth 0.
        A tensor's dim is a size (>= 0); an attribute (``signed``) may be negative."""
        self.skip_ws()
        start, depth = self.pos, 0
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in "([":
                depth += 1
            elif c in ")]}":
                if depth == 0:
                    break
                depth -= 1
            elif c == "," and depth == 0:
                break
            elif c == "\n":
                break
            self.pos += 1
        src = self.text[start:self.pos].strip()
        if _INT.match(src):
            if (src.startswith("-") and not signed) or len(src.lstrip("-")) > MAX_INT_DIGITS \
                    or abs(int(src)) > MAX_DIM:
                self.pos = start
                self.error(f"dim {_clip(src)} is not a size (0 to {MAX_DIM})")
            return int(src)
        if not src:
            self.pos = start
            self.error("expected a dim")
        try:
            expr = parse_dim_expr(src, self.symbols)
        except DimSyntaxError as e:
            self.pos = start + (len(self.text[start:self.pos]) - len(self.text[start:self.pos].lstrip())) \
                + e.offset
            self.error(f"cannot read dim {_clip(src)}: {e}",
                       hint="declare symbols with 'symbol NAME in [LO, HI]'"
                       if "undeclared" in str(e) else None)
        return canon_dim(expr)

    def constant(self) -> Constant:
        self.expect("const")
        name = self.value_name()
        self.expect(":")
        t = self.tensor_type()
        self.expect("=")
        if self.accept("dense"):
            return Constant(name, t, self.dense(t))
        source = None
        if self.accept("param"):
            source = self.string()
        else:
            self.expect("data")
        return Constant(name, t, None, source=source, digest=self.digest())

    def digest(self) -> str:
        """``#`` then the digest: bare when made of letters, digits and ``_.+-`` (every digest
        fexplore makes), else a JSON string (see printer.digest_str)."""
        while self.text.startswith((" ", "\t"), self.pos):   # no skip_ws: '#' is not a comment here
            self.pos += 1
        if self.text.startswith('#"', self.pos):
            self.pos += 1
            d = self.string()
        else:
            m = _DIGEST.match(self.text, self.pos)
            if not m:
                self.error("expected a digest ('#' and the payload's hash)")
            self.pos = m.end()
            d = m.group(1)
        if not d:
            self.error("a digest is empty")
        return d

    def dense(self, t: TensorType) -> np.ndarray:
        self.skip_ws()
        start = self.pos
        if not t.is_static:
            self.error(f"a dense constant needs a static shape, not {t}")
        vals = []
        if self.accept("["):
            while not self.accept("]"):
                if vals:
                    self.expect(",")
                if len(vals) == t.numel:
                    self.error(f"more than the {t.numel} value(s) of {t}")
                vals.append(self.scalar(t.dtype))
            if len(vals) != t.numel:
                self.pos = start
                self.error(f"{len(vals)} value(s) for {t}, which holds {t.numel}")
            arr = np.array(vals, dtype=np.float64 if t.dtype.is_float else object)
            return self._cast(arr, t).reshape(t.shape)
        if t.numel != 1:
            self.error(f"one value for {t}, which holds {t.numel}: write them as [a, b, ...]")
        v = self.scalar(t.dtype)
        arr = np.asarray(v, dtype=np.float64 if t.dtype.is_float else object)
        return self._cast(arr, t).reshape(t.shape)

    @staticmethod
    def _cast(arr: np.ndarray, t: TensorType) -> np.ndarray:
        with np.errstate(over="ignore"):   # 1e6 as f16 is inf, as the printer would write it
            return arr.astype(t.dtype.numpy)

    def scalar(self, dtype: DType):
        self.skip_ws()
        start = self.pos
        if self.accept("true"):
            return True
        if self.accept("false"):
            return False
        m = _NUMBER.match(self.text, self.pos)
        if not m:
            self.error("expected a number")
        text = m.group()
        if dtype.is_float:
            if len(text) > 64:
                self.error(f"number {_clip(text)} has more digits than any float holds")
            self.pos = m.end()
            return float(text)
        if not _INT.match(text) or len(text.lstrip("-")) > MAX_INT_DIGITS:
            self.error(f"{_clip(text)} is not a {dtype} value")
        info = np.iinfo(dtype.numpy) if dtype.is_int else None
        v = int(text)
        if dtype == DType.bool and v not in (0, 1) or info and not info.min <= v <= info.max:
            self.pos = start
            self.error(f"{_clip(text)} is outside the range of {dtype}")
        self.pos = m.end()
        return v

    def node(self, env) -> Node:
        outputs = []
        while True:
            name = self.value_name()
            self.expect(":")
            outputs.append(Value(name, self.tensor_type()))
            if not self.accept(","):
                break
        self.expect("=")
        op_start = self.pos
        opname = self.ident()
        try:
            op = get_op(opname)
        except KeyError:
            self.pos = op_start
            self.skip_ws()
            self.error(f"unknown op {opname!r}")
        self.expect("(")
        inputs = []
        while not self.accept(")"):
            if inputs:
                self.expect(",")
            inputs.append(self._use(env))
        attrs = {}
        if self.text.startswith(" {", self.pos) and not _REGION_BRACE.match(self.text, self.pos):
            self.expect("{")
            while not self.accept("}"):
                if attrs:
                    self.expect(",")
                key = self.ident()
                self.expect("=")
                attrs[key] = self.attr_value()
        try:
            attrs = op.complete_attrs(attrs)
        except TypeError as e:
            self.error(str(e))
        loc = None
        self.skip_ws(newlines=False)
        if self.accept("loc("):
            loc = self.loc()
        regions = []
        self.skip_ws(newlines=False)
        if self.text.startswith("{", self.pos):
            self.pos += 1
            self.enter("regions")
            while not self.peek("}"):
                regions.append(self.graph(top=False))
            self.expect("}")
            self.depth -= 1
        return Node(op, inputs, Attrs(attrs), outputs, loc, regions)

    def loc(self) -> SourceLoc:
        file = line = module = None
        self.skip_ws()
        if self.text.startswith('"', self.pos) or _FILE_KEY_AHEAD.match(self.text, self.pos):
            if self.text.startswith('"', self.pos) and not self._string_then_colon():
                module = self.string()
            else:
                if self.text.startswith('"', self.pos):
                    file = self.string()
                else:
                    key = self.ident_like(r"f\d+")
                    if key not in self.files:
                        self.error(f"unknown source {key}")
                    file = self.files[key]
                self.expect(":")
                line = self.integer(0, 2 ** 31) or None
                if self.peek('"'):
                    module = self.string()
        self.expect(")")
        return SourceLoc(file, line, module)

    def _string_then_colon(self) -> bool:
        dec = json.JSONDecoder()
        try:
            _, end = dec.raw_decode(self.text, self.pos)
        except json.JSONDecodeError:
            return False
        return self.text.startswith(":", end)

    def attr_value(self):
        self.skip_ws()
        if self.accept("["):
            self.enter("attribute lists")
            items = []
            while not self.accept("]"):
                if items:
                    self.expect(",")
                items.append(self.attr_value())
            self.depth -= 1
            return tuple(items)
        if self.peek('"'):
            return self.string()
        m = _WORD_END.match(self.text, self.pos)
        if m:
            self.pos = m.end()
            return {"true": True, "false": False, "none": None}[m.group()]
        m = _IDENT.match(self.text, self.pos)
        if m and m.group() in _DTYPES and not re.match(r"[\w(*+/-]", self.text[m.end():m.end() + 1]):
            self.pos = m.end()
            return _DTYPES[m.group()]
        m = _FLOAT_ATTR.match(self.text, self.pos)
        if m:
            self.pos = m.end()
            return float(m.group())
        return self.dim(signed=True)


def _clip(text: str, n: int = 24) -> str:
    """A token for a message, shortened: hostile input may hold a million digits."""
    return text if len(text) <= n else text[:n] + "..."
