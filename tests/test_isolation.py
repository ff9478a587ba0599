"""Supervised workers (isolation.py), the run lock (run_lock.py), the timeout records
that make a larger --timeout redo a job (jobs.py) and the report's staleness checks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torq_gen_config import isolation, jobs, run_lock
from torq_gen_config.isolation import WorkerCrash, WorkerError, WorkerTimeout, run_isolated


# module-level: workers receive functions by name
def _add(a, b):
    return a + b


def _sleep(seconds):
    time.sleep(seconds)
    return "woke"


def _segfault():
    os.kill(os.getpid(), signal.SIGSEGV)


def _exit_early():
    os._exit(3)


def _raise_value_error():
    raise ValueError("bad value 42")


class _Unpicklable(Exception):
    def __init__(self, a, b):  # two required args: pickling round trip fails
        super().__init__(f"{a}/{b}")
        self.lock = __import__("threading").Lock()


def _raise_unpicklable():
    raise _Unpicklable(1, 2)


def _pid():
    return os.getpid()


@pytest.fixture(autouse=True)
def _no_inline(monkeypatch):
    monkeypatch.delenv(isolation.INLINE_ENV, raising=False)


def test_result_comes_back_from_another_process():
    assert run_isolated(_add, (2, 3), limit_s=60) == 5
    assert run_isolated(_pid, limit_s=60) != os.getpid()


def test_hang_is_stopped_at_the_limit():
    t0 = time.monotonic()
    with pytest.raises(WorkerTimeout, match="the nap did not finish within 1 s"):
        run_isolated(_sleep, (60,), limit_s=1, what="the nap")
    assert time.monotonic() - t0 < 10
    assert not isolation._live  # the worker is gone


def test_crash_names_the_signal():
    with pytest.raises(WorkerCrash) as e:
        run_isolated(_segfault, limit_s=60, what="the kernel")
    assert e.value.signal_name == "SIGSEGV"
    assert "the kernel crashed (signal SIGSEGV)" in str(e.value)


def test_exit_without_result_is_a_crash():
    with pytest.raises(WorkerCrash, match="exit status 3"):
        run_isolated(_exit_early, limit_s=60)


def test_exception_comes_back_as_raised():
    with pytest.raises(ValueError, match="bad value 42"):
        run_isolated(_raise_value_error, limit_s=60)


def test_unpicklable_exception_comes_back_as_text():
    with pytest.raises(WorkerError, match="_Unpicklable: 1/2"):
        run_isolated(_raise_unpicklable, limit_s=60)


def test_inline_mode_runs_here(monkeypatch):
    monkeypatch.setenv(isolation.INLINE_ENV, "1")
    assert run_isolated(_pid, limit_s=60) == os.getpid()


def test_lock_excludes_other_processes_and_names_the_holder(tmp_path):
    lock = tmp_path / ".torq-gen-config-m.lock"
    run_lock.acquire(lock)
    run_lock.acquire(lock)  # reentrant in one process
    try:
        code = ("import sys; sys.path.insert(0, sys.argv[2]); from torq_gen_config import run_lock\n"
                "try:\n    run_lock.acquire(sys.argv[1])\nexcept run_lock.RunLocked as e:\n    print(e); sys.exit(7)")
        pkg = str(Path(run_lock.__file__).parents[1])
        p = subprocess.run([sys.executable, "-c", code, str(lock), pkg], capture_output=True, text=True, timeout=60)
        assert p.returncode == 7, p.stderr
        assert f"pid {os.getpid()}" in p.stdout and "another torq-gen-config run" in p.stdout
        assert run_lock.others_active(tmp_path, mine=lock) == []
    finally:
        run_lock.release(lock)
        run_lock.release(lock)
    assert not (tmp_path / ".torq-gen-config-m.lock.json").exists()
    run_lock.acquire(lock)  # free again
    run_lock.release(lock)


def test_timeout_record_reruns_only_under_a_larger_limit(tmp_path):
    out = tmp_path / "result.json"
    out.write_text("{}")
    jobs.record_timeout(str(out), True, 5)
    assert (tmp_path / "result.json.timed-out").read_text().strip() == "5"
    assert jobs.rerun_after_timeout(str(out), 5) is None  # same limit: the verdict stands
    assert jobs.rerun_after_timeout(str(out), 3) is None
    marker = jobs.rerun_after_timeout(str(out), 60)
    assert marker and os.stat(marker).st_mtime_ns > os.stat(out).st_mtime_ns
    assert jobs.rerun_after_timeout(str(out), 60) == marker  # stable while the job has not rerun
    jobs.record_timeout(str(out), False, 60)  # the rerun finished in time
    assert jobs.rerun_after_timeout(str(out), 600) is None
    assert jobs.rerun_after_timeout(str(tmp_path / "other.json"), 600) is None


def test_staleness_outdated_marker_and_changed_model(tmp_path):
    from torq_gen_config.layout import OUTDATED_MARKER, clear_outdated, mark_outdated, report_file, work_dir
    from torq_gen_config.report.staleness import model_digest, staleness

    model = tmp_path / "m.onnx"
    model.write_bytes(b"first")
    report_path = tmp_path / report_file("m")
    report = {"model_name": "m", "provenance": {"model": {"source": str(model), "sha256": model_digest(model)}}}
    assert staleness(report_path, report) == []
    marker = tmp_path / work_dir("m") / OUTDATED_MARKER
    mark_outdated(marker)
    lines = staleness(report_path, report)
    assert len(lines) == 1 and "out of date" in lines[0]
    clear_outdated(marker)
    model.write_bytes(b"second")
    lines = staleness(report_path, report)
    assert len(lines) == 1 and "changed since this report was written" in lines[0]
    model.unlink()  # a model that is gone is not a reason to warn
    assert staleness(report_path, report) == []
