"""Choice of the recommended executor per layer, and status re-derivation.

The rule follows seed 001 section 3 ("How Recommended Executor is Determined"):
executors are tried in the configured priority order; the first one whose
output matches the reference wins, else the first that ran but differs. This
project adds a third level for ``"unverified"`` runs (the executor ran but the
reference failed on that layer, so nothing could be compared): better than no
executor at all, but flagged in the report. A layer whose every tested
executor has status ``"error"`` is a critical failure (seed 001 section 3,
``notes/reference_tool.md`` section 1 ``critical_failures``).
"""

from __future__ import annotations

from typing import Mapping

from ..compare import derive_status, normalize_tolerance, status_details

STATUSES = ("success", "difference", "error", "unverified", "skipped")
"""Every status a (layer, executor) result may have. ``"skipped"``: not tested because
a higher-priority executor already succeeded on the layer (skip mode)."""

_RECOMMENDATION_ORDER = ("success", "difference", "unverified")
_MESSAGE_MAX_CHARS = 4000


def _status_of(executor: str, result: Mapping) -> str:
    if not isinstance(result, Mapping):
        raise ValueError(f"result of executor {executor!r} must be a dict, got {type(result).__name__}")
    status = result.get("status")
    if status not in STATUSES:
        raise ValueError(f"executor {executor!r} has invalid status {status!r}; expected one of {list(STATUSES)}")
    return status


def recommend_executor(results: Mapping[str, Mapping], priority: list[str]) -> str | None:
    """Recommended executor of one layer.

    Args:
        results: executor name -> result dict (needs ``"status"``, one of
            ``success|difference|error|unverified``).
        priority: configured executor names, highest priority first.

    Returns:
        The first executor in ``priority`` order with status ``"success"``;
        else the first with ``"difference"``; else the first ``"unverified"``;
        else None (no executor ran: critical failure, or nothing tested).
        Executors in ``priority`` but missing from ``results`` are ignored, as
        are results of executors not in ``priority``. Source: seed 001 section 3,
        plus the ``unverified`` level of this project.

    Raises:
        ValueError: a considered result has no valid status.
    """
    statuses = {name: _status_of(name, results[name]) for name in priority if name in results}
    for wanted in _RECOMMENDATION_ORDER:
        for name in priority:
            if statuses.get(name) == wanted:
                return name
    return None


def is_critical_failure(results: Mapping[str, Mapping]) -> bool:
    """True iff at least one executor was tested and every tested one is ``"error"``.

    A ``"difference"`` or ``"unverified"`` result is not critical (the layer can
    still run somewhere); a layer with no tested executors (skipped) is not
    critical either. Source: ``notes/reference_tool.md`` section 1
    (``critical_failures``), seed 001 section 3 (last example).

    Raises:
        ValueError: a result has no valid status.
    """
    tested = [_status_of(name, res) for name, res in results.items()]
    tested = [s for s in tested if s != "skipped"]
    return bool(tested) and all(s == "error" for s in tested)


def accuracy_failure_report(metrics: Mapping, tolerance: Mapping) -> dict:
    """``failure_report`` for a ``"difference"`` verdict derived from metrics.

    Returns ``{"type": "accuracy_failure", "stage": "compare", "summary",
    "message"}``: summary from :func:`~torq_gen_config.compare.derive_status`
    (<= 512 chars), message = every reason, one per line (<= 4000 chars).
    """
    _, summary = derive_status(metrics, tolerance)
    message = "\n".join(status_details(metrics, tolerance)) or summary
    if len(message) > _MESSAGE_MAX_CHARS:
        message = message[: _MESSAGE_MAX_CHARS - 3] + "..."
    return {"type": "accuracy_failure", "stage": "compare", "summary": summary, "message": message}


def rederive_statuses(op_entry: dict, default_tolerance: Mapping) -> None:
    """Recompute the verdicts of one report op entry from its stored metrics, in place.

    The tolerance is the op's ``"tolerance_override"`` when present, else
    ``default_tolerance``. Only executors whose status is ``"success"`` or
    ``"difference"`` and that hold ``"metrics"`` are re-derived: their
    ``status`` (via :func:`~torq_gen_config.compare.derive_status`),
    ``tolerance_used`` and ``failure_report`` (an ``accuracy_failure`` report,
    or None on success) are updated. ``"error"`` and ``"unverified"`` entries
    stay as they are. The recommendation is not touched; the caller decides
    (see :func:`recommend_executor`).

    Raises:
        ValueError: the tolerance is invalid, or a metrics dict is malformed.
    """
    override = op_entry.get("tolerance_override")
    tolerance = normalize_tolerance(override if override is not None else default_tolerance)
    for entry in (op_entry.get("executors") or {}).values():
        if entry.get("status") not in ("success", "difference") or not entry.get("metrics"):
            continue
        status, _ = derive_status(entry["metrics"], tolerance)
        entry["status"] = status
        entry["tolerance_used"] = dict(tolerance)
        entry["failure_report"] = None if status == "success" else accuracy_failure_report(entry["metrics"], tolerance)
