"""report.assemble: the ops are built a layer at a time from the results on disk, sharing
the results' dicts (issue 27: memory at 5,000 layers); the report equals the one
build_report makes from all results held and deep-copied, also with --dedup-layers and a
tolerance override on a duplicate (the re-derivation updates an op's reference_check)."""

from __future__ import annotations

import copy
import json

import numpy as np

from torq_gen_config.compare.metrics import compare_outputs
from torq_gen_config.core.layout import layer_result_file
from torq_gen_config.report.assemble import assemble_report
from torq_gen_config.report.build import build_report

EXECUTORS = [{"name": "llvm-cpu", "backend": "iree", "options": {}}, {"name": "ort", "backend": "onnxruntime",
                                                                        "options": {}}]
TOL = {"fp_avg_tol": 0.01, "fp_max_tol": 0.01}


def _metrics(err: float) -> dict:
    ref = np.linspace(-1, 1, 16, dtype=np.float32)
    return json.loads(json.dumps(compare_outputs({"y": ref + np.float32(err)}, {"y": ref}, ["y"])))


def _result(name: str, err: float, second_err: float) -> dict:
    return {"status": "success", "backend": "iree" if name == "llvm-cpu" else "onnxruntime", "tolerance_used": TOL,
            "metrics": _metrics(err), "failure_report": None, "timing": {"compile_ms": 3.0, "run_ms": 1.0},
            "reference": {"status": "ok", "engine": "onnxruntime", "ort_version": "1.2.3"},
            "reference_check": {"engine": "onnx", "metrics": _metrics(second_err)},
            "tool": {"name": name}}


def test_assembled_report_equals_the_report_of_all_results_held(tmp_path):
    layers_dir = tmp_path / "work" / "m" / "layers"
    # A and B have the same signature: with dedup, B copies A's verdicts
    man = {"layers": [{"layer_id": lid, "slug": lid, "op_type": "Relu", "node_index": i, "signature": sig}
                      for i, (lid, sig) in enumerate([("A", "s1"), ("B", "s1"), ("C", "s2")])]}
    errs = {"A": (1e-5, 2e-5), "C": (2e-3, 0.5)}
    results = {}
    for lid, (err, second) in errs.items():
        results[lid] = {}
        for e in EXECUTORS:
            r = _result(e["name"], err, second)
            path = tmp_path / layer_result_file(str(layers_dir), lid, e["name"])
            path.parent.mkdir(parents=True)
            path.write_text(json.dumps(r))
            results[lid][e["name"]] = r
    files = {"manifest": man, "prepare": {}, "locations": {"status": "error", "message": "not imported"},
             # a tight tolerance on the duplicate: its reference checks differ from A's
             "choices": {"ops": {"B": {"tolerance_override": {"fp_avg_tol": 1e-7, "fp_max_tol": 1e-7}}}}}
    for name, data in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    for dedup in (False, True):
        rep = assemble_report(model_name="m", manifest=str(tmp_path / "manifest.json"),
                              prepare_info=str(tmp_path / "prepare.json"), locations=str(tmp_path / "locations.json"),
                              results_root=str(layers_dir), executors=EXECUTORS, tolerance=TOL, options={},
                              output_dir=str(tmp_path), dedup_layers=dedup,
                              user_choices=str(tmp_path / "choices.json"))
        held = copy.deepcopy(results)
        if dedup:
            held["B"] = copy.deepcopy(results["A"])
        rows = [{"layer_id": l["layer_id"], "slug": l["slug"], "op_type": "Relu", "node_index": l["node_index"],
                 "mlir_location": None, "mac_count": None, "skipped_reason": None, "not_testable": None}
                for l in man["layers"]]
        want = build_report(model_name="m", layers=rows, results=held, executors=EXECUTORS, default_tolerance=TOL,
                            mlir_file=None, provenance={}, previous_report=files["choices"])
        for lid in ("A", "B", "C"):
            got = {k: v for k, v in rep["ops"][lid].items() if k != "duplicate_of"}
            assert got == want["ops"][lid], lid
        assert ("duplicate_of" in rep["ops"]["B"]) == dedup
        if dedup:  # the duplicate's tight tolerance did not leak into the source's checks
            a, b = (rep["ops"][x]["executors"]["llvm-cpu"]["reference_check"] for x in ("A", "B"))
            assert a["agrees_with"] == ["onnxruntime", "onnx"] and b["differs_from"] == ["onnxruntime", "onnx"]
        else:
            assert rep["ops"]["B"]["executors"] == {}  # B was tested without dedup and has no results
            assert rep["discovery_report"]["summary"] == {**want["discovery_report"]["summary"],
                                                          "distinct_layers_tested": 2}  # A and C have results
        assert rep["provenance"]["reference"]["ort_versions"] == ["1.2.3"]
        assert rep["provenance"]["executor_tools"] == {"llvm-cpu": {"name": "llvm-cpu"}, "ort": {"name": "ort"}}
