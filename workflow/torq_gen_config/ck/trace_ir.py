"""Reading TraceLens event-replay IR: the convolution records of a PyTorch trace.

The file is a JSON list of records (AMD-AGI/TraceLens ``EventReplay/event_replay.py``,
``get_repro_info``), each with ``op_name``, ``replay_ir.list_pos_args`` and
``replay_ir.list_kwargs`` (lists of ``{arg_name, arg_type, value}``), tensors as
``{shape, dtype, strides}``, optional ``count`` and ``metadata.priority_rank`` (added by
whatever wrote ``conv_repros_ir.json``; TraceLens itself does not).

Arguments are taken by name, else by position in the op's ATen schema
(native_functions.yaml); :data:`SCHEMAS` lists the ops understood. Every record is checked
before it becomes a :class:`ConvProblem` (docs/ck_profile.md, "What is checked"): channel
counts divisible by the groups and matching the weight, spatial lists of the right length
(a scalar or a one-element list broadcasts; padding may list begins then ends), a positive
output size, ``grad_output`` of exactly the computed shape, no transposed convolution, no
output_padding, one supported dtype, dense strides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import ReportError, TorqGenConfigError
from ..core.fileio import read_json
from .problem import ConvProblem

#: ATen argument order of the convolution ops read from a trace.
SCHEMAS = {
    "aten::miopen_convolution": ("self", "weight", "bias", "padding", "stride", "dilation", "groups",
                                 "benchmark", "deterministic"),
    "aten::cudnn_convolution": ("self", "weight", "padding", "stride", "dilation", "groups", "benchmark",
                                "deterministic", "allow_tf32"),
    "aten::convolution": ("input", "weight", "bias", "stride", "padding", "dilation", "transposed",
                          "output_padding", "groups"),
    "aten::_convolution": ("input", "weight", "bias", "stride", "padding", "dilation", "transposed",
                           "output_padding", "groups", "benchmark", "deterministic", "cudnn_enabled", "allow_tf32"),
    "aten::convolution_backward": ("grad_output", "input", "weight", "bias_sizes", "stride", "padding", "dilation",
                                   "transposed", "output_padding", "groups", "output_mask"),
}
BACKWARD = "aten::convolution_backward"
#: Trace dtype spellings (c10 names, torch names) -> CK data types.
DTYPES = {
    "c10::half": "fp16", "half": "fp16", "float16": "fp16", "torch.float16": "fp16", "torch.half": "fp16",
    "c10::bfloat16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "float": "fp32", "c10::float": "fp32", "float32": "fp32", "torch.float32": "fp32", "torch.float": "fp32",
}


class TraceFormatError(TorqGenConfigError):
    """The trace file cannot be read as TraceLens IR (not JSON, not a list of objects)."""


class RecordSkipped(Exception):
    """A convolution record that cannot be profiled as traced; ``str(e)`` is the reason."""


@dataclass
class ConvRecord:
    """A validated convolution record.

    Attributes:
        index: 0-based position in the trace.
        op_name: the ATen op (``aten::miopen_convolution``, ...).
        problem: the convolution in CK's terms.
        passes: what the record computes: ``forward``, ``backward_data``, ``backward_weight``.
        priority_rank: ``metadata.priority_rank``, or None when the record has none.
        count: the record's ``count`` (how often the trace saw it), or None.
        notes: remarks to carry into the configurations (bias gradient not profiled, ...).
    """

    index: int
    op_name: str
    problem: ConvProblem
    passes: list[str]
    priority_rank: int | None = None
    count: int | None = None
    notes: list[str] = field(default_factory=list)


def read_trace(path: str | Path) -> list:
    """The records of a trace file.

    Raises:
        TraceFormatError: missing or unreadable file, not JSON, not a list of objects, or a
            record without a string ``op_name`` (one line naming the place).
    """
    path = Path(path)
    try:
        data = read_json(path, "trace file")
    except ReportError as e:
        raise TraceFormatError(str(e)) from None
    if isinstance(data, dict) and isinstance(data.get("records"), list):
        data = data["records"]
    if not isinstance(data, list):
        raise TraceFormatError(f"trace file {path}: expected a JSON list of TraceLens IR records, "
                               f"got a {type(data).__name__}")
    for i, rec in enumerate(data):
        if not isinstance(rec, dict) or not isinstance(rec.get("op_name"), str):
            raise TraceFormatError(f"trace file {path}: record {i} is not an object with a string op_name")
    return data


def is_convolution(record: dict) -> bool:
    """True for the ops of :data:`SCHEMAS`."""
    return record.get("op_name") in SCHEMAS


def parse_record(record: dict, index: int) -> ConvRecord:
    """Validate one convolution record (``is_convolution(record)`` must hold).

    Raises:
        RecordSkipped: the record is malformed or not profilable as traced; the reason says why.
    """
    op = record["op_name"]
    args = _arguments(record, SCHEMAS[op])
    backward = op == BACKWARD
    # the schemas give these no defaults: a trace without them is incomplete, not "pad 0"
    required = [a for a in ("padding", "stride", "dilation", "groups", "transposed", "output_padding", "output_mask")
                if a in SCHEMAS[op]]
    missing = [a for a in required if args.get(a) is None]
    if missing:
        raise RecordSkipped(f"argument(s) {', '.join(missing)} missing (the ATen schema has no defaults for them)")
    x = _tensor(args, "self" if "self" in SCHEMAS[op] else "input")
    w = _tensor(args, "weight")
    ndim = len(x["shape"]) - 2
    if ndim not in (1, 2, 3):
        raise RecordSkipped(f"input of rank {len(x['shape'])}: CK's grouped convolutions are 1D, 2D or 3D")
    if len(w["shape"]) != ndim + 2:
        raise RecordSkipped(f"weight of rank {len(w['shape'])} for an input of rank {ndim + 2}")
    if _flag(args, "transposed", False):
        raise RecordSkipped("transposed=True: a transposed convolution swaps the roles of data and weight; "
                            "not converted")
    out_pad = args.get("output_padding")
    if out_pad is not None and any(_int_list(out_pad, "output_padding", ndim)):
        raise RecordSkipped(f"output_padding {out_pad}: only transposed convolutions use it; not converted")
    groups = _int(args, "groups", 1)
    if groups < 1:
        raise RecordSkipped(f"groups={groups}")
    n, c_total = x["shape"][0], x["shape"][1]
    k_total, c_weight = w["shape"][0], w["shape"][1]
    if c_total % groups:
        raise RecordSkipped(f"input channels {c_total} not divisible by groups={groups}")
    if k_total % groups:
        raise RecordSkipped(f"output channels {k_total} (weight dim 0) not divisible by groups={groups}")
    if c_weight != c_total // groups:
        raise RecordSkipped(f"weight dim 1 is {c_weight}, expected input channels / groups = {c_total // groups}")
    strides = _spatial(args, "stride", ndim, default=1)
    dilations = _spatial(args, "dilation", ndim, default=1)
    left, right = _padding(args, ndim)
    if min(strides) < 1 or min(dilations) < 1 or min(left + right) < 0:
        raise RecordSkipped(f"stride {list(strides)}, dilation {list(dilations)}, padding {list(left)}/{list(right)}: "
                            "strides and dilations must be >= 1, pads >= 0")
    dtype = _dtype(x, "input")
    if _dtype(w, "weight") != dtype:
        raise RecordSkipped(f"input is {x['dtype']} but weight is {w['dtype']}: CK needs one data type")
    x_fmt, w_fmt = _memory_format(x, "input"), _memory_format(w, "weight")
    dy_fmt = _memory_format(_tensor(args, "grad_output"), "grad_output") if backward else None
    # a tensor whose size-1 dims make both formats fit (a 1x1 weight, a 1x1 output) takes
    # the format of the others: PyTorch gives a channels-last model's 1x1 weights such strides
    known = [f for f in (x_fmt, dy_fmt, w_fmt) if f not in (None, "either")]
    x_last = (x_fmt if x_fmt != "either" else (known[0] if known else "contiguous")) == "channels_last"
    w_last = (w_fmt if w_fmt != "either" else ("channels_last" if x_last else "contiguous")) == "channels_last"
    if backward and dy_fmt != "either" and (dy_fmt == "channels_last") != x_last:
        raise RecordSkipped("grad_output and input have different memory formats")
    problem = ConvProblem(G=groups, N=n, K=k_total // groups, C=c_total // groups, filter=tuple(w["shape"][2:]),
                          input=tuple(x["shape"][2:]), strides=strides, dilations=dilations, left_pads=left,
                          right_pads=right, dtype=dtype, channels_last=x_last, weight_channels_last=w_last)
    out = problem.output()
    if min(out) < 1:
        raise RecordSkipped(f"output size {list(out)} is not positive (input {list(problem.input)}, "
                            f"filter {list(problem.filter)}, pads {list(left)}/{list(right)})")
    notes = []
    if backward:
        dy = _tensor(args, "grad_output")
        want = [n, k_total, *out]
        if list(dy["shape"]) != want:
            raise RecordSkipped(f"grad_output shape {dy['shape']} differs from the computed output {want}")
        if _dtype(dy, "grad_output") != dtype:
            raise RecordSkipped(f"grad_output is {dy['dtype']} but input is {x['dtype']}")
        mask = args.get("output_mask")
        if not (isinstance(mask, list) and len(mask) == 3 and all(isinstance(m, bool) for m in mask)):
            raise RecordSkipped(f"output_mask must be a list of three booleans, not {mask!r}")
        passes = [p for p, m in zip(("backward_data", "backward_weight"), mask) if m]
        if mask[2]:
            notes.append("the bias gradient (output_mask[2]) is a reduction, not a convolution: not profiled")
        if not passes:
            raise RecordSkipped(f"output_mask {mask} asks for no data or weight gradient")
    else:
        passes = ["forward"]
    rank = (record.get("metadata") or {}).get("priority_rank") if isinstance(record.get("metadata"), dict) else None
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)):
        notes.append(f"metadata.priority_rank {rank!r} is not an integer: taken as unranked")
        rank = None
    count = record.get("count")
    return ConvRecord(index=index, op_name=op, problem=problem, passes=passes, priority_rank=rank,
                      count=count if isinstance(count, int) and not isinstance(count, bool) else None, notes=notes)


def _arguments(record: dict, schema: tuple[str, ...]) -> dict:
    ir = record.get("replay_ir")
    if not isinstance(ir, dict):
        raise RecordSkipped("no replay_ir object")
    pos, kw = ir.get("list_pos_args", []), ir.get("list_kwargs", [])
    if not isinstance(pos, list) or not isinstance(kw, list):
        raise RecordSkipped("replay_ir.list_pos_args / list_kwargs must be lists")
    args = {}
    for i, a in enumerate(pos):
        if not isinstance(a, dict) or "value" not in a:
            raise RecordSkipped(f"positional argument {i} is not an {{arg_name, arg_type, value}} object")
        name = a.get("arg_name") or (schema[i] if i < len(schema) else None)
        if name is None:
            raise RecordSkipped(f"{len(pos)} positional arguments, the schema has {len(schema)}")
        args[name] = a["value"]
    for a in kw:
        if not isinstance(a, dict) or not isinstance(a.get("arg_name"), str) or "value" not in a:
            raise RecordSkipped("a keyword argument is not an {arg_name, arg_type, value} object")
        args[a["arg_name"]] = a["value"]
    return args


def _tensor(args: dict, name: str) -> dict:
    t = args.get(name)
    if not isinstance(t, dict) or not isinstance(t.get("shape"), list):
        raise RecordSkipped(f"argument {name} is missing or not a tensor {{shape, dtype, strides}}")
    shape = t["shape"]
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape):
        raise RecordSkipped(f"{name} shape {shape} must be positive integers")
    strides = t.get("strides")
    if strides is not None and (not isinstance(strides, list) or len(strides) != len(shape)
                                or not all(isinstance(s, int) and not isinstance(s, bool) for s in strides)):
        raise RecordSkipped(f"{name} strides {strides} do not match its shape {shape}")
    if not isinstance(t.get("dtype"), str):
        raise RecordSkipped(f"{name} has no dtype")
    return t


def _dtype(t: dict, name: str) -> str:
    d = DTYPES.get(t["dtype"].lower())
    if d is None:
        raise RecordSkipped(f"{name} dtype {t['dtype']}: CK profiles fp16, bf16 and fp32 convolutions")
    return d


def dense_strides(shape: list[int], order: list[int] | None = None) -> list[int]:
    """Strides (in elements) of a dense tensor whose dims are laid out in ``order``, outermost
    first (default: contiguous, ``0, 1, ..., rank-1``)."""
    order = list(range(len(shape))) if order is None else order
    strides, step = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = step
        step *= shape[d]
    return strides


def _memory_format(t: dict, name: str) -> str:
    """``"contiguous"``, ``"channels_last"``, or ``"either"`` when size-1 dims make both
    fit (the caller decides from the other tensors); no strides count as contiguous.

    Raises:
        RecordSkipped: strides of neither format (a view, a broadcast, a permutation).
    """
    shape, strides = t["shape"], t.get("strides")
    if strides is None:
        return "contiguous"

    def same(order):
        want = dense_strides(shape, order)
        return all(s == w for s, w, d in zip(strides, want, shape) if d > 1)

    rank = len(shape)
    contiguous, last = same(list(range(rank))), same([0, *range(2, rank), 1])
    if contiguous and last:
        return "either"
    if contiguous or last:
        return "contiguous" if contiguous else "channels_last"
    raise RecordSkipped(f"{name} strides {strides} (shape {shape}) are neither contiguous nor channels-last")


def _int(args: dict, name: str, default: int) -> int:
    v = args.get(name, default)
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool):
        raise RecordSkipped(f"{name} must be an integer, not {v!r}")
    return v


def _flag(args: dict, name: str, default: bool) -> bool:
    v = args.get(name, default)
    if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
        return bool(v)
    raise RecordSkipped(f"{name} must be a boolean, not {v!r}")


def _int_list(v, name: str, ndim: int) -> list[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return [v] * ndim
    if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        if len(v) == 1:
            return v * ndim
        if len(v) == ndim:
            return list(v)
    raise RecordSkipped(f"{name} {v!r} must be an integer or a list of 1 or {ndim} integers")


def _spatial(args: dict, name: str, ndim: int, default: int) -> tuple[int, ...]:
    v = args.get(name)
    return tuple(_int_list(default if v is None else v, name, ndim))


def _padding(args: dict, ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Left and right pads; a list of 2·ndim values is begins then ends (asymmetric)."""
    v = args.get("padding")
    if v is None:
        return (0,) * ndim, (0,) * ndim
    if isinstance(v, str):
        raise RecordSkipped(f"padding {v!r}: string padding modes are not in these ops' schemas")
    if isinstance(v, list) and len(v) == 2 * ndim and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return tuple(v[:ndim]), tuple(v[ndim:])
    pads = tuple(_int_list(v, "padding", ndim))
    return pads, pads
