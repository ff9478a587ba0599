"""Tests of the recommendation rule, report assembly, compiler JSON and report text."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from torq_gen_config.compare import compare_outputs
from torq_gen_config.core.errors import ReportError
from torq_gen_config.report.build import build_compiler_json, build_report
from torq_gen_config.report.summary import summarize
from torq_gen_config.report.recommend import (
    is_critical_failure,
    recommend_executor,
    rederive_statuses,
)
from torq_gen_config.report.text import render_final_report_text

TOL = {"fp_avg_tol": 0.01, "fp_max_tol": 0.01, "bf16_avg_tol": 0.01, "bf16_max_tol": 0.05}


def _st(**statuses):
    return {name.replace("_", "-"): {"status": s} for name, s in statuses.items()}


# ---------------------------------------------------------------- recommend_executor


@pytest.mark.parametrize(
    "statuses, expected",
    [
        # the four examples of the original tool's manual (docs/original_tool.md, 'Recommendation')
        (dict(nss="success", css="difference", host="success"), "nss"),
        (dict(nss="error", css="difference", host="success"), "host"),
        (dict(nss="error", css="error", host="success"), "host"),
        (dict(nss="error", css="error", host="error"), None),
        # difference before unverified, unverified before nothing
        (dict(nss="unverified", css="difference", host="error"), "css"),
        (dict(nss="error", css="unverified", host="unverified"), "css"),
        (dict(nss="difference", css="difference", host="difference"), "nss"),
    ],
)
def test_recommend_priority_rule(statuses, expected):
    assert recommend_executor(_st(**statuses), ["nss", "css", "host"]) == expected


def test_recommend_prefers_success_over_earlier_difference():
    # the original tool's example "NSS=error, CSS=difference, Host=success" — a success anywhere wins
    results = _st(llvm_cpu="difference", vulkan="success")
    assert recommend_executor(results, ["llvm-cpu", "vulkan"]) == "vulkan"


def test_recommend_ignores_missing_and_unconfigured_executors():
    results = _st(llvm_cpu="success", host="difference")
    assert recommend_executor(results, ["vulkan", "host"]) == "host"
    assert recommend_executor({}, ["vulkan", "host"]) is None
    with pytest.raises(ValueError, match="invalid status"):
        recommend_executor({"host": {"status": "ok"}}, ["host"])


def test_is_critical_failure():
    assert is_critical_failure(_st(a="error", b="error")) is True
    assert is_critical_failure(_st(a="error", b="difference")) is False
    assert is_critical_failure(_st(a="error", b="unverified")) is False
    assert is_critical_failure({}) is False


# ---------------------------------------------------------------- rederive_statuses


def _metrics_with_rel_error(rel):
    r = np.linspace(1.0, 2.0, 100)
    return compare_outputs({"y": r * (1 + rel)}, {"y": r}, ["y"])


def test_rederive_statuses_uses_override_and_keeps_errors():
    m = _metrics_with_rel_error(0.03)
    op = {
        "executors": {
            "a": {"status": "difference", "tolerance_used": TOL, "metrics": m,
                  "failure_report": {"type": "accuracy_failure", "summary": "old"}},
            "b": {"status": "error", "tolerance_used": TOL, "metrics": None,
                  "failure_report": {"type": "error", "stage": "compile", "summary": "boom"}},
            "c": {"status": "unverified", "tolerance_used": TOL, "metrics": None, "failure_report": None},
        },
        "tolerance_override": {"fp_avg_tol": 0.05, "fp_max_tol": 0.05},
    }
    rederive_statuses(op, TOL)
    a = op["executors"]["a"]
    assert a["status"] == "success"
    assert a["tolerance_used"] == {"fp_avg_tol": 0.05, "fp_max_tol": 0.05, "bf16_avg_tol": 0.01, "bf16_max_tol": 0.05}
    assert a["failure_report"] is None
    assert op["executors"]["b"]["status"] == "error"
    assert op["executors"]["b"]["failure_report"]["summary"] == "boom"
    assert op["executors"]["c"]["status"] == "unverified"

    # back to the default tolerance: difference again, with a fresh accuracy report
    del op["tolerance_override"]
    rederive_statuses(op, TOL)
    assert a["status"] == "difference"
    assert a["tolerance_used"] == TOL
    fr = a["failure_report"]
    assert fr["type"] == "accuracy_failure" and fr["stage"] == "compare"
    assert fr["summary"].startswith("max rel diff 3.0e-02 > fp_max_tol 1.0e-02 (100 of 100")


# ---------------------------------------------------------------- build_report


EXECUTORS = [
    {"name": "llvm-cpu", "backend": "iree", "options": {}},
    {"name": "vulkan", "backend": "iree", "options": {"target": "x"}},
    {"name": "host", "backend": "iree", "options": {}},
]
NAMES = [e["name"] for e in EXECUTORS]


def _result(status, metrics=None, *, stage=None, summary=None, compile_ms=10.0, run_ms=2.0, ref="ok"):
    fr = None
    if status == "error":
        fr = {"type": "error", "stage": stage or "compile", "summary": summary or "compile failed", "message": "log"}
    return {
        "layer_id": "?", "executor": "?", "backend": "iree", "status": status,
        "tolerance_used": TOL, "metrics": metrics, "failure_report": fr,
        "timing": {"compile_ms": compile_ms, "run_ms": run_ms},
        "reference": {"status": ref, "message": None if ref == "ok" else "ORT failed: no kernel"},
    }


def _layers():
    return [
        {"layer_id": "Conv_conv1_1", "slug": "conv_conv1_1", "op_type": "Conv", "node_index": 0,
         "mlir_location": "100:12", "mac_count": 442368, "skipped_reason": None},
        {"layer_id": "Relu_relu1", "slug": "relu_relu1", "op_type": "Relu", "node_index": 1,
         "mlir_location": "42:12", "mac_count": None, "skipped_reason": None},
        {"layer_id": "Gather_" + "x" * 80, "slug": "gather_long", "op_type": "Gather", "node_index": 2,
         "mlir_location": None, "mac_count": None, "skipped_reason": None},
        {"layer_id": "Add_out", "slug": "add_out", "op_type": "Add", "node_index": 3,
         "mlir_location": "42:3", "mac_count": None, "skipped_reason": None},
        {"layer_id": "Loop_l", "slug": "loop_l", "op_type": "Loop", "node_index": 4,
         "mlir_location": "50:1", "mac_count": None, "skipped_reason": "op type skipped by --skip-ops"},
    ]


def _results():
    good = _metrics_with_rel_error(1e-5)
    bad = _metrics_with_rel_error(0.03)
    long_id = "Gather_" + "x" * 80
    return {
        "Conv_conv1_1": {
            "llvm-cpu": _result("difference", bad),
            "vulkan": _result("success", good, run_ms=1.0),
            "host": _result("success", good, run_ms=3.0),
        },
        "Relu_relu1": {
            "llvm-cpu": _result("error", stage="compile", summary="legalization failed"),
            "vulkan": _result("error", stage="run", summary="device lost"),
            "host": _result("error", stage="timeout", summary="timed out after 240 s"),
        },
        long_id: {
            "llvm-cpu": _result("unverified", ref="error"),
            "host": _result("error"),
            "not-configured": _result("success", good),
        },
        "Add_out": {
            "llvm-cpu": _result("success", good),
        },
    }


def _build(**kw):
    args = dict(model_name="squeezenet", layers=_layers(), results=_results(), executors=EXECUTORS,
                default_tolerance=TOL, mlir_file="work/squeezenet.mlir",
                provenance={"tool": "torq-gen-config 0.1.0"})
    args.update(kw)
    return build_report(**args)


def test_build_report_layout_and_recommendations():
    report = _build()
    assert report["version"] == "1.1"
    assert report["model_name"] == "squeezenet"
    assert report["executors"] == NAMES
    assert report["default_tolerance"] == TOL
    assert report["mlir_file"] == "work/squeezenet.mlir"
    assert report["provenance"] == {"tool": "torq-gen-config 0.1.0"}
    assert list(report["ops"]) == [layer["layer_id"] for layer in _layers()]

    conv = report["ops"]["Conv_conv1_1"]
    assert conv["recommended_executor"] == "vulkan"
    assert conv["recommendation_source"] == "discovery"
    assert conv["mlir_location"] == "100:12" and conv["_node_index"] == 0
    assert conv["op_type"] == "Conv" and conv["layer_slug"] == "conv_conv1_1"
    assert conv["mac_count"] == 442368
    diff = conv["executors"]["llvm-cpu"]
    assert diff["status"] == "difference"
    assert diff["max_diff"]["max_rel_diff"] == pytest.approx(0.03)
    assert diff["failure_report"]["type"] == "accuracy_failure"
    assert diff["timing"] == {"compile_ms": 10.0, "run_ms": 2.0}
    assert diff["reference_status"] == "ok"
    assert conv["executors"]["vulkan"]["failure_report"] is None

    relu = report["ops"]["Relu_relu1"]
    assert relu["recommended_executor"] is None and "mac_count" not in relu

    long_id = "Gather_" + "x" * 80
    gather = report["ops"][long_id]
    assert gather["mlir_location"] == "Gather"  # unmapped: the op type (seed behaviour)
    assert gather["recommended_executor"] == "llvm-cpu"  # unverified is better than nothing
    assert set(gather["executors"]) == {"llvm-cpu", "host"}  # unconfigured executor dropped
    assert gather["executors"]["llvm-cpu"]["failure_report"]["stage"] == "reference"

    loop = report["ops"]["Loop_l"]
    assert loop["executors"] == {} and loop["recommended_executor"] is None
    assert loop["skipped_reason"] == "op type skipped by --skip-ops"

    json.dumps(report, allow_nan=False)


def test_summary_counts_and_critical_failures():
    report = _build()
    summary = report["discovery_report"]["summary"]
    assert summary["total_layers"] == 5
    # Conv: 1 diff + 2 success; Relu: 3 error; Gather: 1 unverified + 1 error; Add: 1 success
    assert summary["status_counts"] == {"success": 3, "difference": 1, "error": 4, "unverified": 1, "skipped": 0}
    assert summary["executor_counts"] == {"llvm-cpu": 2, "vulkan": 1, "host": 0}
    assert summary["no_recommendation"] == 2
    assert summary["skipped_layers"] == 1
    assert summary["unverified_recommendations"] == 1
    # error runs are left out of the timing summary
    assert summary["timing_summary"]["vulkan"]["run_ms"] == {"avg_ms": 1.0, "min_ms": 1.0, "max_ms": 1.0, "samples": 1}
    assert summary["timing_summary"]["llvm-cpu"]["run_ms"]["samples"] == 3
    crit = report["discovery_report"]["critical_failures"]
    assert report["has_critical_failures"] is True
    assert [c["layer_id"] for c in crit] == ["Relu_relu1"]
    assert crit[0]["node_index"] == 1 and crit[0]["mlir_location"] == "42:12"
    assert crit[0]["error_details"]["vulkan"] == {"status": "error", "stage": "run", "summary": "device lost"}
    again, again_crit = summarize(report["ops"], NAMES)
    assert again == summary and again_crit == crit


def test_report_rederives_statuses_with_default_tolerance():
    # the layer-test job said "difference" at a stricter tolerance; the report's default says success
    results = _results()
    strict = {"fp_avg_tol": 1e-6, "fp_max_tol": 1e-6}
    results["Add_out"]["llvm-cpu"]["status"] = "difference"
    results["Add_out"]["llvm-cpu"]["tolerance_used"] = strict
    report = _build(results=results)
    entry = report["ops"]["Add_out"]["executors"]["llvm-cpu"]
    assert entry["status"] == "success" and entry["tolerance_used"] == TOL
    loose = _build(default_tolerance={"fp_avg_tol": 0.05, "fp_max_tol": 0.05})
    assert loose["ops"]["Conv_conv1_1"]["executors"]["llvm-cpu"]["status"] == "success"
    assert loose["ops"]["Conv_conv1_1"]["recommended_executor"] == "llvm-cpu"


def test_previous_report_user_choices_are_kept_and_validated():
    previous = copy.deepcopy(_build())
    previous["ops"]["Relu_relu1"]["recommended_executor"] = "host"
    previous["ops"]["Relu_relu1"]["recommendation_source"] = "user"
    previous["ops"]["Add_out"]["recommended_executor"] = "npu-gone"
    previous["ops"]["Add_out"]["recommendation_source"] = "user"
    previous["ops"]["Conv_conv1_1"]["tolerance_override"] = {"fp_avg_tol": 0.05, "fp_max_tol": 0.05}
    report = _build(previous_report=previous)

    relu = report["ops"]["Relu_relu1"]
    assert relu["recommended_executor"] == "host" and relu["recommendation_source"] == "user"
    assert report["discovery_report"]["summary"]["user_recommendations"] == 1
    # a user recommendation does not hide a critical failure
    assert [c["layer_id"] for c in report["discovery_report"]["critical_failures"]] == ["Relu_relu1"]

    add = report["ops"]["Add_out"]
    assert add["recommended_executor"] == "llvm-cpu" and add["recommendation_source"] == "discovery"
    assert add["user_recommendation_dropped"] == "npu-gone"

    conv = report["ops"]["Conv_conv1_1"]
    assert conv["tolerance_override"] == {"fp_avg_tol": 0.05, "fp_max_tol": 0.05, "bf16_avg_tol": 0.01, "bf16_max_tol": 0.05}
    assert conv["executors"]["llvm-cpu"]["status"] == "success"
    assert conv["executors"]["llvm-cpu"]["tolerance_used"]["fp_max_tol"] == 0.05
    assert conv["recommended_executor"] == "llvm-cpu"

    previous["ops"]["Conv_conv1_1"]["tolerance_override"] = {"fp_avg_tol": -1, "fp_max_tol": 0.05}
    with pytest.raises(ReportError, match="Conv_conv1_1"):
        _build(previous_report=previous)


def test_build_report_rejects_bad_input():
    with pytest.raises(ReportError, match="duplicate executor"):
        _build(executors=EXECUTORS + [EXECUTORS[0]])
    with pytest.raises(ReportError, match="invalid status"):
        _build(results={"Add_out": {"host": {"status": "passed"}}})
    with pytest.raises(ReportError, match="duplicate layer id"):
        _build(layers=_layers() + [_layers()[0]])


# ---------------------------------------------------------------- compiler JSON


def test_a_critical_layer_the_reference_failed_on_too_says_so():
    """No executor ran it and no reference engine computed it: the layer may not take these
    inputs (with sizes the tool chose for dynamic dims, those first): said on its line."""
    report = _build()
    report["ops"]["Relu_relu1"]["reference"] = {"status": "error", "used": None, "message": "cannot reshape"}
    line = next(x for x in render_final_report_text(report).splitlines() if x.startswith("  - Relu_relu1"))
    assert line == "  - Relu_relu1 (node: 1); the reference failed on it too, so the layer may not take these inputs"
    report["provenance"] = {"model": {"fixed_dims": [
        {"input": "x", "axis": 2, "was": "h", "to": 32, "source": "the model's stride 32"}]}}
    line = next(x for x in render_final_report_text(report).splitlines() if x.startswith("  - Relu_relu1"))
    assert line.endswith("(input sizes the tool chose: give the model's with --input-shapes)")


def test_compiler_json_sorted_numerically_and_filtered():
    comp = build_compiler_json(_build())
    assert comp["model_name"] == "squeezenet"
    # Relu (42:12) has no recommendation, Gather is unmapped, Loop is skipped
    assert list(comp["op_assignments"]) == ["42:3", "100:12"]
    assert comp["op_assignments"]["100:12"] == {"executor": "vulkan"}
    assert comp["op_assignments"]["42:3"] == {"executor": "llvm-cpu"}
    with pytest.raises(ReportError, match="no 'ops'"):
        build_compiler_json({"op_assignments": {}})


def test_compiler_json_orders_line_then_column():
    ops = {f"l{i}": {"mlir_location": loc, "recommended_executor": "host"}
           for i, loc in enumerate(["9:10", "10:2", "9:9", "10:10", "2:100"])}
    comp = build_compiler_json({"ops": ops, "model_name": "m"})
    assert list(comp["op_assignments"]) == ["2:100", "9:9", "9:10", "10:2", "10:10"]


# ---------------------------------------------------------------- text


def test_final_report_text_sections_and_table():
    report = _build()
    text = report["final_report_text"]
    assert text == render_final_report_text(report)
    lines = text.splitlines()
    assert "FINAL EXECUTOR DISCOVERY REPORT" in lines
    assert "Model: squeezenet" in lines
    assert "Total layers tested: 4" in lines  # the Loop layer is skipped
    assert "Layers in the model: 5 (1 not tested: 0 not testable, 1 skipped)" in lines
    assert "Status Summary (one verdict per (layer, executor) pair):" in lines and "  error: 4" in lines and "  unverified: 1" in lines
    assert "Recommended Executor Distribution:" in lines
    assert "  llvm-cpu: 2" in lines and "  vulkan: 1" in lines and "  host: 0" in lines
    assert "CRITICAL: 1 layer(s) with ALL executors ERRORS (no executor ran the layer)" in lines
    assert "  - Relu_relu1 (node: 1)" in lines
    assert "\x1b" not in text
    header = next(line for line in lines if line.split()[:1] == ["Layer"])
    assert header.split() == ["Layer", "llvm-cpu", "vulkan", "host", "Recommended"]
    for name in ("nss", "css", "NSS", "CSS", "HOST"):
        assert name not in header.split()
    gather_row = next(line for line in lines if line.startswith("Gather_"))
    cut = "Gather_" + "x" * 50 + "..."
    assert gather_row.startswith(cut) and len(cut) == 60
    assert gather_row.split()[1:] == ["unverified", "-", "error", "llvm-cpu", "(unverified)"]
    relu_row = next(line for line in lines if line.startswith("Relu_relu1"))
    assert relu_row.split() == ["Relu_relu1", "error", "error", "error", "-"]
    loop_row = next(line for line in lines if line.startswith("Loop_l"))
    assert loop_row.split() == ["Loop_l", "-", "-", "-", "-"]


def test_final_report_text_without_critical_failures():
    results = _results()
    results["Relu_relu1"]["host"] = _result("success", _metrics_with_rel_error(0.0))
    results.pop("Gather_" + "x" * 80)
    report = _build(results=results)
    assert report["has_critical_failures"] is False
    assert "No critical failures - all layers have at least one working executor" in report["final_report_text"]
    # rendering from ops alone (no discovery_report) gives the same text
    stripped = {k: v for k, v in report.items() if k != "discovery_report"}
    assert render_final_report_text(stripped) == report["final_report_text"]


def test_status_counts_say_how_many_successes_could_not_have_failed():
    from torq_gen_config.report.summary import status_counts_line

    constant = np.full(100, 0.001)  # a Softmax over 100 equal logits: one number to check
    results = _results()
    results["Add_out"]["llvm-cpu"] = _result("success", compare_outputs({"y": constant}, {"y": constant}, ["y"]))
    report = _build(results=results)
    summary = report["discovery_report"]["summary"]
    assert summary["status_counts"]["success"] == 3 and summary["inconclusive_checks"] == 1
    assert "  success: 3 (1 of them success*: could not have failed)" in report["final_report_text"].splitlines()
    line = status_counts_line(summary)
    assert line.startswith("success 3 (1 of them success*: could not have failed), difference 1, error 4")
    # none inconclusive: the plain counts
    plain = status_counts_line(_build()["discovery_report"]["summary"])
    assert plain.startswith("success 3, difference 1, error 4") and "success*" not in plain


def test_layers_whose_reference_repeats_along_an_axis_are_listed_once():
    ref = np.repeat(np.linspace(1.0, 2.0, 10).reshape(1, 1, 10), 3, axis=1)  # 3 equal channels
    m = compare_outputs({"y": ref}, {"y": ref}, ["y"])
    results = _results()
    results["Add_out"] = {"llvm-cpu": _result("success", m), "vulkan": _result("success", m)}
    report = _build(results=results)
    dr = report["discovery_report"]
    assert dr["blind_spots"] == [{"layer_id": "Add_out", "reason": m["blind_spots"][0]}]  # once, not per executor
    assert dr["summary"]["blind_spot_layers"] == 1
    lines = report["final_report_text"].splitlines()
    k = lines.index("BLIND SPOTS: 1 layer(s) whose reference repeats along an axis (their verdicts cannot see a "
                    "permutation or a wrong index along it):")
    assert lines[k + 1].startswith("  - Add_out: the reference repeats along axis 1 (3 equal slices)")
    assert dr["summary"]["status_counts"]["success"] == 4  # still successes: the values were compared
