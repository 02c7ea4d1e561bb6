"""Model inputs and outputs through compile: outputs keep their structure (tuples, dicts,
dataclasses), example inputs that share memory do not make a program of aliased inputs, an input
the model updates in place is updated by each call, as eager updates it, and the buffers it
updates are state the compiled model carries."""

import copy
from dataclasses import dataclass

import pytest

import torch

import fexplore


@dataclass
class Prediction:
    logits: torch.Tensor
    hidden: torch.Tensor


torch.export.register_dataclass(Prediction)


class Structured(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 3)
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x, y):
        h = torch.tanh(self.a(x))
        return {"pair": (h, self.b(y)), "pred": Prediction(h.sum(-1), self.b(x))}


def test_dicts_tuples_and_dataclasses_come_back_as_they_went_in():
    torch.manual_seed(0)
    model = Structured().eval()
    x, y = torch.randn(5, 4), torch.randn(2, 4)
    cm = fexplore.compile(model, (x, y))
    x2, y2 = torch.randn(5, 4), torch.randn(2, 4)
    got = cm(x2, y2)
    with torch.no_grad():
        want = model(x2, y2)
    assert set(got) == {"pair", "pred"}
    assert isinstance(got["pair"], tuple) and len(got["pair"]) == 2
    assert isinstance(got["pred"], Prediction)
    torch.testing.assert_close(got["pair"][0], want["pair"][0])
    torch.testing.assert_close(got["pair"][1], want["pair"][1])
    torch.testing.assert_close(got["pred"].logits, want["pred"].logits)
    torch.testing.assert_close(got["pred"].hidden, want["pred"].hidden)


class PassesThrough(torch.nn.Module):
    """Returns an input untouched, one value twice, and a view of an input (a block hands back its
    hidden states beside what it computed), and copies of both that fexplore's graph no longer
    tells from them (a clone, an ``x + 0``: the input itself once simplified)."""

    def forward(self, x, mask):
        y = torch.tanh(x) * mask
        return {"hidden": x, "out": y, "again": y, "flat": x.reshape(-1),
                "copy": x.clone(), "plus_zero": x + 0, "out_copy": y.clone()}, mask


def test_outputs_alias_as_eagers_do_and_copies_stay_copies():
    x, mask = torch.randn(3, 4), torch.ones(3, 4)
    cm = fexplore.compile(PassesThrough(), (x, mask))
    x2, mask2 = torch.randn(3, 4), (torch.rand(3, 4) > 0.5).float()
    got, want = cm(x2, mask2), PassesThrough()(x2, mask2)
    # the inputs returned untouched are the caller's tensors, as eager's are
    assert got[0]["hidden"] is x2 and got[1] is mask2 and want[0]["hidden"] is x2 and want[1] is mask2
    # one value returned twice is one tensor twice: writing through one shows in the other
    assert got[0]["out"] is got[0]["again"] and want[0]["out"] is want[0]["again"]
    # a copy is a copy, though the final graph returns the input (or the value) itself for it:
    # writing into it must not write into the caller's tensor
    for name, of in (("copy", x2), ("plus_zero", x2), ("out_copy", got[0]["out"])):
        assert got[0][name] is not of and got[0][name].data_ptr() != of.data_ptr(), name
    # a view of an input is that view of the caller's tensor, as eager's is
    assert got[0]["flat"].data_ptr() == x2.data_ptr() == want[0]["flat"].data_ptr()
    for name in want[0]:
        torch.testing.assert_close(got[0][name], want[0][name])


class Views(torch.nn.Module):
    """Views of the inputs by every kind of view op, one of a computed value, and a reshape
    that is a view only when the input's strides allow it."""

    def forward(self, x, y):
        return {"flat": x.reshape(-1), "t": x.transpose(0, 1), "strided": x[1:, ::2], "detached": x.detach(),
                "expanded": y.unsqueeze(0).expand(3, -1), "bits": x.view(torch.int32),
                "window": x.flatten()[2:5], "computed": torch.tanh(x).reshape(-1)}


def test_views_of_inputs_are_views_of_the_callers_tensors():
    """The compiled program computes values; eager returns a view of the input, so a write
    through it shows in the input. The compiled model makes such an output again from the
    caller's tensor by the exported program's view ops, at a dynamic size too (its shape
    arguments read from the call's input). A reshape of a non-contiguous input is a copy in
    eager too, and stays one."""
    x, y = torch.randn(4, 6), torch.randn(5)
    seq = torch.export.Dim("seq", min=3, max=16)
    cm = fexplore.compile(Views(), (x, y), dynamic_shapes=({0: seq}, None))
    for x2 in (torch.randn(4, 6), torch.randn(7, 6), torch.randn(6, 7).T):
        y2 = torch.randn(5)
        got, want = cm(x2, y2), Views()(x2, y2)
        for name, w in want.items():
            g = got[name]
            torch.testing.assert_close(g, w)
            base = y2 if name == "expanded" else x2
            shares = w.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
            assert (g.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()) == shares, name
            assert g.stride() == w.stride(), name
        assert x2.is_contiguous() or got["flat"].untyped_storage().data_ptr() != x2.untyped_storage().data_ptr()
    got = cm(x2 := torch.randn(5, 6), torch.randn(5))
    got["t"][0, 1] = 42.0   # a write through the view shows in the input, as eager's does
    assert x2[1, 0] == 42.0


class SelfAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, q, k, v):
        return self.mha(q, k, v, need_weights=False)[0]


class Halves(torch.nn.Module):
    def forward(self, a, b):
        return a * 2 + b


def test_example_inputs_that_share_memory_compile_to_a_model_of_separate_inputs():
    """``mha(x, x, x)`` as the example: torch.export traces inputs that alias as one tensor, and
    its program reads ``v`` for ``q`` and ``k``. The compile stopped with "stage 'ingest' changed
    the model's numbers" (and with verify=False ran the wrong model on separate inputs)."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    for model, example, other in [(SelfAttention().eval(), (x, x, x), (x, torch.randn(2, 5, 16), torch.randn(2, 5, 16))),
                                  (Halves(), (x, x[0]), (x, torch.randn(5, 16))),
                                  (Halves(), (x[1], x[1].clone()), (torch.randn(5, 16), x[0]))]:
        cm = fexplore.compile(model, example)
        assert cm.verification["ok"].all()
        with torch.no_grad():
            torch.testing.assert_close(cm(*other), model(*other), rtol=1.3e-6, atol=1e-5)
            torch.testing.assert_close(cm(*example), model(*example), rtol=1.3e-6, atol=1e-5)
    assert example[0].data_ptr() == x[1].data_ptr()   # the user's inputs are theirs still


class WritesIntoItsCache(torch.nn.Module):
    """A decode step's cache update in place (``index_copy_`` at the step's position), then reads
    of the updated cache; and a running count updated in place (``add_``)."""

    def forward(self, x, cache, position, count):
        cache.index_copy_(1, position, x)
        count.add_(1)
        return cache.sum(1) * count, x + 1


def test_an_input_the_model_updates_in_place_is_updated_by_each_call():
    """torch.export gives the update as an output of the program (USER_INPUT_MUTATION), and its
    exported program writes it back into the caller's tensor. The compile refused it (FX401);
    the updates are now outputs of the graph after the model's own, verified at every stage like
    them, and each call writes them back. The compile itself leaves the example inputs as they were."""
    model = WritesIntoItsCache()
    example = (torch.randn(2, 1), torch.zeros(2, 5), torch.tensor([3]), torch.ones(()))
    before = [t.clone() for t in example]
    cm = fexplore.compile(model, example)
    assert all(torch.equal(a, b) for a, b in zip(example, before))
    assert cm.verification["ok"].all()
    assert [str(v.type) for v in cm.graph.outputs] == ["f32[2]", "f32[2, 1]", "f32[2, 5]", "f32[]"]
    ours = (torch.zeros(2, 5), torch.ones(()))
    theirs = tuple(t.clone() for t in ours)
    for step in range(3):   # three steps: each reads what the one before wrote
        x, position = torch.randn(2, 1), torch.tensor([step])
        got, want = cm(x, ours[0], position, ours[1]), model(x, theirs[0], position, theirs[1])
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        torch.testing.assert_close(ours, theirs)
    assert float(ours[1]) == 4.0 and bool((ours[0][:, :3] != 0).all())


class Counts(torch.nn.Module):
    """A buffer the model updates in forward, read after the update."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x):
        self.count.add_(1)
        return self.fc(x) * self.count


@pytest.mark.parametrize("make, shape", [
    (Counts, (2, 3)),
    # training mode: the batch's statistics, and the running ones updated (three buffers)
    (lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).train(),
     (2, 3, 8, 8)),
], ids=["counter", "batch-norm-training"])
def test_buffers_the_model_updates_are_state_the_compiled_model_carries(make, shape):
    """torch.export gives a buffer's update as an output of the program (BUFFER_MUTATION), which
    was refused (FX401). The buffers are inputs of the graph after the user's, their new values
    outputs after the model's own, verified at every stage; the compiled model carries them from
    call to call (``cm.state``), as the model carries its buffers, and the compile leaves the
    user's model as it was."""
    torch.manual_seed(0)
    model = make()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cm = fexplore.compile(model, (torch.randn(shape),))
    assert cm.verification["ok"].all()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    twin = copy.deepcopy(model)
    for _ in range(3):
        x = torch.randn(shape)
        with torch.no_grad():
            want = twin(x)
        torch.testing.assert_close(cm(x), want, rtol=1.3e-6, atol=1e-5)
        buffers = dict(twin.named_buffers())
        assert set(cm.state) == set(buffers)
        for name, value in cm.state.items():
            torch.testing.assert_close(value, buffers[name])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    cm.reset_state()
    assert all(torch.equal(before[k], v) for k, v in cm.state.items())
