"""Person-made changes to a report JSON: edits and the user-choices sidecar (layer
matching: :mod:`.layer_select`; paths and loading: :mod:`.files`).

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

Differences from the original tool (docs/original_tool.md, 'edit'):
the executor is validated against the report's executors; ``null`` is stored
as JSON null; a tolerance edit takes effect at once (the layer's verdicts and
recommendation are re-derived); the summary is regenerated, not only the text;
and the choices survive the next ``discover`` through the sidecar.
"""

from __future__ import annotations

import copy
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..compare import normalize_tolerance
from ..core.errors import ConfigError, ReportError
from ..core import run_lock
from ..core.fileio import json_bytes, read_json
from ..core.layout import REPORT_PREFIX, lock_file
from .build import render_report
from .cells import executor_names
from .publish import publish_report
from .files import compiler_path_for_report, load_report, user_choices_path
from .layer_select import match_layers
from .recommend import recommend_with_reason, rederive_statuses

__all__ = [
    "UNSET",
    "NULL_EXECUTOR",
    "LayerChange",
    "EditResult",
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



#: An MLIR location the compiler JSON can name.
_LINE_COL = re.compile(r"^\d+:\d+$")




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
    names = executor_names(report)
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
    ``<report dir>/work/<model>/user_choices.json``. On any error nothing is written.

    Raises:
        ReportError, ConfigError: see :func:`load_report`, :func:`match_layers`
            and :func:`apply_edit`; a malformed sidecar.
        RunLocked: a run of this model in this output directory is running (its report
            would overwrite the edit); the message names it.
    """
    path = Path(report_path)
    # a run of this model writes the report from the user choices when it finishes: an
    # edit meanwhile would be overwritten, so it waits for no run and holds the lock
    name = path.stem[len(REPORT_PREFIX):] if path.stem.startswith(REPORT_PREFIX) else path.stem
    lock = path.parent / lock_file(name)
    run_lock.acquire(lock, what=f"{path.parent} for {name}")
    try:
        return _edit_locked(path, layer_pattern, executor=executor, tolerance_avg=tolerance_avg,
                            tolerance_max=tolerance_max, reset=reset)
    finally:
        run_lock.release(lock)


def _edit_locked(path: Path, layer_pattern: str, *, executor: Any, tolerance_avg: float | None,
                 tolerance_max: float | None, reset: bool) -> EditResult:
    report = load_report(path)
    sidecar = user_choices_path(path, report)
    existing = _read_user_choices(sidecar)
    layer_ids = match_layers(list(report["ops"]), layer_pattern)
    changes = apply_edit(report, layer_ids, executor=executor, tolerance_avg=tolerance_avg,
                         tolerance_max=tolerance_max, reset=reset)
    choices = merge_user_choices(existing, report, layer_ids)
    compiler_path = compiler_path_for_report(path)
    extra = {sidecar: json_bytes(choices)} if existing is not None or choices["ops"] else {}
    # re-rendered and written by the one report writer, with the sidecar: all three or
    # none (a full disk, a read-only directory)
    publish_report(path, compiler_path, report, rederive=True, extra_files=extra, force=True)
    if extra:
        # the sidecar is an input of the report (rule aggregate_report), which this
        # edit has re-rendered: not newer than it, or the next discovery redoes it
        st = os.stat(path)
        os.utime(sidecar, ns=(st.st_atime_ns, st.st_mtime_ns))
    return EditResult(report_path=path, compiler_path=compiler_path, user_choices_path=sidecar,
                      changes=changes, report=report)
