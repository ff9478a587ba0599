"""Verdicts a careful engineer would sign: two references and their disputes, reference
failures that are never an executor's fault, comparisons that cannot fail, and layer
inputs that fall back with a reason. Real ONNX Runtime and onnx reference runs; the
executor is the clearly fake ``FakeOutputBackend`` (tests/fixtures/fake_backends.py)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import TensorProto, helper, make_model, tvi
from fixtures.fake_backends import fake  # noqa: F401 (a fixture)

from torq_gen_config.compare import DEFAULT_TOLERANCE
from torq_gen_config.discovery.layer_test import run_layer_test
from torq_gen_config.core.fileio import save_npz
from torq_gen_config.core.value_store import ValueStore, write_record
from torq_gen_config.reference import compute_reference, load_reference
from torq_gen_config.report.build import build_report
from torq_gen_config.report.recommend import reference_agreement, reference_dispute

LAYER = {"layer_id": "L_y", "slug": "L_y", "op_type": "L", "node_index": 0}


def _test(tmp_path, layer_path, ref_path, executor):
    work = tmp_path / executor["name"]
    return run_layer_test(layer=LAYER, executor=executor, layer_onnx=str(layer_path), reference_npz=str(ref_path),
                          layer_mlir=None, import_status=None, work_dir=str(work),
                          result_path=str(work / "result.json"), log_path=None, tolerance=DEFAULT_TOLERANCE,
                          timeout_s=30)


def _node_test(name: str):
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        case = next(c for c in collect_testcases(None) if c.name == name)
    inputs = {v.name: a for v, a in zip(case.model.graph.input, case.data_sets[0][0])}
    return case.model, inputs, case.data_sets[0][1]


def test_a_tiny_reference_never_gives_a_plain_success(tmp_path, fake):
    m = make_model([helper.make_node("Mul", ["x", "s"], ["y"])], [tvi("x", TensorProto.FLOAT, [64])],
                   [tvi("y", TensorProto.FLOAT, [64])],
                   [onnx.numpy_helper.from_array(np.array(1e-9, np.float32), "s")])
    onnx.save(m, tmp_path / "tiny.onnx")
    compute_reference(tmp_path / "tiny.onnx", tmp_path / "ref.npz")
    for mode in ("zeros", "negated"):
        res = _test(tmp_path, tmp_path / "tiny.onnx", tmp_path / "ref.npz", fake(mode))
        assert res["status"] in ("success", "difference")
        if res["status"] == "success":
            assert res["metrics"]["inconclusive"] is True
            assert "below the absolute floor" in res["metrics"]["inconclusive_reasons"][0]
    rep = build_report(model_name="tiny", layers=[{**LAYER, "mlir_location": None, "mac_count": None,
                                                   "skipped_reason": None}],
                       results={"L_y": {"fake-negated": _test(tmp_path, tmp_path / "tiny.onnx", tmp_path / "ref.npz",
                                                              fake("negated"))}},
                       executors=[fake("negated")], default_tolerance=DEFAULT_TOLERANCE, mlir_file=None,
                       provenance={})
    checks = rep["discovery_report"]["inconclusive_checks"]
    assert [c["executor"] for c in checks] == ["fake-negated"]
    assert "INCONCLUSIVE: 1 success verdict(s) could not have failed" in rep["final_report_text"]
    assert "success*" in rep["final_report_text"]


def test_a_reference_failure_is_never_the_executors_fault(tmp_path, fake):
    m = make_model([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)],
                   [tvi("x", TensorProto.FLOAT, [3, 2]), tvi("i", TensorProto.INT64, [2])],
                   [tvi("y", TensorProto.FLOAT, [2, 2])])
    onnx.save(m, tmp_path / "gather.onnx")
    # index 7 is out of range: both references fail on these inputs
    meta = compute_reference(tmp_path / "gather.onnx", tmp_path / "ref.npz",
                             inputs={"x": np.ones((3, 2), np.float32), "i": np.array([0, 7], np.int64)})
    assert meta["status"] == "error" and meta["message"].startswith("ONNX Runtime failed on the layer")
    assert meta["second"]["status"] == "error"
    for mode in ("fail_run", "same"):
        res = _test(tmp_path, tmp_path / "gather.onnx", tmp_path / "ref.npz", fake(mode))
        assert res["status"] == "unverified", res
        fr = res["failure_report"]
        assert fr["stage"] == "reference"
        assert fr["summary"].startswith("the reference failed on these inputs: ONNX Runtime failed on the layer")
        assert "the executor failed too at run time" in fr["summary"]


def test_a_layer_where_onnxruntime_deviates_from_the_spec_is_a_dispute(tmp_path, fake):
    model, inputs, expected = _node_test("test_resize_downsample_scales_linear_align_corners")
    onnx.save(model, tmp_path / "resize.onnx")
    meta = compute_reference(tmp_path / "resize.onnx", tmp_path / "ref.npz", inputs=inputs, inputs_source="node test")
    _, ort_out, meta = load_reference(tmp_path / "ref.npz")
    # the onnx reference implementation gives the test's expected output, ONNX Runtime does not
    np.testing.assert_allclose(meta["second_outputs"]["Y"], expected[0], rtol=1e-5)
    assert not np.allclose(ort_out["Y"], expected[0], rtol=1e-3)
    dispute = reference_dispute({"engines_agreement": meta["engines_agreement"]}, DEFAULT_TOLERANCE)
    assert dispute and "disagree" in dispute["summary"]
    res = _test(tmp_path, tmp_path / "resize.onnx", tmp_path / "ref.npz", fake("same"))  # copies ONNX Runtime
    assert res["status"] == "success" and res["reference_check"]["engine"] == "onnx"
    agreement = reference_agreement({**res, "reference_engine": "onnxruntime"}, DEFAULT_TOLERANCE)
    assert agreement["agrees_with"] == ["onnxruntime"] and agreement["differs_from"] == ["onnx"]
    # with --reference onnx the same executor differs from the spec
    compute_reference(tmp_path / "resize.onnx", tmp_path / "ref_spec.npz", inputs=inputs, engine="onnx")
    res = _test(tmp_path, tmp_path / "resize.onnx", tmp_path / "ref_spec.npz", fake("same"))
    assert res["status"] == "difference" and res["reference"]["engine"] == "onnx"
    # a result does not repeat the agreement of the two engines: the report's assembly takes it
    # from the layer's reference file (report/assemble.py), as here
    assert "engines_agreement" not in res["reference"]
    res["reference"]["engines_agreement"] = load_reference(tmp_path / "ref_spec.npz")[2]["engines_agreement"]
    rep = build_report(model_name="rz", layers=[{**LAYER, "mlir_location": None, "mac_count": None,
                                                 "skipped_reason": None}],
                       results={"L_y": {"fake-same": res}}, executors=[fake("same")],
                       default_tolerance=DEFAULT_TOLERANCE, mlir_file=None, provenance={})
    disputes = rep["discovery_report"]["reference_disputes"]
    assert [d["layer_id"] for d in disputes] == ["L_y"] and disputes[0]["agree_with"] == {"onnxruntime": ["fake-same"]}
    assert "REFERENCE DISPUTES: 1 layer(s)" in rep["final_report_text"]


def test_a_dispute_is_settled_by_the_spec_in_float64(tmp_path, fake):
    """Issue 42: where the two engines disagree, the verdicts follow the spec evaluated in
    float64, not ONNX Runtime; the report still shows the dispute, and whom the spec sides with."""
    model, inputs, expected = _node_test("test_resize_downsample_scales_linear_align_corners")
    onnx.save(model, tmp_path / "resize.onnx")
    ref = tmp_path / "reference.json"
    meta = compute_reference(tmp_path / "resize.onnx", ref, inputs=inputs, inputs_source="node test",
                             values_dir=tmp_path / "values", tolerance=DEFAULT_TOLERANCE)
    assert meta["arbiter"]["status"] == "ok"
    _, _, meta = load_reference(ref)
    # the spec in float64 gives the node test's expected output (ground truth onnx ships)
    np.testing.assert_allclose(meta["arbiter_outputs"]["Y"], expected[0], rtol=1e-6)
    same = _test(tmp_path, tmp_path / "resize.onnx", ref, fake("same"))  # copies ONNX Runtime
    assert same["status"] == "difference" and same["reference"]["used"] == "onnx-float64"
    assert same["reference_check"]["engine"] == "onnxruntime"  # the second opinion: the configured engine
    layers = [{**LAYER, "mlir_location": None, "mac_count": None, "skipped_reason": None}]
    same["reference"].update(engines_agreement=meta["engines_agreement"], arbiter=meta["arbiter"])
    rep = build_report(model_name="rz", layers=layers, results={"L_y": {"fake-same": same}}, executors=[fake("same")],
                       default_tolerance=DEFAULT_TOLERANCE, mlir_file=None, provenance={})
    op = rep["ops"]["L_y"]
    assert op["reference"]["dispute"]["spec_sides_with"] == ["onnx"]
    assert "the spec in float64 sides with the ONNX reference implementation" in op["reference"]["dispute"]["summary"]
    assert op["executors"]["fake-same"]["reference_used"] == "onnx-float64"
    assert not rep["discovery_report"]["reference_fallbacks"]  # settled, not a fallback
    text = rep["final_report_text"]
    assert "REFERENCE DISPUTES: 1 layer(s)" in text and "agree with ONNX Runtime: fake-same" in text


def test_layer_inputs_fall_back_to_generated_ones_and_say_why(tmp_path):
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [tvi("x", TensorProto.FLOAT, [2, 3])],
                   [tvi("y", TensorProto.FLOAT, [2, 3])])
    onnx.save(m, tmp_path / "relu.onnx")
    store = ValueStore(tmp_path / "values")

    def layer_inputs(name: str, arrays: dict, extra: dict) -> Path:
        path = tmp_path / name
        write_record(path, {"kind": "layer_inputs", **extra, "values": {n: store.put(a) for n, a in arrays.items()}},
                     store)
        return path

    fallback = layer_inputs("fallback.json", {}, {"fallback": "the run gave no value for 'x'"})
    meta = compute_reference(tmp_path / "relu.onnx", tmp_path / "r1.npz", inputs_path=fallback)
    assert meta["status"] == "ok" and meta["layer_inputs"] == "generated (the run gave no value for 'x')"
    wrong = layer_inputs("wrong.json", {"x": np.ones((2, 4), np.float32)}, {})
    meta = compute_reference(tmp_path / "relu.onnx", tmp_path / "r2.npz", inputs_path=wrong)
    assert meta["layer_inputs"].startswith("generated (input 'x' is float32[2, 4] in the whole-model run")
    good = layer_inputs("good.json", {"x": -np.ones((2, 3), np.float32)}, {"source": "run"})
    meta = compute_reference(tmp_path / "relu.onnx", tmp_path / "r3.json", inputs_path=good,
                             values_dir=tmp_path / "values")
    assert meta["layer_inputs"] == "propagate (run)"
    ins, outs, _ = load_reference(tmp_path / "r3.json")
    np.testing.assert_array_equal(outs["y"], np.zeros((2, 3), np.float32))
    (tmp_path / "bad.json").write_bytes(b"PK\x03\x04 not a record")
    meta = compute_reference(tmp_path / "relu.onnx", tmp_path / "r4.npz", inputs_path=tmp_path / "bad.json")
    assert meta["layer_inputs"].startswith("generated (the whole-model run's inputs.json could not be read")


def test_reference_files_keep_every_dtype(tmp_path):
    import ml_dtypes

    from torq_gen_config.core.fileio import load_npz

    arrays = {"f8": np.array([1.5, -2.0], np.float32).astype(ml_dtypes.float8_e5m2),
              "i4": np.array([1, -3], dtype=ml_dtypes.int4), "bf": np.ones(2, ml_dtypes.bfloat16),
              "s": np.array(["a", "bc"], dtype=object), "f": np.arange(3, dtype=np.float32)}
    save_npz(tmp_path / "t.npz", arrays, {"kind": "test"})
    back, meta = load_npz(tmp_path / "t.npz")
    assert {k: v.dtype.name for k, v in back.items()} == {"f8": "float8_e5m2", "i4": "int4", "bf": "bfloat16",
                                                           "s": "str64", "f": "float32"}
    assert back["s"].tolist() == ["a", "bc"] and back["f8"].astype(np.float32).tolist() == [1.5, -2.0]
    assert meta["bf16_keys"] == ["bf"]


def test_string_outputs_compare_exactly():
    from torq_gen_config.compare import compare_outputs, derive_status

    ref = {"y": np.array(["a", "c"])}
    assert derive_status(compare_outputs({"y": np.array(["a", "c"], dtype=object)}, ref, ["y"]))[0] == "success"
    status, summary = derive_status(compare_outputs({"y": np.array(["a", "b"], dtype=object)}, ref, ["y"]))
    assert status == "difference" and summary == "1 of 2 string elements differ"


def test_an_executor_that_failed_where_the_reference_failed_is_not_recommended():
    from torq_gen_config.report.recommend import is_critical_failure, recommend_executor

    failed_too = {"status": "unverified", "failure_report": {"type": "reference_error", "during": "run"}}
    ran = {"status": "unverified", "failure_report": {"type": "reference_error", "during": None}}
    error = {"status": "error", "failure_report": {"stage": "compile"}}
    assert recommend_executor({"a": error, "b": failed_too}, ["a", "b"]) is None
    assert is_critical_failure({"a": error, "b": failed_too})
    assert recommend_executor({"a": error, "b": failed_too, "c": ran}, ["a", "b", "c"]) == "c"
    assert not is_critical_failure({"a": error, "c": ran})


def test_input_data_errors_are_one_line_and_conversions_are_noted(tmp_path):
    from torq_gen_config.core.errors import ModelError
    from torq_gen_config.reference.model_inputs import load_input_data

    m = make_model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Identity", ["s"], ["t"])],
                   [tvi("x", TensorProto.FLOAT, [2]), tvi("s", TensorProto.STRING, [2])],
                   [tvi("y", TensorProto.FLOAT, [2]), tvi("t", TensorProto.STRING, [2])])
    np.savez(tmp_path / "ok.npz", x=np.ones(2), s=np.array(["a", "b"]), extra=np.ones(1))
    notes: list[str] = []
    feeds = load_input_data(tmp_path / "ok.npz", m, notes)
    assert feeds["x"].dtype == np.float32 and feeds["s"].tolist() == ["a", "b"]
    assert any("'extra' are not inputs" in n for n in notes) and any("float64 to float32" in n for n in notes)
    np.savez(tmp_path / "int.npz", x=np.ones(2, np.int64), s=np.array(["a", "b"]))
    with pytest.raises(ModelError, match="'x' has dtype int64, the model input is float32"):
        load_input_data(tmp_path / "int.npz", m)
    np.savez(tmp_path / "obj.npz", x=np.ones(2, np.float32), s=np.array(["a", "b"], dtype=object))
    with pytest.raises(ModelError, match="cannot be read without pickle"):
        load_input_data(tmp_path / "obj.npz", m)


def test_copied_verdicts_are_marked_in_the_text():
    from torq_gen_config.report.text import render_final_report_text

    ok = {"status": "success", "metrics": None, "failure_report": None}
    report = {"model_name": "m", "executors": ["a"], "ops": {
        "Cast_c1": {"executors": {"a": ok}, "recommended_executor": "a"},
        "Cast_c2": {"executors": {"a": ok}, "recommended_executor": "a", "duplicate_of": "Cast_c1"}}}
    text = render_final_report_text(report)
    assert "DEDUPLICATED: 1 layer(s) copy the verdicts" in text and "Cast_c2: copied from Cast_c1" in text
    row = next(line for line in text.splitlines() if line.startswith("Cast_c2"))
    assert "(copied from Cast_c1)" in row


def test_executor_outputs_are_kept_only_where_the_verdict_is_not_a_success(tmp_path, fake):
    """The executor's outputs are compared in memory; outputs.npz (named by the result) is kept
    for a difference, not for a success unless keep_outputs; a later success removes an old one."""
    from torq_gen_config.core.fileio import load_npz

    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [tvi("x", TensorProto.FLOAT, [2, 3])],
                   [tvi("y", TensorProto.FLOAT, [2, 3])])
    onnx.save(m, tmp_path / "relu.onnx")
    x = np.array([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]], np.float32)
    compute_reference(tmp_path / "relu.onnx", tmp_path / "ref.json", inputs={"x": x}, values_dir=tmp_path / "values")

    def test(executor, **kwargs):
        work = tmp_path / "w"
        return run_layer_test(layer=LAYER, executor=executor, layer_onnx=str(tmp_path / "relu.onnx"),
                              reference_npz=str(tmp_path / "ref.json"), layer_mlir=None, import_status=None,
                              work_dir=str(work), result_path=str(work / "result.json"), log_path=None,
                              tolerance=DEFAULT_TOLERANCE, timeout_s=30, **kwargs)

    bad = {**fake("negated"), "name": "x"}
    res = test(bad)
    assert res["status"] == "difference" and res["outputs_file"] == "outputs.npz"
    kept, meta = load_npz(tmp_path / "w" / "outputs.npz")
    np.testing.assert_array_equal(kept["output_0"], -np.maximum(x, 0))
    assert meta["output_names"] == ["y"] and meta["executor"] == "x"
    res = test({**fake("same"), "name": "x"})
    assert res["status"] == "success" and "outputs_file" not in res and not (tmp_path / "w" / "outputs.npz").exists()
    res = test({**fake("same"), "name": "x"}, keep_outputs=True)
    assert res["outputs_file"] == "outputs.npz"
    np.testing.assert_array_equal(load_npz(tmp_path / "w" / "outputs.npz")[0]["output_0"], np.maximum(x, 0))
    res = test({**fake("fail_run"), "name": "x"})
    assert res["status"] == "error" and not (tmp_path / "w" / "outputs.npz").exists()
