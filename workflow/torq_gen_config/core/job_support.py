"""What every job entry point shares: the one-line notes of bad-input failures the
Snakemake runner reports and supervised workers for in-process work that can hang or
crash. The per-job log and the log file shared by all jobs are :mod:`torq_gen_config.core.logs`.

Jobs run in-process (``run:`` blocks with the local executor's threads, see
``profiles/default``), so a job costs milliseconds of start-up instead of a Python
process with numpy, ONNX Runtime and IREE imported (docs/toolchain.md, 'Snakemake'). Tools that
can crash or hang run as subprocesses with timeouts.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import traceback

from .errors import ModelError, TorqGenConfigError
from .isolation import WorkerCrash, WorkerTimeout, run_isolated
from .logs import append_record

#: One-line reasons of the bad-input errors (TorqGenConfigError) raised by jobs of
#: this process (jobs are threads of the Snakemake process); workflow_api puts the
#: first into the run's error message instead of Snakemake's generic one.
JOB_FAILURES: list[str] = []


def records_failure(fn):
    """Decorator for job entry points: a TorqGenConfigError (a missing or corrupt
    model, an int64 value out of int32 range, failed quantization, ...) is noted in
    :data:`JOB_FAILURES` and raised again (the job still fails)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TorqGenConfigError as e:
            JOB_FAILURES.append(f"{fn.__name__.removesuffix('_job')}: {e}")
            raise

    return wrapper


def logs_failure(fn):
    """Decorator for job bodies with a ``log`` keyword (the job's log file): an exception
    is appended to that log before it is raised again (a bad-input error as its one line,
    anything else with its traceback), so a failed job never leaves an empty log."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BaseException as e:
            log = kwargs.get("log")
            if log and not isinstance(e, (KeyboardInterrupt, SystemExit)):
                text = str(e) if isinstance(e, TorqGenConfigError) else traceback.format_exc()
                with contextlib.suppress(OSError):
                    append_record(log, f"failed: {text}")
            raise

    return wrapper


def in_worker(impl, what: str, limit: float, *, without_run: str | None = None, **kwargs):
    """Run the job body ``impl(**kwargs)`` in a supervised worker process
    (:mod:`torq_gen_config.core.isolation`) with the time limit ``limit`` (seconds): a hang
    or a crash of ONNX Runtime, onnx's reference evaluator or the IREE importer stops
    only the worker. For model-level jobs: the run then stops with one line, unless
    ``without_run`` names a keyword of ``impl`` that skips its whole-model reference run
    (what hangs or crashes there): then the job is done again with that keyword set to
    the reason, and says so.

    Raises:
        ModelError: the worker had to be stopped or died (naming ``what``), also when
            done again without the whole-model run.
        Exception: whatever the job body raised.
    """
    try:
        return run_isolated(impl, kwargs=kwargs, limit_s=limit, what=what)
    except WorkerTimeout:
        reason = (f"{what} did not finish within {limit:g} s and was stopped (raise --timeout if the model "
                  "is big; a hang in ONNX Runtime or onnx's reference evaluator also ends this way)")
    except WorkerCrash as e:
        reason = f"{what} crashed: {e}"
    if without_run is None or kwargs.get(without_run):
        raise ModelError(reason)
    print(f"warning: {reason}; done again without the whole-model reference run", file=sys.stderr)
    return in_worker(impl, what, limit, without_run=without_run, **{**kwargs, without_run: reason})



