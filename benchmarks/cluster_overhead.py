#!/usr/bin/env python
"""Benchmark: discovery on this machine vs through SLURM (profiles/slurm), same model, one run.

Measures, on a SLURM on localhost (tests/workflow/local_slurm.py brings it up with
../shared/scripts/setup_local_slurm.sh and stops it by PID; run as root), back to back:
  (a) wall time of `torq-gen-config discover -j J` (local, profiles/default);
  (b) wall time of `torq-gen-config discover --profile profiles/slurm`, the SLURM
      submissions per rule (from the plugin's output), and per submission its peak
      memory (summed RSS of the processes whose environment has its SLURM_JOB_ID,
      sampled from /proc every 0.2 s) and lifetime;
  (c) the floor of one submission, broken down per job from timestamps, not guessed:
      - sbatch: the call's own time (an `sbatch` shim first on PATH logs start and end);
      - queue: SLURM's submit -> allocation (slurmctld's log, ms), for the submissions
        made while a CPU was free (the others waited for a CPU, which is not overhead);
      - launch: allocation -> the job's Snakemake started (its process's start time);
      - outer Snakemake: that start -> the second Snakemake's start: the plugin's job runs
        `snakemake --executor slurm-jobstep` (Python and Snakemake start, Snakefile parse,
        the DAG of that one job), which runs the rule through `srun snakemake ...`, a second
        start of all that (both process start times, from /proc);
      - inner Snakemake: the second start -> the rule's run block began (the job log's
        timestamp before `localrule <rule>:`, whole seconds, +0.5 s);
      - wrap-up: the rule's end (the job log's "Finished jobid" timestamp, +0.5 s) -> SLURM's
        job end (both Snakemakes check the outputs and exit);
      - poll: job end -> the plugin's first status query (an `squeue` shim) after it;
      - turnaround: that query -> the next sbatch it led to (Snakemake's bookkeeping of
        the finished job and its choice of the next; only gaps < 15 s count);
  (d) CPU seconds: the local run's (the discover process and its descendants), the SLURM
      run's (the submitting process, plus every process of every SLURM job, sampled from
      /proc), and their difference per submission: what one submission costs in CPU;
  (e) whether both reports are the same (minus timings, provenance and paths:
      tests/workflow/local_slurm.py, comparable()).
The load average (1 min) is sampled all along; each wall time is printed with the mean
and max load it ran under. The per-rule figures size the resources of profiles/slurm.

Usage: python benchmarks/cluster_overhead.py [--model PATH | --stack-blocks N] [--jobs 2] [--compile-batch N]
           [--nodes N --cpus-per-node C] [--keep DIR] [--json FILE] [-- SNAKEMAKE_ARGS]
  --stack-blocks 26: tests/fixtures/models.py's transformer_encoder_stack (26 * 39 + 2 =
  1,016 layers) instead of light_squeezenet (66 layers); --compile-batch 128: units of 128
  layers in both runs.
  --nodes 2 --cpus-per-node 1: two slurmd on this host (local_slurm.start); with --local-jobs
  the local run uses that many jobs (default --jobs).
  Arguments after -- go to the SLURM run (e.g. -- --slurm-array-jobs=test_unit).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "workflow"))
sys.path.insert(0, str(REPO / "tests"))
import local_slurm  # noqa: E402

PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: slurmctld log lines: "[2026-12-03T08:04:54.910] _slurm_rpc_submit_batch_job: JobId=5 ..."
CTLD_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\] (.*)$")
CTLD_EVENTS = {"submit": re.compile(r"_slurm_rpc_submit_batch_job: JobId=(\d+) "),
               "alloc": re.compile(r"(?:Allocate|Started) JobId=(\d+)"),  # sched: Allocate, sched/backfill: Started
               "end": re.compile(r"_job_complete: JobId=(\d+) done")}
#: the job states after which the plugin reports a job as finished
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                "DEADLINE", "PREEMPTED")
#: a turnaround longer than this is not a job waiting for the next (it waited for others)
TURNAROUND_MAX_S = 15.0
SHIM = r"""#!/bin/bash
# benchmarks/cluster_overhead.py: logs the start and end of each {tool} call, then its output
t0=$EPOCHREALTIME
out=$({real} "$@"); rc=$?
t1=$EPOCHREALTIME
printf '%s\n' "$out"
printf '{tool} %s %s %s %s\n' "$t0" "$t1" "$rc" "$(printf '%s' "$out" | tr '\n' ' ')" >> {log}
exit $rc
"""


def boot_time() -> float:
    """The epoch time of boot, to 10 ms (/proc/uptime; /proc/stat's btime is whole seconds)."""
    return time.time() - float(Path("/proc/uptime").read_text().split()[0])


class JobSampler(threading.Thread):
    """Per SLURM job: peak summed RSS (MB), first/last time seen, and each process's start
    time (epoch s) and kind (script, snakemake, work); the 1-minute load average."""

    def __init__(self, period: float = 0.2):
        super().__init__(daemon=True)
        self.period, self.stop_flag = period, threading.Event()
        self.peak_mb: dict[int, float] = defaultdict(float)
        self.seen: dict[int, list[float]] = {}
        self.procs: dict[int, dict[tuple, tuple[float, str]]] = defaultdict(dict)
        self.job_of: dict[tuple, int | None] = {}  # (pid, start ticks) -> SLURM job id (environment read once)
        self.loads: list[float] = []
        self.boot = boot_time()
        self.cpu: dict[int, dict[tuple, float]] = defaultdict(dict)  # job -> process -> CPU s (last seen)

    def run(self):
        last_load = 0.0
        while not self.stop_flag.is_set():
            now, rss = time.monotonic(), defaultdict(float)
            if now - last_load >= 2:
                self.loads.append(os.getloadavg()[0])
                last_load = now
            for d in os.listdir("/proc"):
                if not d.isdigit():
                    continue
                pid = int(d)
                start = _start_ticks(pid)
                key = (pid, start)  # a pid is reused by later processes
                job = self.job_of.get(key, -1)
                if job == -1:
                    job = self.job_of[key] = _slurm_job(pid)
                    if job is not None and start is not None:
                        self.procs[job][key] = (self.boot + start / CLK_TCK, _kind(pid))
                if job is None:
                    continue
                try:
                    rss[job] += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KB / 1024
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    self.cpu[job][key] = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime
                except (OSError, IndexError, ValueError):
                    continue
            for job, mb in rss.items():
                self.peak_mb[job] = max(self.peak_mb[job], mb)
                self.seen.setdefault(job, [now, now])[1] = now
            self.stop_flag.wait(self.period)

    def job_cpu(self, job: int) -> float:
        """CPU seconds of the job's processes (as last sampled: a process's last 0.2 s may be missing)."""
        return sum(self.cpu.get(job, {}).values())

    def first(self, job: int, kind: str) -> float | None:
        times = [t for t, k in self.procs.get(job, {}).values() if k == kind]
        return min(times) if times else None


class LoadMeter(threading.Thread):
    """The 1-minute load average every 2 s while a phase runs."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop_flag, self.loads = threading.Event(), []

    def run(self):
        while not self.stop_flag.is_set():
            self.loads.append(os.getloadavg()[0])
            self.stop_flag.wait(2)

    def done(self) -> str:
        self.stop_flag.set()
        self.join()
        return load_text(self.loads)


def load_text(loads: list[float]) -> str:
    if not loads:
        return "load ?"
    return f"load {statistics.mean(loads):.1f} mean, {max(loads):.1f} max"


def _start_ticks(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _slurm_job(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    m = re.search(rb"(?:^|\0)SLURM_JOB_ID=(\d+)", env)
    return int(m.group(1)) if m else None


def _kind(pid: int) -> str:
    """script (the batch script, slurmstepd), snakemake (the job's Snakemake), or work."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"
    if "slurm_script" in cmd or "slurmstepd" in cmd or not cmd.strip():
        return "script"
    if "-m snakemake" in cmd or "snakemake/__main__.py" in cmd:
        return "snakemake"
    return "work"


def ctld_events(text: str) -> dict[int, dict[str, float]]:
    """SLURM job id -> {submit, alloc, end: epoch s} from slurmctld's log."""
    jobs: dict[int, dict[str, float]] = defaultdict(dict)
    for line in text.splitlines():
        m = CTLD_LINE.match(line)
        if not m:
            continue
        for event, rx in CTLD_EVENTS.items():
            e = rx.search(m.group(2))
            if e:
                t = dt.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").timestamp()
                jobs[int(e.group(1))].setdefault(event, t)
    return jobs


def shim_calls(log: Path) -> dict[str, list[tuple[float, float, int, str]]]:
    """tool -> [(start, end, exit status, first output)] from the shims' log."""
    calls: dict[str, list] = defaultdict(list)
    if log.is_file():
        for line in log.read_text().splitlines():
            parts = line.split(" ", 4)
            if len(parts) >= 4:
                calls[parts[0]].append((float(parts[1]), float(parts[2]), int(parts[3]),
                                        parts[4] if len(parts) > 4 else ""))
    return calls


def write_shims(d: Path, log: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for tool in ("sbatch", "squeue"):
        real = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        if not real:
            raise SystemExit(f"{tool} is not installed")
        (d / tool).write_text(SHIM.format(tool=tool, real=real, log=log))
        (d / tool).chmod(0o755)
    return d


def discover(model: Path, out: Path, *extra: str, env: dict | None = None) -> tuple[float, float, str]:
    """Wall and CPU seconds (the process and the descendants it waited for) of one
    discovery from nothing, and its output."""
    if out.exists():  # a benchmark measures a discovery from nothing
        shutil.rmtree(out)
    exe = str(Path(sys.executable).parent / "torq-gen-config")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([exe, "discover", "--model", str(model), "--output-dir", str(out), "-q", *extra],
                       cwd=REPO, capture_output=True, text=True, timeout=4 * 3600, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if r.returncode != 0:
        raise SystemExit(f"discover {' '.join(extra)} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return wall, cpu, r.stdout + r.stderr


def kind_of(log: str) -> str:
    """rule_<name> (a unit job's log: rule_test_unit/0000_llvm-cpu/12.log)."""
    return log.split("slurm_logs/", 1)[1].split("/", 1)[0]


def busy_at(t: float, events: dict[int, dict[str, float]], exclude: int) -> int:
    """How many jobs held or waited for a CPU at time ``t`` (submitted, not yet ended): a job
    submitted while fewer than the CPUs did had one free (older pending jobs go first)."""
    return sum(1 for j, e in events.items() if j != exclude and e.get("submit", 1e18) <= t < e.get("end", 1e18))


def med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def fmt(v: float | None, unit: str = "s") -> str:
    return "-" if v is None else f"{v:.2f} {unit}"


def analyse(jobs: dict[int, str], events: dict[int, dict[str, float]], calls: dict, sampler: JobSampler,
            work: Path, cpus: int) -> dict:
    """Per-job phases (s) and their medians: the floor of one submission."""
    sbatch = sorted(calls.get("sbatch", []))
    polls = sorted(c for c in calls.get("squeue", []))
    rows = {}
    sbatch_by_job = {}
    for start, end, rc, out in sbatch:
        m = re.match(r"(\d+)", out.strip())
        if m:
            sbatch_by_job[int(m.group(1))] = (start, end)
    for jobid, log in sorted(jobs.items()):
        e = events.get(jobid, {})
        row = {"kind": kind_of(log), "cpu": sampler.job_cpu(jobid)}
        if jobid in sbatch_by_job:
            s0, s1 = sbatch_by_job[jobid]
            row["sbatch"] = s1 - s0
            row["sbatch_start"] = s0
        if "submit" in e and "alloc" in e:
            row["queue"] = e["alloc"] - e["submit"]
            row["cpu_free"] = busy_at(e["submit"], events, jobid) < cpus
        snakes = sorted(t for t, k in sampler.procs.get(jobid, {}).values() if k == "snakemake")
        if snakes and "alloc" in e:
            row["launch"] = snakes[0] - e["alloc"]
        if len(snakes) >= 2:
            row["outer"] = snakes[1] - snakes[0]
        stamps = job_log_stamps(Path(log))
        if len(snakes) >= 2 and "rule_start" in stamps:
            row["inner"] = stamps["rule_start"] + 0.5 - snakes[1]
        if "rule_end" in stamps and "end" in e:
            row["wrap_up"] = e["end"] - (stamps["rule_end"] + 0.5)
        if "end" in e:  # the first status query that shows the job in a final state
            final = re.compile(rf"(?:^|\s){jobid}\|(?:{'|'.join(FINAL_STATES)})\b")
            seen = [p for p in polls if p[0] >= e["end"] - 1 and final.search(p[3])]
            if seen:
                row["poll"] = seen[0][1] - e["end"]
                row["detected"] = seen[0][1]
        if "alloc" in e and "end" in e:
            row["run"] = e["end"] - e["alloc"]
        rows[jobid] = row
    # turnaround: a poll that saw jobs end -> the next sbatch, when it came soon after
    detections = sorted({r["detected"] for r in rows.values() if "detected" in r})
    turnaround = []
    for s0, _, _, _ in sbatch:
        before = [d for d in detections if d <= s0]
        if before and s0 - before[-1] < TURNAROUND_MAX_S:
            turnaround.append(s0 - before[-1])
    floor = {
        "sbatch": med([r["sbatch"] for r in rows.values() if "sbatch" in r]),
        "queue (CPU free)": med([r["queue"] for r in rows.values() if "queue" in r and r.get("cpu_free")]),
        "launch (allocation -> Snakemake started)": med([r["launch"] for r in rows.values() if "launch" in r]),
        "outer Snakemake (start, parse, DAG, srun)": med([r["outer"] for r in rows.values() if "outer" in r]),
        "inner Snakemake (start, parse, DAG)": med([r["inner"] for r in rows.values() if "inner" in r]),
        "wrap-up (rule end -> job end)": med([r["wrap_up"] for r in rows.values() if "wrap_up" in r]),
        "poll (job end -> seen)": med([r["poll"] for r in rows.values() if "poll" in r]),
        "turnaround (seen -> next sbatch)": med(turnaround),
    }
    return {"rows": rows, "floor": floor, "turnaround": turnaround,
            "queue_all": [r["queue"] for r in rows.values() if "queue" in r],
            "polls": len(polls), "poll_interval": med([b[0] - a[0] for a, b in zip(polls, polls[1:])])}


#: the job log's timestamp line ("[Thu Dec  3 08:19:49 2026]") and what follows it
_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]\n(.*)$", re.M)


def job_log_stamps(log: Path) -> dict[str, float]:
    """From a kept SLURM job log: when the inner Snakemake began the rule
    (``localrule <rule>:``) and when it finished it (its first ``Finished jobid``),
    epoch seconds (whole seconds)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return {}
    out = {}
    for m in _STAMP.finditer(text):
        t = dt.datetime.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y").timestamp()
        if m.group(2).startswith("localrule ") and "rule_start" not in out:
            out["rule_start"] = t
        elif m.group(2).startswith("Finished jobid") and "rule_start" in out and "rule_end" not in out:
            out["rule_end"] = t
    return out


def stack_model(blocks: int, root: Path) -> Path:
    import onnx
    from fixtures.models import transformer_encoder_stack

    path = root / "models" / f"stack{blocks}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(transformer_encoder_stack(blocks), path)
    return path


def main(argv: list[str] | None = None) -> int:
    import onnx

    argv = list(sys.argv[1:] if argv is None else argv)
    smk_extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    default_model = Path(onnx.__file__).parent / "backend/test/data/light/light_squeezenet.onnx"
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=default_model)
    ap.add_argument("--stack-blocks", type=int, help="transformer_encoder_stack of N blocks (N * 39 + 2 layers)")
    ap.add_argument("--jobs", type=int, default=2, help="local parallel jobs (default 2)")
    ap.add_argument("--profile", type=Path, default=REPO / "profiles" / "slurm")
    ap.add_argument("--nodes", type=int, default=1, help="SLURM nodes on this host (default 1)")
    ap.add_argument("--cpus-per-node", type=int, help="CPUs of each node (default: this machine's, shared out)")
    ap.add_argument("--compile-batch", type=int, help="discover --compile-batch N in both runs (the unit of work is "
                                                      "about 32 layers, a whole number of batches: 128 -> units of 128)")
    ap.add_argument("--skip-local", action="store_true", help="only the SLURM run (no ratio)")
    ap.add_argument("--keep", type=Path, help="keep the outputs here (default: a temporary directory)")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = ap.parse_args(argv)
    reason = local_slurm.unavailable_reason()
    if reason:
        raise SystemExit(f"cannot bring up SLURM here: {reason}")
    root = (args.keep or Path(tempfile.mkdtemp(prefix="cluster_overhead_"))).resolve()
    root.mkdir(parents=True, exist_ok=True)
    model = stack_model(args.stack_blocks, root) if args.stack_blocks else args.model.resolve()
    from torq_gen_config.config import model_name

    name = model_name(model)
    result: dict = {"model": str(model), "jobs": args.jobs, "nodes": args.nodes, "cpus_per_node": args.cpus_per_node,
                    "compile_batch": args.compile_batch, "snakemake_args": smk_extra}
    both = ["--compile-batch", str(args.compile_batch)] if args.compile_batch else []
    print(f"model {name}; this machine: {os.cpu_count()} CPUs; load at start {os.getloadavg()[0]:.1f}", flush=True)
    local_wall = None
    if not args.skip_local:
        meter = LoadMeter()
        meter.start()
        local_wall, local_cpu, _ = discover(model, root / "local", "-j", str(args.jobs), *both)
        local_load = meter.done()
        result.update(local_wall_s=round(local_wall, 1), local_cpu_s=round(local_cpu, 1), local_load=local_load)
        print(f"local   discover -j {args.jobs}: {local_wall:7.1f} s, {local_cpu:.1f} CPU s ({local_load})", flush=True)
    log_offset = local_slurm.SLURMCTLD_LOG.stat().st_size if local_slurm.SLURMCTLD_LOG.is_file() else 0
    cluster = local_slurm.start(root / "slurm-state", nodes=args.nodes, cpus_per_node=args.cpus_per_node)
    nodes = local_slurm.node_names(cluster)
    cpus = args.nodes * (args.cpus_per_node or os.cpu_count() or 1) if (args.nodes > 1 or args.cpus_per_node) \
        else (os.cpu_count() or 1)
    shim_log = root / "shims.log"
    shim_log.unlink(missing_ok=True)
    env = dict(os.environ, PATH=f"{write_shims(root / 'shims', shim_log)}:{os.environ['PATH']}")
    try:
        sampler = JobSampler()
        sampler.start()
        slurm_wall, submit_cpu, output = discover(model, root / "slurm", *both, "--profile", str(args.profile),
                                                  "--",
                                      "--slurm-keep-successful-logs", *smk_extra, env=env)
        sampler.stop_flag.set()
        sampler.join()
        ctld = local_slurm.SLURMCTLD_LOG.read_bytes()[log_offset:].decode(errors="replace")
    finally:
        subprocess.run(["scancel", "--user", "root"], capture_output=True, timeout=30)
        killed = local_slurm.stop(cluster)
    jobs = local_slurm.submissions(output)
    events = ctld_events(ctld)
    calls = shim_calls(shim_log)
    slurm_load = load_text(sampler.loads)
    by_kind = defaultdict(list)
    for jobid, log in jobs.items():
        by_kind[kind_of(log)].append(jobid)
    ratio = slurm_wall / local_wall if local_wall else None
    jobs_cpu = sum(sampler.job_cpu(j) for j in jobs)
    slurm_cpu = submit_cpu + jobs_cpu
    print(f"SLURM   discover --profile {args.profile.name} ({len(nodes)} node(s): {', '.join(nodes)}; {cpus} CPUs): "
          f"{slurm_wall:7.1f} s ({slurm_load}), {len(jobs)} submissions, {len(calls.get('sbatch', []))} sbatch calls"
          + (f"; extra Snakemake args: {' '.join(smk_extra)}" if smk_extra else ""))
    print(f"        CPU: {slurm_cpu:.1f} s ({jobs_cpu:.1f} in the SLURM jobs, {submit_cpu:.1f} in the submitting "
          "process)")
    if ratio:
        print(f"ratio SLURM / local: {ratio:.2f} (goal <= 1.3)")
        extra_cpu = (slurm_cpu - local_cpu) / max(1, len(jobs))
        print(f"CPU per submission beyond the local run's: {extra_cpu:.2f} s ((SLURM CPU - local CPU) / "
              f"{len(jobs)} submissions)")
        result.update(cpu_per_submission_s=round(extra_cpu, 2))
    work = root / "slurm" / "work" / name
    a = analyse(jobs, events, calls, sampler, work, cpus)
    print(f"\n{'submissions per rule':28} {'jobs':>4} {'peak MB':>8} {'max s':>6} {'median run':>11} "
          f"{'median CPU':>11}")
    for kind, ids in sorted(by_kind.items()):
        peak = max(sampler.peak_mb.get(i, 0) for i in ids)
        life = max((sampler.seen[i][1] - sampler.seen[i][0]) if i in sampler.seen else 0 for i in ids)
        runs = [a["rows"][i]["run"] for i in ids if "run" in a["rows"][i]]
        cpus_ = [a["rows"][i]["cpu"] for i in ids]
        print(f"{kind[:28]:28} {len(ids):4} {peak:8.0f} {life:6.1f} {fmt(med(runs)):>11} {fmt(med(cpus_)):>11}")
    print("\nfloor per submission (median over the jobs):")
    total = 0.0
    for part, v in a["floor"].items():
        print(f"  {part:40} {fmt(v)}")
        total += v or 0.0
    print(f"  {'sum':40} {total:.2f} s")
    print(f"  (queue of all submissions, CPU free or not: median {fmt(med(a['queue_all']))}, max "
          f"{fmt(max(a['queue_all']) if a['queue_all'] else None)}; {a['polls']} status queries, median interval "
          f"{fmt(a['poll_interval'])})")
    la = json.loads((root / "local" / f"torq_gen_config_{name}.json").read_text()) if local_wall else None
    lb = json.loads((root / "slurm" / f"torq_gen_config_{name}.json").read_text())
    if la is not None:
        equal = local_slurm.comparable(la) == local_slurm.comparable(lb)
        print("reports equal (minus timings, provenance, paths):", equal)
    if killed:
        print("daemons that needed SIGKILL:", killed)
    print(f"outputs in {root}")
    result.update(slurm_wall_s=round(slurm_wall, 1), slurm_cpu_s=round(slurm_cpu, 1),
                  slurm_jobs_cpu_s=round(jobs_cpu, 1), slurm_load=slurm_load, ratio=ratio and round(ratio, 3),
                  nodes=nodes, cpus=cpus, submissions={k: len(v) for k, v in sorted(by_kind.items())},
                  sbatch_calls=len(calls.get("sbatch", [])),
                  floor_s={k: v and round(v, 3) for k, v in a["floor"].items()}, floor_sum_s=round(total, 2),
                  per_job={str(j): {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()
                                    if k not in ("sbatch_start", "detected")} for j, r in a["rows"].items()},
                  reports_equal=None if la is None else local_slurm.comparable(la) == local_slurm.comparable(lb))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
