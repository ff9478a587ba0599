"""The full-model tolerance widened to what ONNX Runtime with all graph optimizations is
off the reference (issue 42): max(configured, margin x that engine's error), per float
output; nothing changes where that engine agrees."""

import numpy as np
import pytest

from torq_gen_config.compare import (ENGINE_TOLERANCE_MARGIN, compare_outputs, count_over_tolerance, derive_status,
                                     engine_widened_tolerances, normalize_tolerance, widening_note)

TOL = {"fp_avg_tol": 0.01, "fp_max_tol": 0.01}


def _off(ref, rel, n_off):
    """``ref`` with its first ``n_off`` elements off by the relative error ``rel``."""
    out = ref.copy()
    out.flat[:n_off] *= (1 + rel)
    return out


def _metrics(actual, ref, names=("y",)):
    return compare_outputs(actual, ref, list(names), min_cosine=0.99)


def test_the_rule_is_the_max_of_configured_and_margin_times_the_engine():
    ref = {"y": np.linspace(1.0, 2.0, 1000).astype(np.float32)}
    engine = _metrics({"y": _off(ref["y"], 0.021, 196)}, ref)  # the figures: 2.1e-2, 196 over
    widened = engine_widened_tolerances(TOL, engine)
    e = engine["outputs"][0]
    assert ENGINE_TOLERANCE_MARGIN == 2.0
    assert widened["y"]["fp_max_tol"] == pytest.approx(2.0 * e["max_rel_diff"])
    assert widened["y"]["fp_avg_tol"] == 0.01  # 2 x the mean (about 4e-3) is below the configured value
    assert widened["y"]["bf16_max_tol"] == 0.05  # the other keys as normalized
    # an executor 1.8e-2 off (the IREE) passes with it and not without it
    run = _metrics({"y": _off(ref["y"], 0.018, 153)}, ref)
    assert derive_status(run, TOL)[0] == "difference"
    assert derive_status(run, TOL, widened)[0] == "success"
    assert count_over_tolerance(run, TOL)[0] == 153 and count_over_tolerance(run, TOL, widened)[0] == 0
    # twice the engine's error is still a difference
    worse = _metrics({"y": _off(ref["y"], 0.05, 10)}, ref)
    status, summary = derive_status(worse, TOL, widened)
    assert status == "difference" and "> fp_max_tol 4.2e-02" in summary
    note = widening_note(TOL, widened, engine)
    assert note.startswith("tolerance widened to 2 x what ONNX Runtime (all optimizations) is off the reference: ")
    assert "output 'y' fp_max_tol 1.0e-02 -> 4.2e-02 (it is 2.1e-02 off)" in note


def test_an_engine_that_agrees_changes_nothing():
    ref = {"y": np.linspace(1.0, 2.0, 100).astype(np.float32)}
    assert engine_widened_tolerances(TOL, _metrics({"y": ref["y"].copy()}, ref)) == {}
    # within configured / margin: not widened either
    assert engine_widened_tolerances(TOL, _metrics({"y": _off(ref["y"], 0.004, 5)}, ref)) == {}
    assert engine_widened_tolerances(TOL, None) == {} and widening_note(TOL, {}, None) is None
    run = _metrics({"y": _off(ref["y"], 0.018, 3)}, ref)
    assert derive_status(run, TOL, {}) == derive_status(run, TOL)


def test_per_output_and_never_for_integers_or_unmeasured_outputs():
    ref = {"a": np.linspace(1.0, 2.0, 50).astype(np.float32), "b": np.linspace(1.0, 2.0, 50).astype(np.float32),
           "i": np.arange(50, dtype=np.int64), "n": np.linspace(1.0, 2.0, 50).astype(np.float32)}
    nan = ref["n"].copy()
    nan[0] = np.nan
    engine = compare_outputs({"a": _off(ref["a"], 0.03, 2), "b": ref["b"].copy(), "i": ref["i"] + 1, "n": nan},
                             ref, ["a", "b", "i", "n"])
    widened = engine_widened_tolerances(TOL, engine)
    assert list(widened) == ["a"]
    run = compare_outputs({"a": _off(ref["a"], 0.03, 2), "b": _off(ref["b"], 0.03, 2), "i": ref["i"], "n": ref["n"]},
                          ref, ["a", "b", "i", "n"])
    status, summary = derive_status(run, TOL, widened)
    assert status == "difference" and summary.startswith("output 'b': ")  # 'a' passes with its own tolerance


def test_bf16_outputs_widen_their_own_keys_and_the_margin_is_checked():
    import ml_dtypes

    ref = {"y": np.linspace(1.0, 2.0, 64).astype(ml_dtypes.bfloat16)}
    off = ref["y"].astype(np.float32) * 1.04
    engine = compare_outputs({"y": off.astype(ml_dtypes.bfloat16)}, ref, ["y"])
    w = engine_widened_tolerances(TOL, engine)["y"]
    assert w["fp_max_tol"] == 0.01 and w["bf16_max_tol"] > normalize_tolerance(TOL)["bf16_max_tol"]
    with pytest.raises(ValueError, match="margin must be a finite number >= 1"):
        engine_widened_tolerances(TOL, engine, margin=0.5)
