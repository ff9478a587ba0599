"""model.prepare.model_fingerprint: which file and external weights a model is (a param of
the preparation job), without importing onnx for a model that names no external data."""

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixtures.models import if_lstm_model

from torq_gen_config.core.errors import ModelError
from torq_gen_config.model.prepare import _may_name_external_data, load_model, model_fingerprint


def _model(path, external: bool):
    w = numpy_helper.from_array(np.full((64, 64), 0.5, np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    if external:
        onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
                  size_threshold=0)
    else:
        onnx.save(m, path)


def test_external_data_files_are_part_of_the_fingerprint(tmp_path):
    p = tmp_path / "m.onnx"
    _model(p, external=True)
    assert _may_name_external_data(p)
    fp = model_fingerprint(p)
    (loc, size, mtime), = fp["external_data"]
    assert loc == "w.bin" and size == (tmp_path / "w.bin").stat().st_size and mtime
    os.utime(tmp_path / "w.bin", ns=(1, 1))  # new weights next to the same model: another fingerprint
    assert model_fingerprint(p) != fp


def test_a_model_without_external_data_is_not_parsed(tmp_path):
    p = tmp_path / "m.onnx"
    _model(p, external=False)
    assert not _may_name_external_data(p)
    assert not _may_name_external_data(tmp_path / "missing.onnx")
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert not _may_name_external_data(tmp_path / "empty.onnx")
    code = ("import sys; from torq_gen_config.model.prepare import model_fingerprint; "
            f"fp = model_fingerprint({str(p)!r}); assert fp['external_data'] == [] and fp['size'], fp; "
            "assert 'onnx' not in sys.modules, 'onnx was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_external_data_of_a_subgraph_is_part_of_the_fingerprint(tmp_path):
    """A model whose only large tensor is a Constant inside an If branch, saved with
    external data: that file is found (and a missing one refused) like a top-level one."""
    p = tmp_path / "m.onnx"
    onnx.save(if_lstm_model(trap=False), p, save_as_external_data=True, all_tensors_to_one_file=True,
              location="branches.bin", size_threshold=1024)
    (loc, size, _), = model_fingerprint(p)["external_data"]
    assert loc == "branches.bin" and size == (tmp_path / "branches.bin").stat().st_size
    (tmp_path / "branches.bin").unlink()
    with pytest.raises(ModelError, match="branches.bin not found"):
        load_model(p, graph_only=True)
