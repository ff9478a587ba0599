"""Compile batches of a full-model run: the partitions of one executor merged into one
module, one compiler process per batch (docs/compile_batches.md, "The full-model run").

A chain often has several partitions per executor (llvm-cpu / vmvx / ONNX Runtime
alternating after an ``edit``), and each partition's ``iree-compile`` is mostly the
compiler's fixed cost. With ``compile_batch`` > 1, the partitions of an executor whose
backend has ``batch_compile`` are cut into batches of up to ``compile_batch``
(:func:`plan_partition_batches`, at plan time); rule ``compile_partition_batch``
imports each member into its own ``partitions/<pid>/model.mlir`` (as a one-partition
compile does) and compiles them together with
:func:`torq_gen_config.discovery.batch_compile.compile_batch` (the same merging, failure location,
bisection and limits as the layer batches: a member is a partition, its ``slug`` its
pid). Rule ``compile_partition`` then writes each member's ``compiled.json`` from the
batch (:func:`compiled_from_batch`): the batch's module and the partition's function,
``compile_ms`` its share of the batch; a member the batch left out is compiled alone,
exactly as with ``compile_batch: 1``, so its ``compiled.json`` (status, failure stage
and message) is the one-partition one.

Not batched: ONNX Runtime partitions, the whole-model torq partition, a batch of one
partition (nothing to share), and every partition of a ``--debug-ir`` run (each
partition's IR is dumped to its own ``DIR/<pid>``).
"""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path
from typing import Mapping

from ..backends import capabilities
from ..core.fileio import atomic_write_text, read_json, write_json
from ..core.layout import BATCH_FILE, BATCHES_DIR, IMPORT_FILE, MLIR_FILE, MODEL_FILE, MODULE_FILE
from ..core.logs import append_record
from ..discovery.batch_compile import ALONE, BATCH_SCHEMA, compile_batch, member_artifact, plan_batches
from .common import COMPILED_SCHEMA, _layer_span, _round
from .compile import compile_partition, import_partition, safe_describe

#: the import status a batch job writes next to each member's ``model.mlir``


def batch_dir(full_dir: str | os.PathLike, executor: str, batch_id: str) -> Path:
    """``<full_dir>/batches/<executor>/<batch id>``: one batch's ``module.vmfb``,
    ``batch.mlir`` and ``batch.json`` (``full_dir``: ``work/<model>/full``)."""
    return Path(full_dir) / BATCHES_DIR / executor / batch_id


def existing_batches(full_dir: str | os.PathLike) -> dict[str, tuple[str, str]]:
    """The partitions already compiled in a batch of an earlier run: pid -> (executor,
    batch id), from each ``batches/<executor>/<id>/batch.json`` whose ``module.vmfb`` is
    there (any member status: one the batch left out has its alone compile). A pid in
    several batches keeps the first (by directory name); an unreadable ``batch.json``
    counts as no batch."""
    found: dict[str, tuple[str, str]] = {}
    root = Path(full_dir) / BATCHES_DIR
    for info in sorted(root.glob(f"*/*/{BATCH_FILE}")):
        if not (info.parent / MODULE_FILE).is_file():
            continue
        try:
            members = read_json(info, "compile batch")["members"]
        except Exception:
            continue
        for m in members:
            found.setdefault(m["slug"], (info.parent.parent.name, info.parent.name))
    return found


def plan_partition_batches(partitions: list[dict], size: int, *, debug_ir: str | None = None,
                           existing: Mapping[str, tuple[str, str]] | None = None) -> list[dict]:
    """The compile batches of a chain's partitions; sets each partition's
    ``compile_batch`` (its batch id, or None: compiled alone).

    A partition already compiled in a batch of an earlier run (``existing``, same
    executor) stays in it: batch modules are never changed, so its ``compiled.json``
    and that batch stay valid, and an assignment change compiles only the partitions
    it creates (as with ``compile_batch: 1``). Those batches are listed with ``kept:
    true`` and the plan's members only; nothing rebuilds them.

    The other partitions are grouped by how they compile (``compile_def``: one group
    per executor), in run order, a pid once (two partitions with the same pid are one
    compile), and cut into chunks of ``size`` with
    :func:`~torq_gen_config.discovery.batch_compile.plan_batches` (ids hash the member pids, so a
    batch keeps its id while its members stay). Only backends with ``batch_compile``
    and an MLIR import take part; chunks of one partition are not batched.

    Args:
        partitions: the plan's partitions (``pid``, ``executor``, ``backend``,
            ``needs_mlir``, ``compile_def``); changed in place.
        size: ``compile_batch`` (1: no batches, also no kept ones).
        debug_ir: the run's ``--debug-ir`` directory; when set nothing is batched.
        existing: :func:`existing_batches` of the run's directory.

    Returns:
        ``[{"id", "executor", "members": [pid, ...], "kept": bool}]``, in the order of
        their first member.

    Raises:
        ValueError: ``size`` < 1.
    """
    if size < 1:
        raise ValueError(f"compile_batch must be >= 1, got {size}")
    for p in partitions:
        p["compile_batch"] = None
    if size == 1 or debug_ir:
        return []
    groups: dict[str, list[str]] = {}
    executor_of: dict[str, str] = {}
    kept: dict[tuple[str, str], list[str]] = {}
    for p in partitions:
        if not (p.get("needs_mlir") and capabilities(p.get("backend")).batch_compile):
            continue
        old = (existing or {}).get(p["pid"])
        if old is not None and old[0] == p["executor"]:
            if p["pid"] not in kept.setdefault(old, []):
                kept[old].append(p["pid"])
            continue
        key = json.dumps(p["compile_def"], sort_keys=True)
        pids = groups.setdefault(key, [])
        if p["pid"] not in pids:
            pids.append(p["pid"])
        executor_of[key] = p["executor"]
    batches = [{"id": bid, "executor": ex, "members": pids, "kept": True} for (ex, bid), pids in kept.items()]
    batch_of = {pid: b["id"] for b in batches for pid in b["members"]}
    for key, pids in groups.items():
        for b in plan_batches(pids, size):
            if len(b["members"]) < 2:
                continue
            batches.append({"id": b["id"], "executor": executor_of[key], "members": b["members"], "kept": False})
            batch_of.update({pid: b["id"] for pid in b["members"]})
    for p in partitions:
        p["compile_batch"] = batch_of.get(p["pid"])
    first: dict[str, int] = {}
    for k, p in enumerate(partitions):
        first.setdefault(p["pid"], k)
    batches.sort(key=lambda b: first[b["members"][0]])
    return batches


def batch_members(plan: Mapping, batch_id: str) -> list[dict]:
    """The members of ``batch_id`` as :func:`compile_partition_batch` takes them:
    ``[{"slug": pid, "layer_id": "partition <index> (<layers>)"}]``, in batch order.

    Raises:
        KeyError: no such batch in ``plan``.
    """
    batch = next((b for b in plan.get("compile_batches") or [] if b["id"] == batch_id), None)
    if batch is None:
        raise KeyError(f"no compile batch {batch_id!r} in the plan")
    by_pid = {}
    for p in plan["partitions"]:
        by_pid.setdefault(p["pid"], p)
    return [{"slug": pid, "layer_id": f"partition {by_pid[pid]['index']} ({_layer_span(by_pid[pid]['layer_ids'])})"}
            for pid in batch["members"]]


def compile_partition_batch(*, executor: Mapping, members: list[dict], partitions_dir: str | os.PathLike,
                            out_dir: str | os.PathLike, timeout_s: float, log_path: str | None = None) -> dict:
    """Import each member partition and compile them as one module; never raises for a
    failing partition.

    Each member's ``partitions/<pid>/model.onnx`` is imported into
    ``partitions/<pid>/model.mlir`` (:func:`~.compile.import_partition`, as
    :func:`~.compile.compile_partition` does; the status goes to
    ``partitions/<pid>/import.json``), then
    :func:`torq_gen_config.discovery.batch_compile.compile_batch` merges and compiles them.
    A batch that cannot be compiled at all (the backend is unavailable, a bug) still
    writes its files, with every member marked to compile alone.

    Args:
        executor: the members' ``compile_def`` (all the same).
        members: ``[{"slug": pid, "layer_id": label}]`` (:func:`batch_members`).
        partitions_dir: ``work/<model>/full/partitions``.
        out_dir: the batch directory (:func:`batch_dir`).
        timeout_s: limit (s) of each compiler run.
        log_path: the job's log.

    Returns:
        The ``batch.json`` content (schema ``compile_batch.schema.yaml``; members'
        ``slug`` is the pid).
    """
    out = Path(out_dir)
    full = []
    for m in members:
        pdir = Path(partitions_dir) / m["slug"]
        st = import_partition(str(pdir / MODEL_FILE), str(pdir / MLIR_FILE),
                              parameters=executor.get("parameters") == "external")
        write_json(pdir / IMPORT_FILE, st)
        full.append({**m, "mlir": str(pdir / MLIR_FILE), "import_status": str(pdir / IMPORT_FILE)})
    try:
        rec = compile_batch(executor=dict(executor), members=full, out_dir=str(out), timeout_s=timeout_s,
                            log_path=log_path)
    except Exception as e:  # each member's own compile reports what is wrong
        reason = f"the batch was not compiled: {type(e).__name__}: {e}"
        if log_path:
            append_record(log_path, reason + "\n" + traceback.format_exc())
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / MODULE_FILE, "")
        rec = {"schema": BATCH_SCHEMA, "executor": executor["name"], "backend": executor["backend"],
               "members": [{"slug": m["slug"], "layer_id": m["layer_id"], "function": None, "status": ALONE,
                            "reason": reason[:500]} for m in members],
               "compiled": 0, "batch_ms": 0.0, "compiles": [], "module_bytes": 0, "artifact_info": {}}
    write_json(out / BATCH_FILE, rec)
    return rec


def compiled_from_batch(*, pid: str, model_path: str, executor: Mapping, work_dir: str, batch_info: str,
                        batch_module: str, timeout_s: float, log_path: str | None) -> dict:
    """``compiled.json`` of a partition of a compile batch.

    A member compiled in the batch gets ``status: ok`` with the batch's module and its
    own function (``artifact.info["function"]``, signature from its ``model.mlir``),
    ``compile_ms`` its share of the batch (``batch_ms`` / members compiled together)
    and ``import_ms`` from its import. A member the batch left out (or that is not in
    it) is compiled alone by :func:`~.compile.compile_partition`, as with
    ``compile_batch: 1``. Either way ``compile_batch`` says which: ``{"id",
    "executor", "members", "batch_ms", "compile_ms_is": "share"}`` or ``{"id",
    "executor", "compiled_alone": reason}``.

    Raises:
        TorqGenConfigError: ``batch_info`` exists but cannot be read.
    """
    mlir = str(Path(work_dir) / MLIR_FILE)
    if os.path.isfile(batch_info):
        artifact, timing = member_artifact(batch_info, batch_module, pid, mlir if os.path.isfile(mlir) else None)
    else:  # a kept batch removed since the plan was made
        artifact, timing = None, {"id": Path(batch_info).parent.name, "compiled_alone": "its batch's files are gone"}
    timing = {"id": timing["id"], "executor": executor.get("name"), **{k: v for k, v in timing.items() if k != "id"}}
    if artifact is None:
        res = compile_partition(pid=pid, model_path=model_path, executor=executor, work_dir=work_dir,
                                timeout_s=timeout_s, log_path=log_path)
        res["compile_batch"] = timing
        return res

    imp = Path(work_dir) / IMPORT_FILE
    import_ms = read_json(imp, "partition import status").get("import_ms") if imp.is_file() else None
    info = dict(artifact.info)
    info["onnx_path"] = model_path
    return {
        "schema": COMPILED_SCHEMA, "pid": pid, "executor": executor.get("name"), "backend": executor.get("backend"),
        "status": "ok", "compile_ms": _round(artifact.compile_ms), "import_ms": import_ms,
        "artifact": {"path": artifact.path, "info": info}, "failure": None, "compiled_at": time.time(),
        "tool": safe_describe(executor, timeout_s), "compile_batch": timing,
    }


def batch_module_of(compiled: Mapping, full_dir: str | os.PathLike) -> str | None:
    """The batch module a compiled partition runs from (found under ``full_dir``, the
    run's ``work/<model>/full``, whatever the working directory at compile time), or
    None when it was compiled alone."""
    cb = compiled.get("compile_batch") or {}
    if cb.get("compile_ms_is") != "share":
        return None
    return str(batch_dir(full_dir, cb["executor"], cb["id"]) / MODULE_FILE)
