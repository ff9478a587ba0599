"""The importer's text written with the weights streamed from their bytes
(:func:`torq_gen_config.mlir.importer._write_asm`) is MLIR's own print of the module,
byte for byte: checked by parsing each written file and printing it again with MLIR."""

from __future__ import annotations

import numpy as np
import onnx
from conftest import TensorProto, helper, make_model, tvi
from onnx import numpy_helper

from torq_gen_config.core import external_data as xd
from torq_gen_config.core import weight_store as ws
from torq_gen_config.mlir.importer import import_model
from torq_gen_config.model.prepare import prepare_model
from torq_gen_config.model.split import split_layers


def _mlir_print(path) -> str:
    from iree.compiler import ir

    return ir.Module.parseFile(str(path), ir.Context()).operation.get_asm(assume_verified=True) + "\n"


def test_layers_of_squeezenet_print_as_mlir_does(tmp_path, squeezenet_path):
    """Folded weights (in-model raw data) and small constants, 66 layers."""
    model, info = prepare_model(squeezenet_path)
    man = split_layers(model, info, tmp_path / "layers")
    for layer in man["layers"][::5]:
        out = tmp_path / f"{layer['slug']}.mlir"
        import_model(xd.load_model(tmp_path / "layers" / layer["slug"] / "model.onnx"), out)
        assert out.read_text() == _mlir_print(out), layer["slug"]


def test_stored_weights_print_as_mlir_does_and_elide(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64), dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("MatMul", ["h", "W"], ["y"]),
             helper.make_node("Add", ["y", "b"], ["z"])]
    m = make_model(nodes, [tvi("x", TensorProto.FLOAT, [1, 64])], [tvi("z", TensorProto.FLOAT, [1, 64])],
                   [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.ones(4, np.float32)[:1], "b")])
    ws.externalize(m, tmp_path / ws.STORE_FILE)
    onnx.save(m, tmp_path / "m.onnx")
    out = tmp_path / "m.mlir"
    import_model(xd.load_model(tmp_path / "m.onnx", weights=False), out)
    text = out.read_text()
    assert text == _mlir_print(out)
    assert w.tobytes().hex().upper() in text and text.count("dense_resource<") == 2
    elided = tmp_path / "map.mlir"
    import_model(xd.load_model(tmp_path / "m.onnx", weights=False), elided, elide_weights=True)
    assert w.tobytes().hex().upper()[:64] not in elided.read_text()
    assert elided.read_text().split("\n{-#")[0] == text.split("\n{-#")[0]  # the same ops on the same lines
