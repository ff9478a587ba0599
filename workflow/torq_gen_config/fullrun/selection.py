"""What to run: the per-layer choice of a report or compiler JSON (the selection),
``assignment.json``, how it runs (a chain of partitions, or one whole-model compile)
and the executor of every layer."""

from __future__ import annotations

import hashlib
import json
from textwrap import shorten
from typing import Any, Mapping

from ..backends import capabilities
from ..core.errors import ConfigError, ReportError
from ..mlir.importer import layer_location
from .common import ASSIGNMENT_SCHEMA, PARTITIONS_MODE

_NULL_NAMES = ("", "null", "none")


def _executor_name(value: Any) -> str | None:
    """An executor name from a JSON value; None for null, "" and the string "null"."""
    if isinstance(value, Mapping):
        value = value.get("executor")
    if not isinstance(value, str) or value.strip().lower() in _NULL_NAMES:
        return None
    return value.strip()


def selection_from_report(report: Mapping, *, source_file: str | None = None) -> dict:
    """The per-layer choice stored in a report JSON.

    Returns:
        ``{"source": "report", "source_file", "model_name", "layers": {layer_id:
        {"executor": name or None, "statuses": {executor: status}, ["untested": why]}},
        "locations": None}`` (``untested``: the not-testable or skip reason).

    Raises:
        ReportError: ``report`` is not a report JSON (no ``ops`` object).
    """
    ops = report.get("ops") if isinstance(report, Mapping) else None
    if not isinstance(ops, Mapping):
        raise ReportError(f"{source_file or 'report'} is not a report JSON: it has no 'ops' object")
    layers = {}
    for layer_id, op in ops.items():
        if not isinstance(op, Mapping):
            raise ReportError(f"{source_file or 'report'}: op {layer_id!r} is not an object")
        statuses = {name: (e or {}).get("status") for name, e in (op.get("executors") or {}).items()}
        layers[str(layer_id)] = {"executor": _executor_name(op.get("recommended_executor")), "statuses": statuses}
        untested = op.get("not_testable_reason") or op.get("skipped_reason")
        if untested:
            layers[str(layer_id)]["untested"] = str(untested)
    return {"source": "report", "source_file": source_file, "model_name": report.get("model_name"),
            "layers": layers, "locations": None}


def selection_from_compiler_json(compiler: Mapping, *, source_file: str | None = None) -> dict:
    """The ``line:col`` -> executor map of a compiler JSON.

    Returns:
        ``{"source": "compiler_json", "source_file", "model_name", "layers": None,
        "locations": {"L:C": name or None}}``.

    Raises:
        ReportError: no ``op_assignments`` object.
    """
    oa = compiler.get("op_assignments") if isinstance(compiler, Mapping) else None
    if not isinstance(oa, Mapping):
        raise ReportError(f"{source_file or 'compiler JSON'} is not a compiler JSON: it has no 'op_assignments' object")
    return {"source": "compiler_json", "source_file": source_file, "model_name": compiler.get("model_name"),
            "layers": None, "locations": {str(k): _executor_name(v) for k, v in oa.items()}}


def named_executors(selection: Mapping) -> dict[str, list[str]]:
    """Executor name -> the layer IDs (or ``line:col`` keys) the selection assigns to it
    (first use order)."""
    named: dict[str, list[str]] = {}
    for key, entry in (selection.get("layers") or {}).items():
        if entry.get("executor"):
            named.setdefault(entry["executor"], []).append(key)
    for key, name in (selection.get("locations") or {}).items():
        if name:
            named.setdefault(name, []).append(key)
    return named


def check_selection(selection: Mapping, executors: list[dict]) -> str:
    """Check that every executor named by the selection is configured, and tell how
    the model runs (:func:`assignment_mode`).

    Returns:
        A whole-model backend's kind (e.g. ``"torq"``: one whole-model compile) or
        ``"partitions"`` (a chain).

    Raises:
        ConfigError: an unknown executor name (the message lists the configured
            ones), or executors of a whole-model backend mixed with others in one
            assignment.
    """
    by_name = {e["name"]: e for e in executors}
    named = named_executors(selection)
    unknown = sorted(n for n in named if n not in by_name)
    if unknown:
        n = unknown[0]
        raise ConfigError(
            f"{selection.get('source_file') or 'the assignment'} assigns executor {n!r} "
            f"(e.g. to {named[n][0]}), which is not configured (configured: {', '.join(by_name)}); "
            "pass the --config-file used for discovery"
        )
    return assignment_mode(selection, executors)


def _whole_model_kind(executor: Mapping) -> str | None:
    """The executor's backend kind when that backend compiles a whole model at once."""
    kind = executor.get("backend")
    return kind if capabilities(kind).whole_model() is not None else None


def assignment_mode(selection: Mapping, executors: list[dict]) -> str:
    """How an assignment runs: the backend kind when every executor it names is of
    one backend that compiles whole models (:meth:`~torq_gen_config.backends.base.Backend.whole_model`,
    e.g. ``"torq"``); with no executor named: when the first configured executor
    is; else ``"partitions"``.

    Raises:
        ConfigError: the assignment names executors of a whole-model backend and
            other executors (one run cannot do both: that backend compiles the whole
            model at once, the others run as a chain).
    """
    by_name = {e["name"]: e for e in executors}
    named = {n: keys for n, keys in named_executors(selection).items() if n in by_name}
    if not named:
        first = _whole_model_kind(executors[0]) if executors else None
        return first or PARTITIONS_MODE
    kinds = {n: _whole_model_kind(by_name[n]) for n in by_name if n in named}
    whole = next((k for k in kinds.values() if k), None)
    mine = [n for n, k in kinds.items() if whole and k == whole]
    other = [n for n, k in kinds.items() if k != whole]
    if mine and other:
        def desc(names):
            return ", ".join(f"{n} ({by_name[n].get('backend')}: {len(named[n])} layer(s), e.g. {named[n][0]})"
                             for n in names)
        how = capabilities(whole).whole_model().how
        raise ConfigError(
            f"{selection.get('source_file') or 'the assignment'} mixes executors of the {whole} backend "
            f"[{desc(mine)}] with other executors [{desc(other)}]: {whole} assignments are {how} and the others "
            f"run as a chain of partitions, and one run cannot do both; assign every layer to {whole} executors "
            f"only, or to non-{whole} executors only (torq-gen-config edit, or the report JSON)"
        )
    return whole or PARTITIONS_MODE


def make_assignment(selection: Mapping, *, debug_ir: str | None = None) -> dict:
    """The content of ``work/full/assignment.json``: the selection plus the run
    options that have no config key (``debug_ir``: directory for IREE's
    per-partition compilation-phase dumps)."""
    return {
        "schema": ASSIGNMENT_SCHEMA,
        **{k: selection.get(k) for k in ("source", "source_file", "model_name", "layers", "locations")},
        "options": {"debug_ir": debug_ir},
    }


def assignment_bytes(doc: Mapping) -> bytes:
    """Stable serialisation (the file is rewritten only when these bytes change)."""
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")


def selection_digest(selection: Mapping | None) -> str | None:
    """A short digest of what a selection assigns (None for no selection)."""
    if selection is None:
        return None
    data = json.dumps({k: selection.get(k) for k in ("source", "layers", "locations")}, sort_keys=True)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()[:16]


def resolve_assignment(assignment: Mapping, layers: list[dict], locations: Mapping | None,
                       executors: list[dict]) -> tuple[dict[str, str], list[dict], list[str]]:
    """The executor of every layer of the manifest.

    Args:
        assignment: the content of ``assignment.json`` (:func:`make_assignment`).
        layers: the manifest's layers (``layer_id``, ``primary_prepared_index``, ...).
        locations: ``locations.json`` (maps layers to ``line:col``; needed for a
            compiler-JSON assignment).
        executors: configured executors in priority order.

    Returns:
        ``(by_layer, fallbacks, warnings)``: layer ID -> executor name for every
        layer; ``fallbacks`` lists the layers that had no choice, each
        ``{"layer_id", "executor", "reason"}``; ``warnings`` are one-liners (e.g.
        report layers that are not in the model any more).

    Raises:
        ConfigError: no executors, or the assignment names an executor that is
            not configured.
    """
    names = [e["name"] for e in executors]
    if not names:
        raise ConfigError("no executors configured")
    first = names[0]
    by_layer: dict[str, str] = {}
    fallbacks: list[dict] = []
    warnings: list[str] = []
    chosen = assignment.get("layers")
    by_loc = assignment.get("locations")
    for layer in layers:
        lid = layer["layer_id"]
        if chosen is not None:
            entry = chosen.get(lid)
            if entry is None:
                by_layer[lid] = first
                fallbacks.append({"layer_id": lid, "executor": first,
                                  "reason": "not in the report (the model changed since discovery?); "
                                            "no status known, so the first executor"})
                continue
            ex = entry.get("executor")
            if ex:
                by_layer[lid] = ex
                continue
            statuses = entry.get("statuses") or {}
            ok = [n for n in names if statuses.get(n) not in (None, "error")]
            if ok:
                by_layer[lid] = ok[0]
                fallbacks.append({"layer_id": lid, "executor": ok[0],
                                  "reason": f"no recommendation; {ok[0]} is the highest-priority executor whose "
                                            f"status is not error ({statuses[ok[0]]})"})
            else:
                tested = sorted(n for n in statuses if statuses[n] == "error")
                why = ("every tested executor failed on it (" + ", ".join(tested) + ")") if tested else (
                    f"it was not tested ({shorten(entry['untested'], 160, placeholder=' ...')})" if entry.get("untested")
                    else "it was not tested")  # the layer's own record says why in full
                by_layer[lid] = first
                fallbacks.append({"layer_id": lid, "executor": first,
                                  "reason": f"no recommendation and {why}; using the first executor"})
        else:
            loc = layer_location(layer, locations or {})
            ex = (by_loc or {}).get(loc) if loc else None
            if ex:
                by_layer[lid] = ex
                continue
            by_layer[lid] = first
            if loc is None:
                reason = "the layer has no MLIR line:col, so the compiler JSON cannot name it; using the first executor"
            elif loc in (by_loc or {}):
                reason = f"the compiler JSON has no executor for {loc}; using the first executor"
            else:
                reason = f"not in the compiler JSON ({loc}); no status known, so the first executor"
            fallbacks.append({"layer_id": lid, "executor": first, "reason": reason})
    if chosen is not None:
        known = {l["layer_id"] for l in layers}
        stale = [lid for lid in chosen if lid not in known]
        if stale:
            warnings.append(f"{len(stale)} layer(s) of the report are not in the model (e.g. {stale[0]}); ignored")
    unknown = sorted({ex for ex in by_layer.values() if ex not in names})
    if unknown:
        raise ConfigError(f"the assignment names executor {unknown[0]!r}, which is not configured "
                          f"(configured: {', '.join(names)})")
    return by_layer, fallbacks, warnings
