"""The assignment compiled and run as ONE IREE module with per-op devices
(docs/toolchain.md, 'Heterogeneous placement in one IREE module'; ``run --run-mode
module``, :mod:`.run`).

Steps (:func:`compile_one_module`, then :func:`run_one_module`):

1. each IREE executor's executable target: a tiny module compiled with that
   executor's own target flags and ``compile_flags`` to ``--compile-to=executable-sources``,
   the ``target`` of its ``hal.executable.variant`` read back (:func:`executable_targets`,
   cached per command line);
2. :func:`torq_gen_config.mlir.placement.place_module` declares one HAL device per executor
   and inserts the transfers (``placed.mlir``);
3. ``iree-compile --iree-execution-model=async-external --compile-to=flow`` (bytecode
   out: it keeps the locations and the weights; with ``--mlir-print-ir-before=
   iree-flow-deduplicate-executables`` into ``ir/``), then
   :func:`~torq_gen_config.mlir.placement.pin_affinities` puts every dispatch on its
   executor's device (``stream.affinity``: the transfers alone leave the other ops free,
   and IREE moves producers to their consumers' device);
4. ``--compile-from=flow --compile-to=stream``, then
   :func:`~torq_gen_config.mlir.stream_split.split_shared_executables` (``split.mlirbc``),
   then ``--compile-from=stream`` with ``--iree-hal-dump-executable-sources-to=sources/``
   into ``module.vmfb``; ``split=False`` skips the split (to show the IREE bug);
5. :func:`~torq_gen_config.mlir.readback.read_placement`: where each op ran;
6. ``iree-run-module`` with one ``--device=`` per declared device, in ordinal order.

Every tool call goes through :func:`torq_gen_config.core.tools.run_tool` with a timeout, the
``iree-compile`` of the backend (``$IREE_COMPILE`` applies) and the executors' own
``compile_flags`` (all of them, in order, without repeats).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ...backends import make_backend
from ...backends.base import CompiledArtifact, StageError, raise_for_tool_failure
from ...backends.iree_tools import FUNCTION, parse_mlir_signature
from ...core.errors import ConfigError
from ...core.layout import MODULE_FILE
from ...core.lazy import ir
from ...core.tools import run_tool
from ...mlir.placement import executor_of, pin_affinities, place_module
from ...mlir.readback import executable_backends, flow_sites, read_placement
from ...mlir.stream_split import split_shared_executables, write_bytecode

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

PLACED_FILE = "placed.mlir"
FLOW_FILE = "flow.mlirbc"
STREAM_FILE = "stream.mlirbc"
SPLIT_FILE = "split.mlirbc"
#: the compile options every one-module compile gets
EXECUTION_MODEL = "--iree-execution-model=async-external"
_TINY = "func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n  %b = arith.addf %a, %a : tensor<4xf32>\n" \
        "  return %b : tensor<4xf32>\n}\n"
_TARGETS: dict[tuple[str, ...], list[str]] = {}  # target command line -> executable targets


def executable_targets(backend, *, work_dir: str | Path, timeout_s: float, log_path: str | None = None) -> list[str]:
    """The executable-target attributes (text) an IREE executor compiles for.

    A one-op module is compiled with the executor's target flags and ``compile_flags``
    to ``--compile-to=executable-sources`` (about 0.1 s); the ``target`` attribute of each
    ``hal.executable.variant`` is read with the MLIR bindings. Cached in this process
    per command line (minus the file names).

    Args:
        backend: an :class:`~torq_gen_config.backends.iree.IreeBackend`.
        work_dir: where the tiny module and its output go (created).
        timeout_s: limit of the compile, seconds.

    Returns:
        e.g. ``['#hal.executable.target<"llvm-cpu", "embedded-elf-x86_64", {cpu = ...}>']``.

    Raises:
        StageError: the compile failed, timed out or crashed (``during="compile"``), or
            printed no variant.
        ToolNotFoundError: ``iree-compile`` cannot be found.
    """
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    src, out = work / f"target_{backend.name}.mlir", work / f"target_{backend.name}.out.mlir"
    argv = backend.compile_argv(str(src), str(out))
    key = tuple(a for a in argv if a not in (str(src), str(out)))
    if key in _TARGETS:
        return list(_TARGETS[key])
    src.write_text(_TINY, encoding="utf-8")
    res = run_tool([*argv, "--compile-to=executable-sources"], timeout_s=timeout_s, log_path=log_path)
    raise_for_tool_failure(res, tool="iree-compile", during="compile", timeout_s=timeout_s)
    ctx = ir.Context()
    module = ir.Module.parse(out.read_text(encoding="utf-8"), ctx)
    found: list[str] = []

    def walk(op) -> None:
        for region in op.regions:
            for block in region.blocks:
                for child in block.operations:
                    child = child.operation
                    if child.name == "hal.executable.variant" and str(child.attributes["target"]) not in found:
                        found.append(str(child.attributes["target"]))
                    walk(child)

    walk(module.operation)
    if not found:
        raise StageError("compile", f"executor {backend.name!r}: iree-compile made no executable variant "
                                    f"for a one-op module ({' '.join(argv)})")
    _TARGETS[key] = found
    return list(found)


def iree_backends(executors: list[Mapping], names) -> dict[str, Any]:
    """The backends of the executors ``names`` (in configuration order).

    Raises:
        ConfigError: a name that is not configured, or an executor that is not an IREE
            one (one module needs IREE executors only; the message names it).
    """
    by_name = {e["name"]: e for e in executors}
    out = {}
    for name in [e["name"] for e in executors if e["name"] in set(names)] + [n for n in names if n not in by_name]:
        if name not in by_name:
            raise ConfigError(f"the assignment names executor {name!r}, which is not configured")
        if by_name[name].get("backend") != "iree":
            raise ConfigError(f"executor {name!r} is a {by_name[name].get('backend')} executor: one module "
                              "needs IREE executors only (run the assignment as partitions)")
        out[name] = make_backend(by_name[name])
    return out


def compile_one_module(mlir_text: str, assignment: Mapping[str, Any], executors: list[Mapping], *,
                       work_dir: str | Path, timeout_s: float, default: str | None = None, split: bool = True,
                       mlir_path: str | None = None, log_path: str | None = None,
                       extra_results: list[str] | None = None, pin: bool = True) -> dict:
    """Place, compile to the flow level, pin every dispatch to its device, compile on (to
    the stream level, the split, from it) and read back the placement.

    Args:
        mlir_text: ``full.mlir`` with its weights (the importer's text).
        assignment: ``{"line:col": executor or {"executor": name} or None}``.
        executors: the configured executors (``{"name", "backend", "options"}``), in
            priority order; those the assignment names (and ``default``) must be IREE ones.
        work_dir: where every file goes (created): ``placed.mlir``, ``stream.mlirbc``
            (``flow.mlirbc`` while it is needed),
            ``split.mlirbc``, ``ir/``, ``sources/``, ``module.vmfb``.
        timeout_s: limit of each ``iree-compile`` call, seconds.
        default: the default executor (see :func:`~torq_gen_config.mlir.placement.place_module`).
        split: run the executable split (False only to show the IREE bug it avoids).
        pin: pin every dispatch to its device (:func:`~torq_gen_config.mlir.placement.pin_affinities`
            on the ``--compile-to=flow`` output); False only to show what IREE does
            with the transfers alone (producers follow their consumers' device).
        mlir_path: ``full.mlir``'s path (for the function signature; default: read from
            ``mlir_text``).
        extra_results: ``line:col`` keys of ops whose results the function also returns
            (a diagnostic module: ``place_module``'s ``extra_results``); the signature is
            then read from ``placed.mlir``.

    Returns:
        ``{"module": path of the .vmfb, "function": the exported function, "devices": [{"executor", "symbol", "ordinal",
        "hal_device", "device"}] (``device``: the runtime ``--device`` value),
        "transfers": int, "split": {executable: [device symbols]}, "placement":
        :func:`~torq_gen_config.mlir.readback.read_placement`'s record, "unplaced":
        {line:col: reason}, "compile_ms": {"targets", "place", "to_flow", "pin", "to_stream", "split",
        "from_stream", "total"} (ms), "argv": [to flow, flow to stream, from stream],
        "pinned": {"pinned": {executor: ops}, "keys": placed ops pinned} (``{}`` without ``pin``), "signature",
        "extra_results": [{"key", "result", "type"}] (with ``extra_results``: the results
        after the model's own), "not_exposed": {line:col: reason}}``.

    Raises:
        ConfigError: a key that matches no op, an executor that is not configured or
            not an IREE one.
        StageError: an ``iree-compile`` call failed, timed out or crashed
            (``during="compile"``).
        ToolNotFoundError: ``iree-compile`` cannot be found.
    """
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    names = {n for n in (executor_of(v) for v in assignment.values()) if n}
    names |= {default or next((e["name"] for e in executors), None)} - {None}
    backends = iree_backends(executors, names)
    targets = {n: executable_targets(b, work_dir=work / "targets", timeout_s=timeout_s, log_path=log_path)
               for n, b in backends.items()}
    hal = {n: b.hal_device for n, b in backends.items()}
    times["targets"] = _ms(t0)

    t = time.perf_counter()
    placed = place_module(mlir_text, assignment, targets, default=default, hal_devices=hal,
                          extra_results=list(extra_results) if extra_results else None)
    (work / PLACED_FILE).write_text(placed["text"], encoding="utf-8")
    times["place"] = _ms(t)

    compile_tool = next(iter(backends.values()))._tool("iree-compile")
    flags: list[str] = []
    for b in backends.values():
        flags += [f for f in b.compile_flags if f not in flags]
    threading = [] if any(b.compile_threads for b in backends.values()) else ["--mlir-disable-threading"]
    symbols = {d["executor"]: d["symbol"] for d in placed["devices"]}
    ir_dir = work / "ir"
    to_flow = [compile_tool, str(work / PLACED_FILE), EXECUTION_MODEL, "--compile-to=flow", "--mlir-print-debuginfo",
               "--mlir-print-ir-before=iree-flow-deduplicate-executables", f"--mlir-print-ir-tree-dir={ir_dir}",
               "--emit-mlir-bytecode", *threading, *flags, "-o", str(work / FLOW_FILE)]
    times["to_flow"] = _compile(to_flow, work / FLOW_FILE, timeout_s, log_path)
    t = time.perf_counter()
    pinned: dict = {}
    if pin:
        pinned = pin_affinities((work / FLOW_FILE).read_bytes(), placed["placed"], symbols)
        write_bytecode(pinned.pop("module"), work / FLOW_FILE)
    times["pin"] = _ms(t)
    first = [compile_tool, str(work / FLOW_FILE), "--compile-from=flow", EXECUTION_MODEL, "--compile-to=stream",
             "--mlir-print-debuginfo", "--emit-mlir-bytecode", *threading, *flags, "-o", str(work / STREAM_FILE)]
    times["to_stream"] = _compile(first, work / STREAM_FILE, timeout_s, log_path)
    (work / FLOW_FILE).unlink()

    t = time.perf_counter()
    res = split_shared_executables((work / STREAM_FILE).read_bytes())
    if split:
        write_bytecode(res["module"], work / SPLIT_FILE)
    times["split"] = _ms(t)

    sources = work / "sources"
    second = [compile_tool, str(work / (SPLIT_FILE if split else STREAM_FILE)), "--compile-from=stream",
              EXECUTION_MODEL, "--mlir-print-debuginfo", f"--iree-hal-dump-executable-sources-to={sources}",
              *threading, *flags, "-o", str(work / MODULE_FILE)]
    times["from_stream"] = _compile(second, work / MODULE_FILE, timeout_s, log_path)

    dumps = sorted(ir_dir.rglob("*iree-flow-deduplicate-executables*.mlir"))
    flow = flow_sites(dumps[0].read_text(encoding="utf-8")) if dumps else []
    stream_sites = res["sites"] if split else split_shared_executables((work / STREAM_FILE).read_bytes())["sites"]
    placement = read_placement(flow=flow, stream=stream_sites, devices={s: e for e, s in symbols.items()}, assignment=placed["placed"],
                               backends=executable_backends(sources))
    times["total"] = _ms(t0)
    devices = [{**d, "device": backends[d["executor"]].device} for d in placed["devices"]]
    signature = (parse_mlir_signature(work / PLACED_FILE, placed["function"]) if extra_results
                 else parse_mlir_signature(mlir_path, placed["function"]) if mlir_path
                 else _signature_of(mlir_text, work, placed["function"]))
    return {"module": str(work / MODULE_FILE), "function": placed["function"], "devices": devices, "transfers": placed["transfers"],
            "split": res["split"] if split else {}, "shared_executables": res["split"], "placement": placement,
            "unplaced": placed["unplaced"], "compile_ms": times, "argv": [to_flow, first, second], "pinned": pinned, "signature": signature,
            "extra_results": placed.get("extra_results") or [], "not_exposed": placed.get("not_exposed") or {}}


def run_one_module(compiled: Mapping, executors: list[Mapping], *, inputs: Mapping[str, "np.ndarray"],
                   input_names: list[str], output_names: list[str], work_dir: str | Path, timeout_s: float,
                   log_path: str | None = None) -> tuple[dict[str, "np.ndarray"], float]:
    """Run a module of :func:`compile_one_module` once with ``iree-run-module``, one
    ``--device=`` per declared device in ordinal order (e.g. ``--device=local-task
    --device=local-task``: each executor's ``device`` as configured now, with the
    ``run_flags`` of all, each once), through the default executor's
    :meth:`~torq_gen_config.backends.iree.IreeBackend.run` (its dtype handling).

    Args:
        compiled: :func:`compile_one_module`'s result.
        executors: the configured executors.
        inputs: arrays by name (shapes/dtypes of the model's inputs).
        input_names / output_names: the model's inputs and outputs in order.
        work_dir: the run's ``.npy`` files (created).
        timeout_s: limit of the run, seconds.

    Returns:
        ``(outputs by name, run_ms)`` (the process's wall time: start-up and loading included).

    Raises:
        StageError: the run failed (``"run"``; e.g. ``HAL device 'device_x' not found``),
            timed out or crashed (``during="run"``).
        ConfigError: the default executor is not configured.
    """
    devices = sorted(compiled["devices"], key=lambda d: d["ordinal"])
    by_name = {e["name"]: e for e in executors}
    missing = [d["executor"] for d in devices if d["executor"] not in by_name]
    if missing:
        raise ConfigError(f"executor {missing[0]!r} is not configured")
    # the runtime side from the executors as they are now: a changed --runtime-option
    # runs the compiled module again, it does not recompile it
    backends = [make_backend(by_name[d["executor"]]) for d in devices]
    run_flags = [f for b in backends for f in b.run_flags if not f.startswith("--device=")]
    first = by_name[devices[0]["executor"]]
    options = {**(first.get("options") or {}), "device": backends[0].device,
               "run_flags": [*(f"--device={b.device}" for b in backends[1:]), *dict.fromkeys(run_flags)]}
    backend = make_backend({**first, "options": options})
    artifact = CompiledArtifact(path=compiled["module"], compile_ms=None,
                                info={"function": compiled.get("function") or FUNCTION, "signature": compiled.get("signature")})
    return backend.run(artifact, inputs=dict(inputs), input_names=input_names, output_names=output_names,
                       work_dir=str(work_dir), timeout_s=timeout_s, log_path=log_path)


def _compile(argv: list[str], out: Path, timeout_s: float, log_path: str | None) -> float:
    """Run one ``iree-compile`` call; return its wall time (ms).

    Raises:
        StageError: failed, timed out, crashed, or wrote no output.
    """
    out.unlink(missing_ok=True)
    res = run_tool(argv, timeout_s=timeout_s, log_path=log_path)
    raise_for_tool_failure(res, tool="iree-compile", during="compile", timeout_s=timeout_s)
    if not out.is_file():
        raise StageError("compile", f"iree-compile exited with status 0 but wrote no {out.name}")
    return round(res.wall_ms, 1)


def _signature_of(mlir_text: str, work: Path, function: str) -> dict | None:
    """The function signature of ``full.mlir``'s text (its header lines only)."""
    head = work / "signature.mlir"
    lines = []
    for line in mlir_text.splitlines():
        lines.append(line)
        if "func.func @" in line:
            break
    head.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return parse_mlir_signature(head, function)


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 1)
