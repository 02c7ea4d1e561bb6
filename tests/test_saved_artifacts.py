"""``cm.save(folder)`` writes only text a person (or a text tool) can read: IR text, JSON, CSV,
HTML and kernel-language ``.py`` sources. No pickle, no binary: a saved folder can be shared and
opened without running anything, and its IR files read back into the stages' graphs."""

import ast
import csv
import io
import json
import pickletools

import pytest

from fexplore import ir

KINDS = (".fx.txt", ".json", ".csv", ".html", ".py")


def is_pickle(data: bytes) -> bool:
    """Whether ``data`` is a complete pickle stream (read opcode by opcode, never loaded)."""
    try:
        ops = list(pickletools.genops(data))
    except Exception:
        return False
    return bool(ops) and ops[-1][0].name == "STOP" and ops[-1][2] == len(data) - 1


def test_the_pickle_detector_detects_pickles():
    import pickle

    import numpy as np
    import torch

    for proto in range(0, pickle.HIGHEST_PROTOCOL + 1):
        assert is_pickle(pickle.dumps({"w": [1.0, 2.0]}, protocol=proto))
    assert is_pickle(pickle.dumps(np.ones(3)))
    buf = io.BytesIO()
    torch.save(torch.ones(2), buf)   # a zip holding a pickle: the signature the test looks for
    assert buf.getvalue().startswith(b"PK\x03\x04")
    assert not is_pickle(b"graph @f() {\n  return\n}\n")


@pytest.fixture(scope="module")
def saved(zoo_compiled, tmp_path_factory):
    _, _, cm = zoo_compiled("mlp")
    folder = tmp_path_factory.mktemp("saved")
    cm.save(folder)
    return cm, folder


def test_save_writes_only_text_json_csv_html_and_kernel_sources(saved):
    cm, folder = saved
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    kinds = {next((k for k in KINDS if p.name.endswith(k)), p.suffix) for p in files}
    assert kinds == set(KINDS), kinds   # every kind there, and nothing else
    for p in files:
        data = p.read_bytes()
        assert not is_pickle(data), p
        assert not data.startswith((b"\x80", b"PK\x03\x04", b"\x93NUMPY")), p
        text = data.decode("utf-8")          # text, all of it
        assert "\x00" not in text, p
        if p.name.endswith(".json"):
            json.loads(text)
        elif p.name.endswith(".csv"):
            rows = list(csv.reader(io.StringIO(text)))
            assert len(rows) >= 2 and rows[0], p
        elif p.name.endswith(".py"):
            ast.parse(text)                  # kernel-language source, parsed, never run here
        elif p.name.endswith(".html"):
            assert text.lstrip().lower().startswith("<!doctype html")
    assert len([p for p in files if p.parent.name == "kernels"]) == len(cm.kernels)


def test_saved_ir_reads_back_into_each_stages_graph(saved):
    cm, folder = saved
    texts = sorted(folder.glob("*.fx.txt"))
    assert [p.name.split("_", 1)[1][:-len(".fx.txt")] for p in texts] == [r.name for r in cm.stages]
    for p, rec in zip(texts, cm.stages):
        g = ir.parse(p.read_text(encoding="utf-8"), payloads=rec.after.payloads)
        assert g == rec.after, rec.name
