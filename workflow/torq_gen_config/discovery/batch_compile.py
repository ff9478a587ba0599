"""Batched compilation: several layers in one module, one compiler process per batch.

A compiler's fixed start-up and pipeline cost dominates a layer's compile (about
0.4 s of ``iree-compile`` per layer and target, measured in docs/compile_batches.md),
so for executors whose backend has ``batch_compile`` (iree, torq) the layer MLIRs
are merged into one module (:mod:`torq_gen_config.mlir.merge`), one function per
layer, and compiled once per (batch, executor). Each (layer, executor) test then
runs its own function from that module.

Failures stay per layer: when a batch does not compile, the layers the compiler's
error locations point at (else found by bisection) leave the batch and the rest is
compiled again; a layer that left is compiled alone by its own test job, exactly as
with ``compile_batch: 1``, so its verdict, stage and message are a one-layer
compile's. A batch that times out is not bisected (each probe could take the whole
limit again): all its layers are compiled alone.

Files, per batch and executor (``work/<model>/batches/<executor>/<batch id>/``):
``module.vmfb`` (empty when no member compiled), ``batch.mlir`` (the merged module
of the last compile, the reproducer: kept only when no member compiled, as its text
holds the members' weights twice over) and ``batch.json`` (:data:`BATCH_SCHEMA`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Mapping

from .. import backends
from ..backends.base import CompiledArtifact, StageError
from ..backends.iree_tools import parse_mlir_signature
from ..core.fileio import atomic_write_text, read_json, write_json
from ..core.isolation import check_running
from ..core.layout import BATCH_FILE, BATCH_MLIR_FILE, MODULE_FILE
from ..core.lazy import np
from ..core.limits import BATCH_WEIGHT_BYTES
from ..core.logs import append_record
from ..mlir.merge import MergeError, function_name, functions_at, merge_modules, parse_layer_module

BATCH_SCHEMA = "torq-gen-config/compile-batch/1"
#: compiler runs one batch may take in all (the first compile, recompiles without
#: the failing layers, bisection probes); what is left after that is compiled alone
MAX_COMPILES = 24

#: member status: in the batch's module / compiled by its own test job / not compiled (import failed)
COMPILED, ALONE, IMPORT_FAILED = "compiled", "alone", "import_failed"


def settings_key(settings: Any) -> str:
    """10 hex digits of the sha256 of ``settings`` (JSON data, keys sorted): the part
    of a batch id that changes with the executor's effective options and the test
    settings that are not per layer (see :func:`plan_batches`)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]


def plan_batches(slugs: list[str], size: int, key: str | None = None, *, weights: Mapping[str, int] | None = None,
                 max_bytes: int = BATCH_WEIGHT_BYTES, unit: int | None = None) -> list[dict]:
    """Cut the tested layers (``slugs``, manifest order) into batches of at most ``size``.

    ``weights``: bytes of each layer's weights (:func:`layer_weight_bytes`); a batch then
    also ends before its weights would pass ``max_bytes`` (the merged module's text holds
    them twice, in the compile job's memory and in the compiler's), so a layer heavier
    than that is a batch of its own, which :func:`compile_batch` leaves to its own test
    (no merge). ``unit``: batches never cross a multiple of ``unit`` slugs (the units of
    :func:`~torq_gen_config.pipeline.units.plan_units`).

    Without ``key``, the batch id is ``<index:04d>-<10 hex digits of sha256 of the
    member slugs>``: a batch keeps its id while its members stay, and another
    membership gives new ids (the full-model partitions' batches, fullrun/batches.py).

    With ``key`` (:func:`settings_key` of an executor's settings; the layer tests'
    batches), the id is ``<index:04d>-<key>``, a slot, not a membership: when the
    members of a slot change (a layer added or removed, another ``compile_batch``) the
    batch job reruns by its ``members`` param in the same directory, and the tests of
    layers whose functions did not change keep their verdicts (their batch inputs are
    ``ancient``; a new directory would be a missing input that retests the members).
    Other settings give another key, hence new directories, and retest the members,
    which is what those settings ask for (docs/compile_batches.md, "Reruns").

    Returns:
        ``[{"id": str, "members": [slug, ...]}, ...]``; empty for no slugs.

    Raises:
        ValueError: ``size`` < 1.
    """
    if size < 1:
        raise ValueError(f"compile_batch must be >= 1, got {size}")
    groups: list[list[str]] = []
    current: list[str] = []
    held = 0
    for k, slug in enumerate(slugs):
        w = (weights or {}).get(slug, 0)
        if current and (len(current) == size or (weights is not None and held + w > max_bytes)
                        or (unit and k % unit == 0)):
            groups.append(current)
            current, held = [], 0
        current.append(slug)
        held += w
    if current:
        groups.append(current)
    out = []
    for index, members in enumerate(groups):
        tail = key if key is not None else hashlib.sha256("\n".join(members).encode()).hexdigest()[:10]
        out.append({"id": f"{index:04d}-{tail}", "members": members})
    return out


def layer_weight_bytes(layer: Mapping) -> int:
    """Bytes of a manifest layer's initializers (``initializers``: dtype, shape)."""
    total = 0
    for init in layer.get("initializers") or []:
        try:
            item = np.dtype(init["dtype"]).itemsize
        except TypeError:  # a dtype numpy does not name (e.g. float8): one byte a value or less
            item = 1
        total += item * int(np.prod(init["shape"], dtype=np.int64))
    return total


def compile_batch(*, executor: dict, members: list[dict], out_dir: str, timeout_s: float,
                  log_path: str | None = None) -> dict:
    """Compile one batch of layers for one executor; never raises for a failing layer.

    Args:
        executor: ``{"name", "backend", "options"}`` (the effective executor, with the
            run-wide tool options applied); its backend must have ``batch_compile``.
        members: per layer ``{"slug", "layer_id", "mlir" (path), "import_status"
            (path of its import.json)}``, in batch order.
        out_dir: the batch directory (created); gets ``module.vmfb``, ``batch.json``
            (written last, atomically) and, when nothing compiled, ``batch.mlir``.
        timeout_s: wall-clock limit (s) of each compiler run.
        log_path: the job's log (command lines and compiler output).

    Returns:
        The ``batch.json`` content: ``{"schema", "executor", "backend", "members":
        [{"slug", "layer_id", "function", "status" (compiled | alone |
        import_failed), "reason"}], "compiled": int, "batch_ms" (wall time of all
        compiler runs of this batch, ms), "compiles": [{"functions", "status",
        "wall_ms", "summary"}], "module_bytes", "artifact_info"}``.

    Raises:
        BackendUnavailableError / ConfigError: the executor cannot be made (the
            caller then lets each member compile alone).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    backend = backends.make_backend(executor)
    entries: list[dict[str, Any]] = []
    parsed: dict[str, Any] = {}
    taken: set[str] = set()
    for m in members:
        entry = {"slug": m["slug"], "layer_id": m["layer_id"], "function": None, "status": ALONE, "reason": None}
        entries.append(entry)
        status = read_json(m["import_status"], "import status") if m.get("import_status") else {"status": "ok"}
        if status.get("status") != "ok":
            entry.update(status=IMPORT_FAILED, reason="the MLIR import failed (the layer's test reports it)")
            continue
        if len(members) == 1:  # nothing to share: its own test compiles its own file, nothing merged
            entry["reason"] = "a batch of one layer (its weights fill a batch, or it is the last layer)"
            continue
        try:
            layer = parse_layer_module(Path(m["mlir"]).read_text())
        except (OSError, MergeError) as e:
            entry["reason"] = f"its MLIR cannot be merged into a batch: {e}"
            continue
        entry["function"] = function_name(m["slug"], taken)
        parsed[entry["function"]] = layer
    compiles: list[dict] = []
    good = [e["function"] for e in entries if e["function"] in parsed]
    artifact = _compile_good(backend, good, parsed, out, entries, compiles, timeout_s, log_path)
    module = out / MODULE_FILE
    if artifact is None:
        atomic_write_text(module, "")  # the declared output; no member runs from it
    else:  # the merged text (twice the weights' size) is kept only to reproduce a failure
        (out / BATCH_MLIR_FILE).unlink(missing_ok=True)
    in_batch = [e for e in entries if e["status"] == COMPILED]
    info = dict(artifact.info) if artifact is not None else {}
    for key in ("signature", "onnx_path", "function", "compiler_stderr"):
        info.pop(key, None)  # per layer, or not the layers' own
    record = {
        "schema": BATCH_SCHEMA, "executor": executor["name"], "backend": executor["backend"],
        "members": entries, "compiled": len(in_batch),
        "batch_ms": round(sum(c["wall_ms"] for c in compiles), 3), "compiles": compiles,
        "module_bytes": module.stat().st_size, "artifact_info": info,
    }
    write_json(out / BATCH_FILE, record)
    if log_path:
        append_record(log_path, f"batch of {len(entries)}: {len(in_batch)} compiled together in "
                                f"{len(compiles)} compiler run(s), {record['batch_ms']:.0f} ms; "
                                f"{sum(e['status'] == ALONE for e in entries)} compile alone")
    return record


def _compile_good(backend, good: list[str], parsed: dict, out: Path, entries: list[dict], compiles: list[dict],
                  timeout_s: float, log_path: str | None):
    """Compile ``good`` as one module; drop the layers that fail it (see the module
    doc) until it compiles. Marks ``entries``; returns the artifact, or None when no
    member is left in the batch."""
    by_fn = {e["function"]: e for e in entries if e["function"]}
    while good:
        if len(compiles) >= MAX_COMPILES:
            _leave(by_fn, good, f"the batch did not compile within {MAX_COMPILES} compiler runs")
            return None
        try:
            artifact = _try(backend, good, parsed, out, compiles, timeout_s, log_path)
        except StageError as err:
            e = err
        else:
            for f in good:
                by_fn[f]["status"] = COMPILED
            return artifact
        # a tool the stop killed is no failure to search for (raised outside the
        # except block: the stop is one line, not a chained traceback)
        check_running("the batch compile")
        if e.stage == "timeout":
            _leave(by_fn, good, f"the batch compile timed out after {timeout_s:g} s")
            return None
        bad = _located(e, out / BATCH_MLIR_FILE, good) or _bisect(
            backend, good, parsed, out, compiles, timeout_s, log_path)
        if not bad:  # fails as a whole, but no part of it does alone
            _leave(by_fn, good, f"the batch failed ({e.stage}: {e.summary}) and no layer could be singled out")
            return None
        _leave(by_fn, bad, f"the batch compile failed at this layer ({e.stage})")
        good = [f for f in good if f not in bad]
    return None


def _try(backend, functions: list[str], parsed: dict, directory: Path, compiles: list[dict], timeout_s: float,
         log_path: str | None):
    """One compiler run of ``functions`` merged into ``directory/batch.mlir``; records
    it in ``compiles``. Returns the artifact; raises StageError (with ``spans``, the
    functions' line ranges)."""
    text, spans = merge_modules([(f, parsed[f]) for f in functions])
    mlir = directory / BATCH_MLIR_FILE
    atomic_write_text(mlir, text)
    t0 = time.perf_counter()
    try:
        artifact = backend.compile(onnx_path=None, mlir_path=str(mlir), work_dir=str(directory), timeout_s=timeout_s,
                                   log_path=log_path)
    except StageError as e:
        e.spans = spans
        compiles.append({"functions": len(functions), "status": e.stage, "wall_ms": _ms(t0),
                         "summary": e.summary[:300]})
        raise
    compiles.append({"functions": len(functions), "status": "ok", "wall_ms": _ms(t0), "summary": None})
    return artifact


def _located(e, mlir: Path, functions: list[str]) -> list[str]:
    """The functions of ``functions`` the error's locations point at."""
    spans = getattr(e, "spans", None) or {}
    return [f for f in functions_at(e.message, str(mlir), spans) if f in functions]


def _bisect(backend, functions: list[str], parsed: dict, out: Path, compiles: list[dict], timeout_s: float,
            log_path: str | None) -> list[str]:
    """Failing layers of a failing group whose errors name no layer: compile halves
    in ``out/probe`` and follow the failing one down to single layers. Returns [] when
    both halves compile (the failure needs layers of both) or a probe times out."""
    probe = out / "probe"
    probe.mkdir(exist_ok=True)
    group = list(functions)
    try:
        while len(group) > 1 and len(compiles) < MAX_COMPILES:
            half = group[:len(group) // 2]
            try:
                _try(backend, half, parsed, probe, compiles, timeout_s, log_path)
            except StageError as e:
                if e.stage == "timeout":
                    return []
                located = _located(e, probe / BATCH_MLIR_FILE, half)
                if located:
                    return located
                group = half
                continue
            group = group[len(group) // 2:]
        return group if len(group) == 1 else []
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _leave(by_fn: dict, functions: list[str], reason: str) -> None:
    for f in functions:
        by_fn[f].update(status=ALONE, reason=reason)


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)


def member_artifact(batch_file: str | os.PathLike, module: str | os.PathLike, slug: str,
                    layer_mlir: str | None) -> tuple["CompiledArtifact | None", dict]:  # noqa: F821
    """What one layer's test runs from its batch.

    Args:
        batch_file: the batch's ``batch.json``.
        module: the batch's ``module.vmfb``.
        slug: the layer.
        layer_mlir: the layer's own MLIR (its signature: argument and result types).

    Returns:
        ``(artifact, timing)``. ``artifact`` is the batch module with
        ``info["function"]`` = the layer's function and ``compile_ms`` = its share
        of the batch's compile time (``batch_ms`` / compiled members, ms), or None
        when the layer is to be compiled alone. ``timing`` goes to the result's
        ``timing.compile_batch``: ``{"id", "members" (compiled together),
        "batch_ms", "compile_ms_is": "share"}``, or for a layer compiled alone
        ``{"id", "compiled_alone": reason}``.

    Raises:
        TorqGenConfigError: ``batch.json`` cannot be read.
    """
    batch = read_json(batch_file, "compile batch")
    batch_id = Path(batch_file).parent.name
    entry = next((m for m in batch["members"] if m["slug"] == slug), None)
    if entry is None or entry["status"] != COMPILED:
        reason = entry["reason"] if entry else "not a member of its batch"
        return None, {"id": batch_id, "compiled_alone": reason}
    share = batch["batch_ms"] / max(batch["compiled"], 1)
    info = {**batch.get("artifact_info", {}), "function": entry["function"], "batch_id": batch_id,
            "signature": parse_mlir_signature(layer_mlir) if layer_mlir else None}
    timing = {"id": batch_id, "members": batch["compiled"], "batch_ms": batch["batch_ms"], "compile_ms_is": "share"}
    return CompiledArtifact(path=os.fspath(module), compile_ms=share, info=info), timing
