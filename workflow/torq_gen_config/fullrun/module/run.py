"""Compile and run a module plan (:mod:`.mode`): the assignment as ONE IREE module
(:mod:`.program`), compared with the reference as the partitions are
(:mod:`.execute`'s comparison: same verdict rules and tolerance), and where each layer
really ran (``placement``). When the module fails or differs, the partitions of the
same assignment (the plan's ``partitions``) run too and the result keeps both: the partitions'
result with the module's under ``module``. When the partitions pass, the first model output
over tolerance and the first layer whose value differs are looked for
(:mod:`.bisect`: one diagnostic module with the layers' values exposed) and named in
the verdict (``module.first_difference``).

Every dispatch is pinned to its executor's device (:func:`~torq_gen_config.mlir.placement.pin_affinities`);
``placement`` is still what the compiled program says, read back, never the assignment, and
a match with a layer elsewhere is :data:`~.common.NOT_AS_ASSIGNED` (:func:`judge_placement`).
"""

from __future__ import annotations

import shutil
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping

from . import program
from ...backends.base import StageError, failure_summary
from ...core.fileio import read_json, write_json
from ...core.layout import MODULE_SIDE_FILE, PARTITION_RUN_DIR
from ...core.lazy import ir
from ...core.limits import MESSAGE_CHARS, SUMMARY_CHARS
from ...core.tools import bounded_message, first_error_line
from ...mlir.importer import import_full_model
from ...reference import load_reference
from ..common import COMPILED_SCHEMA, MODULE_MODE, NOT_AS_ASSIGNED, PARTITIONS_MODE, _round, not_as_assigned_summary
from ..execute import _compare_and_finish, _new_result, run_partitions
from .bisect import bisect_module, verdict_tail

#: what the verdict says when the partitions pass and the module does not
ONE_PROGRAM_BLAME = ("the failure is in compiling the assignment as one program (transfers between devices, "
                     "fusion across layers, multi-device support), not in a layer's executor: the same "
                     "assignment passes as partitions")
DEBUG_README = """Module mode of `torq-gen-config run` (docs/full_model_run.md, "Module mode"):

placed.mlir       full.mlir with one HAL device per executor (util.global @device_<executor>) and a
                  flow.tensor.transfer on every edge that crosses devices; each op keeps its
                  loc("full.mlir":LINE:COL), the compiler JSON's key. The compile then stops at
                  the flow level and pins every dispatch to its op's device (stream.affinity),
                  which stream.mlir shows as on(#hal.device.affinity<@device_x>).
ir/               the flow-level IR before iree-flow-deduplicate-executables: which ops (by their
                  locations) were fused into each dispatch's executable.
stream.mlir       the stream-level IR (after the split that gives each device its own copy of a
                  shared executable): each stream.cmd.dispatch / stream.async.dispatch shows
                  on(#hal.device.affinity<@device_x>) and its root op's location.
sources/          each executable's source per backend (variant embedded_elf_x86_64 = llvm-cpu,
                  vmvx_bytecode_fb = vmvx); one executable with two variants is the IREE bug the
                  split avoids.
placement.json    the read-back record: per op (line:col) the executor assigned, the executors its
                  dispatches ran on, status "as assigned" / "elsewhere" / "no kernel".
The read-back, not the assignment, says where an op ran (outputs that match with a layer
elsewhere are "success, not as assigned").
"""


def compile_module_partition(*, pid: str, side_file: str, work_dir: str, timeout_s: float,
                             log_path: str | None = None) -> dict:
    """Compile the module of a module plan (its ``placement.json``); never raises.

    Returns:
        ``compiled.json``'s content (:func:`~.compile.compile_partition`'s shape):
        ``status`` ok with ``compile_ms`` (wall ms of the whole compile), ``artifact``
        (``path``: ``module.vmfb``) and ``module`` (:func:`~.program.compile_one_module`'s
        record, argv left out), or error with ``failure``. With the side file's
        ``debug_ir``, the IR files are copied there (:func:`copy_debug_ir`).
    """
    res: dict[str, Any] = {"schema": COMPILED_SCHEMA, "pid": pid, "executor": MODULE_MODE, "backend": MODULE_MODE,
                           "status": None, "compile_ms": None, "import_ms": None, "artifact": None, "failure": None,
                           "compiled_at": time.time()}
    t0 = time.perf_counter()
    try:
        side = read_json(side_file, "module placement")
        mlir_path = weighted_mlir(side, work_dir)
        text = Path(mlir_path).read_text(encoding="utf-8")
        out = program.compile_one_module(text, side["assignment"], side["executors"], work_dir=work_dir,
                                            timeout_s=timeout_s, mlir_path=mlir_path, log_path=log_path)
        Path(mlir_path).unlink(missing_ok=True)  # placed.mlir holds it, weights included
    except StageError as e:
        return _fail(res, e.stage, e.message, e.during)
    except Exception as e:  # ConfigError (a key that matches no op), a bindings error: an error result
        return _fail(res, "compile", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    out.pop("argv", None)
    res.update(status="ok", compile_ms=_round((time.perf_counter() - t0) * 1000.0),
               artifact={"path": out["module"], "info": {"function": out["function"]}}, module=out)
    if side.get("debug_ir"):
        res["debug_ir"] = copy_debug_ir(work_dir, out, side["debug_ir"])
    for name in ("stream.mlirbc", "split.mlirbc"):  # each holds the weights again (placed.mlir stays)
        (Path(work_dir) / name).unlink(missing_ok=True)
    return res


def weighted_mlir(side: Mapping, work_dir: str) -> str:
    """The full model's MLIR with its weights: ``work/full.mlir`` keeps them only when a
    whole-model backend is configured, so the prepared model is imported again with them
    (``full_weights.mlir`` in ``work_dir``) and its keys checked against ``full.mlir``'s.

    Raises:
        StageError: the import failed (``import``), or its ``line:col`` differ from
            ``full.mlir``'s (the compiler JSON's keys would name other ops).
    """
    if not side.get("prepared_model"):
        return side["full_mlir"]
    path = Path(work_dir) / "full_weights.mlir"
    loc = import_full_model(side["prepared_model"], path, weights=True)
    if loc["status"] != "ok":
        raise StageError("import", f"the prepared model with its weights: {loc['message']}")
    keys = [f"{n['line']}:{n['col']}" if n.get("line") is not None else None for n in loc["nodes"]]
    want = list(side.get("node_keys") or [])
    if want and keys != want:
        j = next((i for i, (a, b) in enumerate(zip(keys, want)) if a != b), min(len(keys), len(want)))
        keys += [None] * (j + 1 - len(keys)) if j >= len(keys) else []
        want += [None] * (j + 1 - len(want)) if j >= len(want) else []
        raise StageError("import", f"the import with weights puts prepared node {j} at {keys[j]}, "
                                   f"full.mlir at {want[j]}: the compiler JSON's keys would name other ops")
    return str(path)


def copy_debug_ir(work_dir: str, compiled: Mapping, dest: str) -> str:
    """Copy the module's IR into ``dest`` (``placed.mlir``, ``ir/``, ``stream.mlir`` as text
    with weights elided, ``sources/``, ``placement.json``, ``README.txt``); returns ``dest``."""
    work, out = Path(work_dir), Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(work / "placed.mlir", out / "placed.mlir")
    for sub in ("ir", "sources"):
        if (work / sub).is_dir():
            shutil.rmtree(out / sub, ignore_errors=True)
            shutil.copytree(work / sub, out / sub)
    stream = work / "split.mlirbc" if (work / "split.mlirbc").is_file() else work / "stream.mlirbc"
    try:
        mod = ir.Module.parse(stream.read_bytes(), ir.Context())
        (out / "stream.mlir").write_text(mod.operation.get_asm(enable_debug_info=True, large_elements_limit=16),
                                         encoding="utf-8")
    except Exception as e:  # the bytecode stays readable with iree-opt
        shutil.copy2(stream, out / stream.name)
        (out / "stream.mlir.txt").write_text(f"not printed ({type(e).__name__}: {e}); see {stream.name}\n")
    write_json(out / MODULE_SIDE_FILE, {"placement": compiled.get("placement"), "devices": compiled.get("devices"),
                                        "transfers": compiled.get("transfers"), "split": compiled.get("split")})
    (out / "README.txt").write_text(DEBUG_README, encoding="utf-8")
    return str(out)


def layer_placement(record: Mapping | None, key_layer: Mapping[str, str], by_layer: Mapping[str, str]) -> dict:
    """Per layer, where it ran (from the read-back record of :func:`~torq_gen_config.mlir.readback.read_placement`).

    Returns:
        ``{"layers": {layer_id: {"assigned", "ran_on": [executors], "status": "as assigned" |
        "elsewhere" | "no kernel"}}, "counts": {status: n}, "elsewhere": [layer_id],
        "two_backends": {executable: [variants]}}``; a layer is ``elsewhere`` when any of
        its ops ran elsewhere, ``no kernel`` when none of them made a kernel.
    """
    ops = (record or {}).get("ops") or {}
    layers: dict[str, dict] = {}
    for key, rec in ops.items():
        lid = key_layer.get(key)
        if lid is None:
            continue
        row = layers.setdefault(lid, {"assigned": by_layer.get(lid), "ran_on": [], "statuses": set()})
        row["ran_on"] = sorted(set(row["ran_on"]) | set(rec.get("ran_on") or []))
        row["statuses"].add(rec.get("status"))
    for lid in by_layer:
        layers.setdefault(lid, {"assigned": by_layer[lid], "ran_on": [], "statuses": {"no kernel"}})
    counts: dict[str, int] = {}
    for row in layers.values():
        st = row.pop("statuses")
        row["status"] = "elsewhere" if "elsewhere" in st else ("no kernel" if st <= {"no kernel"} else "as assigned")
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    ordered = {lid: layers[lid] for lid in [*by_layer, *[x for x in layers if x not in by_layer]]}
    return {"layers": ordered, "counts": counts, "elsewhere": [lid for lid, r in ordered.items()
                                                               if r["status"] == "elsewhere"],
            "two_backends": dict((record or {}).get("two_backends") or {})}


def run_module(plan: Mapping, *, reference_npz: str, compiled: Mapping, tolerance: Mapping, timeout_s: float,
               partitions_dir: str, log_path: str | None = None, outputs_npz: str | None = None) -> dict:
    """Run the module of a module plan once and compare it with the reference
    (``outputs_npz``: as :func:`~.execute.run_partitions`'s).

    Returns:
        The result in :func:`~.execute.run_partitions`' shape with ``mode: "module"``,
        ``mode_reason`` and ``module``: ``{"status", "summary", "compile_ms", "run_ms",
        "transfers", "devices", "shared_executables", "unplaced", "placement"}``
        (``placement``: :func:`layer_placement`).
    """
    t0 = time.perf_counter()
    inputs, ref_outputs, meta = load_reference(reference_npz)
    result = _new_result(plan, tolerance, meta)
    result["mode_reason"] = plan.get("mode_reason")
    result["num_partitions"] = 1
    p = plan["module"]
    # the module's folder, whatever directory the plan was written from (the CLI runs in the
    # output directory, `snakemake` from the checkout: their relative paths differ)
    pdir = Path(partitions_dir) / p["pid"]
    side_file = pdir / MODULE_SIDE_FILE
    side = read_json(side_file, "module placement") if side_file.is_file() else {}
    mod = dict(compiled.get("module") or {})
    if mod.get("module"):
        mod["module"] = str(pdir / Path(mod["module"]).name)
    row = {"index": 0, "pid": p["pid"], "executor": MODULE_MODE, "backend": MODULE_MODE,
           "first_node": p["first_node"], "last_node": p["last_node"], "num_nodes": p["num_nodes"],
           "layer_ids": p["layer_ids"], "compile_ms": compiled.get("compile_ms"), "run_ms": None,
           "status": "compiled" if compiled.get("status") == "ok" else "not run", "partition_check": None}
    result["partitions"].append(row)
    result["module"] = {"pid": p["pid"], "status": None, "summary": None, "compile_ms": compiled.get("compile_ms"),
                        "compile_phases_ms": mod.get("compile_ms"), "run_ms": None,
                        "transfers": mod.get("transfers"), "devices": [
                            {k: d.get(k) for k in ("executor", "ordinal", "device")} for d in mod.get("devices") or []],
                        "shared_executables": len(mod.get("shared_executables") or {}),
                        "unplaced": mod.get("unplaced") or {},
                        "placement": layer_placement(mod.get("placement"), side.get("key_layer") or {},
                                                     plan.get("layer_executors") or {}) if mod else None,
                        "debug_ir": compiled.get("debug_ir")}

    def finish(status: str, summary: str, failure: dict | None = None) -> dict:
        result.update(status=status, summary=summary[:SUMMARY_CHARS], failure=failure)
        result["timing"] = {"compile_ms_total": row["compile_ms"], "run_ms_total": row["run_ms"],
                            "wall_ms": _round((time.perf_counter() - t0) * 1000.0)}
        result["module"].update(status=status, summary=result["summary"], run_ms=row["run_ms"])
        return result

    def failure(stage: str, message: str, during: str | None = None) -> dict:
        return {"stage": stage, "during": during, "partition": 0, "pid": p["pid"], "executor": MODULE_MODE,
                "layer_ids": [], "summary": f"one module: {failure_summary(stage, message)}"[:SUMMARY_CHARS],
                "message": bounded_message(message, MESSAGE_CHARS)}

    if compiled.get("status") != "ok":
        fr = compiled.get("failure") or {}
        row["status"] = "error"
        f = failure(fr.get("stage") or "compile", fr.get("message") or "no compile result", fr.get("during"))
        return finish("error", f["summary"], f)
    try:
        outs, run_ms = program.run_one_module(mod, p.get("run_executors") or side.get("executors") or [],
                                                 inputs=inputs, input_names=p["inputs"], output_names=p["outputs"],
                                                 work_dir=str(Path(partitions_dir) / p["pid"] / PARTITION_RUN_DIR),
                                                 timeout_s=timeout_s, log_path=log_path)
    except StageError as e:
        row["status"] = "error"
        f = failure(e.stage, e.message, e.during)
        return finish("error", f["summary"], f)
    except Exception as e:  # a missing input, a tool bug: an error result
        row["status"] = "error"
        f = failure("run", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        return finish("error", f["summary"], f)
    row.update(run_ms=_round(run_ms), status="ran")
    return judge_placement(_compare_and_finish(result, finish, outs, ref_outputs, meta, tolerance,
                                               model_path=plan.get("prepared_model"), outputs_npz=outputs_npz))


def judge_placement(result: dict) -> dict:
    """A module result whose numbers match (``success``) but where some placed layer ran
    on another device than assigned becomes :data:`~.common.NOT_AS_ASSIGNED`: the
    program that passed is not the assignment the user asked about. The summary gives
    the count and the first layers; ``no kernel`` layers (folded into a copy, fused into
    a neighbour) do not count. Other statuses are left as they are."""
    summary = not_as_assigned_summary((result.get("module") or {}).get("placement"))
    if result.get("status") != "success" or summary is None:
        return result
    result.update(status=NOT_AS_ASSIGNED, summary=summary[:SUMMARY_CHARS])
    result["module"].update(status=NOT_AS_ASSIGNED, summary=result["summary"])
    return result


def run_module_plan(plan: Mapping, *, reference_npz: str, compiled: Mapping, tolerance: Mapping, timeout_s: float,
                    partitions_dir: str, compile_partition: Callable[[Mapping], dict],
                    log_path: str | None = None, outputs_npz: str | None = None) -> dict:
    """Run a module plan; when the module fails or differs, run the partitions too
    (``outputs_npz``: the outputs of the run whose result is returned).

    Args:
        plan: a module plan (``module``: the module; ``partitions``: the chain of the same assignment).
        compiled: the module's ``compiled.json``.
        compile_partition: compiles one partition of the chain (its plan entry)
            and returns its ``compiled.json`` content (the step's job; an existing one is reused).

    Returns:
        The module's result (:func:`run_module`) when it matches the reference with every
        layer as assigned, or matches with layers elsewhere under ``run_mode: module``
        (:data:`~.common.NOT_AS_ASSIGNED`); else the partitions' result (:func:`~.execute.run_partitions`) with ``mode_reason`` saying
        why the partitions ran, ``module`` (the module's result, placement included) and,
        when the partitions pass, a verdict that says the failure is in compiling the
        assignment as one program and names the first differing output and layer
        (``module.first_difference``: :func:`~.bisect.bisect_module`).
    """
    mres = run_module(plan, reference_npz=reference_npz, compiled=compiled, tolerance=tolerance,
                      timeout_s=timeout_s, partitions_dir=partitions_dir, log_path=log_path, outputs_npz=outputs_npz)
    if mres["status"] in ("success", "unverified") or not plan.get("partitions"):
        return mres
    if mres["status"] == NOT_AS_ASSIGNED and plan.get("run_mode") == MODULE_MODE:
        return mres  # asked for: the verdict says it, the run exits 1
    fb = {k: v for k, v in plan.items() if k != "module"}
    fb["mode"] = PARTITIONS_MODE
    comp = {p["pid"]: compile_partition(p) for p in fb["partitions"]}
    pres = run_partitions(fb, reference_npz=reference_npz, compiled=comp, tolerance=tolerance, timeout_s=timeout_s,
                          partitions_dir=partitions_dir, log_path=log_path, outputs_npz=outputs_npz)
    module = {**mres["module"], "metrics": mres.get("metrics"), "failure": mres.get("failure"),
              "num_over_tolerance": mres.get("num_over_tolerance")}
    pres["module"] = module
    pres["module_timing"] = mres.get("timing")
    if mres["status"] == NOT_AS_ASSIGNED:
        pres["mode_reason"] = (f"{plan.get('mode_reason')}; the module did not keep the assignment "
                               f"({mres['summary']}), so the partitions ran (each keeps its layers on their "
                               "executor by construction)")
        return pres
    what = "failed" if mres["status"] == "error" else "differs from the reference"
    pres["mode_reason"] = f"{plan.get('mode_reason')}; the module {what} ({mres['summary']}), so the partitions ran"
    if pres["status"] == "success":
        first = first_difference_of(plan, mres, reference_npz=reference_npz, tolerance=tolerance,
                                    timeout_s=timeout_s, partitions_dir=partitions_dir, log_path=log_path)
        module["first_difference"] = first
        pres["verdict"] = f"one module {what}, partitions pass: {ONE_PROGRAM_BLAME}{verdict_tail(first)}"
    else:
        pres["verdict"] = (f"one module {what}, and the partitions "
                           + {"difference": "differ from the reference too", "error": "fail too"}.get(
                               pres["status"], f"end with status {pres['status']}"))
    return pres


def first_difference_of(plan: Mapping, mres: Mapping, *, reference_npz: str, tolerance: Mapping, timeout_s: float,
                        partitions_dir: str, log_path: str | None = None) -> dict:
    """:func:`~.bisect.bisect_module` of a module that failed or differed, with its side
    file and :func:`weighted_mlir`; never raises (an unexpected error is a ``failed`` record)."""
    model = (plan.get("module") or {}).get("model")
    try:
        side = read_json(model, "module placement") if model and Path(model).is_file() else None

        def text(work_dir: str) -> str:
            return Path(weighted_mlir(side or {}, work_dir)).read_text(encoding="utf-8")

        return bisect_module(plan, mres, side=side, reference_npz=reference_npz, tolerance=tolerance,
                             timeout_s=timeout_s, partitions_dir=partitions_dir, mlir_text=text, log_path=log_path)
    except Exception as e:  # the verdict stands without it
        return {"status": "failed", "note": f"not located: {type(e).__name__}: {first_error_line(str(e))}",
                "output": None, "output_problem": None, "bisect_ms": None}


def _fail(res: dict, stage: str, message: str, during: str | None = None) -> dict:
    res["status"] = "error"
    res["failure"] = {"stage": stage, "during": during,
                      "summary": failure_summary(stage, message)[:SUMMARY_CHARS],
                      "message": bounded_message(message, MESSAGE_CHARS)}
    return res
