"""Model loading errors and preparation (opset upgrade, symbolic dims, node origins)."""

from __future__ import annotations

import onnx
import pytest
from conftest import TensorProto, helper, make_model, tvi

from torq_gen_config.core.errors import ModelError
from torq_gen_config.model.graph import user_node_table
from torq_gen_config.model.prepare import load_model, prepare_model


def test_missing_model(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        load_model(tmp_path / "nope.onnx")


def test_text_file_named_onnx(tmp_path):
    p = tmp_path / "fake.onnx"
    p.write_text("this is not a model\n" * 20)
    with pytest.raises(ModelError, match="not a valid ONNX model"):
        load_model(p)


def test_tflite_rejected(tmp_path):
    p = tmp_path / "m.tflite"
    p.write_bytes(b"TFL3" + b"\0" * 64)
    with pytest.raises(ModelError, match="TFLite models are not supported"):
        load_model(p)


def test_truncated_onnx(tmp_path, squeezenet_path):
    data = squeezenet_path.read_bytes()
    p = tmp_path / "trunc.onnx"
    p.write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelError, match="not a valid ONNX model"):
        load_model(p)


def test_empty_file(tmp_path):
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    with pytest.raises(ModelError, match="empty"):
        load_model(p)


def test_squeezenet_upgrade_and_origins(squeezenet_path):
    model, info = prepare_model(squeezenet_path, target_opset=17)
    assert info["opset"] == {"original": 9, "prepared": 17}
    assert len(info["user_nodes"]) == 105
    assert len(model.graph.node) == 109  # Softmax-9 became Shape/Flatten/Softmax/Reshape
    origins = [p["graph_index"] for p in info["prepared_nodes"]]
    # Dropout-9 gains a Constant ratio input, Softmax-9 expands into four nodes
    assert origins == list(range(100)) + [100, 100] + [101, 102, 103] + [104] * 4
    assert [p["op_type"] for p in info["prepared_nodes"][100:102]] == ["Constant", "Dropout"]
    softmax_group = [p["op_type"] for p in info["prepared_nodes"] if p["graph_index"] == 104]
    assert sorted(softmax_group) == ["Flatten", "Reshape", "Shape", "Softmax"]
    names = [n.name for n in model.graph.node if n.name]
    assert len(names) == len(set(names)), "node names must stay unique after the expansion"
    assert [i.name for i in model.graph.input] == ["data_0"]  # initializers are not inputs any more
    onnx.checker.check_model(model)


def test_symbolic_batch_fixed(tmp_path):
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [tvi("x", TensorProto.FLOAT, ["N", 4])],
                   [tvi("y", TensorProto.FLOAT, ["N", 4])])
    p = tmp_path / "dyn.onnx"
    onnx.save(m, p)
    model, info = prepare_model(p)
    assert info["fixed_dims"] == [{"input": "x", "axis": 0, "was": "N", "to": 1, "source": "default 1"}]
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 4]
    out_dims = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert out_dims == [1, 4]


def test_node_index_skips_constant_nodes():
    const = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [2.0]))
    m = make_model([const, helper.make_node("Mul", ["x", "c"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
                   [tvi("x", TensorProto.FLOAT, [2])], [tvi("z", TensorProto.FLOAT, [2])])
    table = user_node_table(m)
    assert [t["node_index"] for t in table] == [None, 0, 1]


def test_replaced_node_keeps_its_layer(tmp_path):
    """Upsample-7 is replaced by an unnamed Resize (and its output renamed) by the opset
    converter: the layer must stay, as Upsample_up, made of the Resize."""
    from torq_gen_config.model.split import split_layers

    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Upsample", ["a"], ["up"], scales=[1.0, 1.0, 2.0, 2.0]),
             helper.make_node("Relu", ["up"], ["y"])]
    g = helper.make_graph(nodes, "g", [tvi("x", TensorProto.FLOAT, [1, 2, 4, 4])], [tvi("y", TensorProto.FLOAT, [1, 2, 8, 8])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 7)])
    m.ir_version = 3
    onnx.save(m, tmp_path / "up7.onnx")
    model, info = prepare_model(tmp_path / "up7.onnx")
    man = split_layers(model, info, tmp_path / "layers")
    assert [layer["layer_id"] for layer in man["layers"]] == ["Relu_a", "Upsample_up", "Relu_y"]
    assert man["folded_nodes"] == []
    up = man["layers"][1]
    assert [model.graph.node[j].op_type for j in up["prepared_node_indices"]] == ["Resize"]
