"""The full-model section says which reference judged the run: the spec where ONNX Runtime
failed, both failures when neither ran, and nothing misleading when the run failed first."""

import numpy as np

from torq_gen_config.compare import FULL_MODEL_MIN_COSINE, compare_outputs
from torq_gen_config.fullrun.report_section import full_model_section, render_full_model_text

ORT = "ONNX Runtime failed on the model: [ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find Min(13)"
FALLBACK = "reference: onnx (ONNX Runtime failed: [ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find Min(13))"


def _result(status, reference, metrics=None, failure=None):
    return {"status": status, "summary": "s", "metrics": metrics, "failure": failure, "reference": reference,
            "partitions": [], "layer_executors": {}, "num_partitions": 1}


def test_a_run_judged_against_the_spec_says_so_in_the_summary_and_the_text():
    y = np.arange(6, dtype=np.float32)
    m = compare_outputs({"y": y}, {"y": y}, ["y"], min_cosine=FULL_MODEL_MIN_COSINE)
    ref = {"status": "error", "message": ORT, "used": "onnx", "fallback": FALLBACK,
           "second": {"engine": "onnx", "status": "ok", "message": None}}
    section = full_model_section(_result("success", ref, m), tolerance={"fp_avg_tol": 0.01, "fp_max_tol": 0.01})
    assert section["status"] == "success" and section["summary"].endswith(f"({FALLBACK})")
    text = render_full_model_text(section)
    assert f"Judged against: {FALLBACK}" in text and "Reference failed" not in text


def test_both_references_failed_names_both():
    ref = {"status": "error", "message": ORT, "used": None, "fallback": None,
           "second": {"engine": "onnx", "status": "error", "message": "index 7 is out of bounds"}}
    text = render_full_model_text(full_model_section(_result("unverified", ref), tolerance={}))
    assert "Reference failed: " + ORT in text and "failed too: index 7 is out of bounds" in text


def test_a_run_that_failed_before_comparing_does_not_blame_the_reference():
    ref = {"status": "error", "message": ORT, "second": {"engine": "onnx", "status": "ok", "message": None}}
    failure = {"stage": "compile", "summary": "partition 0: compile failed"}
    text = render_full_model_text(full_model_section(_result("error", ref, failure=failure), tolerance={}))
    assert "Reference failed" not in text
    assert "onnx's reference implementation ran (the outputs were not compared: the run failed first)" in text
