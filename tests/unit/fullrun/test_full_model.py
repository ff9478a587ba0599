"""Full-model run: assignment resolution, partitioning, partition models, running
a chain of partitions (ONNX Runtime executors only: fast, no IREE), report text."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from conftest import TensorProto, helper, make_model, tvi
from onnx import numpy_helper

from torq_gen_config.core.errors import ConfigError, ReportError
from torq_gen_config.fullrun.report_section import TEXT_MARKER, full_model_section, with_full_model_text
from torq_gen_config.fullrun.partition import build_partition_model, partition_runs
from torq_gen_config.fullrun.selection import (
    check_selection,
    make_assignment,
    resolve_assignment,
    selection_from_compiler_json,
    selection_from_report,
)
from torq_gen_config.fullrun.compile import compile_partition
from torq_gen_config.fullrun.plan import make_plan
from torq_gen_config.fullrun.execute import run_partitions
from torq_gen_config.model.prepare import prepare_model
from torq_gen_config.model.folding import fold_constants
from torq_gen_config.model.split import split_layers
from torq_gen_config.core.fileio import load_npz
from torq_gen_config.reference import compute_reference, load_reference

ORT = {"backend": "onnxruntime", "options": {"providers": ["CPUExecutionProvider"]}}
X, Y, Z = ({"name": n, **ORT} for n in ("x", "y", "z"))


def chain_model(path):
    """A: Relu(in) -> a; B: Neg(a) -> b; C: Abs(b) -> c; D: Add(c, a) -> out (a skips C)."""
    nodes = [
        helper.make_node("Relu", ["in"], ["a"], name="A"),
        helper.make_node("Neg", ["a"], ["b"], name="B"),
        helper.make_node("Abs", ["b"], ["c"], name="C"),
        helper.make_node("Add", ["c", "a"], ["out"], name="D"),
    ]
    m = make_model(nodes, [tvi("in", TensorProto.FLOAT, [2, 3])], [tvi("out", TensorProto.FLOAT, [2, 3])])
    onnx.save(m, path)
    return path


def prepared(tmp_path, path):
    model, info = prepare_model(path)
    man = split_layers(model, info, tmp_path / "layers")
    onnx.save(model, tmp_path / "prepared.onnx")
    return model, man


def report_for(man, executors: dict, statuses: dict | None = None) -> dict:
    """A minimal report: layer -> recommended executor (None allowed), optional statuses."""
    ops = {}
    for layer in man["layers"]:
        lid = layer["layer_id"]
        st = (statuses or {}).get(lid) or {}
        ops[lid] = {"recommended_executor": executors.get(lid),
                    "executors": {n: {"status": s} for n, s in st.items()}, "op_type": layer["op_type"]}
    return {"model_name": "m", "ops": ops, "executors": ["x", "y", "z"]}


def assignment_for(man, executors, statuses=None):
    return make_assignment(selection_from_report(report_for(man, executors, statuses), source_file="r.json"))


# ---------------------------------------------------------------- partitioning


def test_partition_runs_are_maximal_runs_of_one_executor():
    assert partition_runs([(0, "x"), (1, "x"), (2, "y"), (3, "x")]) == [("x", [0, 1]), ("y", [2]), ("x", [3])]
    assert partition_runs([(5, "x")]) == [("x", [5])]
    assert partition_runs([]) == []


def test_xxyx_gives_three_partitions_with_their_inputs_and_outputs(tmp_path):
    model, man = prepared(tmp_path, chain_model(tmp_path / "m.onnx"))
    ids = [l["layer_id"] for l in man["layers"]]
    assert ids == ["Relu_a", "Neg_b", "Abs_c", "Add_out"]
    a = assignment_for(man, dict(zip(ids, ["x", "x", "y", "x"])))
    plan = make_plan(model, man, None, a, [X, Y], tmp_path / "parts")
    parts = plan["partitions"]
    assert [(p["executor"], p["layer_ids"]) for p in parts] == [
        ("x", ["Relu_a", "Neg_b"]), ("y", ["Abs_c"]), ("x", ["Add_out"])]
    assert [(p["first_node"], p["last_node"]) for p in parts] == [(0, 1), (2, 2), (3, 3)]
    # P0 hands both b (to C) and a (to D, skipping P1) on
    assert parts[0]["inputs"] == ["in"] and parts[0]["outputs"] == ["a", "b"]
    assert parts[1]["inputs"] == ["b"] and parts[1]["outputs"] == ["c"]
    assert parts[2]["inputs"] == ["c", "a"] and parts[2]["outputs"] == ["out"]
    for p in parts:
        m = onnx.load(p["model"])
        onnx.checker.check_model(m)
        assert m.graph.name == "main"
        assert [i.name for i in m.graph.input] == p["inputs"]
        assert [o.name for o in m.graph.output] == p["outputs"]
        assert all(o.type.tensor_type.elem_type == TensorProto.FLOAT for o in m.graph.output)
    assert plan["fallbacks"] == [] and plan["graph_inputs"] == ["in"] and plan["graph_outputs"] == ["out"]


def test_one_executor_is_one_partition(tmp_path):
    model, man = prepared(tmp_path, chain_model(tmp_path / "m.onnx"))
    a = assignment_for(man, {l["layer_id"]: "y" for l in man["layers"]})
    plan = make_plan(model, man, None, a, [X, Y], tmp_path / "parts")
    assert plan["num_partitions"] == 1
    p = plan["partitions"][0]
    assert p["inputs"] == ["in"] and p["outputs"] == ["out"] and p["num_nodes"] == 4


def test_constants_are_folded_into_initializers_of_their_partition(tmp_path):
    """Constant and a Shape of a static tensor fold; their values become initializers."""
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    nodes = [
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.full((2, 3), 2.0, np.float32))),
        helper.make_node("Mul", ["in", "k"], ["m"], name="mul"),
        helper.make_node("Shape", ["w"], ["s"], name="shape"),
        helper.make_node("Add", ["m", "w"], ["a"], name="add"),
        helper.make_node("Reshape", ["a", "s"], ["out"], name="reshape"),
    ]
    path = tmp_path / "c.onnx"
    onnx.save(make_model(nodes, [tvi("in", TensorProto.FLOAT, [2, 3])], [tvi("out", TensorProto.FLOAT, [2, 3])], [w]),
              path)
    model, man = prepared(tmp_path, path)
    _, folded, _ = fold_constants(model)
    ids = [l["layer_id"] for l in man["layers"]]
    assert ids == ["Mul_m", "Add_a", "Reshape_out"]
    a = assignment_for(man, {"Mul_m": "x", "Add_a": "y", "Reshape_out": "y"})
    plan = make_plan(model, man, None, a, [X, Y], tmp_path / "parts")
    assert plan["folded_nodes"] == len(folded) == 2
    covered = sorted(j for p in plan["partitions"] for j in range(p["first_node"], p["last_node"] + 1))
    assert sorted(set(range(len(model.graph.node))) - set(covered)) == sorted(folded)
    m0, m1 = (onnx.load(p["model"]) for p in plan["partitions"])
    assert [t.name for t in m0.graph.initializer] == ["k"] and [i.name for i in m0.graph.input] == ["in"]
    assert sorted(t.name for t in m1.graph.initializer) == ["s", "w"]
    assert [i.name for i in m1.graph.input] == ["m"]
    assert not any(n.op_type in ("Constant", "Shape") for m in (m0, m1) for n in m.graph.node)


def test_subgraph_outer_names_are_partition_inputs(tmp_path):
    """An If branch reading an outer tensor: that tensor is an input of the If's partition."""
    then_g = helper.make_graph([helper.make_node("Neg", ["a"], ["t"])], "then", [], [tvi("t", TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Abs", ["a"], ["e"])], "else", [], [tvi("e", TensorProto.FLOAT, [2])])
    nodes = [
        helper.make_node("Relu", ["in"], ["a"], name="relu"),
        helper.make_node("Identity", ["cond"], ["c2"], name="id"),
        helper.make_node("If", ["c2"], ["out"], then_branch=then_g, else_branch=else_g, name="if"),
    ]
    m = make_model(nodes, [tvi("in", TensorProto.FLOAT, [2]), tvi("cond", TensorProto.BOOL, [])],
                   [tvi("out", TensorProto.FLOAT, [2])])
    part, io = build_partition_model(m, [2], {})
    assert io["inputs"] == ["c2", "a"] and io["outputs"] == ["out"]
    part0, io0 = build_partition_model(m, [0, 1], {})
    assert io0["outputs"] == ["a", "c2"]  # both read by the If outside


def test_pid_changes_only_for_partitions_a_change_touches(tmp_path):
    model, man = prepared(tmp_path, chain_model(tmp_path / "m.onnx"))
    ids = [l["layer_id"] for l in man["layers"]]
    p1 = make_plan(model, man, None, assignment_for(man, dict(zip(ids, "xyxy"))), [X, Y], tmp_path / "parts")
    again = make_plan(model, man, None, assignment_for(man, dict(zip(ids, "xyxy"))), [X, Y], tmp_path / "parts")
    assert [p["pid"] for p in p1["partitions"]] == [p["pid"] for p in again["partitions"]]
    # the last layer moves from y to x: partitions 0 and 1 stay, 2 and 3 merge
    p2 = make_plan(model, man, None, assignment_for(man, dict(zip(ids, "xyxx"))), [X, Y], tmp_path / "parts")
    old, new = [p["pid"] for p in p1["partitions"]], [p["pid"] for p in p2["partitions"]]
    assert new[:2] == old[:2] and len(new) == 3 and new[2] not in old
    # stale partition directories are removed, unchanged model files keep their mtime
    assert sorted(d.name for d in (tmp_path / "parts").iterdir()) == sorted(new)


def test_unchanged_partition_model_keeps_mtime(tmp_path):
    model, man = prepared(tmp_path, chain_model(tmp_path / "m.onnx"))
    ids = [l["layer_id"] for l in man["layers"]]
    a = assignment_for(man, dict(zip(ids, "xxyy")))
    plan = make_plan(model, man, None, a, [X, Y], tmp_path / "parts")
    f = tmp_path / "parts" / plan["partitions"][0]["pid"] / "model.onnx"
    before = f.stat().st_mtime_ns
    make_plan(model, man, None, a, [X, Y], tmp_path / "parts")
    assert f.stat().st_mtime_ns == before


def test_compiler_and_runtime_options_and_debug_ir(tmp_path):
    model, man = prepared(tmp_path, chain_model(tmp_path / "m.onnx"))
    iree = {"name": "cpu", "backend": "iree", "options": {"target": "llvm-cpu", "compile_flags": ["--a"]}}
    sel = selection_from_report(report_for(man, {l["layer_id"]: "cpu" for l in man["layers"]}))
    base = make_plan(model, man, None, make_assignment(sel), [iree], tmp_path / "p", write=False)
    p = base["partitions"][0]
    assert p["compile_def"]["options"]["compile_flags"] == ["--a"]
    opt = make_plan(model, man, None, make_assignment(sel), [iree], tmp_path / "p", write=False,
                    compiler_options=["--b"], runtime_options=["--r"])
    q = opt["partitions"][0]
    assert q["executor_def"]["options"]["compile_flags"] == ["--a", "--b"]
    assert q["executor_def"]["options"]["run_flags"] == ["--r"]
    assert "run_flags" not in q["compile_def"]["options"]
    assert q["pid"] != p["pid"]
    # a runtime option alone does not change the compile key
    rt = make_plan(model, man, None, make_assignment(sel), [iree], tmp_path / "p", write=False, runtime_options=["--r"])
    assert rt["partitions"][0]["pid"] == p["pid"]
    dbg = make_plan(model, man, None, make_assignment(sel, debug_ir="/tmp/ir"), [iree], tmp_path / "p", write=False)
    d = dbg["partitions"][0]
    assert d["compile_def"]["options"]["compile_flags"][-1] == f"--dump-compilation-phases-to=/tmp/ir/{d['pid']}"
    assert d["pid"] != p["pid"]


# ---------------------------------------------------------------- assignment


def test_null_recommendation_falls_back_to_first_executor_without_error(tmp_path):
    model, man = prepared(tmp_path, chain_model(tmp_path / "m.onnx"))
    ids = [l["layer_id"] for l in man["layers"]]
    statuses = {ids[1]: {"x": "error", "y": "difference", "z": "success"},
                ids[2]: {"x": "error", "y": "error"}}
    a = assignment_for(man, {ids[0]: "z", ids[3]: "z"}, statuses)
    by_layer, fallbacks, _ = resolve_assignment(a, man["layers"], None, [X, Y, Z])
    assert by_layer == {ids[0]: "z", ids[1]: "y", ids[2]: "x", ids[3]: "z"}
    fb = {f["layer_id"]: f for f in fallbacks}
    assert set(fb) == {ids[1], ids[2]}
    assert "highest-priority executor whose status is not error" in fb[ids[1]]["reason"]
    assert "first executor" in fb[ids[2]]["reason"] and "x" in fb[ids[2]]["reason"]
    plan = make_plan(model, man, None, a, [X, Y, Z], tmp_path / "parts")
    assert [f["layer_id"] for f in plan["fallbacks"]] == [ids[1], ids[2]]


def test_an_untested_layer_s_fallback_reason_is_short(tmp_path):
    """The not-testable reason of a layer downstream of a failed node repeats the whole
    chain of causes (hundreds of characters each, as on PaddleOCR's recognizer): the
    fallback line keeps its start; the layer's own record keeps it whole."""
    model, man = prepared(tmp_path, chain_model(tmp_path / "m.onnx"))
    ids = [l["layer_id"] for l in man["layers"]]
    report = report_for(man, {i: "z" for i in ids[1:]})
    why = "not testable: the type/shape of input 'a' is unknown (" + "input 'b' is unavailable (" * 20 + ")" * 21
    report["ops"][ids[0]]["not_testable_reason"] = why
    _, fallbacks, _ = resolve_assignment(make_assignment(selection_from_report(report, source_file="r.json")),
                                         man["layers"], None, [X, Y, Z])
    reason = fallbacks[0]["reason"]
    assert reason.startswith("no recommendation and it was not tested (not testable: the type/shape of input 'a'")
    assert reason.endswith(" ...); using the first executor") and len(reason) < 260


def test_layer_missing_from_report_and_null_string(tmp_path):
    model, man = prepared(tmp_path, chain_model(tmp_path / "m.onnx"))
    rep = report_for(man, {l["layer_id"]: "y" for l in man["layers"]})
    rep["ops"]["Neg_b"]["recommended_executor"] = "null"  # the original tool's edit stored this string
    del rep["ops"]["Abs_c"]
    rep["ops"]["Gone_layer"] = {"recommended_executor": "y", "executors": {}}
    a = make_assignment(selection_from_report(rep))
    by_layer, fallbacks, warnings = resolve_assignment(a, man["layers"], None, [X, Y])
    assert by_layer["Neg_b"] == "x" and by_layer["Abs_c"] == "x" and by_layer["Add_out"] == "y"
    assert {f["layer_id"] for f in fallbacks} == {"Neg_b", "Abs_c"}
    assert any("Gone_layer" in w for w in warnings)


def test_compiler_json_assignment_by_location(tmp_path):
    model, man = prepared(tmp_path, chain_model(tmp_path / "m.onnx"))
    nodes = [{"index": j, "line": 10 + j, "col": 12, "verified": True} for j in range(len(model.graph.node))]
    locations = {"status": "ok", "nodes": nodes}
    sel = selection_from_compiler_json({"op_assignments": {"10:12": {"executor": "y"}, "12:12": {"executor": "y"},
                                                           "13:12": {"executor": None}}, "model_name": "m"})
    by_layer, fallbacks, _ = resolve_assignment(make_assignment(sel), man["layers"], locations, [X, Y])
    assert by_layer == {"Relu_a": "y", "Neg_b": "x", "Abs_c": "y", "Add_out": "x"}
    assert {f["layer_id"] for f in fallbacks} == {"Neg_b", "Add_out"}


def test_unknown_executors_and_mixed_torq_assignments_are_rejected(tmp_path):
    model, man = prepared(tmp_path, chain_model(tmp_path / "m.onnx"))
    sel = selection_from_report(report_for(man, {"Relu_a": "w"}), source_file="r.json")
    with pytest.raises(ConfigError, match="'w'.*not configured"):
        check_selection(sel, [X, Y])
    with pytest.raises(ConfigError, match="not configured"):
        resolve_assignment(make_assignment(sel), man["layers"], None, [X, Y])
    torq = {"name": "nss", "backend": "torq", "options": {}}
    sel = selection_from_report(report_for(man, {"Relu_a": "nss"}))
    assert check_selection(sel, [X, torq]) == "torq"
    sel = selection_from_report(report_for(man, {"Relu_a": "nss", "Neg_b": "x"}))
    with pytest.raises(ConfigError, match="mixes executors of the torq backend"):
        check_selection(sel, [X, torq])
    res = compile_partition(pid="nss-000000000000", model_path=str(tmp_path / "m.onnx"), executor=torq,
                            work_dir=str(tmp_path / "w"), timeout_s=10, log_path=None)
    assert res["status"] == "error" and "torq backend is not available" in res["failure"]["message"]


def test_selection_rejects_wrong_kind_of_json():
    with pytest.raises(ReportError, match="not a report JSON"):
        selection_from_report({"op_assignments": {}}, source_file="x.json")
    with pytest.raises(ReportError, match="not a compiler JSON"):
        selection_from_compiler_json({"ops": {}})


# ---------------------------------------------------------------- running


def compile_all(plan, tmp_path):
    return {p["pid"]: compile_partition(pid=p["pid"], model_path=p["model"], executor=p["compile_def"],
                                        work_dir=str(tmp_path / "parts" / p["pid"]), timeout_s=60, log_path=None)
            for p in plan["partitions"]}


def test_chain_of_partitions_matches_the_full_model_reference(tmp_path):
    model, man = prepared(tmp_path, chain_model(tmp_path / "m.onnx"))
    ids = [l["layer_id"] for l in man["layers"]]
    plan = make_plan(model, man, None, assignment_for(man, dict(zip(ids, "xxyx"))), [X, Y], tmp_path / "parts")
    compiled = compile_all(plan, tmp_path)
    assert all(c["status"] == "ok" for c in compiled.values())
    compute_reference(tmp_path / "prepared.onnx", tmp_path / "ref.npz", {"seed": 7})
    res = run_partitions(plan, reference_npz=str(tmp_path / "ref.npz"), compiled=compiled,
                         tolerance={"fp_avg_tol": 0.01, "fp_max_tol": 0.01}, timeout_s=60, partitions_dir=tmp_path / "parts",
                         outputs_npz=str(tmp_path / "outputs.npz"))
    assert res["status"] == "success", res["summary"]
    assert res["metrics"]["max_abs_diff"] == 0.0 and res["num_over_tolerance"] == 0
    # the model's outputs of the run are kept, named as the model names them
    _, ref_outputs, meta = load_reference(str(tmp_path / "ref.npz"))
    outputs, _ = load_npz(tmp_path / "outputs.npz")
    assert res["outputs_file"] == "outputs.npz" and sorted(outputs) == sorted(meta["output_names"])
    assert all(np.array_equal(outputs[n], ref_outputs[n]) for n in outputs)
    section = full_model_section(res, tolerance={"fp_avg_tol": 0.01, "fp_max_tol": 0.01}, result_file="full/result.json")
    assert section["outputs_file"] == "full/outputs.npz"
    assert "Outputs: full/outputs.npz" in with_full_model_text("", section)
    assert [r["status"] for r in res["partitions"]] == ["ran"] * 3
    assert all(r["run_ms"] is not None and r["compile_ms"] is not None for r in res["partitions"])
    assert all(r["partition_check"]["status"] == "success" for r in res["partitions"])
    json.dumps(res, allow_nan=False)


def test_failing_partition_gives_an_error_result(tmp_path):
    model, man = prepared(tmp_path, chain_model(tmp_path / "m.onnx"))
    ids = [l["layer_id"] for l in man["layers"]]
    plan = make_plan(model, man, None, assignment_for(man, dict(zip(ids, "xxyx"))), [X, Y], tmp_path / "parts")
    compiled = compile_all(plan, tmp_path)
    bad = plan["partitions"][1]["pid"]
    compiled[bad] = {"status": "error", "failure": {"stage": "compile", "during": None,
                                                    "message": "error: failed to legalize 'onnx.Abs'"}}
    compute_reference(tmp_path / "prepared.onnx", tmp_path / "ref.npz")
    res = run_partitions(plan, reference_npz=str(tmp_path / "ref.npz"), compiled=compiled,
                         tolerance={"fp_avg_tol": 0.01, "fp_max_tol": 0.01}, timeout_s=60, partitions_dir=tmp_path / "parts")
    assert res["status"] == "error"
    f = res["failure"]
    assert f["stage"] == "compile" and f["partition"] == 1 and f["executor"] == "y" and f["layer_ids"] == ["Abs_c"]
    assert "failed to legalize" in f["summary"] and "partition 1 (y" in f["summary"]
    # a run failure: the partition's model file is gone, the session cannot be created
    compiled = compile_all(plan, tmp_path)
    (tmp_path / "parts" / plan["partitions"][2]["pid"] / "model.onnx").unlink()
    res = run_partitions(plan, reference_npz=str(tmp_path / "ref.npz"), compiled=compiled,
                         tolerance={"fp_avg_tol": 0.01, "fp_max_tol": 0.01}, timeout_s=60, partitions_dir=tmp_path / "parts")
    assert res["status"] == "error" and res["failure"]["partition"] == 2
    assert [r["status"] for r in res["partitions"]] == ["ran", "ran", "error"]


# ---------------------------------------------------------------- report


def fake_result(max_rel):
    from torq_gen_config.compare import compare_outputs

    ref = {"out": np.ones(100, np.float32)}
    act = {"out": ref["out"] * (1 + max_rel)}
    return {"status": "success", "summary": "x", "metrics": compare_outputs(act, ref, ["out"]),
            "num_over_tolerance": 0, "share_over_tolerance": 0.0, "source": "report", "source_file": "r.json",
            "layer_executors": {"a": "x", "b": "y"}, "partitions": [
                {"index": 0, "executor": "x", "first_node": 0, "last_node": 0, "layer_ids": ["a"],
                 "partition_check": {"status": "success"}},
                {"index": 1, "executor": "y", "first_node": 1, "last_node": 1, "layer_ids": ["b"],
                 "partition_check": {"status": "difference", "summary": "1 element over"}}],
            "num_partitions": 2, "timing": {"compile_ms_total": 1500.0, "run_ms_total": 3.0},
            "fallbacks": [{"layer_id": "b", "executor": "y", "reason": "no recommendation; ..."}]}


def test_section_rederives_status_with_the_report_tolerance():
    res = fake_result(0.005)
    assert full_model_section(res, tolerance={"fp_avg_tol": 0.01, "fp_max_tol": 0.01})["status"] == "success"
    s = full_model_section(res, tolerance={"fp_avg_tol": 0.001, "fp_max_tol": 0.001})
    assert s["status"] == "difference" and s["num_over_tolerance"] == 100
    assert s["partition_counts"] == {"x": 1, "y": 1} and s["assignment"]["layer_counts"] == {"x": 1, "y": 1}


def test_final_report_text_part_is_appended_once():
    s = full_model_section(fake_result(0.0), tolerance=None)
    text = with_full_model_text("FINAL EXECUTOR DISCOVERY REPORT\ntable\n", s)
    assert text.startswith("FINAL EXECUTOR DISCOVERY REPORT\ntable\n\n" + TEXT_MARKER)
    for needle in ("Status: success", "Max relative difference", "Max absolute difference",
                   "Number of differences", "Partitions: 2 (x: 1, y: 1)", "b -> y (no recommendation",
                   "#1 y nodes 1-1 (b): difference"):
        assert needle in text, needle
    again = with_full_model_text(text, s)
    assert again == text and again.count(TEXT_MARKER) == 1
