"""Choosing layers of a report by ID or pattern (``edit --layer``, ``view --layer``),
with close matches when nothing matches, and the ``edit --list`` rows."""

from __future__ import annotations

import fnmatch
from typing import Mapping

from ..core.errors import ConfigError, ReportError
from ..core.lazy import difflib

ALL_LAYERS = "ALL"
"""``--layer`` value that matches every layer."""

_MAX_CLOSE = 10


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

    Strategies, first that applies (the original tool's: docs/original_tool.md, 'edit'):

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
