"""Model outputs keep their structure (tuples, dicts, dataclasses) through compile."""

from dataclasses import dataclass

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
