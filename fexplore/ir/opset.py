"""The opset: the registry of OpDefs, and the one door through which ops (built-in or custom) enter."""

from __future__ import annotations

from .opdef import OpDef

OPSET: dict[str, OpDef] = {}


def register(opdef: OpDef, *, replace: bool = False) -> OpDef:
    if opdef.name in OPSET and not replace:
        raise ValueError(f"op {opdef.name!r} is already defined")
    for attr in ("infer", "cost"):
        if getattr(opdef, attr) is None:
            raise ValueError(f"op {opdef.name!r} has no {attr} rule")
    if opdef.reference is None and opdef.run_regions is None:
        raise ValueError(f"op {opdef.name!r} has no reference implementation")
    OPSET[opdef.name] = opdef
    return opdef


def get_op(name: str) -> OpDef:
    _load_builtin_ops()
    try:
        return OPSET[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}") from None


_loaded = False


def _load_builtin_ops() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        from . import ops  # noqa: F401  (registers every built-in OpDef)


def all_ops() -> dict[str, OpDef]:
    _load_builtin_ops()
    return dict(OPSET)
