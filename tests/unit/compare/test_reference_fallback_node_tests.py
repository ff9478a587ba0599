"""Ground truth for the reference fallback: ONNX's own node tests (shipped in the onnx
wheel) that ONNX Runtime CPU cannot run, while onnx's reference implementation computes
their expected outputs. Each layer is the node test's model on the node test's inputs,
run on the real IREE llvm-cpu executor of the default config; the verdict must be
computed against the spec's outputs, which must be the node test's expected outputs.

The three tests were found by running every node test through ONNX Runtime 1.32 CPU
(optimizations off) and, where it failed, through onnx's ReferenceEvaluator: ONNX
Runtime has no kernel for Min/Max on 16-bit integers nor for TopK on uint64.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest

from torq_gen_config.compare import DEFAULT_TOLERANCE
from torq_gen_config.core.fileio import load_npz
from torq_gen_config.discovery.layer_test import one_line_summary, run_layer_test
from torq_gen_config.mlir.importer import import_layer
from torq_gen_config.core.fileio import save_npz
from torq_gen_config.reference import compute_reference, load_reference

LLVM_CPU = {"name": "llvm-cpu", "backend": "iree",
            "options": {"target": "llvm-cpu", "device": "local-task", "target_cpu": "host"}}

# node test -> what ONNX Runtime says on it (the first line of its message)
NODE_TESTS = {
    "test_min_uint16": "[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for Min(13)",
    "test_max_int16": "[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for Max(13)",
    "test_top_k_uint64": "[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for TopK(24)",
}


def _node_test(name: str):
    """The node test's model (graph named "main", the function the layer modules
    export; opset >= 17 as the workflow's preparation makes it), inputs and expected
    outputs."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        case = next(c for c in collect_testcases(None) if c.name == name)
    model = case.model
    if model.opset_import[0].version < 17:
        model = onnx.version_converter.convert_version(model, 17)
    model.graph.name = "main"
    inputs = {v.name: np.asarray(a) for v, a in zip(model.graph.input, case.data_sets[0][0])}
    expected = {v.name: np.asarray(a) for v, a in zip(model.graph.output, case.data_sets[0][1])}
    return model, inputs, expected


@pytest.mark.parametrize("name", sorted(NODE_TESTS))
def test_a_node_test_onnxruntime_cannot_run_is_judged_against_the_spec(tmp_path, name):
    model, inputs, expected = _node_test(name)
    layer_path, ref_path = tmp_path / "model.onnx", tmp_path / "reference.npz"
    onnx.save(model, layer_path)
    meta = compute_reference(layer_path, ref_path, inputs=inputs, inputs_source="node test")
    assert meta["status"] == "error" and NODE_TESTS[name] in meta["message"], meta["message"]
    assert meta["second"]["engine"] == "onnx" and meta["second"]["status"] == "ok"
    _, _, meta = load_reference(ref_path)
    for out, want in expected.items():  # the spec's outputs are the node test's, bit for bit
        got = meta["second_outputs"][out]
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), out

    (tmp_path / "import.json").write_text(json.dumps(import_layer(layer_path, tmp_path / "model.mlir")))
    layer = {"layer_id": f"{model.graph.node[0].op_type}_{name}", "slug": name, "op_type": model.graph.node[0].op_type}

    def test(ref: str, work: str) -> dict:
        return run_layer_test(layer=layer, executor=LLVM_CPU, layer_onnx=str(layer_path), reference_npz=ref,
                              layer_mlir=str(tmp_path / "model.mlir"), import_status=str(tmp_path / "import.json"),
                              work_dir=str(tmp_path / work), result_path=str(tmp_path / work / "result.json"),
                              log_path=None, tolerance=DEFAULT_TOLERANCE, timeout_s=120)

    res = test(str(ref_path), "llvm-cpu")
    assert res["status"] == "success", res["failure_report"]
    assert res["reference"]["used"] == "onnx"
    assert res["reference"]["fallback"] == f"reference: onnx (ONNX Runtime failed: {NODE_TESTS[name]} node with " \
                                           "name '')"
    assert res["metrics"]["max_abs_diff"] == 0 and "reference_check" not in res
    assert "reference: onnx (ONNX Runtime failed: [ONNXRuntimeError]" in one_line_summary(res)

    # the verdict rests on those outputs: one element of the spec's first output off by one is a difference
    arrays, stored = load_npz(ref_path)
    spoiled = arrays["second_output_0"].copy()
    spoiled.flat[0] += 1
    save_npz(tmp_path / "spoiled.npz", {**arrays, "second_output_0": spoiled}, stored)
    res = test(str(tmp_path / "spoiled.npz"), "llvm-cpu-spoiled")
    assert res["status"] == "difference" and "max abs diff 1" in res["failure_report"]["summary"], res
