"""``fexplore kernel FILE.py``: list a file's kernels, run one against a reference and the
simulator, write its timeline; errors name the kernel file's own line."""

import json
import textwrap

from fexplore.cli import main

KERNELS = textwrap.dedent('''
    def scale_rows(x: fl.f32["M", "N"], s: fl.f32["M", 1]):
        M, N = x.shape
        Y = fl.output(fl.f32["M", "N"])
        for ms in fl.parallel(fl.tiles(M, 32)):
            fl.store(Y[ms, :], fl.mul(fl.load(x[ms, :]), fl.load(s[ms, :])))
        return Y

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

    def ref_matmul(a, b):
        return a @ b

    def wrong_ref(a, b):
        return a @ b + 1
''')

BAD = textwrap.dedent('''
    def bad(a: fl.f32["M", "K"], b: fl.f32["K", "N"]):
        C = fl.output(fl.f32["M", "N"])
        at = fl.load(a[:, :])
        bt = fl.load(b[:, :])
        fl.store(C[:, :], fl.contract("mk,nk->mn", at, bt))   # THE BAD LINE
        return C
''')


def test_lists_runs_checks_and_traces(tmp_path, capsys):
    f = tmp_path / "kernels.py"
    f.write_text(KERNELS)
    assert main(["kernel", str(f)]) == 0
    out = capsys.readouterr().out
    assert "kernel scale_rows(" in out and "kernel matmul(" in out
    trace = tmp_path / "t.json"
    assert main(["kernel", str(f), "--kernel", "matmul", "--shapes", "M=64,K=96,N=32",
                 "--ref", "ref_matmul", "--target", "tiny", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "interpreter vs ref_matmul" in out and "(ok" in out
    assert "simulator: same outputs as the interpreter" in out
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert any(e.get("ph") == "X" for e in events)
    # a reference that disagrees is exit status 1
    assert main(["kernel", str(f), "--kernel", "matmul", "--shapes", "M=32,K=32,N=32",
                 "--ref", "wrong_ref", "--no-sim"]) == 1


def test_kernel_errors_name_the_files_line(tmp_path, capsys):
    f = tmp_path / "bad.py"
    f.write_text(BAD)
    assert main(["kernel", str(f), "--shapes", "M=32,K=32,N=32"]) == 2
    err = capsys.readouterr().err
    line = BAD.splitlines().index(next(l for l in BAD.splitlines() if "THE BAD LINE" in l)) + 1
    assert f"{f}:{line}" in err
    assert "[FK" in err
    assert main(["kernel", str(f), "--shapes", "M=32"]) == 2  # no size for K: a usage error
    assert "no size for axis" in capsys.readouterr().err
