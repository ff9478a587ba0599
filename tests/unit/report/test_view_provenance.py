"""``view``'s summary shows what was only in the report JSON: precision mode, opset, fixed
dims, the executors' compiler and runtime versions, and the full-model result."""

from __future__ import annotations

import io

from sample_report import make_report
from torq_gen_config.report.view import render_summary, tool_lines
from torq_gen_config.report.view_format import make_console

PROVENANCE = {
    "tool": "test",
    "model": {"opset": {"original": 9, "prepared": 17},
              "fixed_dims": [{"input": "x", "axis": 0, "was": "N", "to": 2, "source": "--input-shapes"}]},
    "executor_tools": {"llvm-cpu": {"iree_compiler_version": "IREE compiler version 3.13.0", "iree_runtime_version":
                                    "3.13.0"}, "ort": {"onnxruntime_version": "1.32.0"}},
}


def summary_text(report) -> str:
    buf = io.StringIO()
    render_summary(report, make_console(file=buf))
    return buf.getvalue()


def test_summary_shows_precision_dims_and_versions():
    rep = make_report(provenance=PROVENANCE)
    rep["precision"] = {"flags": {"quantize": False}}
    text = summary_text(rep)
    assert "Precision: fp32 as given (no bf16/int32 conversion, no quantization)" in text
    assert "Opset: 9 -> 17" in text and "Fixed dims: x dim 0 (N) -> 2" in text
    assert "Tools of llvm-cpu: iree-compiler IREE compiler version 3.13.0; iree-runtime 3.13.0" in text
    assert "Tools of ort: onnxruntime 1.32.0" in text


def test_no_fixed_dims_said_so_and_old_reports_quiet():
    assert "Fixed dims: none (no symbolic input dims)" in tool_lines(
        {"provenance": {"model": {"fixed_dims": []}}})
    assert tool_lines({}) == [] and tool_lines({"provenance": {"tool": "x"}}) == []
    assert "Precision:" not in summary_text(make_report())  # a report from before precision modes


def test_summary_shows_full_model_result():
    rep = make_report(provenance=PROVENANCE)
    rep["full_model"] = {"status": "difference", "summary": "3 of 10 elements over tolerance", "mode": "partitions",
                         "assignment": {"source_file": "r.json", "layer_counts": {"vmvx": 6}}, "num_partitions": 1,
                         "partition_counts": {"vmvx": 1}, "timing": {}, "metrics": None}
    text = summary_text(rep)
    assert "--- Full Model Comparison ---" in text and "Status: difference" in text
    assert "3 of 10 elements over tolerance" in text
