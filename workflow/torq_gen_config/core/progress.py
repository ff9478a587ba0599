"""What a person sees while ``discover`` and ``run`` work: one progress display instead of
Snakemake's block per job.

:class:`ProgressDisplay` is a ``logging`` handler put on Snakemake's logger in place of its
console handler (Snakemake's log handler hook; :func:`torq_gen_config.pipeline.workflow_api.execute`
installs it). It follows Snakemake's events (``PROGRESS``: done / total jobs; ``JOB_INFO`` /
``JOB_FINISHED``: what runs now) and the verdicts the layer jobs hand it as records
(:func:`job_verdict`: the status, counted as given, and the job's one-line summary; no
text is parsed back), and shows:

- on a terminal (``live``): a live display on stderr (bar, done / total jobs, verdicts so far
  per status, elapsed and remaining time, the jobs running now); verdicts other than
  ``success``/``skipped`` and any other line the jobs print appear above it, also what worker
  processes write to the descriptors (:class:`_FdCapture`), except ONNX Runtime's own log
  lines, which go only to ``log_file``;
- elsewhere (``lines``): the jobs' lines as they are, plus a progress line on stderr at each
  tenth of the jobs (and at most every :data:`LINE_EVERY_S` seconds otherwise);

and a one-line summary at the end. Snakemake's errors and warnings always get through,
formatted as Snakemake formats them; its per-job blocks only go to ``log_file`` (the
``--log-file`` of the run), or to the console with ``-v`` (then this display is not used).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from typing import Any, Callable
from pathlib import Path

from .lazy import (filelock, rich_console, rich_live, rich_progress_bar, rich_table, rich_text,
                   snakemake_logger_plugins, snakemake_logging)
from .statuses import INCONCLUSIVE, NOT_TESTED, SKIPPED, STATUSES, SUCCESS, TERMINAL_STYLES

#: The display of this process while one runs (the layer jobs are its threads: they hand
#: it their verdicts, :func:`job_verdict`).
_ACTIVE: list["ProgressDisplay"] = []
#: Verdict order and colours of the counts (:data:`~.statuses.TERMINAL_STYLES`, as in ``view``);
#: ``success*``: a success whose comparison could not have failed (counted apart, its line always shown);
#: ``not tested``: the layers that are not testable (counted in layers, not verdicts).
STATUS_STYLES = {s: TERMINAL_STYLES[s] for s in (SUCCESS, INCONCLUSIVE, *STATUSES[1:], NOT_TESTED)}
#: In ``lines`` mode, the longest time between two progress lines while jobs finish (s),
#: and the shortest (a short run prints only its summary line).
LINE_EVERY_S = 30.0
LINE_MIN_S = 5.0
#: Snakemake's info messages that are passed on (the rest is progress bookkeeping).
_PASS_INFO = ("Nothing to be done",)
#: ONNX Runtime's own log line (``2026-... [W:onnxruntime:, graph.cc:..] ...``, coloured on a terminal).
ORT_LOG_RE = re.compile(r"\[[VIWEF]:onnxruntime:")
_DRAIN = b"\x00torq-gen-config-drain\x00\n"


class _FdCapture:
    """File descriptors 1 and 2 of this process through pipes, for the live display: what
    the worker processes (forked from a forkserver that inherits these descriptors) and
    native libraries write would otherwise land in the middle of the display. One per
    process (:func:`fd_capture`); the pipes stay open for its lifetime (a worker forked
    while the display ran keeps them), and while no display is active, what arrives goes
    on to the original descriptors."""

    def __init__(self):
        self.files: dict = {}  # fd -> a file on what the descriptor was before start()
        self.sink = None  # callable(fd, line) while a display is active
        self._before: dict = {}
        self._pipes, self._drained = {}, {}
        for fd in (1, 2):
            r, w = os.pipe()
            self._pipes[fd] = w
            threading.Thread(target=self._read, args=(fd, r), daemon=True, name=f"torq-gen-config-fd{fd}").start()

    def start(self, sink) -> None:
        """Send fd 1 and 2 to the pipes; lines go to ``sink(fd, line)``."""
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:  # a closed or odd stream: nothing to flush
                pass
        self._before = {fd: os.dup(fd) for fd in (1, 2)}
        self.files = {fd: open(os.dup(self._before[fd]), "w", buffering=1, encoding="utf-8", errors="replace",
                               closefd=True) for fd in (1, 2)}
        self.sink = sink
        for fd, w in self._pipes.items():
            os.dup2(w, fd)

    def stop(self) -> None:
        """Back to the original descriptors, after every line written so far reached the sink."""
        for stream in (sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:
                pass
        for fd in (1, 2):
            before = self._before.pop(fd)
            os.dup2(before, fd)
            os.close(before)
        for fd, w in self._pipes.items():  # a marker through each pipe: all before it was read
            done = self._drained[fd] = threading.Event()
            os.write(w, _DRAIN)
            done.wait(5.0)
        self.sink = None

    def release(self) -> None:
        """Close the files on the original descriptors (after :meth:`stop`)."""
        for fd in list(self.files):
            self.files.pop(fd).close()

    def _read(self, fd: int, r: int) -> None:
        buf = b""
        while True:
            chunk = os.read(r, 65536)
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                marker = _DRAIN.rstrip(b"\n")
                if line.endswith(marker):
                    line = line[: -len(marker)]
                    if line:
                        self._emit(fd, line)
                    event = self._drained.pop(fd, None)
                    if event is not None:
                        event.set()
                    continue
                self._emit(fd, line)

    def _emit(self, fd: int, line: bytes) -> None:
        text = line.decode("utf-8", errors="replace")
        sink = self.sink
        try:
            if sink is not None:
                sink(fd, text)
            else:  # no display: the descriptor is back to what it was, write there
                os.write(fd, (text + "\n").encode("utf-8", errors="replace"))
        except Exception:  # the reader must not die: later lines still need a way out
            pass


_FD_CAPTURE: list = []


def fd_capture() -> _FdCapture:
    """The process's :class:`_FdCapture` (made at first use)."""
    if not _FD_CAPTURE:
        _FD_CAPTURE.append(_FdCapture())
    return _FD_CAPTURE[0]


def job_verdict(status: str, line: str, count: int = 1) -> None:
    """A job's verdict, handed to the progress display of this process as a record: ``status``
    (a shown status, :mod:`.statuses`: ``success``, ``success*``, ``difference``, ...) is
    counted ``count`` times and ``line`` (the job's summary, e.g. ``[llvm-cpu] Conv_r0: success
    (412 ms compile)``; more lines with ``-v``) is printed where job lines go. The split job
    hands ``not tested`` with the number of layers that are not testable. Without a display
    (a cluster job's own process, a library call) the line goes to stdout."""
    display = _ACTIVE[-1] if _ACTIVE else None
    if display is None:
        sys.stdout.write(line.rstrip("\n") + "\n")  # one write: jobs are threads
        sys.stdout.flush()
        return
    display.verdict(status, line.rstrip("\n"), count)


def _hms(seconds: float) -> str:
    seconds = int(round(max(0.0, seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _job_label(rule: str, wildcards: dict) -> str:
    """``Conv_r0 on llvm-cpu`` for a layer test, else the rule and its wildcards."""
    if wildcards.get("layer") and wildcards.get("executor"):
        return f"{wildcards['layer']} on {wildcards['executor']}"
    if wildcards:
        return f"{rule} {' '.join(str(v) for v in wildcards.values())}"
    return rule


#: A unit job's record (pipeline/units.py): ``.../units/<unit>/prepared.json`` or ``<executor>.json``.
_UNIT_RECORD_RE = re.compile(r"(?:^|/)units/(?P<unit>[^/]+)/(?P<name>[^/]+)\.json$")
#: The slurm plugin's message of a failed job: ``SLURM-job '57' failed, SLURM status is: 'CANCELLED'. ...``
_SLURM_STATE_RE = re.compile(r"SLURM status is: '(?P<state>[A-Z_]+)'")
#: What a SLURM job state means, for the one line of a failed job.
SLURM_STATE_WORDS = {"CANCELLED": "cancelled (scancel, or an administrator)", "TIMEOUT": "past its time limit",
                     "NODE_FAIL": "its node failed", "OUT_OF_MEMORY": "out of memory (its mem_mb)", "FAILED": "failed",
                     "PREEMPTED": "preempted", "BOOT_FAIL": "its node did not boot", "DEADLINE": "past its deadline"}


def layers_text(slugs: list[str]) -> str:
    """``layer A``, ``layers A, B`` or ``layers A .. Z (32)``."""
    return (f"layer {slugs[0]}" if len(slugs) == 1 else f"layers {slugs[0]}, {slugs[1]}" if len(slugs) == 2
            else f"layers {slugs[0]} .. {slugs[-1]} ({len(slugs)})")


def unit_label(outputs: list[str]) -> str | None:
    """``unit 0001 on vmvx (layers A .. Z (32))`` for a unit job (its record among ``outputs``;
    the layers from the unit's prepared.json when it is there), else None."""
    for path in outputs:
        m = _UNIT_RECORD_RE.search(str(path))
        if m:
            try:
                members = json.loads((Path(str(path)).parent / "prepared.json").read_text())["members"]
                layers = f" ({layers_text([str(member['slug']) for member in members])})" if members else ""
            except (OSError, ValueError, KeyError, TypeError):
                layers = ""
            return f"unit {m['unit']}" + ("" if m["name"] == "prepared" else f" on {m['name']}") + layers
    return None


def short_error(record: logging.LogRecord) -> str:
    """A failed job in one line: its rule, its unit and the unit's layers (else its first output),
    the SLURM job id and state when it ran on a cluster, and its log (then the SLURM job's, which
    the plugin adds last). Snakemake's block (every input: 200 for the report) is in the log file."""
    outputs = [str(f) for f in (getattr(record, "output", None) or [])]
    logs = [str(f) for f in (getattr(record, "log", None) or []) if f]
    label = unit_label(outputs)
    text = f"job failed: rule {getattr(record, 'rule_name', '?')}" + (
        f", {label}" if label else f" for {outputs[0]}" if outputs else "")
    external = (getattr(record, "aux", None) or {}).get("external_jobid")
    if external:
        m = _SLURM_STATE_RE.search(str(getattr(record, "rule_msg", None) or ""))
        state = f" {m['state']}, {SLURM_STATE_WORDS.get(m['state'], 'failed')}" if m else ""
        text += f": SLURM job {external}{state}"
    log = (logs[-1] if external else logs[0]) if logs else None
    return text + (f" (log: {log})" if log else "")


def _without_traceback(text: str) -> str:
    """Snakemake's error text without the Python stack lines (``  File "...", line N``): the
    exception and its message stay; the stack is in the log file."""
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith('  File "'))


class _LineStream:
    """A stand-in for ``sys.stdout`` / ``sys.stderr`` while the display runs: whole lines
    go to :meth:`ProgressDisplay.job_line` (jobs are threads and write a line at a time)."""

    def __init__(self, display: "ProgressDisplay", original):
        self._display, self._original, self._buf = display, original, ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self._buf += text
            lines = self._buf.split("\n")
            self._buf = lines.pop()
        for line in lines:
            self._display.job_line(line, self._original)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            rest, self._buf = self._buf, ""
        if rest:
            self._display.job_line(rest, self._original)
        self._original.flush()

    def isatty(self) -> bool:
        return self._original.isatty()

    def fileno(self) -> int:
        return self._original.fileno()

    @property
    def encoding(self):
        return getattr(self._original, "encoding", "utf-8")


class ProgressDisplay(logging.Handler):
    """The progress display of one workflow run (see the module docstring).

    Args:
        mode: ``"live"`` (a rich live display; for a terminal) or ``"lines"``.
        what: what is running, for the display's title (``"discovery of m"``).
        log_file: append Snakemake's own messages (its block per job) to this file, under
            the lock the jobs' diagnostics use (``<log_file>.lock``); None: nowhere.
        stopping: returns true once the run was asked to stop (Ctrl-C, SIGTERM); from then
            on Snakemake's error blocks of the jobs it stops (``RuleException: RunStopped``,
            ``Error in rule``) go only to ``log_file``: the caller's one line says what happened.

    Use as a context manager around the run: it replaces ``sys.stdout``/``sys.stderr``
    while it is active and restores them on exit, then prints the summary line.
    """

    def __init__(self, mode: str = "lines", *, what: str = "workflow", log_file: str | None = None,
                 stopping: Callable[[], Any] | None = None):
        super().__init__(level=logging.INFO)
        if mode not in ("live", "lines"):
            raise ValueError(f"mode must be 'live' or 'lines', not {mode!r}")
        self.mode, self.what, self.log_file = mode, what, log_file
        self._stopping = stopping or (lambda: False)
        self.done = self.total = 0
        self.counts: dict[str, int] = {}
        self.running: dict[int, str] = {}
        self._lock = threading.RLock()
        self._start = time.monotonic()
        self._last_line_at = self._start
        self._last_line_done = 0
        self._jobs_started = False
        self._live = None
        self._console = None
        self._saved = None

        self._formatter = snakemake_logging.DefaultFormatter(show_failed_logs=True)

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> "ProgressDisplay":
        self._saved = (sys.stdout, sys.stderr)
        self._capture = None
        err = sys.stderr
        if self.mode == "live":
            try:
                self._capture = fd_capture()
                self._capture.start(self._fd_line)
                # the display writes to the original terminal, never into its own pipe
                out, err = (self._unpiped(s, fd) for s, fd in ((sys.stdout, 1), (sys.stderr, 2)))
                self._saved = (out, err)
            except OSError:  # no descriptors to redirect (an embedded interpreter): lines may cut in
                self._capture = None
        self._console = rich_console.Console(file=err, highlight=False, soft_wrap=True)
        if self.mode == "live":
            self._live = rich_live.Live(get_renderable=self._render, console=self._console, refresh_per_second=4,
                              transient=True, redirect_stdout=False, redirect_stderr=False)
            self._live.start()
        self._saved_streams = (sys.stdout, sys.stderr)
        sys.stdout = _LineStream(self, self._saved[0])
        sys.stderr = _LineStream(self, self._saved[1])
        _ACTIVE.append(self)
        return self

    def _unpiped(self, stream, fd: int):
        """``stream``, or the capture's file on the original descriptor when ``stream``
        writes to ``fd`` (which is about to become a pipe)."""
        try:
            if stream.fileno() == fd:
                return self._capture.files[fd]
        except (AttributeError, OSError, ValueError):  # not a file (a test's StringIO): keep it
            pass
        return stream

    def _fd_line(self, fd: int, line: str) -> None:
        """A line written to fd 1 or 2 by a worker process or native code: ONNX Runtime's
        own log lines go only to the log file; the rest like a job's line."""
        if ORT_LOG_RE.search(line):
            if self.log_file:
                self._append_log(line)
            return
        if self._live is None:  # not started yet: straight to the terminal (never back into the pipe)
            self._capture.files[fd].write(line + "\n")
            return
        self.job_line(line, self._saved[0] if fd == 1 else self._saved[1])

    def __exit__(self, *exc) -> None:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, _LineStream):
                stream.flush()
        if self._live is not None:
            self._live.stop()
        if self._capture is not None:
            self._capture.stop()  # what is still in the pipes is printed now
        sys.stdout, sys.stderr = self._saved_streams
        if self._jobs_started:
            self._console.print(self.summary_line(final=True), highlight=False)
        if self._capture is not None:
            self._capture.release()

    # ------------------------------------------------------------------ what is shown

    def counts_text(self) -> str:
        """``success 12, error 1, not tested 3 layers`` (the verdicts printed so far, in
        :data:`STATUS_STYLES` order; the layers that are not testable last)."""
        return ", ".join(f"{s} {self.counts[s]}{' layers' if s == NOT_TESTED else ''}"
                         for s in STATUS_STYLES if self.counts.get(s))

    def summary_line(self, final: bool = False) -> str:
        """One line: done / total steps (Snakemake's word for jobs), verdicts, elapsed and
        remaining time (a linear estimate from the jobs done so far; the total grows when a
        checkpoint adds the layer jobs)."""
        elapsed = time.monotonic() - self._start
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        verdicts = f"; verdicts: {self.counts_text()}" if self.counts else ""
        if final:
            if not self.done:
                return f"{self.what}: no step finished ({_hms(elapsed)})"
            return f"{self.what}: {self.done} of {self.total} steps done in {_hms(elapsed)}{verdicts}"
        left = ""
        if 0 < self.done < self.total:
            left = f", ~{_hms(elapsed / self.done * (self.total - self.done))} left"
        return f"progress: {self.done} of {self.total} steps{pct}{verdicts}; {_hms(elapsed)} elapsed{left}"

    def _render(self):
        with self._lock:
            elapsed = time.monotonic() - self._start
            head = rich_table.Table.grid(padding=(0, 1))
            Text = rich_text.Text
            head.add_row(Text(self.what, style="bold"),
                         rich_progress_bar.ProgressBar(total=max(self.total, 1), completed=self.done, width=30),
                         Text(f"{self.done}/{self.total} jobs"), Text(f"{_hms(elapsed)} elapsed"),
                         Text(f"~{_hms(elapsed / self.done * (self.total - self.done))} left"
                              if 0 < self.done < self.total else ""))
            counts = Text("verdicts: ")
            for s, style in STATUS_STYLES.items():
                if self.counts.get(s):
                    counts.append(f"{s} {self.counts[s]}{' layers' if s == NOT_TESTED else ''}  ", style=style)
            if not self.counts:
                counts.append("none yet", style="dim")
            now = list(self.running.values())
            running = Text("running: " + (", ".join(now[:4]) + (f" (+{len(now) - 4} more)" if len(now) > 4 else "")
                                          if now else "-"), style="cyan", overflow="ellipsis", no_wrap=True)
            return rich_console.Group(head, counts, running)

    def _print(self, text: str, original=None) -> None:
        """A line above the live display, or to the stream it was written to."""
        if self._live is not None:
            self._console.print(text, highlight=False, markup=False)
        else:
            stream = original or self._saved[1]
            stream.write(text + "\n")
            stream.flush()

    def job_line(self, line: str, original) -> None:
        """A line a job (or a worker process) printed: shown as it is."""
        self._print(line, original)

    def verdict(self, status: str, line: str, count: int = 1) -> None:
        """A job's verdict (:func:`job_verdict`): counted ``count`` times; on a terminal,
        success and skipped verdicts only count (the display shows them), the others are shown."""
        with self._lock:
            self.counts[status] = self.counts.get(status, 0) + count
        if self._live is not None and status in (SUCCESS, SKIPPED):
            return
        self._print(line, self._saved[0])

    # ------------------------------------------------------------------ Snakemake's records

    def emit(self, record: logging.LogRecord) -> None:
        """Follow one Snakemake log record (never raises: a display problem must not stop the run)."""
        try:
            self._emit(record)
        except Exception:  # pragma: no cover - logging must not fail the workflow
            self.handleError(record)

    def _emit(self, record: logging.LogRecord) -> None:
        LogEvent = snakemake_logger_plugins.LogEvent
        event = getattr(record, "event", None)
        if self.log_file and (record.levelno >= logging.INFO):
            self._to_log_file(record)
        with self._lock:
            if event == LogEvent.PROGRESS:
                self.done, self.total = int(record.done), int(record.total)
                self._jobs_started = True
                self._maybe_line()
                return
            if event == LogEvent.JOB_INFO:
                self._jobs_started = True
                self.running[record.jobid] = _job_label(record.rule_name, dict(record.wildcards or {}))
                return
            if event == LogEvent.JOB_FINISHED:
                self.running.pop(record.job_id, None)
                return
        if record.levelno >= logging.WARNING or event in (LogEvent.JOB_ERROR, LogEvent.GROUP_ERROR, LogEvent.ERROR):
            if self._stopping():
                return  # the jobs being stopped: their blocks are in the log file only
            text = short_error(record) if event == LogEvent.JOB_ERROR else _without_traceback(
                self._formatter.format(record))
            if text and text.strip():
                self._print(text.rstrip("\n"))
            return
        msg = record.getMessage() if record.msg is not None else ""
        if msg and msg.startswith(_PASS_INFO):
            self._print(msg)

    def _maybe_line(self) -> None:
        """In ``lines`` mode, a progress line at each tenth of the jobs (at least
        :data:`LINE_MIN_S` after the last one), or after :data:`LINE_EVERY_S` seconds with
        jobs done since the last one."""
        if self.mode != "lines" or not self.total or self.done == self._last_line_done or self.done == self.total:
            return  # the last step: the summary line says it
        step = max(1, self.total // 10)
        now = time.monotonic()
        since = now - self._last_line_at
        if (self.done // step != self._last_line_done // step and since >= LINE_MIN_S) or since >= LINE_EVERY_S:
            self._last_line_done, self._last_line_at = self.done, now
            self._print(self.summary_line())

    def _to_log_file(self, record: logging.LogRecord) -> None:
        text = self._formatter.format(record)
        if text and text.strip():
            self._append_log(text)

    def _append_log(self, text: str) -> None:
        Path(self.log_file).parent.mkdir(parents=True, exist_ok=True)
        with filelock.FileLock(str(self.log_file) + ".lock"):
            with open(self.log_file, "a", encoding="utf-8") as f:
                f.write(text.rstrip("\n") + "\n")


def display_mode(*, quiet: bool, verbose: bool, dryrun: bool, stream=None) -> str | None:
    """The display for a run: None (Snakemake's own output) with ``verbose`` or for a dry run
    (its job list is the point), ``"live"`` on a terminal unless ``quiet``, else ``"lines"``."""
    if verbose or dryrun:
        return None
    stream = stream if stream is not None else sys.stderr
    tty = bool(getattr(stream, "isatty", lambda: False)())
    return "live" if tty and not quiet else "lines"
