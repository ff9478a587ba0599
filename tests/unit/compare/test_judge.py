"""Tests of torq_gen_config.compare.judge: arrays -> integer levels -> metrics -> verdict."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import TensorProto, helper, make_model, tvi
from onnx import numpy_helper

from torq_gen_config.compare import (FULL_MODEL_MIN_COSINE, Judgement, compare_on_model, compare_outputs,
                                     derive_status, judge)

SCALE, ZP = 0.05, 3


def _dq_model():
    """x (int8) -> DequantizeLinear (scale 0.05, zero point 3) -> y (float): a quantized layer's output."""
    s = numpy_helper.from_array(np.array(SCALE, np.float32), "s")
    z = numpy_helper.from_array(np.array(ZP, np.int8), "z")
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"])]
    return make_model(nodes, [tvi("x", TensorProto.INT8, [8])], [tvi("y", TensorProto.FLOAT, [8])], [s, z])


def _dequantized(q: np.ndarray) -> np.ndarray:
    return ((q.astype(np.float32) - np.float32(ZP)) * np.float32(SCALE)).astype(np.float32)


def test_success_matches_compare_outputs_and_derive_status():
    r = np.linspace(1.0, 2.0, 16, dtype=np.float32)
    o = r * np.float32(1 + 1e-4)
    j = judge({"y": o}, {"y": r}, ["y"])
    assert isinstance(j, Judgement) and j.status == "success"
    status, summary, metrics = j  # unpacks as a tuple
    assert metrics == compare_outputs({"y": o}, {"y": r}, ["y"])
    assert (status, summary) == derive_status(metrics)
    assert summary.startswith("all 16 elements within tolerance")
    json.dumps(metrics, allow_nan=False)  # JSON-safe


def test_difference_and_tolerance():
    r = np.ones(10, np.float32)
    o = r.copy()
    o[3] = 1.02  # 2 % off: over fp_max_tol 0.01
    j = judge({"y": o}, {"y": r}, ["y"])
    assert j.status == "difference"
    assert "max rel diff 2.0e-02 > fp_max_tol 1.0e-02" in j.summary and "1 of 10 elements" in j.summary
    loose = judge({"y": o}, {"y": r}, ["y"], {"fp_max_tol": 0.05, "fp_avg_tol": 0.05})
    assert loose.status == "success" and loose.metrics == j.metrics  # the tolerance changes only the verdict
    with pytest.raises(ValueError, match="unknown tolerance"):
        judge({"y": o}, {"y": r}, ["y"], {"no_such_tol": 1})


def test_min_cosine_applies():
    r = np.linspace(-1.0, 1.0, 64, dtype=np.float32)
    j = judge({"y": -r}, {"y": r}, ["y"], {"fp_max_tol": 10.0, "fp_avg_tol": 10.0}, min_cosine=FULL_MODEL_MIN_COSINE)
    assert j.status == "difference" and "cosine similarity" in j.summary
    assert j.metrics["min_cosine"] == FULL_MODEL_MIN_COSINE


def test_inconclusive_success_says_so():
    r = np.zeros(5, np.float32)
    j = judge({"y": np.zeros(5, np.float32)}, {"y": r}, ["y"])
    assert j.status == "success" and j.metrics["inconclusive"] is True
    assert "; inconclusive: " in j.summary


def test_model_levels_allow_one_step():
    m = _dq_model()
    q = np.array([-128, -5, 0, 1, 2, 3, 50, 127], np.int8)
    ref = _dequantized(q)
    off = q.copy()
    off[2] += 1  # one level off at -0.15: 33 % as floats, a difference
    act = _dequantized(off)
    assert derive_status(compare_outputs({"y": act}, {"y": ref}, ["y"]))[0] == "difference"
    j = judge({"y": act}, {"y": ref}, ["y"], model=m)
    assert j.status == "success"
    assert j.metrics["quantized_levels"] == {"y": {"scale": pytest.approx(SCALE), "zero_point": ZP, "dtype": "int8"}}
    out = j.metrics["outputs"][0]
    assert out["kind"] == "int" and out["quantized"] is True and out["max_abs_diff"] == 1
    assert out["declared_shape"] == [8]
    assert j.metrics == compare_on_model(m, {"y": act}, {"y": ref}, ["y"])  # the same metrics as compare_on_model
    off[5] += 2  # two levels: a difference
    j2 = judge({"y": _dequantized(off)}, {"y": ref}, ["y"], model=m)
    assert j2.status == "difference" and "max abs diff 2 > int_atol 1" in j2.summary


def test_explicit_levels_and_quantized_outputs():
    m = _dq_model()
    levels = {"y": {"scale": SCALE, "zero_point": ZP, "dtype": "int8"}}
    q = np.arange(-4, 4, dtype=np.int8)
    ref, act = _dequantized(q), _dequantized(q + np.int8(1))
    j = judge({"y": act, "i": np.array([4, 5], np.int8)}, {"y": ref, "i": np.array([5, 5], np.int8)}, ["y", "i"],
              levels=levels, quantized_outputs={"i"})
    assert j.status == "success" and j.metrics["quantized_levels"] == levels
    assert [o["quantized"] for o in j.metrics["outputs"]] == [True, True]
    exact = judge({"i": np.array([4, 5], np.int8)}, {"i": np.array([5, 5], np.int8)}, ["i"])
    assert exact.status == "difference"  # integers are exact unless they carry quantized data
    assert "quantized_levels" not in judge({"y": ref}, {"y": ref}, ["y"], levels={}).metrics
    with pytest.raises(ValueError, match="not both"):
        judge({"y": act}, {"y": ref}, ["y"], model=m, levels=levels)
