"""What the HTML report shows of each (layer, executor) verdict: its display status
(``success*`` for an inconclusive success, ``not tested`` where the executor has no
entry), one line for hovering and a small detail record for clicking. Read from the
report JSON only; nothing is re-judged here."""

from __future__ import annotations

from html import escape
from typing import Mapping

from ..compare import shown_status
from ..core.statuses import DISPLAY_STATUSES, ERROR, NOT_TESTED
from .recommend import duration_ms, runtime_median_ms

#: Colours of the executors, in priority order (the model graph and the Model Explorer
#: overlays: one executor has one colour in both).
EXECUTOR_PALETTE = ("#1e88e5", "#43a047", "#fb8c00", "#8e24aa", "#00acc1", "#f4511e", "#6d4c41", "#c0ca33",
                    "#3949ab", "#d81b60")
#: Longest tool message kept per cell in the page (characters); the JSON has all of it.
MESSAGE_CHARS = 3000


def cell_status(entry: Mapping | None) -> str:
    """The display status of one executor entry (None: the executor has no entry)."""
    if not entry:
        return NOT_TESTED
    status = shown_status(entry)
    return status if status in DISPLAY_STATUSES else ERROR


def executor_names(report: Mapping) -> list[str]:
    """The report's executors in priority order (``executors``: names, or dicts with a name);
    a report without that list (older ones, the original tool's): the executors of its
    layers in order of appearance."""
    out = []
    for e in report.get("executors") or []:
        name = e.get("name") if isinstance(e, Mapping) else e
        if isinstance(name, str):
            out.append(name)
    if out:
        return out
    for op in (report.get("ops") or {}).values():
        for name in (op.get("executors") or {}) if isinstance(op, Mapping) else ():
            if name not in out:
                out.append(name)
    return out


def _num(x) -> str:
    if x is None:
        return "n/a"
    try:
        return f"{float(x):.3g}"
    except (TypeError, ValueError):
        return str(x)


def cell_detail(layer_id: str, op: Mapping, executor: str) -> dict:
    """The click detail of one cell: ``layer``, ``executor``, ``status`` (display status),
    ``stage``, ``summary``, ``message`` (cut to :data:`MESSAGE_CHARS`), ``metrics``
    (``max_rel_diff``, ``mean_rel_diff``, ``max_abs_diff``, ``cosine_similarity``),
    ``timing_ms`` (``compile``, ``run``, ``runtime_median``), ``inconclusive_reasons``,
    ``reference`` (``status``, ``used``: the engine judged against, ``agrees_with``),
    ``reference_fallback`` (when judged against the spec because ONNX Runtime failed),
    ``recommended`` (bool), and
    ``duplicate_of`` / ``not_testable`` / ``skipped_reason`` of the layer when set."""
    entry = (op.get("executors") or {}).get(executor)
    fr = (entry or {}).get("failure_report") or {}
    m = (entry or {}).get("metrics") or {}
    t = (entry or {}).get("timing") or {}
    message = fr.get("message") or ""
    detail = {
        "layer": layer_id,
        "op_type": op.get("op_type"),
        "executor": executor,
        "status": cell_status(entry),
        "stage": fr.get("stage"),
        "summary": fr.get("summary"),
        "message": message[:MESSAGE_CHARS] + (" ..." if len(message) > MESSAGE_CHARS else ""),
        "metrics": {k: m.get(k) for k in ("max_rel_diff", "mean_rel_diff", "max_abs_diff", "cosine_similarity")},
        "timing_ms": {"compile": duration_ms(t.get("compile_ms")), "run": duration_ms(t.get("run_ms")),
                      "runtime_median": runtime_median_ms(entry) if entry else None},
        "inconclusive_reasons": list(m.get("inconclusive_reasons") or []),
        "reference": {"status": (entry or {}).get("reference_status"),
                      "used": (entry or {}).get("reference_used"),
                      "agrees_with": ((entry or {}).get("reference_check") or {}).get("agrees_with")},
        "recommended": op.get("recommended_executor") == executor,
    }
    if (entry or {}).get("reference_fallback"):  # judged against the spec: ONNX Runtime failed on the layer
        detail["reference_fallback"] = entry["reference_fallback"]
    for key in ("duplicate_of", "not_testable_reason", "skipped_reason"):
        if op.get(key):
            detail[key] = op[key]
    dispute = (op.get("reference") or {}).get("dispute")
    if dispute:
        detail["reference_dispute"] = dispute.get("summary")
    return detail


def cell_hover(detail: Mapping) -> str:
    """One hover text (HTML with ``<br>``, already escaped) of a cell detail."""
    lines = [f"<b>{escape(detail['layer'])}</b> on <b>{escape(detail['executor'])}</b>: {escape(detail['status'])}"
             + (" (recommended)" if detail.get("recommended") else "")]
    if detail.get("summary"):
        stage = f"[{detail['stage']}] " if detail.get("stage") else ""
        lines.append(escape(stage + str(detail["summary"])[:160]))
    m = detail.get("metrics") or {}
    if any(v is not None for v in m.values()):
        lines.append(f"max rel {_num(m.get('max_rel_diff'))}, mean rel {_num(m.get('mean_rel_diff'))}, "
                     f"max abs {_num(m.get('max_abs_diff'))}, cosine {_num(m.get('cosine_similarity'))}")
    t = detail.get("timing_ms") or {}
    if any(v is not None for v in t.values()):
        parts = [f"compile {_num(t.get('compile'))} ms", f"run {_num(t.get('run'))} ms"]
        if t.get("runtime_median") is not None:
            parts.append(f"runtime median {_num(t['runtime_median'])} ms")
        lines.append(", ".join(parts))
    if detail.get("inconclusive_reasons"):
        lines.append("inconclusive: " + escape(str(detail["inconclusive_reasons"][0])[:160]))
    if detail.get("reference_dispute"):
        lines.append("reference dispute: " + escape(str(detail["reference_dispute"])[:160]))
    if detail.get("reference_fallback"):
        lines.append(escape(str(detail["reference_fallback"])[:160]) + " - no second opinion")
    for key, label in (("duplicate_of", "copy of"), ("not_testable_reason", "not testable"),
                       ("skipped_reason", "not tested")):
        if detail.get(key):
            lines.append(f"{label}: {escape(str(detail[key])[:160])}")
    lines.append("<i>click for the full message</i>")
    return "<br>".join(lines)


def executor_colors(names: list[str]) -> dict[str, str]:
    """``{executor: colour}`` for ``names`` in priority order (:data:`EXECUTOR_PALETTE`, repeated
    past its end)."""
    return {n: EXECUTOR_PALETTE[i % len(EXECUTOR_PALETTE)] for i, n in enumerate(names)}
