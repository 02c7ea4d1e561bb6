"""ONNX's recurrent layers (RNN, GRU, LSTM) unrolled over their static sequence length into the
IR's linear and elementwise ops, one step at a time, each direction on its own.

Layout 0 (sequence first). Gate orders as ONNX states them: LSTM i, o, f, c; GRU z, r, h.
"""

from __future__ import annotations

import numpy as np

from .elementwise import scalar_like
from .movement import _reshape_to
from .registry import OnnxContext, onnx_converter

_ACT = {"Sigmoid": "sigmoid", "Tanh": "tanh", "Relu": "relu"}


def _act(ctx, name, x):
    op = _ACT.get(name)
    if op is None:
        ctx.refuse(f"{ctx.onnx.op_type} with activation {name}")
    return ctx.emit(op, [x])


def _setup(ctx, gates: int, default_acts):
    if ctx.attr("layout", 0):
        ctx.refuse(f"{ctx.onnx.op_type} with layout=1")
    x, w, r, b = ctx.input(0), ctx.input(1), ctx.input(2), ctx.input(3)
    lens = ctx.const(4, "sequence_lens")
    seq, batch = x.type.shape[:2]
    if not isinstance(seq, int):
        raise NotImplementedError("a recurrent layer over a symbolic sequence length")
    if lens is not None and not np.all(np.asarray(lens) == seq):
        ctx.refuse("sequence_lens shorter than the sequence (padding per batch row)")
    if ctx.attr("clip") is not None:
        ctx.refuse(f"{ctx.onnx.op_type} with clip")
    direction = ctx.attr("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    hidden = ctx.attr("hidden_size") or r.type.shape[-1]
    acts = list(ctx.attr("activations") or default_acts * dirs)
    return x, w, r, b, seq, batch, direction, dirs, hidden, acts


def _dir(ctx, t, d):
    return ctx.emit("select", [t], {"axis": 0, "index": d})


def _run(ctx, gates: int, default_acts, step):
    x, w, r, b, seq, batch, direction, dirs, hidden, acts = _setup(ctx, gates, default_acts)
    n_acts = len(default_acts)
    init_h, init_c = ctx.input(5), ctx.input(6) if ctx.onnx.op_type == "LSTM" else None
    ys, hs, cs = [], [], []
    for d in range(dirs):
        wd, rd = _dir(ctx, w, d), _dir(ctx, r, d)
        bias = None
        if b is not None:
            bd = _dir(ctx, b, d)
            wb = ctx.emit("slice", [bd], {"axis": 0, "start": 0, "end": gates * hidden})
            rb = ctx.emit("slice", [bd], {"axis": 0, "start": gates * hidden, "end": 2 * gates * hidden})
            bias = (wb, rb)
        zeros = ctx.emit("full", [], {"shape": (batch, hidden), "value": 0.0, "dtype": x.type.dtype})
        h = _dir(ctx, init_h, d) if init_h is not None else zeros
        c = (_dir(ctx, init_c, d) if init_c is not None else zeros) if ctx.onnx.op_type == "LSTM" else None
        reverse = direction == "reverse" or d == 1
        order = range(seq - 1, -1, -1) if reverse else range(seq)
        outs = [None] * seq
        a = acts[d * n_acts:(d + 1) * n_acts]
        for t in order:
            xt = ctx.emit("select", [x], {"axis": 0, "index": t})
            h, c = step(ctx, xt, h, c, wd, rd, bias, hidden, a, d)
            outs[t] = h
        ys.append(ctx.emit("concat", [_reshape_to(ctx, o, (1, 1, batch, hidden)) for o in outs],
                           {"axis": 0}) if seq > 1 else _reshape_to(ctx, outs[0], (1, 1, batch, hidden)))
        hs.append(_reshape_to(ctx, h, (1, batch, hidden)))
        if c is not None:
            cs.append(_reshape_to(ctx, c, (1, batch, hidden)))
    cat = (lambda vs, ax: vs[0] if len(vs) == 1 else ctx.emit("concat", vs, {"axis": ax}))
    out = [cat(ys, 1), cat(hs, 0)] + ([cat(cs, 0)] if cs else [])
    return tuple(out[:len(ctx.onnx.output)])


def _gate(ctx, x, h, wd, rd, bias, k, hidden):
    """x W_k^T + h R_k^T (+ both biases) for gate k."""
    wk = ctx.emit("slice", [wd], {"axis": 0, "start": k * hidden, "end": (k + 1) * hidden})
    rk = ctx.emit("slice", [rd], {"axis": 0, "start": k * hidden, "end": (k + 1) * hidden})
    y = ctx.emit("add", [ctx.emit("linear", [x, wk]), ctx.emit("linear", [h, rk])])
    if bias is not None:
        for bb in bias:
            y = ctx.emit("add", [y, ctx.emit("slice", [bb], {"axis": 0, "start": k * hidden,
                                                            "end": (k + 1) * hidden})])
    return y


def _rnn_step(ctx, x, h, c, wd, rd, bias, hidden, acts, d):
    return _act(ctx, acts[0], _gate(ctx, x, h, wd, rd, bias, 0, hidden)), None


def _lstm_step(ctx, x, h, c, wd, rd, bias, hidden, acts, d):
    if ctx.attr("input_forget", 0):
        ctx.refuse("LSTM with input_forget")
    f, g, hh = acts
    peep = None
    if ctx.has_input(7):   # peepholes (i, o, f) look at the cell state
        pd = _dir(ctx, ctx.input(7), d)
        peep = [ctx.emit("slice", [pd], {"axis": 0, "start": k * hidden, "end": (k + 1) * hidden})
                for k in range(3)]

    def peeped(y, k, cell):
        return y if peep is None else ctx.emit("add", [y, ctx.emit("mul", [peep[k], cell])])

    i = _act(ctx, f, peeped(_gate(ctx, x, h, wd, rd, bias, 0, hidden), 0, c))
    fg = _act(ctx, f, peeped(_gate(ctx, x, h, wd, rd, bias, 2, hidden), 2, c))
    cc = _act(ctx, g, _gate(ctx, x, h, wd, rd, bias, 3, hidden))
    c = ctx.emit("add", [ctx.emit("mul", [fg, c]), ctx.emit("mul", [i, cc])])
    o = _act(ctx, f, peeped(_gate(ctx, x, h, wd, rd, bias, 1, hidden), 1, c))
    return ctx.emit("mul", [o, _act(ctx, hh, c)]), c


def _gru_step(ctx, x, h, c, wd, rd, bias, hidden, acts, d):
    f, g = acts
    z = _act(ctx, f, _gate(ctx, x, h, wd, rd, bias, 0, hidden))
    r = _act(ctx, f, _gate(ctx, x, h, wd, rd, bias, 1, hidden))

    def gate_h(t):   # the third gate's rows
        return ctx.emit("slice", [t], {"axis": 0, "start": 2 * hidden, "end": 3 * hidden})

    wh, rh = gate_h(wd), gate_h(rd)
    xw = ctx.emit("linear", [x, wh])
    if bias is not None:
        xw = ctx.emit("add", [xw, gate_h(bias[0])])
    rbh = gate_h(bias[1]) if bias is not None else None
    if ctx.attr("linear_before_reset", 0):
        hr = ctx.emit("linear", [h, rh])
        if rbh is not None:
            hr = ctx.emit("add", [hr, rbh])
        hr = ctx.emit("mul", [r, hr])
    else:
        hr = ctx.emit("linear", [ctx.emit("mul", [r, h]), rh])
        if rbh is not None:
            hr = ctx.emit("add", [hr, rbh])
    ht = _act(ctx, g, ctx.emit("add", [xw, hr]))
    one = scalar_like(ctx, 1.0, z)
    h = ctx.emit("add", [ctx.emit("mul", [ctx.emit("sub", [one, z]), ht]), ctx.emit("mul", [z, h])])
    return h, None


@onnx_converter("RNN")
def _rnn(ctx):
    return _run(ctx, 1, ["Tanh"], _rnn_step)


@onnx_converter("LSTM")
def _lstm(ctx):
    return _run(ctx, 4, ["Sigmoid", "Tanh", "Tanh"], _lstm_step)


@onnx_converter("GRU")
def _gru(ctx):
    return _run(ctx, 3, ["Sigmoid", "Tanh"], _gru_step)
