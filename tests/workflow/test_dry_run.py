"""Building the DAG writes nothing: a dry run (`snakemake -n`) over a finished discovery,
with reruns pending (skipped verdicts to produce, timed-out jobs under a larger limit),
leaves every file of the output directory as it was and creates none."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import run_cli, run_snakemake, work
from test_e2e import small_cnn

pytestmark = pytest.mark.slow


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under ``root``: relative path -> (size, mtime ns)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_size if p.is_file() else 0, st.st_mtime_ns)
    return out


def test_dry_run_writes_nothing(tmp_path):
    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--skip-mode")
    assert r.returncode == 0, r.stderr[-3000:]
    # a timed-out layer test under a smaller limit than the next run's
    result = work(out) / "layers" / "Relu_relu" / "llvm-cpu" / "result.json"
    Path(str(result) + ".timed-out").write_text("1\n")
    before = snapshot(out)
    r = run_snakemake("-n", "--config", f"model={model}", f"output_dir={out}", "timeout_s=60", "--quiet", "rules")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "test_unit" in r.stdout, r.stdout[-3000:]  # the reruns are planned (the unit of the timed-out test)...
    assert snapshot(out) == before  # ...without touching a file


def test_discover_dry_run_lists_the_jobs_and_writes_nothing(tmp_path):
    """`torq-gen-config discover -n` on a finished output directory whose report a
    larger --timeout would not change: it names the jobs a real run would do (here
    the timed-out layer test) and changes no file."""
    model = small_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "out"
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    result = work(out) / "layers" / "Relu_relu" / "llvm-cpu" / "result.json"
    Path(str(result) + ".timed-out").write_text("1\n")
    # Snakemake's own state folder (.snakemake: its dry-run I/O cache) is not a result
    def results():
        return {k: v for k, v in snapshot(out).items() if not k.startswith(".snakemake")}

    before = results()
    r = run_cli("discover", "--model", model, "--output-dir", out, "--timeout", "60", "-n")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    text = r.stdout + r.stderr
    assert "test_unit" in text and "aggregate_report" in text, text[-3000:]
    assert results() == before
    r = run_cli("discover", "--model", model, "--output-dir", out, "--timeout", "1", "-n")  # same limit: nothing
    assert r.returncode == 0 and "test_unit" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    assert results() == before
