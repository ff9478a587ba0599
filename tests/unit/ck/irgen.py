"""Hand-written TraceLens event-replay IR records for the CK tests (ATen schemas:
native_functions.yaml; the format: TraceLens EventReplay/event_replay.py)."""

from __future__ import annotations

import json
from pathlib import Path

from torq_gen_config.ck.trace_ir import dense_strides

FAKE_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "fake_ck"
DATA = Path(__file__).resolve().parents[2] / "data"


def contiguous(shape):
    return dense_strides(shape)


def channels_last(shape):
    """Strides of a channels-last tensor [N, C, *sp] (C innermost)."""
    n, c, *sp = shape
    strides = [0] * len(shape)
    step = 1
    strides[1] = step
    step *= c
    for i in range(len(shape) - 1, 1, -1):
        strides[i] = step
        step *= shape[i]
    strides[0] = step
    return strides


def tensor(shape, dtype="c10::Half", strides="contiguous"):
    s = contiguous(shape) if strides == "contiguous" else channels_last(shape) if strides == "cl" else strides
    return {"shape": list(shape), "dtype": dtype, "strides": s}


def arg(name, value, kind="x"):
    return {"arg_name": name, "arg_type": kind, "value": value}


def forward(x, w, *, padding=(0, 0), stride=(1, 1), dilation=(1, 1), groups=1, dtype="c10::Half", rank=1,
            layout="contiguous", op="aten::miopen_convolution", w_layout=None):
    """A forward record; ``x``, ``w`` are shapes."""
    xs, ws = tensor(x, dtype, layout), tensor(w, dtype, w_layout or layout)
    if op == "aten::convolution":
        pos = [arg("input", xs), arg("weight", ws), arg("bias", None), arg("stride", list(stride)),
               arg("padding", list(padding)), arg("dilation", list(dilation)), arg("transposed", False),
               arg("output_padding", [0] * (len(x) - 2)), arg("groups", groups)]
    else:
        pos = [arg("self", xs), arg("weight", ws), arg("bias", None), arg("padding", list(padding)),
               arg("stride", list(stride)), arg("dilation", list(dilation)), arg("groups", groups),
               arg("benchmark", False), arg("deterministic", False)]
    return {"op_name": op, "replay_ir": {"list_pos_args": pos, "list_kwargs": []}, "metadata": {"priority_rank": rank}}


def out_size(i, f, s, d, pl, pr):
    return (i + pl + pr - ((f - 1) * d + 1)) // s + 1


def backward(x, w, *, padding=(0, 0), stride=(1, 1), dilation=(1, 1), groups=1, mask=(True, True, False),
             dtype="c10::Half", rank=1, layout="contiguous", transposed=False, output_padding=None, grad_output=None):
    """A convolution_backward record; grad_output's shape is computed unless given."""
    nd = len(x) - 2
    pads = list(padding) if len(padding) == nd else list(padding)
    pl, pr = (padding[:nd], padding[nd:]) if len(padding) == 2 * nd else (padding, padding)
    out = [out_size(x[2 + k], w[2 + k], stride[k], dilation[k], pl[k], pr[k]) for k in range(nd)]
    dy = grad_output or [x[0], w[0], *out]
    pos = [arg("grad_output", tensor(dy, dtype, layout)), arg("input", tensor(x, dtype, layout)),
           arg("weight", tensor(w, dtype, layout)), arg("bias_sizes", None), arg("stride", list(stride)),
           arg("padding", pads), arg("dilation", list(dilation)), arg("transposed", transposed),
           arg("output_padding", list(output_padding or [0] * nd)), arg("groups", groups),
           arg("output_mask", list(mask))]
    return {"op_name": "aten::convolution_backward", "replay_ir": {"list_pos_args": pos, "list_kwargs": []},
            "metadata": {"priority_rank": rank}}


def write(path, records) -> Path:
    Path(path).write_text(json.dumps(records))
    return Path(path)
