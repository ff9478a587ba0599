"""int8 quantization (the modules of torq_gen_config.precision) on the real light_squeezenet,
with ONNX Runtime's quantize_static, IREE's importer and the IREE llvm-cpu tools."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from torq_gen_config.backends.iree import IreeBackend
from torq_gen_config.core.errors import ModelError
from torq_gen_config.mlir.importer import import_model
from torq_gen_config.model.prepare import prepare_model
from torq_gen_config.core.layout import MODEL_FILE
from torq_gen_config.model.split import split_layers
from torq_gen_config.precision import qdq_graph
from torq_gen_config.precision.alignment import align_layers, compute_nodes
from torq_gen_config.precision.calibration import (DEFAULT_CALIBRATION_SAMPLES, DEFAULT_CALIBRATION_SEED,
                                                   INT_INPUT_RANGE, _layer_samples, calibration_samples)
from torq_gen_config.precision.folding import fold_to_initializers
from torq_gen_config.precision.ort_quantization import QuantizationError, _root_logger_guard
from torq_gen_config.precision.quantize import _choose_format, quantize_model
from torq_gen_config.precision.ranges import tensor_ranges

SQUEEZENET = Path(onnx.__file__).parent / "backend/test/data/light/light_squeezenet.onnx"


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def sq(tmp_path_factory):
    """Prepared squeezenet, its layers, calibration samples and tensor ranges."""
    model, info = prepare_model(SQUEEZENET, target_opset=17)
    layers_dir = tmp_path_factory.mktemp("layers")
    manifest = split_layers(model, info, layers_dir)
    samples = calibration_samples(model, n=DEFAULT_CALIBRATION_SAMPLES, seed=DEFAULT_CALIBRATION_SEED)
    ranges = tensor_ranges(model, samples)
    return {"model": model, "manifest": manifest, "layers_dir": layers_dir, "samples": samples, "ranges": ranges}


@pytest.fixture(scope="module")
def full_qdq(sq):
    return quantize_model(sq["model"], ranges=sq["ranges"], samples=sq["samples"], quant_format="qdq")


@pytest.fixture(scope="module")
def full_qop_int(sq):
    return quantize_model(sq["model"], ranges=sq["ranges"], samples=sq["samples"], quant_format="qoperator",
                          full_integer=True)


def layer(sq, op_type: str, k: int = 0) -> tuple[dict, onnx.ModelProto]:
    """The k-th layer of ``op_type`` (manifest record, loaded layer model)."""
    rec = [x for x in sq["manifest"]["layers"] if x["op_type"] == op_type][k]
    return rec, onnx.load(str(sq["layers_dir"] / rec["slug"] / MODEL_FILE))


def manifest_layers(sq) -> list[dict]:
    return [{"op_type": x["op_type"], "outputs": [o["name"] for o in x["outputs"]]} for x in sq["manifest"]["layers"]]


def ort_run(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    return dict(zip(names, sess.run(names, feeds)))


def q_scale(model, tensor: str) -> tuple[float, int]:
    """(scale, zero_point) of the QuantizeLinear that reads ``tensor``, or of the
    DequantizeLinear that writes it (a graph output: ORT renames the producer's output)."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    node = next(n for n in model.graph.node if (n.op_type == "QuantizeLinear" and n.input[0] == tensor)
                or (n.op_type == "DequantizeLinear" and n.output[0] == tensor))
    return float(inits[node.input[1]]), int(inits[node.input[2]])


# --------------------------------------------------------------------- folding / ranges
def test_fold_and_ranges(sq):
    folded = fold_to_initializers(sq["model"])
    ops = [n.op_type for n in folded.graph.node]
    assert "ConstantOfShape" not in ops and "Shape" not in ops
    assert ops.count("Conv") == 26
    inits = {t.name for t in folded.graph.initializer}
    assert all(n.input[1] in inits for n in folded.graph.node if n.op_type == "Conv")
    r = sq["ranges"]
    assert r["data_0"][0] >= -1.0 and r["data_0"][1] < 1.0 and r["data_0"][0] < -0.99
    assert r["r1"][0] == 0.0  # a Relu output
    assert "softmaxout_1" in r and all(lo <= hi for lo, hi in r.values())


# ------------------------------------------------------------------ 1. full-model flow
@pytest.mark.parametrize("which", ["qdq", "qoperator_full_integer"])
def test_full_model_alignment(sq, full_qdq, full_qop_int, which):
    q, info = full_qdq if which == "qdq" else full_qop_int
    assert info["quantized"] and info["activation_type"] == info["weight_type"] == "int8"
    onnx.checker.check_model(q)
    computes = compute_nodes(q)
    assert sum(c["op_type"] == "Conv" for c in computes) == 26
    assert not any(c["quantized_op_type"] in ("QuantizeLinear", "DequantizeLinear", "Constant") for c in computes)
    layers = manifest_layers(sq)
    aligned = align_layers(layers, computes)
    assert len(aligned) == len(layers)
    fused_relu = not any(c["op_type"] == "Relu" for c in computes)
    assert fused_relu  # ORT fuses every Relu of squeezenet into its Conv
    for lay, a in zip(layers, aligned):
        if lay["op_type"] in ("Conv", "Concat", "MaxPool"):
            assert a is not None and computes[a]["op_type"] == lay["op_type"], lay
        if lay["op_type"] == "Relu":
            assert a is None
    used = [a for a in aligned if a is not None]
    assert used == sorted(used) and len(set(used)) == len(used)
    convs = [computes[a] for lay, a in zip(layers, aligned) if lay["op_type"] == "Conv"]
    if which == "qdq":
        assert info["format_used"] == "qdq" and not info["full_integer"]
        assert {c["quantized_op_type"] for c in convs} == {"Conv"}
        assert q.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
        assert info["io_quantization"]["data_0"]["io_dtype"] == "float32"
    else:
        assert info["format_used"] == "qoperator" and info["full_integer"]
        assert {c["quantized_op_type"] for c in convs} == {"QLinearConv"}
        # names break ties: QLinearConv of layer Conv_rX writes rX_quantized
        assert all(c["outputs"][0] == lay["outputs"][0] + "_quantized"
                   for lay, c in zip([x for x in layers if x["op_type"] == "Conv"], convs))
        assert q.graph.input[0].name == "data_0" and q.graph.output[0].name == "softmaxout_1"
        assert q.graph.input[0].type.tensor_type.elem_type == TensorProto.INT8
        assert q.graph.output[0].type.tensor_type.elem_type == TensorProto.INT8
        io = info["io_quantization"]
        assert io["data_0"]["dtype"] == io["data_0"]["io_dtype"] == "int8"
        assert io["data_0"]["scale"] == pytest.approx(q_scale(full_qdq[0], "data_0")[0])
        assert "softmaxout_1" in io
        # int8 I/O runs in ORT
        x = np.zeros([1, 3, 224, 224], dtype=np.int8)
        assert ort_run(q, {"data_0": x})["softmaxout_1"].dtype == np.int8
    # every tensor has value_info (IREE's importer types missing ones !torch.none)
    known = {v.name for v in list(q.graph.value_info) + list(q.graph.input) + list(q.graph.output)}
    assert all(t in known for n in q.graph.node for t in n.output if t)


def test_full_model_imports(sq, full_qdq, full_qop_int, tmp_path):
    for name, (q, _) in (("qdq", full_qdq), ("qop", full_qop_int)):
        import_model(q, tmp_path / f"{name}.mlir")
        assert "!torch.none" not in (tmp_path / f"{name}.mlir").read_text()


# ------------------------------------------------- 2. per-layer Conv through IREE vs ORT
@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_layer_conv_iree_matches_ort(sq, fmt, tmp_path):
    rec, lm = layer(sq, "Conv", 1)
    q, info = quantize_model(lm, ranges=sq["ranges"], quant_format=fmt)
    assert info["format_used"] == fmt and info["quantized_nodes"] == 1
    ops = [n.op_type for n in q.graph.node]
    assert ("QLinearConv" in ops) == (fmt == "qoperator")
    onnx.save(q, tmp_path / "q.onnx")
    import_model(q, tmp_path / "q.mlir")
    be = IreeBackend("iree", {})
    art = be.compile(onnx_path=str(tmp_path / "q.onnx"), mlir_path=str(tmp_path / "q.mlir"), work_dir=str(tmp_path),
                     timeout_s=300, log_path=None)
    x_name = q.graph.input[0].name
    lo, hi = sq["ranges"][x_name]
    x = np.random.default_rng(7).uniform(lo, hi, [d.dim_value for d in q.graph.input[0].type.tensor_type.shape.dim])
    feeds = {x_name: x.astype(np.float32)}
    out_names = [o.name for o in q.graph.output]
    got, _ = be.run(art, inputs=feeds, input_names=[x_name], output_names=out_names, work_dir=str(tmp_path),
                    timeout_s=120, log_path=None)
    ref = ort_run(q, feeds)
    y = out_names[0]
    step = info["io_quantization"][y]["scale"]
    assert got[y].shape == ref[y].shape
    assert np.max(np.abs(got[y].astype(np.float64) - ref[y])) <= step * 1.001


# ------------------------------------------------------------ 3. per-layer scale consistency
def test_layer_scales_match_full_model(sq, full_qdq):
    full = full_qdq[0]
    rec, lm = layer(sq, "Conv", 1)  # Conv_r3: input r2 (MaxPool output), output r3
    q, info = quantize_model(lm, ranges=sq["ranges"], quant_format="qdq")
    x, y = rec["inputs"][0]["name"], rec["outputs"][0]["name"]
    assert q_scale(q, x) == q_scale(full, x)
    # the output Q of the layer uses the layer's own range, as ORT computes it
    s, z = qdq_graph._scale_zp(*sq["ranges"][y])
    assert q_scale(q, y) == (float(s), int(z))
    # a Concat layer: output scale equal to the full model's
    rec, lm = layer(sq, "Concat", 2)
    q, _ = quantize_model(lm, ranges=sq["ranges"], quant_format="qdq")
    y = rec["outputs"][0]["name"]
    assert q_scale(q, y) == q_scale(full, y)
    for i in rec["inputs"]:
        assert q_scale(q, i["name"]) == q_scale(full, i["name"])


# ------------------------------------------------------------ 4. lone Relu/MaxPool wrapped
@pytest.mark.parametrize("op", ["Relu", "MaxPool"])
@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_wrap_unquantized_io(sq, op, fmt):
    rec, lm = layer(sq, op)
    plain, pinfo = quantize_model(lm, ranges=sq["ranges"], quant_format=fmt)
    assert not pinfo["quantized"] and pinfo["wrapped_io"] == []  # ORT leaves a lone Relu/MaxPool in float
    q, info = quantize_model(lm, ranges=sq["ranges"], quant_format=fmt, wrap_unquantized_io=True)
    assert info["quantized"]
    x, y = rec["inputs"][0]["name"], rec["outputs"][0]["name"]
    assert {(w["tensor"], w["kind"]) for w in info["wrapped_io"]} == {(x, "input"), (y, "output")}
    ops = [n.op_type for n in q.graph.node]
    assert ops.count("QuantizeLinear") == 2 and ops.count("DequantizeLinear") == 2
    assert [i.name for i in q.graph.input] == [x] and [o.name for o in q.graph.output] == [y]
    w_out = next(w for w in info["wrapped_io"] if w["kind"] == "output")
    s, z = qdq_graph._scale_zp(*sq["ranges"][y])
    assert (w_out["scale"], w_out["zero_point"]) == (float(s), int(z))
    shape = [d.dim_value for d in q.graph.input[0].type.tensor_type.shape.dim]
    xv = np.random.default_rng(3).uniform(*sq["ranges"][x], shape).astype(np.float32)
    out = ort_run(q, {x: xv})[y]
    k = out / w_out["scale"] + w_out["zero_point"]
    assert np.allclose(k, np.round(k), atol=1e-3) and k.min() >= -128 - 1e-3 and k.max() <= 127 + 1e-3


# ------------------------------------------------------------------------- 5. hybrid
def test_hybrid_choice(sq):
    _, conv = layer(sq, "Conv")
    q, info = quantize_model(conv, ranges=sq["ranges"], quant_format="hybrid")
    assert (info["quant_format"], info["format_used"]) == ("hybrid", "qoperator")
    assert "QLinearConv" in [n.op_type for n in q.graph.node]
    _, concat = layer(sq, "Concat")
    q, info = quantize_model(concat, ranges=sq["ranges"], quant_format="hybrid")
    assert info["format_used"] == "qdq" and "QLinearConcat" not in [n.op_type for n in q.graph.node]
    _, softmax = layer(sq, "Softmax")  # Flatten/Softmax/Reshape: shape ops do not count
    assert _choose_format(fold_to_initializers(softmax), "hybrid") == "qoperator"
    assert _choose_format(fold_to_initializers(sq["model"]), "hybrid") == "qdq"


# -------------------------------------------------------------------- 6. calibration data
def test_calibration_samples_random_and_npz(sq, tmp_path):
    m = sq["model"]
    a = calibration_samples(m, n=3, seed=0)
    b = calibration_samples(m, n=3, seed=0)
    assert len(a) == 3 and a[0]["data_0"].shape == (1, 3, 224, 224) and a[0]["data_0"].dtype == np.float32
    assert np.array_equal(a[2]["data_0"], b[2]["data_0"])
    assert a[0]["data_0"].min() >= -1.0 and a[0]["data_0"].max() < 1.0
    c = calibration_samples(m, n=1, seed=0, float_range=(0.0, 6.0))
    assert c[0]["data_0"].min() >= 0.0 and c[0]["data_0"].max() > 5.0

    rng = np.random.default_rng(0)
    many = rng.normal(size=(4, 1, 3, 224, 224)).astype(np.float32)
    np.savez(tmp_path / "many.npz", data_0=many)
    s = calibration_samples(m, n=20, seed=0, data_path=tmp_path / "many.npz")
    assert len(s) == 4 and np.array_equal(s[3]["data_0"], many[3])
    np.savez(tmp_path / "one.npz", data_0=many[0].astype(np.float64))
    s = calibration_samples(m, n=20, seed=0, data_path=tmp_path / "one.npz")
    assert len(s) == 1 and s[0]["data_0"].dtype == np.float32 and s[0]["data_0"].shape == (1, 3, 224, 224)
    # the file's samples quantize the model
    q, info = quantize_model(m, ranges={}, samples=s, quant_format="qdq")
    assert info["quantized"]

    bad = {
        "wrong_key": ({"data_1": many[0]}, "'data_1'"),
        "wrong_shape": ({"data_0": many[:, :, :, :100]}, "'data_0'"),
        "wrong_dtype": ({"data_0": many[0].astype(np.int32)}, "int32"),
    }
    for name, (arrays, needle) in bad.items():
        np.savez(tmp_path / f"{name}.npz", **arrays)
        with pytest.raises(QuantizationError) as ei:
            calibration_samples(m, n=20, seed=0, data_path=tmp_path / f"{name}.npz")
        msg = str(ei.value)
        assert needle in msg, msg
        if name != "wrong_key":
            assert "'data_0'" in msg and "224" in msg, msg
        assert isinstance(ei.value, ModelError)
    with pytest.raises(QuantizationError, match="not found"):
        calibration_samples(m, n=1, seed=0, data_path=tmp_path / "missing.npz")


# ------------------------------------------------------------ 7. failures are errors
def test_quantize_static_failure_is_an_error(sq, monkeypatch):
    _, conv = layer(sq, "Conv")
    x = conv.graph.input[0].name
    # a real failure inside quantize_static: calibration samples of the wrong shape
    with pytest.raises(QuantizationError, match="quantize_static"):
        quantize_model(conv, ranges=sq["ranges"], samples=[{x: np.zeros([1, 2, 3], np.float32)}])
    import onnxruntime.quantization as oq

    def boom(*a, **k):
        raise RuntimeError("unsupported model")

    monkeypatch.setattr(oq, "quantize_static", boom)
    with pytest.raises(QuantizationError, match="unsupported model"):
        quantize_model(conv, ranges=sq["ranges"], quant_format="qoperator")
    with pytest.raises(QuantizationError, match="quant_format"):
        quantize_model(conv, ranges=sq["ranges"], quant_format="int4")
    with pytest.raises(QuantizationError, match="min <= max"):
        quantize_model(conv, ranges={x: [1.0, -1.0]})


def test_per_channel_conv_layer(sq):
    _, conv = layer(sq, "Conv")
    q, info = quantize_model(conv, ranges=sq["ranges"], quant_format="qdq", per_channel=True)
    assert info["per_channel"]
    w = conv.graph.node[0].input[1]
    dq = next(n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.output[0].startswith(w))
    scale = next(t for t in q.graph.initializer if t.name == dq.input[1])
    out_channels = next(t for t in conv.graph.initializer if t.name == w).dims[0]
    assert list(scale.dims) == [out_channels] and out_channels > 1


# ---------------------------------------------------------------- 8. align_layers unit
def L(*ops):
    return [{"op_type": o, "outputs": [f"t{i}"]} for i, o in enumerate(ops)]


def C(*ops, names=None):
    return [{"index": i, "op_type": o, "quantized_op_type": o, "outputs": [names[i] if names else f"c{i}"]}
            for i, o in enumerate(ops)]


def test_align_fused_and_empty():
    assert align_layers([], C("Conv")) == []
    assert align_layers(L("Conv", "Relu"), []) == [None, None]
    assert align_layers(L("Conv", "Relu", "MaxPool", "Conv", "Relu"), C("Conv", "MaxPool", "Conv")) == [0, None, 1, 2, None]


def test_align_repeated_patterns_use_names():
    layers = L("Conv", "Relu", "Conv", "Relu", "Conv", "Relu")
    # two Relu kept, one fused: the names decide which Relu layers are paired
    computes = C("Conv", "Conv", "Relu", "Conv", "Relu", names=["t0", "t2", "t3", "t4", "t5"])
    assert align_layers(layers, computes) == [0, None, 1, 2, 3, 4]
    computes = C("Conv", "Relu", "Conv", "Conv", "Relu", names=["t0", "t1", "t2", "t4", "t5"])
    assert align_layers(layers, computes) == [0, 1, 2, None, 3, 4]
    # equal-length alignments: the one pairing equal names wins (also with ORT's suffixes)
    assert align_layers(L("Relu", "Relu", "Relu"), C("Relu", names=["zz"])) == [0, None, None]
    assert align_layers(L("Relu", "Relu", "Relu"), C("Relu", names=["t1"])) == [None, 0, None]
    assert align_layers(L("Relu", "Relu", "Relu"), C("Relu", names=["t2_quantized"])) == [None, None, 0]
    res = align_layers(L("Conv", "Conv", "Conv"), C("Conv", "Conv", names=["x_quantized", "t2_quantized"]))
    assert res[2] == 1 and res.count(None) == 1


def test_align_large_is_fast():
    rng = np.random.default_rng(0)
    ops = ["Conv", "Relu", "Add", "Concat", "MaxPool", "BatchNormalization"]
    layers = [{"op_type": ops[k], "outputs": [f"t{i}"]} for i, k in enumerate(rng.integers(0, len(ops), 1000))]
    computes = [{"index": i, "op_type": x["op_type"], "quantized_op_type": x["op_type"], "outputs": x["outputs"]}
                for i, x in enumerate(layers) if x["op_type"] != "Relu"]
    computes += [{"index": 10**6, "op_type": "Conv", "quantized_op_type": "Conv", "outputs": ["z"]}] * (1000 - len(computes))
    t0 = time.perf_counter()
    res = align_layers(layers, computes)
    assert time.perf_counter() - t0 < 1.0
    kept = [i for i, x in enumerate(layers) if x["op_type"] != "Relu"]
    assert [res[i] for i in kept] == list(range(len(kept)))
    assert all(res[i] is None for i, x in enumerate(layers) if x["op_type"] == "Relu")


# ------------------------------------------------- 9. index inputs (int64 Gather indices)
def gather_models(table_as_input: bool = False):
    """int64 ``idx`` [6] -> Gather(table [3, 4], axis 0) -> MatMul(w [4, 5]): the whole
    model and its two layers (Gather, MatMul). ``table_as_input``: the Gather layer reads
    the table from a float graph input instead of an initializer."""
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.normal(size=(3, 4)).astype(np.float32), "table")
    w = numpy_helper.from_array(rng.normal(size=(4, 5)).astype(np.float32), "w")
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, [6])
    g_vi = helper.make_tensor_value_info("g", TensorProto.FLOAT, [6, 4])
    y_vi = helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 5])
    gather = helper.make_node("Gather", ["table", "idx"], ["g"], axis=0)
    matmul = helper.make_node("MatMul", ["g", "w"], ["y"])

    def mk(nodes, inputs, outputs, inits):
        return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                                 opset_imports=[helper.make_opsetid("", 17)])

    whole = mk([gather, matmul], [idx], [y_vi], [table, w])
    if table_as_input:
        g_layer = mk([gather], [helper.make_tensor_value_info("table", TensorProto.FLOAT, [3, 4]), idx], [g_vi], [])
    else:
        g_layer = mk([gather], [idx], [g_vi], [table])
    mm_layer = mk([matmul], [g_vi], [y_vi], [w])
    return whole, g_layer, mm_layer


def test_gather_index_inputs_calibration_and_quantization():
    whole, g_layer, mm_layer = gather_models()
    samples = calibration_samples(whole, n=DEFAULT_CALIBRATION_SAMPLES, seed=5)
    again = calibration_samples(whole, n=DEFAULT_CALIBRATION_SAMPLES, seed=5)
    idx = np.stack([s["idx"] for s in samples])
    assert idx.dtype == np.int64 and idx.shape == (20, 6)
    assert idx.min() >= 0 and idx.max() <= 2 and len(np.unique(idx)) == 3  # bounded by the indexed axis (3)
    assert all(np.array_equal(a["idx"], b["idx"]) for a, b in zip(samples, again))  # seeded, deterministic
    assert not all(np.array_equal(samples[0]["idx"], s["idx"]) for s in samples[1:])  # differ per sample
    ranges = tensor_ranges(whole, samples)
    assert set(ranges) == {"g", "y"}
    q, info = quantize_model(whole, ranges=ranges, samples=samples, quant_format="qdq")
    assert info["quantized"]
    ref = ort_run(whole, samples[0])["y"]
    got = ort_run(q, samples[0])["y"]
    assert np.max(np.abs(got - ref)) < 0.1 * np.max(np.abs(ref))
    # per layer (samples=None: _layer_samples), both formats, table as initializer or float input
    _, g_in_layer, _ = gather_models(table_as_input=True)
    for lm in (g_layer, g_in_layer, mm_layer):
        feeds = _layer_samples(fold_to_initializers(lm), ranges, 20, 0)
        if "idx" in feeds[0]:
            assert all(f["idx"].min() >= 0 and f["idx"].max() <= 2 for f in feeds)
        for fmt in ("qdq", "qoperator"):
            quantize_model(lm, ranges=ranges, quant_format=fmt, wrap_unquantized_io=True)
    q, info = quantize_model(mm_layer, ranges=ranges, quant_format="qoperator")
    assert "QLinearMatMul" in [n.op_type for n in q.graph.node]


def test_non_index_int_inputs_stay_in_safe_range():
    x = helper.make_tensor_value_info("x", TensorProto.INT32, [2, 3])
    b = helper.make_tensor_value_info("b", TensorProto.BOOL, [2, 3])
    f = helper.make_tensor_value_info("f", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
             helper.make_node("Where", ["b", "xf", "f"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [x, b, f], [y]), opset_imports=[helper.make_opsetid("", 17)])
    s = calibration_samples(m, n=10, seed=0, float_range=(2.0, 3.0))
    assert all(d["x"].dtype == np.int32 and d["x"].min() >= INT_INPUT_RANGE[0] and d["x"].max() < INT_INPUT_RANGE[1]
               for d in s)
    assert all(d["b"].dtype == np.bool_ for d in s) and all(d["f"].min() >= 2.0 for d in s)
    assert tensor_ranges(m, s)


# --------------------------------------------------------------- 10. non-finite calibration
def test_non_finite_calibration_data(sq, tmp_path):
    m = sq["model"]
    x = np.random.default_rng(0).uniform(-1, 1, (2, 1, 3, 224, 224)).astype(np.float32)
    for name, bad in (("nan", np.nan), ("inf", -np.inf)):
        y = x.copy()
        y[1, 0, 2, 5, 5] = bad
        np.savez(tmp_path / f"{name}.npz", data_0=y)
        with pytest.raises(QuantizationError, match=r"'data_0'.*non-finite"):
            calibration_samples(m, n=1, seed=0, data_path=tmp_path / f"{name}.npz")
    # finite float64 that overflows float32
    np.savez(tmp_path / "big.npz", data_0=np.full((1, 3, 224, 224), 1e300))
    with pytest.raises(QuantizationError, match=r"'data_0'.*non-finite.*float32"):
        calibration_samples(m, n=1, seed=0, data_path=tmp_path / "big.npz")
    # quantize_model refuses non-finite samples (before ORT's "AssertionError: scale issue")
    _, conv = layer(sq, "Conv")
    xn = conv.graph.input[0].name
    shape = [d.dim_value for d in conv.graph.input[0].type.tensor_type.shape.dim]
    with pytest.raises(QuantizationError, match=rf"'{xn}'.*non-finite"):
        quantize_model(conv, ranges={}, samples=[{xn: np.full(shape, np.nan, np.float32)}])


def test_tensor_ranges_ignore_non_finite():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    outs = [helper.make_tensor_value_info(t, TensorProto.FLOAT, [4]) for t in ("lg", "sq")]
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    nodes = [helper.make_node("Log", ["x"], ["lg"]),  # log(0) = -inf
             helper.make_node("Abs", ["x"], ["ab"]), helper.make_node("Neg", ["ab"], ["ng"]),
             helper.make_node("Sub", ["ng", "one"], ["neg"]), helper.make_node("Sqrt", ["neg"], ["sq"])]  # all NaN
    m = helper.make_model(helper.make_graph(nodes, "g", [x], outs, [one]), opset_imports=[helper.make_opsetid("", 17)])
    r = tensor_ranges(m, [{"x": np.array([0.0, 1.0, 2.0, 4.0], np.float32)}])
    assert r["lg"] == [0.0, pytest.approx(np.log(4.0))]
    assert "sq" not in r  # no finite value: no range
    assert r["x"] == [0.0, 4.0] and r["neg"] == [-5.0, -1.0]


def test_quantize_model_never_raises_ort_assertions(sq, monkeypatch):
    _, relu = layer(sq, "Relu")

    def scale_issue(*a, **k):
        raise AssertionError("scale issue")

    monkeypatch.setattr(qdq_graph, "_scale_zp", scale_issue)  # called when wrapping float I/O (qdq_graph._wrap_io)
    with pytest.raises(QuantizationError, match="scale issue"):
        quantize_model(relu, ranges=sq["ranges"], wrap_unquantized_io=True)
    import onnxruntime.quantization as oq

    monkeypatch.setattr(oq, "quantize_static", scale_issue)
    with pytest.raises(QuantizationError, match="scale issue"):
        quantize_model(relu, ranges=sq["ranges"])


# ------------------------------------------------------------- 11. calibration file forms
def test_calibration_file_not_npz_and_batch_forms(sq, tmp_path):
    m = sq["model"]
    (tmp_path / "text.npz").write_text("data_0 = 1, 2, 3\n")
    np.save(tmp_path / "arr.npy", np.zeros((1, 3, 224, 224), np.float32))
    (tmp_path / "arr.npy").rename(tmp_path / "arr.npz")
    (tmp_path / "empty.npz").write_bytes(b"")
    for name, why in (("text", "not a zip archive"), ("arr", ".npy array (numpy.save)"), ("empty", "empty")):
        with pytest.raises(QuantizationError) as ei:
            calibration_samples(m, n=1, seed=0, data_path=tmp_path / f"{name}.npz")
        assert str(ei.value).startswith(f"{tmp_path / name}.npz: not an .npz archive (numpy.savez): "), ei.value
        assert why in str(ei.value)
    many = np.random.default_rng(1).uniform(-1, 1, (4, 1, 3, 224, 224)).astype(np.float32)
    forms = {"no_sample_axis": (many[:, 0], 4), "sample_axis": (many, 4), "one": (many[0], 1),
             "one_no_batch_axis_form": (many[:1, 0], 1)}
    for name, (arr, count) in forms.items():
        np.savez(tmp_path / f"{name}.npz", data_0=arr)
        s = calibration_samples(m, n=20, seed=0, data_path=tmp_path / f"{name}.npz")
        assert len(s) == count, name
        for k in range(count):
            assert s[k]["data_0"].shape == (1, 3, 224, 224) and np.array_equal(s[k]["data_0"], many[k]), name
    np.savez(tmp_path / "bad.npz", data_0=many[:, 0, :2])
    with pytest.raises(QuantizationError, match=r"\[N, 3, 224, 224\] \(N samples of batch 1\)"):
        calibration_samples(m, n=1, seed=0, data_path=tmp_path / "bad.npz")


# ---------------------------------------------------------------- 12. root logger untouched
@pytest.mark.parametrize("preset", ["no_handler", "one_handler"])
def test_quantize_leaves_root_logger_alone(preset):
    import logging

    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    mine = logging.StreamHandler()
    try:
        for h in saved:  # pytest's capture handlers; Snakemake leaves the root logger without any
            root.removeHandler(h)
        if preset == "one_handler":
            root.addHandler(mine)
        before = list(root.handlers)
        _, _, mm_layer = gather_models()
        samples = calibration_samples(mm_layer, n=3, seed=0)
        ranges = tensor_ranges(mm_layer, samples)
        quantize_model(mm_layer, ranges=ranges, samples=samples)  # ORT logs "Please consider to run pre-processing"
        quantize_model(mm_layer, ranges={}, quant_format="qoperator", wrap_unquantized_io=True)
        assert root.handlers == before and root.level == level
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)


def test_root_logger_guard_nested_and_threads():
    import logging
    import threading

    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    barrier = threading.Barrier(2)

    def job():
        with _root_logger_guard():
            barrier.wait()
            logging.warning("from ORT")  # would run logging.basicConfig() on a root logger without handlers
            with _root_logger_guard():
                logging.basicConfig(level=logging.INFO)
            barrier.wait()

    try:
        for h in saved:
            root.removeHandler(h)
        threads = [threading.Thread(target=job) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert root.handlers == [] and root.level == level
    finally:
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)
