"""Example inputs for an ONNX model on the command line: ``--input-shapes input_ids=1x16``.

Each graph input gets seeded random values of its dtype and of the shape given (by name, or in
the graph's input order); an input whose dims are all static may be left out. Floats are standard
normal; integers are 0 or 1, valid as indices into any axis; bools are random.
"""

from __future__ import annotations

import numpy as np

from fexplore.errors import ConfigError

from .importer import graph_inputs, load_model, onnx_dtype


def parse_shape(text: str) -> tuple[int, ...]:
    if text.strip() in ("", "scalar"):
        return ()
    try:
        dims = tuple(int(d) for d in text.lower().replace(",", "x").split("x"))
    except ValueError:
        raise ConfigError(f"cannot read the shape {text!r}", hint="write it as 2x16") from None
    if any(d < 0 for d in dims):
        raise ConfigError(f"negative size in the shape {text!r}")
    return dims


def example_inputs(path: str, specs: list[str], seed: int = 0) -> list[np.ndarray]:
    proto, _ = load_model(path)
    ins = graph_inputs(proto)
    names = [i.name for i in ins]
    shapes: dict[str, tuple] = {}
    for k, spec in enumerate(specs):
        if "=" in spec:
            name, text = spec.split("=", 1)
            if name not in names:
                raise ConfigError(f"the model has no input {name!r}",
                                  hint=f"its inputs are {', '.join(names)}")
        elif k < len(names):
            name, text = names[k], spec
        else:
            raise ConfigError(f"{len(specs)} shapes for {len(names)} inputs")
        shapes[name] = parse_shape(text)
    rng = np.random.default_rng(seed)
    out = []
    for vi in ins:
        tt = vi.type.tensor_type
        shape = shapes.get(vi.name)
        if shape is None:
            dims = tt.shape.dim
            if not all(d.HasField("dim_value") for d in dims):
                raise ConfigError(
                    f"input {vi.name!r} has symbolic dims ("
                    + ", ".join(d.dim_param or "?" for d in dims if not d.HasField("dim_value"))
                    + "): give its shape", hint=f"--input-shapes {vi.name}=" +
                    "x".join(str(d.dim_value) if d.HasField("dim_value") else "N" for d in dims))
            shape = tuple(d.dim_value for d in dims)
        try:
            dt = onnx_dtype(tt.elem_type).numpy
        except TypeError as e:
            raise ConfigError(f"input {vi.name!r}: {e}") from None
        if dt == np.bool_:
            a = rng.random(shape) < 0.5
        elif np.dtype(dt).kind in "iu":
            a = rng.integers(0, 2, size=shape)
        else:
            a = rng.standard_normal(shape)
        out.append(np.asarray(a).astype(dt))
    return out
