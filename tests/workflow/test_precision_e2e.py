"""End-to-end precision modes (docs/precision.md) with the real tools: ``torq-gen-config
discover`` then ``run`` on light_squeezenet with --quantize (qdq; qoperator + full
integer) and --auto-convert-bf16, and on a small int64 model with --auto-convert-int32.

Marked ``slow`` (about 2-3 minutes on 2 cores): one discovery per mode (module-scoped
fixtures), vmvx skipped (llvm-cpu and ort are tested).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import TensorProto, helper, one_line_error, run_cli, tvi, work
from onnx import numpy_helper

from torq_gen_config.mlir.importer import operator_at
from torq_gen_config.reference import load_reference

pytestmark = pytest.mark.slow
NAME = "light_squeezenet"
EXECUTORS = {"llvm-cpu", "ort"}
LOC = re.compile(r"^\d+:\d+$")
QDQ = {"onnx.QuantizeLinear", "onnx.DequantizeLinear", "onnx.DynamicQuantizeLinear"}
I64 = np.iinfo(np.int64)


def discover(model, out: Path, *flags):
    t0 = time.perf_counter()
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--skip-executors", "vmvx",
                *flags)
    return r, time.perf_counter() - t0


def run_model(model, out: Path, *flags):
    return run_cli("run", "--model", model, "--output-dir", out, "-j", "2", "-q", *flags)


def load(out: Path, name: str = NAME) -> tuple[dict, dict]:
    report = json.loads((out / f"torq_gen_config_{name}.json").read_text())
    compiler = json.loads((out / f"torq_gen_config_{name}_compiler.json").read_text())
    return report, compiler


def check_quantized_keys(out: Path, report: dict, compiler: dict) -> dict:
    """Every compiler JSON key is the line:col of a compute op (never Q/DQ) of the
    quantized type of exactly the layer that owns it. Returns key -> layer ID."""
    assert report["mlir_file"] == f"work/{report['model_name']}/full.mlir"
    lines = (out / report["mlir_file"]).read_text().splitlines()
    owners: dict[str, list[str]] = {}
    for lid, op in report["ops"].items():
        loc = op["mlir_location"]
        if isinstance(loc, str) and LOC.match(loc):
            owners.setdefault(loc, []).append(lid)
    assert compiler["op_assignments"]
    assert set(compiler["op_assignments"]) == set(owners)
    by_key = {}
    for key, a in compiler["op_assignments"].items():
        assert len(owners[key]) == 1, (key, owners[key])
        lid = owners[key][0]
        op = report["ops"][lid]
        got = operator_at(lines, key)
        assert got is not None and got not in QDQ, (key, got)
        assert got == f"onnx.{op['quantized_op_type']}", (lid, key, got)
        assert a["executor"] == op["recommended_executor"]
        by_key[key] = lid
    text = "\n".join(lines)
    assert '"onnx.QuantizeLinear"' in text or '"onnx.DequantizeLinear"' in text or '"onnx.QLinearConv"' in text
    return by_key


def check_fused_relus(report: dict, compiler: dict) -> None:
    relus = {lid: op for lid, op in report["ops"].items() if op["op_type"] == "Relu"}
    assert len(relus) == 26
    keys = set(compiler["op_assignments"])
    for lid, op in relus.items():
        # no line:col (the report's seed fallback writes the op type; docs say null)
        loc = op["mlir_location"]
        assert loc is None or not LOC.match(loc), (lid, loc)
        assert loc not in keys
        assert op["quantized_op_type"] is None
        assert "fused" in op["note"] and "compiler JSON" in op["note"], op.get("note")
        assert set(op["executors"]) == EXECUTORS  # still tested on its own


# ----------------------------------------------------------------------------- qdq
@pytest.fixture(scope="module")
def qdq(tmp_path_factory, squeezenet_path):
    out = tmp_path_factory.mktemp("qdq") / "out"
    r, secs = discover(squeezenet_path, out, "--quantize")
    print(f"\nqdq discovery: {secs:.1f} s")
    return out, r


def test_quantize_qdq_discovery(qdq):
    out, r = qdq
    assert r.returncode == 0, r.stderr[-3000:]
    report, compiler = load(out)
    prec = report["precision"]
    assert prec["flags"]["quantize"] is True and prec["flags"]["quant_format"] == "qdq"
    assert not prec["flags"]["full_integer"] and not prec["flags"]["per_channel"]
    assert prec["quantization"]["format_used"] == "qdq" and prec["quantization"]["quantized"]
    assert report["provenance"]["options"]["quantize"] is True
    assert len(report["ops"]) == 66
    for lid, op in report["ops"].items():
        assert set(op["executors"]) == EXECUTORS, lid
        assert (work(out) / "layers" / op["layer_slug"] / "quantized.onnx").is_file()
    by_key = check_quantized_keys(out, report, compiler)
    lines = (work(out) / "full.mlir").read_text().splitlines()
    for key, lid in by_key.items():  # qdq keeps the float op types
        assert operator_at(lines, key) == f"onnx.{report['ops'][lid]['op_type']}"
    check_fused_relus(report, compiler)
    assert len(compiler["op_assignments"]) == 66 - 26
    convs = [op for op in report["ops"].values() if op["op_type"] == "Conv"]
    assert len(convs) == 26 and all(op["quantized_op_type"] == "Conv" for op in convs)
    # the compiler sees the quantized model (its MLIR has the Q/DQ wrappers)
    q = onnx.load(work(out) / "quant" / "quantized.onnx")
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in q.graph.node}
    assert sum('"onnx.DequantizeLinear"' in ln for ln in lines) == 95  # measured (structural: the same on every run)
    # quantized layers: all bit-exact enough to pass on llvm-cpu (measured)
    assert all(op["executors"]["llvm-cpu"]["status"] == "success" for op in report["ops"].values())


def test_quantize_qdq_run(qdq, squeezenet_path):
    out, r = qdq
    assert r.returncode == 0, r.stderr[-3000:]
    # another quantization than discovery's: refused, nothing run (issue 38: run follows the discovery it runs)
    r = run_model(squeezenet_path, out, "--quantize", "--quant-format", "qoperator")
    assert r.returncode == 2 and "--quant-format qoperator differs from discovery's (--quant-format: qdq" in (
        one_line_error(r))
    assert "full_model" not in load(out)[0]
    # without the flags: discovery's apply, the quantized model runs and is compared
    r = run_model(squeezenet_path, out)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report, _ = load(out)
    fm = report["full_model"]
    assert fm["status"] == "success", fm.get("message")
    assert fm["assignment"]["layer_counts"] == {"llvm-cpu": 66}
    # the quantized model is partitioned: every node in a partition; the fused Relu
    # layers own no node, so only the other 40 layers are listed
    q = onnx.load(work(out) / "quant" / "quantized.onnx")
    assert sum(p["num_nodes"] for p in fm["partitions"]) == len(q.graph.node)
    assert sum(len(p["layer_ids"]) for p in fm["partitions"]) == 40
    assert json.loads((work(out) / "full" / "plan.json").read_text())["prepared_model"] == "work/light_squeezenet/quant/quantized.onnx"
    assert fm["metrics"]["num_elements"] == 1000
    _, outputs, meta = load_reference(work(out) / "full" / "reference.npz")
    assert meta["status"] == "ok" and list(outputs) == ["softmaxout_1"]
    # one Conv on ONNX Runtime: its partition holds its DequantizeLinear nodes (activation,
    # weight, bias), the Conv and its output QuantizeLinear
    r = run_cli("edit", "--model", squeezenet_path, "--output-dir", out, "--layer", "Conv_r3", "--executor", "ort")
    assert r.returncode == 0, r.stderr
    r = run_model(squeezenet_path, out, "--quantize")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    fm = load(out)[0]["full_model"]
    assert fm["status"] == "success", fm.get("message")
    parts = fm["partitions"]
    assert [p["executor"] for p in parts] == ["llvm-cpu", "ort", "llvm-cpu"]
    assert parts[1]["layer_ids"] == ["Conv_r3"]
    ops = [n.op_type for n in q.graph.node[parts[1]["first_node"]:parts[1]["last_node"] + 1]]
    assert ops == ["DequantizeLinear"] * 3 + ["Conv", "QuantizeLinear"], ops
    assert all(p["partition_check"]["status"] == "success" for p in parts)


# ------------------------------------------------------------------ qoperator + full integer
@pytest.fixture(scope="module")
def qop(tmp_path_factory, squeezenet_path):
    out = tmp_path_factory.mktemp("qop") / "out"
    r, secs = discover(squeezenet_path, out, "--quantize", "--quant-format", "qoperator", "--full-integer")
    print(f"\nqoperator discovery: {secs:.1f} s")
    return out, r


def test_quantize_qoperator_full_integer_discovery(qop):
    out, r = qop
    assert r.returncode == 0, r.stderr[-3000:]
    report, compiler = load(out)
    prec = report["precision"]
    assert prec["flags"]["full_integer"] is True and prec["flags"]["quant_format"] == "qoperator"
    assert prec["quantization"]["format_used"] == "qoperator"
    io = prec["quantization"]["io_quantization"]
    assert io["data_0"]["io_dtype"] == "int8" and io["softmaxout_1"]["io_dtype"] == "int8"
    q = onnx.load(work(out) / "quant" / "quantized.onnx")
    assert [i.type.tensor_type.elem_type for i in q.graph.input] == [TensorProto.INT8]
    assert [o.type.tensor_type.elem_type for o in q.graph.output] == [TensorProto.INT8]
    by_key = check_quantized_keys(out, report, compiler)
    check_fused_relus(report, compiler)
    lines = (work(out) / "full.mlir").read_text().splitlines()
    convs = {lid: op for lid, op in report["ops"].items() if op["op_type"] == "Conv"}
    assert len(convs) == 26
    for lid, op in convs.items():
        assert op["quantized_op_type"] == "QLinearConv", lid
        assert by_key[op["mlir_location"]] == lid
        assert operator_at(lines, op["mlir_location"]) == "onnx.QLinearConv"
    # the first layer's quantized model takes the int8 graph input
    first = onnx.load(work(out) / "layers" / "Conv_r0" / "quantized.onnx")
    assert first.graph.input[0].type.tensor_type.elem_type == TensorProto.INT8
    # IREE cannot compile QLinearSoftmax; ONNX Runtime runs it, so it gets the Softmax layer
    (sid, sm), = [(lid, op) for lid, op in report["ops"].items() if op["op_type"] == "Softmax"]
    assert sm["quantized_op_type"] == "QLinearSoftmax"
    assert operator_at(lines, sm["mlir_location"]) == "onnx.QLinearSoftmax"
    llvm = sm["executors"]["llvm-cpu"]
    assert llvm["status"] == "error" and llvm["failure_report"]["stage"] == "compile", llvm
    assert "QLinearSoftmax" in llvm["failure_report"]["message"] or "failed to legalize" in llvm["failure_report"]["message"]
    assert sm["executors"]["ort"]["status"] == "success"
    assert sm["recommended_executor"] == "ort"
    assert compiler["op_assignments"][sm["mlir_location"]] == {"executor": "ort"}
    others = [op for lid, op in report["ops"].items() if lid != sid]
    assert all(op["executors"]["llvm-cpu"]["status"] == "success" for op in others)
    assert all(op["recommended_executor"] == "llvm-cpu" for op in others)
    assert not report["has_critical_failures"]


def test_quantize_qoperator_full_integer_run(qop, squeezenet_path):
    out, r = qop
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_model(squeezenet_path, out, "--quantize", "--quant-format", "qdq")  # another format: refused
    assert r.returncode == 2 and "--quant-format qdq differs from discovery's" in one_line_error(r)
    # the flags given or not (run follows the discovery it runs): the same model runs
    r = run_model(squeezenet_path, out, "--quantize", "--quant-format", "qoperator")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report, _ = load(out)
    fm = report["full_model"]
    assert fm["status"] == "success", fm.get("message")
    assert fm["assignment"]["layer_counts"] == {"llvm-cpu": 65, "ort": 1}
    parts = fm["partitions"]
    assert [p["executor"] for p in parts] == ["llvm-cpu", "ort"]
    assert parts[1]["layer_ids"] == ["Softmax_softmaxout_1"]
    out0 = fm["metrics"]["outputs"][0]
    assert out0["dtype"] == "int8" and out0["num_elements"] == 1000


# ----------------------------------------------------------------------------- bf16
@pytest.fixture(scope="module")
def bf16(tmp_path_factory, squeezenet_path):
    base = tmp_path_factory.mktemp("bf16")
    out, saved = base / "out", base / "saved" / "sq_bf16.onnx"
    r, secs = discover(squeezenet_path, out, "--auto-convert-bf16", "--save-bf16-model", saved)
    print(f"\nbf16 discovery: {secs:.1f} s")
    return out, saved, r


def test_bf16_discovery(bf16):
    out, saved, r = bf16
    assert r.returncode == 0, r.stderr[-3000:]
    m = onnx.load(saved)
    onnx.checker.check_model(m, full_check=True)
    assert m.graph.input[0].type.tensor_type.elem_type == TensorProto.BFLOAT16
    assert m.graph.output[0].type.tensor_type.elem_type == TensorProto.BFLOAT16
    assert any(o.domain in ("", "ai.onnx") and o.version == 22 for o in m.opset_import)
    report, compiler = load(out)
    prec = report["precision"]
    assert prec["flags"]["auto_convert_bf16"] is True and not prec["flags"]["quantize"]
    assert "quantization" not in prec
    conv = prec["bf16_conversion"]
    assert conv["saved_to"] == str(saved)
    assert len(conv["constants"]) == 53  # measured (structural: the same on every run)
    for c in conv["constants"]:
        assert {"name", "values", "max_abs_error", "mean_abs_error", "rmse", "max_rel_error"} <= set(c), c
        assert c["values"] > 0
        assert 0 <= c["mean_abs_error"] <= c["rmse"] <= c["max_abs_error"] + 1e-12, c
        assert 0 <= c["max_rel_error"] <= 2 ** -8 + 1e-9, c  # round to nearest bf16
    for lid, op in report["ops"].items():
        assert set(op["executors"]) == EXECUTORS, lid
        assert op["executors"]["llvm-cpu"]["status"] == "success", (lid, op["executors"]["llvm-cpu"])
        if op["op_type"] == "Conv":
            assert op["executors"]["ort"]["status"] == "error", lid  # no bf16 Conv kernel in ORT CPU
        if op["op_type"] == "Concat":  # ORT CPU has a bf16 Concat, fed as bf16 OrtValues
            assert op["executors"]["ort"]["status"] == "success", (lid, op["executors"]["ort"])
        assert op["recommended_executor"] == "llvm-cpu"
    assert len(compiler["op_assignments"]) == 66
    layer = onnx.load(work(out) / "layers" / "Conv_r0" / "model.onnx", load_external_data=False)  # weights: folded.irpa
    assert layer.graph.input[0].type.tensor_type.elem_type == TensorProto.BFLOAT16
    _, outputs, meta = load_reference(work(out) / "layers" / "Conv_r0" / "reference.json")
    assert "bf16" in meta["reference_precision"]
    assert next(iter(outputs.values())).dtype.name == "bfloat16"


def test_bf16_run(bf16, squeezenet_path):
    out, _, r = bf16
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_model(squeezenet_path, out)  # discovery's --auto-convert-bf16 applies
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    fm = load(out)[0]["full_model"]
    assert fm["status"] == "success", fm.get("message")
    assert fm["metrics"]["outputs"][0]["dtype"] == "bfloat16"


# ----------------------------------------------------------------------------- int32
def int64_model(path: Path, offsets) -> Path:
    """x int64 [1, 8] -> Add(offsets) -> Mul(3) -> Reshape([2, 4]) -> Slice(1:INT64_MAX on axis 1)."""
    inits = [numpy_helper.from_array(np.array([offsets], np.int64), "offsets"),
             numpy_helper.from_array(np.full((1, 8), 3, np.int64), "factor"),
             numpy_helper.from_array(np.array([2, 4], np.int64), "shape"),
             numpy_helper.from_array(np.array([1], np.int64), "starts"),
             numpy_helper.from_array(np.array([I64.max], np.int64), "ends"),
             numpy_helper.from_array(np.array([1], np.int64), "axes")]
    nodes = [helper.make_node("Add", ["x", "offsets"], ["s"], name="add"),
             helper.make_node("Mul", ["s", "factor"], ["p"], name="mul"),
             helper.make_node("Reshape", ["p", "shape"], ["r"], name="reshape"),
             helper.make_node("Slice", ["r", "starts", "ends", "axes"], ["y"], name="slice")]
    g = helper.make_graph(nodes, "int64net", [tvi("x", TensorProto.INT64, [1, 8])],
                          [tvi("y", TensorProto.INT64, [2, 3])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, path)
    return path


def test_int32_conversion(tmp_path):
    model = int64_model(tmp_path / "int64net.onnx", [1, 2, 3, I64.max, 5, 6, 7, 8])
    out = tmp_path / "out"
    r, secs = discover(model, out, "--auto-convert-int32")
    print(f"\nint32 discovery: {secs:.1f} s")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "int32 conversion: 1 constants with INT64_MIN/MAX sentinels clamped" in r.stderr
    report, compiler = load(out, "int64net")
    assert list(report["ops"]) == ["Add_s", "Mul_p", "Reshape_r", "Slice_y"]
    for lid, op in report["ops"].items():
        assert {n: v["status"] for n, v in op["executors"].items()} == {"llvm-cpu": "success", "ort": "success"}, lid
    assert len(compiler["op_assignments"]) == 4
    conv = report["precision"]["int32_conversion"]
    assert report["precision"]["flags"]["auto_convert_int32"] is True
    assert conv["clamped"] == [{"name": "offsets", "int64_min": 0, "int64_max": 1}]
    assert set(conv["io_converted"]) == {"x", "y"}
    layers = work(out) / "layers"
    for slug, data_in in (("Add_s", "x"), ("Mul_p", "s"), ("Reshape_r", "p"), ("Slice_y", "r")):
        m = onnx.load(layers / slug / "model.onnx")
        types = {i.name: i.type.tensor_type.elem_type for i in m.graph.input}
        assert types[data_in] == TensorProto.INT32, (slug, types)
        assert all(o.type.tensor_type.elem_type == TensorProto.INT32 for o in m.graph.output), slug
    inits = {t.name: t for t in onnx.load(layers / "Add_s" / "model.onnx").graph.initializer}
    if "offsets" in inits:
        assert numpy_helper.to_array(inits["offsets"]).tolist() == [[1, 2, 3, np.iinfo(np.int32).max, 5, 6, 7, 8]]
    shape = {t.name: t for t in onnx.load(layers / "Reshape_r" / "model.onnx").graph.initializer}["shape"]
    assert shape.data_type == TensorProto.INT64  # Reshape's schema needs int64
    # run follows discovery's flag without it, and runs with it given again
    for flags in ((), ("--auto-convert-int32",)):
        r = run_model(model, out, *flags)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert load(out, "int64net")[0]["full_model"]["status"] == "success"


def test_int32_out_of_range_fails(tmp_path):
    model = int64_model(tmp_path / "bad64.onnx", [1, 2, 3_000_000_000, 4, 5, 6, 7, 8])
    r, _ = discover(model, tmp_path / "out", "--auto-convert-int32")
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and [ln for ln in err if ln.startswith("torq-gen-config: error:")] == err[-1:], r.stderr[-3000:]
    assert re.search(r"'offsets'.*3000000000", err[-1]), err[-1]
    assert not (tmp_path / "out" / "torq_gen_config_bad64.json").exists()
