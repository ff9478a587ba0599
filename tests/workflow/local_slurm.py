"""A SLURM on localhost for the cluster tests and benchmarks/cluster_overhead.py.

``start`` runs ``../shared/scripts/setup_local_slurm.sh`` (installs Debian's slurm-wlm and
munge with apt when missing, writes /etc/slurm/slurm.conf, starts munged, slurmctld and
slurmd in the background and writes their PIDs to the state directory); ``stop`` stops
exactly those daemons by PID and puts /etc/slurm/slurm.conf back as it was.

``start(..., nodes=N, cpus_per_node=C)`` makes it N nodes of C CPUs each: one slurmd per
node on this host (``slurmd -N node<i>``, each with its own ``Port=``), which Debian's
slurm-wlm 22.05 runs although it is not built with ``--enable-multiple-slurmd`` (checked:
batch jobs pinned with ``-w`` to each node ran there; what that build lacks is about
multi-node job steps, which these jobs do not use). The last part
matters: with the slurm plugin installed, every Snakemake start runs ``scontrol show
config``, which waits 9 s when a slurm.conf names a controller that is not running; with
no slurm.conf it fails in milliseconds.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SETUP_SCRIPT = REPO.parent / "shared" / "scripts" / "setup_local_slurm.sh"
SLURM_CONF = Path("/etc/slurm/slurm.conf")
SLURMCTLD_LOG = Path("/var/log/slurm/slurmctld.log")
DAEMONS = ("slurmd", "slurmctld", "munged")  # stop order: node(s), controller, then authentication
#: first port of the slurmd of node<i> (17000 + i) when there are several nodes
NODE_PORT_BASE = 17000
#: "Job 3 has been submitted with SLURM jobid 21 (log: .../slurm_logs/rule_prepare_model/21.log)."
SUBMITTED = re.compile(r"submitted with SLURM jobid (\d+) \(log: (\S+?)\)")


def unavailable_reason() -> str | None:
    """Why a local SLURM cannot be brought up here, else None."""
    if not SETUP_SCRIPT.is_file():
        return f"the setup script {SETUP_SCRIPT} is missing"
    if os.geteuid() != 0:
        return "bringing up SLURM needs root (apt-get, /etc/slurm, daemons)"
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        return "slurm-wlm is not installed and there is no apt-get to install it"
    return None


@dataclass
class LocalSlurm:
    state_dir: Path
    pids: dict = field(default_factory=dict)
    conf_before: bytes | None = None
    log_offset: int = 0

    def controller_log(self) -> str:
        """What slurmctld logged since this cluster started."""
        try:
            with open(SLURMCTLD_LOG, "rb") as f:
                f.seek(self.log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""


def start(state_dir: Path, timeout: float = 600, *, nodes: int = 1, cpus_per_node: int | None = None) -> LocalSlurm:
    """Bring up SLURM with the setup script (its PID files and daemon output in ``state_dir``);
    with ``nodes`` > 1 or ``cpus_per_node``, the node is then replaced by ``nodes`` nodes
    of ``cpus_per_node`` CPUs (default: this machine's CPUs shared out), one slurmd each.

    Raises:
        RuntimeError: the script failed (its output in the message), or the nodes did
            not come up; the daemons started are stopped first.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    cluster = LocalSlurm(state_dir=state_dir,
                         conf_before=SLURM_CONF.read_bytes() if SLURM_CONF.is_file() else None,
                         log_offset=SLURMCTLD_LOG.stat().st_size if SLURMCTLD_LOG.is_file() else 0)
    r = subprocess.run(["bash", str(SETUP_SCRIPT)], env={**os.environ, "SLURM_STATE_DIR": str(state_dir)},
                       capture_output=True, text=True, timeout=timeout)
    cluster.pids = {name: int((state_dir / f"{name}.pid").read_text())
                    for name in DAEMONS if (state_dir / f"{name}.pid").is_file()}
    if r.returncode != 0 or "idle" not in r.stdout:
        stop(cluster)
        raise RuntimeError(f"setup_local_slurm.sh exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    if nodes > 1 or cpus_per_node is not None:
        try:
            _make_nodes(cluster, nodes, cpus_per_node or max(1, (os.cpu_count() or 1) // nodes))
        except Exception:
            stop(cluster)
            raise
    return cluster


def node_names(cluster: LocalSlurm) -> list[str]:
    """The SLURM node names of ``cluster`` (``localhost`` for the setup script's one node)."""
    names = [name.split("-", 1)[1] for name in cluster.pids if name.startswith("slurmd-")]
    return names or ["localhost"]


def _make_nodes(cluster: LocalSlurm, nodes: int, cpus: int, timeout: float = 60) -> None:
    """Replace the setup script's node by ``nodes`` nodes of ``cpus`` CPUs: stop its
    slurmd and slurmctld (by PID), rewrite the node and partition lines of slurm.conf
    (per-node spool directory, PID and log file: ``%n``), start slurmctld with a clean
    state and one ``slurmd -N node<i>`` per node."""
    for name in ("slurmd", "slurmctld"):
        _stop_pid(cluster.pids.pop(name), 20)
    mem = _conf_value("RealMemory", SLURM_CONF.read_text()) or "2000"
    mem_each = max(500, int(mem) // nodes)
    lines = []
    for line in SLURM_CONF.read_text().splitlines():
        if line.startswith(("NodeName=", "PartitionName=", "SlurmdSpoolDir=", "SlurmdPidFile=", "SlurmdLogFile=")):
            continue
        lines.append(line)
    host = os.uname().nodename.split(".")[0]
    names = [f"node{i}" for i in range(1, nodes + 1)]
    lines += ["SlurmdSpoolDir=/var/lib/slurm/slurmd-%n", "SlurmdPidFile=/run/slurmd-%n.pid",
              "SlurmdLogFile=/var/log/slurm/slurmd-%n.log"]
    lines += [f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={NODE_PORT_BASE + i} CPUs={cpus} "
              f"RealMemory={mem_each} State=UNKNOWN" for i, n in enumerate(names, 1)]
    lines.append(f"PartitionName=debug Nodes={','.join(names)} Default=YES MaxTime=INFINITE State=UP")
    SLURM_CONF.write_text("\n".join(lines) + "\n")
    d = cluster.state_dir
    with open(d / "slurmctld-nodes.out", "wb") as out:
        cluster.pids["slurmctld"] = subprocess.Popen(["slurmctld", "-D", "-c"], stdout=out, stderr=subprocess.STDOUT,
                                                     start_new_session=True).pid
    time.sleep(2)
    for n in names:
        Path(f"/var/lib/slurm/slurmd-{n}").mkdir(parents=True, exist_ok=True)
        with open(d / f"slurmd-{n}.out", "wb") as out:
            cluster.pids[f"slurmd-{n}"] = subprocess.Popen(["slurmd", "-D", "-N", n], stdout=out,
                                                           stderr=subprocess.STDOUT, start_new_session=True).pid
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run(["sinfo", "--noheader", "-N", "-o", "%N %t"], capture_output=True, text=True)
        states = dict(ln.split() for ln in r.stdout.splitlines() if len(ln.split()) == 2)
        if all(states.get(n) == "idle" for n in names):
            return
        time.sleep(1)
    raise RuntimeError(f"the {nodes} nodes did not come up within {timeout:.0f} s: {r.stdout.strip()!r}")


def _conf_value(key: str, text: str) -> str | None:
    m = re.search(rf"\b{key}=(\S+)", text)
    return m.group(1) if m else None


def stop(cluster: LocalSlurm, timeout: float = 20) -> list[str]:
    """Stop the daemons ``start`` started, by PID (SIGTERM, then SIGKILL after ``timeout``),
    and restore /etc/slurm/slurm.conf. Returns the daemons that had to be killed."""
    killed = []
    order = sorted(cluster.pids, key=lambda name: DAEMONS.index(name.split("-", 1)[0]))  # slurmd-node<i>: a slurmd
    for name in order:
        killed += [f"{name} ({p})" for p in _stop_pid(cluster.pids[name], timeout)]
    if cluster.conf_before is None:
        SLURM_CONF.unlink(missing_ok=True)
    else:
        SLURM_CONF.write_bytes(cluster.conf_before)
    return killed


def _stop_pid(pid: int, timeout: float) -> list[int]:
    """SIGTERM ``pid`` and its children (munged runs under runuser: both), SIGKILL after
    ``timeout``; returns the PIDs that needed SIGKILL."""
    children = _children(pid)
    for p in [pid, *children]:
        _signal(p, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in [pid, *children]) and time.monotonic() < deadline:
        time.sleep(0.2)
    killed = []
    for p in [pid, *children]:
        if _alive(p):
            _signal(p, signal.SIGKILL)
            killed.append(p)
    return killed


def running(cluster: LocalSlurm) -> list[str]:
    """The daemons of ``cluster`` still alive."""
    return [f"{name} ({pid})" for name, pid in cluster.pids.items() if _alive(pid)]


def submissions(output: str) -> dict[int, str]:
    """SLURM job id -> its log path, from Snakemake's slurm-plugin output."""
    return {int(m.group(1)): m.group(2) for m in SUBMITTED.finditer(output)}


#: what differs between two runs of the same discovery: when, how long, where
# work_dir: its bytes include the logs, which a cluster's scheduler writes differently
VOLATILE_KEYS = {"provenance", "timing", "timing_summary", "generated_at", "work_dir"}


def comparable(report: dict):
    """The report without timings, provenance (versions, tool paths, options with the
    model and output paths, generated_at) and the work directory's size: what a cluster run must give as a local one."""
    if isinstance(report, dict):
        return {k: comparable(v) for k, v in report.items() if k not in VOLATILE_KEYS}
    if isinstance(report, list):
        return [comparable(v) for v in report]
    return report


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited (its parent has not collected it yet)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
