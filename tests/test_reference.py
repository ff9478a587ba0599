"""Deterministic inputs and ONNX Runtime references (including a failing reference)."""

from __future__ import annotations

import numpy as np
import onnx
from conftest import TensorProto, helper, make_model, tvi
from onnx import numpy_helper

from torq_gen_config.reference import compute_reference, load_reference, make_inputs


def test_inputs_are_deterministic_and_in_range():
    m = make_model([helper.make_node("Cast", ["b"], ["bf"], to=TensorProto.FLOAT), helper.make_node("Add", ["a", "bf"], ["c"])],
                   [tvi("a", TensorProto.FLOAT, [4, 5]), tvi("b", TensorProto.INT64, [4, 5])],
                   [tvi("c", TensorProto.FLOAT, [4, 5])])
    x1 = make_inputs(m)
    x2 = make_inputs(m)
    for k in x1:
        np.testing.assert_array_equal(x1[k], x2[k])
    assert x1["a"].dtype == np.float32 and -1 <= x1["a"].min() and x1["a"].max() < 1
    assert x1["b"].dtype == np.int64 and -40 <= x1["b"].min() and x1["b"].max() < 40
    x3 = make_inputs(m, {"seed": 7})
    assert not np.array_equal(x1["a"], x3["a"])


def test_gather_indices_bounded_by_indexed_dim(tmp_path):
    table = numpy_helper.from_array(np.arange(30, dtype=np.float32).reshape(3, 10), "table")
    m = make_model([helper.make_node("Gather", ["table", "idx"], ["y"], axis=1)],
                   [tvi("idx", TensorProto.INT64, [64])], [tvi("y", TensorProto.FLOAT, [3, 64])], [table])
    x = make_inputs(m)
    assert x["idx"].min() >= 0 and x["idx"].max() < 10
    onnx.save(m, tmp_path / "g.onnx")
    meta = compute_reference(tmp_path / "g.onnx", tmp_path / "ref.npz")
    assert meta["status"] == "ok"
    ins, outs, meta = load_reference(tmp_path / "ref.npz")
    np.testing.assert_array_equal(outs["y"], np.arange(30, dtype=np.float32).reshape(3, 10)[:, ins["idx"]])
    assert meta["ort_version"]


def test_reference_failure_is_recorded(tmp_path):
    node = helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "main", [tvi("x", TensorProto.FLOAT, [2])], [tvi("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    onnx.save(m, tmp_path / "bad.onnx")
    meta = compute_reference(tmp_path / "bad.onnx", tmp_path / "ref.npz")
    assert meta["status"] == "error" and "ONNX Runtime" in meta["message"]
    ins, outs, meta2 = load_reference(tmp_path / "ref.npz")
    assert set(ins) == {"x"} and outs == {} and meta2["status"] == "error"
