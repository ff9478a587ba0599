"""The full-model verdict of ``run`` rests on a tolerance ONNX Runtime itself meets (its
error with all optimizations, measured by the full reference, widens the configured one)
and a ``difference`` names the partition that carries it (issue 42; no workflow run)."""

from __future__ import annotations

import json

import jsonschema
import numpy as np

from torq_gen_config.compare import FULL_MODEL_MIN_COSINE, compare_outputs
from torq_gen_config.fullrun.execute import _compare_and_finish, difference_carrier
from torq_gen_config.core.schemas import load_schema
from torq_gen_config.fullrun.report_section import full_model_section, render_full_model_text

TOL = {"fp_avg_tol": 0.01, "fp_max_tol": 0.01}
REF = {"y": np.linspace(1.0, 2.0, 1000).astype(np.float32)}


def _off(rel, n):
    out = REF["y"].copy()
    out[:n] *= (1 + rel)
    return {"y": out}


def _row(index, executor, status, max_rel):
    return {"index": index, "pid": f"{executor}-{index}", "executor": executor, "first_node": 3 * index,
            "last_node": 3 * index + 2, "layer_ids": [f"L{3 * index}", f"L{3 * index + 2}"],
            "partition_check": {"status": status, "summary": f"check {index}", "max_rel_diff": max_rel}}


def _meta(optimized_rel=None):
    meta = {"status": "ok", "engine": "onnxruntime", "output_names": ["y"]}
    if optimized_rel is not None:
        meta["optimized"] = {"engine": "onnxruntime", "graph_optimization_level": "all", "status": "ok",
                             "metrics": compare_outputs(_off(optimized_rel, 196), REF, ["y"],
                                                        min_cosine=FULL_MODEL_MIN_COSINE)}
    return meta


def _run(actual, meta, rows):
    result = {"partitions": rows, "reference": {"engine": meta["engine"], "optimized": meta.get("optimized")},
              "layer_executors": {}, "num_partitions": len(rows)}

    def finish(status, summary, failure=None):
        result.update(status=status, summary=summary, failure=failure)
        return result
    return _compare_and_finish(result, finish, actual, REF, meta, TOL)


def test_the_carrier_is_the_first_partition_whose_own_check_differs():
    rows = [_row(0, "llvm-cpu", "success", 1e-3), _row(1, "vmvx", "difference", 2e-2), _row(2, "ort", "difference", 5e-2)]
    c = difference_carrier(rows)
    assert c["partition"] == 1 and c["executor"] == "vmvx" and c["how"] == "own check differs"
    assert c["line"] == ("carried by partition 1 (vmvx, nodes 3-5, layers L3 .. L5 (2)), which differs from ONNX Runtime "
                         "on its own inputs: check 1")


def test_without_a_differing_check_the_error_accumulates_and_the_largest_is_named():
    rows = [_row(0, "llvm-cpu", "success", 1e-3), _row(1, "vmvx", "success", 8e-3), _row(2, "ort", "unverified", None)]
    c = difference_carrier(rows)
    assert c["partition"] == 1 and c["how"] == "accumulated" and c["max_rel_diff"] == 8e-3
    assert c["line"].startswith("no partition differs from ONNX Runtime on its own inputs, so the error accumulates "
                                "across the 3 partition(s); the largest own deviation is partition 1 (vmvx")
    assert difference_carrier([{"partition_check": None}]) is None  # one module: nobody to name


def _valid(res):
    props = load_schema("full_result.schema.yaml")["properties"]
    for key in ("tolerance_widened", "difference_partition", "reference"):
        jsonschema.validate(json.loads(json.dumps(res[key])), props[key])


def test_widened_to_what_onnx_runtime_needs_a_run_closer_than_it_passes_and_says_so():
    rows = [_row(0, "llvm-cpu", "success", 1e-3), _row(1, "vmvx", "success", 8e-3)]
    before = _run(_off(0.018, 153), _meta(), [dict(r) for r in rows])
    assert before["status"] == "difference" and before["tolerance_widened"] is None
    assert "; no partition differs from ONNX Runtime on its own inputs" in before["summary"]
    assert before["difference_partition"]["partition"] == 1
    _valid(before)
    res = _run(_off(0.018, 153), _meta(0.021), rows)
    assert res["status"] == "success" and res["num_over_tolerance"] == 0 and res["difference_partition"] is None
    w = res["tolerance_widened"]
    _valid(res)
    assert w["margin"] == 2.0 and abs(w["outputs"]["y"]["fp_max_tol"] - 0.042) < 1e-6
    assert "tolerance widened to 2 x what ONNX Runtime (all optimizations) is off the reference: output 'y' " \
           "fp_max_tol 1.0e-02 -> 4.2e-02 (it is 2.1e-02 off)" in res["summary"]
    # the report re-derives the same verdict from the stored result, after a JSON round trip
    section = full_model_section(json.loads(json.dumps(res, allow_nan=False)), tolerance=TOL)
    assert section["status"] == "success" and section["tolerance_widened"]["outputs"] == w["outputs"]
    assert section["summary"] == res["summary"]
    text = render_full_model_text(section)
    assert "Tolerance: tolerance widened to 2 x what ONNX Runtime" in text and "rule: per float output" in text
    # a tolerance edit in the report above the engine's need drops the widening
    loose = full_model_section(json.loads(json.dumps(res)), tolerance={"fp_avg_tol": 0.05, "fp_max_tol": 0.05})
    assert loose["status"] == "success" and loose["tolerance_widened"] is None


def test_an_engine_that_agrees_leaves_the_verdict_as_before():
    rows = [_row(0, "llvm-cpu", "success", 1e-3)]
    plain, agreed = _run(_off(0.018, 153), _meta(), [dict(rows[0])]), _run(_off(0.018, 153), _meta(0.0), rows)
    for k in ("status", "summary", "num_over_tolerance", "tolerance_widened"):
        assert plain[k] == agreed[k], k
    section = full_model_section(json.loads(json.dumps(agreed)), tolerance=TOL)
    assert section["status"] == "difference" and "Difference: no partition differs" in render_full_model_text(section)
    assert "Tolerance:" not in render_full_model_text(section)


def test_a_difference_beyond_the_widened_tolerance_names_its_partition():
    rows = [_row(0, "llvm-cpu", "success", 1e-3), _row(1, "vmvx", "difference", 9e-2)]
    res = _run(_off(0.09, 40), _meta(0.021), rows)
    assert res["status"] == "difference"
    assert res["summary"].startswith("max rel diff 9.0e-02 > fp_max_tol 4.2e-02")
    assert "carried by partition 1 (vmvx, nodes 3-5" in res["summary"] and "tolerance widened" in res["summary"]


def test_the_full_reference_measures_onnx_runtime_with_all_optimizations(tmp_path):
    import onnx
    from conftest import TensorProto, helper, make_model, tvi

    from torq_gen_config.reference import compute_reference, load_reference

    model = make_model([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
                       [tvi("x", TensorProto.FLOAT, [2, 8])], [tvi("y", TensorProto.FLOAT, [2, 8])])
    onnx.save(model, tmp_path / "m.onnx")
    meta = compute_reference(tmp_path / "m.onnx", tmp_path / "reference.npz", second_opinion="on_failure",
                             subject="the model", optimized_check=True)
    opt = meta["optimized"]
    assert opt["status"] == "ok" and opt["graph_optimization_level"] == "all" and opt["run_ms"] is not None
    assert opt["metrics"]["outputs"][0]["name"] == "y" and opt["metrics"]["min_cosine"] == FULL_MODEL_MIN_COSINE
    assert load_reference(tmp_path / "reference.npz")[2]["optimized"]["metrics"] == opt["metrics"]
    assert "optimized" not in compute_reference(tmp_path / "m.onnx", tmp_path / "r2.npz", second_opinion=False)
