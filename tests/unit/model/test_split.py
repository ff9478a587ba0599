"""Layer split: constant folding, layer IDs and slugs, manifests, unchanged files kept."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from conftest import TensorProto, helper, make_model, tvi
from onnx import numpy_helper

from torq_gen_config.model.prepare import prepare_model
from torq_gen_config.model.split import layer_slug, split_layers


def test_squeezenet_has_66_layers(tmp_path, squeezenet_path):
    model, info = prepare_model(squeezenet_path)
    man = split_layers(model, info, tmp_path / "layers")
    layers = man["layers"]
    assert len(layers) == 66
    assert len(man["folded_nodes"]) == 39
    assert {f["op_type"] for f in man["folded_nodes"]} == {"ConstantOfShape"}
    ids = [layer["layer_id"] for layer in layers]
    assert len(set(ids)) == 66
    first = layers[0]
    assert first["layer_id"] == "Conv_r0" and first["node_index"] == 39  # 39 ConstantOfShape nodes come first
    assert [i["name"] for i in first["initializers"]] == ["conv1_w_0", "conv1_b_0"]
    assert first["mac_count"] == 64 * 111 * 111 * 3 * 3 * 3
    softmax = layers[-1]
    assert softmax["layer_id"] == "Softmax_softmaxout_1" and softmax["node_index"] == 104
    assert len(softmax["prepared_node_indices"]) == 3  # Flatten, Softmax, Reshape; Shape was folded
    sm = onnx.load(tmp_path / "layers" / softmax["slug"] / "model.onnx")
    assert [n.op_type for n in sm.graph.node] == ["Flatten", "Softmax", "Reshape"]
    assert sm.graph.name == "main"
    # every layer model passes onnx's full check, loads in ONNX Runtime and runs, with the manifest's shapes
    for layer in layers:
        path = tmp_path / "layers" / layer["slug"] / "model.onnx"
        onnx.checker.check_model(onnx.load(path), full_check=True)
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {i["name"]: np.ones(i["shape"], np.float32) for i in layer["inputs"]}
        assert [i.name for i in sess.get_inputs()] == list(feeds), layer["layer_id"]
        ys = sess.run(None, feeds)
        assert [list(y.shape) for y in ys] == [o["shape"] for o in layer["outputs"]], layer["layer_id"]
    assert layers[0]["outputs"][0]["shape"] == [1, 64, 111, 111]


def test_unchanged_layer_files_keep_mtime(tmp_path, squeezenet_path):
    model, info = prepare_model(squeezenet_path)
    split_layers(model, info, tmp_path / "layers")
    p = tmp_path / "layers" / "Relu_r1" / "model.onnx"
    before = p.stat().st_mtime_ns
    split_layers(model, info, tmp_path / "layers")
    assert p.stat().st_mtime_ns == before


def test_stale_layer_dirs_removed(tmp_path, squeezenet_path):
    model, info = prepare_model(squeezenet_path)
    stale = tmp_path / "layers" / "Old_layer"
    stale.mkdir(parents=True)
    (stale / "model.onnx").write_bytes(b"x")
    split_layers(model, info, tmp_path / "layers")
    assert not stale.exists()


def test_slug_is_safe_and_stable():
    assert layer_slug("Conv_r0") == "Conv_r0"
    s = layer_slug("MaxPool_/features/pool/MaxPool_output_0")
    assert "/" not in s and s.startswith("MaxPool__features_pool_MaxPool_output_0-")
    assert s == layer_slug("MaxPool_/features/pool/MaxPool_output_0")
    assert layer_slug("a/b") != layer_slug("a_b")
    assert len(layer_slug("X_" + "y" * 500)) <= 80


def test_shape_arithmetic_and_constants_fold(tmp_path):
    # x -> Relu -> y; Shape(y) is static -> folded; Reshape(y, shape) is a layer with an initializer
    w = numpy_helper.from_array(np.full((2, 3), 0.5, np.float32), "w")
    nodes = [
        helper.make_node("Relu", ["x"], ["y"], name="relu"),
        helper.make_node("Shape", ["y"], ["s"], name="shape"),
        helper.make_node("Identity", ["w"], ["w2"], name="ident"),
        helper.make_node("Add", ["y", "w2"], ["z"], name="add"),
        helper.make_node("Reshape", ["z", "s"], ["out/0"], name="reshape"),
    ]
    m = make_model(nodes, [tvi("x", TensorProto.FLOAT, [2, 3])], [tvi("out/0", TensorProto.FLOAT, [2, 3])], [w])
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    model, info = prepare_model(p)
    man = split_layers(model, info, tmp_path / "layers")
    assert [layer["layer_id"] for layer in man["layers"]] == ["Relu_y", "Add_z", "Reshape_out/0"]
    assert [f["op_type"] for f in man["folded_nodes"]] == ["Shape", "Identity"]
    add = man["layers"][1]
    assert add["node_index"] == 3 and [i["name"] for i in add["initializers"]] == ["w2"]
    reshape = man["layers"][2]
    assert "/" not in reshape["slug"]
    assert [i["name"] for i in reshape["initializers"]] == ["s"]


def test_if_layer_gets_outer_scope_inputs(tmp_path):
    """An If whose branches read a tensor of the enclosing graph: that tensor is a layer input."""
    from onnx import TensorProto as T

    from torq_gen_config.reference import compute_reference

    then_g = helper.make_graph([helper.make_node("Relu", ["a"], ["t"])], "then", [], [tvi("t", T.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["a"], ["e"])], "else", [], [tvi("e", T.FLOAT, [2])])
    nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    m = make_model(nodes, [tvi("x", T.FLOAT, [2])], [tvi("y", T.FLOAT, [2])],
                   [numpy_helper.from_array(np.array(0, np.float32), "zero")])
    onnx.save(m, tmp_path / "if.onnx")
    model, info = prepare_model(tmp_path / "if.onnx")
    man = split_layers(model, info, tmp_path / "layers")
    if_layer = man["layers"][-1]
    assert if_layer["layer_id"] == "If_y" and [i["name"] for i in if_layer["inputs"]] == ["c", "a"]
    assert compute_reference(tmp_path / "layers" / "If_y" / "model.onnx", tmp_path / "ref.npz")["status"] == "ok"
