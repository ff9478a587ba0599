#!/usr/bin/env python
"""Benchmark: how discovery's cost grows with the number of layers (issue 27).

Builds stacks of transformer-encoder blocks (tests/fixtures/models.py,
``transformer_encoder_stack``: ``layers = blocks * 39 + 2``, every node a layer) at the
sizes of ``--sizes`` (layer counts; the block count is chosen to come closest) and
measures for each size, in one run:
  (a) ``snakemake --version``: wall time, median of 3 (the floor of any Snakemake call);
  (b) ``torq-gen-config discover --model M --output-dir D -j J -q`` from an empty output
      directory: wall time, CPU seconds (user + sys of the child processes, from
      ``resource.getrusage(RUSAGE_CHILDREN)``), CPU seconds per layer, peak RSS of the
      process tree (the discover process and its descendants, orphaned workers included:
      the benchmark is their subreaper; summed, sampled from /proc every 0.2 s; also the
      summed PSS, which counts the forked workers' shared pages once), the number of Snakemake jobs (the ``Finished jobid`` lines of the
      run's ``D/.snakemake/log/*.snakemake.log``) and jobs per layer (layers: the
      ``layers`` of ``D/work/<model>/layers/manifest.json``);
  (c) the no-op rerun on both forms, median of 3 each: ``torq-gen-config discover`` with
      the same arguments, and ``snakemake --cores J --config model=M output_dir=D`` from
      the repository root (the same output files; its ``.snakemake`` is the repository
      root's). A rerun that ran jobs is flagged.
Then prints a row per size and the ratios the issue sets goals for: CPU per layer
(largest) / CPU per layer (smallest) (goal <= 1.1), no-op (largest) / no-op (smallest) on
both forms (goal <= 1.5), and the peak RSS at the largest size (goal < 1 GB at 5,000 layers).

Usage: python benchmarks/bench_scale.py [--sizes 80,1000] [--jobs 2] [--keep DIR] [--json FILE]
       (--sizes 80,1000,5000 adds the 5,000-layer figure; at the ~0.4 s CPU per layer
       measured at 80-160 layers that is over 30 minutes on 2 cores; not measured)
"""

from __future__ import annotations

import argparse
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
BIN = Path(sys.executable).parent
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")

#: Nodes per block and nodes outside the blocks of ``transformer_encoder_stack`` (kept
#: equal to tests/fixtures/models.py's STACK_NODES_PER_BLOCK / STACK_EXTRA_NODES; the
#: unit test checks it).
NODES_PER_BLOCK, EXTRA_NODES = 39, 2

_FINISHED = re.compile(r"^\s*Finished job(?:id:)? \d+", re.M)  # Snakemake 9 "Finished jobid: 3 (Rule: x)", 7/8 "Finished job 3."
_STEPS = re.compile(r"^\s*(\d+) of (\d+) steps \(\d+%\) done", re.M)
_NOTHING = re.compile(r"Nothing to be done")


def layers_for_blocks(blocks: int) -> int:
    """The layer count of a stack of ``blocks`` blocks."""
    return blocks * NODES_PER_BLOCK + EXTRA_NODES


def blocks_for_size(layers: int) -> int:
    """The block count whose stack comes closest to ``layers`` layers (at least 1)."""
    return max(1, round((layers - EXTRA_NODES) / NODES_PER_BLOCK))


def parse_sizes(text: str) -> list[int]:
    """``"80,1000"`` -> ``[80, 1000]`` (sorted, duplicates dropped, each > 0)."""
    sizes = sorted({int(s) for s in text.replace(" ", "").split(",") if s})
    if not sizes or sizes[0] <= 0:
        raise argparse.ArgumentTypeError(f"sizes must be positive layer counts: {text!r}")
    return sizes


def count_jobs(log_text: str) -> int:
    """The number of Snakemake jobs that finished in a run, from its log (or its console
    output): the ``Finished jobid: N`` lines (``Finished job N.`` before Snakemake 9),
    else the last ``K of M steps`` line's K; 0 for a run with nothing to do."""
    finished = len(_FINISHED.findall(log_text))
    if finished:
        return finished
    steps = _STEPS.findall(log_text)
    return int(steps[-1][0]) if steps else 0


def nothing_to_do(text: str) -> bool:
    """Whether Snakemake said the run had nothing to do."""
    return bool(_NOTHING.search(text))


def median(values: list[float]) -> float:
    return statistics.median(values)


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _ppid_map() -> dict[int, int]:
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                out[int(d)] = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return out


def tree_pids(root: int, ppids: dict[int, int]) -> set[int]:
    """``root`` and its descendants in a pid -> parent pid map."""
    children: dict[int, list[int]] = {}
    for pid, ppid in ppids.items():
        children.setdefault(ppid, []).append(pid)
    seen, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(children.get(pid, []))
    return seen


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants (Linux ``prctl``): a
    process whose parent ends before it (a ``multiprocessing`` forkserver and its workers
    when the discover process exits) is re-parented here instead of to init, so it stays
    in the sampled tree and, once reaped (:func:`reap_orphans`), its CPU time counts in
    ``RUSAGE_CHILDREN``. Returns whether that worked."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def reap_orphans(timeout: float = 30.0) -> list[int]:
    """Wait for every remaining child of this process (the orphans re-parented here),
    at most ``timeout`` seconds; returns the pids of those still running then."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return []
        if pid:
            continue
        if time.monotonic() > deadline:
            return sorted(tree_pids(os.getpid(), _ppid_map()) - {os.getpid()})
        time.sleep(0.05)


class TreeSampler(threading.Thread):
    """Peak summed RSS (bytes) of a process and its descendants, sampled from /proc; also
    the peak summed PSS (``smaps_rollup``: shared pages divided among their processes, so
    the forked workers' shared libraries count once), where the kernel has it. With
    ``include_root=False`` the root itself is left out (the benchmark's own process as the
    root: every process it started, orphans re-parented to it included)."""

    def __init__(self, root: int, period: float = 0.2, include_root: bool = True):
        super().__init__(daemon=True)
        self.root, self.period, self.stop_flag = root, period, threading.Event()
        self.include_root = include_root
        self.peak = 0
        self.peak_procs = 0
        self.peak_pss: int | None = None

    def sample(self) -> None:
        total, pss, procs = 0, 0, 0
        for pid in tree_pids(self.root, _ppid_map()) - (set() if self.include_root else {self.root}):
            try:
                total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_BYTES
                procs += 1
            except (OSError, IndexError, ValueError):
                continue
            if pss is not None:
                pss = _add_pss(pss, pid)
        if total > self.peak:
            self.peak, self.peak_procs = total, procs
        if pss is not None and (self.peak_pss is None or pss > self.peak_pss):
            self.peak_pss = pss

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.sample()
            self.stop_flag.wait(self.period)


def _add_pss(total: int, pid: int) -> int | None:
    """``total`` plus the PSS of ``pid`` in bytes; None when the kernel has no smaps_rollup
    (a process that ended meanwhile adds 0)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except FileNotFoundError:
        return None if Path(f"/proc/{pid}").exists() else total  # no smaps_rollup / the process ended
    except OSError:
        return total
    m = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
    return total + int(m.group(1)) * 1024 if m else total


def run_timed(cmd: list[str], *, cwd: Path, sample: bool = False, check: bool = True) -> dict:
    """Run ``cmd``; returns wall s (until ``cmd`` exits), child CPU s (after reaping the
    orphans it left: :func:`become_subreaper`), peak tree RSS/PSS (bytes, with ``sample``),
    the pids still running 30 s after it exited (``lingering``), the output and the exit
    status. Runs one command at a time: the sampled tree is every descendant of this process."""
    c0, t0 = cpu_children(), time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        p = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True)
        sampler = TreeSampler(os.getpid(), include_root=False) if sample else None
        if sampler:
            sampler.start()
        rc = p.wait()
        wall = time.perf_counter() - t0
        lingering = reap_orphans()
        cpu = cpu_children() - c0
        if sampler:
            sampler.stop_flag.set()
            sampler.join()
        out.seek(0)
        text = out.read()
    if check and rc != 0:
        sys.exit(f"{' '.join(cmd)} exited {rc}:\n{text[-4000:]}")
    return {"wall": wall, "cpu": cpu, "peak_rss": sampler.peak if sampler else None,
            "peak_procs": sampler.peak_procs if sampler else None,
            "peak_pss": sampler.peak_pss if sampler else None, "lingering": lingering, "output": text, "rc": rc}


def new_logs(log_dir: Path, before: set[Path]) -> str:
    """The text of the Snakemake logs in ``log_dir`` that are not in ``before``."""
    if not log_dir.is_dir():
        return ""
    return "".join(f.read_text(errors="replace") for f in sorted(set(log_dir.glob("*.snakemake.log")) - before))


def logs_in(log_dir: Path) -> set[Path]:
    return set(log_dir.glob("*.snakemake.log")) if log_dir.is_dir() else set()


def measure(size: int, root: Path, jobs: int, repeats: int = 3) -> dict:
    """Every figure of one size (see the module docstring)."""
    import onnx

    from fixtures.models import transformer_encoder_stack

    blocks = blocks_for_size(size)
    model = root / "models" / f"stack{blocks}.onnx"
    model.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(transformer_encoder_stack(blocks), model)
    out = root / f"stack{blocks}"
    shutil.rmtree(out, ignore_errors=True)
    tgc, smk = str(BIN / "torq-gen-config"), str(BIN / "snakemake")
    discover = [tgc, "discover", "--model", str(model), "--output-dir", str(out), "-j", str(jobs), "-q"]
    log_dir = out / ".snakemake" / "log"

    version = [run_timed([smk, "--version"], cwd=REPO)["wall"] for _ in range(repeats)]
    print(f"[{size}] {blocks} blocks: discovery ...", file=sys.stderr, flush=True)
    first = run_timed(discover, cwd=REPO, sample=True)
    log_text = new_logs(log_dir, set())
    n_jobs = count_jobs(log_text)
    manifest = json.loads((out / "work" / model.stem / "layers" / "manifest.json").read_text())
    n_layers = len(manifest["layers"])

    print(f"[{size}] no-op reruns ...", file=sys.stderr, flush=True)
    noop_tgc, noop_tgc_jobs = [], []
    for _ in range(repeats):
        before = logs_in(log_dir)
        r = run_timed(discover, cwd=REPO)
        noop_tgc.append(r["wall"])
        noop_tgc_jobs.append(count_jobs(new_logs(log_dir, before)))
    noop_smk, noop_smk_jobs = [], []
    smk_cmd = [smk, "--cores", str(jobs), "--config", f"model={model}", f"output_dir={out}"]
    for _ in range(repeats):
        r = run_timed(smk_cmd, cwd=REPO)
        noop_smk.append(r["wall"])
        noop_smk_jobs.append(0 if nothing_to_do(r["output"]) else max(1, count_jobs(r["output"])))
    return {
        "size": size, "blocks": blocks, "layers": n_layers, "expected_layers": layers_for_blocks(blocks),
        "model": str(model), "output_dir": str(out), "jobs": jobs,
        "snakemake_version_s": median(version), "snakemake_version_runs_s": version,
        "discover_wall_s": first["wall"], "discover_cpu_s": first["cpu"],
        "cpu_per_layer_s": first["cpu"] / n_layers,
        "peak_rss_mb": first["peak_rss"] / 2**20, "peak_rss_processes": first["peak_procs"],
        "peak_pss_mb": first["peak_pss"] / 2**20 if first["peak_pss"] is not None else None,
        "lingering_processes": first["lingering"],
        "snakemake_jobs": n_jobs, "jobs_per_layer": n_jobs / n_layers,
        "noop_discover_s": median(noop_tgc), "noop_discover_runs_s": noop_tgc, "noop_discover_jobs": noop_tgc_jobs,
        "noop_snakemake_s": median(noop_smk), "noop_snakemake_runs_s": noop_smk, "noop_snakemake_jobs": noop_smk_jobs,
    }


def summary(rows: list[dict]) -> dict:
    """The ratios of the largest size over the smallest, and the peak RSS at the largest."""
    small, large = rows[0], rows[-1]
    return {
        "cpu_per_layer_ratio": large["cpu_per_layer_s"] / small["cpu_per_layer_s"],
        "noop_discover_ratio": large["noop_discover_s"] / small["noop_discover_s"],
        "noop_snakemake_ratio": large["noop_snakemake_s"] / small["noop_snakemake_s"],
        "peak_rss_mb_largest": large["peak_rss_mb"], "peak_pss_mb_largest": large.get("peak_pss_mb"),
        "largest_layers": large["layers"],
        "smallest_layers": small["layers"],
    }


def print_table(rows: list[dict], s: dict) -> None:
    head = (f"{'layers':>6} {'blocks':>6} {'wall s':>8} {'CPU s':>8} {'CPU/layer':>9} {'peak MB':>8} {'PSS MB':>7} {'jobs':>6} "
            f"{'jobs/layer':>10} {'no-op tgc':>9} {'no-op smk':>9} {'smk --version':>13}")
    print(head)
    for r in rows:
        pss = f"{r['peak_pss_mb']:7.0f}" if r.get("peak_pss_mb") is not None else f"{'-':>7}"
        print(f"{r['layers']:6d} {r['blocks']:6d} {r['discover_wall_s']:8.1f} {r['discover_cpu_s']:8.1f} "
              f"{r['cpu_per_layer_s']:9.3f} {r['peak_rss_mb']:8.0f} {pss} {r['snakemake_jobs']:6d} "
              f"{r['jobs_per_layer']:10.2f} {r['noop_discover_s']:9.2f} {r['noop_snakemake_s']:9.2f} "
              f"{r['snakemake_version_s']:13.2f}")
    for r in rows:
        if r.get("lingering_processes"):
            print(f"WARNING: processes of the discovery at {r['layers']} layers still ran 30 s after it exited: "
                  f"{r['lingering_processes']}")
        if r["layers"] != r["expected_layers"]:
            print(f"WARNING: {r['layers']} layers in the manifest, {r['expected_layers']} expected ({r['blocks']} blocks)")
        for form in ("discover", "snakemake"):
            if any(r[f"noop_{form}_jobs"]):
                print(f"WARNING: the no-op reruns ({form}) at {r['layers']} layers ran jobs: {r[f'noop_{form}_jobs']}")
    if len(rows) < 2:
        print("(one size: no ratios)")
    else:
        span = f"{s['largest_layers']} / {s['smallest_layers']} layers"
        print(f"CPU per layer, {span}: {s['cpu_per_layer_ratio']:.2f} (goal <= 1.1)")
        print(f"no-op discover, {span}: {s['noop_discover_ratio']:.2f} (goal <= 1.5)")
        print(f"no-op snakemake, {span}: {s['noop_snakemake_ratio']:.2f} (goal <= 1.5)")
    pss = s.get("peak_pss_mb_largest")
    print(f"peak RSS at {s['largest_layers']} layers: {s['peak_rss_mb_largest']:.0f} MB (goal < 1 GB at 5,000 layers)"
          + (f"; peak PSS {pss:.0f} MB (shared pages counted once)" if pss is not None else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes("80,1000"),
                    help="layer counts, comma-separated (default 80,1000; 5000 opt-in)")
    ap.add_argument("--jobs", "-j", type=int, default=2, help="parallel jobs (default 2)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each timed no-op and --version (default 3)")
    ap.add_argument("--keep", type=Path, help="keep the models and outputs here (default: a temporary directory)")
    ap.add_argument("--json", type=Path, help="write the figures to this file")
    args = ap.parse_args(argv)
    subreaper = become_subreaper()
    root = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="tgc-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        rows = [measure(size, root, args.jobs, args.repeats) for size in args.sizes]
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    s = summary(rows)
    print(f"jobs: {args.jobs}  cores: {os.cpu_count()}  sizes: {args.sizes}"
          + ("" if subreaper else "  (not a subreaper: CPU of orphaned workers is not counted)"))
    print_table(rows, s)
    if args.json:
        args.json.write_text(json.dumps({"jobs": args.jobs, "cores": os.cpu_count(), "sizes": rows, "summary": s},
                                        indent=2) + "\n")
    if args.keep:
        print(f"outputs kept in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
