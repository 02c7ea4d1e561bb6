"""The %%furiosa_kernel cell magic, driven through IPython's InteractiveShell as a notebook would."""

import numpy as np
import pytest

from fexplore import lang
from fexplore.lang.errors import CELL_PREFIX, AxisError, KernelError

MATMUL = '''\
def matmul(a: fl.f32["M", "K"], b: fl.f32["K", "N"]):
    M, K = a.shape
    N = b.shape[1]
    C = fl.output(fl.f32["M", "N"])
    for ms, ns in fl.parallel(fl.tiles(M, 32), fl.tiles(N, 32)):
        acc = None
        for ks in fl.range(fl.tiles(K, 32), stages=2):
            acc = fl.contract("mk,kn->mn", fl.load(a[ms, ks]), fl.load(b[ks, ns]), acc=acc)
        fl.store(C[ms, ns], acc)
    return C

def helper(n):
    return 2 * n
'''

BAD = '''\
def bad(a: fl.f32["M", "K"], b: fl.f32["K", "N"]):
    C = fl.output(fl.f32["M", "N"])
    at = fl.load(a)
    bt = fl.load(b)
    acc = fl.contract("mk,nk->mn", at, bt)
    fl.store(C, acc)
    return C
'''


@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "fexplore")
    sh.run_cell("import numpy as np\nrng = np.random.default_rng(0)")
    return sh


def run(shell, line, cell):
    return shell.run_cell(f"%%furiosa_kernel {line}\n{cell}")


def test_a_cell_defines_kernels_that_the_notebook_then_calls(shell, capsys):
    assert shell.user_ns["fl"] is lang                  # the language is in scope as `fl`
    res = run(shell, "", MATMUL)
    assert res.success
    assert isinstance(shell.user_ns["matmul"], lang.Kernel)
    # the cell compiles with the notebook's __future__ flags: annotations are objects, not strings
    assert isinstance(shell.user_ns["matmul"].fn.__annotations__["a"], lang.TensorSpec)
    assert shell.user_ns["helper"](3) == 6              # a plain helper stays a plain function
    assert "kernel matmul(a: f32[M, K], b: f32[K, N]) on rngd" in capsys.readouterr().out
    res = shell.run_cell("a = rng.standard_normal((64, 48)).astype(np.float32)\n"
                         "b = rng.standard_normal((48, 40)).astype(np.float32)\n"
                         "y = matmul(a, b)\n"
                         "r = matmul.simulate(a, b, target='tiny')")
    assert res.success
    ns = shell.user_ns
    np.testing.assert_allclose(ns["y"], ns["a"] @ ns["b"], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ns["r"].outputs["C"], ns["y"])


def test_options_run_on_random_inputs_against_a_reference_and_show_the_timeline(shell, capsys):
    shell.run_cell("def ref(a, b):\n    return a @ b")
    res = run(shell, "--target tiny --shapes M=64,K=48,N=40 --ref ref --timeline", MATMUL)
    assert res.success
    out = capsys.readouterr().out
    assert "matmul on tiny: a[64, 48], b[48, 40]" in out
    assert "interpreter vs ref: max abs error" in out and "(ok," in out
    assert "simulator: same outputs as the interpreter;" in out and "cycles" in out
    assert "IPython.core.display.Image" in out          # the timeline picture was displayed
    assert shell.user_ns["matmul"].target.name == "tiny"


def test_inputs_from_the_notebook_and_static_arguments(shell, capsys):
    shell.run_cell("x = rng.standard_normal((64, 80)).astype(np.float32)\n"
                   "w = rng.standard_normal(80).astype(np.float32)\n"
                   "from fexplore.lang.examples import reference")
    cell = ("rms = fl.examples.rms_norm\n"
            "def twice(x: fl.f32['R', 'D']):\n"
            "    Y = fl.output(fl.f32['R', 'D'])\n"
            "    fl.store(Y, fl.load(x) * 2.0)\n"
            "    return Y\n")
    res = run(shell, "--kernel rms --inputs x,w --static stages=1 --ref reference.rms_norm", cell)
    assert res.success, res.error_in_exec
    out = capsys.readouterr().out
    assert "rms_norm on rngd: x[64, 80], w[80]" in out and "(ok," in out


def test_a_bad_cell_names_its_own_line_not_fexplore(shell, capsys):
    res = run(shell, "--shapes M=16,K=8,N=8", BAD)
    err = res.error_in_exec
    assert isinstance(err, AxisError) and isinstance(err, KernelError)
    assert err.loc.file.startswith(CELL_PREFIX)
    assert err.loc.line == 6        # line 1 is the %%furiosa_kernel line, as the notebook numbers them
    out = capsys.readouterr().out
    assert "AxisError: [FK112]" in out
    assert "at line 6 of %%furiosa_kernel cell" in out
    assert 'acc = fl.contract("mk,nk->mn", at, bt)' in out
    assert "Traceback" not in out and "fexplore/lang" not in out


def test_an_error_at_a_later_call_still_points_into_the_kernel_cell(shell, capsys):
    assert run(shell, "", BAD).success                  # defining it is fine ...
    res = shell.run_cell("bad(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32))")
    err = res.error_in_exec                             # ... calling it fails on its line
    assert isinstance(err, AxisError) and err.loc.line == 6 and err.loc.file.startswith(CELL_PREFIX)
    assert "Traceback" not in capsys.readouterr().out


def test_a_cell_without_kernels_is_a_usage_error(shell, capsys):
    res = run(shell, "", "x = 1\n")
    assert not res.success
    assert "defines no kernel" in capsys.readouterr().err + str(res.error_in_exec)
