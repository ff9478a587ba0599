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


def test_snakemake_lint_of_a_sweep_has_no_findings(tmp_path):
    """The sweep's own rules (rules/sweep.smk, config ``models``) with a one-model sheet. (The
    models' rules are the discovery's: linted above; with an absolute output directory the
    linter's path-prefix heuristic flags plan_full_model's weight-store param, which is a
    file the step reads, not a prefix.)"""
    sheet = tmp_path / "models.tsv"
    sheet.write_text("name\tmodel\nsq\tonnx:backend/test/data/light/light_squeezenet.onnx\n")
    r = run_snakemake("--lint", "--config", f"models={sheet}", f"output_dir={tmp_path / 'zoo'}", timeout=300)
    text = r.stdout + r.stderr
    assert "Congratulations" in text or "Lints for rule sq__" in text, text[-4000:]  # the lint ran
    assert "sweep.smk" not in text and "Lints for rule sweep" not in text, text[-4000:]
