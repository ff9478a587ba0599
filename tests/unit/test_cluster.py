"""torq_gen_config.pipeline.cluster: the checks before `discover --profile` (one line, no 9 s wait)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from torq_gen_config.pipeline import cluster
from torq_gen_config.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_the_slurm_profile_names_the_slurm_executor_and_its_settings():
    settings = cluster.read_profile(REPO / "profiles" / "slurm")
    assert settings["executor"] == "slurm"
    assert settings["slurm-status-command"] == "squeue"  # no accounting database, no sacct
    # no groups: the jobs are units of layers already (pipeline/units.py); every rule with
    # resources set exists in rules/*.smk, and the unit rules have theirs
    assert "groups" not in settings and "group-components" not in settings
    rules = "".join(p.read_text() for p in (REPO / "rules").glob("*.smk"))
    assert {"prepare_unit", "test_unit"} <= {item.split(":")[0] for item in settings["set-resources"]}
    for item in settings.get("set-resources", []):
        assert f"rule {item.split(':')[0]}:" in rules or f"checkpoint {item.split(':')[0]}:" in rules, item


def test_the_slurm_profile_repeats_the_default_profiles_settings():
    """`discover --profile` reads only the given profile: what profiles/default sets beside
    local threads must be there too, with the same values."""
    default = yaml.safe_load((REPO / "profiles" / "default" / "config.yaml").read_text())
    slurm = cluster.read_profile(REPO / "profiles" / "slurm")
    for key, value in default.items():
        if key != "force-use-threads":
            assert slurm.get(key) == value, key


def test_missing_profile_and_bad_profile_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such profile directory"):
        cluster.check_profile(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no profile.yaml or config.yaml"):
        cluster.check_profile(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.yaml").write_text("executor: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot read config.yaml"):
        cluster.check_profile(tmp_path / "bad")


def test_a_local_profile_needs_no_plugin(tmp_path):
    (tmp_path / "config.yaml").write_text("cores: 2\n")
    assert cluster.check_profile(tmp_path) == "local"


def test_missing_executor_plugin_names_the_package_to_install(tmp_path, monkeypatch):
    (tmp_path / "config.yaml").write_text("executor: slurm\n")
    monkeypatch.setattr(cluster.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError) as e:
        cluster.check_profile(tmp_path)
    assert "snakemake-executor-plugin-slurm, which is not installed" in str(e.value)
    assert "pip install -e '.[cluster]'" in str(e.value) and "\n" not in str(e.value)


def test_no_slurm_client_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "config.yaml").write_text("executor: slurm\n")
    monkeypatch.setattr(cluster.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(cluster.shutil, "which", lambda tool: None)
    with pytest.raises(ConfigError, match="SLURM's sbatch is not on PATH"):
        cluster.check_profile(tmp_path)


@pytest.mark.parametrize("stdout, rc, expected", [
    ("Slurmctld(primary) at vm is DOWN\n", 1, "no SLURM controller answers"),
    ("", 1, "exit status 1"),
    ("Slurmctld(primary) at vm is UP\n", 0, None),
])
def test_controller_state_from_scontrol_ping(monkeypatch, stdout, rc, expected):
    monkeypatch.setattr(cluster.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(cluster.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a[0], rc, stdout=stdout, stderr=""))
    problem = cluster.slurm_controller_problem()
    assert (problem is None) if expected is None else (expected in problem and "\n" not in problem)


def test_a_hanging_scontrol_is_cut_short(monkeypatch):
    monkeypatch.setattr(cluster.shutil, "which", lambda tool: f"/usr/bin/{tool}")

    def hang(*a, **k):
        raise subprocess.TimeoutExpired(a[0], k["timeout"])

    monkeypatch.setattr(cluster.subprocess, "run", hang)
    assert "within 10 s" in cluster.slurm_controller_problem()


def test_discover_with_an_unusable_profile_fails_fast_in_one_line(tmp_path):
    """Before any model work or Snakemake start: exit 2, one line, in well under the 9 s
    that the slurm plugin's `scontrol show config` waits for a controller that is down."""
    profile = tmp_path / "p"
    profile.mkdir()
    (profile / "config.yaml").write_text("executor: no-such-executor\n")
    exe = str(Path(sys.executable).parent / "torq-gen-config")
    t0 = time.perf_counter()
    r = subprocess.run([exe, "discover", "--profile", str(profile), "--model", str(tmp_path / "m.onnx"),
                        "--output-dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "snakemake-executor-plugin-no-such-executor, which is not installed" in lines[0], lines
    assert time.perf_counter() - t0 < 8
    assert not (tmp_path / "out").exists()


def test_a_profile_setting_snakemake_does_not_know_is_one_line(tmp_path):
    """Found by a fresh-user test: 111 lines (Snakemake's whole usage) and a message about
    arguments after `--` that were never given."""
    from conftest import SQUEEZENET

    profile = tmp_path / "p"
    profile.mkdir()
    (profile / "config.yaml").write_text("nosuchoption: 3\n")
    exe = str(Path(sys.executable).parent / "torq-gen-config")
    r = subprocess.run([exe, "discover", "--profile", str(profile), "--model", str(SQUEEZENET),
                        "--output-dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines == [f"torq-gen-config: error: Snakemake rejected the settings of --profile {profile}: "
                     "unrecognized arguments: --nosuchoption=3"], lines


def test_a_local_run_imports_the_slurm_plugin_without_its_controller_probe(tmp_path, monkeypatch):
    """The slurm plugin runs `scontrol show config` at import (9 s for a controller that
    does not answer); a local run imports it with SLURM_CONF naming an empty file, so that
    the call fails at once, and the environment is as it was afterwards."""
    seen = {}
    fake = tmp_path / "snakemake_executor_plugin_slurm.py"
    fake.write_text("import os\nSEEN_SLURM_CONF = os.environ.get('SLURM_CONF')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, cluster.SLURM_PLUGIN, raising=False)
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    try:
        assert cluster.import_slurm_plugin_without_probe() is True
        seen["conf"] = sys.modules[cluster.SLURM_PLUGIN].SEEN_SLURM_CONF
        assert seen["conf"] == cluster.NO_SLURM_CONF and Path(seen["conf"]).read_bytes() == b""
        import os

        assert os.environ["SLURM_CONF"] == "/etc/slurm/slurm.conf"
        assert cluster.import_slurm_plugin_without_probe() is False  # imported already: nothing to do
    finally:
        # the fake must not outlive the test: a later find_spec would see it (test_slurm_e2e's
        # skip without the cluster extra); monkeypatch then puts back what was there before
        sys.modules.pop(cluster.SLURM_PLUGIN, None)


def test_no_slurm_plugin_installed_is_nothing_to_do(monkeypatch):
    monkeypatch.delitem(sys.modules, cluster.SLURM_PLUGIN, raising=False)
    monkeypatch.setattr(cluster.importlib.util, "find_spec", lambda name: None)
    assert cluster.import_slurm_plugin_without_probe() is False


@pytest.mark.parametrize("profile, expected", [(None, True), ("local", True), ("slurm", False)])
def test_only_local_runs_skip_the_probe(tmp_path, monkeypatch, profile, expected):
    import argparse

    from torq_gen_config.cli import options

    calls = []
    monkeypatch.setattr(cluster, "import_slurm_plugin_without_probe", lambda: calls.append(1))
    monkeypatch.setattr(cluster, "slurm_controller_problem", lambda: None)
    monkeypatch.setattr(cluster.importlib.util, "find_spec", lambda name: object())
    path = None
    if profile:
        path = tmp_path / "p"
        path.mkdir()
        (path / "config.yaml").write_text(f"executor: {profile}\n")
    options.resolve_execution_options(argparse.Namespace(cores=None, profile=str(path) if path else None))
    assert bool(calls) is expected


@pytest.mark.slow
def test_a_local_run_does_not_wait_for_a_slurm_controller_that_is_down(tmp_path):
    """Through the console script, with the plugin installed and a slurm.conf whose
    controller does not answer (SLURM_CONF: a file naming a port nothing listens on): a
    local dry run takes no longer than with no slurm.conf at all, where the probe fails at
    once (skipped without the plugin or scontrol, or where that probe is fast anyway)."""
    import importlib.util
    import os
    import shutil

    if importlib.util.find_spec(cluster.SLURM_PLUGIN) is None or shutil.which("scontrol") is None:
        pytest.skip("needs snakemake-executor-plugin-slurm and SLURM's scontrol")
    from conftest import SQUEEZENET

    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=down\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=1\n"
                    "NodeName=localhost CPUs=1 State=UNKNOWN\nPartitionName=debug Nodes=localhost Default=YES\n")
    down = {**os.environ, "SLURM_CONF": str(conf)}
    t0 = time.perf_counter()
    subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, env=down, timeout=60)
    probe_s = time.perf_counter() - t0
    if probe_s < 2:
        pytest.skip(f"`scontrol show config` gives up in {probe_s:.1f} s here: nothing to save")
    exe = str(Path(sys.executable).parent / "torq-gen-config")
    walls = {}
    for label, env in (("no slurm.conf", {**os.environ, "SLURM_CONF": cluster.NO_SLURM_CONF}),
                       ("controller down", down)):
        t0 = time.perf_counter()
        r = subprocess.run([exe, "discover", "--model", str(SQUEEZENET), "--output-dir", str(tmp_path / "out"), "-n"],
                           capture_output=True, text=True, env=env, timeout=300)
        walls[label] = time.perf_counter() - t0
        assert r.returncode == 0, r.stderr[-2000:]
    print(f"scontrol show config, controller down: {probe_s:.1f} s; discover -n: {walls}")
    assert walls["controller down"] < walls["no slurm.conf"] + probe_s / 2, (probe_s, walls)
