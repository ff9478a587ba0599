"""Precision modes (docs/precision.md), fast unit tests: the flag rules (config and CLI),
the discover/run flag check, the layer map onto a quantized model, bf16 references and
the input ranges of quantized layers."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import SQUEEZENET, TensorProto, cli_in_process, helper, make_model, one_line_error, tvi
from onnx import numpy_helper

from torq_gen_config.config import (DEFAULT_CONFIG_PATH, PRECISION_KEYS, check_precision_matches, load_config_file,
                                    validate_config)
from torq_gen_config.core.errors import ConfigError
from torq_gen_config.precision.alignment import compute_nodes
from torq_gen_config.precision.bf16_rounding import round_to_bf16
from torq_gen_config.precision.calibration import calibration_samples
from torq_gen_config.precision.layer_mapping import map_layers_to_quantized, mapping_summary
from torq_gen_config.precision.narrowing import BF16_OPSET, convert_to_bf16
from torq_gen_config.precision.qdq_graph import place_constant_nodes_before_use
from torq_gen_config.precision.quantize import quantize_model
from torq_gen_config.precision.ranges import tensor_ranges
from torq_gen_config.reference import compute_reference, load_reference, reference_outputs
from torq_gen_config.reference.reference_run import has_bfloat16
from torq_gen_config.pipeline.steps.quantize import quantized_input_ranges


# ----------------------------------------------------------------------------- flag rules
def cfg(**keys) -> dict:
    return {**load_config_file(DEFAULT_CONFIG_PATH), **keys}


@pytest.mark.parametrize("keys, flags", [
    ({"auto_convert_bf16": True, "quantize": True}, ["--auto-convert-bf16", "--quantize"]),
    ({"auto_convert_int32": True, "quantize": True}, ["--auto-convert-int32", "--quantize"]),
    ({"per_channel": True}, ["--per-channel", "--quantize"]),
    ({"full_integer": True}, ["--full-integer", "--quantize"]),
    ({"calibration_data": "cal.npz"}, ["--calibration-data", "--quantize"]),
    ({"quant_format": "qoperator"}, ["--quant-format qoperator", "--quantize"]),
    ({"quant_format": "hybrid"}, ["--quant-format hybrid", "--quantize"]),
    ({"save_bf16_model": "out.onnx"}, ["--save-bf16-model", "--auto-convert-bf16"]),
    ({"save_bf16_model": "out.onnx", "auto_convert_int32": True}, ["--save-bf16-model", "--auto-convert-bf16"]),
])
def test_flag_rules_in_config(keys, flags):
    with pytest.raises(ConfigError) as e:
        validate_config(cfg(**keys))
    msg = str(e.value)
    assert "\n" not in msg
    for f in flags:
        assert f in msg, (f, msg)


@pytest.mark.parametrize("keys", [
    {},
    {"quantize": True},
    {"quantize": True, "per_channel": True, "full_integer": True, "quant_format": "qoperator",
     "calibration_data": "cal.npz", "calibration_samples": 3},
    {"quantize": True, "quant_format": "hybrid"},
    {"auto_convert_bf16": True, "save_bf16_model": "out.onnx"},
    {"auto_convert_bf16": True, "auto_convert_int32": True},
    {"auto_convert_int32": True},
])
def test_flag_rules_accept_valid_sets(keys):
    out = validate_config(cfg(**keys))
    for k in PRECISION_KEYS:
        assert k in out
    for k, v in keys.items():
        assert out[k] == v


def test_flag_defaults_all_off():
    out = validate_config(cfg())
    assert not any(out[k] for k in ("auto_convert_bf16", "auto_convert_int32", "quantize", "per_channel",
                                    "full_integer", "calibration_data", "save_bf16_model"))
    assert out["quant_format"] == "qdq" and out["calibration_samples"] == 20


@pytest.mark.parametrize("args, flags", [
    (["--auto-convert-bf16", "--quantize"], ["--auto-convert-bf16", "--quantize"]),
    (["--auto-convert-int32", "--quantize", "--per-channel"], ["--auto-convert-int32", "--quantize"]),
    (["--full-integer"], ["--full-integer", "--quantize"]),
    (["--quant-format", "qoperator"], ["--quant-format qoperator", "--quantize"]),
    (["--save-bf16-model", "x.onnx"], ["--save-bf16-model", "--auto-convert-bf16"]),
])
def test_flag_rules_on_the_cli(tmp_path, capsys, monkeypatch, args, flags):
    monkeypatch.chdir(tmp_path)  # a relative --save-bf16-model x.onnx: here, as the subprocess's cwd was
    out = tmp_path / "out"
    r = cli_in_process(capsys, "discover", "--model", SQUEEZENET, "--output-dir", out, "-q", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torq-gen-config: error: "), r.stderr
    for f in flags:
        assert f in lines[0], (f, lines[0])
    assert not out.exists()  # nothing ran
    assert not (tmp_path / "x.onnx").exists()


def test_flag_rules_on_run_cli(tmp_path, capsys):
    r = cli_in_process(capsys, "run", "--model", SQUEEZENET, "--output-dir", tmp_path, "--per-channel")
    assert r.returncode == 2
    assert "--per-channel" in r.stderr and "--quantize" in r.stderr and len(r.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ discover/run flag check
def report_with(**options) -> dict:
    return {"provenance": {"options": {"model": "m.onnx", "skip_mode": False, **options}}}


def full_options(**keys) -> dict:
    return {k: v for k, v in validate_config(cfg(**keys)).items() if k in PRECISION_KEYS}


def test_precision_matches_same_flags():
    for keys in ({}, {"quantize": True}, {"quantize": True, "quant_format": "qoperator", "full_integer": True,
                                          "per_channel": True}, {"auto_convert_bf16": True},
                 {"auto_convert_int32": True}):
        check_precision_matches(report_with(**full_options(**keys)), validate_config(cfg(**keys)))


def test_precision_mismatch_shows_both_sets():
    rep = report_with(**full_options(quantize=True))
    with pytest.raises(ConfigError) as e:
        check_precision_matches(rep, validate_config(cfg()), report_name="r.json")
    msg = str(e.value)
    assert "[--quantize --quant-format=qdq]" in msg and "[no precision flags]" in msg and "r.json" in msg
    assert msg.index("[--quantize") < msg.index("[no precision flags]")  # discovery's first

    with pytest.raises(ConfigError) as e:
        check_precision_matches(rep, validate_config(cfg(quantize=True, quant_format="qoperator")))
    msg = str(e.value)
    assert "--quant-format=qdq" in msg and "--quant-format=qoperator" in msg

    with pytest.raises(ConfigError) as e:
        check_precision_matches(rep, validate_config(cfg(quantize=True, full_integer=True)))
    assert "--full-integer" in str(e.value)

    with pytest.raises(ConfigError) as e:
        check_precision_matches(report_with(**full_options(auto_convert_bf16=True)), validate_config(cfg()))
    assert "[--auto-convert-bf16]" in str(e.value) and "[no precision flags]" in str(e.value)

    with pytest.raises(ConfigError) as e:
        check_precision_matches(report_with(**full_options(auto_convert_int32=True)),
                                validate_config(cfg(auto_convert_bf16=True)))
    assert "[--auto-convert-int32]" in str(e.value) and "[--auto-convert-bf16]" in str(e.value)

    with pytest.raises(ConfigError) as e:
        check_precision_matches(rep, validate_config(cfg(quantize=True, calibration_samples=5)))
    assert "--calibration-samples=20" in str(e.value) and "--calibration-samples=5" in str(e.value)


@pytest.mark.parametrize("report", [{}, {"provenance": {}}, {"provenance": {"options": {"model": "m.onnx"}}}])
def test_old_report_counts_as_all_off(report):
    check_precision_matches(report, validate_config(cfg()))
    for keys in ({"quantize": True}, {"auto_convert_bf16": True}, {"auto_convert_int32": True}):
        with pytest.raises(ConfigError, match=re.escape("discovery used [no precision flags]")):
            check_precision_matches(report, validate_config(cfg(**keys)))


# ------------------------------------------------------------------ layer map (quantized)
@pytest.fixture(scope="module")
def conv_relu_conv(tmp_path_factory):
    """Conv -> Relu -> Conv (fp32), prepared and split, and its qdq quantization."""
    from torq_gen_config.model.prepare import prepare_model
    from torq_gen_config.model.split import split_layers

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
             for n, s in (("w1", (4, 3, 3, 3)), ("b1", (4,)), ("w2", (6, 4, 1, 1)), ("b2", (6,)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], name="conv2")]
    m = make_model(nodes, [tvi("x", TensorProto.FLOAT, [1, 3, 8, 8])], [tvi("y", TensorProto.FLOAT, [1, 6, 8, 8])], inits)
    d = tmp_path_factory.mktemp("crc")
    onnx.save(m, d / "crc.onnx")
    prepared, info = prepare_model(d / "crc.onnx", target_opset=17)
    manifest = split_layers(prepared, info, d / "layers")
    samples = calibration_samples(prepared, n=8, seed=0)
    ranges = tensor_ranges(prepared, samples)
    q, qinfo = quantize_model(prepared, ranges=ranges, samples=samples, quant_format="qdq")
    return {"prepared": prepared, "manifest": manifest, "q": q, "qinfo": qinfo, "ranges": ranges, "samples": samples,
            "layers_dir": d / "layers"}


def test_map_layers_to_quantized(conv_relu_conv):
    q, manifest = conv_relu_conv["q"], conv_relu_conv["manifest"]
    assert conv_relu_conv["qinfo"]["format_used"] == "qdq" and conv_relu_conv["qinfo"]["quantized"]
    assert [l["op_type"] for l in manifest["layers"]] == ["Conv", "Relu", "Conv"]
    assert "Relu" not in [n.op_type for n in q.graph.node]  # fused into conv1 by onnxruntime
    mapped = map_layers_to_quantized(manifest, q)
    assert manifest["layers"][0].get("quantized_op_type") is None  # input not modified
    layers = mapped["layers"]
    owners = [i for l in layers for i in l["prepared_node_indices"]]
    assert sorted(owners) == list(range(len(q.graph.node)))  # each node in exactly one layer
    for l in layers:
        assert l["prepared_node_indices"] == sorted(l["prepared_node_indices"])
    conv1, relu, conv2 = layers
    assert relu["primary_prepared_index"] is None and relu["quantized_op_type"] is None
    assert relu["quantized_note"] and "Relu" in relu["quantized_note"] and "compiler JSON" in relu["quantized_note"]
    for layer, wname in ((conv1, "w1"), (conv2, "w2")):
        j = layer["primary_prepared_index"]
        node = q.graph.node[j]
        assert node.op_type == "Conv" and layer["quantized_op_type"] == "Conv" and layer["quantized_note"] is None
        assert j in layer["prepared_node_indices"]
        # its weight (and bias) DequantizeLinear right before it, in its layer
        producer = {t: k for k, n in enumerate(q.graph.node) for t in n.output}
        w_dq = producer[node.input[1]]
        assert q.graph.node[w_dq].op_type == "DequantizeLinear"
        assert q.graph.node[w_dq].input[0].startswith(wname)
        const_dqs = [producer[t] for t in node.input[1:] if t]
        assert sorted(const_dqs) == list(range(j - len(const_dqs), j)), (const_dqs, j)
        assert all(k in layer["prepared_node_indices"] for k in const_dqs)
        # the activation DequantizeLinear feeding it also belongs to it
        x_dq = producer[node.input[0]]
        assert q.graph.node[x_dq].op_type == "DequantizeLinear" and x_dq in layer["prepared_node_indices"]
    assert q.graph.node[conv1["prepared_node_indices"][0]].op_type == "QuantizeLinear"  # graph-input Q
    assert q.graph.node[conv2["prepared_node_indices"][-1]].op_type == "DequantizeLinear"  # graph-output DQ
    assert mapped["quantized_mapping"] == {"compute_nodes": 2, "aligned": 2, "fused_layers": 1,
                                           "unaligned_compute_nodes": 0, "quantized_nodes": len(q.graph.node)}
    assert "1 fused away" in mapping_summary(mapped)


def test_place_constant_nodes_before_use(conv_relu_conv):
    q = conv_relu_conv["q"]
    # undo the placement: every constant-only node first, as onnxruntime writes them
    produced = {t for n in q.graph.node for t in n.output}
    const = [n for n in q.graph.node if all(t not in produced and t != "x" for t in n.input if t)]
    assert len(const) == 4  # w1, b1, w2, b2 DequantizeLinear
    shuffled = onnx.ModelProto()
    shuffled.CopyFrom(q)
    del shuffled.graph.node[:]
    shuffled.graph.node.extend(const + [n for n in q.graph.node if n not in const])
    placed = place_constant_nodes_before_use(shuffled)
    assert [n.name for n in placed.graph.node] == [n.name for n in q.graph.node]
    assert place_constant_nodes_before_use(q) is q  # already in place: unchanged
    onnx.checker.check_model(placed)
    # same results as the unplaced model
    x = conv_relu_conv["samples"][0]["x"]
    a = ort.InferenceSession(shuffled.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    b = ort.InferenceSession(placed.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(a, b)
    assert [c["op_type"] for c in compute_nodes(placed)] == ["Conv", "Conv"]


# ----------------------------------------------------------------------------- bf16 reference
def _fp32_models():
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    conv = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], name="conv")],
                      [tvi("x", TensorProto.FLOAT, [1, 4, 6, 6])], [tvi("y", TensorProto.FLOAT, [1, 8, 6, 6])],
                      [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")], opset=BF16_OPSET)
    wm = (rng.standard_normal((16, 8)) * 0.5).astype(np.float32)
    matmul = make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                        [tvi("x", TensorProto.FLOAT, [4, 16])], [tvi("y", TensorProto.FLOAT, [4, 8])],
                        [numpy_helper.from_array(wm, "w")], opset=BF16_OPSET)
    return {"conv": conv, "matmul": matmul}


def _rounded_fp32(model):
    """The fp32 model with its initializers rounded to bf16 values (still fp32)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        a = numpy_helper.to_array(t)
        t.CopyFrom(numpy_helper.from_array(round_to_bf16(a).astype(np.float32), t.name))
    return out


@pytest.mark.parametrize("kind", ["conv", "matmul"])
def test_bf16_reference(tmp_path, kind):
    fp32 = _fp32_models()[kind]
    bf, rep = convert_to_bf16(fp32)
    assert not has_bfloat16(fp32) and has_bfloat16(bf)
    assert bf.graph.input[0].type.tensor_type.elem_type == TensorProto.BFLOAT16
    path = tmp_path / "layer.onnx"
    onnx.save(bf, path)
    meta = compute_reference(path, tmp_path / "reference.npz", {"seed": 7})
    assert meta["status"] == "ok", meta["message"]
    assert "bf16" in meta["reference_precision"]
    inputs, outputs, meta2 = load_reference(tmp_path / "reference.npz")
    x, y = inputs["x"], outputs["y"]
    assert x.dtype == ml_dtypes.bfloat16 and y.dtype == ml_dtypes.bfloat16
    assert meta2["reference_precision"] == meta["reference_precision"]
    # fp32 computation on the bf16 values, rounded to bf16 (same engine: exact)
    sess = ort.InferenceSession(_rounded_fp32(fp32).SerializeToString(), providers=["CPUExecutionProvider"])
    want = round_to_bf16(sess.run(None, {"x": x.astype(np.float32)})[0])
    np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))
    # and an independent numpy computation agrees within one bf16 ulp
    inits = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in bf.graph.initializer}
    xf = x.astype(np.float64)
    if kind == "matmul":
        ref = xf @ inits["w"].astype(np.float64)
    else:
        xp = np.pad(xf, ((0, 0), (0, 0), (1, 1), (1, 1)))
        win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))  # [1, C, H, W, 3, 3]
        ref = np.einsum("bchwij,ocij->bohw", win, inits["w"].astype(np.float64)) + inits["b"][None, :, None, None]
    yf = y.astype(np.float64)
    assert np.all(np.abs(yf - ref) <= np.abs(ref) * 2.0 ** -8 + 1e-6)
    # the fp32 model gives the unrounded result: bf16 rounding changed something
    y32 = ort.InferenceSession(fp32.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.astype(np.float32)})[0]
    assert not np.array_equal(y.astype(np.float32), y32)
    # reference_outputs directly (in memory, no path)
    got = reference_outputs(bf, {"x": x}, ["y"])[0]
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), y.view(np.uint16))


def test_fp32_reference_is_as_the_model(tmp_path):
    fp32 = _fp32_models()["matmul"]
    onnx.save(fp32, tmp_path / "m.onnx")
    meta = compute_reference(tmp_path / "m.onnx", tmp_path / "r.npz", {"seed": 7})
    assert meta["reference_precision"] == "as the model"
    _, outputs, _ = load_reference(tmp_path / "r.npz")
    assert outputs["y"].dtype == np.float32


# ----------------------------------------------------------------- quantized input ranges
def test_quantized_input_ranges(tmp_path):
    s = numpy_helper.from_array(np.array(0.05, np.float32), "s")
    z = numpy_helper.from_array(np.array(3, np.int8), "z")
    zu = numpy_helper.from_array(np.array(7, np.uint8), "zu")
    nodes = [helper.make_node("DequantizeLinear", ["a", "s", "z"], ["da"]),
             helper.make_node("DequantizeLinear", ["u", "s", "zu"], ["du"]),
             helper.make_node("Add", ["da", "f"], ["t"]),
             helper.make_node("Add", ["t", "g"], ["t2"]),
             helper.make_node("Add", ["t2", "h"], ["t3"]),
             helper.make_node("Add", ["t3", "du"], ["y"])]
    ins = [tvi("a", TensorProto.INT8, [4]), tvi("f", TensorProto.FLOAT, [4]), tvi("g", TensorProto.FLOAT, [4]),
           tvi("h", TensorProto.FLOAT, [4]), tvi("u", TensorProto.UINT8, [4])]
    m = make_model(nodes, ins, [tvi("y", TensorProto.FLOAT, [4])], [s, z, zu])
    onnx.save(m, tmp_path / "q.onnx")
    ranges = {"a": [-0.3, 0.4], "f": [-2.5, 3.25], "g": [1.5, 1.5], "y": [0.0, 9.0]}
    got = quantized_input_ranges(str(tmp_path / "q.onnx"), ranges)
    assert got == {"a": [-128, 128], "f": [-2.5, 3.25], "g": [1.5, 1.5 + 1e-3], "u": [0, 256]}
    # the reference draws int8 inputs over all int8 values, floats within their range
    from torq_gen_config.inputs.generate import make_inputs

    feeds = make_inputs(m, {"seed": 1}, got)
    assert feeds["a"].dtype == np.int8 and feeds["u"].dtype == np.uint8
    assert -2.5 <= feeds["f"].min() and feeds["f"].max() < 3.25
    big = make_inputs(helper.make_model(helper.make_graph([], "g", [tvi("a", TensorProto.INT8, [4096])], [])),
                      {"seed": 1}, {"a": [-128, 128]})["a"]
    assert big.min() == -128 and big.max() == 127


# ------------------------------------------------- quantized outputs compared as int8 levels
def test_dequantized_outputs_and_levels(conv_relu_conv):
    from torq_gen_config.compare import (compare_outputs, dequantized_outputs, derive_status,
                                         to_quantized_levels)

    q = conv_relu_conv["q"]
    levels = dequantized_outputs(q)
    assert set(levels) == {"y"} and levels["y"]["dtype"] == "int8" and levels["y"]["scale"] > 0
    assert dequantized_outputs(conv_relu_conv["prepared"]) == {}  # fp32 model: none
    s, zp = levels["y"]["scale"], levels["y"]["zero_point"]
    qlev = np.arange(-128, 128, dtype=np.int8)
    x = ((qlev.astype(np.float32) - np.float32(zp)) * np.float32(s)).astype(np.float32)
    assert np.array_equal(to_quantized_levels(x, s, zp, "int8"), qlev)  # exact round trip
    # one level off where values are small: a float relative error fails, the levels pass
    o = x.copy()
    k = int(np.argmin(np.abs(x[1:]))) + 1
    o[k] = x[k - 1]
    assert derive_status(compare_outputs({"y": o}, {"y": x}, ["y"]))[0] == "difference"
    lo, lx = to_quantized_levels(o, s, zp, "int8"), to_quantized_levels(x, s, zp, "int8")
    # levels are quantized data (one step allowed) only when flagged so; other integers are exact
    assert derive_status(compare_outputs({"y": lo}, {"y": lx}, ["y"], quantized_outputs=levels))[0] == "success"
    assert derive_status(compare_outputs({"y": lo}, {"y": lx}, ["y"]))[0] == "difference"
    o[k] = x[k - 2]  # two levels: a difference
    lo = to_quantized_levels(o, s, zp, "int8")
    assert derive_status(compare_outputs({"y": lo}, {"y": lx}, ["y"], quantized_outputs=levels))[0] == "difference"


def test_layer_test_compares_quantized_layer_outputs_as_levels(tmp_path, conv_relu_conv):
    """A quantized layer on ONNX Runtime with optimizations on: the verdict comes from
    the int8 levels and the metrics say so."""
    from torq_gen_config.discovery.layer_test import run_layer_test

    layer = conv_relu_conv["manifest"]["layers"][2]  # conv2
    src = conv_relu_conv["layers_dir"] / layer["slug"] / "model.onnx"
    qlayer, info = quantize_model(onnx.load(src), ranges=conv_relu_conv["ranges"], samples=None,
                                  wrap_unquantized_io=True)
    qpath = tmp_path / "quantized.onnx"
    onnx.save(qlayer, qpath)
    ref = tmp_path / "reference.npz"
    compute_reference(qpath, ref, input_ranges=quantized_input_ranges(str(qpath), conv_relu_conv["ranges"]))
    res = run_layer_test(layer=layer, executor={"name": "ort", "backend": "onnxruntime", "options": {}},
                         layer_onnx=str(qpath), reference_npz=str(ref), layer_mlir=None, import_status=None,
                         work_dir=str(tmp_path / "ort"), result_path=str(tmp_path / "ort" / "result.json"),
                         log_path=None, tolerance={"fp_avg_tol": 0.01, "fp_max_tol": 0.01}, timeout_s=60)
    assert res["status"] == "success", res["failure_report"]
    m = res["metrics"]
    assert set(m["quantized_levels"]) == {layer["outputs"][0]["name"]}
    assert m["outputs"][0]["kind"] == "int" and m["outputs"][0]["ref_dtype"] == "int8"
    assert m["outputs"][0]["max_abs_diff"] <= 1
    assert m["outputs"][0]["quantized"] is True  # levels are quantized data: one step allowed
    assert m["outputs"][0]["declared_shape"] == m["outputs"][0]["ref_shape"]  # from the layer's graph output


# --------------------------------------------------- a layer that cannot be quantized
def test_quantize_layer_failure_is_a_verdict(tmp_path, conv_relu_conv, monkeypatch, capsys):
    import json

    from torq_gen_config.precision.ort_quantization import QuantizationError
    from torq_gen_config.pipeline.steps.layer_tests import test_layer_job
    from torq_gen_config.pipeline.steps.quantize import quantize_failure, quantize_layer_job

    import shutil
    layer = conv_relu_conv["manifest"]["layers"][0]
    d = tmp_path / layer["slug"]
    d.mkdir()
    shutil.copy(conv_relu_conv["layers_dir"] / layer["slug"] / "model.onnx", d / "model.onnx")
    ranges = tmp_path / "calibration.json"
    ranges.write_text(json.dumps({"ranges": conv_relu_conv["ranges"]}))
    full_info = tmp_path / "quantize.json"
    full_info.write_text(json.dumps({"format_used": "qdq"}))

    def boom(*a, **k):
        raise QuantizationError("onnxruntime.quantization failed: test failure")

    from torq_gen_config.precision import quantize as quantize_module

    monkeypatch.setattr(quantize_module, "quantize_model", boom)  # where the quantize step takes it from
    monkeypatch.setenv("TORQ_GEN_CONFIG_INLINE", "1")  # the patched function runs in this process
    quantize_layer_job(layer_onnx=str(d / "model.onnx"), ranges=str(ranges), quantized=str(d / "quantized.onnx"),
                       info=str(d / "quantize.json"), settings={"quant_format": "hybrid", "per_channel": False,
                                                                "full_integer": False},
                       full_model_info=str(full_info))
    assert "could not be quantized" in capsys.readouterr().err
    assert json.loads((d / "quantize.json").read_text())["status"] == "error"
    assert quantize_failure(str(d / "quantized.onnx")) == "onnxruntime.quantization failed: test failure"
    assert quantize_failure(str(d / "model.onnx")) is None  # only quantized models
    res_path = d / "llvm-cpu" / "result.json"
    test_layer_job(layer=layer, executor={"name": "llvm-cpu", "backend": "iree", "options": {}},
                   layer_onnx=str(d / "quantized.onnx"), reference=str(d / "missing.npz"), mlir=None,
                   import_status=None, result=str(res_path), tolerance={"fp_avg_tol": 0.01, "fp_max_tol": 0.01},
                   timeout_s=10)
    res = json.loads(res_path.read_text())
    assert res["status"] == "error" and res["failure_report"]["stage"] == "quantize"
    assert "test failure" in res["failure_report"]["summary"]


def test_quantize_layer_uses_the_whole_models_format(tmp_path, conv_relu_conv):
    """hybrid: the layer follows the format chosen for the whole model."""
    import json
    import shutil

    from torq_gen_config.pipeline.steps.quantize import quantize_layer_job

    layer = conv_relu_conv["manifest"]["layers"][0]  # a Conv: QOperator on its own under hybrid
    shutil.copy(conv_relu_conv["layers_dir"] / layer["slug"] / "model.onnx", tmp_path / "model.onnx")
    ranges = tmp_path / "calibration.json"
    ranges.write_text(json.dumps({"ranges": conv_relu_conv["ranges"]}))
    settings = {"quant_format": "hybrid", "per_channel": False, "full_integer": False}
    for used, op in (("qdq", "Conv"), ("qoperator", "QLinearConv")):
        info = tmp_path / f"full_{used}.json"
        info.write_text(json.dumps({"format_used": used}))
        quantize_layer_job(layer_onnx=str(tmp_path / "model.onnx"), ranges=str(ranges),
                           quantized=str(tmp_path / f"q_{used}.onnx"), info=str(tmp_path / f"i_{used}.json"),
                           settings=settings, full_model_info=str(info))
        ops = [n.op_type for n in onnx.load(tmp_path / f"q_{used}.onnx").graph.node]
        assert op in ops, (used, ops)
        assert json.loads((tmp_path / f"i_{used}.json").read_text())["format_used"] == used


# ------------------------------------------------------------------ --save-bf16-model path
def test_save_bf16_model_must_not_be_the_input(tmp_path, capsys):
    from torq_gen_config.config import check_save_bf16_path

    model = tmp_path / "m.onnx"
    model.write_bytes(SQUEEZENET.read_bytes())
    with pytest.raises(ConfigError, match="input model itself"):
        check_save_bf16_path(model, str(model))
    with pytest.raises(ConfigError, match="directory"):
        check_save_bf16_path(model, str(tmp_path))
    check_save_bf16_path(model, str(tmp_path / "m_bf16.onnx"))
    check_save_bf16_path(model, None)
    r = cli_in_process(capsys, "discover", "--model", str(model), "--output-dir", str(tmp_path / "out"),
                       "--auto-convert-bf16", "--save-bf16-model", str(model))
    assert r.returncode == 2 and "input model itself" in one_line_error(r)
    assert model.read_bytes() == SQUEEZENET.read_bytes()
    r = cli_in_process(capsys, "discover", "--model", str(model), "--output-dir", str(tmp_path / "out"),
                       "--calibration-samples", "3")
    assert r.returncode == 2 and "--calibration-samples needs --quantize" in one_line_error(r)


# ------------------------------------------- layer map by names (node order not preserved)
def test_match_by_names_handles_reordered_branches_and_fused_activations():
    from torq_gen_config.precision.layer_mapping import match_by_names

    def io(names):
        return [{"name": n} for n in names]

    layers = [
        {"op_type": "Conv", "inputs": io(["x"]), "outputs": io(["c1"])},     # branch a, Relu fused
        {"op_type": "Relu", "inputs": io(["c1"]), "outputs": io(["r1"])},
        {"op_type": "Conv", "inputs": io(["x"]), "outputs": io(["c2"])},     # branch b
        {"op_type": "Add", "inputs": io(["r1", "c2"]), "outputs": io(["y"])},
    ]
    # the quantized model lists branch b first; conv a writes the Relu's output name;
    # QOperator appends _quantized
    computes = [{"op_type": "Conv", "outputs": ["c2_quantized"]}, {"op_type": "Conv", "outputs": ["r1"]},
                {"op_type": "Add", "outputs": ["y_quantized"]}]
    assert match_by_names(layers, computes) == [1, None, 0, 2]


def test_quantized_resnet_block_maps_each_layer_to_its_own_op():
    """light_resnet50's first blocks: onnxruntime.quantization interleaves the
    parallel branches in another order; every mapped layer must point at its own op."""
    from conftest import LIGHT

    from torq_gen_config.model.prepare import prepare_model
    from torq_gen_config.model.split import split_layers
    from torq_gen_config.precision.alignment import base_tensor_name

    prepared, info = prepare_model(LIGHT / "light_resnet50.onnx", target_opset=17, subgraph=("Conv_r0", "Relu_r25"))
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        manifest = split_layers(prepared, info, d)
    samples = calibration_samples(prepared, n=2, seed=0)
    q, _ = quantize_model(prepared, ranges=tensor_ranges(prepared, samples), samples=samples)
    mapped = map_layers_to_quantized(manifest, q)
    by_out = {o["name"]: l for l in manifest["layers"] for o in l["outputs"]}
    checked = 0
    for layer in mapped["layers"]:
        j = layer["primary_prepared_index"]
        if j is None:
            assert layer["op_type"] == "Relu", layer["layer_id"]  # only activations fuse away
            continue
        outs = {base_tensor_name(t) for t in q.graph.node[j].output}
        own = {o["name"] for o in layer["outputs"]}
        fused_into = {o for o in outs if o in by_out and own & {i["name"] for i in by_out[o]["inputs"]}}
        assert outs & own or fused_into, (layer["layer_id"], q.graph.node[j].op_type, outs)
        checked += 1
    assert checked == 21  # every layer of the range but the fused Relus (measured)


def test_layer_wrapping_follows_the_whole_model(conv_relu_conv):
    """A lone Relu: only the tensors the whole quantized model holds quantized get Q/DQ."""
    from torq_gen_config.precision.layer_mapping import quantized_tensor_names

    names = quantized_tensor_names(conv_relu_conv["q"])
    assert "r1" in names and "x" in names and "c1" not in names  # conv1 writes r1 (Relu fused)
    relu = conv_relu_conv["manifest"]["layers"][1]
    model = onnx.load(conv_relu_conv["layers_dir"] / relu["slug"] / "model.onnx")
    q_all, info_all = quantize_model(model, ranges=conv_relu_conv["ranges"], wrap_unquantized_io=True)
    assert {w["tensor"] for w in info_all["wrapped_io"]} == {"c1", "r1"}
    q_some, info_some = quantize_model(model, ranges=conv_relu_conv["ranges"], wrap_unquantized_io=True,
                                       wrap_only=set(names))
    assert {w["tensor"] for w in info_some["wrapped_io"]} == {"r1"}


def test_float16_and_double_io_are_not_wrapped(tmp_path):
    x = tvi("x", TensorProto.DOUBLE, [1, 4])
    y = tvi("y", TensorProto.DOUBLE, [1, 4])
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [x], [y])
    q, info = quantize_model(m, ranges={"x": [-1.0, 1.0], "y": [0.0, 1.0]}, wrap_unquantized_io=True)
    assert info["wrapped_io"] == [] and [n.op_type for n in q.graph.node] == ["Relu"]
    sess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    assert sess.run(None, {"x": np.array([[-1, 0, 1, 2]], np.float64)})[0].tolist() == [[0, 0, 1, 2]]
