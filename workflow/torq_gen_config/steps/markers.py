"""Files beside a job's output that decide whether the next run redoes the job: the
skip-mode "skipped" placeholder and the timeout record (the limit a job timed out under).

The rules read them while the DAG is built, which must not write anything: they name
a rerun marker (:func:`skipped_rerun_marker`, :func:`timeout_rerun_marker`) that rule
``rerun_marker`` creates when the jobs run."""

from __future__ import annotations

import os
from pathlib import Path

#: File next to a result.json that was written as "skipped" (skip mode).
SKIPPED_MARKER = ".skipped"
_RERUN_MARKER = ".rerun"


def was_skipped(result_dir: str) -> bool:
    """True when the result in ``result_dir`` is a skip-mode "skipped" placeholder."""
    return os.path.exists(os.path.join(result_dir, SKIPPED_MARKER))


def mark_for_rerun(result_dir: str) -> str:
    """Return a marker file newer than the result in ``result_dir`` (touching it when
    needed), used as an extra input so that Snakemake reruns that job: a verdict
    skipped in skip mode is produced by the next run without skip mode. Writes: the
    rules use :func:`skipped_rerun_marker` instead."""
    return _newer_marker(os.path.join(result_dir, "result.json"), os.path.join(result_dir, _RERUN_MARKER))


#: Suffix of the file beside a job's output when that output records a timeout: it
#: holds the limit (s) in force, so that a run with a larger ``--timeout`` redoes the
#: job instead of keeping a verdict a longer limit might change.
TIMED_OUT_SUFFIX = ".timed-out"


def record_timeout(output: str, timed_out: bool, timeout_s: float | None) -> None:
    """Write (``timed_out``) or remove the timeout record of ``output`` (see
    :data:`TIMED_OUT_SUFFIX`); ``timeout_s`` in seconds (None: the default limit)."""
    from ..reference import DEFAULT_TIMEOUT_S

    record = Path(output + TIMED_OUT_SUFFIX)
    if timed_out:
        record.write_text(f"{float(timeout_s or DEFAULT_TIMEOUT_S):g}\n")
    else:
        record.unlink(missing_ok=True)


def rerun_after_timeout(output: str, timeout_s: float | None) -> str | None:
    """A marker input that reruns the job of ``output`` when that output records a
    timeout under a smaller limit than ``timeout_s`` (seconds) now; None otherwise.
    A stat per output when nothing timed out. Writes: the rules use
    :func:`timeout_rerun_marker` instead."""
    from ..reference import DEFAULT_TIMEOUT_S

    record = output + TIMED_OUT_SUFFIX
    try:
        limit = float(Path(record).read_text().strip())
    except (OSError, ValueError):
        return None
    if limit >= float(timeout_s or DEFAULT_TIMEOUT_S):
        return None
    return _newer_marker(output, output + _RERUN_MARKER)


def _newer_marker(output: str, marker: str) -> str:
    """``marker``, touched when needed so that it is newer than ``output``."""
    result = output
    try:
        if os.stat(marker).st_mtime_ns > os.stat(result).st_mtime_ns:
            return marker
    except FileNotFoundError:
        pass
    Path(marker).touch()
    if os.path.exists(result) and os.stat(marker).st_mtime_ns <= os.stat(result).st_mtime_ns:
        st = os.stat(result)
        os.utime(marker, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    return marker


def _rerun_marker_name(output: str) -> str | None:
    # <output>.rerun-<mtime of output in ns>: new for every skipped or timed-out
    # version of the output, so a marker made for an earlier one never stands in
    try:
        return f"{output}.rerun-{os.stat(output).st_mtime_ns}"
    except FileNotFoundError:  # no output: the job runs anyway
        return None


def skipped_rerun_marker(result_dir: str) -> str | None:
    """Without writing anything (DAG building): the rerun marker input of the test job
    whose result in ``result_dir`` is a skip-mode "skipped" placeholder, else None.
    Rule ``rerun_marker`` creates it, so the job runs again after it."""
    return _rerun_marker_name(os.path.join(result_dir, "result.json")) if was_skipped(result_dir) else None


def timeout_rerun_marker(output: str, timeout_s: float | None) -> str | None:
    """Without writing anything (DAG building): the rerun marker input of the job of
    ``output`` when that output records a timeout under a smaller limit than
    ``timeout_s`` (seconds) now, else None. A stat per output when nothing timed out."""
    from ..reference import DEFAULT_TIMEOUT_S

    try:
        limit = float(Path(output + TIMED_OUT_SUFFIX).read_text().strip())
    except (OSError, ValueError):
        return None
    if limit >= float(timeout_s or DEFAULT_TIMEOUT_S):
        return None
    return _rerun_marker_name(output)


def write_rerun_marker(marker: str) -> None:
    """Rule ``rerun_marker``: create ``marker`` (empty) and remove the older rerun
    markers of the same output (made for an earlier skipped or timed-out version)."""
    output, _, _ = marker.rpartition(".rerun-")
    for old in Path(output).parent.glob(Path(output).name + ".rerun-*"):
        if str(old) != marker:
            old.unlink(missing_ok=True)
    Path(marker).parent.mkdir(parents=True, exist_ok=True)
    Path(marker).touch()
