"""The ways a model is called and what it returns, beyond tensors in and tensors out: keyword
inputs (``example_kwargs``, as torch.export takes them) and numbers among the outputs."""

import pytest
import torch
from torch.export import Dim

import fexplore
from fexplore.errors import InputError


class KeywordModel(torch.nn.Module):
    """Called the way a Hugging Face model is: ids first, the rest by keyword, some left out."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, input_ids, attention_mask=None, position_ids=None, *, scale: float = 1.0, bias=None):
        h = self.emb(input_ids)
        if position_ids is not None:
            h = h + self.emb(position_ids)
        if attention_mask is not None:
            h = h * attention_mask[..., None]
        h = self.proj(h) * scale
        return {"hidden": h if bias is None else h + bias, "length": input_ids.shape[1]}


def _inputs(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50, (2, n), generator=g)
    mask = (torch.rand(2, n, generator=g) > 0.3).float()
    return ids, {"bias": torch.randn(8, generator=g), "attention_mask": mask}


def test_keyword_inputs_compile_verify_and_are_taken_in_any_order():
    torch.manual_seed(0)
    model = KeywordModel().eval()
    ids, kwargs = _inputs(6)
    cm = fexplore.compile(model, (ids,), example_kwargs=kwargs)
    assert cm.verification["ok"].all(), cm.verification
    assert len(cm.graph.inputs) == 3          # ids, then the keywords' tensors
    for seed in (1, 2):
        ids, kwargs = _inputs(6, seed)
        with torch.no_grad():
            want = model(ids, **kwargs)
        got = cm(ids, attention_mask=kwargs["attention_mask"], bias=kwargs["bias"])   # another order
        torch.testing.assert_close(got["hidden"], want["hidden"])
        assert got["length"] == 6 and isinstance(got["length"], int)


def test_keyword_inputs_with_dynamic_shapes_named_by_keyword():
    torch.manual_seed(0)
    model = KeywordModel().eval()
    ids, kwargs = _inputs(6)
    seq = Dim("seq", min=2, max=32)
    cm = fexplore.compile(model, (ids,), example_kwargs=kwargs,
                          dynamic_shapes={"input_ids": {1: seq}, "attention_mask": {1: seq}, "bias": None})
    assert cm.verification["ok"].all(), cm.verification
    for n in (3, 11):
        ids, kwargs = _inputs(n, n)
        with torch.no_grad():
            want = model(ids, **kwargs)
        got = cm(ids, **kwargs)
        torch.testing.assert_close(got["hidden"], want["hidden"])
        assert got["length"] == n      # a size the model returns, at the call's size


def test_a_call_without_the_compiled_keywords_is_refused_by_name():
    model = KeywordModel().eval()
    ids, kwargs = _inputs(4)
    cm = fexplore.compile(model, (ids,), example_kwargs=kwargs)
    with pytest.raises(InputError, match="compiled with keyword inputs"):
        cm(ids, attention_mask=kwargs["attention_mask"])


class ReturnsNumbers(torch.nn.Module):
    def forward(self, x):
        return x.shape[1] + 1, x * 2, 3, 2.5, True, x.shape[0] * x.shape[1]


def test_numbers_among_the_outputs_come_back_as_numbers():
    """A size (symbolic or not) and constants of each kind: each its own value, of its own type.
    (Constant outputs once all read the first one's value: torch names none of them.)"""
    model = ReturnsNumbers()
    for dynamic in (None, {"x": {1: Dim("d", max=64)}}):
        cm = fexplore.compile(model, (torch.randn(3, 2),), dynamic_shapes=dynamic)
        for d in (2, 5) if dynamic else (2,):
            x = torch.randn(3, d)
            got, want = cm(x), model(x)
            assert [type(v) for v in got] == [type(v) for v in want]
            assert got[0] == d + 1 and got[2:5] == (3, 2.5, True) and got[5] == 3 * d
            torch.testing.assert_close(got[1], want[1])
