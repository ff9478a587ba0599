"""Deterministic inputs and ONNX Runtime references (including a failing reference)."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import TensorProto, helper, make_model, tvi
from onnx import numpy_helper

from torq_gen_config.core.errors import ModelError
from torq_gen_config.inputs.generate import make_inputs
from torq_gen_config.reference.model_inputs import load_input_data
from torq_gen_config.reference import (
    compute_reference,
    load_layer_inputs,
    load_reference,
    propagate_layer_inputs,
)


def test_inputs_are_deterministic_and_in_range():
    m = make_model([helper.make_node("Cast", ["b"], ["bf"], to=TensorProto.FLOAT), helper.make_node("Add", ["a", "bf"], ["c"])],
                   [tvi("a", TensorProto.FLOAT, [4, 5]), tvi("b", TensorProto.INT64, [4, 5])],
                   [tvi("c", TensorProto.FLOAT, [4, 5])])
    x1 = make_inputs(m)
    x2 = make_inputs(m)
    for k in x1:
        np.testing.assert_array_equal(x1[k], x2[k])
    assert x1["a"].dtype == np.float32 and -1 <= x1["a"].min() and x1["a"].max() < 1
    assert x1["b"].dtype == np.int64 and -40 <= x1["b"].min() and x1["b"].max() < 40
    x3 = make_inputs(m, {"seed": 7})
    assert not np.array_equal(x1["a"], x3["a"])


def test_gather_indices_bounded_by_indexed_dim(tmp_path):
    table = numpy_helper.from_array(np.arange(30, dtype=np.float32).reshape(3, 10), "table")
    m = make_model([helper.make_node("Gather", ["table", "idx"], ["y"], axis=1)],
                   [tvi("idx", TensorProto.INT64, [64])], [tvi("y", TensorProto.FLOAT, [3, 64])], [table])
    x = make_inputs(m)
    assert x["idx"].min() >= 0 and x["idx"].max() < 10
    onnx.save(m, tmp_path / "g.onnx")
    meta = compute_reference(tmp_path / "g.onnx", tmp_path / "ref.npz")
    assert meta["status"] == "ok"
    ins, outs, meta = load_reference(tmp_path / "ref.npz")
    np.testing.assert_array_equal(outs["y"], np.arange(30, dtype=np.float32).reshape(3, 10)[:, ins["idx"]])
    assert meta["ort_version"] == ort.__version__ and re.fullmatch(r"\d+\.\d+\.\d+\S*", meta["ort_version"])


def test_reference_failure_is_recorded(tmp_path):
    node = helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "main", [tvi("x", TensorProto.FLOAT, [2])], [tvi("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    onnx.save(m, tmp_path / "bad.onnx")
    meta = compute_reference(tmp_path / "bad.onnx", tmp_path / "ref.npz")
    assert meta["status"] == "error" and "ONNX Runtime" in meta["message"]
    ins, outs, meta2 = load_reference(tmp_path / "ref.npz")
    assert set(ins) == {"x"} and outs == {} and meta2["status"] == "error"


def _bf16(nodes, inputs, outputs):
    """A small fp32 model at opset 22, converted as --auto-convert-bf16 does."""
    from torq_gen_config.precision.narrowing import convert_to_bf16

    m = make_model(nodes, inputs, outputs, opset=22)
    m.ir_version = 10
    return convert_to_bf16(onnx.shape_inference.infer_shapes(m))[0]


def test_propagated_bf16_layer_inputs_stay_bf16(tmp_path):
    import ml_dtypes

    model = _bf16([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Concat", ["r", "x"], ["y"], axis=1)],
                  [tvi("x", TensorProto.FLOAT, [1, 4])], [tvi("y", TensorProto.FLOAT, [1, 8])])
    layer = _bf16([helper.make_node("Concat", ["r", "x"], ["y"], axis=1)],
                  [tvi("r", TensorProto.FLOAT, [1, 4]), tvi("x", TensorProto.FLOAT, [1, 4])],
                  [tvi("y", TensorProto.FLOAT, [1, 8])])
    assert all(v.type.tensor_type.elem_type == TensorProto.BFLOAT16 for v in list(model.graph.input) + list(layer.graph.input))
    onnx.save(model, tmp_path / "prepared.onnx")
    onnx.save(layer, tmp_path / "concat.onnx")
    manifest = {"layers": [{"slug": "relu", "inputs": [{"name": "x"}]},
                           {"slug": "concat", "inputs": [{"name": "r"}, {"name": "x"}]}]}
    from torq_gen_config.reference.model_inputs import cast_to_model_inputs, save_model_inputs

    def model_inputs(seed):
        feeds = {"x": np.random.default_rng(seed).uniform(-1, 1, (1, 4)).astype(np.float32)}
        save_model_inputs(tmp_path / "model_inputs.npz", cast_to_model_inputs(feeds, model), {"source": f"seed {seed}"})
        return tmp_path / "model_inputs.npz"

    values = tmp_path / "values"
    res = propagate_layer_inputs(tmp_path / "prepared.onnx", manifest, tmp_path / "layers", model_inputs(1),
                                 values_dir=values)
    assert res["rewritten"] == 2 and not res["fallback"]
    assert len(list(values.glob("*.npy"))) == 2  # x (read by both layers) and r: each value once
    path = tmp_path / "layers" / "concat" / "inputs.json"
    ins, _ = load_layer_inputs(path, layer)
    assert list(ins) == ["r", "x"] and all(a.dtype == ml_dtypes.bfloat16 for a in ins.values())
    np.testing.assert_array_equal(ins["r"].astype(np.float32), np.maximum(ins["x"].astype(np.float32), 0))
    meta = compute_reference(tmp_path / "concat.onnx", tmp_path / "ref.json", inputs_path=path, values_dir=values)
    assert meta["status"] == "ok", meta["message"]
    ref_in, ref_out, _ = load_reference(tmp_path / "ref.json")
    assert ref_in["r"].dtype == ml_dtypes.bfloat16 and ref_out["y"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(ref_out["y"].view(np.uint16),
                                  np.concatenate([ins["r"], ins["x"]], axis=1).view(np.uint16))
    # the reference's inputs are the stored values themselves, its output one more value; the
    # second engine's output (kept: no tolerance given) has the same bits, so the same file
    assert meta["second"]["outputs_kept"] is True and len(list(values.glob("*.npy"))) == 3
    # Unchanged arrays: no file is rewritten.
    stamp = path.stat().st_mtime_ns
    assert propagate_layer_inputs(tmp_path / "prepared.onnx", manifest, tmp_path / "layers",
                                  model_inputs(1), values_dir=values)["rewritten"] == 0
    assert path.stat().st_mtime_ns == stamp
    # Other values: rewritten.
    assert propagate_layer_inputs(tmp_path / "prepared.onnx", manifest, tmp_path / "layers",
                                  model_inputs(5), values_dir=values)["rewritten"] == 2


def test_a_reference_whose_stored_value_is_gone_is_made_again(tmp_path):
    """A value of the store removed outside the workflow: reading the reference names the
    file and removes the record too, so the next run's preparation makes both again."""
    from torq_gen_config.core.errors import DamagedWorkFile

    layer = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                                [tvi("x", TensorProto.FLOAT, [2, 3])],
                                                [tvi("y", TensorProto.FLOAT, [2, 3])]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(layer, tmp_path / "relu.onnx")
    ref = tmp_path / "layers" / "relu" / "reference.json"
    ref.parent.mkdir(parents=True)
    meta = compute_reference(tmp_path / "relu.onnx", ref, values_dir=tmp_path / "values",
                             tolerance={"fp_avg_tol": 0.01, "fp_max_tol": 0.01})
    assert meta["status"] == "ok" and meta["second"]["outputs_kept"] is False  # Relu: both engines agree
    ins, outs, back = load_reference(ref)
    np.testing.assert_array_equal(outs["y"], np.maximum(ins["x"], 0))
    assert back["second_outputs"] == {}
    for f in (tmp_path / "values").glob("*.npy"):
        f.unlink()
    with pytest.raises(DamagedWorkFile, match="values"):
        load_reference(ref)
    assert not ref.exists()


def test_second_engine_outputs_are_kept_where_the_engines_disagree(tmp_path):
    """The second engine's outputs are stored only where the engines are further apart than
    a tenth of the tolerance (None: always)."""
    from torq_gen_config.reference import engines_disagree

    agree = {"outputs": [{"name": "y", "kind": "float", "max_rel_diff": 1e-6, "mean_rel_diff": 1e-7}]}
    near = {"outputs": [{"name": "y", "kind": "float", "max_rel_diff": 2e-3, "mean_rel_diff": 1e-4}]}
    tol = {"fp_avg_tol": 0.01, "fp_max_tol": 0.01}
    for m in (agree, near):
        for o in m["outputs"]:
            o.update(shape=[2], dtype="float32", ref_dtype="float32", ref_shape=[2], num_elements=2,
                     missing_output=False, shape_mismatch=False, dtype_mismatch=False, nan_mismatch=False,
                     inf_mismatch=False, num_nonfinite_mismatches=0, quantized=False)
    assert not engines_disagree(agree, tol)
    assert engines_disagree(near, tol)  # within the tolerance, but not within a tenth of it
    assert engines_disagree(agree, None) and engines_disagree(None, tol)


def test_input_data_for_a_bf16_input(tmp_path):
    import ml_dtypes

    model = _bf16([helper.make_node("Relu", ["x"], ["y"])], [tvi("x", TensorProto.FLOAT, [2, 3])],
                  [tvi("y", TensorProto.FLOAT, [2, 3])])
    x = np.linspace(-1, 1, 6).reshape(2, 3)
    np.savez(tmp_path / "f64.npz", x=x)
    feeds = load_input_data(tmp_path / "f64.npz", model)
    assert feeds["x"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(feeds["x"], x.astype(np.float32).astype(ml_dtypes.bfloat16))
    np.savez(tmp_path / "int.npz", x=np.ones((2, 3), np.int32))
    with pytest.raises(ModelError, match="bfloat16"):
        load_input_data(tmp_path / "int.npz", model)


def sigmoid_far_left(path, shape=(1, 64, 32, 32)):
    """x * 24 - 29 -> Sigmoid: inputs in [-53, -5] for x in [-1, 1] (issue 42: ONNX Runtime's
    CPU Sigmoid is about 1 % off there, the spec is not)."""
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"]), helper.make_node("Sub", ["a", "c"], ["b"]),
             helper.make_node("Sigmoid", ["b"], ["y"])]
    m = make_model(nodes, [tvi("x", TensorProto.FLOAT, list(shape))], [tvi("y", TensorProto.FLOAT, list(shape))],
                   [numpy_helper.from_array(np.array(24, np.float32), "k"),
                    numpy_helper.from_array(np.array(29, np.float32), "c")])
    onnx.save(m, path)
    return m


def test_the_spec_in_float64_is_the_formula_in_float64():
    from torq_gen_config.reference.reference_run import run_spec_float64

    m = make_model([helper.make_node("Sigmoid", ["x"], ["y"]), helper.make_node("Cast", ["y"], ["z"], to=TensorProto.FLOAT)],
                   [tvi("x", TensorProto.FLOAT, [1000])], [tvi("y", TensorProto.FLOAT, [1000]), tvi("z", TensorProto.FLOAT, [1000])])
    x = np.linspace(-60, 10, 1000, dtype=np.float32)
    y, z = run_spec_float64(m, {"x": x}, ["y", "z"])
    want = (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)  # the spec page's formula
    assert y.dtype == np.float32 and z.dtype == np.float32
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(z, want)


def test_a_dispute_is_settled_by_the_spec_in_float64(tmp_path):
    """Where ONNX Runtime and the reference implementation disagree, the spec in float64
    runs; the verdicts rest on it, and each engine's agreement with it is recorded."""
    from torq_gen_config.reference import judged_reference
    from torq_gen_config.compare import derive_status

    sigmoid_far_left(tmp_path / "s.onnx")
    x = np.linspace(-1, 1, 64 * 32 * 32, dtype=np.float32).reshape(1, 64, 32, 32)
    tol = {"fp_avg_tol": 0.01, "fp_max_tol": 0.01}
    meta = compute_reference(tmp_path / "s.onnx", tmp_path / "ref.json", inputs={"x": x}, tolerance=tol,
                             values_dir=tmp_path / "values")
    arbiter = meta["arbiter"]
    assert arbiter["status"] == "ok" and set(arbiter["agreement"]) == {"onnxruntime", "onnx"}
    assert derive_status(arbiter["agreement"]["onnx"], tol)[0] == "success"
    ins, outs, meta = load_reference(tmp_path / "ref.json")
    used, ref, line = judged_reference(meta, outs)
    want = (1.0 / (1.0 + np.exp(-(x.astype(np.float64) * 24 - 29)))).astype(np.float32)
    assert used == "onnx-float64" and "float64" in line
    np.testing.assert_allclose(ref["y"], want, rtol=1e-6)
    np.testing.assert_array_equal(outs["y"], ort.InferenceSession(str(tmp_path / "s.onnx")).run(None, {"x": x})[0])
    # (ONNX Runtime's outputs stay the primary's); where the engines agree (Sigmoid near 0),
    # there is no arbiter and the verdicts rest on the configured engine
    meta = compute_reference(tmp_path / "s.onnx", tmp_path / "ref2.json", inputs={"x": x * 0 + 1.2}, tolerance=tol,
                             values_dir=tmp_path / "values")
    assert "arbiter" not in meta
    assert judged_reference(*reversed(load_reference(tmp_path / "ref2.json")[1:]))[0] == "onnxruntime"


def test_an_overflow_in_the_spec_is_not_a_console_warning():
    """Issue 42 item 6: numpy's "overflow encountered in exp" from the second opinion reached the console."""
    import warnings

    from torq_gen_config.reference.reference_run import run_reference, run_spec_float64

    m = make_model([helper.make_node("Exp", ["x"], ["y"])], [tvi("x", TensorProto.FLOAT, [3])],
                   [tvi("y", TensorProto.FLOAT, [3])])
    x = np.array([1, 100, 1000], np.float32)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for y in (run_reference(m, {"x": x}, ["y"], engine="onnx")[0], run_spec_float64(m, {"x": x}, ["y"])[0]):
            assert y.dtype == np.float32 and np.isinf(y[1:]).all()
    assert not [w for w in seen if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in seen]


def test_lrn_is_the_spec_pages_formula_in_the_engine_and_in_folding():
    """onnx 1.23's LRN loops over the batch, not the channels (16 channels, batch 1: 50 % off);
    the second engine, the spec in float64 and constant folding (the fresh-user test: a
    folded LRN made the next layer's reference 6.19 off) all use the spec page's formula."""
    import math

    from torq_gen_config.model.folding import evaluate_node
    from torq_gen_config.reference.reference_run import run_reference, run_spec_float64

    x = (np.random.default_rng(0).standard_normal((1, 16, 4, 4)) * 50).astype(np.float32)
    xd, want = x.astype(np.float64), np.empty((1, 16, 4, 4))
    for c in range(16):  # onnx.ai/onnx/operators/onnx__LRN.html
        ss = (xd[:, max(0, c - 2):min(15, c + math.ceil(4 / 2)) + 1] ** 2).sum(axis=1)
        want[:, c] = xd[:, c] / (1.0 + 1e-4 / 5 * ss) ** 0.75
    node = helper.make_node("LRN", ["x"], ["y"], size=5, alpha=1e-4, beta=0.75, bias=1.0)
    m = make_model([node], [tvi("x", TensorProto.FLOAT, [1, 16, 4, 4])], [tvi("y", TensorProto.FLOAT, [1, 16, 4, 4])])
    for got in (run_reference(m, {"x": x}, ["y"], engine="onnx")[0], run_spec_float64(m, {"x": x}, ["y"])[0],
                evaluate_node(node, {"x": x}, {"": 17})[0],
                run_reference(m, {"x": x}, ["y"], engine="onnxruntime")[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5)
