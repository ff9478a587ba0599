"""The full-model section's text marks a success that could not have failed."""

import numpy as np

from torq_gen_config.compare import FULL_MODEL_MIN_COSINE, compare_outputs, derive_status
from torq_gen_config.fullrun.report_section import render_full_model_text


def _section(output, reference):
    m = compare_outputs({"y": output}, {"y": reference}, ["y"], min_cosine=FULL_MODEL_MIN_COSINE)
    status, summary = derive_status(m)
    return {"status": status, "summary": summary, "metrics": m, "assignment": {}, "num_partitions": 1,
            "partition_counts": {"llvm-cpu": 1}, "timing": {}}


def test_a_constant_model_output_is_an_inconclusive_full_model_success():
    # the embedded default model's output: 1/1000 per class whatever the input
    ref = np.full((1, 1000, 1, 1), 0.001, np.float32)
    text = render_full_model_text(_section(ref.copy(), ref))
    assert "Status: success* (inconclusive: the comparison could not have failed" in text
    assert "reference is constant (all 1000 finite elements 0.001)" in text


def test_a_varied_output_is_a_plain_success():
    ref = np.linspace(0.1, 1.0, 1000, dtype=np.float32)
    text = render_full_model_text(_section(ref.copy(), ref))
    assert "Status: success\n" in text and "inconclusive" not in text
