"""Schema-aware dtype narrowing (precision/narrowing.py, bf16_rounding.py, widening.py):
bf16 and int32 on real models, checked with the ONNX checker, ONNX Runtime and IREE (llvm-cpu)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from torq_gen_config.core.errors import ConfigError, ModelError
from torq_gen_config.precision.bf16_rounding import round_to_bf16
from torq_gen_config.precision.narrowing import BF16_OPSET, KEEP_INT64_INPUTS, convert_int64_to_int32, convert_to_bf16
from torq_gen_config.precision.widening import widen_bf16_to_fp32

SQUEEZENET = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_squeezenet.onnx"
I64 = np.iinfo(np.int64)
I32 = np.iinfo(np.int32)
METRICS = {"name", "values", "max_abs_error", "mean_abs_error", "rmse", "max_rel_error"}


def _model(nodes, inputs, outputs, inits=(), opset=BF16_OPSET):
    g = helper.make_graph(nodes, "main", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    onnx.checker.check_model(m, full_check=True)
    return onnx.shape_inference.infer_shapes(m)


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _elem(vis, name):
    return next(v.type.tensor_type.elem_type for v in vis if v.name == name)


def _ort(model, feeds):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


@pytest.fixture(scope="module")
def squeezenet22():
    m = onnx.load(str(SQUEEZENET))
    m = onnx.shape_inference.infer_shapes(m)
    return onnx.version_converter.convert_version(m, 22)


@pytest.fixture(scope="module")
def squeezenet_bf16(squeezenet22):
    return convert_to_bf16(squeezenet22)


# ----------------------------------------------------------------------------- helpers


def test_round_to_bf16_is_rne_and_saturates_on_request():
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.4e38, -3.4e38, np.inf, 0.0], dtype=np.float32)
    r = round_to_bf16(x)
    assert r.dtype == ml_dtypes.bfloat16
    assert r[:3].astype(np.float32).tolist() == [1.0, 1 + 2**-6, -1.0]  # ties to even
    assert np.isinf(r[3]) and np.isinf(r[4])
    s = round_to_bf16(x, saturate=True).astype(np.float32)
    bmax = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    assert s[3] == bmax and s[4] == -bmax and np.isinf(s[5])


def test_low_opset_is_a_config_error_and_input_untouched(squeezenet22):
    m17 = onnx.version_converter.convert_version(onnx.shape_inference.infer_shapes(onnx.load(str(SQUEEZENET))), 17)
    with pytest.raises(ConfigError, match="opset >= 22"):
        convert_to_bf16(m17)
    with pytest.raises(ConfigError, match="opset >= 22"):
        convert_int64_to_int32(m17)
    before = squeezenet22.SerializeToString()
    convert_to_bf16(squeezenet22)
    assert squeezenet22.SerializeToString() == before


# ----------------------------------------------------------------------------- 1. squeezenet bf16


def test_squeezenet_bf16(squeezenet22, squeezenet_bf16):
    m, rep = squeezenet_bf16
    onnx.checker.check_model(m, full_check=True)
    assert _elem(m.graph.input, "data_0") == TensorProto.BFLOAT16
    assert _elem(m.graph.output, "softmaxout_1") == TensorProto.BFLOAT16
    assert sorted(rep["io_converted"]) == ["data_0", "softmaxout_1"]
    cos = [n for n in m.graph.node if n.op_type == "ConstantOfShape"]
    assert len(cos) == 39
    for n in cos:
        t = n.attribute[0].t
        assert t.data_type == TensorProto.BFLOAT16
    # conv biases (initializers) and weights (ConstantOfShape) are bf16
    assert all(t.data_type in (TensorProto.BFLOAT16, TensorProto.INT64) for t in m.graph.initializer)
    for n in m.graph.node:
        if n.op_type == "Conv":
            assert all(_elem(list(m.graph.value_info) + list(m.graph.input), x) == TensorProto.BFLOAT16 for x in n.input)
    consts = {c["name"]: c for c in rep["constants"]}
    assert "conv1_b_0" in consts and "conv1_w_0" in consts
    assert consts["conv1_w_0"]["kind"] == "ConstantOfShape"
    for c in rep["constants"]:
        assert METRICS <= set(c)
        assert 0 <= c["max_abs_error"] and c["mean_abs_error"] <= c["max_abs_error"] and c["rmse"] <= c["max_abs_error"]
        assert c["max_rel_error"] <= 2**-8  # bf16 RNE: relative error <= 2^-8
    # 0.02 (ConstantOfShape weight) rounds to 0.02001953125 in bf16
    assert consts["conv1_w_0"]["max_abs_error"] == pytest.approx(abs(0.02001953125 - np.float32(0.02)), rel=1e-6)
    assert len(rep["origin"]) == len(m.graph.node)
    assert rep["origin"] == list(range(len(squeezenet22.graph.node)))  # no Casts needed here
    json.dumps(rep)


# ----------------------------------------------------------------------------- 2. bf16 Conv on IREE


def _conv_model():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32) * 0.3, "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])
    return _model([conv], [_vi("x", TensorProto.FLOAT, [1, 4, 16, 16])], [_vi("y", TensorProto.FLOAT, [1, 8, 16, 16])], [w, b])


def test_bf16_conv_on_iree_matches_widened_ort_reference(tmp_path):
    iree_rt = pytest.importorskip("iree.runtime")
    from torq_gen_config.backends.iree_tools import iree_tool_path
    from torq_gen_config.mlir.importer import import_model

    m, rep = convert_to_bf16(_conv_model())
    assert {c["name"] for c in rep["constants"]} == {"w", "b"}
    assert rep["casts_inserted"] == 0 and rep["origin"] == [0]
    mlir = tmp_path / "conv.mlir"
    import_model(m, mlir)
    assert "bf16" in mlir.read_text()[:2000]
    vmfb = tmp_path / "conv.vmfb"
    res = subprocess.run([iree_tool_path("iree-compile"), str(mlir), "--iree-hal-target-backends=llvm-cpu",
                          "--iree-llvmcpu-target-cpu=host", "-o", str(vmfb)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    x = np.random.default_rng(1).standard_normal((1, 4, 16, 16)).astype(np.float32)
    xb = round_to_bf16(x)
    mod = iree_rt.load_vm_flatbuffer_file(str(vmfb), driver="local-task")
    y = np.asarray(mod.main(xb).to_host())
    assert y.dtype == ml_dtypes.bfloat16 and y.shape == (1, 8, 16, 16)

    ref = _ort(widen_bf16_to_fp32(m), {"x": xb.astype(np.float32)})[0]
    ref_b = round_to_bf16(ref).astype(np.float32)
    diff = np.abs(y.astype(np.float32) - ref_b).max()
    ulp = float(np.abs(ref).max()) * 2**-7
    assert diff <= 4 * ulp, (diff, ulp)


def test_onnxruntime_cpu_has_no_bf16_conv():
    """Why widen_bf16_to_fp32 exists (its own test: the one above passes either way)."""
    m, _ = convert_to_bf16(_conv_model())
    xb = round_to_bf16(np.ones((1, 4, 16, 16), np.float32))
    try:
        _ort(m, {"x": xb})
    except Exception as e:  # INVALID_GRAPH / NOT_IMPLEMENTED
        assert "Conv" in str(e) or "bfloat16" in str(e)
    else:
        pytest.skip("this ONNX Runtime runs bf16 Conv (widening not needed for it)")


# ----------------------------------------------------------------------------- 3. schema forbids bf16


def test_float_only_schema_keeps_fp32_through_casts():
    # Celu (T = tensor(float) only at opset 22), Resize (scales: tensor(float) only),
    # a Constant used by Mul/Sub (bf16) and by a Celu (fp32).
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], dtype=np.float32), "scales")
    nodes = [
        helper.make_node("Constant", [], ["k"], name="k_const", value=numpy_helper.from_array(np.array(0.7, dtype=np.float32))),
        helper.make_node("Mul", ["x", "k"], ["xk"], name="mul"),
        helper.make_node("Celu", ["xk"], ["c"], name="celu"),
        helper.make_node("Add", ["c", "k"], ["ck"], name="add"),
        helper.make_node("Resize", ["ck", "", "scales"], ["r"], name="resize", mode="nearest"),
        helper.make_node("Celu", ["r"], ["y"], name="celu_out"),
        helper.make_node("Celu", ["k"], ["kc"], name="celu_k"),
        helper.make_node("Sub", ["k", "kc"], ["kk"], name="sub_kk"),
    ]
    src = _model(nodes, [_vi("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                 [_vi("y", TensorProto.FLOAT, [1, 2, 8, 8]), _vi("kk", TensorProto.FLOAT, [])], [scales])
    m, rep = convert_to_bf16(src)
    onnx.checker.check_model(m, full_check=True)
    g = m.graph
    assert _elem(g.input, "x") == TensorProto.BFLOAT16
    assert _elem(g.output, "y") == TensorProto.BFLOAT16 and _elem(g.output, "kk") == TensorProto.BFLOAT16
    init = {t.name: t for t in g.initializer}
    assert init["scales"].data_type == TensorProto.FLOAT  # only consumer needs float: kept, no Cast
    by_name = {n.name: n for n in g.node}
    # Celu reads an fp32 Cast of the bf16 Mul output, and its fp32 output is cast back to bf16 for Add
    celu = by_name["celu"]
    assert celu.input[0] == "xk__to_fp32"
    assert by_name["add"].input[0] == "c__to_bf16"
    # the Constant is bf16; Mul uses it directly
    kc = by_name["k_const"]
    assert kc.attribute[0].t.data_type == TensorProto.BFLOAT16
    assert by_name["mul"].input[1] == "k"
    # ... and one Cast serves its fp32 consumer, right before it
    assert by_name["celu_k"].input[0] == "k__to_fp32"
    assert by_name["sub_kk"].input == ["k", "kc__to_bf16"]
    # Resize: X and Y bf16, scales fp32
    assert by_name["resize"].input[2] == "scales"
    # graph output y: the fp32 Celu writes y__fp32, a Cast writes y
    assert by_name["celu_out"].output[0] == "y__fp32"
    cast_y = next(n for n in g.node if n.op_type == "Cast" and n.output[0] == "y")
    assert cast_y.input[0] == "y__fp32"
    # provenance: input Casts belong to their consumer, output Casts to their producer
    origin = rep["origin"]
    assert len(origin) == len(g.node)
    src_idx = {n.name: k for k, n in enumerate(src.graph.node)}
    pos = {n.name: k for k, n in enumerate(g.node)}
    assert origin[pos["Cast__xk__to_fp32"]] == src_idx["celu"]
    assert pos["Cast__xk__to_fp32"] == pos["celu"] - 1
    assert origin[pos["Cast__c__to_bf16"]] == src_idx["celu"]
    assert pos["Cast__c__to_bf16"] == pos["celu"] + 1
    assert origin[pos[cast_y.name]] == src_idx["celu_out"]
    assert pos["Cast__k__to_fp32"] == pos["celu_k"] - 1 and origin[pos["Cast__k__to_fp32"]] == src_idx["celu_k"]
    assert rep["casts_inserted"] == sum(1 for n in g.node if n.op_type == "Cast") == 6
    kept = {(k["node"], k["tensor"]) for k in rep["kept_wide"]}
    assert ("celu", "xk") in kept and ("resize", "scales") in kept and (None, "scales") in kept
    reason = next(k["reason"] for k in rep["kept_wide"] if k["node"] == "resize")
    assert "scales" in reason and "tensor(float)" in reason
    # the widened model runs in ORT and matches the fp32 model on bf16-rounded input
    x = np.random.default_rng(2).standard_normal((1, 2, 4, 4)).astype(np.float32)
    xb = round_to_bf16(x).astype(np.float32)
    got = _ort(widen_bf16_to_fp32(m), {"x": xb})
    want = _ort(src, {"x": xb})
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=0.02, atol=0.02)  # k is rounded to bf16 (0.69921875)


def test_opaque_if_node_keeps_fp32_and_outer_refs():
    then_g = helper.make_graph([helper.make_node("Neg", ["a"], ["t_out"])], "then", [], [_vi("t_out", TensorProto.FLOAT, [3])])
    else_g = helper.make_graph([helper.make_node("Identity", ["a"], ["e_out"])], "else", [], [_vi("e_out", TensorProto.FLOAT, [3])])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("If", ["cond"], ["o"], name="if", then_branch=then_g, else_branch=else_g),
        helper.make_node("Relu", ["o"], ["y"], name="relu2"),
    ]
    src = _model(nodes, [_vi("x", TensorProto.FLOAT, [3]), _vi("cond", TensorProto.BOOL, [])], [_vi("y", TensorProto.FLOAT, [3])])
    m, rep = convert_to_bf16(src)
    g = m.graph
    by = {n.name: n for n in g.node}
    ifn = by["if"]
    # the subgraphs read the fp32 Cast of "a", and the If output is cast to bf16 for relu2
    assert ifn.attribute[0].g.node[0].input[0] == "a__to_fp32" or ifn.attribute[1].g.node[0].input[0] == "a__to_fp32"
    assert by["relu2"].input[0] == "o__to_bf16"
    x = np.array([-1.0, 2.0, 3.0], dtype=np.float32)
    out = _ort(widen_bf16_to_fp32(m), {"x": x, "cond": np.array(True)})[0]
    np.testing.assert_array_equal(out, np.zeros(3, dtype=np.float32))


# ----------------------------------------------------------------------------- 4. int32


def _int_model(add_values):
    c = numpy_helper.from_array(np.array(add_values, dtype=np.int64), "c")
    shape = numpy_helper.from_array(np.array([3, 4], dtype=np.int64), "shape")
    starts = numpy_helper.from_array(np.array([1], dtype=np.int64), "starts")
    ends = numpy_helper.from_array(np.array([I64.max], dtype=np.int64), "ends")
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    nodes = [
        helper.make_node("Add", ["x", "c"], ["s"], name="add"),
        helper.make_node("Reshape", ["s", "shape"], ["r"], name="reshape"),
        helper.make_node("Slice", ["r", "starts", "ends", "axes"], ["y"], name="slice"),
    ]
    return _model(nodes, [_vi("x", TensorProto.INT64, [2, 6])], [_vi("y", TensorProto.INT64, [3, 3])], [c, shape, starts, ends, axes])


def test_int64_to_int32_clamps_sentinels_keeps_schema_int64():
    assert KEEP_INT64_INPUTS["Slice"] == (1, 2, 3, 4)
    vals = [1, 2, I64.max, I64.min, -5, 6]
    src = _int_model(vals)
    m, rep = convert_int64_to_int32(src)
    onnx.checker.check_model(m, full_check=True)
    assert _elem(m.graph.input, "x") == TensorProto.INT32 and _elem(m.graph.output, "y") == TensorProto.INT32
    init = {t.name: t for t in m.graph.initializer}
    assert init["c"].data_type == TensorProto.INT32
    assert numpy_helper.to_array(init["c"]).tolist() == [1, 2, I32.max, I32.min, -5, 6]
    assert rep["clamped"] == [{"name": "c", "int64_min": 1, "int64_max": 1}]
    for name in ("shape", "starts", "ends", "axes"):
        assert init[name].data_type == TensorProto.INT64, name
    assert numpy_helper.to_array(init["ends"]).tolist() == [I64.max]
    assert rep["casts_inserted"] == 0
    assert any(k["tensor"] == "starts" and "KEEP_INT64_INPUTS" in k["reason"] for k in rep["kept_wide"])
    assert any(k["tensor"] == "shape" and "tensor(int64)" in k["reason"] for k in rep["kept_wide"])
    x = np.arange(-6, 6, dtype=np.int64).reshape(2, 6)
    x[:, 2] = np.minimum(x[:, 2], 0)  # no overflow next to the sentinels in either width
    x[:, 3] = np.maximum(x[:, 3], 0)
    want = _ort(src, {"x": x})[0]
    got = _ort(m, {"x": x.astype(np.int32)})[0]
    assert got.dtype == np.int32
    sentinel = np.zeros((2, 6), dtype=bool)
    sentinel[:, 2:4] = True
    mask = sentinel.reshape(3, 4)[:, 1:]
    np.testing.assert_array_equal(got[~mask], want[~mask])
    assert (got[mask] != want[mask]).all()  # the sentinel positions hold clamped values


def test_int64_out_of_range_constant_is_a_model_error():
    with pytest.raises(ModelError, match=r"'c'.*3000000000"):
        convert_int64_to_int32(_int_model([1, 2, 3_000_000_000, 4, 5, 6]))
    cos = helper.make_node("ConstantOfShape", ["shp"], ["z"], name="cos",
                           value=numpy_helper.from_array(np.array([-3_000_000_000], dtype=np.int64)))
    add = helper.make_node("Add", ["x", "z"], ["y"], name="add")
    shp = numpy_helper.from_array(np.array([4], dtype=np.int64), "shp")
    m = _model([cos, add], [_vi("x", TensorProto.INT64, [4])], [_vi("y", TensorProto.INT64, [4])], [shp])
    with pytest.raises(ModelError, match=r"ConstantOfShape 'z'.*-3000000000"):
        convert_int64_to_int32(m)


def test_int32_shape_chain_and_cast_retarget():
    # Shape (int64 only) -> Gather (int32 allowed) -> Cast(to=int64) kept for Reshape
    idx = numpy_helper.from_array(np.array([0, 1], dtype=np.int64), "idx")
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"], name="shape"),
        helper.make_node("Gather", ["sh", "idx"], ["g"], name="gather"),
        helper.make_node("Cast", ["g"], ["gc"], name="cast_shape", to=TensorProto.INT64),
        helper.make_node("Reshape", ["x", "gc"], ["y"], name="reshape"),
        helper.make_node("Cast", ["y"], ["yc"], name="cast_out", to=TensorProto.INT64),
    ]
    src = _model(nodes, [_vi("x", TensorProto.FLOAT, [2, 3])], [_vi("yc", TensorProto.INT64, [2, 3])], [idx])
    m, rep = convert_int64_to_int32(src)
    by = {n.name: n for n in m.graph.node}
    to = lambda n: next(a.i for a in n.attribute if a.name == "to")  # noqa: E731
    assert to(by["cast_shape"]) == TensorProto.INT64  # every consumer needs int64: left alone
    assert to(by["cast_out"]) == TensorProto.INT32  # Cast(to=int64) -> Cast(to=int32)
    assert by["gather"].input[0] == "sh__to_int32"  # Shape must produce int64
    assert _elem(m.graph.output, "yc") == TensorProto.INT32
    got = _ort(m, {"x": np.ones((2, 3), np.float32)})[0]
    assert got.dtype == np.int32 and got.tolist() == [[1, 1, 1], [1, 1, 1]]


# ----------------------------------------------------------------------------- 5. widen round trip


def test_widen_bf16_squeezenet_runs_in_ort(squeezenet22, squeezenet_bf16):
    m, _ = squeezenet_bf16
    w = widen_bf16_to_fp32(m)
    assert not any(t.data_type == TensorProto.BFLOAT16 for t in w.graph.initializer)
    assert all(n.attribute[0].t.data_type == TensorProto.FLOAT for n in w.graph.node if n.op_type == "ConstantOfShape")
    assert _elem(w.graph.input, "data_0") == TensorProto.FLOAT
    # the widened weights are exactly the bf16 values
    b16 = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    for t in w.graph.initializer:
        if t.name in b16 and t.data_type == TensorProto.FLOAT:
            np.testing.assert_array_equal(numpy_helper.to_array(t), b16[t.name].astype(np.float32))
    x = np.random.default_rng(3).random((1, 3, 224, 224), dtype=np.float32)
    xb = round_to_bf16(x).astype(np.float32)
    y = _ort(w, {"data_0": xb})[0]
    y_ref = _ort(squeezenet22, {"data_0": xb})[0]
    assert y.shape == (1, 1000, 1, 1)
    np.testing.assert_allclose(round_to_bf16(y).astype(np.float32), y_ref, rtol=2**-7, atol=1e-6)
