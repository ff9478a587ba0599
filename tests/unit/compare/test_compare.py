"""Tests of torq_gen_config.compare: the metric, the verdict rule, re-derivation."""

from __future__ import annotations

import json
import re
import time

import ml_dtypes
import numpy as np
import pytest

from conftest import TensorProto, helper, make_model, tvi
from onnx import numpy_helper

from torq_gen_config.compare import (
    ABS_DIFF_THRESHOLDS,
    DEFAULT_TOLERANCE,
    FULL_MODEL_MIN_COSINE,
    REL_DIFF_THRESHOLDS,
    compare_outputs,
    count_over_tolerance,
    default_int_atol,
    derive_status,
    inconclusive_reason,
    normalize_tolerance,
    quantized_data_outputs,
    status_details,
)


def _one(actual, reference, name="y"):
    return compare_outputs({name: actual}, {name: reference}, [name])


def _json_roundtrip(metrics):
    return json.loads(json.dumps(metrics, allow_nan=False))


def _ort(model, feeds):
    """ONNX Runtime outputs of ``model`` (optimizations off, as the reference)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


# ---------------------------------------------------------------- float metric


def test_identical_float32_is_success_with_zero_error():
    r = np.linspace(-3, 3, 60, dtype=np.float32).reshape(3, 4, 5)
    m = _one(r.copy(), r)
    out = m["outputs"][0]
    assert out["kind"] == "float"
    assert out["shape"] == [3, 4, 5] and out["ref_shape"] == [3, 4, 5]
    assert out["dtype"] == "float32" and out["ref_dtype"] == "float32"
    assert m["max_abs_diff"] == 0.0 and m["max_rel_diff"] == 0.0 and m["mean_rel_diff"] == 0.0
    assert m["cosine_similarity"] == pytest.approx(1.0)
    assert m["num_elements"] == 60
    assert out["rel_diff_counts_over"] == [0] * len(REL_DIFF_THRESHOLDS)
    status, summary = derive_status(m)
    assert status == "success"
    assert summary == "all 60 elements within tolerance (max rel diff 0.0e+00)"


def test_normalized_error_matches_hand_computation():
    # F = max(1e-7 (float64), 1e-3 * 4) = 4e-3
    r = np.array([1.0, 2.0, 0.0, -4.0])
    o = np.array([1.011, 2.0, 1e-4, -4.2])
    m = _one(o, r)
    out = m["outputs"][0]
    assert out["floor"] == pytest.approx(4e-3)
    # d = [0.011, 0, 1e-4 / 4e-3, 0.2 / 4]
    expected_d = np.array([0.011, 0.0, 0.025, 0.05])
    assert out["max_rel_diff"] == pytest.approx(0.05)
    assert out["mean_rel_diff"] == pytest.approx(expected_d.mean())
    assert out["max_abs_diff"] == pytest.approx(0.2)
    assert out["mean_abs_diff"] == pytest.approx((0.011 + 0 + 1e-4 + 0.2) / 4)
    cos = float(o @ r / (np.linalg.norm(o) * np.linalg.norm(r)))
    assert out["cosine_similarity"] == pytest.approx(cos)

    status, summary = derive_status(m)  # defaults 0.01 / 0.01
    assert status == "difference"
    assert summary == "max rel diff 5.0e-02 > fp_max_tol 1.0e-02 (3 of 4 elements over tolerance, 75.00%)"
    # max within, mean (0.0215) over
    status, summary = derive_status(m, {"fp_max_tol": 0.06, "fp_avg_tol": 0.02})
    assert status == "difference"
    assert summary == "mean rel diff 2.1e-02 > fp_avg_tol 2.0e-02 (max rel diff 5.0e-02)"
    assert derive_status(m, {"fp_max_tol": 0.06, "fp_avg_tol": 0.03})[0] == "success"


def test_floor_keeps_cancellation_near_zero_from_failing():
    # a reference element near zero (cancellation) next to large values
    r = np.array([1000.0, -999.0, 1e-6, 500.0], dtype=np.float32)
    o = np.array([1000.0, -999.0, 5e-5, 500.0], dtype=np.float32)
    m = _one(o, r)
    out = m["outputs"][0]
    assert out["floor"] == pytest.approx(1.0)  # 1e-3 * 1000 > 1e-5
    assert out["max_rel_diff"] < 1e-4
    assert derive_status(m)[0] == "success"
    # the plain relative error of that element would be about 49
    assert abs(5e-5 - 1e-6) / 1e-6 > 40


@pytest.mark.parametrize(
    "dtype, ref_values, floor",
    [
        (np.float64, [1e-9, -2e-9], 1e-7),
        (np.float32, [1e-9, -2e-9], 1e-5),
        (np.float16, [1e-4, 0.0], 1e-3),
        (ml_dtypes.bfloat16, [1e-4, 0.0], 1e-2),
        (np.float32, [0.0, 100.0], 0.1),  # the relative part wins
    ],
)
def test_floor_per_reference_dtype(dtype, ref_values, floor):
    r = np.array(ref_values).astype(dtype)
    m = _one(r.copy(), r)
    assert m["outputs"][0]["floor"] == pytest.approx(floor, rel=1e-2)


def test_bfloat16_outputs_are_compared_in_float64():
    r = np.array([1.0, 2.0, 3.0, -0.5], dtype=ml_dtypes.bfloat16)
    o = np.array([1.0078125, 2.0, 3.0, -0.5], dtype=ml_dtypes.bfloat16)  # one bf16 ulp at 1.0
    m = _one(o, r)
    out = m["outputs"][0]
    assert out["dtype"] == "bfloat16" and out["kind"] == "float"
    assert out["max_rel_diff"] == pytest.approx(0.0078125)
    assert derive_status(m)[0] == "success"
    # bf16 references use the bf16 bounds, not fp_max_tol
    assert derive_status(m, {"fp_max_tol": 0.005, "fp_avg_tol": 0.01})[0] == "success"
    status, summary = derive_status(m, {"bf16_max_tol": 0.005})
    assert status == "difference" and "bf16_max_tol" in summary


def test_bf16_bounds_apply_only_to_bf16_references():
    r = np.array([1.0, 2.0, 3.0, -0.5], dtype=np.float32)
    o = r.copy()
    o[0] = 1.03  # 3 % off: over fp_max_tol 0.01, within bf16_max_tol 0.05
    status, summary = derive_status(_one(o, r))
    assert status == "difference" and "fp_max_tol" in summary
    rb, ob = r.astype(ml_dtypes.bfloat16), o.astype(ml_dtypes.bfloat16)
    assert derive_status(_one(ob, rb))[0] == "success"


def test_counts_over_grid_equal_brute_force():
    rng = np.random.default_rng(7)
    r = rng.standard_normal(20000).astype(np.float32)
    o = (r + rng.standard_normal(20000).astype(np.float32) * np.float32(0.01)).astype(np.float32)
    m = _one(o, r)
    out = m["outputs"][0]
    rf, of = r.astype(np.float64), o.astype(np.float64)
    floor = max(1e-5, 1e-3 * np.abs(rf).max())
    d = np.abs(of - rf) / np.maximum(np.abs(rf), floor)
    brute = [int(np.count_nonzero(d > t)) for t in REL_DIFF_THRESHOLDS]
    assert out["rel_diff_counts_over"] == brute
    assert brute[0] > brute[-1]  # the data spans the grid
    count, share = count_over_tolerance(m, {"fp_max_tol": 0.02, "fp_avg_tol": 0.01})
    assert count == int(np.count_nonzero(d > 0.02))
    assert share == pytest.approx(count / 20000)


def test_count_over_tolerance_is_conservative_between_grid_points():
    r = np.array([1.0, 2.0, 0.0, -4.0])
    o = np.array([1.011, 2.0, 1e-4, -4.2])  # d = 0.011, 0, 0.025, 0.05
    m = _one(o, r)
    assert count_over_tolerance(m, {"fp_max_tol": 0.02}) == (2, 0.5)  # grid point: exact
    # 0.012 is not on the grid: counted at 0.01, which also counts d = 0.011
    count, _ = count_over_tolerance(m, {"fp_max_tol": 0.012})
    assert count == 3
    status, summary = derive_status(m, {"fp_max_tol": 0.012, "fp_avg_tol": 1.0})
    assert status == "difference"
    assert "(at most 3 of 4 elements over tolerance" in summary
    # below the smallest positive grid point: counted at 0 (every inexact element)
    assert count_over_tolerance(m, {"fp_max_tol": 1e-9})[0] == 3


def test_tolerance_change_rederives_from_json_without_arrays():
    rng = np.random.default_rng(3)
    r = rng.uniform(-1, 1, 5000).astype(np.float32)
    o = (r * np.float32(1.03)).astype(np.float32)  # 3 % relative error where |r| >= F
    stored = _json_roundtrip(_one(o, r))
    assert derive_status(stored)[0] == "difference"
    assert derive_status(stored, {"fp_avg_tol": 0.05, "fp_max_tol": 0.05})[0] == "success"
    assert derive_status(stored, {"fp_avg_tol": 0.05, "fp_max_tol": 0.025})[0] == "difference"
    # grid point 0.025: exact count equals a direct count
    count, _ = count_over_tolerance(stored, {"fp_max_tol": 0.025})
    d = np.abs(o.astype(np.float64) - r) / np.maximum(np.abs(r.astype(np.float64)), stored["outputs"][0]["floor"])
    assert count == int(np.count_nonzero(d > 0.025))


def test_summary_format_for_difference():
    r = np.ones(50176, dtype=np.float32)
    o = r.copy()
    o[:1234] = 1.032
    status, summary = derive_status(_one(o, r))
    assert status == "difference"
    assert re.fullmatch(
        r"max rel diff 3\.2e-02 > fp_max_tol 1\.0e-02 \(1234 of 50176 elements over tolerance, 2\.46%\)",
        summary,
    ), summary


# ---------------------------------------------------------------- NaN / inf


def test_nan_at_same_positions_is_equal_and_excluded():
    r = np.array([np.nan, 1.0, 2.0], dtype=np.float32)
    o = np.array([np.nan, 1.0, 2.0], dtype=np.float32)
    m = _one(o, r)
    assert m["nan_mismatch"] is False
    assert m["max_rel_diff"] == 0.0 and m["mean_rel_diff"] == 0.0
    assert derive_status(m)[0] == "success"
    json.dumps(m, allow_nan=False)


def test_nan_at_different_positions_is_a_difference():
    r = np.array([1.0, 1.0, 2.0], dtype=np.float32)
    o = np.array([np.nan, 1.0, 2.0], dtype=np.float32)
    m = _one(o, r)
    assert m["nan_mismatch"] is True
    assert m["outputs"][0]["num_nonfinite_mismatches"] == 1
    assert m["max_rel_diff"] is None  # not computable with a non-finite mismatch
    status, summary = derive_status(m, {"fp_max_tol": 100.0, "fp_avg_tol": 100.0})
    assert status == "difference"
    assert summary == ("1 of 3 elements non-finite where the reference is not, or the reverse "
                       "(e.g. nan vs 1.0 at index 0)")
    # the NaN element counts as over every threshold
    assert count_over_tolerance(m, {"fp_max_tol": 100.0})[0] == 1
    json.dumps(m, allow_nan=False)


def test_infinities():
    r = np.array([np.inf, -np.inf, 1.0], dtype=np.float32)
    assert derive_status(_one(r.copy(), r))[0] == "success"
    m = _one(np.array([np.inf, np.inf, 1.0], dtype=np.float32), r)  # -inf vs +inf
    assert m["inf_mismatch"] is True and m["nan_mismatch"] is False
    assert derive_status(m)[0] == "difference"
    m = _one(np.array([1e30, -np.inf, 1.0], dtype=np.float32), r)  # finite vs inf
    assert m["inf_mismatch"] is True
    assert derive_status(m)[0] == "difference"
    json.dumps(m, allow_nan=False)


def test_float64_overflow_is_stored_as_none_with_flag():
    r = np.array([-1.7e308, 1.0])
    o = np.array([1.7e308, 1.0])
    m = _one(o, r)
    assert m["metric_overflow"] is True
    assert m["outputs"][0]["max_abs_diff"] is None
    assert derive_status(m, {"fp_max_tol": 1e9, "fp_avg_tol": 1e9})[0] == "difference"
    json.dumps(m, allow_nan=False)


# ---------------------------------------------------------------- cosine


def test_cosine_similarity_edge_cases():
    z = np.zeros(4, dtype=np.float32)
    v = np.array([1, 2, 3, 4], dtype=np.float32)
    assert _one(z, z)["cosine_similarity"] == 1.0
    assert _one(z, v)["cosine_similarity"] is None
    assert _one(v, z)["cosine_similarity"] is None
    assert _one(-v, v)["cosine_similarity"] == pytest.approx(-1.0)
    big = np.array([1e300, 2e300])
    assert _one(big, big)["cosine_similarity"] == pytest.approx(1.0)


# ---------------------------------------------------------------- integers and bool


@pytest.mark.parametrize(
    "dtype, diff, quantized, expected",
    [
        # integers are exact unless they carry quantized data (then one step)
        (np.int8, 1, False, "difference"),
        (np.uint8, 1, False, "difference"),
        (np.int16, 1, False, "difference"),
        (np.int32, 1, False, "difference"),
        (np.int64, 1, False, "difference"),
        (np.int32, 0, False, "success"),
        (np.int8, 1, True, "success"),
        (np.uint8, 1, True, "success"),
        (np.int8, 2, True, "difference"),
        (np.int32, 1, True, "success"),
    ],
)
def test_integer_default_atol(dtype, diff, quantized, expected):
    r = np.array([10, 20, 30], dtype=dtype)
    o = r.copy()
    o[1] += diff
    m = compare_outputs({"y": o}, {"y": r}, ["y"], quantized_outputs=["y"] if quantized else [])
    assert m["outputs"][0]["kind"] == "int"
    assert m["outputs"][0]["quantized"] is quantized
    assert m["max_abs_diff"] == diff
    assert derive_status(m)[0] == expected
    assert derive_status(_json_roundtrip(m))[0] == expected


def test_int_atol_override_and_counts():
    r = np.arange(100, dtype=np.int8)
    o = r.copy()
    o[:5] += 3
    o[5:8] += 1
    m = compare_outputs({"y": o}, {"y": r}, ["y"], quantized_outputs={"y"})
    assert derive_status(m)[0] == "difference"
    assert derive_status(m, {"int_atol": 3})[0] == "success"
    assert count_over_tolerance(m, {}) == (5, 0.05)  # quantized data: default int_atol 1
    assert count_over_tolerance(m, {"int_atol": 0}) == (8, 0.08)
    status, summary = derive_status(m)
    assert summary == "max abs diff 3 > int_atol 1 (5 of 100 elements over tolerance, 5.00%)"
    plain = _one(o, r)  # not quantized data: exact
    assert count_over_tolerance(plain, {}) == (8, 0.08)
    assert derive_status(plain)[1] == "max abs diff 3 > int_atol 0 (8 of 100 elements over tolerance, 8.00%)"
    assert derive_status(plain, {"int_atol": 3})[0] == "success"  # int_atol still overrides
    assert default_int_atol() == 0 and default_int_atol(quantized=True) == 1


def test_integer_differences_do_not_wrap():
    r = np.array([255, 0], dtype=np.uint8)
    o = np.array([0, 255], dtype=np.uint8)
    assert _one(o, r)["max_abs_diff"] == 255
    big_r = np.array([np.iinfo(np.int64).min, 5], dtype=np.int64)
    big_o = np.array([np.iinfo(np.int64).max, 5], dtype=np.int64)
    m = _one(big_o, big_r)
    assert m["max_abs_diff"] == 2**64 - 1
    json.dumps(m, allow_nan=False)
    u = _one(np.array([2**64 - 1], dtype=np.uint64), np.array([0], dtype=np.uint64))
    assert u["max_abs_diff"] == 2**64 - 1


def test_bool_outputs_must_match_exactly():
    r = np.array([True, False, True, True])
    assert derive_status(_one(r.copy(), r))[0] == "success"
    o = np.array([True, True, True, True])
    m = _one(o, r)
    assert m["outputs"][0]["kind"] == "bool"
    assert m["outputs"][0]["num_mismatches"] == 1
    status, summary = derive_status(m, {"fp_max_tol": 1.0, "fp_avg_tol": 1.0, "int_atol": 5})
    assert status == "difference" and summary == "1 of 4 bool elements differ"
    assert count_over_tolerance(m, None) == (1, 0.25)


# ---------------------------------------------------------------- structure


def test_shape_mismatch_has_no_elementwise_metrics():
    r = np.zeros((1, 16, 32, 32), dtype=np.float32)
    o = np.zeros((1, 16, 31, 31), dtype=np.float32)
    m = _one(o, r)
    assert m["shape_mismatch"] is True
    assert m["max_rel_diff"] is None and "rel_diff_counts_over" not in m["outputs"][0]
    status, summary = derive_status(m, {"fp_max_tol": 1e9, "fp_avg_tol": 1e9})
    assert status == "difference"
    assert summary == "shape 1x16x31x31 differs from reference 1x16x32x32"
    assert count_over_tolerance(m, None) == (0, 0.0)


def test_dtype_mismatch_still_compares_values():
    r = np.array([1.0, 2.0], dtype=np.float32)
    o = np.array([1.0, 2.0], dtype=np.float16)
    m = _one(o, r)
    assert m["dtype_mismatch"] is True
    assert m["max_rel_diff"] == 0.0
    status, summary = derive_status(m)
    assert status == "difference" and "dtype float16 differs from reference float32" in summary
    # float output against an integer reference
    m = _one(np.array([1.0, np.nan]), np.array([1, 2], dtype=np.int32))
    assert m["dtype_mismatch"] and m["nan_mismatch"]
    assert derive_status(m)[0] == "difference"


def test_missing_and_extra_outputs():
    r = {"a": np.ones(3, np.float32), "b": np.ones(2, np.float32)}
    m = compare_outputs({"a": np.ones(3, np.float32)}, r, ["a", "b"])
    assert m["missing_output"] and m["missing_outputs"] == ["b"] and m["output_count_mismatch"]
    lines = status_details(m)
    assert lines[0] == "executor produced 1 outputs, reference has 2"
    assert lines[1] == "output 'b': output missing from the executor's results"
    m = compare_outputs({"a": np.ones(3, np.float32), "zz": np.ones(1)}, {"a": r["a"]}, ["a"])
    assert m["extra_outputs"] == ["zz"]
    assert derive_status(m)[0] == "difference"


def test_multi_output_aggregation_in_output_names_order():
    ref = {
        "x": np.array([1.0, 2.0], np.float32),
        "idx": np.array([3, 4], np.int64),
        "y": np.array([1.0, -1.0], np.float32),
    }
    act = {"x": np.array([1.0, 2.1], np.float32), "idx": np.array([3, 4], np.int64), "y": np.array([-1.0, 1.0], np.float32)}
    m = compare_outputs(act, ref, ["y", "x", "idx"])
    assert [o["name"] for o in m["outputs"]] == ["y", "x", "idx"]
    assert [o["kind"] for o in m["outputs"]] == ["float", "float", "int"]
    assert m["max_rel_diff"] == pytest.approx(2.0)  # y: |(-1) - 1| / 1
    assert m["max_abs_diff"] == pytest.approx(2.0)
    assert m["cosine_similarity"] == pytest.approx(-1.0)  # min over float outputs
    assert m["num_elements"] == 6
    status, summary = derive_status(m)
    assert status == "difference"
    assert summary.startswith("output 'y': max rel diff 2.0e+00") and summary.endswith("(+1 more problem)")


def test_metrics_are_json_safe_and_round_trip():
    rng = np.random.default_rng(0)
    r = rng.standard_normal((2, 3)).astype(np.float32)
    r[0, 0] = np.nan
    o = r.copy()
    o[1, 1] = np.inf
    m = compare_outputs({"f": o, "i": np.array([1], np.int32)}, {"f": r, "i": np.array([1], np.int32)}, ["f", "i"])
    text = json.dumps(m, allow_nan=False)
    back = json.loads(text)
    assert back == m
    assert derive_status(back) == derive_status(m)
    assert back["rel_diff_thresholds"] == list(REL_DIFF_THRESHOLDS)
    assert back["abs_diff_thresholds"] == list(ABS_DIFF_THRESHOLDS)


# ---------------------------------------------------------------- inconclusive comparisons


def _tiny_reference():
    # outputs of the size a random-weight MobileNetV2 gives at its end (~1e-9)
    rng = np.random.default_rng(5)
    return (rng.standard_normal(1000) * 1e-9).astype(np.float32)


def test_tiny_reference_never_gives_a_plain_success():
    r = _tiny_reference()
    for wrong in (np.zeros_like(r), -r):
        m = _one(wrong, r)
        out = m["outputs"][0]
        status, summary = derive_status(m)
        # the floor 1e-5 of float32 swallows any difference of that size: the
        # verdict cannot fail, so it is flagged
        assert status == "success"
        assert m["inconclusive"] is True and out["inconclusive_reason"] is not None
        mag = f"{np.abs(r).max():.1e}"
        assert out["inconclusive_reason"] == f"reference magnitude {mag} below the absolute floor 1.0e-05 of float32"
        assert inconclusive_reason(m) == out["inconclusive_reason"]
        assert m["inconclusive_reasons"] == [out["inconclusive_reason"]]
        assert summary.startswith("all 1000 elements within tolerance (max rel diff ")
        assert summary.endswith(f"; inconclusive: reference magnitude {mag} below the absolute floor "
                                "1.0e-05 of float32")
        assert _json_roundtrip(m)["inconclusive"] is True
    # with a cosine requirement both are a difference, also after a JSON round trip
    m = _json_roundtrip(compare_outputs({"y": np.zeros_like(r)}, {"y": r}, ["y"], min_cosine=FULL_MODEL_MIN_COSINE))
    status, summary = derive_status(m)
    assert status == "difference"
    assert summary == "output is all zero where the reference is not (cosine similarity undefined, min_cosine 0.99)"
    m = _json_roundtrip(compare_outputs({"y": -r}, {"y": r}, ["y"], min_cosine=FULL_MODEL_MIN_COSINE))
    assert derive_status(m) == ("difference", "cosine similarity -1 < min_cosine 0.99")
    # the right output (float32 noise) passes the cosine requirement
    ok = (r.astype(np.float64) * (1 + 1e-6)).astype(np.float32)
    status, summary = derive_status(compare_outputs({"y": ok}, {"y": r}, ["y"], min_cosine=FULL_MODEL_MIN_COSINE))
    assert status == "success" and "min cosine 1.000000" in summary and "inconclusive" in summary


def test_a_constant_reference_is_inconclusive_and_a_wrong_constant_still_fails():
    # the embedded default model's Softmax: 1/1000 for every class whatever the input; a
    # permuted or misindexed output matches such a reference, so the check proves little
    r = np.full((1, 1000, 1, 1), 0.001, np.float32)
    m = _one(r.copy(), r)
    assert m["outputs"][0]["inconclusive_reason"] == (
        "reference is constant (all 1000 finite elements 0.001): a permuted or misindexed output would match it too")
    status, summary = derive_status(m)
    assert status == "success" and "; inconclusive: reference is constant" in summary
    assert derive_status(_one(np.full_like(r, 0.002), r))[0] == "difference"  # a wrong value still fails
    # two distinct values, or a single element, are not flagged
    r2 = r.copy()
    r2.flat[7] = 0.002
    assert _one(r2.copy(), r2)["outputs"][0]["inconclusive_reason"] is None
    one = np.array([3.0], np.float32)
    assert _one(one.copy(), one)["outputs"][0]["inconclusive_reason"] is None


def test_all_zero_and_empty_references_are_inconclusive():
    z = np.zeros(8, np.float32)
    m = _one(z.copy(), z)
    assert m["inconclusive"] is True
    assert m["outputs"][0]["inconclusive_reason"] == "reference is all zero (below the absolute floor 1.0e-05 of float32)"
    assert derive_status(m)[1].endswith("; inconclusive: reference is all zero (below the absolute floor "
                                        "1.0e-05 of float32)")
    # an all-zero reference is not judged by the cosine (undefined); d still catches a large output
    m = compare_outputs({"y": np.ones(8, np.float32)}, {"y": z}, ["y"], min_cosine=0.99)
    assert derive_status(m)[1].startswith("max rel diff 1.0e+05 > fp_max_tol")
    m = compare_outputs({"y": z.copy()}, {"y": z}, ["y"], min_cosine=0.99)
    assert derive_status(m)[0] == "success"
    zi = np.zeros(4, np.int32)
    assert _one(zi.copy(), zi)["outputs"][0]["inconclusive_reason"] == "reference is all zero"
    zb = np.zeros(4, bool)
    assert _one(zb.copy(), zb)["outputs"][0]["inconclusive_reason"] == "reference is all False"
    e = np.zeros((0, 3), np.float32)
    m = _one(e.copy(), e)
    assert m["outputs"][0]["inconclusive_reason"] == "no elements to compare"
    assert derive_status(m) == ("success", "all 0 elements within tolerance (max rel diff 0.0e+00); "
                                           "inconclusive: no elements to compare")
    # a normal reference is conclusive
    r = np.linspace(-1, 1, 8, dtype=np.float32)
    m = _one(r.copy(), r)
    assert m["inconclusive"] is False and m["inconclusive_reasons"] == [] and inconclusive_reason(m) is None
    assert "inconclusive" not in derive_status(m)[1]


def test_inconclusive_reasons_name_the_output_and_a_difference_stays_conclusive():
    r = {"big": np.array([1.0, -2.0], np.float32), "tiny": np.array([3e-9, 1e-9], np.float32)}
    m = compare_outputs({"big": r["big"].copy(), "tiny": r["tiny"].copy()}, r, ["big", "tiny"])
    assert m["inconclusive_reasons"] == ["output 'tiny': reference magnitude 3.0e-09 below the absolute floor "
                                         "1.0e-05 of float32"]
    assert derive_status(m)[1].endswith("; inconclusive: output 'tiny': reference magnitude 3.0e-09 below the "
                                        "absolute floor 1.0e-05 of float32")
    # a difference beyond the floor is a plain difference (the stored flag stays)
    m = _one(np.array([1e-3, 0.0], np.float32), r["tiny"])
    status, summary = derive_status(m)
    assert status == "difference" and "inconclusive" not in summary and m["inconclusive"] is True


def test_cosine_requirement_is_stored_and_rederived():
    rng = np.random.default_rng(2)
    r = rng.standard_normal(4000).astype(np.float32)
    o = (r + rng.standard_normal(4000).astype(np.float32) * np.float32(0.2)).astype(np.float32)  # cosine ~0.98
    m = compare_outputs({"y": o}, {"y": r}, ["y"], min_cosine=0.99)
    assert m["min_cosine"] == 0.99
    cos = m["outputs"][0]["cosine_similarity"]
    assert 0.97 < cos < 0.99
    loose = {"fp_max_tol": 1e3, "fp_avg_tol": 1e3}
    stored = _json_roundtrip(m)
    status, summary = derive_status(stored, loose)
    assert status == "difference" and summary == f"cosine similarity {cos:.6g} < min_cosine 0.99"
    assert status_details(stored, loose) == [summary]
    # without the requirement (the per-layer tests) the same numbers pass the loose tolerance
    assert compare_outputs({"y": o}, {"y": r}, ["y"])["min_cosine"] is None
    assert derive_status(compare_outputs({"y": o}, {"y": r}, ["y"]), loose)[0] == "success"
    assert derive_status(compare_outputs({"y": o}, {"y": r}, ["y"], min_cosine=0.95), loose)[0] == "success"
    # the cosine does not underflow for a tiny output against a normal reference
    assert _one(r * np.float32(1e-30), r)["cosine_similarity"] == pytest.approx(1.0)
    for bad in (1.5, -2, "0.9", True, float("nan")):
        with pytest.raises(ValueError, match="min_cosine"):
            compare_outputs({"y": o}, {"y": r}, ["y"], min_cosine=bad)


# ---------------------------------------------------------------- exact integers, quantized data


def test_cast_to_int8_off_by_one_is_a_difference():
    model = make_model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT8)],
                       [tvi("x", TensorProto.FLOAT, [64])], [tvi("y", TensorProto.INT8, [64])])
    x = np.linspace(-50.3, 60.7, 64, dtype=np.float32)
    ref = _ort(model, {"x": x})
    assert quantized_data_outputs(model) == set()
    wrong = {"y": (ref["y"].astype(np.int16) + 1).clip(-128, 127).astype(np.int8)}  # off by one almost everywhere
    m = compare_outputs(wrong, ref, ["y"], quantized_outputs=quantized_data_outputs(model))
    assert m["outputs"][0]["quantized"] is False
    status, summary = derive_status(m)
    assert status == "difference"
    assert summary == "max abs diff 1 > int_atol 0 (64 of 64 elements over tolerance, 100.00%)"


def test_quantize_linear_output_off_by_one_is_a_success():
    scale = numpy_helper.from_array(np.array(0.05, np.float32), "s")
    zp = numpy_helper.from_array(np.array(3, np.int8), "z")
    model = make_model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])],
                       [tvi("x", TensorProto.FLOAT, [64])], [tvi("y", TensorProto.INT8, [64])], [scale, zp])
    x = np.linspace(-3.0, 3.0, 64, dtype=np.float32)
    ref = _ort(model, {"x": x})
    quantized = quantized_data_outputs(model)
    assert quantized == {"y"}
    one_off = {"y": (ref["y"].astype(np.int16) + np.arange(64) % 2).clip(-128, 127).astype(np.int8)}
    m = compare_outputs(one_off, ref, ["y"], quantized_outputs=quantized)
    assert m["outputs"][0]["quantized"] is True
    assert derive_status(_json_roundtrip(m)) == ("success", "all 64 elements within tolerance (max abs diff 1)")
    two_off = {"y": (ref["y"].astype(np.int16) + 2).clip(-128, 127).astype(np.int8)}
    assert derive_status(compare_outputs(two_off, ref, ["y"], quantized_outputs=quantized))[0] == "difference"
    # int_atol from the tolerance still overrides the default
    assert derive_status(m, {"int_atol": 0})[0] == "difference"


def test_quantized_data_outputs_traces_moving_ops():
    s = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    z = numpy_helper.from_array(np.array(0, np.int8), "z")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    w = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.int8), "w")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("MaxPool", ["q"], ["mp", "mp_idx"], kernel_shape=[1, 1]),
        helper.make_node("Reshape", ["mp", "shape"], ["flat"]),                    # quantized, traced
        helper.make_node("MaxPool", ["xi"], ["plain_pool"], kernel_shape=[1, 1]),  # graph input: not quantized
        helper.make_node("Cast", ["x"], ["cast"], to=TensorProto.INT8),            # not quantized
        helper.make_node("DynamicQuantizeLinear", ["x"], ["dq", "dq_s", "dq_z"]),  # first output only
        helper.make_node("QLinearConv", ["q", "s", "z", "w", "s", "z", "s", "z"], ["qc"]),
        helper.make_node("QLinearAdd", ["q", "s", "z", "q", "s", "z", "s", "z"], ["qa"], domain="com.microsoft"),
        helper.make_node("Concat", ["xi", "qa"], ["cat"], axis=1),                  # one quantized input
        helper.make_node("Identity", ["cat"], ["cat_id"]),
    ]
    outs = ["q", "mp_idx", "flat", "plain_pool", "cast", "dq", "dq_s", "dq_z", "qc", "qa", "cat_id"]
    graph = helper.make_graph(
        nodes, "g", [tvi("x", TensorProto.FLOAT, [1, 2, 2, 2]), tvi("xi", TensorProto.INT8, [1, 2, 2, 2])],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outs], [s, z, shape, w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    assert quantized_data_outputs(model) == {"q", "flat", "dq", "qc", "qa", "cat_id"}


def test_declared_shape_is_named_in_a_shape_mismatch():
    r = np.zeros((2, 4), np.float32)
    o = np.zeros((2, 3), np.float32)
    m = compare_outputs({"y": o}, {"y": r}, ["y"], declared_shapes={"y": [2, 4]})
    assert m["outputs"][0]["declared_shape"] == [2, 4]
    assert derive_status(_json_roundtrip(m))[1] == "shape 2x3 differs from reference 2x4 (the model declares 2x4)"
    m = compare_outputs({"y": o}, {"y": r}, ["y"], declared_shapes={"y": [None, 4]})
    assert derive_status(m)[1] == "shape 2x3 differs from reference 2x4 (the model declares ?x4)"
    m = compare_outputs({"y": o}, {"y": r}, ["y"], declared_shapes={"y": None})  # unknown rank: not named
    assert derive_status(m)[1] == "shape 2x3 differs from reference 2x4"
    with pytest.raises(ValueError, match="declared shape"):
        compare_outputs({"y": o}, {"y": r}, ["y"], declared_shapes={"y": ["batch", 4]})


# ---------------------------------------------------------------- non-finite mismatches


def test_inf_against_a_finite_reference_is_reported_with_count_and_example():
    r = np.array([0.5, 1.0, 2.0, 1.569, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], np.float32)
    o = r.copy()
    o[3] = np.inf
    o[7] = np.nan
    m = _one(o, r)
    out = m["outputs"][0]
    assert out["num_nonfinite_mismatches"] == 2 and m["num_nonfinite_mismatches"] == 2
    assert out["nonfinite_examples"] == [{"index": 3, "output": "inf", "reference": "1.569"},
                                         {"index": 7, "output": "nan", "reference": "6.0"}]
    for key in ("max_abs_diff", "mean_abs_diff", "max_rel_diff", "mean_rel_diff", "cosine_similarity"):
        assert out[key] is None and m[key] is None, key  # not computable (not 0.0 / 1.0)
    assert m["metric_overflow"] is False
    assert out["rel_diff_counts_over"] == [2] * len(REL_DIFF_THRESHOLDS)  # over every threshold
    stored = json.loads(json.dumps(m, allow_nan=False))
    status, summary = derive_status(stored, {"fp_max_tol": 100.0, "fp_avg_tol": 100.0})
    assert status == "difference"
    assert summary == ("2 of 10 elements non-finite where the reference is not, or the reverse "
                       "(e.g. inf vs 1.569 at index 3)")
    assert count_over_tolerance(stored, None) == (2, 0.2)
    # finite elements over tolerance besides: counted from the histogram
    o[0] = 0.6
    assert "1 finite elements with rel diff > fp_max_tol 1.0e-02" in derive_status(_one(o, r))[1]
    # the reverse, and only the first 3 examples are stored
    r2 = np.full(6, np.inf, np.float32)
    m = _one(np.zeros(6, np.float32), r2)
    assert [e["output"] for e in m["outputs"][0]["nonfinite_examples"]] == ["0.0"] * 3
    assert derive_status(m)[1].startswith("6 of 6 elements non-finite where the reference is not, or the reverse "
                                          "(e.g. 0.0 vs inf at index 0)")
    assert m["outputs"][0]["inconclusive_reason"] == "reference has no finite elements"


def test_metrics_stored_before_the_new_keys_still_derive():
    """Metrics of an older version (no quantized, inconclusive, min_cosine,
    nonfinite_examples, ref_max_abs, declared_shape keys) re-derive; their
    integers are exact."""
    new_keys = ("quantized", "inconclusive_reason", "nonfinite_examples", "ref_max_abs", "declared_shape")
    top_keys = ("inconclusive", "inconclusive_reasons", "min_cosine", "num_nonfinite_mismatches")

    def old(m):
        m = _json_roundtrip(m)
        for k in top_keys:
            m.pop(k)
        for out in m["outputs"]:
            for k in new_keys:
                out.pop(k, None)
        return m

    r = np.linspace(-1, 1, 10, dtype=np.float32)
    assert derive_status(old(_one(r.copy(), r))) == ("success", "all 10 elements within tolerance "
                                                                "(max rel diff 0.0e+00)")
    assert derive_status(old(_one(r * np.float32(1.05), r)))[0] == "difference"
    ri = np.arange(10, dtype=np.int8)
    m = old(compare_outputs({"y": ri + np.int8(1)}, {"y": ri}, ["y"], quantized_outputs=["y"]))
    assert derive_status(m)[0] == "difference"  # no "quantized" key: exact
    # an old NaN mismatch (metrics computed over the finite part, no count, no examples)
    m = old(_one(np.array([np.nan, 1.0], np.float32), np.array([1.0, 1.0], np.float32)))
    for out in m["outputs"]:
        out.pop("num_nonfinite_mismatches")
        out["max_rel_diff"] = out["mean_rel_diff"] = 0.0
    assert derive_status(m) == ("difference", "NaN at positions where the reference has none (or the reverse)")
    assert inconclusive_reason(old(_one(np.zeros(2), np.zeros(2)))) is None
    z = np.zeros(3, np.float32)
    assert derive_status(old(_one(z.copy(), z)))[1] == "all 3 elements within tolerance (max rel diff 0.0e+00)"
    m = old(compare_outputs({"y": np.zeros((2, 3))}, {"y": np.zeros((2, 4))}, ["y"]))
    assert derive_status(m)[1] == "shape 2x3 differs from reference 2x4"


# ---------------------------------------------------------------- errors


def test_invalid_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="reference has no output"):
        compare_outputs({"y": np.ones(2)}, {}, ["y"])
    with pytest.raises(ValueError, match="output_names is empty"):
        compare_outputs({}, {}, [])
    with pytest.raises(TypeError, match="complex64"):
        _one(np.ones(2, np.complex64), np.ones(2, np.complex64))
    with pytest.raises(ValueError, match="finite number >= 0"):
        derive_status(_one(np.ones(2), np.ones(2)), {"fp_max_tol": -1})
    with pytest.raises(ValueError, match="unknown tolerance key"):
        normalize_tolerance({"fp_max": 0.1})
    with pytest.raises(ValueError, match="metrics must be a dict"):
        derive_status(None)
    assert normalize_tolerance(None) == DEFAULT_TOLERANCE


def test_grid_contains_common_tolerances():
    for t in (0.0, 1e-7, 1e-3, 1.5e-3, 0.01, 0.02, 0.05, 0.1, 1.0, 100.0):
        assert t in REL_DIFF_THRESHOLDS
    assert list(REL_DIFF_THRESHOLDS) == sorted(REL_DIFF_THRESHOLDS)
    assert len(REL_DIFF_THRESHOLDS) == 92


def test_one_million_elements_vectorized(capsys):
    rng = np.random.default_rng(1)
    r = rng.standard_normal((1, 16, 256, 256)).astype(np.float32)  # 1,048,576 elements
    o = (r * (1 + np.float32(1e-4) * rng.standard_normal(r.shape).astype(np.float32))).astype(np.float32)
    start = time.perf_counter()
    m = _one(o, r)
    elapsed = time.perf_counter() - start
    with capsys.disabled():
        print(f"\ncompare_outputs on {r.size} float32 elements: {elapsed * 1000:.1f} ms")
    assert m["num_elements"] == 1_048_576
    assert derive_status(m)[0] == "success"
    assert m["outputs"][0]["rel_diff_counts_over"][0] == int(np.count_nonzero(o != r))


def test_a_reference_that_repeats_along_an_axis_is_a_blind_spot_not_an_inconclusive_check():
    """The embedded default model (every weight 0.02) gives Convs whose output channels are
    all equal: a channel permutation would pass. The values are still compared, so the
    verdict stands; the metrics say where it cannot see."""
    from torq_gen_config.compare.elementwise import uniform_axes

    rng = np.random.default_rng(0)
    row = rng.standard_normal((1, 1, 5, 7)).astype(np.float32)
    ref = np.repeat(row, 4, axis=1)  # 4 equal channels
    assert uniform_axes(ref) == [(1, 4)]
    m = compare_outputs({"y": ref.copy()}, {"y": ref}, ["y"])
    assert not m["inconclusive"] and m["outputs"][0]["uniform_axes"] == [1]
    assert m["blind_spots"] == ["the reference repeats along axis 1 (4 equal slices): an output permuted or "
                                "misindexed along it would match it too"]
    swapped = ref[:, ::-1].copy()  # what the blind spot means: a permuted output matches exactly
    assert compare_outputs({"y": swapped}, {"y": ref}, ["y"])["max_abs_diff"] == 0.0
    wrong = ref.copy()
    wrong[0, 2] += 1.0  # a wrong value in one channel is still seen
    assert compare_outputs({"y": wrong}, {"y": ref}, ["y"])["max_abs_diff"] == pytest.approx(1.0)
    # a reference with distinct slices, a NaN, size-1 axes only, a constant one: no blind spot
    assert uniform_axes(rng.standard_normal((2, 3))) == []
    assert uniform_axes(np.array([[np.nan, 1.0], [np.nan, 1.0]])) == []
    assert uniform_axes(np.ones((1, 1))) == []
    const = compare_outputs({"y": np.full(8, 2.0)}, {"y": np.full(8, 2.0)}, ["y"])
    assert const["inconclusive"] and const["blind_spots"] == []
    # integers too; with two outputs the note names its output
    two = compare_outputs({"a": np.zeros((2, 3), np.int64) + [1, 2, 3], "b": rng.standard_normal(4)},
                          {"a": np.zeros((2, 3), np.int64) + [1, 2, 3], "b": rng.standard_normal(4)}, ["a", "b"])
    assert two["blind_spots"] == ["output 'a': the reference repeats along axis 0 (2 equal slices): an output "
                                  "permuted or misindexed along it would match it too"]
