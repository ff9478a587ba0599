"""One run at a time per discovery: an OS file lock in the output directory.

Both forms take the same lock (``<output dir>/.torq-gen-config-<name>.lock``,
:mod:`torq_gen_config.core.layout`): ``torq-gen-config`` before it starts Snakemake, and the
workflow itself when it starts its jobs (``onstart`` in the Snakefile), so a
``snakemake --config model=...`` run and a ``torq-gen-config discover`` run of the same
model into the same directory exclude each other. Runs of other models in the same
directory do not. The kernel releases the lock when its process dies (also after
``kill -9``); a JSON file next to it names the holder for the error message.

Within one process the lock is reentrant (the command line holds it while the
workflow it runs takes it again).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
import time
from pathlib import Path

from .errors import TorqGenConfigError
from .fileio import atomic_write_text
from .layout import lock_file
from .lazy import filelock
from .limits import COMMAND_CHARS

_held: dict[str, list] = {}  # resolved lock path -> [FileLock, count]
_guard = threading.Lock()


class RunLocked(TorqGenConfigError):
    """Another run holds the lock of this discovery."""


def _holder_file(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def holder(path: str | os.PathLike) -> str:
    """Who holds the lock at ``path``, for messages: ``"pid 123 (torq-gen-config discover ...,
    since 10:02:11)"``, or ``"another process"`` when its record cannot be read."""
    try:
        info = json.loads(_holder_file(Path(path)).read_text())
        command = textwrap.shorten(str(info.get("command", "?")), COMMAND_CHARS, placeholder=" ...")
        return f"pid {info.get('pid')} ({command}, since {info.get('started', '?')})"
    except (OSError, ValueError):
        return "another process"


def acquire(path: str | os.PathLike, *, what: str = "this output directory", tool: str = "torq-gen-config") -> None:
    """Take the run lock at ``path`` (created with its directory), or fail at once.

    Raises:
        RunLocked: another process holds it; the message names the holder.
    """
    path = Path(path).resolve()
    key = str(path)
    with _guard:
        if key in _held:
            _held[key][1] += 1
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(key)
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            raise RunLocked(_refusal(what, path, tool)) from None
        _held[key] = [lock, 1]
    try:

        atomic_write_text(_holder_file(path), json.dumps({
            "pid": os.getpid(), "command": " ".join(sys.argv), "started": time.strftime("%Y-%m-%d %H:%M:%S")}))
    except OSError:  # the lock holds without its record
        pass


def check_free(path: str | os.PathLike, *, what: str = "this output directory", tool: str = "torq-gen-config") -> None:
    """Fail at once when another process holds the run lock at ``path`` (the workflow
    checks it when it is parsed, before Snakemake's own directory lock, whose message
    names no holder and advises ``--unlock``); a lock this process holds is free here.

    Raises:
        RunLocked: another process holds it; the message names the holder.
    """
    if _held_by_another(Path(path)):
        raise RunLocked(_refusal(what, path, tool))


def running_holder(path: str | os.PathLike) -> str | None:
    """Who holds the run lock at ``path`` (:func:`holder`) when another process holds it
    now, else None (free, missing, or held by this process)."""
    return holder(path) if _held_by_another(Path(path)) else None


def _refusal(what: str, path: str | os.PathLike, tool: str = "torq-gen-config") -> str:
    return (f"another {tool} run is using {what}: {holder(path)}; wait for it to finish "
            f"(or stop it), then run again")


def _held_by_another(path: Path) -> bool:
    """True when another process holds the (existing) lock file ``path``."""
    key = str(path.resolve())
    if key in _held or not path.exists():
        return False
    probe = filelock.FileLock(key)
    try:
        probe.acquire(timeout=0)
    except filelock.Timeout:
        return True
    probe.release()
    return False


def release(path: str | os.PathLike) -> None:
    """Give the lock at ``path`` back (the last release of this process unlocks it)."""
    key = str(Path(path).resolve())
    with _guard:
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _held[key]
        try:
            _holder_file(Path(key)).unlink(missing_ok=True)
        except OSError:
            pass
        entry[0].release()


def others_active(directory: str | os.PathLike, mine: str | os.PathLike | None = None) -> list[str]:
    """The holders of the other run locks in ``directory`` (runs of other models): their
    Snakemake state shares the directory's ``.snakemake``, so a stale Snakemake lock is
    only removed when this list is empty."""

    mine_key = str(Path(mine).resolve()) if mine else None
    return [holder(p) for p in sorted(Path(directory).glob(lock_file("*")))
            if str(p.resolve()) != mine_key and _held_by_another(p)]


def clear_stale_snakemake_locks(workdir: str | os.PathLike, output_dir: str | os.PathLike) -> int:
    """Remove the Snakemake locks a killed run left in ``workdir/.snakemake/locks`` for
    files of ``output_dir`` (Snakemake's own lock is a pair of files naming the run's
    inputs and outputs, never removed after ``kill -9``; the next run would refuse with
    "Directory cannot be locked"). A lock pair is stale when every output it names is
    in ``output_dir`` and no torq-gen-config run lock there is held: any live run of
    this workflow on ``output_dir`` holds one (the command line before Snakemake starts,
    the Snakemake form from ``onstart``; a run that passes between its Snakemake lock and
    ``onstart`` still cannot go on, the run lock admits one).

    Returns:
        The number of lock pairs removed.
    """
    locks = Path(workdir) / ".snakemake" / "locks"
    if not locks.is_dir() or others_active(output_dir):
        return 0
    out = Path(output_dir).resolve()
    removed = 0
    for output_lock in sorted(locks.glob("*.output.lock")):
        try:
            paths = [ln.strip() for ln in output_lock.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            continue
        if not paths or not all(_inside((Path(workdir) / p).resolve(), out) for p in paths):
            continue
        n = output_lock.name.split(".", 1)[0]
        for f in (output_lock, locks / f"{n}.input.lock"):
            f.unlink(missing_ok=True)
        removed += 1
    return removed


def _inside(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents
