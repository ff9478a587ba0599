"""Choice of the recommended executor per layer, and status re-derivation.

The rule follows the original tool's (docs/original_tool.md, 'Recommendation'):
executors are tried in the configured priority order; the first one whose
output matches the reference wins, else the first that ran but differs. This
project adds a third level for ``"unverified"`` runs (the executor ran but the
reference failed on that layer, so nothing could be compared): better than no
executor at all, but flagged in the report. A layer whose every tested
executor has status ``"error"`` is a critical failure, as in the
original tool.

With ``by_timing`` (the original tool's ``--recommend-by-timing``)
the fastest success by measured runtime median wins, else the fastest
difference; where no candidate has a measured runtime the priority rule
applies and the reason says so (the original tool returned no recommendation
there). :func:`recommend_with_reason` returns the choice and that reason.
"""

from __future__ import annotations

import math
from typing import Mapping

from ..compare import derive_status, normalize_tolerance, status_details
from ..core.limits import MESSAGE_CHARS as _MESSAGE_MAX_CHARS
from ..core.statuses import STATUSES
from ..reference.reference_run import SPEC_FLOAT64, engine_label


_RECOMMENDATION_ORDER = ("success", "difference", "unverified")


def _status_of(executor: str, result: Mapping) -> str:
    if not isinstance(result, Mapping):
        raise ValueError(f"result of executor {executor!r} must be a dict, got {type(result).__name__}")
    status = result.get("status")
    if status not in STATUSES:
        raise ValueError(f"executor {executor!r} has invalid status {status!r}; expected one of {list(STATUSES)}")
    return status


#: ``recommendation_reason`` values (the fastest-* ones are built by :func:`recommend_with_reason`).
REASON_PRIORITY = "priority"
REASON_NO_TIMING = "priority (no timing data)"
REASON_NO_TIMED_STATUS = "priority (no success or difference)"
REASON_NONE = "no working executor"
REASON_NOT_TESTED = "not tested"
REASON_NOT_TESTABLE = "not testable"
REASON_USER = "user"
_FASTEST_PREFIX = "fastest "


def runtime_median_ms(result: Mapping) -> float | None:
    """The measured runtime median (ms) of one result, or None when there is none.

    Accepts a report executor entry (``timing.median_ms``, 4 decimals, else the
    original tool's ``timing.runtime_ms``) and a layer-test result
    (``timing.runtime.median_ms``). Non-finite or negative values count as
    missing.
    """
    timing = result.get("timing") if isinstance(result, Mapping) else None
    if not isinstance(timing, Mapping):
        return None
    value = timing.get("median_ms")
    if value is None and isinstance(timing.get("runtime"), Mapping):
        value = timing["runtime"].get("median_ms")
    if value is None:
        value = timing.get("runtime_ms")
    return duration_ms(value)


def duration_ms(value) -> float | None:
    """A duration in milliseconds as a finite, non-negative float, else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


def is_timing_reason(reason: str | None) -> bool:
    """True when ``reason`` says the recommendation was chosen by runtime."""
    return isinstance(reason, str) and reason.startswith(_FASTEST_PREFIX)


def recommend_with_reason(results: Mapping[str, Mapping], priority: list[str],
                          by_timing: bool = False) -> tuple[str | None, str]:
    """Recommended executor of one layer and why it was chosen.

    Args:
        results: executor name -> result dict (``"status"``; for ``by_timing``
            also the runtime, see :func:`runtime_median_ms`).
        priority: configured executor names, highest priority first.
        by_timing: choose by measured runtime instead of priority.

    Returns:
        ``(name, reason)``. Without ``by_timing``: :func:`recommend_executor`'s
        choice and ``"priority"`` (``"no working executor"`` when None). With
        ``by_timing``: among the ``success`` executors that have a runtime
        median, the lowest (ties: priority order), reason e.g. ``"fastest
        success (0.123 ms median)"``; when there is no success, the same among
        the ``difference`` executors (``"fastest difference (...)"``).
        Executors without a runtime are ignored for that choice. When the best
        status present has no runtime at all (timing was not collected, or its
        measurement failed), the priority rule decides and the reason is
        ``"priority (no timing data)"``; when no executor has a success or a
        difference, ``"priority (no success or difference)"`` (an unverified
        run may still be recommended) or ``"no working executor"``. A timed
        difference never wins over an untimed success.

    Raises:
        ValueError: a considered result has no valid status.
    """
    name = recommend_executor(results, priority)
    if not by_timing:
        return name, REASON_PRIORITY if name is not None else REASON_NONE
    statuses = {n: _status_of(n, results[n]) for n in priority if n in results}
    for wanted in ("success", "difference"):
        candidates = [n for n in priority if statuses.get(n) == wanted]
        if not candidates:
            continue
        timed = [(runtime_median_ms(results[n]), i, n) for i, n in enumerate(candidates)]
        timed = [t for t in timed if t[0] is not None]
        if not timed:
            return name, REASON_NO_TIMING
        ms, _, best = min(timed)
        return best, f"{_FASTEST_PREFIX}{wanted} ({ms:.3f} ms median)"
    return name, REASON_NO_TIMED_STATUS if name is not None else REASON_NONE


def recommend_executor(results: Mapping[str, Mapping], priority: list[str], by_timing: bool = False) -> str | None:
    """Recommended executor of one layer.

    Args:
        results: executor name -> result dict (needs ``"status"``, one of
            ``success|difference|error|unverified``).
        priority: configured executor names, highest priority first.
        by_timing: choose the fastest success (else difference) by runtime
            median, see :func:`recommend_with_reason` (which also says why).

    Returns:
        Without ``by_timing``: the first executor in ``priority`` order with a conclusive
        ``"success"``; else the first ``"success"`` whose comparison was inconclusive
        (:func:`is_inconclusive`); else the first with ``"difference"``; else the first ``"unverified"``;
        else None (no executor ran: critical failure, or nothing tested).
        Executors in ``priority`` but missing from ``results`` are ignored, as
        are results of executors not in ``priority``. Source: docs/original_tool.md,
        'Recommendation', plus the ``unverified`` level of this project.

    Raises:
        ValueError: a considered result has no valid status.
    """
    if by_timing:
        return recommend_with_reason(results, priority, by_timing=True)[0]
    statuses = {name: _status_of(name, results[name]) for name in priority if name in results}
    for wanted in _RECOMMENDATION_ORDER:
        for conclusive in ((True, False) if wanted == "success" else (None,)):
            for name in priority:
                if statuses.get(name) != wanted or (conclusive is not None and is_inconclusive(results[name]) == conclusive):
                    continue
                if wanted == "unverified" and not executor_ran(results[name]):
                    continue  # it failed at run time too: nothing says it works
                return name
    return None


def executor_ran(result: Mapping) -> bool:
    """False for an ``unverified`` result whose executor failed at run time on the
    inputs the reference failed on too (``failure_report.during == "run"``): not the
    executor's fault, but no evidence that it works either."""
    if not isinstance(result, Mapping) or result.get("status") != "unverified":
        return True
    return (result.get("failure_report") or {}).get("during") != "run"


def is_inconclusive(result: Mapping) -> bool:
    """True when a result's comparison could not have failed for outputs of the
    reference's magnitude (``metrics["inconclusive"]``, docs/comparison.md)."""
    return bool((result.get("metrics") or {}).get("inconclusive")) if isinstance(result, Mapping) else False


def is_critical_failure(results: Mapping[str, Mapping]) -> bool:
    """True iff at least one executor was tested and every tested one is ``"error"``,
    or ``"unverified"`` after failing at run time (:func:`executor_ran`): none ran.

    A ``"difference"`` or an ``"unverified"`` run that produced outputs is not
    critical (the layer can still run somewhere); a layer with no tested executors
    (skipped) is not critical either. Source: docs/original_tool.md,
    'Recommendation'.

    Raises:
        ValueError: a result has no valid status.
    """
    tested = [(name, res) for name, res in results.items() if _status_of(name, res) != "skipped"]
    return bool(tested) and all(res["status"] == "error" or not executor_ran(res) for _, res in tested)


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
    # the second opinion and the dispute of the two references follow the same tolerance
    for entry in (op_entry.get("executors") or {}).values():
        if entry.get("reference_check"):
            entry["reference_check"].update(reference_agreement(entry, tolerance))
    if op_entry.get("reference"):
        op_entry["reference"]["dispute"] = reference_dispute(op_entry["reference"], tolerance)


def reference_used(reference: Mapping | None) -> str | None:
    """The engine a layer's verdicts were computed against, from a result's or an op's
    ``reference`` (``engine``, ``status``, ``used``): ``used`` where recorded (``onnx``
    for a layer judged against the spec because ONNX Runtime failed on it,
    :func:`torq_gen_config.reference.judged_reference`), else the configured engine
    when it ran (results written before ``used`` existed), else None (no reference:
    the verdicts are ``unverified``)."""
    if not isinstance(reference, Mapping) or not reference:
        return None
    if "used" in reference:
        return reference["used"]
    return (reference.get("engine") or "onnxruntime") if reference.get("status") == "ok" else None


def is_reference_fallback(reference: Mapping | None) -> bool:
    """True when a layer's verdicts rest on an engine other than the configured one
    because it failed (ONNX Runtime failed on it, the spec ran: :func:`reference_used`);
    not where the spec in float64 settled a dispute (:func:`reference_dispute` says so)."""
    used = reference_used(reference)
    return used not in (None, SPEC_FLOAT64) and used != (reference.get("engine") or "onnxruntime")


def reference_agreement(entry: Mapping, tolerance: Mapping) -> dict:
    """Whether one executor's outputs agree with each reference engine.

    Args:
        entry: a report executor entry (``status``, ``metrics`` against the reference
            the verdict rests on, ``reference_used`` (that engine; ``reference_engine``,
            the configured one, where absent), ``reference_check`` = ``{"engine",
            "metrics"}`` against the second engine). A check against the engine the
            verdict already rests on (a fallback) is not a second opinion and is not
            counted twice.
        tolerance: the layer's effective tolerance.

    Returns:
        ``{"agrees_with": [engines within tolerance], "differs_from": [engines
        outside it], "summary": one line}`` (an engine without a usable output is in
        neither list). Source: issue "a second reference"; the rule is the same
        comparison as the verdict (docs/comparison.md).
    """
    agrees, differs = [], []
    primary = entry.get("reference_used") or entry.get("reference_engine") or "onnxruntime"
    if entry.get("metrics") and entry.get("status") in ("success", "difference"):
        (agrees if derive_status(entry["metrics"], tolerance)[0] == "success" else differs).append(primary)
    check = entry.get("reference_check") or {}
    second = check.get("engine")
    if second and second not in agrees + differs and check.get("metrics"):
        (agrees if derive_status(check["metrics"], tolerance)[0] == "success" else differs).append(second)
    labels = {e: engine_label(e) for e in agrees + differs}
    if agrees and not differs:
        summary = "agrees with " + (" and ".join(labels[e] for e in agrees) if len(agrees) > 1 else labels[agrees[0]])
    elif agrees and differs:
        summary = f"agrees with {labels[agrees[0]]}, not with {labels[differs[0]]}"
    elif differs:
        summary = "agrees with neither reference" if len(differs) > 1 else f"differs from {labels[differs[0]]}"
    else:
        summary = "no reference to compare with"
    return {"agrees_with": agrees, "differs_from": differs, "summary": summary}


def reference_dispute(reference: Mapping, tolerance: Mapping) -> dict | None:
    """The dispute of the two reference engines on one layer, or None when they agree
    (or one of them did not run).

    ``reference["engines_agreement"]`` holds the metrics of ONNX Runtime's outputs
    against the ONNX reference implementation's (the spec's); they disagree when that
    comparison is a ``difference`` under ``tolerance``.

    Returns:
        ``{"summary": one line}`` naming the disagreement, or None.
    """
    metrics = reference.get("engines_agreement")
    if not metrics:
        return None
    status, summary = derive_status(metrics, tolerance)
    if status == "success":
        return None
    text = f"ONNX Runtime and the ONNX reference implementation disagree: {summary}"
    arbiter = reference.get("arbiter") or {}
    if arbiter.get("status") == "ok" and arbiter.get("agreement"):
        sides = [e for e, m in arbiter["agreement"].items() if derive_status(m, tolerance)[0] == "success"]
        verdict = ("the spec in float64 sides with " + " and ".join(engine_label(e) for e in sides) if sides
                   else "the spec in float64 sides with neither")
        return {"summary": f"{text}; {verdict}: the verdicts rest on it", "spec_sides_with": sides}
    if arbiter:
        return {"summary": f"{text}; the spec in float64 could not settle it ({arbiter.get('status')}: "
                           f"{str(arbiter.get('message') or '')[:200]})", "spec_sides_with": None}
    return {"summary": text}
