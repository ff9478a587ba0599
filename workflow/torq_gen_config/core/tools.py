"""Running external tools (compilers, runtimes) with timeouts, logs and crash detection.

Every external command of the workflow goes through :func:`run_tool`:

- the tool runs in its own session (``start_new_session=True``), so on timeout the
  whole process group is killed (wrapper scripts and their children included);
- the result tells a normal exit, a timeout and a death by signal (crash) apart;
- the full command line, return code, stdout and stderr can be appended to a log.

:func:`find_tool` locates an executable (environment variable, the running
interpreter's ``bin`` directory, ``PATH``). :func:`bounded_message` and
:func:`first_error_line` cut a tool's stderr down to what is worth showing in a
report.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from .limits import MESSAGE_CHARS, SUMMARY_CHARS
from .logs import append_record

__all__ = [
    "ToolResult",
    "ToolNotFoundError",
    "run_tool",
    "find_tool",
    "bounded_message",
    "first_error_line",
    "tool_version",
]

# Seconds to wait for the pipes to close after the process group was killed.
_DRAIN_AFTER_KILL_S = 5.0
# Tools started by this process and still running (killed when the run stops).
_LIVE: set = set()
# Reentrant: the stop handler (a signal handler, main thread) takes it, possibly while the
# main thread it interrupted holds it (a plain Lock would deadlock the stop).
_LIVE_LOCK = threading.RLock()
# No tool process group outlives a ``kill -9`` of the run (no handler of ours runs
# then): a small reaper process per run holds the groups of the running tools and
# kills them when its pipe from the run closes (wrapper scripts' children included).
_REAPER_CODE = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
groups = set()
for line in sys.stdin:
    (groups.add if line[0] == "+" else groups.discard)(int(line[1:]))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""
_reaper: subprocess.Popen | None = None
_reaper_pid = None


def _tell_reaper(line: str) -> None:
    """Send ``+pgid`` / ``-pgid`` to this process's reaper (started on first use)."""
    global _reaper, _reaper_pid
    with _LIVE_LOCK:
        try:
            if _reaper is None or _reaper_pid != os.getpid() or _reaper.poll() is not None:
                _reaper = subprocess.Popen([sys.executable, "-S", "-c", _REAPER_CODE], stdin=subprocess.PIPE,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True, text=True, bufsize=1)
                _reaper_pid = os.getpid()
            _reaper.stdin.write(line + "\n")
        except OSError:  # no reaper: tools are still killed on a normal stop or a signal
            _reaper = None


class ToolNotFoundError(FileNotFoundError):
    """An external tool could not be found; the message lists where it was searched."""


@dataclass
class ToolResult:
    """Outcome of one :func:`run_tool` call.

    Attributes:
        argv: the command line that was run (as given, every item a ``str``).
        returncode: the exit status; negative ``-N`` when the process died of signal
            ``N`` (including the ``SIGKILL`` sent by :func:`run_tool` on timeout).
        stdout: everything the tool wrote on stdout (UTF-8, undecodable bytes replaced).
        stderr: everything the tool wrote on stderr (same decoding).
        wall_ms: wall-clock time from start to exit (or to the kill), in milliseconds.
        timed_out: True when the tool ran past ``timeout_s`` and its process group was killed.
        crashed: True when the tool died of a signal that :func:`run_tool` did not send
            (``returncode < 0`` and not ``timed_out``), e.g. ``SIGSEGV`` or ``SIGABRT``.
            A tool started through a Python wrapper script that turns a child's
            signal death into ``exit(-N)`` shows up as exit status ``256 - N``
            instead; callers that know their tool can detect that case themselves.
        signal_name: the name of the signal (``"SIGSEGV"``) when ``returncode < 0``, else None.
    """

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    wall_ms: float
    timed_out: bool = False
    crashed: bool = False
    signal_name: str | None = None

    @property
    def ok(self) -> bool:
        """True when the tool exited normally with status 0."""
        return self.returncode == 0 and not self.timed_out

    def command_line(self) -> str:
        """The command line quoted for a POSIX shell (for logs and messages)."""
        return shlex.join(self.argv)

    def describe_failure(self) -> str:
        """A one-line description of how the tool ended ("exit status 1", "killed by SIGSEGV", ...)."""
        if self.timed_out:
            return f"timed out after {self.wall_ms / 1000.0:.3g} s (process group killed)"
        if self.returncode < 0:
            return f"killed by {self.signal_name or f'signal {-self.returncode}'}"
        return f"exit status {self.returncode}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group led by ``proc`` (it was started in a new session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:  # pragma: no cover - group member changed uid; kill at least the leader
        try:
            proc.kill()
        except ProcessLookupError:
            pass


def run_tool(
    argv: Sequence[str | os.PathLike],
    *,
    timeout_s: float,
    cwd: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    log_path: str | os.PathLike | None = None,
) -> ToolResult:
    """Run an external command, capturing its output, with a hard wall-clock timeout.

    The command runs in a new session (its own process group). When it runs past
    ``timeout_s`` the whole group is killed with ``SIGKILL`` and the result has
    ``timed_out=True``; whatever the tool printed up to then is kept.

    Args:
        argv: the program and its arguments; ``argv[0]`` is a path or a name on ``PATH``.
        timeout_s: wall-clock limit in seconds (> 0).
        cwd: working directory of the tool (default: the current one).
        env: the complete environment of the tool (default: inherit ours).
        log_path: when given, the command line, working directory, return code, wall
            time and the full stdout/stderr are appended to this text file (its parent
            directory is created).

    Returns:
        A :class:`ToolResult`; a non-zero exit, a timeout or a crash is reported
        there, never raised.

    Raises:
        ValueError: ``argv`` is empty or ``timeout_s`` is not positive.
        ToolNotFoundError: ``argv[0]`` does not exist.
        PermissionError: ``argv[0]`` is not executable.
        OSError: the process cannot be started for another reason (or the log
            cannot be written).
    """
    argv = [os.fspath(a) for a in argv]
    if not argv:
        raise ValueError("run_tool: empty command line")
    if not timeout_s or timeout_s <= 0:
        raise ValueError(f"run_tool: timeout_s must be > 0 (got {timeout_s!r})")

    start = time.perf_counter()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    except FileNotFoundError as e:
        if cwd is not None and not os.path.isdir(cwd):
            raise ToolNotFoundError(f"working directory does not exist: {cwd}") from None
        raise ToolNotFoundError(f"cannot run {argv[0]!r}: executable not found ({e.strerror})") from None

    with _LIVE_LOCK:
        _LIVE.add(proc)
    _tell_reaper(f"+{proc.pid}")
    timed_out = False
    try:
        try:
            out_b, err_b = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            try:
                out_b, err_b = proc.communicate(timeout=_DRAIN_AFTER_KILL_S)
            except subprocess.TimeoutExpired:  # pragma: no cover - a child left the group and holds the pipes
                for pipe in (proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()
                proc.wait()
                out_b, err_b = b"", b""
    except BaseException:
        # KeyboardInterrupt or similar while waiting: do not leave the tool running.
        _kill_group(proc)
        proc.wait()
        raise
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc)
        _tell_reaper(f"-{proc.pid}")
    wall_ms = (time.perf_counter() - start) * 1000.0

    rc = proc.returncode
    result = ToolResult(
        argv=argv,
        returncode=rc,
        stdout=out_b.decode("utf-8", errors="replace"),
        stderr=err_b.decode("utf-8", errors="replace"),
        wall_ms=wall_ms,
        timed_out=timed_out,
        crashed=(rc < 0 and not timed_out),
        signal_name=_signal_name(-rc) if rc < 0 else None,
    )
    if log_path is not None:
        _append_log(log_path, result, cwd=cwd, timeout_s=timeout_s)
    return result


def kill_all_tools() -> int:
    """Kill the process group of every tool still running (the run is stopping).

    Returns:
        The number of tools killed.
    """
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        _kill_group(proc)
    return len(live)


def _append_log(log_path: str | os.PathLike, res: ToolResult, *, cwd, timeout_s: float) -> None:
    """Append one run's record (command, cwd, status, stdout, stderr) to ``log_path``."""
    if res.timed_out:
        status = f"TIMED OUT after {timeout_s:g} s (process group killed; return code {res.returncode})"
    elif res.crashed:
        status = f"CRASHED: killed by {res.signal_name} (return code {res.returncode})"
    else:
        status = f"return code {res.returncode}"
    parts = [
        f"$ {res.command_line()}\n",
        f"cwd: {os.fspath(cwd) if cwd is not None else os.getcwd()}\n",
        f"--- {status}; wall {res.wall_ms:.1f} ms\n",
        f"--- stdout ({len(res.stdout)} chars)\n",
        res.stdout,
        "" if not res.stdout or res.stdout.endswith("\n") else "\n",
        f"--- stderr ({len(res.stderr)} chars)\n",
        res.stderr,
        "" if not res.stderr or res.stderr.endswith("\n") else "\n",
    ]
    append_record(log_path, "".join(parts))


def tool_from_env(name: str, env_var: str, elsewhere: str = "the default locations") -> str | None:
    """The executable that the environment variable ``env_var`` names for the tool
    ``name``: a path, or a name looked up on ``PATH``; None when it is unset or empty.

    Raises:
        ToolNotFoundError: it is set but names no executable file (no silent fallback;
            the message says to unset it to search ``elsewhere``).
    """
    value = os.environ.get(env_var, "")
    if not value:
        return None
    if os.sep in value or (os.altsep and os.altsep in value):
        if os.path.isfile(value) and os.access(value, os.X_OK):
            return os.path.abspath(value)
    else:
        found = shutil.which(value)
        if found:
            return os.path.abspath(found)
    raise ToolNotFoundError(f"{name}: ${env_var}={value!r} is not an executable file "
                            f"(unset {env_var} to search {elsewhere})")


def find_tool(
    name: str,
    env_var: str | None = None,
    *,
    search_dirs: Sequence[str | os.PathLike] = (),
) -> str:
    """Locate an executable and return its absolute path.

    Search order:

    1. the environment variable ``env_var`` if it is set and non-empty; its value is
       a path to the executable or a name looked up on ``PATH``. When it is set but
       does not point at an executable this is an error (no silent fallback);
    2. each directory of ``search_dirs`` (for tools shipped inside a package);
    3. the directory of ``sys.executable`` (the ``bin`` of the running virtual
       environment; not resolved through symlinks);
    4. ``PATH``.

    Args:
        name: executable name, e.g. ``"iree-compile"``.
        env_var: optional environment variable that overrides the search.
        search_dirs: extra directories searched before the interpreter's directory.

    Returns:
        The absolute path of an existing executable file.

    Raises:
        ToolNotFoundError (a FileNotFoundError): not found; the message names every
            place that was searched.
    """
    chosen = tool_from_env(name, env_var) if env_var else None
    if chosen:
        return chosen

    searched: list[str] = []
    if env_var:
        searched.append(f"${env_var} (unset)")
    dirs = [os.fspath(d) for d in search_dirs]
    dirs.append(os.path.dirname(sys.executable) if sys.executable else "")
    for d in dirs:
        if not d:
            continue
        candidate = os.path.join(d, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
        searched.append(d)
    found = shutil.which(name)
    if found:
        return os.path.abspath(found)
    searched.append(f"PATH={os.environ.get('PATH', '')}")
    raise ToolNotFoundError(f"executable {name!r} not found; searched: " + "; ".join(searched))


# "error" as a word ("error:", "Error ...") is preferred over an exception class
# name ("ValueError:"), which is preferred over "error" anywhere ("errors.py").
_ERROR_WORD = re.compile(r"\berror\b", re.IGNORECASE)
_ERROR_CLASS = re.compile(r"\w+error\b", re.IGNORECASE)
_ERROR_ANY = re.compile(r"error", re.IGNORECASE)
# IREE runtime status lines: "c/runtime/src/...: INVALID_ARGUMENT; tensor shape ..."
_STATUS_CODE = re.compile(r"\b[A-Z][A-Z_]{3,}; ")


def _first_matching_line(lines: list[str], patterns) -> int | None:
    for pat in patterns:
        for i, line in enumerate(lines):
            if pat.search(line):
                return i
    return None


def bounded_message(text: str, limit: int = MESSAGE_CHARS, *, from_error: bool = True) -> str:
    """Cut a tool's output down to its most useful part, at most ``limit`` characters.

    The message starts at the first line containing the word "error" (any case;
    failing that, the first line with an exception name such as ``ValueError``;
    failing that, the first line containing "error" at all); without such a line
    it starts at the beginning. It is then cut at
    a line boundary so that, with the note ``"... (N more chars)"`` appended (N =
    characters left out at the end), it fits in ``limit`` characters. A single first
    line longer than that (MLIR ops print whole constants) is cut inside the line.
    Trailing whitespace is removed.

    Args:
        text: the tool's stderr (or stdout), possibly empty.
        limit: maximum length of the result in characters (values below 64 are raised to 64).
        from_error: False keeps the beginning of the text instead of seeking the first
            error line (for crash output, where "Error" also appears in stack frames).

    Returns:
        The bounded message (``""`` for empty or blank input).
    """
    limit = max(int(limit), 64)
    text = (text or "").rstrip()
    if not text.strip():
        return ""
    lines = text.splitlines(keepends=True)
    start = (_first_matching_line(lines, (_ERROR_WORD, _ERROR_CLASS, _ERROR_ANY)) or 0) if from_error else 0
    body = "".join(lines[start:]).rstrip()
    if len(body) <= limit:
        return body
    # Reserve room for the note; its length depends on N (at most a few digits).
    budget = limit - len(f"\n... ({len(body)} more chars)")
    kept: list[str] = []
    size = 0
    for line in lines[start:]:
        if size + len(line) > budget:
            break
        kept.append(line)
        size += len(line)
    if kept:
        head = "".join(kept).rstrip("\n")
    else:  # the first line alone is too long: cut inside it
        head = lines[start][:budget].rstrip("\n")
    more = len(body) - len(head)
    return f"{head}\n... ({more} more chars)"


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: an "... ERROR:" line whose rest has no letter (an emoji banner)
_BANNER = re.compile(r"error\s*:[^A-Za-z]*$", re.IGNORECASE)


def first_error_line(text: str, limit: int = SUMMARY_CHARS) -> str:
    """The single most telling line of a tool's output, for one-line summaries.

    Colour escapes are removed; an error banner with nothing after its colon but symbols
    (iree-run-module's ``FLAGS ERROR: (...)``) is replaced by the line after it.
    Picks the first line containing the word "error" (any case), else the first line
    with an exception name (``ValueError``), else the first line containing "error"
    at all, else the first IREE status line
    (``"...: INVALID_ARGUMENT; ..."``), else the first non-blank line. The line is
    stripped and cut to ``limit`` characters (ending in ``"..."`` when cut).

    Args:
        text: the tool's stderr (or stdout), possibly empty.
        limit: maximum length in characters (default 512, minimum 16).

    Returns:
        One line without newline; ``""`` for empty or blank input.
    """
    limit = max(int(limit), 16)
    lines = [_ANSI.sub("", ln).strip() for ln in (text or "").splitlines()]
    lines = [ln for ln in lines if ln]
    if not lines:
        return ""
    idx = _first_matching_line(lines, (_ERROR_WORD, _ERROR_CLASS, _ERROR_ANY, _STATUS_CODE)) or 0
    line = lines[idx]
    if idx + 1 < len(lines) and _BANNER.search(line):  # "FLAGS ERROR: (emoji)": the cause is the next line
        line = f"{line.split(':')[0]}: {lines[idx + 1]}"
    if len(line) > limit:
        line = line[: limit - 3] + "..."
    return line


#: ``tool --version`` answers of this process, by (path, mtime): probed once per run.
_VERSION_CACHE: dict[tuple, str | None] = {}
_VERSION_LOCK = threading.Lock()


def tool_version(tool: str, *, timeout_s: float, pick=None) -> str | None:
    """The version line of ``tool --version``, probed once per process (jobs are
    threads of one Snakemake process) and cached with failures too, so a hanging or
    broken tool costs one bounded probe per run, not one per job.

    Args:
        tool: the executable's path.
        timeout_s: limit of the probe in seconds (the run's ``--timeout``, capped by
            the caller).
        pick: ``pick(line) -> bool`` selects the line (default: the first non-blank one).

    Returns:
        The stripped line, or None when the tool times out, fails or prints none.
    """
    try:
        key = (tool, os.stat(tool).st_mtime_ns)
    except OSError:
        return None
    with _VERSION_LOCK:  # other jobs wait for the one probe instead of starting their own
        if key in _VERSION_CACHE:
            return _VERSION_CACHE[key]
        version = None
        try:
            res = run_tool([tool, "--version"], timeout_s=timeout_s)
            if res.ok:
                version = next((ln.strip() for ln in res.stdout.splitlines()
                                if ln.strip() and (pick is None or pick(ln))), None)
        except OSError:
            pass
        _VERSION_CACHE[key] = version
        return version
