"""Job logs: the one way a record is appended to a job's log file, and to the file all
jobs share (``--log-file``).

A record is ``=== <local time, ISO 8601 with offset> <text>`` followed by an empty
line; tools (:mod:`torq_gen_config.core.tools`) put the command, status and output in the
text, the backends and job steps a line of what they did. Appending creates the
parent directory; ``None`` as the path writes nothing.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

from .lazy import filelock

__all__ = ["append_record", "append_to_shared_log", "timestamp"]


def timestamp() -> str:
    """Local time with its UTC offset, to the second (``2026-12-01T19:04:05+00:00``)."""
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


def append_record(log_path: str | os.PathLike | None, text: str) -> None:
    """Append one record (``=== <timestamp> <text>``, then an empty line) to ``log_path``.

    Raises:
        OSError: the directory or file cannot be written.
    """
    if not log_path:
        return
    path = Path(log_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"=== {timestamp()} {text.rstrip()}\n\n")


def fold_log(layer_log: str | os.PathLike | None, into: str | os.PathLike, title: str) -> None:
    """Move a per-layer log into its unit job's log: its text appended under a ``---
    title ---`` heading to ``into``, then the per-layer file removed (a 1,000-layer model
    keeps a few hundred log files instead of thousands of 4 KB blocks). No-op when the
    per-layer log does not exist.

    Raises:
        OSError: ``into`` cannot be written.
    """
    if not layer_log:
        return
    try:
        text = Path(layer_log).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return
    Path(into).parent.mkdir(parents=True, exist_ok=True)
    with open(into, "a", encoding="utf-8") as f:
        f.write(f"--- {title} ({layer_log}, folded in) ---\n{text.rstrip()}\n\n")
    Path(layer_log).unlink(missing_ok=True)


def append_to_shared_log(log_file: str | os.PathLike, title: str, text: str) -> None:
    """Append one job's whole log under a ``##### title #####`` heading to the file all
    jobs share (``--log-file``), holding its lock (``<log_file>.lock``, filelock) so
    jobs running at once do not interleave.

    Raises:
        OSError: the file cannot be written.
    """
    log_file = os.fspath(log_file)
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(log_file + ".lock"):
        with open(log_file, "a", encoding="utf-8") as f:
            f.write(f"\n##### {title} #####\n{text}")
