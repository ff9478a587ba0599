"""The placement step: an executor assignment (the compiler JSON's ``op_assignments``,
keyed by the ``line:col`` of each op of ``full.mlir``) turned into ONE IREE module whose
ops run on several HAL devices (docs/toolchain.md, 'Heterogeneous placement in one IREE
module').

The transformation works on the parsed IR with IREE's MLIR Python bindings
(``iree.compiler.ir``), never on the text:

1. one ``util.global private @device_<executor> = #hal.device.target<"<hal device>",
   {ordinal = N : index}, [<executable targets>]> : !hal.device`` per executor the module
   uses, in order (the default executor first: ordinal 0), and the module attribute
   ``stream.affinity.default = #hal.device.affinity<@device_<default>>``;
2. on every edge whose producer and consumer run on different devices, the value goes
   through ``torch_c.to_builtin_tensor`` -> ``flow.tensor.transfer ... to
   #hal.device.affinity<@device_<consumer>>`` -> ``torch_c.from_builtin_tensor`` (one
   transfer per (value, device), every consumer on that device rewired to it);
   function arguments start on the default device;
3. the function's results are transferred back to the default device before ``return``.
4. devices of different kinds (a CPU and CUDA) get a ``stream.topology`` (:func:`topology`).

Constants (``onnx.Constant``, ``torch.constant.*``, ``torch.vtensor.literal``, parameter
loads) get no transfer: IREE places each one with its user. Every op keeps its location;
the file name of the ``line:col`` locations becomes ``source_name`` (the parser calls a
string ``"-"``). An op inside a region (the branches of ``onnx.If``, ``onnx.Loop``) runs
where its parent op runs: its key is accepted and listed under ``unplaced`` when it names
another executor; the values a body reads from outside cross to the op's device (else
the body's kernels follow the data), and the body's ops are ``placed`` with the op.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ..core.errors import ConfigError
from ..core.lazy import arith, flow, ir, tensor, util

#: ops whose results are constants: IREE places them with their users, no transfer
_CONSTANT_OPS = ("torch.vtensor.literal", "torch_c.from_builtin_tensor", "util.global.load")
_ONNX_CONSTANT = '"onnx.Constant"'
_VTENSOR = re.compile(r"!torch\.vtensor<\[([^\]]*)\],\s*([A-Za-z0-9_]+)>\Z")
_INT = re.compile(r"[su]i(\d+)\Z")
_SYMBOL_CHARS = re.compile(r"[^A-Za-z0-9_]")
_FILE_LOC = re.compile(r'"[^"]*":(\d+):(\d+)')
#: ops that keep no pin: constants and globals (weights, parameters), the transfers
#: (their target is their device), the ABI's imports and exports
_UNPINNED_PREFIXES = ("arith.constant", "util.global", "flow.tensor.transfer", "hal.", "torch_c.", "func.", "util.return")
#: what may come before an op on its line: blanks and its results
_OP_START = re.compile(r"\s*(%[\w#.$-]+(:\d+)?(\s*,\s*%[\w#.$-]+(:\d+)?)*\s*=\s*)?")
#: the ops whose bodies are kernels (their ops are not placed one by one)
_EXECUTABLES = ("flow.executable", "hal.executable", "stream.executable")
#: name of the location given to the ops a transfer adds
TRANSFER_LOC = "placement.transfer"


def parse_module(text: str | bytes, what: str, ctx=None):
    """``text`` (MLIR text or bytecode) parsed with IREE's bindings into ``ctx`` (a new
    context when None); returns the ``ir.Module``.

    Raises:
        ValueError: it does not parse (``"<what> does not parse: <first line>"``).
    """
    try:
        return ir.Module.parse(text, ctx if ctx is not None else ir.Context())
    except ir.MLIRError as e:
        raise ValueError(f"{what} does not parse: {str(e).splitlines()[0]}") from e


def location_key(op) -> str | None:
    """The ``"line:col"`` of an op's file location (the compiler JSON's key), or None."""
    try:
        loc = op.location
        return f"{loc.start_line}:{loc.start_col}"
    except AttributeError:
        return None


def location_keys(loc_text: str) -> list[str]:
    """Every ``line:col`` in a location's text (a fused location has several)."""
    return [f"{m.group(1)}:{m.group(2)}" for m in _FILE_LOC.finditer(loc_text)]


def executor_of(value: Any) -> str | None:
    """The executor name of one ``op_assignments`` value: a name, ``{"executor": name}``;
    None for null, ``""`` or ``"null"`` (the op follows the default device)."""
    if isinstance(value, Mapping):
        value = value.get("executor")
    if not isinstance(value, str) or value.strip().lower() in ("", "null", "none"):
        return None
    return value.strip()


def device_symbol(executor: str, taken: set[str]) -> str:
    """``device_<executor>`` with every character outside ``[A-Za-z0-9_]`` as ``_``,
    made unique against ``taken`` (which it joins)."""
    base = "device_" + _SYMBOL_CHARS.sub("_", executor)
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def place_module(mlir_text: str, assignment: Mapping[str, Any], targets: Mapping[str, str | list[str]], *,
                 default: str | None = None, hal_devices: Mapping[str, str] | None = None,
                 source_name: str = "full.mlir", extra_results: list[str] | None = None) -> dict:
    """Place each op of an imported ``full.mlir`` on its executor's HAL device.

    Args:
        mlir_text: the text of ``full.mlir`` (one ``func.func``, torch dialect, as
            :func:`torq_gen_config.mlir.importer.import_full_model` writes it with weights).
        assignment: ``{"line:col": executor name or {"executor": name} or None}`` (the
            compiler JSON's ``op_assignments``); ops without one run on the default device.
        targets: executor name -> its executable-target attribute text
            (``#hal.executable.target<"llvm-cpu", "embedded-elf-x86_64", {...}>``), or a
            list of them; in priority order.
        default: the default executor (function arguments and results live there, ops
            without an assignment run there); None: the first executor of ``targets`` that
            the assignment names (the first of ``targets`` when it names none).
        hal_devices: executor name -> HAL device ID (``"local"``, ``"cuda"``, ``"hip"``,
            ...); default ``"local"``.
        source_name: the file name put into the ``line:col`` locations.
        extra_results: ``line:col`` keys of top-level ops whose tensor results are also
            returned (a diagnostic module, :mod:`~torq_gen_config.fullrun.module.bisect`):
            appended to the ``func.return`` and the function type in this order, each
            transferred to the default device (:func:`_expose_results`).

    Returns:
        ``{"text": the placed module (printed with its locations, weights included),
        "function": the function's name, "devices": [{"executor", "symbol", "ordinal", "hal_device"}] (ordinal order: the
        runtime's ``--device=`` flags go in this order), "default": executor,
        "transfers": int (transfer ops inserted, results included), "placed":
        {"line:col": executor} (every top-level tensor op and where it was put; the tensor
        ops in the bodies of an If/Loop with their op's executor),
        "unplaced": {"line:col": reason} (assigned ops the step could not place),
        "extra_results": [{"key", "result": index among the op's results, "type"}] (the
        appended results, in order), "not_exposed": {"line:col": reason}}``.

    Raises:
        ConfigError: a key that matches no op of ``mlir_text`` (the message names it),
            an executor without an entry in ``targets``, a target that does not parse,
            a crossing value whose type has no static rank.
        ValueError: ``mlir_text`` does not parse or has no ``func.func``.
    """
    wanted = {str(k): executor_of(v) for k, v in assignment.items()}
    unknown = sorted({e for e in wanted.values() if e and e not in targets})
    if unknown:
        raise ConfigError(f"the assignment names executor {unknown[0]!r}, which has no device target "
                          f"(IREE executors: {', '.join(targets) or 'none'})")
    used = [e for e in targets if e in set(wanted.values())]
    default = default or (used[0] if used else next(iter(targets), None))
    if default is None or default not in targets:
        raise ConfigError(f"default executor {default!r} has no device target")
    order = [default] + [e for e in used if e != default]

    ctx = ir.Context()
    module = parse_module(mlir_text, source_name, ctx)
    func = next((op.operation for op in module.body.operations if op.operation.name == "func.func"), None)
    if func is None:
        raise ValueError(f"{source_name} has no func.func")
    by_loc = _index_locations(module.operation, ctx, source_name)
    missing = [k for k in wanted if k not in by_loc]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ConfigError(f"assignment key {missing[0]!r} matches no op of {source_name}{more}")

    with ctx, ir.Location.unknown():
        symbols = _declare_devices(module, order, targets, hal_devices or {})
        affinity = {e: ir.Attribute.parse(f"#hal.device.affinity<@{symbols[e]}>") for e in order}
        module.operation.attributes["stream.affinity.default"] = affinity[default]
        block = func.regions[0].blocks[0]
        top = {id_: op for id_, op in ((location_key(op), op) for op in (o.operation for o in block.operations)) if id_}
        device_of: dict = {}  # result value -> executor, top-level ops only (Operation hashes are not stable)
        placed, unplaced = {}, {}
        for key, ex in wanted.items():
            if key not in top:
                if ex:
                    unplaced[key] = "inside a region: it runs where its parent op runs"
        transfers: dict = {}  # (value, executor) -> transferred value
        count = 0
        for op in [o.operation for o in block.operations]:
            if op.name == "func.return":
                for i, v in enumerate(op.operands):
                    src = _producer_device(v, device_of, default)
                    if src is not None and src != default and _is_vtensor(v.type):
                        op.operands[i], n = _transfer(v, default, affinity, transfers, op)
                        count += n
                continue
            if _is_constant(op):
                continue
            key = location_key(op)
            ex = (wanted.get(key) if key else None) or default
            for r in op.results:
                device_of[r] = ex
            if key and any(_is_vtensor(r.type) for r in op.results):
                placed[key] = ex
                for inner in _nested(op):  # a body runs where its op runs (the read-back checks it)
                    k = location_key(inner)
                    if k and k not in top and any(_is_vtensor(r.type) for r in inner.results):
                        placed.setdefault(k, ex)
            # a body reads outer values directly: they cross to the op's device too (else
            # the body's kernels follow the data, not the assignment)
            for user in [op, *(_nested(op) if len(op.regions) else ())]:
                for i, v in enumerate(user.operands):
                    if user is not op and not _outer(v, device_of, block):
                        continue
                    src = _producer_device(v, device_of, default)
                    if src is None or src == ex or not _is_vtensor(v.type):
                        continue
                    user.operands[i], n = _transfer(v, ex, affinity, transfers, op)
                    count += n
        exposed, not_exposed = [], {}
        if extra_results:
            exposed, not_exposed, n = _expose_results(func, extra_results, device_of, default, affinity, transfers)
            count += n
        module.operation.verify()
    text = module.operation.get_asm(enable_debug_info=True, assume_verified=True)
    devices = [{"executor": e, "symbol": symbols[e], "ordinal": i, "hal_device": (hal_devices or {}).get(e, "local")}
               for i, e in enumerate(order)]
    return {"text": text, "function": ir.StringAttr(func.attributes["sym_name"]).value, "devices": devices,
            "default": default, "transfers": count, "placed": placed, "unplaced": unplaced,
            "extra_results": exposed, "not_exposed": not_exposed}


def pin_affinities(flow_ir: str | bytes, placed: Mapping[str, str], symbols: Mapping[str, str]) -> dict:
    """Pin every dispatch and tensor op of a placed module, compiled to IREE's flow level,
    to its executor's device: ``stream.affinity = #hal.device.affinity<@device_<executor>>``
    on each op outside the executables whose location is a placed op's ``line:col``.

    Why: the transfers of :func:`place_module` fix only the values that cross devices;
    every other op is free, and IREE's affinity analysis moves a producer to the device
    of the consumer that needs its value (a detector's backbone followed a head moved to
    vmvx; a Conv's padding copy ran beside its neighbour's on the other device). IREE's
    stream dialect honours ``stream.affinity`` on ``flow.dispatch`` and the ``flow.tensor``
    ops (the affinity interface); the attribute does not survive from torch or linalg ops
    to the dispatches IREE forms, hence this step runs on the output of
    ``iree-compile --compile-to=flow``, where the dispatches exist. A dispatch keeps the
    location of its root op; fusion never crosses devices (a transfer stands between).

    Left free: the transfers (their target is their device), globals (weights and
    parameters: IREE places each with its users), the ABI's imports and exports. An op
    with a fused location takes the first of its ``line:col`` keys that is placed.

    Args:
        flow_ir: the module after ``--compile-to=flow`` (text or bytecode, with its
            locations: ``--mlir-print-debuginfo``).
        placed: ``{"line:col": executor}`` (``place_module()["placed"]``).
        symbols: executor -> device symbol (``place_module()["devices"]``).

    Returns:
        ``{"module": the pinned ``ir.Module``, "pinned": {executor: ops pinned},
        "keys": number of placed keys that pinned at least one op}``.

    Raises:
        ValueError: ``flow_ir`` does not parse.
        ConfigError: an executor of ``placed`` has no symbol.
    """
    missing = sorted({e for e in placed.values() if e not in symbols})
    if missing:
        raise ConfigError(f"executor {missing[0]!r} has no device in the placed module")
    ctx = ir.Context()
    module = parse_module(flow_ir, "the flow-level IR", ctx)
    pinned: dict[str, int] = {}
    keys: set[str] = set()
    with ctx:
        attrs = {e: ir.Attribute.parse(f"#hal.device.affinity<@{s}>") for e, s in symbols.items()}
        for op in _nested(module.operation, skip=_EXECUTABLES):
            if op.name.startswith(_UNPINNED_PREFIXES) or not any("tensor<" in str(r.type) for r in op.results):
                continue
            key = next((k for k in location_keys(str(op.location)) if k in placed), None)
            if key is None:
                continue
            ex = placed[key]
            op.attributes["stream.affinity"] = attrs[ex]
            pinned[ex] = pinned.get(ex, 0) + 1
            keys.add(key)
    return {"module": module, "pinned": pinned, "keys": len(keys)}


def _index_locations(module_op, ctx, source_name: str) -> dict[str, Any]:
    """``line:col`` -> op for every op of the module (nested ones too); renames the
    file of each location to ``source_name``."""
    out: dict[str, Any] = {}

    def walk(op) -> None:
        for region in op.regions:
            for block in region.blocks:
                for child in block.operations:
                    child = child.operation
                    key = location_key(child)
                    if key:
                        line, col = (int(x) for x in key.split(":"))
                        child.location = ir.Location.file(source_name, line, col, ctx)
                        out.setdefault(key, child)
                    walk(child)

    walk(module_op)
    return out


def _outer(value, device_of: Mapping, func_block) -> bool:
    """Whether ``value`` is defined at the function's top level (a top-level op's result
    or a function argument), not inside a region."""
    if isinstance(value.owner, ir.Block):
        return value.owner == func_block
    return value in device_of


def _nested(op, skip: tuple[str, ...] = ()):
    """Every op inside ``op``'s regions, depth first (not inside ops named in ``skip``)."""
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                yield child.operation
                if child.operation.name not in skip:
                    yield from _nested(child.operation, skip)


def _declare_devices(module, order: list[str], targets: Mapping, hal_devices: Mapping[str, str]) -> dict[str, str]:
    """Insert one ``util.global`` HAL device per executor at the top of the module, in
    ``order`` (ordinal = position); return executor -> symbol name."""
    taken = {ir.StringAttr(op.operation.attributes["sym_name"]).value for op in module.body.operations
             if "sym_name" in op.operation.attributes}
    symbols: dict[str, str] = {}
    body = module.body
    first = body.operations[0] if len(body.operations) else None
    for ordinal, ex in enumerate(order):
        tlist = targets[ex] if isinstance(targets[ex], (list, tuple)) else [targets[ex]]
        kind = hal_devices.get(ex, "local")
        text = (f'#hal.device.target<"{kind}", {{ordinal = {ordinal} : index}}, [{", ".join(tlist)}]> '
                f": !hal.device")
        try:
            attr = ir.Attribute.parse(text)
        except ir.MLIRError as e:
            raise ConfigError(f"executor {ex!r}: its device target does not parse: "
                              f"{str(e).splitlines()[0]}") from e
        symbols[ex] = device_symbol(ex, taken)
        ip = ir.InsertionPoint(first) if first is not None else ir.InsertionPoint(body)
        with ip:
            util.GlobalOp(ir.StringAttr.get(symbols[ex]), ir.TypeAttr.get(ir.Type.parse("!hal.device")),
                          sym_visibility=ir.StringAttr.get("private"), initial_value=attr)
    kinds = {hal_devices.get(ex, "local") for ex in order}
    if len(kinds) > 1:
        module.operation.attributes["stream.topology"] = ir.Attribute.parse(topology([symbols[ex] for ex in order]))
    return symbols


def topology(symbols: list[str]) -> str:
    """The ``stream.topology`` attribute text that lets devices of different kinds
    (a local CPU and CUDA) share one module: a link with ``transparent_access = true``
    in both directions between every two devices.

    Without it, IREE 3.13 fails to legalize ``hal.allocator.resolve_memory_properties``
    for a buffer used by both (iree-org/iree#20856, docs/toolchain.md); with
    it, such buffers get the mapping usage (host-visible). Devices of one kind need none.
    Whether this is right at run time on a discrete GPU is unverified here (no GPU).
    """
    links = [f"(@{a} -> @{b} = {{transparent_access = true}})" for a in symbols for b in symbols if a != b]
    return f"#hal.device.topology<links = [{', '.join(links)}]>"


def _is_vtensor(t) -> bool:
    return str(t).startswith("!torch.vtensor<")


def _is_constant(op) -> bool:
    """Ops that make constants (IREE places them with their users)."""
    if op.name.startswith("torch.constant.") or op.name in _CONSTANT_OPS:
        return True
    return op.name == "torch.operator" and str(op.attributes["name"]) == _ONNX_CONSTANT


def _producer_device(value, device_of: Mapping, default: str) -> str | None:
    """Where ``value`` lives: its defining op's device, the default device for a
    function argument, None for a constant (or an op not placed)."""
    if isinstance(value.owner, ir.Block):
        return default
    return device_of.get(value)


def builtin_tensor_type(vtensor: str) -> str:
    """The builtin tensor type of a ``!torch.vtensor<[d0,d1],dtype>`` type's text
    (``tensor<d0xd1xdtype>``; signed and unsigned integers become signless, ``?`` dims stay).

    Raises:
        ConfigError: not a ranked vtensor with a known dtype.
    """
    m = _VTENSOR.match(vtensor.strip())
    if not m or m.group(2) == "unk":
        raise ConfigError(f"a value crossing devices has type {vtensor}: placement needs a ranked tensor type")
    dims = [d.strip() for d in m.group(1).split(",") if d.strip()]
    im = _INT.match(m.group(2))
    dtype = f"i{im.group(1)}" if im else m.group(2)
    return "tensor<" + "".join(f"{d}x" for d in dims) + dtype + ">"


def _transfer(value, ex: str, affinity: Mapping, transfers: dict, before) -> tuple[Any, int]:
    """The transferred copy of ``value`` on ``ex``'s device (made before op ``before`` the
    first time); returns ``(value, 1 if a transfer was added else 0)``."""
    hit = transfers.get((value, ex))
    if hit is not None:
        return hit, 0
    btype = ir.Type.parse(builtin_tensor_type(str(value.type)))
    with ir.InsertionPoint(before), ir.Location.name(TRANSFER_LOC):
        b = ir.Operation.create("torch_c.to_builtin_tensor", results=[btype], operands=[value]).result
        dims = []
        for i, d in enumerate(ir.RankedTensorType(btype).shape):
            if ir.ShapedType.is_dynamic_size(d):
                dims.append(tensor.DimOp(b, arith.ConstantOp(ir.IndexType.get(), i).result).result)
        t = flow.TensorTransferOp(b, dims, affinity[ex], results=[btype]).result
        out = ir.Operation.create("torch_c.from_builtin_tensor", results=[value.type], operands=[t]).result
    transfers[(value, ex)] = out
    return out, 1


def _expose_results(func, keys: list[str], device_of: Mapping, default: str, affinity: Mapping,
                    transfers: dict) -> tuple[list[dict], dict[str, str], int]:
    """Append the tensor results of the top-level ops ``keys`` (``line:col``) to the
    function's ``func.return`` and type, each transferred to the default device (a value
    already transferred there is reused); a ``res_attrs`` array gets empty entries.

    Returns:
        ``(exposed, not_exposed, transfers added)``: ``[{"key", "result", "type"}]`` in
        order, ``{key: reason}`` for keys with no top-level tensor op.
    """
    block = func.regions[0].blocks[0]
    ops = [o.operation for o in block.operations]
    ret = ops[-1]
    by_key: dict[str, Any] = {}
    for op in ops:
        key = location_key(op)
        if key and key not in by_key and not _is_constant(op) and any(_is_vtensor(r.type) for r in op.results):
            by_key[key] = op
    values, exposed, not_exposed, count = [], [], {}, 0
    for key in keys:
        op = by_key.get(key)
        if op is None:
            not_exposed[key] = "no top-level op with a tensor result (a constant, or inside a region)"
            continue
        for i, r in enumerate(op.results):
            if not _is_vtensor(r.type):
                continue
            v = r
            if device_of.get(r, default) != default:
                v, n = _transfer(r, default, affinity, transfers, ret)
                count += n
            values.append(v)
            exposed.append({"key": key, "result": i, "type": str(r.type)})
    if not values:
        return exposed, not_exposed, count
    with ir.InsertionPoint(ret), ret.location:
        ir.Operation.create("func.return", operands=[*ret.operands, *values])
    ret.erase()
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    func.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(list(ftype.inputs), [*ftype.results, *[v.type for v in values]]))
    if "res_attrs" in func.attributes:
        old = list(ir.ArrayAttr(func.attributes["res_attrs"]))
        func.attributes["res_attrs"] = ir.ArrayAttr.get([*old, *[ir.DictAttr.get({}) for _ in values]])
    return exposed, not_exposed, count


def keys_matching_no_op(keys, mlir_path) -> list[str]:
    """The ``line:col`` keys (compiler JSON ``op_assignments``) that name no op of the
    MLIR file: an op starts at a key when only blanks and its results (``%a = ``,
    ``%b:2 = ``) come before that column on its line (the importer prints one op per
    line, as MLIR locates it; ops in If/Loop bodies count too).
    Reads the file line by line (no parse: full.mlir can hold the weights).

    Returns:
        The bad keys, sorted (a key that is not ``line:col`` is bad too).
    """
    want: dict[int, set[int]] = {}
    bad = []
    for k in keys:
        m = re.fullmatch(r"(\d+):(\d+)", str(k).strip())
        if not m:
            bad.append(str(k))
            continue
        want.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    found: set[tuple[int, int]] = set()
    if want:
        last = max(want)
        with open(mlir_path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                for col in want.get(n, ()):
                    if _OP_START.fullmatch(line[:col - 1]) and line[col - 1:col].strip() not in ("", "%"):
                        found.add((n, col))
                if n >= last:
                    break
    bad += [f"{n}:{c}" for n, cols in want.items() for c in cols if (n, c) not in found]
    return sorted(bad, key=lambda k: [int(x) if x.isdigit() else 0 for x in k.split(":")])
