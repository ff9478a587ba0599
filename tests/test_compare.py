"""Tests of torq_gen_config.compare: the metric, the verdict rule, re-derivation."""

from __future__ import annotations

import json
import re
import time

import ml_dtypes
import numpy as np
import pytest

from torq_gen_config.compare import (
    ABS_DIFF_THRESHOLDS,
    DEFAULT_TOLERANCE,
    REL_DIFF_THRESHOLDS,
    compare_outputs,
    count_over_tolerance,
    default_int_atol,
    derive_status,
    normalize_tolerance,
    status_details,
)


def _one(actual, reference, name="y"):
    return compare_outputs({name: actual}, {name: reference}, [name])


def _json_roundtrip(metrics):
    return json.loads(json.dumps(metrics, allow_nan=False))


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
    assert m["max_rel_diff"] == 0.0  # the NaN element is not part of d
    status, summary = derive_status(m, {"fp_max_tol": 100.0, "fp_avg_tol": 100.0})
    assert status == "difference" and "NaN" in summary
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
    "dtype, diff, expected",
    [
        (np.int8, 1, "success"),
        (np.int8, 2, "difference"),
        (np.uint8, 1, "success"),
        (np.int16, 1, "success"),
        (np.int32, 1, "difference"),
        (np.int64, 1, "difference"),
        (np.int32, 0, "success"),
    ],
)
def test_integer_default_atol(dtype, diff, expected):
    r = np.array([10, 20, 30], dtype=dtype)
    o = r.copy()
    o[1] += diff
    m = _one(o, r)
    assert m["outputs"][0]["kind"] == "int"
    assert m["max_abs_diff"] == diff
    assert derive_status(m)[0] == expected


def test_int_atol_override_and_counts():
    r = np.arange(100, dtype=np.int8)
    o = r.copy()
    o[:5] += 3
    o[5:8] += 1
    m = _one(o, r)
    assert derive_status(m)[0] == "difference"
    assert derive_status(m, {"int_atol": 3})[0] == "success"
    assert count_over_tolerance(m, {}) == (5, 0.05)  # default int_atol 1
    assert count_over_tolerance(m, {"int_atol": 0}) == (8, 0.08)
    status, summary = derive_status(m)
    assert summary == "max abs diff 3 > int_atol 1 (5 of 100 elements over tolerance, 5.00%)"
    assert default_int_atol("int8") == 1 and default_int_atol("int64") == 0


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
