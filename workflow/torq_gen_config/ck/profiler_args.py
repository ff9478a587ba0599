"""The real ckProfiler's command line for grouped convolutions, and the configuration format.

Facts from CK's sources (profiler/src/profile_grouped_conv_{fwd,bwd_data,bwd_weight}.cpp;
summary in docs/ck_profile.md):

- one binary, ``ckProfiler``, with the operation as its first argument;
- fwd: ``data_type layout index_type verify init log time ndim G N K C`` + six spatial groups;
  bwd_data / bwd_weight: the same without ``index_type`` and with ``split_k`` last;
  the count is checked exactly: argc = 14 + 6·ndim (argv[0] and the op name included);
- data-type and layout codes differ per op (bwd_weight's layouts are shifted by one and its
  bf16 code is 5);
- split_k: ``all`` is understood by bwd_weight only; bwd_data parses it with ``std::stoi``
  (``all`` aborts the program), where ``0`` sweeps the values.

A configuration (one entry of ``ck_profiler_configs.json``, the seed's format)::

    {"operation_type": "grouped_conv_fwd",
     "profiler_args": {"data_type": 1, "layout": 3, "index_type": 0, "verify": 0, "init": 1,
                       "log": 0, "time": 1, "num_dim_spatial": 2, "G": 32, "N": 32, "K": 4,
                       "C": 4, "filter_spatial": [3, 3], "input_spatial": [200, 200],
                       "strides": [1, 1], "dilations": [1, 1], "left_pads": [1, 1],
                       "right_pads": [1, 1]},          # + "split_k" for bwd ops
     "metadata": {"priority_rank": 1, "pytorch_op": "aten::miopen_convolution",
                  "description": "...", "dtype": "fp16", "layout_name": "NGCHW_GKCYX_NGKHW"}}

The seed wrote ``profile_grouped_conv_*`` as the operation type (an executable CK does not
have); those names are read as the real op names.
"""

from __future__ import annotations

import hashlib
import json

from ..core.errors import TorqGenConfigError
from .problem import ConvProblem

FWD, BWD_DATA, BWD_WEIGHT = "grouped_conv_fwd", "grouped_conv_bwd_data", "grouped_conv_bwd_weight"
OPERATIONS = (FWD, BWD_DATA, BWD_WEIGHT)
#: Short names used in summaries and configuration IDs.
SHORT = {FWD: "fwd", BWD_DATA: "bwd_data", BWD_WEIGHT: "bwd_weight"}

#: data_type codes per op (profile_grouped_conv_*.cpp). bwd_weight's 2 is bf16 data with an
#: fp32 weight; 5 is bf16 throughout, what a bf16 PyTorch trace computes.
DATA_TYPE_CODES = {
    FWD: {"fp32": 0, "fp16": 1, "bf16": 2},
    BWD_DATA: {"fp32": 0, "fp16": 1, "bf16": 2},
    BWD_WEIGHT: {"fp32": 0, "fp16": 1, "bf16": 5},
}
#: layout codes per op; bwd_weight's list starts with GNCHW_GKCYX_GNKHW, so its codes are
#: shifted by one against fwd/bwd_data.
LAYOUT_CODES = {
    FWD: {"GNHWC_GKYXC_GNHWK": 0, "NHWGC_GKYXC_NHWGK": 1, "NGCHW_GKYXC_NGKHW": 2, "NGCHW_GKCYX_NGKHW": 3},
    BWD_DATA: {"GNHWC_GKYXC_GNHWK": 0, "NHWGC_GKYXC_NHWGK": 1, "NGCHW_GKYXC_NGKHW": 2, "NGCHW_GKCYX_NGKHW": 3},
    BWD_WEIGHT: {"GNCHW_GKCYX_GNKHW": 0, "GNHWC_GKYXC_GNHWK": 1, "NHWGC_GKYXC_NHWGK": 2,
                 "NGCHW_GKYXC_NGKHW": 3, "NGCHW_GKCYX_NGKHW": 4},
}
#: Fixed settings of the generated configurations (the seed's): no verification, integer
#: init, no tensor log, timing on (time=0 makes CK report 0 ms and meaningless TFLOPS).
FIXED_ARGS = {"verify": 0, "init": 1, "log": 0, "time": 1}
_SPATIAL_KEYS = ("filter_spatial", "input_spatial", "strides", "dilations", "left_pads", "right_pads")
_SCALAR_KEYS = ("data_type", "layout", "verify", "init", "log", "time", "num_dim_spatial", "G", "N", "K", "C")
_INT32_LIMIT = 2 ** 31


class ConfigFormatError(TorqGenConfigError):
    """A configuration cannot be run as written (wrong keys, lengths, values)."""


def layout_name(problem: ConvProblem) -> str:
    """The CK layout that matches the problem's memory layout, without moving data.

    Contiguous PyTorch tensors are NGCHW_GKCYX_NGKHW (the channel dim split into G, C);
    channels-last activations and weight are NHWGC_GKYXC_NHWGK; contiguous activations with a
    channels-last weight are NGCHW_GKYXC_NGKHW.

    Raises:
        ConfigFormatError: channels-last activations with a contiguous weight (no CK layout).
    """
    spatial = "DHW"[3 - problem.ndim:]
    f = "ZYX"[3 - problem.ndim:]
    if problem.channels_last:
        if not problem.weight_channels_last:
            raise ConfigFormatError("channels-last activations with a KCYX weight: CK has no such layout")
        return f"N{spatial}GC_GK{f}C_N{spatial}GK"
    if problem.weight_channels_last:
        return f"NGC{spatial}_GK{f}C_NGK{spatial}"
    return f"NGC{spatial}_GKC{f}_NGK{spatial}"


def layout_code(op: str, name: str) -> int:
    """CK's layout code of ``name`` (any spatial rank's spelling) for ``op``.

    Raises:
        ConfigFormatError: the op has no such layout.
    """
    two_d = name.replace("DHW", "HW").replace("ZYX", "YX")
    if "HW" not in two_d:  # 1D spelling: NWGC_GKXC_NWGK -> NHWGC_GKYXC_NHWGK
        two_d = two_d.replace("W", "HW").replace("X", "YX")
    try:
        return LAYOUT_CODES[op][two_d]
    except KeyError:
        raise ConfigFormatError(f"{op} has no layout {name}") from None


def layout_of_code(op: str, code: int, ndim: int) -> str | None:
    """The layout name of a code for ``op``, spelt for ``ndim`` spatial dims (None if unknown)."""
    for name, c in LAYOUT_CODES[op].items():
        if c == code:
            if ndim == 3:
                return name.replace("HW", "DHW").replace("YX", "ZYX")
            if ndim == 1:
                return name.replace("HW", "W").replace("YX", "X")
            return name
    return None


def index_type(problem: ConvProblem) -> int:
    """0 (32-bit indices) unless a tensor has 2**31 elements or more, then 1 (64-bit)."""
    return 1 if max(problem.tensor_elements()) >= _INT32_LIMIT else 0


def make_config(problem: ConvProblem, op: str, *, layout: str, metadata: dict) -> dict:
    """One configuration (the seed's format) for ``op`` on ``problem``.

    ``split_k`` is ``"all"`` for bwd_weight (sweeps -1 and 1..128) and ``0`` for bwd_data
    (its sweep; ``all`` would abort it); fwd has ``index_type`` instead.

    Raises:
        ConfigFormatError: the dtype or layout has no code for ``op``.
    """
    if problem.dtype not in DATA_TYPE_CODES[op]:
        raise ConfigFormatError(f"{op} has no data type {problem.dtype}")
    args = {"data_type": DATA_TYPE_CODES[op][problem.dtype], "layout": layout_code(op, layout)}
    if op == FWD:
        args["index_type"] = index_type(problem)
    args.update(FIXED_ARGS)
    args.update({"num_dim_spatial": problem.ndim, "G": problem.G, "N": problem.N, "K": problem.K, "C": problem.C,
                 "filter_spatial": list(problem.filter), "input_spatial": list(problem.input),
                 "strides": list(problem.strides), "dilations": list(problem.dilations),
                 "left_pads": list(problem.left_pads), "right_pads": list(problem.right_pads)})
    if op == BWD_WEIGHT:
        args["split_k"] = "all"
    elif op == BWD_DATA:
        args["split_k"] = 0
    return {"operation_type": op, "profiler_args": args, "metadata": dict(metadata)}


def normalize_config(config: object, where: str = "configuration") -> dict:
    """Check one configuration and return it with the real op name.

    Accepts the seed's ``profile_grouped_conv_*`` names. Checks every key the command needs,
    integer values, spatial list lengths equal to ``num_dim_spatial`` (1-3), and split_k.

    Raises:
        ConfigFormatError: naming ``where`` and the first problem found.
    """
    if not isinstance(config, dict):
        raise ConfigFormatError(f"{where}: not a JSON object")
    op = config.get("operation_type")
    if isinstance(op, str) and op.startswith("profile_"):
        op = op[len("profile_"):]
    if op not in OPERATIONS:
        raise ConfigFormatError(f"{where}: operation_type {config.get('operation_type')!r} is none of "
                                + ", ".join(OPERATIONS))
    args = config.get("profiler_args")
    if not isinstance(args, dict):
        raise ConfigFormatError(f"{where}: profiler_args missing or not an object")
    needed = list(_SCALAR_KEYS) + (["index_type"] if op == FWD else ["split_k"]) + list(_SPATIAL_KEYS)
    missing = [k for k in needed if k not in args]
    if missing:
        raise ConfigFormatError(f"{where}: profiler_args lacks {', '.join(missing)}")
    for k in _SCALAR_KEYS + (("index_type",) if op == FWD else ()):
        if not _is_int(args[k]):
            raise ConfigFormatError(f"{where}: profiler_args.{k} must be an integer, not {args[k]!r}")
    ndim = args["num_dim_spatial"]
    if ndim not in (1, 2, 3):
        raise ConfigFormatError(f"{where}: num_dim_spatial must be 1, 2 or 3, not {ndim}")
    for k in _SPATIAL_KEYS:
        v = args[k]
        if not isinstance(v, list) or len(v) != ndim or not all(_is_int(x) for x in v):
            raise ConfigFormatError(f"{where}: profiler_args.{k} must be a list of {ndim} integers, not {v!r}")
    for k in ("G", "N", "K", "C"):
        if args[k] < 1:
            raise ConfigFormatError(f"{where}: profiler_args.{k} must be >= 1, not {args[k]}")
    if op != FWD:
        sk = args["split_k"]
        if not (_is_int(sk) or (isinstance(sk, str) and (sk == "all" or _is_int_text(sk)))):
            raise ConfigFormatError(f"{where}: split_k must be an integer or \"all\", not {sk!r}")
    for k in needed:
        values = args[k] if isinstance(args[k], list) else [args[k]]
        if any(_is_int(x) and not -_INT32_LIMIT <= x < _INT32_LIMIT for x in values):
            raise ConfigFormatError(f"{where}: profiler_args.{k} {args[k]} is outside ckProfiler's 32-bit arguments")
    if args["time"] != 1:
        raise ConfigFormatError(f"{where}: time must be 1 (with time {args['time']} ckProfiler times nothing: "
                                "0 ms, infinite TFLOPS)")
    if min(args["strides"]) < 1 or min(args["dilations"]) < 1 or min(args["left_pads"] + args["right_pads"]) < 0:
        raise ConfigFormatError(f"{where}: strides and dilations must be >= 1 and pads >= 0")
    metadata = config.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ConfigFormatError(f"{where}: metadata must be an object")
    clean = {k: v for k, v in args.items() if k in needed}
    notes = []
    if set(args) - set(needed):
        notes.append(f"ignored profiler_args not read by {op}: {', '.join(sorted(set(args) - set(needed)))}")
    if config.get("operation_type", "").startswith("profile_") and op == BWD_WEIGHT and args["layout"] == 3:
        notes.append("layout 3 is NGCHW_GKYXC_NGKHW for the real grouped_conv_bwd_weight (its codes are shifted by one); "
                     "a PyTorch NCHW weight is 4 (NGCHW_GKCYX_NGKHW): run as written")
    normalized = {"operation_type": op, "profiler_args": clean, "metadata": dict(metadata), "notes": notes}
    out = problem_of_config(normalized).output()
    if min(out) < 1:
        raise ConfigFormatError(f"{where}: output size {list(out)} is not positive")
    return normalized


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_int_text(v: str) -> bool:
    try:
        int(v)
        return True
    except ValueError:
        return False


def expected_argc(op: str, ndim: int, *, bwd_data_split_k: bool = True) -> int:
    """The argc the real program accepts: 14 + 6·ndim (argv[0] and the op name counted);
    one less for bwd_data on builds from before its split_k argument (2024 code)."""
    return 14 + 6 * ndim - (1 if op == BWD_DATA and not bwd_data_split_k else 0)


def command_args(config: dict, *, bwd_data_split_k: bool = True) -> tuple[list[str], list[str]]:
    """The arguments after the binary for a normalized configuration, and notes on what was
    changed to fit the real program (split_k ``all`` for bwd_data becomes ``0``, its sweep;
    dropped on builds without the argument).

    Raises:
        ConfigFormatError: the argument count does not match :func:`expected_argc`.
    """
    op, a = config["operation_type"], config["profiler_args"]
    notes = []
    argv = [op, a["data_type"], a["layout"]]
    if op == FWD:
        argv.append(a["index_type"])
    argv += [a["verify"], a["init"], a["log"], a["time"], a["num_dim_spatial"], a["G"], a["N"], a["K"], a["C"]]
    for k in _SPATIAL_KEYS:
        argv += a[k]
    if op == BWD_WEIGHT:
        argv.append(a["split_k"])
    elif op == BWD_DATA:
        sk = a["split_k"]
        if not bwd_data_split_k:
            notes.append(f"split_k {sk} not passed: this ckProfiler build's grouped_conv_bwd_data has no split_k argument")
        else:
            if sk == "all":
                notes.append("split_k \"all\" sent as 0 (bwd_data's sweep; \"all\" aborts it in std::stoi)")
                sk = 0
            argv.append(sk)
    argv = [str(x) for x in argv]
    want = expected_argc(op, a["num_dim_spatial"], bwd_data_split_k=bwd_data_split_k)
    if len(argv) + 1 != want:  # +1: argv[0]
        raise ConfigFormatError(f"{len(argv) - 1} arguments after {op}, the program expects {want - 2}")
    return argv, notes


def config_id(config: dict) -> str:
    """A stable, content-addressed ID of a normalized configuration: the op's short name and
    a hash of its profiler_args (metadata excluded, so identical problems share one run)."""
    key = json.dumps({"op": config["operation_type"], "args": config["profiler_args"]}, sort_keys=True)
    return f"{SHORT[config['operation_type']]}_{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def problem_of_config(config: dict, *, strict: bool = False) -> ConvProblem:
    """The ConvProblem a normalized configuration describes, dtype and layout from its codes.

    Codes this tool does not know (CK's int8/fp8/tf32 types, other layouts) give the dtype
    ``"data_type <code>"`` and a contiguous layout: enough for descriptions and FLOP counts.

    Raises:
        ConfigFormatError: ``strict`` and a code this tool does not know.
    """
    op, a = config["operation_type"], config["profiler_args"]
    dtype = next((d for d, c in DATA_TYPE_CODES[op].items() if c == a["data_type"]), None)
    name = layout_of_code(op, a["layout"], a["num_dim_spatial"])
    if strict and (dtype is None or name is None):
        raise ConfigFormatError(f"data_type {a['data_type']} / layout {a['layout']} of {op}: known here are data types "
                                f"{DATA_TYPE_CODES[op]} and layouts {LAYOUT_CODES[op]}")
    dtype = dtype or f"data_type {a['data_type']}"
    name = name or ""
    return ConvProblem(G=a["G"], N=a["N"], K=a["K"], C=a["C"], filter=tuple(a["filter_spatial"]),
                       input=tuple(a["input_spatial"]), strides=tuple(a["strides"]),
                       dilations=tuple(a["dilations"]), left_pads=tuple(a["left_pads"]),
                       right_pads=tuple(a["right_pads"]), dtype=dtype,
                       channels_last=name.startswith("N") and name[1] != "G",
                       weight_channels_last="GKC" not in name)
