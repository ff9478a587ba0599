"""The one policy of which layers get test jobs (model/tested_layers.py), shared by the
workflow's DAG (rules/common.smk) and the report (steps/report.py)."""

from __future__ import annotations

from torq_gen_config.model.tested_layers import DUPLICATE, NOT_TESTABLE, SKIP_OPS, TEST, plan_layer_tests

LAYERS = [
    {"layer_id": "Conv_a", "op_type": "Conv", "signature": "s1"},
    {"layer_id": "Relu_b", "op_type": "Relu", "signature": "s2"},
    {"layer_id": "Conv_c", "op_type": "Conv", "signature": "s1"},
    {"layer_id": "Loop_d", "op_type": "Loop", "signature": "s3", "not_testable": "sequence output"},
    {"layer_id": "Relu_e", "op_type": "Relu", "signature": "s2"},
]


def test_every_testable_layer_is_tested_without_dedup():
    plan = plan_layer_tests(LAYERS)
    assert list(plan) == [lay["layer_id"] for lay in LAYERS]
    assert plan == {"Conv_a": (TEST, None), "Relu_b": (TEST, None), "Conv_c": (TEST, None),
                    "Loop_d": (NOT_TESTABLE, None), "Relu_e": (TEST, None)}


def test_dedup_copies_from_the_first_layer_of_a_signature():
    plan = plan_layer_tests(LAYERS, dedup_layers=True)
    assert plan["Conv_c"] == (DUPLICATE, "Conv_a") and plan["Relu_e"] == (DUPLICATE, "Relu_b")
    assert [lid for lid, (d, _) in plan.items() if d == TEST] == ["Conv_a", "Relu_b"]


def test_skip_ops_any_case_wins_over_dedup():
    plan = plan_layer_tests(LAYERS, skip_ops=["relu"], dedup_layers=True)
    assert plan["Relu_b"] == (SKIP_OPS, None) and plan["Relu_e"] == (SKIP_OPS, None)
    assert plan["Conv_c"] == (DUPLICATE, "Conv_a")
