"""Supervised workers (isolation.py), the run lock (run_lock.py), the timeout records
that make a larger --timeout redo a job (pipeline/markers.py) and the report's staleness checks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torq_gen_config.core import isolation, job_support, run_lock
from torq_gen_config.core.isolation import WorkerCrash, WorkerError, WorkerTimeout, run_isolated


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
    assert isolation.busy_workers() == 0  # the worker is gone


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


def test_each_call_of_a_sequence_has_its_own_limit_and_a_hang_does_not_stop_the_rest():
    t0 = time.monotonic()
    outcomes = isolation.run_isolated_each(
        [(_add, (1, 2), {}), (_sleep, (60,), {}), (_raise_value_error, (), {}), (_segfault, (), {}),
         (_pid, (), {})],
        limit_s=2, what=["the sum", "the nap", "the check", "the kernel", "the pid"])
    assert outcomes[0] == 3
    assert isinstance(outcomes[1], WorkerTimeout) and "the nap did not finish within 2 s" in str(outcomes[1])
    assert isinstance(outcomes[2], ValueError) and "bad value 42" in str(outcomes[2])
    assert isinstance(outcomes[3], WorkerCrash) and outcomes[3].signal_name == "SIGSEGV"
    assert outcomes[4] != os.getpid()
    assert time.monotonic() - t0 < 20
    assert isolation.busy_workers() == 0


def test_calls_of_a_sequence_share_one_worker_and_a_worker_is_reused():
    pids = isolation.run_isolated_each([(_pid, (), {}), (_pid, (), {})], limit_s=60, what=["a", "b"])
    assert pids[0] == pids[1] != os.getpid()
    assert run_isolated(_pid, limit_s=60) == pids[0]  # the idle worker took the next call


def test_a_reused_worker_runs_in_the_callers_current_directory(tmp_path, monkeypatch):
    # a second workflow run from the same process (run --reduce prepares the reduced model in
    # its own folder) resolves its relative paths there, not in the first run's directory
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    first = isolation.run_isolated_each([(_pid, (), {}), (os.getcwd, (), {})], limit_s=60, what=["pid", "cwd"])
    monkeypatch.chdir(tmp_path / "b")
    again = isolation.run_isolated_each([(_pid, (), {}), (os.getcwd, (), {})], limit_s=60, what=["pid", "cwd"])
    assert first[0] == again[0]  # the same kept worker
    assert (first[1], again[1]) == (str(tmp_path / "a"), str(tmp_path / "b"))


def test_a_worker_that_hung_or_crashed_is_not_reused():
    first = run_isolated(_pid, limit_s=60)
    with pytest.raises(WorkerCrash):
        run_isolated(_segfault, limit_s=60)
    assert run_isolated(_pid, limit_s=60) != first


def test_a_function_of_main_is_refused_with_a_clear_error():
    def local():  # noqa: pretend __main__
        return 1
    local.__module__ = "__main__"
    with pytest.raises(ValueError, match="defined in __main__"):
        run_isolated(local, limit_s=5)


def _prepare_like(*, model_run_failed=None):
    if not model_run_failed:
        os.kill(os.getpid(), signal.SIGSEGV)  # the whole-model run crashes the worker
    return f"done without the run: {model_run_failed}"


def test_model_job_is_done_again_without_the_whole_model_run_after_a_crash(capsys):
    result = job_support.in_worker(_prepare_like, "the model preparation", 60, without_run="model_run_failed")
    assert result.startswith("done without the run: the model preparation crashed")
    assert "SIGSEGV" in result
    assert "done again without the whole-model reference run" in capsys.readouterr().err


def test_model_job_crash_without_a_fallback_is_one_model_error():
    from torq_gen_config.core.errors import ModelError

    with pytest.raises(ModelError, match="the model preparation crashed"):
        job_support.in_worker(_prepare_like, "the model preparation", 60)


def test_stale_snakemake_lock_of_this_output_dir_is_removed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.output.lock").write_text(f"{out}/work/m/a.json\nout/torq_gen_config_m.json\n")
    (locks / "0.input.lock").write_text(f"{tmp_path}/m.onnx\n")
    (locks / "1.output.lock").write_text(f"{tmp_path}/elsewhere/x.json\n")  # another run's outputs
    (locks / "1.input.lock").write_text("")
    held = out / ".torq-gen-config-m.lock"
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, sys.argv[1]); from torq_gen_config.core import run_lock; "
        "run_lock.acquire(sys.argv[2]); print('held', flush=True); time.sleep(60)"),
        str(Path(isolation.__file__).parents[1]), str(held)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        assert run_lock.clear_stale_snakemake_locks(tmp_path, out) == 0  # a live run holds the directory
        assert (locks / "0.output.lock").exists()
    finally:
        child.kill()
        child.wait()
    assert run_lock.clear_stale_snakemake_locks(tmp_path, out) == 1
    assert not (locks / "0.output.lock").exists() and not (locks / "0.input.lock").exists()
    assert (locks / "1.output.lock").exists()


def test_temporary_files_of_killed_writers_are_removed(tmp_path):
    from torq_gen_config.core.fileio import atomic_write_bytes, remove_temporary_files

    (tmp_path / "layers" / "a").mkdir(parents=True)
    left = tmp_path / "layers" / "a" / ".reference.npz.bxol44ks.tmp"
    left.write_bytes(b"partial")
    atomic_write_bytes(tmp_path / "layers" / "a" / "reference.npz", b"complete")
    assert remove_temporary_files(tmp_path) == 1
    assert not left.exists() and (tmp_path / "layers" / "a" / "reference.npz").read_bytes() == b"complete"


def test_no_result_is_written_once_the_run_is_stopping(tmp_path):
    from torq_gen_config.core.fileio import atomic_write_bytes

    isolation.kill_all()
    try:
        with pytest.raises(isolation.RunStopped, match="writing result.json was not done"):
            atomic_write_bytes(tmp_path / "result.json", b"{}")  # e.g. a "crash" verdict the stop caused
        with pytest.raises(isolation.RunStopped):
            run_isolated(_pid, limit_s=5)
    finally:
        isolation.reset()
    assert not (tmp_path / "result.json").exists()
    atomic_write_bytes(tmp_path / "result.json", b"{}")


def test_lock_excludes_other_processes_and_names_the_holder(tmp_path):
    lock = tmp_path / ".torq-gen-config-m.lock"
    run_lock.acquire(lock)
    run_lock.acquire(lock)  # reentrant in one process
    try:
        code = ("import sys; sys.path.insert(0, sys.argv[2]); from torq_gen_config.core import run_lock\n"
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


def test_staleness_outdated_marker_and_changed_model(tmp_path):
    from torq_gen_config.core.layout import OUTDATED_MARKER, clear_outdated, mark_outdated, report_file, work_dir
    from torq_gen_config.report.staleness import model_digest, staleness

    model = tmp_path / "m.onnx"
    model.write_bytes(b"first")
    report_path = tmp_path / report_file("m")
    report = {"model_name": "m", "provenance": {"model": {"source": str(model), "sha256": model_digest(model)}}}
    assert staleness(report_path, report) == []
    marker = tmp_path / work_dir("m") / OUTDATED_MARKER
    mark_outdated(marker)
    lines = staleness(report_path, report)
    assert len(lines) == 1 and "out of date" in lines[0] and "did not finish" in lines[0]
    # while another process holds the run's lock, the run is in progress, not failed
    from torq_gen_config.core.layout import lock_file

    lock = tmp_path / lock_file("m")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.argv = ['torq-gen-config', 'discover']; from torq_gen_config.core import run_lock; "
        f"run_lock.acquire({str(lock)!r}); print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        lines = staleness(report_path, report)
        assert len(lines) == 1 and "a run of m is in progress (pid " in lines[0] and "did not finish" not in lines[0]
    finally:
        holder.kill()
        holder.wait()
    assert "did not finish" in staleness(report_path, report)[0]
    clear_outdated(marker)
    model.write_bytes(b"second")
    lines = staleness(report_path, report)
    assert len(lines) == 1 and "changed since this report was written" in lines[0]
    model.unlink()  # a model that is gone is not a reason to warn
    assert staleness(report_path, report) == []


def test_stop_handlers_keep_an_ignored_sigint_and_let_sigterm_act_while_stopping():
    """A background job's SIGINT stays ignored (POSIX); a SIGTERM after a Ctrl-C still does
    what it did before (found by a fresh-user test: a backgrounded run could only be kill -9'd)."""
    code = r"""
import signal, sys
from torq_gen_config.core import isolation
signal.signal(signal.SIGINT, signal.SIG_IGN)
isolation.install_stop_handlers()
assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN, "SIGINT no longer ignored"
calls = []
signal.signal(signal.SIGINT, lambda s, f: calls.append(("int", s)))
signal.signal(signal.SIGTERM, lambda s, f: calls.append(("term", s)))
isolation.install_stop_handlers()
import threading, time
signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
signal.getsignal(signal.SIGINT)(signal.SIGINT, None)   # a second Ctrl-C: ignored
# SIGTERM while stopping acts; its previous handler runs outside the signal handler, so a
# lock the interrupted main thread holds (Snakemake's scheduler lock) cannot deadlock it
held = threading.Lock()
def term(s, f):
    with held:
        calls.append(("term", s))
signal.signal(signal.SIGTERM, term)
isolation.install_stop_handlers()
with held:  # the main thread holds the lock when the signal arrives
    signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
for _ in range(100):
    if len(calls) == 2:
        break
    time.sleep(0.05)
assert calls == [("int", signal.SIGINT), ("term", signal.SIGTERM)], calls
assert isolation.stop_signal() == signal.SIGINT
print("ok")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]
