"""The ``view`` text of a compiler JSON: total, executor distribution, assignments by
``line:col``."""

from __future__ import annotations

from typing import Any, Mapping

from ..core.lazy import rich_console
from .view_format import _LOCATION_RE, _line


def sorted_assignments(op_assignments: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``(location, executor)`` pairs sorted by line, then column, as numbers;
    keys that are not ``line:col`` come last, in string order."""

    def key(item):
        m = _LOCATION_RE.match(str(item[0]))
        return (0, int(m.group(1)), int(m.group(2)), "") if m else (1, 0, 0, str(item[0]))

    pairs = []
    for loc, val in op_assignments.items():
        executor = val.get("executor") if isinstance(val, Mapping) else val
        pairs.append((str(loc), executor))
    return sorted(pairs, key=key)


def render_compiler(data: Mapping, console: rich_console.Console, model: str | None = None) -> None:
    """A compiler JSON: total, distribution per executor, assignments by line:col.
    ``model``: the name to show (default: its ``model_name``)."""
    pairs = sorted_assignments(data.get("op_assignments") or {})
    _line(console, "=" * 60)
    _line(console, f"MODEL: {model or data.get('model_name')} (compiler format)", style="bold")
    _line(console, "=" * 60)
    _line(console)
    _line(console, f"Total assignments: {len(pairs)}")
    _line(console)
    dist: dict[str, int] = {}
    for _, ex in pairs:
        dist[str(ex)] = dist.get(str(ex), 0) + 1
    _line(console, "Executor distribution:", style="bold")
    for name, n in sorted(dist.items(), key=lambda kv: (-kv[1], kv[0])):
        _line(console, f"  {name}: {n}")
    _line(console)
    _line(console, "Assignments:", style="bold")
    for loc, ex in pairs:
        _line(console, f"  {loc} -> {ex}")

