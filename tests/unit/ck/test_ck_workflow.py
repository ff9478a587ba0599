"""The CK workflow in its Snakemake form and through ck-profile: one job per configuration,
incremental reruns, re-targeting, a rebuilt binary, stopping and resuming, two runs at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
from conftest import REPO
from irgen import FAKE_DIR, backward, forward, write

BINARY = FAKE_DIR / "ckProfiler"


def trace(path):
    return write(path, [forward([4, 16, 28, 28], [32, 16, 3, 3], padding=(1, 1), rank=1),
                        backward([4, 16, 28, 28], [32, 16, 3, 3], padding=(1, 1), rank=1),
                        forward([4, 32, 14, 14], [32, 8, 3, 3], padding=(1, 1), groups=4, rank=2),
                        backward([4, 32, 14, 14], [32, 8, 3, 3], padding=(1, 1), groups=4, rank=2,
                                 mask=(False, True, False)),
                        forward([4, 16, 28, 28], [32, 16, 3, 3], padding=(1, 1), rank=3),  # a repeat: run once
                        {"op_name": "aten::relu"}])


def snake(tmp_path, *extra, target="ck_profile", flags=(), env=None):
    args = ["--cores", "2", target, "--resources", "ck_device=2", *flags, "--config", f"ck_trace={tmp_path / 'ir.json'}",
            f"ck_profiler_path={FAKE_DIR}", f"ck_output_dir={tmp_path / 'out'}", "ck_quiet=true", *extra]
    exe = os.path.join(os.path.dirname(sys.executable), "snakemake")
    return subprocess.run([exe, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "FAKE_CK_LOG": str(tmp_path / "calls"), **(env or {})})


def calls(tmp_path):
    """ckProfiler runs (the build probe excluded)."""
    p = tmp_path / "calls"
    return [a for a in map(json.loads, p.read_text().splitlines())] if p.exists() else []


def profiled(tmp_path):
    return [a for a in calls(tmp_path) if len(a) > 2]


def test_snakemake_form_from_a_trace(tmp_path):
    trace(tmp_path / "ir.json")
    r = snake(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "out"
    doc = json.loads((out / "profiler_results.json").read_text())
    assert doc["stats"]["total"] == 6 and doc["stats"]["success"] == 6
    assert len(profiled(tmp_path)) == 5  # 6 configurations, one repeated: 5 jobs
    assert [x["priority_rank"] for x in doc["results"]] == [1, 1, 1, 2, 2, 3]
    assert doc["results"][0]["config_id"] == doc["results"][-1]["config_id"]
    assert (out / "ck_profiler_configs.json").exists() and "Conversion Summary" in r.stdout + r.stderr
    ids = sorted(p.name for p in (out / "runs").iterdir())
    assert len(ids) == 5 and all((out / "runs" / i / "profiler.log").stat().st_size > 0 for i in ids)

    # nothing changed: nothing runs
    r = snake(tmp_path, flags=["-n"])
    assert "Nothing to be done" in r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]

    # fewer configurations (max_ops): selection and aggregation only, no profiler run
    n = len(calls(tmp_path))
    r = snake(tmp_path, "ck_max_ops=2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(profiled(tmp_path)) == 5 and len(calls(tmp_path)) == n
    assert json.loads((out / "profiler_results.json").read_text())["stats"]["total"] == 2

    # re-target one configuration's result: only that job runs
    target = out / "runs" / ids[0] / "result.json"
    target.unlink()
    r = snake(tmp_path, "ck_max_ops=2", target=target)
    assert r.returncode == 0 and len(profiled(tmp_path)) == 6 and target.exists(), r.stderr[-3000:]

    # a rebuilt profiler (another binary) reruns the measurements
    other = tmp_path / "bin"
    other.mkdir()
    (other / "ckProfiler").write_bytes(BINARY.read_bytes())
    (other / "ckProfiler").chmod(0o755)
    r = snake(tmp_path, f"ck_profiler_path={other}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(profiled(tmp_path)) == 11


def test_snakemake_form_bad_settings(tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "snakemake")
    r = subprocess.run([exe, "--cores", "1", "ck_profile", "--config", f"ck_configs={tmp_path / 'none.json'}"], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode != 0 and "ck_configs file not found" in r.stderr
    trace(tmp_path / "ir.json")
    r = snake(tmp_path, "ck_backend=rocm")
    assert r.returncode != 0 and "ck_backend 'rocm': choose one of ckprofiler, onnxruntime" in r.stderr


def ck_profile(*args, env=None):
    exe = os.path.join(os.path.dirname(sys.executable), "ck-profile")
    return subprocess.Popen([exe, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)


def configs(tmp_path):
    from torq_gen_config.ck import convert

    trace(tmp_path / "ir.json")
    convert.convert_file(tmp_path / "ir.json", tmp_path / "c.json")
    return tmp_path / "c.json"


def profilers_logging_to(log) -> list[int]:
    """PIDs of the fake profilers alive with ``FAKE_CK_LOG=log``: this test's (under
    pytest-xdist other modules run the same fake binary at the same time; the process scan
    of benchmarks/faults.py, with psutil, which Snakemake depends on)."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if (p.environ().get("FAKE_CK_LOG") == str(log) and str(BINARY) in " ".join(p.cmdline())
                    and p.status() != psutil.STATUS_ZOMBIE):
                found.append(p.pid)
        except (psutil.Error, OSError):  # ended meanwhile, or not ours to read
            continue
    return found


def wait_for(pred, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.2)
    return False


def test_stop_and_resume_and_two_runs_at_once(tmp_path):
    c = configs(tmp_path)
    work = tmp_path / "w"
    log = tmp_path / "calls"
    first = ck_profile("run", c, "--profiler-path", FAKE_DIR, "--work-dir", work, "--quiet", "--output",
                       tmp_path / "r.json", env={"FAKE_CK_MODE": "hang", "FAKE_CK_LOG": str(log)})
    try:
        assert wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= 2), "the profiler never started"
        # a second run on the same work directory is refused in one line
        second = ck_profile("run", c, "--profiler-path", FAKE_DIR, "--work-dir", work)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2 and "ck-profile: error:" in err and "(CK profiling)" in err, err
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 130, err[-2000:]
    assert "stopped; finished configurations are kept" in err
    assert not list(work.glob("runs/*/result.json")), "a stopped run records no made-up result"
    assert not profilers_logging_to(log), "no profiler is left running"
    # resume: the same command completes
    again = ck_profile("run", c, "--profiler-path", FAKE_DIR, "--work-dir", work, "--quiet", "--output",
                       tmp_path / "r.json")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    assert json.loads((tmp_path / "r.json").read_text())["stats"]["success"] == 6
