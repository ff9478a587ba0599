"""Input dims as exporters write them, end to end (issue 42, items 4 and 5): a model
declared ``[-1, 3, ?, ?]`` runs with ``--input-data`` of any shape ONNX Runtime takes, and
input sizes that nothing gave and that the model does not take stop discovery with one
line naming the ``--input-shapes`` to give (and the prepare log says it too)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import make_model, one_line_error, run_cli, tvi, work

pytestmark = pytest.mark.slow


def _input(dims) -> onnx.ValueInfoProto:
    vi = tvi("x", TensorProto.FLOAT, None)
    vi.type.tensor_type.shape.SetInParent()
    for d in dims:
        dim = vi.type.tensor_type.shape.dim.add()
        if isinstance(d, int):
            dim.dim_value = d
        else:
            dim.dim_param = d
    return vi


def test_a_direction_classifier_declaration_runs_with_its_real_input(tmp_path):
    w = numpy_helper.from_array(np.full((4, 3, 3, 3), 0.1, np.float32), "w")
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], [_input([-1, 3, "?", "?"])],
                       [tvi("y", TensorProto.FLOAT, ["", "", "", ""])], [w], name="cls")
    onnx.save(model, tmp_path / "cls.onnx")
    np.savez(tmp_path / "in.npz", x=np.random.default_rng(0).random((1, 3, 48, 192), dtype=np.float32))
    r = run_cli("discover", "--model", tmp_path / "cls.onnx", "--input-data", tmp_path / "in.npz",
                "--output-dir", tmp_path / "out", "-j", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert "note: input x dim 0 (-1) set to 1 (--input-data)" in r.stderr
    assert "note: input x dim 3 (?) set to 192 (--input-data)" in r.stderr
    assert "verdicts: success" in r.stderr and "not tested" not in r.stderr


def test_sizes_nothing_gave_that_the_model_does_not_take_stop_with_one_line(tmp_path):
    """A Reshape to 75 values needs a 5x5 input; no size the tool tries is accepted, the
    whole-model run fails at the first node: one line that names --input-shapes."""
    shape = numpy_helper.from_array(np.array([1, 75], np.int64), "shape")
    model = make_model([helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["y"])],
                       [_input(["batch", 3, "h", "w"])], [tvi("y", TensorProto.FLOAT, [1, 75])], [shape], name="flat")
    onnx.save(model, tmp_path / "flat.onnx")
    r = run_cli("discover", "--model", tmp_path / "flat.onnx", "--output-dir", tmp_path / "out", "-j", "2")
    assert r.returncode != 0
    line = one_line_error(r)
    assert "the whole-model reference run fails with the input sizes chosen" in line
    assert "--input-shapes x:1x3x32x32 with those dims changed" in line
    log = (work(tmp_path / "out") / "logs" / "prepare_model.log").read_text()
    assert "failed: the whole-model reference run fails" in log
