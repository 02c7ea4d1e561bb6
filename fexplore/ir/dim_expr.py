"""Reads a symbolic dim as the printer writes it (sympy's ``sstr``: ``2*seq + 1``,
``floor(seq/2)``, ``Max(1, seq - 3)``) without evaluating any code.

``sympy.sympify`` would run the text through Python's ``eval``; IR text can come from anywhere (a
saved folder, a bug report), so this is a small recursive-descent reader over a closed grammar
that builds the sympy expression with sympy's own operators:

    expr  := term (('+' | '-') term)*
    term  := unary (('*' | '/') unary)*
    unary := '-' unary | power
    power := atom ('**' unary)?
    atom  := INT | NAME | FUNC '(' expr (',' expr)* ')' | '(' expr ')'

Only declared symbols and the functions the shape rules produce are accepted, and sizes are
bounded (the expression's length, its nesting, its integers, its exponents), so hostile text gets
a `DimSyntaxError`, never a hang or an exception from deep inside sympy.
"""

from __future__ import annotations

import re
from typing import Mapping

import sympy

MAX_CHARS = 2000        # far beyond any dim torch.export produces
MAX_DEPTH = 32          # nesting of parentheses, calls and unary minus
MAX_INT = 2 ** 63       # dims and their arithmetic live in i64
MAX_EXPONENT = 8        # seq**2 appears in attention costs; nothing needs seq**9

FUNCTIONS = {"floor": sympy.floor, "ceiling": sympy.ceiling, "Mod": sympy.Mod,
             "Max": sympy.Max, "Min": sympy.Min, "Abs": sympy.Abs}

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(\*\*|[-+*/(),]))")


class DimSyntaxError(ValueError):
    """Why a dim could not be read, and the offset in its text where reading stopped."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.offset = offset


def parse_dim_expr(src: str, symbols: Mapping[str, sympy.Symbol]) -> sympy.Expr:
    if len(src) > MAX_CHARS:
        raise DimSyntaxError(f"a dim of {len(src)} characters (at most {MAX_CHARS})", 0)
    r = _Reader(src, symbols)
    e = r.expr(0)
    if r.tok is not None:
        raise DimSyntaxError(f"unexpected {r.tok[1]!r} in a dim", r.tok[2])
    if e.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
        raise DimSyntaxError("a dim divides by zero", 0)
    return e


class _Reader:
    def __init__(self, src: str, symbols: Mapping[str, sympy.Symbol]):
        self.src = src
        self.symbols = symbols
        self.pos = 0
        self.tok: tuple[str, str, int] | None = None   # (kind, text, offset)
        self.advance()

    def advance(self) -> None:
        m = _TOKEN.match(self.src, self.pos)
        if m is None:
            rest = self.src[self.pos:]
            if rest.strip():
                at = self.pos + len(rest) - len(rest.lstrip())
                raise DimSyntaxError(f"unexpected character {self.src[at]!r} in a dim", at)
            self.tok = None
            self.pos = len(self.src)
            return
        kind = "int" if m.group(1) else "name" if m.group(2) else "op"
        self.tok = (kind, m.group(m.lastindex), m.start(m.lastindex))
        self.pos = m.end()

    def at(self, text: str) -> bool:
        return self.tok is not None and self.tok[0] == "op" and self.tok[1] == text

    def expect(self, text: str) -> None:
        if not self.at(text):
            where = self.tok[2] if self.tok else len(self.src)
            found = repr(self.tok[1]) if self.tok else "the end"
            raise DimSyntaxError(f"expected {text!r} in a dim, found {found}", where)
        self.advance()

    def expr(self, depth: int) -> sympy.Expr:
        e = self.term(depth)
        while self.at("+") or self.at("-"):
            op = self.tok[1]
            self.advance()
            rhs = self.term(depth)
            e = e + rhs if op == "+" else e - rhs
        return e

    def term(self, depth: int) -> sympy.Expr:
        e = self.unary(depth)
        while self.at("*") or self.at("/"):
            op = self.tok[1]
            self.advance()
            rhs = self.unary(depth)
            e = e * rhs if op == "*" else e / rhs
        return e

    def unary(self, depth: int) -> sympy.Expr:
        if depth > MAX_DEPTH:
            raise DimSyntaxError(f"a dim nested more than {MAX_DEPTH} deep",
                                 self.tok[2] if self.tok else len(self.src))
        if self.at("-"):
            self.advance()
            return -self.unary(depth + 1)
        return self.power(depth)

    def power(self, depth: int) -> sympy.Expr:
        base = self.atom(depth)
        if not self.at("**"):
            return base
        where = self.tok[2]
        self.advance()
        exp = self.unary(depth + 1)
        if not (exp.is_Integer and abs(int(exp)) <= MAX_EXPONENT):
            raise DimSyntaxError(f"a dim's exponent must be an integer in [-{MAX_EXPONENT}, "
                                 f"{MAX_EXPONENT}]", where)
        return base ** exp

    def atom(self, depth: int) -> sympy.Expr:
        if self.tok is None:
            raise DimSyntaxError("a dim ends too early", len(self.src))
        kind, text, where = self.tok
        if kind == "int":
            if len(text) > 19 or int(text) >= MAX_INT:
                raise DimSyntaxError(f"the integer {text[:24]}{'...' if len(text) > 24 else ''} "
                                     f"is beyond any dim", where)
            self.advance()
            return sympy.Integer(int(text))
        if kind == "name":
            self.advance()
            if self.at("("):
                fn = FUNCTIONS.get(text)
                if fn is None:
                    raise DimSyntaxError(f"unknown function {text!r} in a dim (one of "
                                         f"{', '.join(FUNCTIONS)})", where)
                self.advance()
                args = [self.expr(depth + 1)]
                while self.at(","):
                    self.advance()
                    args.append(self.expr(depth + 1))
                self.expect(")")
                try:
                    return fn(*args)
                except (TypeError, ValueError) as e:   # a wrong number of arguments, say
                    raise DimSyntaxError(f"{text}{tuple(args)}: {e}", where) from None
            sym = self.symbols.get(text)
            if sym is None:
                raise DimSyntaxError(f"undeclared symbol {text!r}", where)
            return sym
        if text == "(":
            self.advance()
            e = self.expr(depth + 1)
            self.expect(")")
            return e
        raise DimSyntaxError(f"unexpected {text!r} in a dim", where)
