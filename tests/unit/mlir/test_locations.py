"""Full-model MLIR import and the node -> line:col map (checked against the printed file)."""

from __future__ import annotations

import onnx

from torq_gen_config.mlir.importer import import_full_model, import_layer, layer_location, operator_at
from torq_gen_config.model.prepare import prepare_model
from torq_gen_config.model.split import split_layers


def test_squeezenet_locations_point_at_same_op_type(tmp_path, squeezenet_path):
    model, info = prepare_model(squeezenet_path)
    onnx.save(model, tmp_path / "prepared.onnx")
    man = split_layers(model, info, tmp_path / "layers")
    locs = import_full_model(tmp_path / "prepared.onnx", tmp_path / "full.mlir")
    assert locs["status"] == "ok" and locs["n_unverified"] == 0
    lines = (tmp_path / "full.mlir").read_text().splitlines()
    seen = set()
    for layer in man["layers"]:
        loc = layer_location(layer, locs)
        assert loc is not None, layer["layer_id"]
        assert operator_at(lines, loc) == f"onnx.{layer['op_type']}", (layer["layer_id"], loc)
        seen.add(loc)
    assert len(seen) == 66
    # the Softmax layer (expanded by the opset upgrade) points at the Softmax op, not the Reshape
    sm = man["layers"][-1]
    line = int(layer_location(sm, locs).split(":")[0])
    assert '"onnx.Softmax"' in lines[line - 1]
    # quick cross-check of the documented layout: node i at line 4 + n_initializers + i
    n_init = len(model.graph.initializer)
    first_conv = man["layers"][0]
    assert layer_location(first_conv, locs).split(":")[0] == str(4 + n_init + first_conv["prepared_node_indices"][0])


def test_layer_import_ok_and_error(tmp_path, squeezenet_path):
    model, info = prepare_model(squeezenet_path)
    man = split_layers(model, info, tmp_path / "layers")
    d = tmp_path / "layers" / man["layers"][0]["slug"]
    res = import_layer(d / "model.onnx", d / "model.mlir")
    assert res["status"] == "ok"
    assert "func.func @main" in (d / "model.mlir").read_text()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage")
    res = import_layer(bad, tmp_path / "bad.mlir")
    assert res["status"] == "error" and res["message"]
    assert (tmp_path / "bad.mlir").read_text() == ""
