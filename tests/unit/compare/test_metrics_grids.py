"""compare.metrics.share_threshold_grids: the standard grids of metrics read back become one
shared list each (the report's memory at 5,000 layers), nothing else changes."""

from __future__ import annotations

import copy
import json

import numpy as np

from torq_gen_config.compare.metrics import compare_outputs, share_threshold_grids


def _stored_metrics():
    ref = {"y": np.linspace(-1, 1, 12, dtype=np.float32)}
    got = {"y": ref["y"] + np.float32(1e-3)}
    return json.loads(json.dumps(compare_outputs(got, ref, ["y"])))  # as read back from a result.json


def test_equal_grids_become_one_shared_list_and_values_do_not_change():
    a, b = _stored_metrics(), _stored_metrics()
    before = copy.deepcopy(a)
    assert a["rel_diff_thresholds"] is not b["rel_diff_thresholds"]
    share_threshold_grids(a)
    share_threshold_grids(b)
    assert a == before
    assert a["rel_diff_thresholds"] is b["rel_diff_thresholds"]
    assert a["abs_diff_thresholds"] is b["abs_diff_thresholds"]


def test_other_grids_and_non_dicts_are_left_alone():
    m = _stored_metrics()
    m["rel_diff_thresholds"] = [0.0, 0.5]
    other = m["rel_diff_thresholds"]
    share_threshold_grids(m)
    assert m["rel_diff_thresholds"] is other
    share_threshold_grids(None)
    share_threshold_grids(["not", "metrics"])
