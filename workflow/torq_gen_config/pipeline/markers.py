"""Files beside a job's output that decide whether the next run redoes the job: the
skip-mode "skipped" placeholder and the timeout record (the limit a job timed out under).

The rules read them while the DAG is built, which must not write anything: a job's
rerun param (:func:`skipped_rerun_token`, :func:`timeout_rerun_token`) changes when a
marker asks for a rerun, and the rerun renames that marker so that the param keeps
its value afterwards (:func:`consume_rerun_marker`)."""

from __future__ import annotations

import os
from pathlib import Path

from ..core.limits import DEFAULT_TIMEOUT_S

#: File next to a result.json that was written as "skipped" (skip mode).
SKIPPED_MARKER = ".skipped"
#: Suffix of the file beside a job's output when that output records a timeout: it
#: holds the limit (s) in force, so that a run with a larger ``--timeout`` redoes the
#: job instead of keeping a verdict a longer limit might change.
TIMED_OUT_SUFFIX = ".timed-out"


def was_skipped(result_dir: str) -> bool:
    """True when the result in ``result_dir`` is a skip-mode "skipped" placeholder."""
    return os.path.exists(os.path.join(result_dir, SKIPPED_MARKER))


def record_timeout(output: str, timed_out: bool, timeout_s: float | None) -> None:
    """Write (``timed_out``) or remove the timeout record of ``output`` (see
    :data:`TIMED_OUT_SUFFIX`); ``timeout_s`` in seconds (None: the default limit)."""

    record = Path(output + TIMED_OUT_SUFFIX)
    if timed_out:
        record.write_text(f"{float(timeout_s or DEFAULT_TIMEOUT_S):g}\n")
    else:
        record.unlink(missing_ok=True)


#: Suffix of a skip or timeout marker that a rerun has dealt with (renamed, so its
#: mtime, the rerun param's value, stays the same: the next run reruns nothing).
DONE_SUFFIX = ".done"


def _token(path: str) -> str | None:
    try:
        return str(os.stat(path).st_mtime_ns)
    except FileNotFoundError:
        return None


def skipped_rerun_token(result_dir: str, skip_mode: bool) -> str | None:
    """Read-only (DAG building): a test job's rerun param for skip mode. Outside skip
    mode, a "skipped" placeholder in ``result_dir`` gives a new value (the marker's
    mtime, ns, as text), which reruns the job ("params" rerun trigger); otherwise the
    value of the last placeholder a rerun replaced (:func:`consume_rerun_marker`), or None."""
    marker = os.path.join(result_dir, SKIPPED_MARKER)
    return (None if skip_mode else _token(marker)) or _token(marker + DONE_SUFFIX)


def timeout_rerun_token(output: str, timeout_s: float | None) -> str | None:
    """Read-only (DAG building): the rerun param of the job of ``output``. When that
    output records a timeout under a smaller limit than ``timeout_s`` (seconds) now,
    a new value (the record's mtime, ns, as text) that reruns the job; otherwise the
    value of the last record a rerun dealt with (:func:`consume_rerun_marker`), or None.
    A stat per output when nothing timed out."""

    record = output + TIMED_OUT_SUFFIX
    try:  # os.open, not Path.read_text: this runs for every output of a 5,000-layer model
        fd = os.open(record, os.O_RDONLY)
    except OSError:
        return _token(record + DONE_SUFFIX)
    try:
        limit = float(os.read(fd, 64).decode().strip())
    except (OSError, ValueError, UnicodeDecodeError):
        limit = None
    finally:
        os.close(fd)
    if limit is not None and limit < float(timeout_s or DEFAULT_TIMEOUT_S):
        return _token(record)
    return _token(record + DONE_SUFFIX)


def consume_rerun_marker(marker: str, token: str | None) -> None:
    """In a job, before it writes its output: when ``token`` (its rerun param) names
    the current ``marker`` (a skip marker or a timeout record), rename the marker to
    ``<marker>.done``; its mtime stays, so the next run computes the same param."""
    if token is not None and _token(marker) == token:
        os.replace(marker, marker + DONE_SUFFIX)


def timed_out_under_smaller(output: str, timeout_s: float | None) -> bool:
    """Whether ``output`` records a timeout under a smaller limit than ``timeout_s``
    (seconds) now: the job that made it must run again (read-only)."""
    try:
        return float(Path(output + TIMED_OUT_SUFFIX).read_text().strip()) < float(timeout_s or DEFAULT_TIMEOUT_S)
    except (OSError, ValueError):
        return False


def consume_marker(marker: str) -> None:
    """Rename a live ``marker`` to ``<marker>.done`` (its mtime, the rerun param's
    value, stays): the rerun it asked for is being done (:func:`consume_rerun_marker`
    when the token is the marker's own)."""
    consume_rerun_marker(marker, _token(marker))

