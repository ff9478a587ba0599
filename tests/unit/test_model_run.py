"""The whole-model reference run (node by node): values against ground truth computed
without ONNX Runtime, bounded memory, the onnx fallback, and failing nodes."""

from __future__ import annotations

import numpy as np
import onnx
from conftest import LIGHT, TensorProto, helper, tvi
from fixtures.models import encoder_reference, transformer_encoder_layer

from torq_gen_config.reference.model_run import run_model_by_node


def test_values_match_a_numpy_encoder_layer_and_every_type_is_observed():
    model = transformer_encoder_layer()
    src = np.random.default_rng(3).standard_normal((6, 1, 16)).astype(np.float32)
    seen = {}
    res = run_model_by_node(model, {"src": src}, on_value=lambda n, v: seen.setdefault(n, v.shape))
    truth = encoder_reference(model, src)
    np.testing.assert_allclose(res["values"]["out"], truth["out"], atol=2e-5)
    np.testing.assert_allclose(res["values"]["attn_head0"], truth["attn_head0"], atol=2e-6)
    assert res["failed_nodes"] == [] and res["unavailable"] == {}
    assert res["types"]["q1"] == {"kind": "tensor", "elem_type": TensorProto.FLOAT, "shape": [6, 2, 8]}
    assert seen["src"] == (6, 1, 16) and seen["ctx"] == (6, 1, 16)  # inputs and produced values, once each
    assert res["engines"]["onnxruntime"] == res["nodes_run"] and res["engines"]["onnx"] == 0


def test_memory_is_bounded_by_the_live_tensors():
    model = onnx.load(str(LIGHT / "light_squeezenet.onnx"))
    from onnx import version_converter

    model = onnx.shape_inference.infer_shapes(version_converter.convert_version(model, 17))
    inits = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    total = 0

    def count(name, value):
        nonlocal total
        total += value.nbytes

    res = run_model_by_node(model, {"data_0": np.ones((1, 3, 224, 224), np.float32)}, on_value=count)
    assert res["nodes_run"] > 60
    # every activation exposed at once would need `total`; the run holds a few at a time
    assert res["peak_live_bytes"] < total / 4, (res["peak_live_bytes"], total)


def test_a_node_onnxruntime_cannot_run_falls_back_to_the_onnx_reference():
    # BitCast bool -> uint8 (opset 26) has no ONNX Runtime kernel; onnx's reference implements it
    nodes = [helper.make_node("Greater", ["x", "zero"], ["r"]),
             helper.make_node("BitCast", ["r"], ["b"], to=TensorProto.UINT8),
             helper.make_node("Cast", ["b"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [tvi("x", TensorProto.FLOAT, [3])], [tvi("y", TensorProto.FLOAT, [3])],
                              initializer=[helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)])
    model.ir_version = 13
    res = run_model_by_node(model, {"x": np.array([-1.0, 1.0, 2.5], np.float32)})
    assert [f["op_type"] for f in res["fallback_nodes"]] == ["BitCast"]
    assert "NOT_IMPLEMENTED" in res["fallback_nodes"][0]["errors"]["onnxruntime"]
    np.testing.assert_array_equal(res["values"]["y"], [0.0, 1.0, 1.0])
    assert res["engines"] == {"onnxruntime": 2, "onnx": 1}


def test_a_node_no_engine_can_run_costs_only_what_depends_on_it():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Foo", ["r"], ["f"], domain="com.example"),
             helper.make_node("Neg", ["f"], ["g"]), helper.make_node("Sigmoid", ["r"], ["s"])]
    graph = helper.make_graph(nodes, "g", [tvi("x", TensorProto.FLOAT, [2])],
                              [tvi("g", TensorProto.FLOAT, [2]), tvi("s", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    res = run_model_by_node(model, {"x": np.array([-1.0, 2.0], np.float32)})
    assert [f["op_type"] for f in res["failed_nodes"]] == ["Foo"]
    assert set(res["unavailable"]) == {"f", "g"}
    assert "could not be evaluated" in res["unavailable"]["f"]
    assert res["unavailable"]["g"].startswith("input 'f' of Neg node") and "could not be evaluated" in res["unavailable"]["g"]
    np.testing.assert_allclose(res["values"]["s"], 1 / (1 + np.exp(-np.array([0.0, 2.0]))), rtol=1e-6)


def test_the_time_budget_stops_the_run_with_a_reason():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [tvi("x", TensorProto.FLOAT, [2])], [tvi("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    res = run_model_by_node(model, {"x": np.ones(2, np.float32)}, timeout_s=0)
    assert res["nodes_run"] == 0 and "exceeded its 0 s limit" in res["unavailable"]["y"]
