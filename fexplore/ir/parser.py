"""Reads the text form written by ``printer.py`` back into a Graph.

A small hand-written recursive-descent reader over a character cursor, so every error carries the
line and column where reading stopped (``fexplore.errors.ParseError``).
"""

from __future__ import annotations

import json
import re
from typing import Mapping

import numpy as np
import sympy

from fexplore.errors import ParseError, SourceLoc

from .graph import Attrs, Constant, Graph, Node, Value
from .opset import get_op
from .types import DType, Layout, TensorType, canon_dim, symbol

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_NUMBER = re.compile(r"-?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)")
_INT = re.compile(r"-?\d+$")
_DTYPES = {d.value: d for d in DType}


def parse(text: str, payloads: Mapping[str, np.ndarray] | None = None) -> Graph:
    """Parse IR text. ``payloads`` (name -> array) binds big constants, which the text holds only
    by digest; without it they stay unbound (printable and comparable, not runnable)."""
    g = _Parser(text).parse_top()
    return g.bind(payloads) if payloads else g


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.files: dict[str, str] = {}
        self.symbols: dict[str, sympy.Symbol] = {}

    # -- cursor ----------------------------------------------------------------------------

    def error(self, msg: str, hint: str | None = None):
        line = self.text.count("\n", 0, self.pos) + 1
        col = self.pos - (self.text.rfind("\n", 0, self.pos) + 1) + 1
        raise ParseError(msg, line=line, column=col, text=self.text, hint=hint)

    def skip_ws(self, newlines: bool = True):
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == "#" and self.text[self.pos - 1:self.pos] in (" ", "\n", ""):
                # a comment runs to the end of the line (digests start with '#' but follow '= ')
                if not self._digest_ahead():
                    self.pos = self.text.find("\n", self.pos)
                    if self.pos < 0:
                        self.pos = len(self.text)
                    continue
                return
            if c in " \t\r" or (newlines and c == "\n"):
                self.pos += 1
            else:
                return

    def _digest_ahead(self) -> bool:
        return re.match(r"#[0-9a-f]{16}\b", self.text[self.pos:self.pos + 18]) is not None

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
        m = re.compile(r"[A-Za-z0-9_.]+").match(self.text, self.pos)
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

    def integer(self) -> int:
        self.skip_ws()
        m = re.compile(r"-?\d+").match(self.text, self.pos)
        if not m:
            self.error("expected an integer")
        self.pos = m.end()
        return int(m.group())

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
            lo = self.integer()
            self.expect(",")
            hi = None if self.accept("inf") else self.integer()
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
        name = self.ident()
        if name not in _DTYPES:
            self.error(f"unknown dtype {name!r}", hint=f"one of {', '.join(_DTYPES)}")
        self.expect("[")
        dims = []
        while not self.accept("]"):
            if dims:
                self.expect(",")
            dims.append(self.dim())
        layout = None
        if self.text.startswith("{", self.pos) and re.match(r"\{\d", self.text[self.pos:]):
            self.pos += 1
            order = [self.integer()]
            while self.accept(","):
                order.append(self.integer())
            tile: list[int] = []
            if self.accept("tile"):
                tile = [int(x) for x in self.ident_like(r"\d+(x\d+)*").split("x")]
            self.expect("}")
            layout = Layout(tuple(order), tuple(tile))
        return TensorType(tuple(dims), _DTYPES[name], layout)

    def ident_like(self, pattern: str) -> str:
        self.skip_ws()
        m = re.compile(pattern).match(self.text, self.pos)
        if not m:
            self.error(f"expected {pattern}")
        self.pos = m.end()
        return m.group()

    def dim(self):
        """An int or a symbolic expression, up to the next ',' or closing bracket at depth 0."""
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
            return int(src)
        try:
            expr = sympy.sympify(src, locals=dict(self.symbols))
        except (sympy.SympifyError, SyntaxError, TypeError):
            self.pos = start
            self.error(f"cannot read dim {src!r}")
        unknown = {s.name for s in expr.free_symbols} - set(self.symbols)
        if unknown:
            self.pos = start
            self.error(f"undeclared symbol(s) {sorted(unknown)}",
                       hint="declare them with 'symbol NAME in [LO, HI]'")
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
        self.skip_ws()
        digest = self.ident_like(r"#[0-9a-f]{16}")[1:]
        return Constant(name, t, None, source=source, digest=digest)

    def dense(self, t: TensorType) -> np.ndarray:
        vals = []
        if self.accept("["):
            while not self.accept("]"):
                if vals:
                    self.expect(",")
                vals.append(self.scalar(t.dtype))
            arr = np.array(vals, dtype=np.float64 if t.dtype.is_float else None)
            return arr.astype(t.dtype.numpy).reshape(t.shape)
        v = self.scalar(t.dtype)
        return np.asarray(v, dtype=np.float64 if t.dtype.is_float else None).astype(t.dtype.numpy)

    def scalar(self, dtype: DType):
        self.skip_ws()
        if self.accept("true"):
            return True
        if self.accept("false"):
            return False
        m = _NUMBER.match(self.text, self.pos)
        if not m:
            self.error("expected a number")
        self.pos = m.end()
        return float(m.group()) if dtype.is_float else int(m.group())

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
        if self.text.startswith(" {", self.pos) and not self._region_brace_ahead():
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
            while not self.peek("}"):
                regions.append(self.graph(top=False))
            self.expect("}")
        return Node(op, inputs, Attrs(attrs), outputs, loc, regions)

    def _region_brace_ahead(self) -> bool:
        return re.match(r" \{\s*\n", self.text[self.pos:self.pos + 64]) is not None

    def loc(self) -> SourceLoc:
        file = line = module = None
        self.skip_ws()
        if self.text.startswith('"', self.pos) or re.match(r"f\d+:", self.text[self.pos:]):
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
                line = self.integer() or None
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
            items = []
            while not self.accept("]"):
                if items:
                    self.expect(",")
                items.append(self.attr_value())
            return tuple(items)
        if self.peek('"'):
            return self.string()
        for word, val in (("true", True), ("false", False), ("none", None)):
            if re.match(word + r"\b", self.text[self.pos:]):
                self.pos += len(word)
                return val
        m = _IDENT.match(self.text, self.pos)
        if m and m.group() in _DTYPES and not re.match(r"[\w(*+/-]", self.text[m.end():m.end() + 1]):
            self.pos = m.end()
            return _DTYPES[m.group()]
        m = re.compile(r"-?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|inf|nan)(?=[,\]}\s])")\
            .match(self.text, self.pos)
        if m:
            self.pos = m.end()
            return float(m.group())
        return self.dim()
