"""torch.export's own gallery of what it accepts (ExportDB, shipped with torch): each example it
marks supported compiles, verifies at every stage and runs on the chip as eager does, on its
example inputs and on the other inputs the example gives; the two whose sizes depend on tensor
values are refused, clearly. Written by torch's developers, not ours: control flow on sizes and
on values, maps, keyword inputs, numbers returned, mutations, closures, pytrees."""

import copy
import warnings

import pytest
import torch

import fexplore
from fexplore.errors import FexploreError

try:
    from torch._export.db.examples import all_examples
    EXAMPLES = {name: case for name, case in all_examples().items()
                if case.support_level.name == "SUPPORTED"}
except ImportError:   # a torch without the gallery: nothing to run, said so in the collection
    EXAMPLES = {}

# Sizes that depend on values read from tensors: not a program of static or symbolic sizes.
DATA_DEPENDENT = {"assume_constant_result", "constrain_as_size_example"}


def _call(fn, args, kwargs):
    """``fn`` on copies (an example may update its inputs in place)."""
    with torch.no_grad():
        return fn(*copy.deepcopy(args), **copy.deepcopy(kwargs))


def test_the_gallery_is_here():
    assert len(EXAMPLES) >= 30, "torch's ExportDB examples could not be loaded"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_exportdb_example(name):
    case = EXAMPLES[name]
    args, kwargs = case.example_args, case.example_kwargs or {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch's notes on the examples' own style
        if name in DATA_DEPENDENT:
            with pytest.raises(FexploreError, match="depends on the values"):
                fexplore.compile(copy.deepcopy(case.model), args, example_kwargs=kwargs,
                                 dynamic_shapes=case.dynamic_shapes)
            return
        model = copy.deepcopy(case.model)
        cm = fexplore.compile(model, args, example_kwargs=kwargs, dynamic_shapes=case.dynamic_shapes)
        assert cm.verification["ok"].all(), cm.verification
        calls = [args] + ([case.extra_args] if case.extra_args else [])
        for call in calls:
            want = _call(case.model, call, kwargs)
            got = _call(cm, call, kwargs)
            torch.testing.assert_close(got, want)
            # the program of the call's sizes: a cond on a tensor's value runs its branch from
            # the host (the chip's program has no branches); every other op is a kernel
            leaves = torch.utils._pytree.tree_leaves((call, kwargs))
            made = cm.schedules.for_inputs([x.numpy() for x in leaves if isinstance(x, torch.Tensor)])
            host = [k.node.op.name for k in made.schedule.kernels if k.how == "host"]
            assert set(host) <= {"cond"}, host
