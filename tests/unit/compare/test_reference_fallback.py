"""The spec as the reference of last resort: where ONNX Runtime (the configured
reference) fails on a layer and onnx's reference implementation ran, the verdict is
computed against the latter and every place a person looks says so; ``unverified``
stays for layers no reference computed (and for ``--reference onnx`` where the spec
failed: ONNX Runtime is only its second opinion).

The reference files here are real ``compute_reference`` files of a layer both engines
run, rewritten to record the engine failure under test; the executor is the clearly
fake ``FakeOutputBackend`` (tests/fixtures/fake_backends.py), which computes the layer
with ONNX Runtime. The node tests of onnx that ONNX Runtime really cannot run are in
test_reference_fallback_node_tests.py.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from conftest import TensorProto, helper, make_model, tvi
from fixtures.fake_backends import fake  # noqa: F401 (a fixture)

from torq_gen_config.compare import DEFAULT_TOLERANCE
from torq_gen_config.core.fileio import load_npz, save_npz
from torq_gen_config.discovery.layer_test import one_line_summary, run_layer_test
from torq_gen_config.reference import compute_reference, judged_reference, load_reference
from torq_gen_config.report.build import build_report
from torq_gen_config.report.cells import cell_detail
from torq_gen_config.report.recommend import reference_agreement, rederive_statuses
from torq_gen_config.report.view import render_summary
from torq_gen_config.report.view_format import make_console
from torq_gen_config.report.view_layer import render_layer
from torq_gen_config.core.schemas import validator

LAYER = {"layer_id": "Add_y", "slug": "Add_y", "op_type": "Add", "node_index": 0}
ORT_MESSAGE = ("ONNX Runtime failed on the layer: [ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an "
               "implementation for Add(14) node with name ''\nsecond line of the message")
FALLBACK = ("reference: onnx (ONNX Runtime failed: [ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an "
            "implementation for Add(14) node with name '')")
X = np.linspace(1.0, 2.0, 12, dtype=np.float32).reshape(3, 4)


@pytest.fixture
def layer(tmp_path):
    """y = x + 1 on float32[3, 4]: a layer both engines run."""
    m = make_model([helper.make_node("Add", ["x", "one"], ["y"])], [tvi("x", TensorProto.FLOAT, [3, 4])],
                   [tvi("y", TensorProto.FLOAT, [3, 4])],
                   [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    path = tmp_path / "add.onnx"
    import onnx

    onnx.save(m, path)
    return path


def _reference(tmp_path, layer, *, engine="onnxruntime", primary_fails=True, second_fails=False,
               second_scale=None) -> str:
    """A real reference file of ``layer``, rewritten so that the primary engine (and with
    ``second_fails`` the second one) failed on it; ``second_scale`` multiplies the second
    engine's outputs (to tell which outputs a verdict was computed against)."""
    path = tmp_path / f"ref_{engine}.npz"
    compute_reference(layer, path, inputs={"x": X}, inputs_source="test", engine=engine)
    arrays, meta = load_npz(path)
    assert meta["status"] == "ok" and meta["second"]["status"] == "ok"
    label = "ONNX Runtime" if engine == "onnxruntime" else "the ONNX reference implementation"
    if primary_fails:
        arrays = {k: v for k, v in arrays.items() if not k.startswith("output_")}
        meta.update(status="error", message=ORT_MESSAGE if engine == "onnxruntime" else
                    f"{label} failed on the layer: spec failure", engines_agreement=None, run_ms=None)
    if second_fails:
        arrays = {k: v for k, v in arrays.items() if not k.startswith("second_output_")}
        meta["second"] = {**meta["second"], "status": "crash", "message": "the worker crashed", "run_ms": None}
        meta["engines_agreement"] = None
    if second_scale is not None:
        arrays["second_output_0"] = arrays["second_output_0"] * np.float32(second_scale)
    save_npz(path, arrays, meta)
    return str(path)


def _test(tmp_path, layer, ref, executor):
    work = tmp_path / executor["name"]
    return run_layer_test(layer=LAYER, executor=executor, layer_onnx=str(layer), reference_npz=ref, layer_mlir=None,
                          import_status=None, work_dir=str(work), result_path=str(work / "result.json"),
                          log_path=None, tolerance=DEFAULT_TOLERANCE, timeout_s=30)


def _report(results: dict, executors: list[dict], tolerance=DEFAULT_TOLERANCE) -> dict:
    return build_report(model_name="m", layers=[{**LAYER, "mlir_location": None, "mac_count": None,
                                                 "skipped_reason": None}],
                        results={LAYER["layer_id"]: results}, executors=executors, default_tolerance=tolerance,
                        mlir_file=None, provenance={})


def test_judged_reference_picks_the_engine_the_verdict_rests_on():
    names = {"output_names": ["y"]}
    spec = {"y": np.ones(2)}
    ok = {**names, "status": "ok", "engine": "onnxruntime", "second": {"engine": "onnx", "status": "ok"},
          "second_outputs": spec}
    assert judged_reference(ok, {"y": np.zeros(2)})[0] == "onnxruntime"
    failed = {**ok, "status": "error", "message": ORT_MESSAGE}
    used, outputs, line = judged_reference(failed, {})
    assert used == "onnx" and outputs is spec and line == FALLBACK
    assert judged_reference({**failed, "second": {"engine": "onnx", "status": "timeout"}, "second_outputs": {}},
                            {}) == (None, {}, None)
    assert judged_reference({**failed, "second_outputs": {}}, {}) == (None, {}, None)  # no outputs kept
    # --reference onnx: the spec failed; ONNX Runtime is no stand-in for it
    spec_failed = {**names, "status": "error", "engine": "onnx", "message": "x",
                   "second": {"engine": "onnxruntime", "status": "ok"}, "second_outputs": spec}
    assert judged_reference(spec_failed, {}) == (None, {}, None)


def test_a_layer_onnxruntime_fails_on_is_judged_against_the_spec(tmp_path, layer, fake):
    # the spec's outputs negated: an executor that agrees with them is the negated one
    ref = _reference(tmp_path, layer, second_scale=-1.0)
    agrees, differs = _test(tmp_path, layer, ref, fake("negated")), _test(tmp_path, layer, ref, fake("same"))
    assert agrees["status"] == "success" and agrees["failure_report"] is None, agrees
    assert differs["status"] == "difference" and differs["failure_report"]["type"] == "accuracy_failure"
    for res in (agrees, differs):
        assert res["reference"]["used"] == "onnx" and res["reference"]["fallback"] == FALLBACK
        assert res["reference"]["status"] == "error" and res["reference"]["engine"] == "onnxruntime"
        assert "reference_check" not in res  # the spec is the reference: there is no second opinion
        assert validator("layer_result.schema.yaml").is_valid(res), list(
            validator("layer_result.schema.yaml").iter_errors(res))
    cut = FALLBACK[:116] + "...)"  # the console line keeps the fallback's parenthesis closed
    assert one_line_summary(agrees).startswith("[fake-negated] Add_y: success (")
    assert one_line_summary(agrees).endswith(f"; {cut})")
    assert one_line_summary(differs).startswith("[fake-same] Add_y: difference - max rel diff")
    assert one_line_summary(differs).endswith(f" ({cut})")


def test_a_run_failure_where_the_spec_ran_is_the_executors_error(tmp_path, layer, fake):
    res = _test(tmp_path, layer, _reference(tmp_path, layer), fake("fail_run"))
    assert res["status"] == "error" and res["failure_report"]["stage"] == "run", res
    assert res["reference"]["used"] == "onnx"


def test_with_both_engines_failed_the_verdict_is_unverified(tmp_path, layer, fake):
    ref = _reference(tmp_path, layer, second_fails=True)
    ran, failed = _test(tmp_path, layer, ref, fake("same")), _test(tmp_path, layer, ref, fake("fail_run"))
    for res in (ran, failed):
        assert res["status"] == "unverified" and res["metrics"] is None, res
        assert res["reference"]["used"] is None and res["reference"]["fallback"] is None
        assert validator("layer_result.schema.yaml").is_valid(res)
    assert ran["failure_report"]["summary"].startswith("ran, but the reference failed: ONNX Runtime failed")
    assert failed["failure_report"]["during"] == "run"
    rep = _report({"fake-same": ran}, [fake("same")])
    dr = rep["discovery_report"]
    assert [x["layer_id"] for x in dr["reference_failures"]] == ["Add_y"] and dr["reference_fallbacks"] == []
    assert "REFERENCE FAILED on 1 layer(s)" in rep["final_report_text"]
    assert "REFERENCE FALLBACK" not in rep["final_report_text"]


def test_reference_onnx_keeps_the_spec_as_the_only_reference(tmp_path, layer, fake):
    # --reference onnx, the spec failed, ONNX Runtime ran: unverified, ONNX Runtime only a second opinion
    ref = _reference(tmp_path, layer, engine="onnx")
    res = _test(tmp_path, layer, ref, fake("same"))
    assert res["status"] == "unverified" and res["metrics"] is None, res
    assert res["reference"]["used"] is None and res["reference"]["fallback"] is None
    assert res["reference_check"]["engine"] == "onnxruntime"
    failed = _test(tmp_path, layer, ref, fake("fail_run"))
    assert failed["status"] == "unverified" and failed["failure_report"]["during"] == "run"


def test_the_report_lists_a_fallback_layer_honestly(tmp_path, layer, fake):
    ref = _reference(tmp_path, layer, second_scale=-1.0)
    results = {"fake-negated": _test(tmp_path, layer, ref, fake("negated")),
               "fake-same": _test(tmp_path, layer, ref, fake("same"))}
    rep = _report(results, [fake("negated"), fake("same")])
    op = rep["ops"]["Add_y"]
    assert op["reference"]["used"] == "onnx" and op["reference"]["fallback"] == FALLBACK
    assert op["reference"]["dispute"] is None
    for entry in op["executors"].values():
        assert entry["reference_used"] == "onnx" and entry["reference_fallback"] == FALLBACK
        assert "reference_check" not in entry
    assert op["executors"]["fake-negated"]["status"] == "success"
    assert op["executors"]["fake-same"]["status"] == "difference"
    assert op["recommended_executor"] == "fake-negated"
    dr = rep["discovery_report"]
    assert dr["reference_failures"] == [] and dr["summary"]["reference_failures"] == 0
    assert [(x["layer_id"], x["used"], x["fallback"]) for x in dr["reference_fallbacks"]] == [("Add_y", "onnx",
                                                                                              FALLBACK)]
    assert dr["summary"]["reference_fallbacks"] == 1 and dr["summary"]["status_counts"]["unverified"] == 0
    text = rep["final_report_text"]
    assert "REFERENCE FAILED" not in text
    assert ("REFERENCE FALLBACK: 1 layer(s) judged against onnx's reference implementation, with no second opinion"
            in text)
    assert ("Add_y: judged against onnx's reference implementation (ONNX Runtime failed: [ONNXRuntimeError] : 9 : "
            "NOT_IMPLEMENTED") in text
    assert "fake-negated (judged against onnx)" in text
    # the ops and the fallback list against the output schema (assemble adds the other sections)
    errors = [e.message for e in validator("report_output.schema.yaml").iter_errors(rep)
              if list(e.absolute_path)[:1] == ["ops"] or list(e.absolute_path)[:2] == ["discovery_report",
                                                                                        "reference_fallbacks"]]
    assert errors == []
    detail = cell_detail("Add_y", op, "fake-same")
    assert detail["reference"]["used"] == "onnx" and detail["reference_fallback"] == FALLBACK


def test_view_shows_what_a_fallback_layer_was_judged_against(tmp_path, layer, fake):
    ref = _reference(tmp_path, layer)
    rep = _report({"fake-same": _test(tmp_path, layer, ref, fake("same"))}, [fake("same")])
    buf = io.StringIO()
    render_layer(rep, "Add_y", make_console(file=buf))
    text = buf.getvalue()
    assert "Judged against: the ONNX reference implementation" in text and "no second opinion" in text
    assert FALLBACK[:80] in text
    assert "Second opinion:" not in text and "agrees with" not in text
    assert "compared with the ONNX reference implementation only" in text
    buf = io.StringIO()
    render_summary(rep, make_console(file=buf))
    assert "fake-same (judged against onnx)" in buf.getvalue()
    assert "REFERENCE FALLBACK: 1 layer(s)" in buf.getvalue()


def test_a_tolerance_change_rederives_a_fallback_verdict_from_its_metrics(tmp_path, layer, fake):
    # the spec's outputs 0.5% above the executor's: a success at 1%, a difference at 0.1%
    ref = _reference(tmp_path, layer, second_scale=1.005)
    res = _test(tmp_path, layer, ref, fake("same"))
    assert res["status"] == "success" and res["reference"]["used"] == "onnx"
    tight = {**DEFAULT_TOLERANCE, "fp_avg_tol": 1e-3, "fp_max_tol": 1e-3}
    rep = _report({"fake-same": res}, [fake("same")], tolerance=tight)
    entry = rep["ops"]["Add_y"]["executors"]["fake-same"]
    assert entry["status"] == "difference" and entry["reference_used"] == "onnx"
    assert rep["discovery_report"]["summary"]["status_counts"]["unverified"] == 0
    op = rep["ops"]["Add_y"]
    rederive_statuses(op, DEFAULT_TOLERANCE)
    assert entry["status"] == "success" and entry["failure_report"] is None
    op["tolerance_override"] = tight
    rederive_statuses(op, DEFAULT_TOLERANCE)
    assert entry["status"] == "difference" and "max rel diff" in entry["failure_report"]["summary"]


def test_a_check_against_the_reference_itself_is_no_second_opinion():
    from torq_gen_config.compare import compare_outputs

    y = np.linspace(1.0, 2.0, 10)
    metrics = compare_outputs({"y": y}, {"y": y}, ["y"])
    entry = {"status": "success", "metrics": metrics, "reference_engine": "onnxruntime", "reference_used": "onnx",
             "reference_check": {"engine": "onnx", "metrics": metrics}}
    agreement = reference_agreement(entry, DEFAULT_TOLERANCE)
    assert agreement["agrees_with"] == ["onnx"] and agreement["differs_from"] == []
    assert agreement["summary"] == "agrees with the ONNX reference implementation"
    # with the primary used, both engines are counted, each once
    both = reference_agreement({**entry, "reference_used": "onnxruntime"}, DEFAULT_TOLERANCE)
    assert both["agrees_with"] == ["onnxruntime", "onnx"]
    assert " and " in both["summary"]


def test_results_written_before_the_fallback_read_as_before(tmp_path, layer, fake):
    # a result without reference.used: the configured engine when it ran, none when it failed
    res = _test(tmp_path, layer, _reference(tmp_path, layer, second_fails=True), fake("same"))
    for key in ("used", "fallback"):
        res["reference"].pop(key)
    rep = _report({"fake-same": res}, [fake("same")])
    assert rep["ops"]["Add_y"]["reference"]["used"] is None
    assert rep["ops"]["Add_y"]["executors"]["fake-same"]["reference_used"] is None
    assert [x["layer_id"] for x in rep["discovery_report"]["reference_failures"]] == ["Add_y"]
    _, _, meta = load_reference(_reference(tmp_path, layer, primary_fails=False))
    assert meta["status"] == "ok"
