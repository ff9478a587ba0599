"""Person-made changes to a report JSON: layer matching, edits, user-choices sidecar.

Used by ``torq-gen-config edit`` (and the path helpers by ``view``). An edit
works on the stored results only: verdicts are re-derived from the stored
metrics, nothing is compiled or run again. After an edit the report is
consistent again (summary, critical failures, ``final_report_text``) and the
compiler JSON next to it is regenerated from it.

Person-made choices (a recommendation chosen by a person, a per-layer
tolerance override) are also kept in a sidecar file,
``<report dir>/work/<name>/user_choices.json``, shaped like a report's ``ops``::

    {"model_name": "...",
     "ops": {"<layer_id>": {"recommended_executor": "ort" | null,
                            "recommendation_source": "user",
                            "tolerance_override": {"fp_avg_tol": .., "fp_max_tol": ..}}}}

An entry holds only what a person set: ``recommended_executor`` together with
``recommendation_source: "user"`` when the recommendation was chosen,
``tolerance_override`` when a tolerance was set. The workflow's aggregate step
passes this file to :func:`~torq_gen_config.report.build.build_report` as
``previous_report``, so the choices survive a later ``discover``.

Differences from the original tool (``notes/reference_tool.md`` section 7):
the executor is validated against the report's executors; ``null`` is stored
as JSON null; a tolerance edit takes effect at once (the layer's verdicts and
recommendation are re-derived); the summary is regenerated, not only the text;
and the choices survive the next ``discover`` through the sidecar.
"""

from __future__ import annotations

import copy
import difflib
import fnmatch
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..compare import normalize_tolerance
from ..errors import ConfigError, ReportError
from ..fileio import atomic_write_files, json_bytes, read_json
from .build import build_compiler_json, check_report, executor_names, render_report, summarize, trust_lists  # noqa: F401
from .recommend import recommend_with_reason, rederive_statuses
from .text import render_final_report_text  # noqa: F401 (its old import path here)

__all__ = [
    "UNSET",
    "NULL_EXECUTOR",
    "LayerChange",
    "EditResult",
    "report_path_for_model",
    "compiler_path_for_model",
    "compiler_path_for_report",
    "user_choices_path",
    "resolve_report_path",
    "is_compiler_json",
    "load_report",
    "match_layers",
    "find_layer",
    "close_matches",
    "list_layers",
    "apply_edit",
    "refresh_report",
    "user_choice_entry",
    "merge_user_choices",
    "edit_report_file",
]


class _Unset:
    """Marker: the executor was not given (as opposed to ``None`` = no executor)."""

    def __repr__(self) -> str:  # pragma: no cover - cosmetic
        return "UNSET"


UNSET: Any = _Unset()
"""``executor`` argument of :func:`apply_edit` when the recommendation is not edited."""

NULL_EXECUTOR = "null"
"""Command-line spelling of "no executor" (stored as JSON null)."""

ALL_LAYERS = "ALL"
"""``--layer`` value that matches every layer."""

_MAX_CLOSE = 10


#: An MLIR location the compiler JSON can name.
_LINE_COL = re.compile(r"^\d+:\d+$")


# --------------------------------------------------------------------------- paths


def report_path_for_model(model: str | os.PathLike, output_dir: str | os.PathLike) -> Path:
    """``<output_dir>/torq_gen_config_<model stem>.json`` (:mod:`torq_gen_config.layout`)."""
    from ..layout import report_file

    return Path(output_dir).expanduser() / report_file(Path(model).stem)


def compiler_path_for_model(model: str | os.PathLike, output_dir: str | os.PathLike) -> Path:
    """``<output_dir>/torq_gen_config_<model stem>_compiler.json`` (:mod:`torq_gen_config.layout`)."""
    from ..layout import compiler_file

    return Path(output_dir).expanduser() / compiler_file(Path(model).stem)


def compiler_path_for_report(report_path: str | os.PathLike) -> Path:
    """The compiler JSON next to a report: ``<report stem>_compiler.json``."""
    p = Path(report_path)
    return p.with_name(f"{p.stem}_compiler.json")


def user_choices_path(report_path: str | os.PathLike, report: Mapping | None = None) -> Path:
    """The user-choices sidecar of a report: ``<report dir>/work/<name>/user_choices.json``
    (:mod:`torq_gen_config.layout`; ``name`` the report's ``model_name``, else the name in
    the report's file name), so that the choices of one model (or subgraph) never reach
    another's report in the same directory."""
    from ..layout import REPORT_PREFIX, user_choices_file

    name = report.get("model_name") if isinstance(report, Mapping) else None
    if not isinstance(name, str) or not name:
        name = Path(report_path).stem.removeprefix(REPORT_PREFIX)
    return Path(report_path).parent / user_choices_file(name)


def resolve_report_path(report: str | None, model: str | None, output_dir: str | None) -> Path:
    """Report path from either a positional path or ``--model``/``--output-dir``.

    Raises:
        ConfigError: neither or both forms were given.
    """
    if report and model:
        raise ConfigError("give either a report JSON path or --model/--output-dir, not both")
    if report:
        return Path(report).expanduser()
    if model:
        return report_path_for_model(model, output_dir or ".")
    raise ConfigError("give a report JSON path, or --model (with --output-dir) to find it")


# --------------------------------------------------------------------------- loading


def is_compiler_json(data: Any) -> bool:
    """True for a compiler JSON (``op_assignments`` and no ``ops``)."""
    return isinstance(data, Mapping) and "op_assignments" in data and "ops" not in data


def _report_name_for_compiler(path: Path) -> Path:
    stem = path.stem
    if stem.endswith("_compiler"):
        return path.with_name(stem[: -len("_compiler")] + ".json")
    return path.with_name("torq_gen_config_<model>.json")


def load_report(path: str | os.PathLike) -> dict:
    """Read a report JSON for editing.

    Raises:
        ReportError: the file is missing or not valid JSON; it is a compiler
            JSON (the message names the report JSON to use instead); or it has
            no ``ops`` object.
    """
    path = Path(path)
    if not path.exists() and compiler_path_for_report(path).exists():
        raise ReportError(
            f"report JSON not found: {path} (only the compiler JSON {compiler_path_for_report(path)} is there; "
            "edit needs the report JSON: run 'torq-gen-config discover' to create it)"
        )
    data = read_json(path, "report JSON")
    if is_compiler_json(data):
        raise ReportError(
            f"{path} is a compiler JSON (op_assignments), which is derived from the report; "
            f"edit the report JSON instead: {_report_name_for_compiler(path)}"
        )
    if not isinstance(data, dict) or not isinstance(data.get("ops"), dict):
        raise ReportError(f"{path} is not a torq-gen-config report JSON: it has no 'ops' object")
    check_report(data, str(path))
    return data


_executor_names = executor_names  # its old name here


# --------------------------------------------------------------------------- matching


def close_matches(layer_ids: list[str], query: str, n: int = _MAX_CLOSE) -> list[str]:
    """Up to ``n`` layer IDs close to ``query`` (case-insensitive, difflib)."""
    by_lower: dict[str, str] = {}
    for lid in layer_ids:
        by_lower.setdefault(lid.lower(), lid)
    hits = difflib.get_close_matches(query.lower(), list(by_lower), n=n, cutoff=0.4)
    return [by_lower[h] for h in hits]


def _no_match_message(layer_ids: list[str], query: str) -> str:
    close = close_matches(layer_ids, query)
    if close:
        hint = "close matches: " + ", ".join(close)
    elif layer_ids:
        shown = layer_ids[:_MAX_CLOSE]
        more = f" (and {len(layer_ids) - len(shown)} more)" if len(layer_ids) > len(shown) else ""
        hint = "layers: " + ", ".join(shown) + more
    else:
        hint = "the report has no layers"
    return f"no layer matches {query!r}; {hint}; use 'edit --list' to see all layer IDs"


def match_layers(layer_ids: list[str], pattern: str) -> list[str]:
    """Layer IDs selected by ``pattern``, in report order.

    Strategies, first that applies (``notes/reference_tool.md`` section 7):

    1. ``ALL``: every layer;
    2. the pattern holds ``*`` or ``?``: fnmatch, case-insensitive;
    3. an exact case-insensitive match (the exact-case ID wins if several IDs
       differ only in case);
    4. case-insensitive substring.

    Raises:
        ConfigError: empty pattern.
        ReportError: nothing matches (the message lists close IDs).
    """
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError("--layer needs a layer ID or pattern")
    if pattern == ALL_LAYERS:
        matched = list(layer_ids)
    elif "*" in pattern or "?" in pattern:
        pat = pattern.lower()
        matched = [lid for lid in layer_ids if fnmatch.fnmatchcase(lid.lower(), pat)]
    else:
        if pattern in layer_ids:
            return [pattern]
        low = pattern.lower()
        matched = [lid for lid in layer_ids if lid.lower() == low]
        if not matched:
            matched = [lid for lid in layer_ids if low in lid.lower()]
    if not matched:
        raise ReportError(_no_match_message(layer_ids, pattern))
    return matched


def find_layer(layer_ids: list[str], query: str) -> str:
    """One layer by exact ID, else by case-insensitive ID.

    Raises:
        ReportError: no such layer (the message lists close IDs), or the
            case-insensitive match is ambiguous.
    """
    if query in layer_ids:
        return query
    low = query.lower()
    hits = [lid for lid in layer_ids if lid.lower() == low]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        raise ReportError(f"layer {query!r} is ambiguous (differs only in case): {', '.join(hits)}")
    close = close_matches(layer_ids, query)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    raise ReportError(f"no layer {query!r} in the report{hint}")


def list_layers(report: Mapping, filter_text: str | None = None) -> tuple[list[dict], int]:
    """Layers for ``edit --list``: substring ``filter_text`` (case-insensitive).

    Returns:
        ``(rows, total)``: rows ``{layer_id, op_type, recommended_executor,
        recommendation_source, tolerance_override}`` in report order, and the
        number of layers in the report.
    """
    ops = report.get("ops") or {}
    low = (filter_text or "").lower()
    rows = []
    for lid, op in ops.items():
        if low and low not in lid.lower():
            continue
        rows.append({
            "layer_id": lid,
            "op_type": op.get("op_type"),
            "recommended_executor": op.get("recommended_executor"),
            "recommendation_source": op.get("recommendation_source") or "discovery",
            "tolerance_override": op.get("tolerance_override"),
        })
    return rows, len(ops)


# --------------------------------------------------------------------------- edits


@dataclass
class LayerChange:
    """What an edit changed on one layer."""

    layer_id: str
    old_recommendation: str | None
    new_recommendation: str | None
    old_source: str
    new_source: str
    old_tolerance_override: dict | None
    new_tolerance_override: dict | None
    status_changes: dict[str, tuple[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return (self.old_recommendation != self.new_recommendation or self.old_source != self.new_source
                or self.old_tolerance_override != self.new_tolerance_override or bool(self.status_changes))


def _check_tolerance_value(flag: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{flag} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{flag} must be a finite number > 0, got {value!r}")
    return value


def _validate_executor(executor: Any, names: list[str]) -> str | None:
    if executor is None or executor == NULL_EXECUTOR:
        return None
    if not isinstance(executor, str) or executor not in names:
        raise ConfigError(
            f"unknown executor {executor!r}; valid: {', '.join(names)} "
            f"(or '{NULL_EXECUTOR}' for no assignment)"
        )
    return executor


def _default_tolerance(report: Mapping) -> dict:
    try:
        return normalize_tolerance(report.get("default_tolerance"))
    except ValueError as e:
        raise ReportError(f"report has an invalid default_tolerance: {e}") from None


def apply_edit(
    report: dict,
    layer_ids: list[str],
    *,
    executor: Any = UNSET,
    tolerance_avg: float | None = None,
    tolerance_max: float | None = None,
    reset: bool = False,
) -> list[LayerChange]:
    """Apply one edit to the given layers of ``report``, in place.

    Args:
        report: a report dict (``ops``, ``executors``, ``default_tolerance``).
        layer_ids: layers to edit (from :func:`match_layers`).
        executor: :data:`UNSET` (leave the recommendation), an executor name
            of ``report["executors"]``, or ``None`` / ``"null"`` for no
            executor (JSON null: the layer is left out of the compiler JSON).
            Marks the recommendation ``recommendation_source: "user"``.
        tolerance_avg, tolerance_max: new ``fp_avg_tol`` / ``fp_max_tol`` of
            the layer's ``tolerance_override`` (also set as ``bf16_avg_tol`` /
            ``bf16_max_tol``: the override applies to every float output) (the other value comes from the
            existing override, else the report's default). Finite and > 0.
            The layer's verdicts are re-derived from the stored metrics and,
            unless a person chose it, its recommendation is recomputed.
        reset: drop person-made choices: the recommendation goes back to
            discovery's rule and the tolerance override is removed (verdicts
            re-derived with the default tolerance). Not combinable with the
            other edits.

    The summary, critical failures and text are not refreshed here: call
    :func:`refresh_report` afterwards.

    Returns:
        One :class:`LayerChange` per layer, in the order of ``layer_ids``.

    Raises:
        ConfigError: nothing to do, a conflicting combination, an unknown
            executor (the message lists the valid names) or a bad tolerance.
        ReportError: an unknown layer ID, or a report that cannot be
            re-derived (invalid default tolerance or metrics).
    """
    names = _executor_names(report)
    tol_avg = _check_tolerance_value("--tolerance-avg", tolerance_avg)
    tol_max = _check_tolerance_value("--tolerance-max", tolerance_max)
    set_executor = executor is not UNSET
    set_tolerance = tol_avg is not None or tol_max is not None
    if reset and (set_executor or set_tolerance):
        raise ConfigError("--reset cannot be combined with --executor or --tolerance-avg/--tolerance-max")
    if not (reset or set_executor or set_tolerance):
        raise ConfigError("nothing to change: give --executor, --tolerance-avg/--tolerance-max or --reset")
    new_executor = _validate_executor(executor, names) if set_executor else None
    default_tol = _default_tolerance(report)
    ops = report["ops"]
    summary = (report.get("discovery_report") or {}).get("summary") or {}
    by_timing = summary.get("recommendation_rule") == "timing"

    changes: list[LayerChange] = []
    for lid in layer_ids:
        if lid not in ops:
            raise ReportError(f"no layer {lid!r} in the report")
        op = ops[lid]
        execs = op.setdefault("executors", {})
        old_statuses = {name: entry.get("status") for name, entry in execs.items()}
        old_override = copy.deepcopy(op.get("tolerance_override"))
        change = LayerChange(
            layer_id=lid,
            old_recommendation=op.get("recommended_executor"),
            new_recommendation=None,
            old_source=op.get("recommendation_source") or "discovery",
            new_source="discovery",
            old_tolerance_override=old_override,
            new_tolerance_override=None,
        )
        rederive = False
        if reset:
            if "tolerance_override" in op:
                del op["tolerance_override"]
                rederive = True
            op["recommendation_source"] = "discovery"
            op.pop("user_recommendation_dropped", None)
        if set_tolerance:
            base = dict(old_override) if old_override else dict(default_tol)
            # one tolerance per layer, whatever the output dtype: it also
            # replaces the bf16 bounds (docs/comparison.md)
            if tol_avg is not None:
                base["fp_avg_tol"] = base["bf16_avg_tol"] = tol_avg
            if tol_max is not None:
                base["fp_max_tol"] = base["bf16_max_tol"] = tol_max
            try:
                op["tolerance_override"] = normalize_tolerance(base)
            except ValueError as e:
                raise ConfigError(f"layer {lid}: invalid tolerance: {e}") from None
            rederive = True
        if rederive or reset:
            try:
                rederive_statuses(op, default_tol)
            except ValueError as e:
                raise ReportError(f"layer {lid}: cannot re-derive verdicts: {e}") from None
        if set_executor:
            op["recommended_executor"] = new_executor
            op["recommendation_source"] = "user"
            op["recommendation_reason"] = "user"
            op.pop("user_recommendation_dropped", None)
            if new_executor is not None:
                status = (execs.get(new_executor) or {}).get("status")
                if status is None:
                    change.notes.append(f"{new_executor} was not tested on this layer")
                elif status != "success":
                    change.notes.append(f"{new_executor} has status '{status}' on this layer")
            if not _LINE_COL.match(str(op.get("mlir_location") or "")):
                change.notes.append(
                    "no MLIR line:col, so the compiler JSON does not name this layer"
                    + (" (fused into another op in the quantized model: the choice reaches neither the compiler "
                       "nor `run`)" if op.get("quantized_op_type") is None and op.get("note") else ""))
        elif op.get("recommendation_source") != "user":
            try:
                # the report's own rule: by priority, or by timing when discovery used it
                op["recommended_executor"], op["recommendation_reason"] = recommend_with_reason(
                    execs, names, by_timing=by_timing)
            except ValueError as e:
                raise ReportError(f"layer {lid}: {e}") from None
            op["recommendation_source"] = "discovery"
        change.new_recommendation = op.get("recommended_executor")
        change.new_source = op.get("recommendation_source") or "discovery"
        change.new_tolerance_override = copy.deepcopy(op.get("tolerance_override"))
        for name, entry in execs.items():
            before, after = old_statuses.get(name), entry.get("status")
            if before != after:
                change.status_changes[name] = (before, after)
        skipped = [name for name, entry in execs.items() if entry.get("status") == "skipped"]
        if skipped and change.status_changes:
            change.notes.append(f"not tested in skip mode, so not re-derived: {', '.join(skipped)} "
                                "(run discover without skip mode to test them)")
        changes.append(change)
    return changes


def refresh_report(report: dict) -> dict:
    """Recompute ``discovery_report``, ``has_critical_failures`` and
    ``final_report_text`` of ``report`` in place, and return its compiler JSON
    (:func:`~torq_gen_config.report.build.build_compiler_json`): the render step
    :func:`~torq_gen_config.report.build.render_report`, shared with ``run``."""
    return render_report(report)


# --------------------------------------------------------------------------- sidecar


def user_choice_entry(op: Mapping) -> dict | None:
    """The sidecar entry of one report op: only what a person set, or None."""
    entry: dict[str, Any] = {}
    if op.get("recommendation_source") == "user":
        entry["recommended_executor"] = op.get("recommended_executor")
        entry["recommendation_source"] = "user"
    if op.get("tolerance_override") is not None:
        entry["tolerance_override"] = copy.deepcopy(op["tolerance_override"])
    return entry or None


def merge_user_choices(existing: Mapping | None, report: Mapping, layer_ids: list[str]) -> dict:
    """The new sidecar content: ``existing`` with the entries of ``layer_ids``
    replaced by the report's current person-made choices (dropped when there
    are none), plus any person-made choice of the report that the sidecar lacks.
    Entries of other layers are kept as they are."""
    ops_out: dict[str, Any] = dict((existing or {}).get("ops") or {})
    report_ops = report.get("ops") or {}
    for lid, op in report_ops.items():
        if lid in layer_ids or lid not in ops_out:
            entry = user_choice_entry(op)
            if entry is None:
                ops_out.pop(lid, None)
            else:
                ops_out[lid] = entry
    out = {k: v for k, v in (existing or {}).items() if k != "ops"}
    out["model_name"] = report.get("model_name", out.get("model_name"))
    out["ops"] = ops_out
    return out


def _read_user_choices(path: Path) -> dict | None:
    if not path.exists():
        return None
    data = read_json(path, "user choices file")
    if not isinstance(data, dict) or not isinstance(data.get("ops", {}), dict):
        raise ReportError(f"user choices file {path} is malformed: expected an object with an 'ops' object")
    return data


# --------------------------------------------------------------------------- one call


@dataclass
class EditResult:
    """Outcome of :func:`edit_report_file`."""

    report_path: Path
    compiler_path: Path
    user_choices_path: Path
    changes: list[LayerChange]
    report: dict


def edit_report_file(
    report_path: str | os.PathLike,
    layer_pattern: str,
    *,
    executor: Any = UNSET,
    tolerance_avg: float | None = None,
    tolerance_max: float | None = None,
    reset: bool = False,
) -> EditResult:
    """Edit a report file: match layers, apply the edit, refresh, write all three files.

    Reads the report (and the sidecar) first and validates everything before
    writing; then writes, each atomically, the report, the compiler JSON next
    to it (``<report stem>_compiler.json``) and the sidecar
    ``<report dir>/work/user_choices.json``. On any error nothing is written.

    Raises:
        ReportError, ConfigError: see :func:`load_report`, :func:`match_layers`
            and :func:`apply_edit`; a malformed sidecar.
    """
    path = Path(report_path)
    report = load_report(path)
    sidecar = user_choices_path(path, report)
    existing = _read_user_choices(sidecar)
    layer_ids = match_layers(list(report["ops"]), layer_pattern)
    changes = apply_edit(report, layer_ids, executor=executor, tolerance_avg=tolerance_avg,
                         tolerance_max=tolerance_max, reset=reset)
    compiler = refresh_report(report)
    choices = merge_user_choices(existing, report, layer_ids)
    compiler_path = compiler_path_for_report(path)
    files = {path: json_bytes(report), compiler_path: json_bytes(compiler)}
    if existing is not None or choices["ops"]:
        files[sidecar] = json_bytes(choices)
    atomic_write_files(files)  # all three or none (a full disk, a read-only directory)
    if sidecar in files:
        # the sidecar is an input of the report (rule aggregate_report), which this
        # edit has re-rendered: not newer than it, or the next discovery redoes it
        st = os.stat(path)
        os.utime(sidecar, ns=(st.st_atime_ns, st.st_mtime_ns))
    return EditResult(report_path=path, compiler_path=compiler_path, user_choices_path=sidecar,
                      changes=changes, report=report)
