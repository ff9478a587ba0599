"""A single-node SLURM on localhost for the cluster tests and benchmarks/cluster_overhead.py.

``start`` runs ``../shared/scripts/setup_local_slurm.sh`` (installs Debian's slurm-wlm and
munge with apt when missing, writes /etc/slurm/slurm.conf, starts munged, slurmctld and
slurmd in the background and writes their PIDs to the state directory); ``stop`` stops
exactly those daemons by PID and puts /etc/slurm/slurm.conf back as it was. The last part
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
DAEMONS = ("slurmd", "slurmctld", "munged")  # stop order: node, controller, then authentication
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


def start(state_dir: Path, timeout: float = 600) -> LocalSlurm:
    """Bring up SLURM with the setup script (its PID files and daemon output in ``state_dir``).

    Raises:
        RuntimeError: the script failed (its output in the message); the daemons it
            started are stopped first.
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
    return cluster


def stop(cluster: LocalSlurm, timeout: float = 20) -> list[str]:
    """Stop the daemons ``start`` started, by PID (SIGTERM, then SIGKILL after ``timeout``),
    and restore /etc/slurm/slurm.conf. Returns the daemons that had to be killed."""
    killed = []
    for name in DAEMONS:
        pid = cluster.pids.get(name)
        if pid is None:
            continue
        children = _children(pid)  # munged runs under runuser: stop both
        for p in [pid, *children]:
            _signal(p, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(_alive(p) for p in [pid, *children]) and time.monotonic() < deadline:
            time.sleep(0.2)
        for p in [pid, *children]:
            if _alive(p):
                _signal(p, signal.SIGKILL)
                killed.append(f"{name} ({p})")
    if cluster.conf_before is None:
        SLURM_CONF.unlink(missing_ok=True)
    else:
        SLURM_CONF.write_bytes(cluster.conf_before)
    return killed


def running(cluster: LocalSlurm) -> list[str]:
    """The daemons of ``cluster`` still alive."""
    return [f"{name} ({pid})" for name, pid in cluster.pids.items() if _alive(pid)]


def submissions(output: str) -> dict[int, str]:
    """SLURM job id -> its log path, from Snakemake's slurm-plugin output."""
    return {int(m.group(1)): m.group(2) for m in SUBMITTED.finditer(output)}


#: what differs between two runs of the same discovery: when, how long, where
VOLATILE_KEYS = {"provenance", "timing", "timing_summary", "generated_at"}


def comparable(report: dict):
    """The report without timings and provenance (versions, tool paths, options with the
    model and output paths, generated_at): what a cluster run must give as a local one."""
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
