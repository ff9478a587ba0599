#!/usr/bin/env python
"""Benchmark: discovery on this machine vs through SLURM (profiles/slurm), same model.

Measures, on a single-node SLURM on localhost (tests/workflow/local_slurm.py brings it up
with ../shared/scripts/setup_local_slurm.sh and stops it by PID; run as root):
  (a) wall time of `torq-gen-config discover -j J` (local, profiles/default);
  (b) wall time of `torq-gen-config discover --profile profiles/slurm`, the number of
      SLURM submissions (per rule or group, from the plugin's output) and, per submission,
      the peak memory (sum of RSS over the job's processes, sampled every 0.2 s from
      /proc: every process whose environment has that SLURM_JOB_ID) and its lifetime;
  (c) whether both reports are the same (minus timings, provenance and paths:
      tests/workflow/local_slurm.py, comparable()).
The per-rule figures size the resources of profiles/slurm.

Usage: python benchmarks/cluster_overhead.py [--model PATH] [--jobs 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "workflow"))
import local_slurm  # noqa: E402

PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


class JobSampler(threading.Thread):
    """Peak summed RSS (MB) and first/last time seen of each SLURM job's processes."""

    def __init__(self, period: float = 0.2):
        super().__init__(daemon=True)
        self.period, self.stop_flag = period, threading.Event()
        self.peak_mb: dict[int, float] = defaultdict(float)
        self.seen: dict[int, list[float]] = {}
        self.job_of: dict[tuple, int | None] = {}  # (pid, start time) -> SLURM job id (environment read once)

    def run(self):
        while not self.stop_flag.is_set():
            now, rss = time.monotonic(), defaultdict(float)
            for d in os.listdir("/proc"):
                if not d.isdigit():
                    continue
                pid = int(d)
                key = (pid, _start_time(pid))  # a pid is reused by later processes
                job = self.job_of.get(key, -1)
                if job == -1:
                    job = self.job_of[key] = _slurm_job(pid)
                if job is None:
                    continue
                try:
                    rss[job] += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KB / 1024
                except (OSError, IndexError, ValueError):
                    continue
            for job, mb in rss.items():
                self.peak_mb[job] = max(self.peak_mb[job], mb)
                self.seen.setdefault(job, [now, now])[1] = now
            self.stop_flag.wait(self.period)


def _start_time(pid: int) -> int | None:
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


def discover(model: Path, out: Path, *extra: str) -> tuple[float, str]:
    exe = str(Path(sys.executable).parent / "torq-gen-config")
    t0 = time.perf_counter()
    r = subprocess.run([exe, "discover", "--model", str(model), "--output-dir", str(out), "-q", *extra],
                       cwd=REPO, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"discover {' '.join(extra)} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return wall, r.stdout + r.stderr


def main() -> int:
    import onnx

    default_model = Path(onnx.__file__).parent / "backend/test/data/light/light_squeezenet.onnx"
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=default_model)
    ap.add_argument("--jobs", type=int, default=2, help="local parallel jobs (default 2)")
    ap.add_argument("--profile", type=Path, default=REPO / "profiles" / "slurm")
    ap.add_argument("--keep", type=Path, help="keep the outputs here (default: a temporary directory)")
    args = ap.parse_args()
    reason = local_slurm.unavailable_reason()
    if reason:
        raise SystemExit(f"cannot bring up SLURM here: {reason}")
    root = args.keep or Path(tempfile.mkdtemp(prefix="cluster_overhead_"))
    name = args.model.stem
    local_wall, _ = discover(args.model, root / "local", "-j", str(args.jobs))
    print(f"local   -j {args.jobs}: {local_wall:7.1f} s")
    cluster = local_slurm.start(root / "slurm-state")
    try:
        sampler = JobSampler()
        sampler.start()
        slurm_wall, output = discover(args.model, root / "slurm", "--profile", str(args.profile))
        sampler.stop_flag.set()
        sampler.join()
    finally:
        killed = local_slurm.stop(cluster)
    jobs = local_slurm.submissions(output)
    by_kind = defaultdict(list)
    for jobid, log in jobs.items():
        by_kind[log.split("slurm_logs/", 1)[1].split("/", 1)[0]].append(jobid)  # rule_<name> or group_<name>_...
    print(f"SLURM (profile {args.profile.name}): {slurm_wall:7.1f} s, {len(jobs)} submissions "
          f"({slurm_wall / local_wall:.2f}x local)")
    print(f"{'rule or group':60} {'jobs':>4} {'peak MB':>8} {'max s':>6}")
    for kind, ids in sorted(by_kind.items()):
        peak = max(sampler.peak_mb.get(i, 0) for i in ids)
        life = max((sampler.seen[i][1] - sampler.seen[i][0]) if i in sampler.seen else 0 for i in ids)
        print(f"{kind[:60]:60} {len(ids):4} {peak:8.0f} {life:6.1f}")
    a = json.loads((root / "local" / f"torq_gen_config_{name}.json").read_text())
    b = json.loads((root / "slurm" / f"torq_gen_config_{name}.json").read_text())
    print("reports equal (minus timings, provenance, paths):", local_slurm.comparable(a) == local_slurm.comparable(b))
    if killed:
        print("daemons that needed SIGKILL:", killed)
    print(f"outputs in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
