"""A node test the product folds to a constant is judged on the test's own model (issue 42
item 6: ONNX Runtime fails OptionalHasElement without an input, which "not judged" hid)."""

from __future__ import annotations

import warnings

import pytest

from torq_gen_config.conformance.evaluate import FAILED, PASSED, unfolded_outcome

ORT = {"name": "ort", "backend": "onnxruntime", "options": {}}
LLVM = {"name": "llvm-cpu", "backend": "iree", "options": {"target": "llvm-cpu", "device": "local-sync"}}


def _case(name: str):
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return next(c for c in collect_testcases(None) if c.name == name)


def test_onnx_runtime_fails_an_optional_has_element_the_product_folds(tmp_path):
    res = unfolded_outcome(ORT, _case("test_optional_has_element_empty_no_input_tensor_input"), tmp_path / "o", 60)
    assert res["outcome"] == FAILED and res["stage"] == "session" and res["unfolded"] and res["verdict"] is None
    assert "OptionalHasElement" in res["message"]


@pytest.mark.slow  # an IREE compile
def test_a_folded_shape_passes_on_the_executors_that_run_it(tmp_path):
    case = _case("test_shape")
    for ex in (ORT, LLVM):
        res = unfolded_outcome(ex, case, tmp_path / ex["name"], 120)
        assert res["outcome"] == PASSED, (ex["name"], res)
