"""Tests of ``torq-gen-config edit`` (report/edit.py, cli/edit.py).

The reports are built with report.build.build_report from hand-made results that
carry real metrics (compare.compare_outputs on small arrays); no workflow run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from torq_gen_config.core.errors import ConfigError, ReportError
from torq_gen_config.report.build import build_compiler_json
from torq_gen_config.report.edit import (
    UNSET,
    apply_edit,
    edit_report_file,
    merge_user_choices,
    refresh_report,
)
from torq_gen_config.report.files import load_report, user_choices_path
from torq_gen_config.report.layer_select import close_matches, list_layers, match_layers

from sample_report import EXECUTORS, LAYERS, NAMES, TOL, _err, _layers, _metrics, _ok, _results, make_report  # noqa: F401

@pytest.fixture()
def report_path(tmp_path):
    """A report and its compiler JSON in tmp_path/out, as discover writes them."""
    out = tmp_path / "out"
    out.mkdir()
    rep = make_report()
    path = out / "torq_gen_config_tiny.json"
    path.write_text(json.dumps(rep, indent=2))
    (out / "torq_gen_config_tiny_compiler.json").write_text(json.dumps(build_compiler_json(rep), indent=2))
    return path


def cli(*argv):
    """``torq-gen-config edit ARGV`` in this process, through the console script's own
    entry point: returns its exit status (errors: status 2 and the one-line message)."""
    from torq_gen_config.cli.main import main

    return main(["edit", *map(str, argv)])


def _load(path):
    return json.loads(path.read_text())


def _compiler(report_path):
    return _load(report_path.with_name("torq_gen_config_tiny_compiler.json"))


# ---------------------------------------------------------------- matching


IDS = ["Conv_a", "Conv_ab", "Relu_a", "Relu_b"]


def test_match_all():
    assert match_layers(IDS, "ALL") == IDS


def test_match_fnmatch_case_insensitive():
    assert match_layers(IDS, "conv_*") == ["Conv_a", "Conv_ab"]
    assert match_layers(IDS, "RELU_?") == ["Relu_a", "Relu_b"]
    assert match_layers(IDS, "*_a?") == ["Conv_ab"]


def test_match_exact_case_insensitive_beats_substring():
    # "conv_a" is also a substring of "Conv_ab": the exact match wins
    assert match_layers(IDS, "conv_a") == ["Conv_a"]
    assert match_layers(IDS, "Relu_b") == ["Relu_b"]


def test_match_substring_case_insensitive():
    assert match_layers(IDS, "_A") == ["Conv_a", "Conv_ab", "Relu_a"]
    assert match_layers(IDS, "AB") == ["Conv_ab"]


def test_match_none_lists_close_ids():
    with pytest.raises(ReportError) as e:
        match_layers(IDS, "Cnv_a")
    msg = str(e.value)
    assert "no layer matches 'Cnv_a'" in msg and "Conv_a" in msg and "--list" in msg
    with pytest.raises(ReportError, match="no layer matches"):
        match_layers(IDS, "Softmax_*")
    many = [f"Conv_{i}" for i in range(30)]
    assert len(close_matches(many, "Conv_x")) <= 10


# ---------------------------------------------------------------- --list


def test_list_with_filter_and_totals(report_path, capsys):
    assert cli(report_path, "--list", "RELU") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "Total: 2 layer(s) (filtered from 6)"
    assert out[0].split() == ["Relu_relu1", "Relu", "llvm-cpu"]
    assert out[1].split()[0] == "Relu_relu2"

    assert cli(report_path, "--list") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "Total: 6 layer(s) (filtered from 6)"
    assert [ln.split()[0] for ln in out[:-1]] == [lid for lid, *_ in LAYERS]
    assert out[5].split() == ["Gather_critical", "Gather", "null"]

    assert cli(report_path, "--list", "nothing") == 0
    assert capsys.readouterr().out.strip() == "Total: 0 layer(s) (filtered from 6)"


def test_list_marks_user_choices(report_path):
    edit_report_file(report_path, "Relu_relu1", executor="ort")
    rows, total = list_layers(load_report(report_path), "relu_relu1")
    assert total == 6
    assert rows == [{"layer_id": "Relu_relu1", "op_type": "Relu", "recommended_executor": "ort",
                     "recommendation_source": "user", "tolerance_override": None}]


# ---------------------------------------------------------------- executor edits


def test_set_executor_updates_report_compiler_json_and_sidecar(report_path, capsys):
    assert cli(report_path, "--layer", "relu_relu1", "--executor", "ort") == 0
    out = capsys.readouterr().out
    assert "Relu_relu1" in out and "llvm-cpu -> ort (user)" in out
    op = _load(report_path)["ops"]["Relu_relu1"]
    assert op["recommended_executor"] == "ort" and op["recommendation_source"] == "user"
    rep = _load(report_path)
    assert rep["discovery_report"]["summary"]["user_recommendations"] == 1
    assert rep["discovery_report"]["summary"]["executor_counts"]["ort"] == 2
    assert "ort (user)" in rep["final_report_text"]
    assert _compiler(report_path)["op_assignments"]["42:12"] == {"executor": "ort"}
    side = _load(user_choices_path(report_path))
    assert side["ops"] == {"Relu_relu1": {"recommended_executor": "ort", "recommendation_source": "user"}}


def test_null_executor_is_json_null_and_left_out_of_compiler_json(report_path):
    assert "42:12" in _compiler(report_path)["op_assignments"]
    assert cli(report_path, "--layer", "Relu_relu1", "--executor", "null") == 0
    text = report_path.read_text()
    op = json.loads(text)["ops"]["Relu_relu1"]
    assert op["recommended_executor"] is None  # JSON null, not the string "null"
    assert op["recommendation_source"] == "user"
    assert '"null"' not in text
    assert "42:12" not in _compiler(report_path)["op_assignments"]
    assert len(_compiler(report_path)["op_assignments"]) == 4  # 5 mapped layers, one now unassigned
    side = _load(user_choices_path(report_path))
    assert side["ops"]["Relu_relu1"] == {"recommended_executor": None, "recommendation_source": "user"}
    assert '"recommended_executor": null' in user_choices_path(report_path).read_text()


def test_unknown_executor_refused_with_valid_names(report_path, capsys):
    before = report_path.read_bytes()
    assert cli(report_path, "--layer", "Relu_relu1", "--executor", "npu") == 2
    err = capsys.readouterr().err
    assert "unknown executor 'npu'" in err
    assert "llvm-cpu, vmvx, ort" in err
    assert report_path.read_bytes() == before
    assert not user_choices_path(report_path).exists()


def test_batch_edit_lists_layers(report_path, capsys):
    assert cli(report_path, "--layer", "Conv_*", "--executor", "ort") == 0
    out = capsys.readouterr().out
    assert "Batch edit: 2 layers: Conv_conv1, Conv_conv2" in out
    ops = _load(report_path)["ops"]
    assert ops["Conv_conv1"]["recommended_executor"] == "ort"
    assert ops["Conv_conv2"]["recommended_executor"] == "ort"
    assert ops["Relu_relu1"]["recommendation_source"] == "discovery"
    assert cli(report_path, "--layer", "ALL", "--executor", "vmvx") == 0
    assert "Batch edit: 6 layers" in capsys.readouterr().out
    assert {op["recommended_executor"] for op in _load(report_path)["ops"].values()} == {"vmvx"}


def test_no_match_is_an_error(report_path, capsys):
    assert cli(report_path, "--layer", "Softmax", "--executor", "ort") == 2
    err = capsys.readouterr().err
    assert err.startswith("torq-gen-config: error: no layer matches 'Softmax'")


# ---------------------------------------------------------------- refusals


def test_compiler_json_refused_naming_the_report(report_path, capsys):
    comp = report_path.with_name("torq_gen_config_tiny_compiler.json")
    before = comp.read_bytes()
    assert cli(comp, "--layer", "ALL", "--executor", "ort") == 2
    err = capsys.readouterr().err
    assert "is a compiler JSON" in err and str(report_path) in err
    assert comp.read_bytes() == before
    assert cli(comp, "--list") == 2


def test_malformed_json_refused_and_untouched(report_path, capsys):
    report_path.write_text('{"ops": {"Conv_conv1": ')
    before = report_path.read_bytes()
    assert cli(report_path, "--layer", "ALL", "--executor", "ort") == 2
    err = capsys.readouterr().err
    assert "is not valid JSON" in err and str(report_path) in err
    assert report_path.read_bytes() == before
    report_path.write_text('{"model_name": "x"}')
    assert cli(report_path, "--list") == 2
    assert "has no 'ops' object" in capsys.readouterr().err


def test_malformed_sidecar_refused_before_any_write(report_path, capsys):
    side = user_choices_path(report_path)
    side.parent.mkdir(parents=True)
    side.write_text("[broken")
    before = report_path.read_bytes()
    assert cli(report_path, "--layer", "Relu_relu1", "--executor", "ort") == 2
    assert "user choices file" in capsys.readouterr().err
    assert report_path.read_bytes() == before
    assert side.read_text() == "[broken"


@pytest.mark.parametrize("value", ["0", "-0.1", "nan", "inf"])
def test_bad_tolerance_refused(report_path, capsys, value):
    before = report_path.read_bytes()
    assert cli(report_path, "--layer", "Conv_conv1", f"--tolerance-max={value}") == 2
    assert "--tolerance-max must be a finite number > 0" in capsys.readouterr().err
    assert report_path.read_bytes() == before


def test_missing_arguments(report_path, capsys):
    assert cli(report_path, "--executor", "ort") == 2
    assert "--layer" in capsys.readouterr().err
    assert cli(report_path, "--layer", "Conv_conv1") == 2
    assert "nothing to change" in capsys.readouterr().err
    assert cli(report_path, "--layer", "Conv_conv1", "--reset", "--executor", "ort") == 2
    assert "--reset cannot be combined" in capsys.readouterr().err
    assert cli("--layer", "x", "--executor", "ort") == 2
    assert "give a report JSON path" in capsys.readouterr().err


def test_model_and_output_dir_find_the_report(report_path, capsys, tmp_path):
    out = report_path.parent
    assert cli("--model", tmp_path / "models" / "tiny.onnx", "--output-dir", out, "--list", "conv") == 0
    assert "Total: 2 layer(s) (filtered from 6)" in capsys.readouterr().out
    assert cli("--model", "other.onnx", "--output-dir", out, "--list") == 2
    assert "torq_gen_config_other.json" in capsys.readouterr().err
    # only the compiler JSON there: the error says edit needs the report
    report_path.unlink()
    assert cli("--model", "tiny.onnx", "--output-dir", out, "--list") == 2
    err = capsys.readouterr().err
    assert "only the compiler JSON" in err and "torq_gen_config_tiny.json" in err


# ---------------------------------------------------------------- tolerance edits


def test_tolerance_edit_turns_difference_into_success_and_moves_recommendation(report_path, capsys):
    rep = _load(report_path)
    conv = rep["ops"]["Conv_conv1"]
    assert conv["executors"]["llvm-cpu"]["status"] == "difference"
    assert conv["recommended_executor"] == "vmvx"
    assert _compiler(report_path)["op_assignments"]["100:12"] == {"executor": "vmvx"}
    timing_before = conv["executors"]["llvm-cpu"]["timing"]

    assert cli(report_path, "--layer", "Conv_conv1", "--tolerance-avg", "0.05", "--tolerance-max", "0.05") == 0
    out = capsys.readouterr().out
    assert "vmvx -> llvm-cpu" in out
    assert "llvm-cpu: difference -> success" in out

    rep = _load(report_path)
    conv = rep["ops"]["Conv_conv1"]
    assert conv["tolerance_override"] == {"fp_avg_tol": 0.05, "fp_max_tol": 0.05, "bf16_avg_tol": 0.05, "bf16_max_tol": 0.05}
    llvm = conv["executors"]["llvm-cpu"]
    assert llvm["status"] == "success"
    assert llvm["tolerance_used"] == {"fp_avg_tol": 0.05, "fp_max_tol": 0.05, "bf16_avg_tol": 0.05, "bf16_max_tol": 0.05}
    assert llvm["failure_report"] is None
    assert llvm["timing"] == timing_before  # verdict from stored metrics, no new run
    assert conv["recommended_executor"] == "llvm-cpu"
    assert conv["recommendation_source"] == "discovery"
    # summary, text and compiler JSON follow
    assert rep["discovery_report"]["summary"]["status_counts"]["difference"] == 0
    assert rep["discovery_report"]["summary"]["executor_counts"]["llvm-cpu"] == 4
    assert "difference: 0" in rep["final_report_text"]
    assert _compiler(report_path)["op_assignments"]["100:12"] == {"executor": "llvm-cpu"}
    # other layers keep the default tolerance
    assert "tolerance_override" not in rep["ops"]["Conv_conv2"]
    side = _load(user_choices_path(report_path))
    assert side["ops"] == {"Conv_conv1": {"tolerance_override": {"fp_avg_tol": 0.05, "fp_max_tol": 0.05, "bf16_avg_tol": 0.05, "bf16_max_tol": 0.05}}}


def test_one_tolerance_value_keeps_the_other(report_path):
    edit_report_file(report_path, "Conv_conv1", tolerance_max=0.05)
    conv = _load(report_path)["ops"]["Conv_conv1"]
    # mean rel diff 0.03 > fp_avg_tol 0.01 (kept from the default): still a difference
    assert conv["tolerance_override"] == {"fp_avg_tol": 0.01, "fp_max_tol": 0.05, "bf16_avg_tol": 0.01, "bf16_max_tol": 0.05}
    assert conv["executors"]["llvm-cpu"]["status"] == "difference"
    assert "mean rel diff" in conv["executors"]["llvm-cpu"]["failure_report"]["summary"]
    edit_report_file(report_path, "Conv_conv1", tolerance_avg=0.04)
    conv = _load(report_path)["ops"]["Conv_conv1"]
    assert conv["tolerance_override"] == {"fp_avg_tol": 0.04, "fp_max_tol": 0.05, "bf16_avg_tol": 0.04, "bf16_max_tol": 0.05}
    assert conv["executors"]["llvm-cpu"]["status"] == "success"


def test_tolerance_tightened_makes_critical_free_layer_a_difference(report_path):
    edit_report_file(report_path, "Relu_relu1", tolerance_max=1e-9, tolerance_avg=1e-9)
    op = _load(report_path)["ops"]["Relu_relu1"]
    assert {e["status"] for e in op["executors"].values()} == {"difference"}
    assert op["recommended_executor"] == "llvm-cpu"  # first difference
    assert op["executors"]["vmvx"]["failure_report"]["type"] == "accuracy_failure"


def test_tolerance_edit_keeps_a_person_made_recommendation(report_path):
    edit_report_file(report_path, "Conv_conv1", executor="ort")
    edit_report_file(report_path, "Conv_conv1", tolerance_avg=0.05, tolerance_max=0.05)
    conv = _load(report_path)["ops"]["Conv_conv1"]
    assert conv["executors"]["llvm-cpu"]["status"] == "success"
    assert conv["recommended_executor"] == "ort" and conv["recommendation_source"] == "user"
    side = _load(user_choices_path(report_path))
    assert side["ops"]["Conv_conv1"] == {"recommended_executor": "ort", "recommendation_source": "user",
                                         "tolerance_override": {"fp_avg_tol": 0.05, "fp_max_tol": 0.05, "bf16_avg_tol": 0.05, "bf16_max_tol": 0.05}}


def test_tolerance_edit_compiles_nothing(report_path):
    """In a fresh interpreter: the edit imports no backend, runs no tool."""
    code = textwrap.dedent(f"""
        import sys
        from torq_gen_config.report.edit import edit_report_file
        edit_report_file({str(report_path)!r}, "Conv_conv1", tolerance_avg=0.05, tolerance_max=0.05)
        import argparse
        from torq_gen_config.cli import edit
        p = argparse.ArgumentParser(); sub = p.add_subparsers()
        edit.add_parser(sub)
        a = p.parse_args(["edit", {str(report_path)!r}, "--layer", "Relu_*", "--tolerance-max", "0.02"])
        a.func(a)
        bad = sorted(m for m in sys.modules if m.startswith(("torq_gen_config.backends", "torq_gen_config.discovery.layer_test",
                     "torq_gen_config.pipeline.workflow_api", "torq_gen_config.core.tools", "iree", "onnxruntime", "snakemake")))
        print("IMPORTED:" + ",".join(bad))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    imported = [ln for ln in proc.stdout.splitlines() if ln.startswith("IMPORTED:")]
    assert imported == ["IMPORTED:"], imported
    conv = _load(report_path)["ops"]["Conv_conv1"]
    assert conv["executors"]["llvm-cpu"]["status"] == "success"
    assert not any(p.name == "result.json" for p in report_path.parent.rglob("*"))


# ---------------------------------------------------------------- reset


def test_reset_drops_person_made_choices(report_path, capsys):
    edit_report_file(report_path, "Conv_conv1", tolerance_avg=0.05, tolerance_max=0.05)
    edit_report_file(report_path, "Conv_conv1", executor="ort")
    edit_report_file(report_path, "Relu_relu1", executor="null")
    assert set(_load(user_choices_path(report_path))["ops"]) == {"Conv_conv1", "Relu_relu1"}

    assert cli(report_path, "--layer", "Conv_conv1", "--reset") == 0
    out = capsys.readouterr().out
    assert "ort (user) -> vmvx" in out and "llvm-cpu: success -> difference" in out
    conv = _load(report_path)["ops"]["Conv_conv1"]
    assert "tolerance_override" not in conv
    assert conv["recommended_executor"] == "vmvx" and conv["recommendation_source"] == "discovery"
    assert conv["executors"]["llvm-cpu"]["status"] == "difference"
    assert _load(user_choices_path(report_path))["ops"] == {
        "Relu_relu1": {"recommended_executor": None, "recommendation_source": "user"}}

    assert cli(report_path, "--layer", "ALL", "--reset") == 0
    rep = _load(report_path)
    assert rep["ops"]["Relu_relu1"]["recommended_executor"] == "llvm-cpu"
    assert rep["discovery_report"]["summary"]["user_recommendations"] == 0
    assert _load(user_choices_path(report_path))["ops"] == {}
    assert "42:12" in _compiler(report_path)["op_assignments"]


# ---------------------------------------------------------------- sidecar and build_report


def test_merge_user_choices_keeps_other_entries():
    rep = make_report()
    apply_edit(rep, ["Relu_relu1"], executor="ort")
    existing = {"ops": {"Old_layer": {"recommended_executor": "vmvx", "recommendation_source": "user"},
                        "Relu_relu1": {"recommended_executor": "vmvx", "recommendation_source": "user"}}}
    merged = merge_user_choices(existing, rep, ["Relu_relu1"])
    assert merged["ops"]["Old_layer"]["recommended_executor"] == "vmvx"
    assert merged["ops"]["Relu_relu1"]["recommended_executor"] == "ort"
    assert merged["model_name"] == "tiny"


def test_apply_edit_unset_leaves_recommendation():
    rep = make_report()
    changes = apply_edit(rep, ["Conv_conv1"], executor=UNSET, tolerance_max=0.05, tolerance_avg=0.05)
    assert changes[0].status_changes == {"llvm-cpu": ("difference", "success")}
    assert changes[0].old_recommendation == "vmvx" and changes[0].new_recommendation == "llvm-cpu"
    compiler = refresh_report(rep)
    assert compiler["op_assignments"]["100:12"] == {"executor": "llvm-cpu"}
    with pytest.raises(ConfigError, match="valid: llvm-cpu, vmvx, ort"):
        apply_edit(rep, ["Conv_conv1"], executor="host")


def test_sidecar_choices_survive_a_rebuild(report_path):
    """The aggregate step passes the sidecar as previous_report to build_report."""
    edit_report_file(report_path, "Relu_relu2", executor="ort")
    edit_report_file(report_path, "Conv_conv1", tolerance_avg=0.05, tolerance_max=0.05)
    side = _load(user_choices_path(report_path))
    rebuilt = make_report(previous_report=side)
    assert rebuilt["ops"]["Relu_relu2"]["recommended_executor"] == "ort"
    assert rebuilt["ops"]["Relu_relu2"]["recommendation_source"] == "user"
    conv = rebuilt["ops"]["Conv_conv1"]
    assert conv["tolerance_override"] == {"fp_avg_tol": 0.05, "fp_max_tol": 0.05, "bf16_avg_tol": 0.05, "bf16_max_tol": 0.05}
    assert conv["executors"]["llvm-cpu"]["status"] == "success"
    assert conv["recommended_executor"] == "llvm-cpu"
    assert build_compiler_json(rebuilt) == _compiler(report_path)


def test_sidecar_null_choice_survives_a_rebuild(report_path):
    edit_report_file(report_path, "Relu_relu1", executor=None)
    rebuilt = make_report(previous_report=_load(user_choices_path(report_path)))
    op = rebuilt["ops"]["Relu_relu1"]
    assert op["recommended_executor"] is None and op["recommendation_source"] == "user"
    assert "42:12" not in build_compiler_json(rebuilt)["op_assignments"]


def test_edit_refuses_while_a_run_of_the_model_is_running(report_path, capsys):
    """A running discovery rewrites the report from user_choices.json when it finishes:
    an edit meanwhile would be lost from the report, so it is refused (exit 2, one line
    naming the run) and nothing is written."""
    from torq_gen_config.core.layout import REPORT_PREFIX, lock_file

    name = report_path.stem[len(REPORT_PREFIX):]
    lock = report_path.parent / lock_file(name)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from torq_gen_config.core import run_lock
        run_lock.acquire({str(lock)!r}, what="the test")
        print("held", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = report_path.read_bytes()
        assert cli(report_path, "--layer", "ALL", "--executor", "ort") == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("torq-gen-config: error: another torq-gen-config run"), err
        assert report_path.read_bytes() == before
    finally:
        holder.kill()
        holder.wait()
    assert cli(report_path, "--layer", "ALL", "--executor", "ort") == 0  # free again
