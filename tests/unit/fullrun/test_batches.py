"""Compile batches of a full-model run (torq_gen_config.fullrun.batches): which partitions
are batched, partition modules (several inputs and outputs) merged and compiled with the
real IREE compiler, results equal to one-partition compiles, failures per partition."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
from conftest import TensorProto, helper, make_model, tvi

from torq_gen_config.discovery.batch_compile import ALONE, COMPILED, IMPORT_FAILED
from torq_gen_config.fullrun.batches import (
    batch_dir,
    batch_members,
    compile_partition_batch,
    compiled_from_batch,
    plan_partition_batches,
)
from torq_gen_config.fullrun.compile import compile_partition
from torq_gen_config.fullrun.selection import make_assignment, selection_from_report
from torq_gen_config.fullrun.plan import make_plan
from torq_gen_config.fullrun.report_section import full_model_section, render_full_model_text
from torq_gen_config.fullrun.execute import run_partitions
from torq_gen_config.mlir.merge import merge_modules, parse_layer_module
from torq_gen_config.model.prepare import prepare_model
from torq_gen_config.model.split import split_layers
from torq_gen_config.reference import compute_reference

LLVM = {"name": "llvm-cpu", "backend": "iree", "options": {"target": "llvm-cpu", "device": "local-sync"}}
VMVX = {"name": "vmvx", "backend": "iree", "options": {"target": "vmvx", "device": "local-sync"}}
ORT = {"name": "ort", "backend": "onnxruntime", "options": {}}
TOL = {"fp_avg_tol": 0.01, "fp_max_tol": 0.01}


def fake(index, pid, executor="llvm-cpu", backend="iree", needs_mlir=True):
    return {"index": index, "pid": pid, "executor": executor, "backend": backend, "needs_mlir": needs_mlir,
            "compile_def": {"name": executor, "backend": backend, "options": {}}, "layer_ids": [f"L{index}"]}


def test_batches_group_the_partitions_of_each_batching_executor():
    parts = [fake(0, "a"), fake(1, "o1", "ort", "onnxruntime", False), fake(2, "v1", "vmvx"), fake(3, "b"),
             fake(4, "v2", "vmvx"), fake(5, "c"), fake(6, "a"), fake(7, "v3", "vmvx")]
    batches = plan_partition_batches(parts, 2)
    # llvm-cpu: a, b, c (a once) -> [a, b] + [c] (one partition: not batched); vmvx: [v1, v2] + [v3]
    assert [(b["executor"], b["members"], b["kept"]) for b in batches] == [("llvm-cpu", ["a", "b"], False),
                                                                           ("vmvx", ["v1", "v2"], False)]
    assert [p["compile_batch"] for p in parts] == [batches[0]["id"], None, batches[1]["id"], batches[0]["id"],
                                                   batches[1]["id"], None, batches[0]["id"], None]
    assert plan_partition_batches([dict(p) for p in parts], 2) == batches  # stable ids
    # one batch per executor when it holds them all
    assert [len(b["members"]) for b in plan_partition_batches(parts, 32)] == [3, 3]
    # 1: no batches; --debug-ir: each partition's IR goes to its own directory, no batches
    assert plan_partition_batches(parts, 1) == [] and all(p["compile_batch"] is None for p in parts)
    assert plan_partition_batches(parts, 8, debug_ir="/tmp/ir") == []
    with pytest.raises(ValueError):
        plan_partition_batches(parts, 0)
    # partitions of a batch of an earlier run stay in it; the others make new batches
    batches = plan_partition_batches(parts, 8, existing={"a": ("llvm-cpu", "0000-00000000aa"), "v1": ("other", "x")})
    assert [(b["executor"], b["members"], b["kept"]) for b in batches] == [  # in the order of their first member
        ("llvm-cpu", ["a"], True), ("vmvx", ["v1", "v2", "v3"], False), ("llvm-cpu", ["b", "c"], False)]
    assert batches[0]["id"] == "0000-00000000aa"


def chain(path: Path) -> Path:
    """A: Relu(x) -> a; B: Neg(a) -> b; C: Abs(b) -> c; D: Add(c, a) -> d; E: Sigmoid(d) -> y.
    On [llvm, llvm, vmvx, llvm, vmvx]: partition 0 has two outputs (a, b), partition 2
    two inputs (c, a)."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="A"), helper.make_node("Neg", ["a"], ["b"], name="B"),
             helper.make_node("Abs", ["b"], ["c"], name="C"), helper.make_node("Add", ["c", "a"], ["d"], name="D"),
             helper.make_node("Sigmoid", ["d"], ["y"], name="E")]
    onnx.save(make_model(nodes, [tvi("x", TensorProto.FLOAT, [1, 2, 4, 4])], [tvi("y", TensorProto.FLOAT, [1, 2, 4, 4])]),
              path)
    return path


def failing(path: Path) -> Path:
    """A: Relu -> a; B: Cast(a, f64) -> d; C: Abs(d) -> e (f64 in and out: IREE demotes
    f64, the run fails); D: Cast(e, f32) -> f; E: LpPool(f) -> p (IREE 3.13: "failed to
    legalize"); F: Sigmoid(p) -> y."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="A"),
             helper.make_node("Cast", ["a"], ["d"], to=TensorProto.DOUBLE, name="B"),
             helper.make_node("Abs", ["d"], ["e"], name="C"),
             helper.make_node("Cast", ["e"], ["f"], to=TensorProto.FLOAT, name="D"),
             helper.make_node("LpPool", ["f"], ["p"], kernel_shape=[2, 2], name="E"),
             helper.make_node("Sigmoid", ["p"], ["y"], name="F")]
    onnx.save(make_model(nodes, [tvi("x", TensorProto.FLOAT, [1, 2, 4, 4])], [tvi("y", TensorProto.FLOAT, [1, 2, 3, 3])]),
              path)
    return path


def setup(tmp_path: Path, build, executors: str, compile_batch: int, name: str = "full"):
    """Prepare and split the model, plan it with one executor per layer (letters: l =
    llvm-cpu, v = vmvx, o = ort) into ``tmp_path/<name>/partitions``."""
    model, info = prepare_model(build(tmp_path / "m.onnx"))
    if not (tmp_path / "prepared.onnx").exists():
        onnx.save(model, tmp_path / "prepared.onnx")
    man = split_layers(model, info, tmp_path / f"layers_{name}")
    names = {"l": "llvm-cpu", "v": "vmvx", "o": "ort"}
    ops = {layer["layer_id"]: {"recommended_executor": names[e], "executors": {}, "op_type": layer["op_type"]}
           for layer, e in zip(man["layers"], executors)}
    assignment = make_assignment(selection_from_report({"model_name": "m", "ops": ops}, source_file="r.json"))
    full = tmp_path / name
    plan = make_plan(model, man, None, assignment, [LLVM, VMVX, ORT], full / "partitions", compile_batch=compile_batch)
    plan["prepared_model"] = str(tmp_path / "prepared.onnx")
    return plan, full


def compile_plan(plan: dict, full: Path) -> dict:
    """What the rules do: each batch compiled, then each partition's compiled.json."""
    parts = full / "partitions"
    for b in plan["compile_batches"]:
        d = batch_dir(full, b["executor"], b["id"])
        by_pid = {p["pid"]: p for p in plan["partitions"]}
        compile_partition_batch(executor=by_pid[b["members"][0]]["compile_def"], members=batch_members(plan, b["id"]),
                                partitions_dir=parts, out_dir=d, timeout_s=120)
    compiled = {}
    for p in plan["partitions"]:
        kw = dict(pid=p["pid"], model_path=p["model"], executor=p["compile_def"], work_dir=str(parts / p["pid"]),
                  timeout_s=120, log_path=None)
        if p["compile_batch"]:
            d = batch_dir(full, p["executor"], p["compile_batch"])
            compiled[p["pid"]] = compiled_from_batch(batch_info=str(d / "batch.json"), batch_module=str(d / "module.vmfb"),
                                                     **kw)
        else:
            compiled[p["pid"]] = compile_partition(**kw)
    return compiled


def run(plan, full, compiled, tmp_path):
    ref = tmp_path / "ref.npz"
    if not ref.exists():
        compute_reference(tmp_path / "prepared.onnx", ref, {"seed": 3})
    return run_partitions(plan, reference_npz=str(ref), compiled=compiled, tolerance=TOL, timeout_s=120,
                          partitions_dir=full / "partitions")


def test_partition_modules_with_several_inputs_and_outputs_merge(tmp_path):
    plan, full = setup(tmp_path, chain, "llvlv", 8)
    p0, _, p2 = plan["partitions"][:3]
    assert (p0["outputs"], p2["inputs"]) == (["a", "b"], ["c", "a"])
    compile_plan(plan, full)
    texts = {p["pid"]: (full / "partitions" / p["pid"] / "model.mlir").read_text() for p in plan["partitions"]}
    header = texts[p0["pid"]].splitlines()[1]
    assert header.startswith("  func.func @main(%arg0: ") and header.count("!torch.vtensor") == 3  # 1 in, 2 out
    text, spans = merge_modules([(f"p{k}", parse_layer_module(texts[p["pid"]])) for k, p in enumerate(plan["partitions"])])
    assert list(spans) == ["p0", "p1", "p2", "p3"] and text.count("func.func @") == 4


def test_batched_chain_equals_one_partition_compiles(tmp_path):
    one_plan, one_full = setup(tmp_path, chain, "llvlv", 1, "one")
    plan, full = setup(tmp_path, chain, "llvlv", 8)
    assert one_plan["compile_batches"] == [] and [p["pid"] for p in plan["partitions"]] == \
        [p["pid"] for p in one_plan["partitions"]]
    assert [(b["executor"], len(b["members"])) for b in plan["compile_batches"]] == [("llvm-cpu", 2), ("vmvx", 2)]
    one = run(one_plan, one_full, compile_plan(one_plan, one_full), tmp_path)
    compiled = compile_plan(plan, full)
    for c in compiled.values():
        cb = c["compile_batch"]
        assert c["status"] == "ok" and cb["compile_ms_is"] == "share" and cb["members"] == 2
        assert c["artifact"]["info"]["function"].startswith("l_") and c["import_ms"] > 0
        assert c["compile_ms"] == pytest.approx(cb["batch_ms"] / 2, abs=0.01)
    # each partition's own directory holds no module: it runs from its batch's
    assert not list((full / "partitions").glob("*/module.vmfb"))
    res = run(plan, full, compiled, tmp_path)
    assert res["status"] == one["status"] == "success" and res["metrics"] == one["metrics"]
    strip = ("compile_ms", "run_ms", "compile_batch")
    assert [{k: v for k, v in r.items() if k not in strip} for r in res["partitions"]] == \
        [{k: v for k, v in r.items() if k not in strip} for r in one["partitions"]]
    assert all("compile_batch" not in r for r in one["partitions"])
    text = render_full_model_text(full_model_section(res, tolerance=TOL))
    assert "4 of 4 partitions compiled in 2 batch module(s)" in text
    assert "batch module" not in render_full_model_text(full_model_section(one, tolerance=TOL))
    json.dumps(res, allow_nan=False)


def test_an_assignment_change_keeps_the_batches_of_unchanged_partitions(tmp_path):
    plan, full = setup(tmp_path, chain, "llvlv", 8)
    compile_plan(plan, full)
    llvm_batch, vmvx_batch = plan["compile_batches"]
    p_ab = plan["partitions"][0]["pid"]
    # D moves to vmvx: [A, B] keeps its pid and its batch; [C, D, E] is new, alone
    plan2, _ = setup(tmp_path, chain, "llvvv", 8)
    assert [p["pid"] for p in plan2["partitions"]][0] == p_ab and plan2["num_partitions"] == 2
    assert plan2["compile_batches"] == [{"id": llvm_batch["id"], "executor": "llvm-cpu", "members": [p_ab],
                                         "kept": True}]
    assert [p["compile_batch"] for p in plan2["partitions"]] == [llvm_batch["id"], None]
    assert batch_dir(full, "llvm-cpu", llvm_batch["id"]).is_dir()  # kept; the other batch is pruned
    assert not batch_dir(full, "vmvx", vmvx_batch["id"]).exists()
    compiled = compile_plan({**plan2, "compile_batches": []}, full)  # kept batches are not compiled again
    assert compiled[p_ab]["compile_batch"]["compile_ms_is"] == "share"
    assert run(plan2, full, compiled, tmp_path)["status"] == "success"
    # compile_batch 1: no batch kept, every batch directory removed
    plan3, _ = setup(tmp_path, chain, "llvvv", 1)
    assert plan3["compile_batches"] == [] and not list((full / "batches").glob("*/*"))


def without_time(c: dict) -> dict:
    out = {k: v for k, v in c.items() if k not in ("compiled_at", "compile_ms", "import_ms", "compile_batch", "tool")}
    out["failure"] = c.get("failure")
    return out


def test_a_partition_the_batch_cannot_compile_gets_its_one_partition_result(tmp_path):
    # llvm-cpu: A, C (f64), E (LpPool) in one batch; E fails to compile in it
    plan, full = setup(tmp_path, failing, "lolol" + "o", 8)
    one_plan, one_full = setup(tmp_path, failing, "lolol" + "o", 1, "one")
    compiled = compile_plan(plan, full)
    one = compile_plan(one_plan, one_full)
    batch = json.loads((batch_dir(full, "llvm-cpu", plan["compile_batches"][0]["id"]) / "batch.json").read_text())
    assert [m["status"] for m in batch["members"]] == [COMPILED, COMPILED, ALONE]
    lp = plan["partitions"][4]["pid"]
    assert compiled[lp]["status"] == "error" and compiled[lp]["failure"]["stage"] == "compile"
    assert "failed to legalize" in compiled[lp]["failure"]["message"]
    assert compiled[lp]["compile_batch"]["compiled_alone"].startswith("the batch compile failed at this layer")
    # the same compiled.json as a one-partition compile (paths: another directory)
    got = json.loads(json.dumps(without_time(compiled[lp])).replace(str(full), "<full>"))
    assert got == json.loads(json.dumps(without_time(one[lp])).replace(str(one_full), "<full>"))
    res, one_res = run(plan, full, compiled, tmp_path), run(one_plan, one_full, one, tmp_path)
    assert res["status"] == one_res["status"] == "error" and res["failure"]["partition"] == 4
    assert res["failure"]["message"].replace(str(full), "<full>") == one_res["failure"]["message"].replace(
        str(one_full), "<full>")


def test_a_run_failure_from_the_batch_module_is_redone_with_the_partition_alone(tmp_path):
    # llvm-cpu: A and C (f64 in and out) batched; C compiles in the batch and fails at run time
    plan, full = setup(tmp_path, failing, "lolooo", 8)
    one_plan, one_full = setup(tmp_path, failing, "lolooo", 1, "one")
    compiled = compile_plan(plan, full)
    assert all(compiled[p["pid"]]["status"] == "ok" for p in plan["partitions"])
    res, one = run(plan, full, compiled, tmp_path), run(one_plan, one_full, compile_plan(one_plan, one_full), tmp_path)
    assert res["status"] == one["status"] == "error" and res["failure"]["stage"] == one["failure"]["stage"] == "run"
    assert res["failure"]["message"] == one["failure"]["message"] and "l_" not in res["failure"]["message"]
    row = res["partitions"][2]
    assert row["compile_batch"]["compiled_alone"].startswith("its run from the batch's module failed (run)")
    assert row["compile_ms"] > 0


def test_import_failure_and_unavailable_backend_leave_members_alone(tmp_path, monkeypatch):
    plan, full = setup(tmp_path, chain, "llvlv", 8)
    b = plan["compile_batches"][0]
    parts = full / "partitions"
    shutil.copy(parts / b["members"][0] / "model.onnx", tmp_path / "keep.onnx")
    (parts / b["members"][0] / "model.onnx").write_bytes(b"not onnx")
    d = batch_dir(full, b["executor"], b["id"])
    rec = compile_partition_batch(executor=LLVM, members=batch_members(plan, b["id"]), partitions_dir=parts, out_dir=d,
                                  timeout_s=120)
    assert [m["status"] for m in rec["members"]] == [IMPORT_FAILED, COMPILED]
    c = compiled_from_batch(pid=b["members"][0], model_path=str(parts / b["members"][0] / "model.onnx"),
                            executor=LLVM, work_dir=str(parts / b["members"][0]), batch_info=str(d / "batch.json"),
                            batch_module=str(d / "module.vmfb"), timeout_s=120, log_path=None)
    assert c["status"] == "error" and c["failure"]["stage"] == "import"
    bad = {"name": "llvm-cpu", "backend": "no-such-backend", "options": {}}
    rec = compile_partition_batch(executor=bad, members=batch_members(plan, b["id"]), partitions_dir=parts, out_dir=d,
                                  timeout_s=120)
    assert rec["compiled"] == 0 and {m["status"] for m in rec["members"]} == {ALONE}
    assert (d / "module.vmfb").read_bytes() == b"" and json.loads((d / "batch.json").read_text())["compiled"] == 0
