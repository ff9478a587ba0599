"""The full-model comparison of ``run`` and its per-partition checks use the
comparison rules of compare/ with the cosine requirement and the quantized-data
flags (library functions on small real models; no workflow run, no IREE)."""

from __future__ import annotations

import json

import numpy as np
import onnx
from conftest import TensorProto, helper, make_model, tvi
from onnx import numpy_helper

from torq_gen_config.compare import FULL_MODEL_MIN_COSINE
from torq_gen_config.fullrun.execute import _check_partition, _compare_and_finish
from torq_gen_config.fullrun.report_section import full_model_section

TOL = {"fp_avg_tol": 0.01, "fp_max_tol": 0.01}


def _finish_into(result):
    def finish(status, summary, failure=None):
        result.update(status=status, summary=summary, failure=failure)
        return result
    return finish


def _tiny_model(path):
    """y = x * 1e-9: outputs far below float32's absolute floor, as at the end of a
    random-weight MobileNetV2."""
    k = numpy_helper.from_array(np.array(1e-9, np.float32), "k")
    m = make_model([helper.make_node("Mul", ["x", "k"], ["y"])], [tvi("x", TensorProto.FLOAT, [4, 8])],
                   [tvi("y", TensorProto.FLOAT, [4, 8])], [k])
    onnx.save(m, path)
    return str(path)


def test_full_model_comparison_of_a_negated_output_is_a_difference():
    rng = np.random.default_rng(0)
    ref = {"y": (rng.standard_normal((4, 8)) * 1e-9).astype(np.float32)}
    meta = {"status": "ok", "output_names": ["y"]}
    result = {}
    res = _compare_and_finish(result, _finish_into(result), {"y": -ref["y"]}, ref, meta, TOL)
    assert res["status"] == "difference", res["summary"]
    assert res["summary"] == "cosine similarity -1 < min_cosine 0.99"
    assert res["metrics"]["min_cosine"] == FULL_MODEL_MIN_COSINE
    # the report re-derives it from the stored metrics (after a JSON round trip), for any tolerance
    stored = json.loads(json.dumps(res, allow_nan=False))
    section = full_model_section(stored, tolerance={"fp_avg_tol": 10.0, "fp_max_tol": 10.0})
    assert section["status"] == "difference" and "cosine" in section["summary"]
    # the right output passes, flagged inconclusive (the d rule alone cannot fail there)
    result = {}
    ok = _compare_and_finish(result, _finish_into(result), {"y": ref["y"].copy()}, ref, meta, TOL)
    assert ok["status"] == "success" and ok["metrics"]["inconclusive"] is True
    assert "inconclusive: reference magnitude" in ok["summary"]


def test_partition_check_of_a_negated_or_zero_output_is_a_difference(tmp_path):
    path = _tiny_model(tmp_path / "model.onnx")
    p = {"inputs": ["x"], "outputs": ["y"]}
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    right = {"y": (x * np.float32(1e-9)).astype(np.float32)}
    check = _check_partition(p, path, {"x": x}, right, TOL)
    assert check["status"] == "success" and check["inconclusive"] is True
    assert check["cosine_similarity"] > 0.999999
    check = _check_partition(p, path, {"x": x}, {"y": -right["y"]}, TOL)
    assert check["status"] == "difference" and check["summary"] == "cosine similarity -1 < min_cosine 0.99"
    check = _check_partition(p, path, {"x": x}, {"y": np.zeros_like(right["y"])}, TOL)
    assert check["status"] == "difference" and "output is all zero" in check["summary"]


def test_partition_check_integers_exact_unless_quantized_data(tmp_path):
    x = np.linspace(-3.0, 3.0, 32, dtype=np.float32).reshape(4, 8)
    s = numpy_helper.from_array(np.array(0.05, np.float32), "s")
    z = numpy_helper.from_array(np.array(0, np.int8), "z")
    shape = numpy_helper.from_array(np.array([32], np.int64), "shape")
    # QuantizeLinear -> Reshape: the output carries quantized data (one step allowed)
    q = make_model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                    helper.make_node("Reshape", ["q", "shape"], ["y"])],
                   [tvi("x", TensorProto.FLOAT, [4, 8])], [tvi("y", TensorProto.INT8, [32])], [s, z, shape])
    onnx.save(q, tmp_path / "q.onnx")
    # Cast float -> int8: exact
    c = make_model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT8)],
                   [tvi("x", TensorProto.FLOAT, [4, 8])], [tvi("y", TensorProto.INT8, [4, 8])])
    onnx.save(c, tmp_path / "c.onnx")
    p = {"inputs": ["x"], "outputs": ["y"]}
    levels = np.clip(np.rint(x / np.float32(0.05)), -128, 127).astype(np.int8).reshape(32)
    one_off = (levels.astype(np.int16) + 1).clip(-128, 127).astype(np.int8)
    assert _check_partition(p, str(tmp_path / "q.onnx"), {"x": x}, {"y": one_off}, TOL)["status"] == "success"
    cast_one_off = (x.astype(np.int8).astype(np.int16) + 1).astype(np.int8)
    check = _check_partition(p, str(tmp_path / "c.onnx"), {"x": x}, {"y": cast_one_off}, TOL)
    assert check["status"] == "difference" and "int_atol 0" in check["summary"]
    # the full-model comparison reads the quantized outputs from the model it ran
    meta = {"status": "ok", "output_names": ["y"]}
    result = {}
    res = _compare_and_finish(result, _finish_into(result), {"y": one_off}, {"y": levels}, meta, TOL,
                              model_path=str(tmp_path / "q.onnx"))
    assert res["status"] == "success" and res["metrics"]["outputs"][0]["quantized"] is True
    result = {}
    res = _compare_and_finish(result, _finish_into(result), {"y": one_off}, {"y": levels}, meta, TOL)
    assert res["status"] == "difference"  # without the model: exact
