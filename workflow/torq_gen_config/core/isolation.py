"""Supervised worker processes for the in-process work: ONNX Runtime, onnx's reference
evaluator and the IREE importer run in a child process with a time limit.

Jobs are threads of the Snakemake process (``profiles/default``: a thread costs
milliseconds, a Python process with numpy, onnx and onnxruntime imported costs ~0.3 s).
But a library call that never returns (a ``Loop`` of 2**40 iterations in ONNX Runtime)
or that crashes (a segfault in a kernel) would hang or kill the whole run. So every
such call goes through :func:`run_isolated`: a worker forked from a *forkserver* that
imported the heavy modules once (so a worker starts in ~10 ms), given the call, killed
when it runs past its limit (:class:`WorkerTimeout`), reported with its signal when it
dies (:class:`WorkerCrash`). Its exception comes back as it was raised (or as
:class:`WorkerError` when it cannot be pickled). A worker whose calls came back waits
for the next ones (a small pool), so the libraries' first-use costs (an ONNX Runtime
session's set-up, onnx's operator tables) are paid once per worker, not once per job.

No worker outlives the run: every live worker is killed when the run stops
(:func:`kill_all`, called on SIGINT/SIGTERM and at exit), and each worker asks the
kernel to kill it when the forkserver goes away (``PR_SET_PDEATHSIG``; the forkserver
exits when the Snakemake process does, also after ``kill -9``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import types
from typing import Any, Callable

from .errors import TorqGenConfigError

#: Modules the forkserver imports once, so that workers start with them loaded.
PRELOAD = ["numpy", "ml_dtypes", "onnx", "onnx.reference", "onnxruntime", "torq_gen_config.reference",
           "torq_gen_config.reference.model_run", "torq_gen_config.inputs"]
#: Seconds between checks of a worker while waiting for it.
_POLL_S = 0.05
#: Environment variable that runs calls in this process instead (debugging; tests of the library).
INLINE_ENV = "TORQ_GEN_CONFIG_INLINE"

_lock = threading.RLock()  # reentrant: kill_all runs in a signal handler (see tools._LIVE_LOCK)
_context = None
_in_worker = False
_live: set = set()
_idle: list = []  # _Worker objects waiting for calls
#: A worker runs at most this many call sequences, then it is replaced (bounds what a
#: library may leak into a long-lived process).
MAX_USES = 50
#: Idle workers kept for later calls (one per job thread that may need one).
MAX_IDLE = max(2, os.cpu_count() or 2)
_stopping = threading.Event()
_stop_signal: int | None = None


class WorkerTimeout(TimeoutError):
    """The worker ran past its limit and was killed."""


class WorkerCrash(RuntimeError):
    """The worker died without a result (a signal, or ``os._exit``)."""

    def __init__(self, message: str, signal_name: str | None = None):
        super().__init__(message)
        self.signal_name = signal_name


class WorkerError(RuntimeError):
    """The worker raised an exception that could not be sent back as it was."""


class RunStopped(TorqGenConfigError):
    """The run is stopping (Ctrl-C, SIGTERM): no new worker is started."""


def _ctx():
    global _context
    with _lock:
        if _context is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(list(PRELOAD))
            _context = ctx
        return _context


def _set_parent_death_signal() -> None:
    """Ask the kernel to SIGKILL this process when its parent (the forkserver) exits."""
    with contextlib.suppress(Exception):  # not Linux: the forkserver still kills nothing, kill_all does at exit
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1


def _release_inherited_fds() -> None:
    """Close the forkserver's "alive" pipe and the resource tracker's pipe that
    multiprocessing hands every child: while a worker holds them, neither helper
    process sees the run end (and the forkserver's exit is what kills the workers)."""
    try:
        from multiprocessing import forkserver, resource_tracker  # another Python's internals: may be absent

        for owner, attr in ((forkserver._forkserver, "_forkserver_alive_fd"),
                            (resource_tracker._resource_tracker, "_fd")):
            fd = getattr(owner, attr, None)
            if fd is not None:
                setattr(owner, attr, None)
                os.close(fd)
    except Exception:  # another Python's internals: the watchdog still ends the worker
        pass


def _watch_run(run_pid: int) -> None:
    """End this worker when the run's process is gone (``kill -9`` of the run)."""
    def watch() -> None:
        while True:
            time.sleep(0.5)
            try:
                os.kill(run_pid, 0)
            except ProcessLookupError:
                os._exit(137)
            except PermissionError:  # pragma: no cover - pid reused by another user
                os._exit(137)

    threading.Thread(target=watch, daemon=True, name="tgc-watch-run").start()


#: One call of a sequence: ``(fn, args, kwargs)``.
Call = tuple  # (Callable, tuple, dict)


def _worker_main(conn, run_pid: int) -> None:
    """Body of a worker: receive call sequences (with the caller's working directory, which
    the calls run in) until the pipe closes (or ``None``); run each sequence's calls in order,
    sending ``("start", i)`` before and ``("ok", i, value)`` or the exception after each (a
    later call's hang does not lose them), then return the memory they freed."""
    global _in_worker
    _in_worker = True  # calls made from here run inline: a worker is already isolated
    _release_inherited_fds()
    _set_parent_death_signal()
    _watch_run(run_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when a worker stops
    try:
        while True:
            try:
                calls = conn.recv()
            except (EOFError, OSError):
                break
            if calls is None:
                break
            # a kept worker runs later calls of this process, whose working directory
            # may have changed (a second workflow run in another output directory)
            cwd, calls = calls
            if cwd != os.getcwd():
                os.chdir(cwd)
            for i, (fn, args, kwargs) in enumerate(calls):
                _send(conn, ("start", i))
                try:
                    _send(conn, ("ok", i, fn(*args, **kwargs)))  # an unpicklable result: an error
                except BaseException as e:  # sent back, re-raised in the caller
                    text = traceback.format_exc()
                    try:
                        pickle.dumps(e)
                        _send(conn, ("raise", i, e, text))
                    except Exception:
                        _send(conn, ("error", i, f"{type(e).__name__}: {e}", text))
                with contextlib.suppress(OSError, AttributeError):  # glibc keeps freed pages: a kept worker
                    ctypes.CDLL(None).malloc_trim(0)  # would hold every call's peak (one layer's weights)
    finally:
        conn.close()


def _send(conn, message) -> None:
    """Send to the parent; when the parent is gone (``kill -9`` of the run), end quietly."""
    try:
        conn.send(message)
    except (BrokenPipeError, ConnectionResetError, EOFError):
        os._exit(0)


def run_isolated(fn: Callable, args: tuple = (), kwargs: dict | None = None, *, limit_s: float,
                 what: str = "the call") -> Any:
    """Call ``fn(*args, **kwargs)`` in a supervised worker process and return its result.

    Args:
        fn: a module-level function of an importable module (it is pickled by name;
            not one of ``__main__``); its arguments and result must be picklable
            (numpy arrays are).
        limit_s: wall-clock limit in seconds; the worker is killed (SIGKILL) after it.
        what: what the call does, for messages ("the layer reference").

    Returns:
        ``fn``'s return value.

    Raises:
        WorkerTimeout: the limit was reached (the worker was killed).
        WorkerCrash: the worker died without a result; ``signal_name`` is set when a
            signal killed it (a segfault: ``SIGSEGV``).
        RunStopped: the run is stopping (Ctrl-C).
        ValueError: ``fn`` is defined in ``__main__``.
        Exception: whatever ``fn`` raised (or :class:`WorkerError` with its text when it
            cannot be pickled).
    """
    (outcome,) = run_isolated_each([(fn, args, kwargs or {})], limit_s=limit_s, what=[what])
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def run_isolated_each(calls: list[Call], *, limit_s: float, what: list[str]) -> list:
    """Run several calls in order in one supervised worker, each with its own limit: a
    call that hangs or crashes ends that worker, and the calls after it go on in a new
    one. A worker whose calls all came back is kept for later calls (at most
    :data:`MAX_IDLE` idle, each reused up to :data:`MAX_USES` times), so a job pays
    neither a process start nor the libraries' first-use costs.

    Args:
        calls: ``(fn, args, kwargs)`` triples, as for :func:`run_isolated`.
        limit_s: wall-clock limit of each call in seconds.
        what: what each call does, for messages.

    Returns:
        One outcome per call, in order: its return value, or the exception it ended
        with (:class:`WorkerTimeout`, :class:`WorkerCrash`, :class:`WorkerError`, or
        what the call raised) as a value, not raised.

    Raises:
        RunStopped: the run is stopping (Ctrl-C).
        ValueError: a function is defined in ``__main__``.
    """
    calls = [(fn, tuple(args), dict(kwargs or {})) for fn, args, kwargs in calls]
    if _in_worker or os.environ.get(INLINE_ENV):
        outcomes = []
        for fn, args, kwargs in calls:
            try:
                outcomes.append(fn(*args, **kwargs))
            except Exception as e:
                outcomes.append(e)
        return outcomes
    for fn, _, _ in calls:
        if getattr(fn, "__module__", None) == "__main__":  # workers do not import the main module
            raise ValueError(f"run_isolated: {getattr(fn, '__qualname__', fn)} is defined in __main__; "
                             "pass a function of an importable module")
    outcomes: list = []
    while len(outcomes) < len(calls):
        outcomes.extend(_run_in_one_worker(calls[len(outcomes):], limit_s, what[len(outcomes):]))
    return outcomes


class _Worker:
    """A worker process and the parent's end of its pipe."""

    def __init__(self, proc, conn):
        self.proc, self.conn, self.uses = proc, conn, 0


def _take_worker() -> _Worker:
    """An idle worker that is still alive, or a new one."""
    while True:
        with _lock:
            worker = _idle.pop() if _idle else None
        if worker is None:
            break
        if worker.proc.is_alive():
            return worker
        _stop(worker)
    ctx = _ctx()
    mine, theirs = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=_worker_main, args=(theirs, os.getpid()), daemon=True, name="tgc-worker")
    with _lock:
        _start_without_main(proc)
        _live.add(proc)
    theirs.close()
    return _Worker(proc, mine)


def _give_back(worker: _Worker) -> None:
    """Keep a worker whose calls all came back for the next calls, or stop it."""
    worker.uses += 1
    if worker.uses < MAX_USES and not _stopping.is_set():
        with _lock:
            if len(_idle) < MAX_IDLE:
                _idle.append(worker)
                return
    _stop(worker)


def _run_in_one_worker(calls: list, limit_s: float, what: list[str]) -> list:
    """The outcomes of ``calls`` in one worker, up to and including the first that
    hangs or crashes (the worker is then gone)."""
    if _stopping.is_set():
        raise RunStopped(f"the run is stopping; {what[0]} was not started")
    worker = _take_worker()
    try:
        worker.conn.send((os.getcwd(), calls))
    except (BrokenPipeError, EOFError, OSError):  # an idle worker that just died: a new one
        _stop(worker)
        worker = _take_worker()
        worker.conn.send((os.getcwd(), calls))
    except Exception:  # the calls cannot be pickled: nothing was sent, the worker stays usable
        _give_back(worker)
        raise
    outcomes: list = []
    finished = False
    deadline = time.monotonic() + float(limit_s)
    try:
        while len(outcomes) < len(calls):
            current = what[len(outcomes)]
            message = None
            if worker.conn.poll(_POLL_S):
                try:
                    message = worker.conn.recv()
                except (EOFError, OSError):  # died while sending
                    if _stopping.is_set():
                        raise RunStopped(f"the run is stopping; {current} was stopped") from None
                    outcomes.append(_crash(worker.proc, current))
                    break
            elif not worker.proc.is_alive() and not worker.conn.poll(0):
                if _stopping.is_set():  # killed by the stop, not crashed
                    raise RunStopped(f"the run is stopping; {current} was stopped")
                outcomes.append(_crash(worker.proc, current))
                break
            if message is not None:
                kind = message[0]
                if kind == "start":
                    deadline = time.monotonic() + float(limit_s)
                elif kind in ("ok", "raise"):
                    outcomes.append(message[2])
                else:
                    outcomes.append(WorkerError(f"{message[2]}\n{message[3]}"))
                continue
            if _stopping.is_set():
                raise RunStopped(f"the run is stopping; {current} was stopped")
            if time.monotonic() > deadline:
                outcomes.append(WorkerTimeout(f"{current} did not finish within {limit_s:g} s and was stopped"))
                break
        finished = len(outcomes) == len(calls) and not isinstance(outcomes[-1], (WorkerTimeout, WorkerCrash))
    finally:
        if finished:
            _give_back(worker)
        else:
            _stop(worker)
    return outcomes


def _crash(proc, what: str) -> WorkerCrash:
    """The :class:`WorkerCrash` of a worker that died without a result (reaped first)."""
    try:
        proc.join(5)
    except Exception:
        pass
    code = proc.exitcode
    sig = _signal_name(-code) if code is not None and code < 0 else None
    return WorkerCrash(f"{what} crashed ({'signal ' + sig if sig else f'exit status {code}'}) without a result",
                       signal_name=sig)


def busy_workers() -> int:
    """Workers started and not idle (running a call, or not yet reaped)."""
    with _lock:
        return len(_live) - len(_idle)


def _start_without_main(proc) -> None:
    """``proc.start()`` without the worker re-importing the parent's ``__main__``:
    multiprocessing prepares a child by importing the parent's main module (for
    Snakemake its whole command line layer, ~0.3 s per worker). A main module whose
    spec name ends in ``.__main__`` is skipped by that step (``multiprocessing.spawn``),
    so the spec is swapped for the start. Callers hold ``_lock``."""
    main = sys.modules.get("__main__")
    if main is None:
        proc.start()
        return
    had = "__spec__" in vars(main)
    saved = getattr(main, "__spec__", None)
    main.__spec__ = types.SimpleNamespace(name="torq_gen_config.__main__")
    try:
        proc.start()
    finally:
        if had:
            main.__spec__ = saved
        else:
            del main.__spec__


def _stop(proc) -> None:
    """Kill a worker (a process or a :class:`_Worker`) if it still runs, reap it, forget it."""
    if isinstance(proc, _Worker):
        try:
            proc.conn.close()
        except Exception:
            pass
        proc = proc.proc
    try:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
    except Exception:  # already gone
        pass
    with _lock:
        _live.discard(proc)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def kill_all() -> int:
    """Stop the run's workers and tools: no new worker starts, every live worker and
    every running tool's process group (:func:`torq_gen_config.core.tools.run_tool`) is killed.

    Returns:
        The number of workers and tools that were still running.
    """
    _stopping.set()
    with _lock:
        live = list(_live)
        _idle.clear()
    for proc in live:
        try:
            if proc.is_alive():
                proc.kill()
        except Exception:
            pass
    from .tools import kill_all_tools  # light: reading or editing a report imports no tool runner

    return len(live) + kill_all_tools()


def reset() -> None:
    """Allow workers again after :func:`kill_all` (a new run in the same process)."""
    global _stop_signal
    _stopping.clear()
    _stop_signal = None


def check_running(what: str = "this step") -> None:
    """Raise :class:`RunStopped` when the run is stopping (:func:`kill_all` was called).

    Raises:
        RunStopped: naming ``what``, which is not done.
    """
    if _stopping.is_set():
        raise RunStopped(f"the run is stopping; {what} was not done")


def stop_signal() -> int | None:
    """The signal (SIGINT, SIGTERM) that stopped this run, or None."""
    return _stop_signal


def install_stop_handlers() -> None:
    """On SIGINT and SIGTERM, stop the workers and tools first (:func:`kill_all`), then do
    what the signal did before (Ctrl-C: ``KeyboardInterrupt``, which Snakemake turns into
    "stopping": the job threads now end at once instead of waiting for their tools;
    SIGTERM: Snakemake's scheduler stops, so call this again once it has installed its
    handler, e.g. in ``onstart``). The signal is kept for :func:`stop_signal`.
    Idempotent; only from the main thread (elsewhere it does nothing)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(signum)
        if getattr(previous, "_tgc_stop_handler", False):
            continue
        if previous == signal.SIG_IGN:  # a background job's SIGINT: it stays ignored (POSIX)
            continue

        def handler(sig, frame, _previous=previous):
            global _stop_signal
            if _stop_signal == sig:  # already stopping: a second Ctrl-C (or `timeout` passing it on)
                return None
            if _stop_signal is None:  # another signal while stopping (SIGTERM after Ctrl-C) still acts
                _stop_signal = sig
            kill_all()
            if callable(_previous) and sig == signal.SIGTERM:
                # not inside the signal handler: Snakemake's SIGTERM handler takes the
                # scheduler's (non-reentrant) lock, which the interrupted main thread may
                # hold (seen: a hang in job postprocessing); it only sets a flag
                threading.Thread(target=_previous, args=(sig, frame), daemon=True, name="stop-SIGTERM").start()
                return None
            if callable(_previous):  # SIGINT: KeyboardInterrupt, raised in the main thread
                return _previous(sig, frame)
            signal.signal(sig, signal.SIG_DFL)  # the default action, now that nothing is left running
            os.kill(os.getpid(), sig)
            return None

        handler._tgc_stop_handler = True
        signal.signal(signum, handler)


atexit.register(kill_all)
