"""The Snakemake rules pass `snakemake --lint` (also a CI step, .ci/run): run from the
repository root with the default model of config/config.yaml, it reports no findings."""

from __future__ import annotations

from conftest import run_snakemake


def test_snakemake_lint_has_no_findings():
    r = run_snakemake("--lint", timeout=300)
    text = r.stdout + r.stderr
    assert r.returncode == 0, text[-4000:]
    # snakemake --lint exits 0 with findings too: it prints "Lints for ..." per finding
    assert "Lints for" not in text, text[-4000:]
    assert "Congratulations, your workflow is in a good condition!" in text, text[-4000:]
