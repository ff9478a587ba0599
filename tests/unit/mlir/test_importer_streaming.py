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


def test_stored_weights_by_reference_are_written_in_for_a_compile(tmp_path):
    """A layer imported with its weights referred to in the store is a few hundred bytes;
    written out with them it is, byte for byte, the hex import; its compile goes through that
    copy (removed after), and a store cut short is named."""
    from torq_gen_config.backends import make_backend
    from torq_gen_config.mlir.importer import has_stored_weights, write_with_weights

    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 64), dtype=np.float32)
    m = make_model([helper.make_node("MatMul", ["x", "W"], ["y"])], [tvi("x", TensorProto.FLOAT, [1, 64])],
                   [tvi("y", TensorProto.FLOAT, [1, 64])], [numpy_helper.from_array(w, "W")])
    m.graph.name = "main"  # the function the runtime calls, as in the split's layer models
    ws.externalize(m, tmp_path / ws.STORE_FILE)
    onnx.save(m, tmp_path / "m.onnx")
    hexed, ref = tmp_path / "hex.mlir", tmp_path / "layer" / "model.mlir"
    import_model(xd.load_model(tmp_path / "m.onnx", weights=False), hexed)
    import_model(xd.load_model(tmp_path / "m.onnx", weights=False), ref, stored_by_reference=True)
    assert ref.stat().st_size < 2000 < w.nbytes < hexed.stat().st_size
    assert has_stored_weights(ref) and not has_stored_weights(hexed)
    assert ref.read_text().split("\n{-#")[0] == hexed.read_text().split("\n{-#")[0]  # the same ops, same lines
    write_with_weights(ref, tmp_path / "full.mlir")
    assert (tmp_path / "full.mlir").read_text() == hexed.read_text()
    backend = make_backend({"name": "llvm-cpu", "backend": "iree", "options": {"target": "llvm-cpu"}})
    log = tmp_path / "compile.log"
    art = backend.compile(onnx_path=None, mlir_path=str(ref), work_dir=str(tmp_path / "w"), timeout_s=120,
                          log_path=str(log))
    x = rng.standard_normal((1, 64), dtype=np.float32)
    out, _ = backend.run(art, inputs={"x": x}, input_names=["x"], output_names=["y"], work_dir=str(tmp_path / "w"),
                         timeout_s=60, log_path=None)
    np.testing.assert_allclose(out["y"], x @ w, rtol=1e-4, atol=1e-4)
    assert "refers to the weight store" in log.read_text() and not (tmp_path / "w" / ".with_weights").exists()
    # the store cut short: the reference names it, nothing compiles on garbage
    store = tmp_path / ws.STORE_FILE
    store.write_bytes(store.read_bytes()[:100])
    try:
        write_with_weights(ref, tmp_path / "again.mlir")
        raise AssertionError("a store cut short went unnoticed")
    except ValueError as e:
        assert "weight store changed" in str(e)
