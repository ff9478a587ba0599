"""Discovery through a real SLURM (profiles/slurm): a single-node SLURM on localhost
(Debian's slurm-wlm and munge, brought up by ../shared/scripts/setup_local_slurm.sh and
stopped by PID), the CLI and the Snakemake form, the report the same as a local run's.

Skipped where SLURM cannot be brought up (not root, or neither slurm-wlm nor apt-get) and,
with the reason, where the executor plugin is not installed (`pip install -e '.[cluster]'`);
CI installs it and sets TORQ_GEN_CONFIG_REQUIRE_CLUSTER=1, which makes a missing plugin a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from local_slurm import LocalSlurm, comparable, running, start, stop, submissions, unavailable_reason
from test_output_schemas import small_cnn

PROFILE = REPO / "profiles" / "slurm"


def test_comparable_drops_only_timings_and_provenance():
    r = {"ops": {"A": {"executors": {"e": {"status": "success", "timing": {"run_ms": 1.0}}}}},
         "provenance": {"generated_at": "x"}, "discovery_report": {"summary": {"timing_summary": {}, "total_layers": 1}}}
    assert comparable(r) == {"ops": {"A": {"executors": {"e": {"status": "success"}}}},
                             "discovery_report": {"summary": {"total_layers": 1}}}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> LocalSlurm:
    """SLURM up for this module's tests; every daemon it started stopped by PID afterwards
    (also when a test fails), and /etc/slurm/slurm.conf as it was."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"no local SLURM: {reason}")
    if not importlib.util.find_spec("snakemake_executor_plugin_slurm"):
        missing = "snakemake-executor-plugin-slurm is not installed: pip install -e '.[cluster]'"
        assert not os.environ.get("TORQ_GEN_CONFIG_REQUIRE_CLUSTER"), missing
        pytest.skip(missing)
    cluster = start(tmp_path_factory.mktemp("slurm-state"))
    try:
        yield cluster
    finally:
        subprocess.run(["scancel", "--user", "root"], capture_output=True, timeout=30)  # none should be left
        killed = stop(cluster)
        assert not running(cluster), running(cluster)
        assert not killed, f"daemons that ignored SIGTERM: {killed}"


def _queue_empty(timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run(["squeue", "--noheader", "--states=PENDING,RUNNING"], capture_output=True, text=True)
        if r.returncode == 0 and not r.stdout.strip():
            return True
        time.sleep(1)
    return False


def _kinds(jobs: dict[int, str]) -> dict[str, int]:
    """How many submissions per rule (rule_<name>) or group (group_<name>_...)."""
    kinds: dict[str, int] = {}
    for log in jobs.values():
        kind = log.split("slurm_logs/", 1)[1].split("/", 1)[0]
        kind = "group:" + kind.split("_")[1] + "_" + kind.split("_")[2] if kind.startswith("group_") else kind
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


@pytest.mark.slow
def test_discovery_through_slurm_matches_a_local_run(slurm, tmp_path):
    model = small_cnn(tmp_path / "cnn.onnx")  # 3 layers: one unit (pipeline/units.py)
    local = run_cli("discover", "--model", model, "--output-dir", tmp_path / "local", "-j", "2", "-q")
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]
    expected = comparable(json.loads((tmp_path / "local" / "torq_gen_config_cnn.json").read_text()))

    # the CLI form
    t0 = time.perf_counter()
    r = run_cli("discover", "--profile", PROFILE, "--model", model, "--output-dir", tmp_path / "cli", "-q")
    wall = time.perf_counter() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    jobs = submissions(out)
    # one unit: its preparation, and its compile batch and tests per executor (3)
    assert _kinds(jobs) == {"rule_prepare_model": 1, "rule_import_full_model": 1, "rule_split_layers": 1,
                            "rule_prepare_unit": 1, "rule_test_unit": 3}, out[-4000:]
    # they ran in SLURM: the controller completed each of them
    log = slurm.controller_log()
    for jobid in jobs:
        assert f"_job_complete: JobId={jobid} done" in log, (jobid, log[-3000:])
    assert comparable(json.loads((tmp_path / "cli" / "torq_gen_config_cnn.json").read_text())) == expected
    print(f"discover --profile profiles/slurm: {wall:.1f} s, {len(jobs)} submissions")

    # the full-model run of that discovery, through SLURM too
    r = run_cli("run", "--profile", PROFILE, "--model", model, "--output-dir", tmp_path / "cli", "-q")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    kinds = _kinds(submissions(out))
    assert kinds.get("rule_run_full_model") == 1 and kinds.get("rule_compile_partition") == 1, (kinds, out[-3000:])
    report = json.loads((tmp_path / "cli" / "torq_gen_config_cnn.json").read_text())
    assert report["full_model"]["status"] == "success"

    # the Snakemake form from the repository root (profiles/default is read too)
    r = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "--profile", "profiles/slurm", "--config",
                        f"model={model}", f"output_dir={tmp_path / 'smk'}"],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    jobs = submissions(out)
    assert _kinds(jobs) == {"rule_prepare_model": 1, "rule_import_full_model": 1, "rule_split_layers": 1,
                            "rule_prepare_unit": 1, "rule_test_unit": 3}, out[-4000:]
    log = slurm.controller_log()
    assert all(f"_job_complete: JobId={jobid} done" in log for jobid in jobs), log[-3000:]
    assert comparable(json.loads((tmp_path / "smk" / "torq_gen_config_cnn.json").read_text())) == expected
    assert _queue_empty(), "jobs left in the SLURM queue"


def _faults_benchmark():
    """benchmarks/faults.py as a module (its SLURM rows)."""
    import importlib.util as iu

    spec = iu.spec_from_file_location("tgc_faults_benchmark_slurm", REPO / "benchmarks" / "faults.py")
    module = iu.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_cluster_faults_each_give_one_line_and_the_rerun_resumes(slurm, tmp_path):
    """benchmarks/faults.py's row that puts the three cluster faults in one run (~3 min: a
    time limit takes SLURM 60-90 s to enforce): the node drained while the unit's test jobs
    wait (then resumed), the vmvx test job cancelled with scancel while it compiles, the
    llvm-cpu one past its time limit (runtime=1). Each gives its one line naming the unit's
    layers and the SLURM job id; the finished verdicts (ort's) are all there after the
    rerun through SLURM, which completes with every verdict a success; nothing is left in
    the queue."""
    faults = _faults_benchmark()
    outcome = faults.run_kind(faults.KINDS_BY_NAME["SLURM: drain, scancel and time limit in one run"], tmp_path)
    assert outcome.not_measured is None, outcome.not_measured
    details = "\n".join(outcome.problems + [f"corrupt: {c}" for c in outcome.corrupt]
                        + [f"left: {s}" for s in outcome.stale])
    print(f"cluster faults: {outcome.message} ({outcome.wall:.0f} s)")
    assert outcome.clear, f"exit {outcome.exit}, {outcome.message}\n{details}"
    assert outcome.tracebacks == 0 and outcome.leftovers == 0 and not outcome.lost, details
    assert _queue_empty(), "jobs left in the SLURM queue"
    r = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], capture_output=True, text=True)
    assert all(ln.split()[1].rstrip("*") in ("idle", "mix", "alloc") for ln in r.stdout.splitlines()), r.stdout
