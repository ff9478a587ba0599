"""Every tensor's real shape and dtype before the split: static inference, folding fed
back, the whole-model run, zero-size dims, --input-shapes and the opset signature check."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from conftest import TensorProto, helper, make_model, tvi
from fixtures.models import S, E, HEADS, loop_model, transformer_encoder_layer

from torq_gen_config.config import parse_input_shapes
from torq_gen_config.core.errors import ConfigError, ModelError
from torq_gen_config.model.prepare import prepare_model
from torq_gen_config.model.shapes import complete_static_shapes, type_table, type_text, unknown_runtime_tensors
from torq_gen_config.model.split import split_layers
from torq_gen_config.reference.model_run import run_model_by_node


def _observe_with_run(seed=0):
    """An ``observe`` callback for prepare_model that runs the whole model node by node."""
    calls = []

    def observe(model, *, want, unknown):
        from torq_gen_config.inputs.generate import make_inputs

        feeds = make_inputs(model, {"seed": seed})
        res = run_model_by_node(model, feeds, keep=want)
        calls.append({"want": want, "unknown": unknown, "values": res["values"]})
        return {"types": res["types"], "info": {"ran": True, "unavailable": res["unavailable"]}}

    return observe, calls


def test_static_inference_leaves_the_heads_unknown_and_folding_fed_back_finds_them():
    model = transformer_encoder_layer()
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    assert "unk" in type_text(type_table(inferred)["q1"])  # Div stops onnx's data propagation
    completed, info = complete_static_shapes(model)
    types = type_table(completed)
    hd = E // HEADS
    assert type_text(types["q1"]) == f"float32[{S}x{HEADS}x{hd}]"
    assert type_text(types["kt"]) == f"float32[{HEADS}x{hd}x{S}]"
    assert type_text(types["ctx"]) == f"float32[{S}x1x{E}]"
    assert {"q1", "q2", "kt", "v", "ctx"} <= set(info["learnt_from_folding"])
    assert info["unknown"] == [] and unknown_runtime_tensors(completed) == []


def test_a_loop_output_needs_the_model_run(tmp_path):
    model = loop_model(trips=3)
    _, info = complete_static_shapes(model)
    assert set(info["unknown"]) == {"scan", "shifted", "r"}
    p = tmp_path / "loop.onnx"
    onnx.save(model, p)
    observe, calls = _observe_with_run()
    prepared, pinfo = prepare_model(p, observe=observe)
    assert calls and set(calls[0]["unknown"]) == {"scan", "shifted", "r"}
    assert set(pinfo["shapes"]["observed"]) >= {"scan", "shifted", "r"} and pinfo["shapes"]["unknown"] == []
    types = type_table(prepared)
    assert type_text(types["scan"]) == "float32[3x4]" and type_text(types["r"]) == "float32[3x4]"
    man = split_layers(prepared, pinfo, tmp_path / "layers")
    relu = next(layer for layer in man["layers"] if layer["op_type"] == "Relu")
    assert relu["inputs"] == [{"name": "shifted", "dtype": "float32", "shape": [3, 4]}]
    assert not any(layer.get("not_testable") for layer in man["layers"])


def test_without_a_run_unknown_shapes_make_layers_not_testable(tmp_path):
    p = tmp_path / "loop.onnx"
    onnx.save(loop_model(), p)
    prepared, pinfo = prepare_model(p)
    man = split_layers(prepared, pinfo, tmp_path / "layers")
    reasons = {layer["op_type"]: layer.get("not_testable") for layer in man["layers"]}
    assert reasons["ReduceSum"].startswith("not testable: the type/shape of input 'r' is unknown")
    assert "static shape inference could not infer it" in reasons["Relu"]


def test_untyped_custom_op_and_sequences_are_not_testable_and_nothing_raises(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Foo", ["r"], ["f"], domain="com.example"),
             helper.make_node("Add", ["f", "x"], ["g"]),
             helper.make_node("SequenceConstruct", ["r", "x"], ["seq"]),
             helper.make_node("ConcatFromSequence", ["seq"], ["cat"], axis=0),
             helper.make_node("Sigmoid", ["cat"], ["s"])]
    graph = helper.make_graph(nodes, "g", [tvi("x", TensorProto.FLOAT, [2, 3])],
                              [tvi("g", TensorProto.FLOAT, [2, 3]), tvi("s", TensorProto.FLOAT, [4, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    p = tmp_path / "custom.onnx"
    onnx.save(model, p)
    observe, _ = _observe_with_run()
    prepared, pinfo = prepare_model(p, observe=observe)
    man = split_layers(prepared, pinfo, tmp_path / "layers")
    reasons = {layer["layer_id"]: layer.get("not_testable") for layer in man["layers"]}
    assert reasons["Relu_r"] is None and reasons["Sigmoid_s"] is None
    assert "Foo node" in reasons["Foo_f"] and "could not be evaluated" in reasons["Foo_f"]
    assert reasons["Add_g"].startswith("not testable: the type/shape of input 'f' is unknown")
    assert "is a seq(" in reasons["SequenceConstruct_seq"] and "is a seq(" in reasons["ConcatFromSequence_cat"]


def test_zero_size_dims_are_dims_not_symbolic(tmp_path):
    m = make_model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1),
                    helper.make_node("Relu", ["x"], ["z"])],
                   [tvi("x", TensorProto.FLOAT, [2, 0, 4]), tvi("axes", TensorProto.INT64, [0])],
                   [tvi("y", TensorProto.FLOAT, [1, 1, 1]), tvi("z", TensorProto.FLOAT, [2, 0, 4])])
    p = tmp_path / "zero.onnx"
    onnx.save(m, p)
    prepared, info = prepare_model(p)
    assert info["fixed_dims"] == []
    dims = [d.dim_value for d in prepared.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [2, 0, 4]
    from torq_gen_config.reference.model_inputs import load_input_data

    np.savez(tmp_path / "in.npz", x=np.zeros((2, 0, 4), np.float32), axes=np.zeros((0,), np.int64))
    feeds = load_input_data(tmp_path / "in.npz", prepared)
    assert feeds["x"].shape == (2, 0, 4)
    np.savez(tmp_path / "bad.npz", x=np.zeros((2, 1, 4), np.float32), axes=np.zeros((0,), np.int64))
    with pytest.raises(ModelError, match=r"'x' has shape 2x1x4, the model expects 2x0x4"):
        load_input_data(tmp_path / "bad.npz", prepared)


def test_input_shapes_set_symbolic_dims_and_refuse_contradictions(tmp_path):
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [tvi("x", TensorProto.FLOAT, ["N", 3, "H"])],
                   [tvi("y", TensorProto.FLOAT, ["N", 3, "H"])])
    p = tmp_path / "dyn.onnx"
    onnx.save(m, p)
    prepared, info = prepare_model(p, input_shapes=parse_input_shapes(["x:2x3x7"]))
    assert [d.dim_value for d in prepared.graph.input[0].type.tensor_type.shape.dim] == [2, 3, 7]
    assert info["fixed_dims"] == [{"input": "x", "axis": 0, "was": "N", "to": 2, "source": "--input-shapes"},
                                  {"input": "x", "axis": 2, "was": "H", "to": 7, "source": "--input-shapes"}]
    with pytest.raises(ConfigError, match="dim 1 is 3 in the model"):
        prepare_model(p, input_shapes={"x": [2, 4, 7]})
    with pytest.raises(ConfigError, match="has rank 2"):
        prepare_model(p, input_shapes={"x": [2, 3]})
    with pytest.raises(ConfigError, match="which the model does not have as input"):
        prepare_model(p, input_shapes={"nope": [1]})


def test_parse_input_shapes_forms():
    assert parse_input_shapes(["a:1x3x224x224", "b:0", "ns:x:5", "s:"]) == {
        "a": [1, 3, 224, 224], "b": [0], "ns:x": [5], "s": []}
    for bad in (["a"], ["a:1xq"], ["a:-1"], ["a:1", "a:2"], [":3"]):
        with pytest.raises(ConfigError):
            parse_input_shapes(bad)


def test_an_opset_upgrade_that_would_change_the_signature_is_not_applied(tmp_path):
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        case = next(c for c in collect_testcases(None) if c.name == "test_scan_sum")  # Scan-8: batch axis
    p = tmp_path / "scan8.onnx"
    onnx.save(case.model, p)
    prepared, info = prepare_model(p)
    assert info["opset"]["original"] == info["opset"]["prepared"] == 8
    assert "input 'initial' float32[1x2] -> float32[2]" in info["opset"]["upgrade_undone"]
    assert any("would change the model's signature" in w and "kept at opset 8" in w for w in info["warnings"])
    dims = [[d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in prepared.graph.input]
    assert dims == [[1, 2], [1, 3, 2]]  # the user's signature
    prepared, info = prepare_model(p, target_opset=8)
    assert info["opset"] == {"original": 8, "prepared": 8}
    assert any("stays at opset 8" in w for w in info["warnings"])


def test_inputs_that_share_a_named_dim_get_one_value(tmp_path):
    m = make_model([helper.make_node("Unsqueeze", ["mask", "ax"], ["m3"]), helper.make_node("Mul", ["x", "m3"], ["y"])],
                   [tvi("x", TensorProto.FLOAT, ["batch", "seq", 4]), tvi("mask", TensorProto.FLOAT, ["batch", "seq"])],
                   [tvi("y", TensorProto.FLOAT, ["batch", "seq", 4])],
                   [onnx.numpy_helper.from_array(np.array([2], np.int64), "ax")])
    p = tmp_path / "mask.onnx"
    onnx.save(m, p)
    prepared, info = prepare_model(p, input_shapes={"x": [2, 3, 4]})
    dims = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in prepared.graph.input}
    assert dims == {"x": [2, 3, 4], "mask": [2, 3]}
    assert [d["source"] for d in info["fixed_dims"] if d["input"] == "mask"] == ["dim 'batch' of x", "dim 'seq' of x"]
    with pytest.raises(ConfigError, match="disagree on the symbolic dim 'batch': 2 .* and 5"):
        prepare_model(p, input_shapes={"x": [2, 3, 4], "mask": [5, 3]})


def test_a_wrong_declared_type_is_replaced_by_the_real_one_with_a_warning(tmp_path):
    graph = helper.make_graph([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
                               helper.make_node("Relu", ["t"], ["y"])], "g",
                              [tvi("x", TensorProto.FLOAT, [2, 3])], [tvi("y", TensorProto.FLOAT, [3, 2])],
                              value_info=[tvi("t", TensorProto.FLOAT, [2, 3])])  # wrong: t is 3x2
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    p = tmp_path / "wrong.onnx"
    onnx.save(model, p)
    observe, _ = _observe_with_run()
    prepared, info = prepare_model(p, observe=observe)
    assert type_text(type_table(prepared)["t"]) == "float32[3x2]"
    assert info["shapes"]["conflicts"] == ["t: the model declares float32[2x3], the run gives float32[3x2]"]
    assert any("declared type is wrong for t" in w for w in info["warnings"])
