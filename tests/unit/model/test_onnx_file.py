"""Reading a model file's graph without its weights (:mod:`torq_gen_config.model.onnx_file`):
the skeleton parses to the same model as ``onnx.load``, with each large tensor's values
referring to their bytes in the file."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import TensorProto, helper, make_model, tvi
from onnx import numpy_helper

from torq_gen_config.core import external_data as xd
from torq_gen_config.model.onnx_file import WireError, read_skeleton
from torq_gen_config.model.prepare import load_model

T = TensorProto


def _if_model():
    """Weights as raw data, as packed float_data, in a Constant node, in an If branch,
    plus small and int64 tensors that stay inside."""
    rng = np.random.default_rng(0)
    w_raw = numpy_helper.from_array(rng.standard_normal((32, 32), dtype=np.float32), "w_raw")
    w_float = helper.make_tensor("w_float", T.FLOAT, [32, 32], rng.standard_normal(1024).astype(np.float32).tolist())
    w_dbl = helper.make_tensor("w_dbl", T.DOUBLE, [16, 16], rng.standard_normal(256).tolist())
    shape = numpy_helper.from_array(np.array([1, 32], np.int64), "shape")
    branch_w = numpy_helper.from_array(rng.standard_normal((32, 32), dtype=np.float32), "bw")
    then = helper.make_graph([helper.make_node("MatMul", ["h", "bw"], ["t"])], "then", [], [tvi("t", T.FLOAT, [1, 32])],
                             initializer=[branch_w])
    other = helper.make_graph([helper.make_node("Identity", ["h"], ["e"])], "else", [], [tvi("e", T.FLOAT, [1, 32])])
    const = numpy_helper.from_array(rng.standard_normal((32, 32), dtype=np.float32), "cv")
    nodes = [helper.make_node("MatMul", ["x", "w_raw"], ["a"]), helper.make_node("MatMul", ["a", "w_float"], ["b"]),
             helper.make_node("Constant", [], ["c"], value=const), helper.make_node("MatMul", ["b", "c"], ["d"]),
             helper.make_node("Reshape", ["d", "shape"], ["h"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]
    m = make_model(nodes, [tvi("x", T.FLOAT, [1, 32]), tvi("cond", T.BOOL, [])], [tvi("y", T.FLOAT, [1, 32])],
                   [w_raw, w_float, shape])
    m.graph.initializer.append(w_dbl)  # unused, still a tensor of the file
    return m


def test_skeleton_is_the_model_with_its_weights_in_the_file(tmp_path):
    m = _if_model()
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    data, n = read_skeleton(path)
    assert n == 5 and len(data) < path.stat().st_size / 5  # w_raw, w_float, w_dbl, the Constant, the branch's
    sk = onnx.load_from_string(data)
    full = onnx.load(str(path))
    pairs = list(zip(xd.model_tensors(full), xd.model_tensors(sk)))
    assert len(pairs) == len(list(xd.model_tensors(full)))
    for a, b in pairs:
        assert a.name == b.name and list(a.dims) == list(b.dims)
        np.testing.assert_array_equal(numpy_helper.to_array(a), xd.tensor_array(b))
    assert not xd.is_external(sk.graph.initializer[2])  # the int64 shape: small, inside
    loaded = onnx.ModelProto()
    loaded.CopyFrom(sk)
    xd.load_weights(loaded)
    onnx.checker.check_model(loaded)
    assert [n.op_type for n in loaded.graph.node] == [n.op_type for n in full.graph.node]


def test_truncated_and_foreign_files_are_wire_errors(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_if_model(), path)
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(WireError, match="truncated"):
        read_skeleton(cut)
    text = tmp_path / "t.onnx"
    text.write_text("this is not a model\n" * 10)
    with pytest.raises(WireError):
        read_skeleton(text)


def test_load_model_reads_external_data_and_checks_it(tmp_path):
    m = _if_model()
    onnx.save_model(m, tmp_path / "ext.onnx", save_as_external_data=True, location="ext.data", size_threshold=64)
    graph = load_model(tmp_path / "ext.onnx", graph_only=True)
    assert all(e.value.startswith(str(tmp_path)) for t in xd.model_tensors(graph) for e in t.external_data
               if e.key == "location")
    whole = load_model(tmp_path / "ext.onnx")
    assert not any(xd.is_external(t) for t in xd.model_tensors(whole))
    with open(tmp_path / "ext.data", "r+b") as f:
        f.truncate(100)
    from torq_gen_config.core.errors import ModelError

    with pytest.raises(ModelError, match="cannot read the model's external data"):
        load_model(tmp_path / "ext.onnx", graph_only=True)
