"""Tests of the HTML report (report/html.py, report/plots.py, report/cells.py, cli/report.py)
on the shared hand-made report (tests/sample_report.py: real metrics, errors, a difference,
a critical failure). The page in a real browser: tests/workflow/test_html_report_e2e.py."""

from __future__ import annotations

import copy
import json
import re

import pytest

from sample_report import make_report
from torq_gen_config.cli.main import main
from torq_gen_config.report import plots
from torq_gen_config.report.build import build_compiler_json
from torq_gen_config.core.statuses import DISPLAY_STATUSES as CELL_STATUSES
from torq_gen_config.report.cells import cell_status
from torq_gen_config.report.html import MATRIX_ID, render_html, write_report_html


@pytest.fixture()
def report():
    rep = make_report()
    # an inconclusive success and a reference dispute, as the report builder records them
    entry = rep["ops"]["Relu_relu1"]["executors"]["vmvx"]
    entry["metrics"]["inconclusive"] = True
    entry["metrics"]["inconclusive_reasons"] = ["reference below the absolute floor"]
    rep["ops"]["Conv_conv2"]["reference"] = {"status": "ok", "dispute": {"summary": "onnxruntime and onnx differ"}}
    rep["discovery_report"]["reference_disputes"] = [
        {"layer_id": "Conv_conv2", "summary": "onnxruntime and onnx differ", "agree_with": {"onnx": ["vmvx"]}}]
    rep["discovery_report"]["inconclusive_checks"] = [
        {"layer_id": "Relu_relu1", "executor": "vmvx", "reason": "reference below the absolute floor"}]
    return rep


def test_cell_status_marks_inconclusive_and_untested(report):
    ops = report["ops"]
    assert cell_status(ops["Relu_relu1"]["executors"]["vmvx"]) == "success*"
    assert cell_status(ops["Conv_conv1"]["executors"]["llvm-cpu"]) == "difference"
    assert cell_status(ops["MatMul_fc"]["executors"]["vmvx"]) == "error"
    assert cell_status(None) == "not tested"


def test_status_matrix_cells_and_details(report):
    fig = plots.status_matrix(report)
    heat = fig.data[0]
    assert list(heat.x) == ["llvm-cpu", "vmvx", "ort"] and list(heat.y) == list(report["ops"])
    code = {s: i for i, s in enumerate(CELL_STATUSES)}
    assert list(heat.z[0]) == [code["difference"], code["success"], code["success"]]  # Conv_conv1
    assert list(heat.z[5]) == [code["error"]] * 3  # Gather_critical
    assert "legalization failed" in heat.text[4][0]  # MatMul_fc on llvm-cpu: the tool's summary on hover
    details = plots.matrix_details(report)
    assert len(details) == 6 * 3
    assert details["4|1"]["stage"] == "run" and details["4|1"]["summary"] == "trap"
    assert "line three" in details["4|1"]["message"]
    assert details["0|1"]["recommended"] and not details["0|0"]["recommended"]  # vmvx recommended on Conv_conv1
    star = fig.data[1]
    assert list(zip(star.x, star.y))[0] == ("vmvx", "Conv_conv1")
    assert "Gather_critical" not in star.y  # no recommendation, no star
    assert "dispute" in fig.layout.yaxis.ticktext[2]


def test_op_type_counts_and_error_stages(report):
    counts = plots.op_type_counts(report)
    assert counts["llvm-cpu"]["Conv"] == {"difference": 1, "success": 1}
    assert counts["ort"]["Gather"] == {"error": 1}
    assert counts["vmvx"]["Relu"] == {"success*": 1, "success": 1}
    assert plots.error_stages(report) == {"llvm-cpu": {"compile": 2}, "vmvx": {"compile": 1, "run": 1},
                                          "ort": {"run": 1}}


def test_speedups_need_runtime_medians(report):
    assert plots.speedups(report) == [] and plots.speedup_plot(report) is None
    ops = report["ops"]
    ops["Relu_relu1"]["executors"]["llvm-cpu"]["timing"]["median_ms"] = 0.5  # recommended
    ops["Relu_relu1"]["executors"]["vmvx"]["timing"]["median_ms"] = 2.0
    ops["MatMul_fc"]["executors"]["ort"]["timing"]["median_ms"] = 1.0  # recommended; the others erred
    rows = plots.speedups(report)
    assert rows == [{"layer": "Relu_relu1", "recommended": "llvm-cpu", "versus": "vmvx", "speedup": 4.0,
                     "recommended_ms": 0.5, "versus_ms": 2.0}]
    assert plots.speedup_plot(report) is not None


def test_timing_leaves_out_error_runs(report):
    lids, vals = plots._timed(report, "llvm-cpu", "compile_ms")
    assert "MatMul_fc" not in lids and "Gather_critical" not in lids and vals == [10.0] * 4


def test_page_sections_and_honest_statuses(report):
    page = render_html(report, compiler=build_compiler_json(report))
    assert page.startswith("<!DOCTYPE html>") and f'id="{MATRIX_ID}"' in page
    for text in ("Summary", "Verdicts per op type", "Compile and run time", "Error stages",
                 "Reference disputes (1)", "Inconclusive checks (1)", "Critical failures", "Gather_critical",
                 "reference below the absolute floor", "onnxruntime and onnx differ", "Full-model comparison",
                 "not run", "Precision, shapes and tools", "matches the report", "no runtime measurements"):
        assert text in page, text
    # self-contained: no script, style or image is loaded from anywhere
    assert not re.search(r'<(script|link|img)[^>]+(src|href)=["\']?(https?:)?//', page)
    data = json.loads(re.search(r'<script type="application/json" id="cell-details">(.*?)</script>', page,
                                re.S).group(1))
    assert data["5|2"]["status"] == "error" and data["5|2"]["summary"] == "no kernel"


def test_page_shows_full_model_and_compiler_mismatch(report):
    rep = copy.deepcopy(report)
    rep["full_model"] = {"status": "difference", "summary": "12 of 100 elements over tolerance", "mode": "partitions",
                         "metrics": {"max_rel_diff": 0.2, "num_elements": 100}, "num_over_tolerance": 12,
                         "assignment": {"source_file": "r.json", "layer_counts": {"vmvx": 5}}, "num_partitions": 2,
                         "partition_counts": {"vmvx": 1, "ort": 1}, "timing": {"compile_ms_total": 900.0},
                         "partitions": [{"index": 0, "executor": "vmvx", "first_node": 0, "last_node": 3,
                                         "layer_ids": ["a", "b"], "partition_check": {"status": "success"}}]}
    compiler = build_compiler_json(rep)
    first = next(iter(compiler["op_assignments"]))
    compiler["op_assignments"][first] = {"executor": "ort"}
    page = render_html(rep, compiler=compiler)
    assert "12 of 100 elements over tolerance" in page and "DIFFERS from the report" in page
    assert "not run:" not in page


def test_page_names_unavailable_executors_once(report):
    rep = copy.deepcopy(report)
    rep["unavailable_executors"] = [{"name": "cuda", "backend": "iree", "reason": "no CUDA device"}]
    page = render_html(rep)
    assert page.count("Executor cuda (iree): unavailable on this machine, not tested: no CUDA device") == 1


def test_report_command_writes_page(tmp_path, report, capsys):
    path = tmp_path / "torq_gen_config_tiny.json"
    path.write_text(json.dumps(report))
    (tmp_path / "torq_gen_config_tiny_compiler.json").write_text("{not json")
    assert main(["report", str(path)]) == 0
    html = tmp_path / "torq_gen_config_tiny.html"
    assert capsys.readouterr().out.strip() == f"HTML report: {html}"
    page = html.read_text()
    assert "is not valid JSON" in page  # the broken compiler JSON is a warning on the page
    assert main(["report", "--model", "tiny.onnx", "--output-dir", str(tmp_path), "-o", str(tmp_path / "x.html")]) == 0
    assert (tmp_path / "x.html").read_text().count("<!DOCTYPE html>") == 1


@pytest.mark.parametrize("content, message", [
    (None, "report JSON not found"),
    ("{\"ops\": ", "is not valid JSON"),
    ("{\"op_assignments\": {}}", "is a compiler JSON"),
    ("{\"ops\": {\"a\": 5}}", "not a valid torq-gen-config report: at ops/a"),  # the report schema
])
def test_report_command_bad_input_is_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "torq_gen_config_m.json"
    if content is not None:
        path.write_text(content)
    assert main(["report", "--model", "m.onnx", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("torq-gen-config: error:") and message in err[0], err
    assert not (tmp_path / "torq_gen_config_m.html").exists()


def test_minimal_report_renders(tmp_path):
    """The report schema requires only ``ops``: a page still comes out, saying what is missing."""
    page = render_html({"ops": {"Relu_a": {"op_type": "Relu"}}})
    assert "the report has no layers or no executors" in page and "Full-model comparison" in page


def test_write_is_atomic_and_replaces(tmp_path, report):
    path = tmp_path / "torq_gen_config_tiny.json"
    path.write_text(json.dumps(report))
    out = write_report_html(path)
    first = out.read_text()
    out2 = write_report_html(path)
    assert out2 == out and out.read_text() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["torq_gen_config_tiny.html", "torq_gen_config_tiny.json"]
