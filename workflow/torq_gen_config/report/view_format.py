"""Shared pieces of the ``view`` texts: the console, status colours, number, time and
tolerance formats, tables printed at their natural width, the precision-mode line.

Text from the JSON is printed with markup off (:func:`_line`), never as rich markup.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Mapping

from ..core.lazy import rich_console, rich_measure, rich_table, rich_text
from ..core.statuses import INCONCLUSIVE, SUCCESS, TERMINAL_STYLES
from .recommend import is_reference_fallback
from .text import LAYER_COLUMN_MAX


_PLAIN_WIDTH = 200
_MESSAGE_LINES = 8
_MESSAGE_LINE_CHARS = 200
_LOCATION_RE = re.compile(r"^(\d+):(\d+)$")


@functools.cache
def _view_console_class() -> type:
    """The view's Console class, made on first use (rich is loaded then: core/lazy.py)."""

    class _ViewConsole(rich_console.Console):
        """A rich Console whose closed pipe (`view | head`) reaches the CLI as BrokenPipeError
        (rich's own handling exits with status 1; the CLI exits 0: the reader had enough)."""

        def on_broken_pipe(self) -> None:
            raise BrokenPipeError("the reader closed the output")

    return _ViewConsole


def make_console(file=None, *, force_terminal: bool | None = None) -> rich_console.Console:
    """A console for the view: colours on a terminal, plain text elsewhere.

    When the output is not a terminal (a file, a pipe, a test's buffer) the
    width is fixed wide (``COLUMNS`` when set, else 200) so tables are not
    wrapped at 80 columns.
    """
    _ViewConsole = _view_console_class()
    console = _ViewConsole(file=file, force_terminal=force_terminal, highlight=False)
    if not console.is_terminal:
        width = _PLAIN_WIDTH
        try:
            width = int(os.environ.get("COLUMNS", "")) or width
        except ValueError:
            pass
        console = _ViewConsole(file=file, force_terminal=force_terminal, highlight=False, width=width,
                          no_color=True)
    return console


def _cut(text: str, width: int = LAYER_COLUMN_MAX) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _status_text(status: Any, inconclusive: bool = False) -> rich_text.Text:
    if not status:
        return rich_text.Text("-")
    if status == SUCCESS and inconclusive:
        return rich_text.Text(INCONCLUSIVE, style=TERMINAL_STYLES[INCONCLUSIVE])
    return rich_text.Text(str(status), style=TERMINAL_STYLES.get(str(status), ""))


def _recommended_text(op: Mapping) -> rich_text.Text:
    rec = op.get("recommended_executor")
    user = op.get("recommendation_source") == "user"
    if rec is None and op.get("not_testable_reason") and not user:
        return rich_text.Text("(not testable)", style="magenta")
    if rec is None:
        return rich_text.Text("- (user)" if user else "-", style="bold" if user else "red")
    if user:
        return rich_text.Text(f"{rec} (user)", style="bold cyan")
    status = ((op.get("executors") or {}).get(rec) or {}).get("status")
    if status == "unverified":
        return rich_text.Text(f"{rec} (unverified)", style="magenta")
    if op.get("duplicate_of"):
        return rich_text.Text(f"{rec} (copied from {_cut(str(op['duplicate_of']), 30)})", style="dim")
    if (op.get("reference") or {}).get("dispute"):
        return rich_text.Text(f"{rec} (references disagree)", style="yellow")
    if is_reference_fallback(op.get("reference")):
        return rich_text.Text(f"{rec} (judged against onnx)", style="yellow")
    return rich_text.Text(str(rec))


def _fmt_num(x: Any, spec: str = ".3g") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    try:
        return format(float(x), spec)
    except (TypeError, ValueError):
        return str(x)


def _fmt_ms(x: Any) -> str:
    return "-" if x is None else f"{float(x):.1f}"


def _fmt_tol(tol: Mapping | None) -> str:
    if not tol:
        return "-"
    parts = [f"fp_avg_tol={_fmt_num(tol.get('fp_avg_tol'), 'g')}", f"fp_max_tol={_fmt_num(tol.get('fp_max_tol'), 'g')}"]
    if tol.get("bf16_max_tol") is not None and (tol.get("bf16_max_tol"), tol.get("bf16_avg_tol")) != (
            tol.get("fp_max_tol"), tol.get("fp_avg_tol")):
        parts.append(f"bf16_avg_tol={_fmt_num(tol.get('bf16_avg_tol'), 'g')}")
        parts.append(f"bf16_max_tol={_fmt_num(tol.get('bf16_max_tol'), 'g')}")
    if tol.get("int_atol") is not None:
        parts.append(f"int_atol={tol['int_atol']}")
    return ", ".join(parts)


def _print_table(console: rich_console.Console, table: rich_table.Table) -> None:
    """Print a table at its natural width, even on a narrower terminal (no cell
    is cut: the terminal wraps long lines instead)."""
    needed = rich_measure.Measurement.get(console, console.options.update(width=10_000), table).maximum
    if needed <= console.width:
        console.print(table)
        return
    width = console.width
    console.width = needed  # rich caps print(width=...) at the console width
    try:
        console.print(table)
    finally:
        console.width = width


def _line(console: rich_console.Console, text: str = "", style: str | None = None) -> None:
    console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)


def precision_text(report: Mapping) -> str | None:
    """One line about the precision mode of a report (docs/precision.md), or None."""
    flags = ((report.get("precision") or {}).get("flags") or {})
    parts = []
    if flags.get("auto_convert_bf16"):
        parts.append("bf16 (converted from fp32)")
    if flags.get("auto_convert_int32"):
        parts.append("int32 (converted from int64)")
    if flags.get("quantize"):
        q = (report.get("precision") or {}).get("quantization") or {}
        fmt = q.get("format_used") or flags.get("quant_format")
        extra = [x for x, on in (("per-channel", flags.get("per_channel")), ("full-integer", flags.get("full_integer")))
                 if on]
        parts.append(f"int8 quantized ({fmt}{', ' + ', '.join(extra) if extra else ''}); "
                     "fused layers have no MLIR location")
    return "; ".join(parts) or None
