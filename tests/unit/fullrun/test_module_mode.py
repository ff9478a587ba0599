"""Module mode of the full-model run (fullrun/module/mode.py, module_run.py; issue 22 phase
2): the mode decision (auto, module forced, partitions), the If/Loop rule, the line:col
assignment, the fingerprint, and the full_model section of a synthetic module run in
the result schema, the report text (`view`), the HTML report and the graph panel."""

from __future__ import annotations

import jsonschema
import pytest

from torq_gen_config.core.errors import ConfigError
from torq_gen_config.fullrun.report_section import full_model_section, render_full_model_text
from torq_gen_config.fullrun.module.mode import (
    decide_run_mode,
    module_fingerprint,
    placement_assignment,
    region_conflicts,
)
from torq_gen_config.fullrun.module.run import layer_placement
from torq_gen_config.core.schemas import load_schema

EXECUTORS = [{"name": "llvm-cpu", "backend": "iree", "options": {"target": "llvm-cpu"}},
             {"name": "vmvx", "backend": "iree", "options": {"target": "vmvx"}},
             {"name": "ort", "backend": "onnxruntime", "options": {}}]


def test_auto_all_iree_local_is_module():
    mode, why = decide_run_mode("auto", ["llvm-cpu", "vmvx"], EXECUTORS)
    assert mode == "module" and "auto" in why and "llvm-cpu, vmvx" in why


def test_auto_with_ort_is_partitions_with_the_reason():
    mode, why = decide_run_mode("auto", ["llvm-cpu", "ort"], EXECUTORS)
    assert mode == "partitions"
    assert "'ort'" in why and "onnxruntime" in why and "IREE executors only" in why


def test_partitions_asked_for():
    assert decide_run_mode("partitions", ["llvm-cpu"], EXECUTORS)[0] == "partitions"


def test_module_forced_impossible_is_a_one_line_error():
    with pytest.raises(ConfigError) as e:
        decide_run_mode("module", ["llvm-cpu", "ort"], EXECUTORS)
    assert "--run-mode module is impossible" in str(e.value) and "'ort'" in str(e.value)
    assert "\n" not in str(e.value)


def test_if_with_body_ops_elsewhere_is_partitions_with_the_reason():
    regions = {"5:10": ["6:12", "7:12"], "20:3": ["21:5"]}
    assignment = {"5:10": "llvm-cpu", "6:12": "vmvx", "7:12": "llvm-cpu", "20:3": "vmvx", "21:5": "vmvx"}
    conflicts = region_conflicts(regions, assignment)
    assert conflicts == ["5:10 (on llvm-cpu) has body ops on vmvx (6:12)"]
    mode, why = decide_run_mode("auto", ["llvm-cpu", "vmvx"], EXECUTORS, region_conflicts_found=conflicts)
    assert mode == "partitions" and "body ops" in why and "5:10" in why
    with pytest.raises(ConfigError, match="body ops"):
        decide_run_mode("module", ["llvm-cpu", "vmvx"], EXECUTORS, region_conflicts_found=conflicts)
    assert region_conflicts({"20:3": ["21:5"]}, assignment) == []  # a body that follows its op


def test_cuda_executor_without_a_gpu_is_unavailable(monkeypatch):
    from torq_gen_config.backends import iree

    monkeypatch.setattr(iree.IreeBackend, "unavailable_reason", lambda self, timeout_s=60.0: "no cuda device: none")
    cuda = {"name": "gpu", "backend": "iree", "options": {"target": "cuda", "device": "cuda"}}
    mode, why = decide_run_mode("auto", ["llvm-cpu", "gpu"], [*EXECUTORS, cuda])
    assert mode == "partitions" and "unavailable" in why and "'gpu'" in why


def test_cuda_executor_with_its_gpu_joins_the_module(monkeypatch):
    from torq_gen_config.backends import iree

    monkeypatch.setattr(iree.IreeBackend, "unavailable_reason", lambda self, timeout_s=60.0: None)
    cuda = {"name": "gpu", "backend": "iree", "options": {"target": "cuda", "device": "cuda"}}
    mode, why = decide_run_mode("auto", ["llvm-cpu", "gpu"], [*EXECUTORS, cuda])
    assert mode == "module" and "gpu shares the module with CPU devices through a stream.topology" in why
    assert decide_run_mode("module", ["gpu"], [*EXECUTORS, cuda])[0] == "module"


def test_placement_assignment_every_node_of_a_layer_and_compiler_keys_on_top():
    layers = [{"layer_id": "A", "prepared_node_indices": [0, 1]}, {"layer_id": "B", "prepared_node_indices": [2]}]
    locations = {"nodes": [{"line": 3, "col": 10, "verified": True}, {"line": 4, "col": 10, "verified": True},
                           {"line": 5, "col": 10, "verified": True}]}
    keys, key_layer = placement_assignment(layers, {"A": "vmvx", "B": "llvm-cpu"}, locations)
    assert keys == {"3:10": "vmvx", "4:10": "vmvx", "5:10": "llvm-cpu"}
    assert key_layer == {"3:10": "A", "4:10": "A", "5:10": "B"}
    keys, _ = placement_assignment(layers, {"A": "vmvx", "B": "llvm-cpu"}, locations, {"4:10": "llvm-cpu"})
    assert keys["4:10"] == "llvm-cpu"


def test_fingerprint_changes_with_what_the_compile_reads():
    a = module_fingerprint("d", {"3:10": "vmvx"}, EXECUTORS[:2], "3.13")
    assert a == module_fingerprint("d", {"3:10": "vmvx"}, EXECUTORS[:2], "3.13")
    assert a != module_fingerprint("d", {"3:10": "llvm-cpu"}, EXECUTORS[:2], "3.13")
    assert a != module_fingerprint("d", {"3:10": "vmvx"}, EXECUTORS[:2], "3.14")
    run_only = [{**e, "options": {**e["options"], "run_flags": ["--task_topology_max_group_count=1"],
                                  "device": "local-sync"}} for e in EXECUTORS[:2]]
    assert a == module_fingerprint("d", {"3:10": "vmvx"}, run_only, "3.13")  # a runtime option: no recompile
    flags = [{**e, "options": {**e["options"], "compile_flags": ["--iree-opt-level=O3"]}} for e in EXECUTORS[:2]]
    assert a != module_fingerprint("d", {"3:10": "vmvx"}, flags, "3.13")


def _module_result(status="success", mode="module"):
    """A synthetic result.json of a module run (or, mode partitions, of the partitions run after it)."""
    record = {"ops": {"3:10": {"assigned": "vmvx", "ran_on": ["vmvx"], "status": "as assigned"},
                      "4:10": {"assigned": "vmvx", "ran_on": ["llvm-cpu", "vmvx"], "status": "elsewhere"},
                      "5:10": {"assigned": "llvm-cpu", "ran_on": [], "status": "no kernel"}},
              "elsewhere": ["4:10"], "two_backends": {"main_dispatch_3": ["embedded_elf_x86_64", "vmvx_bytecode_fb"]}}
    placement = layer_placement(record, {"3:10": "A", "4:10": "B", "5:10": "C"}, {"A": "vmvx", "B": "vmvx", "C": "llvm-cpu"})
    module = {"pid": "module-0123456789ab", "status": status, "summary": "s", "compile_ms": 2015.0, "run_ms": 15.0,
              "transfers": 2, "devices": [{"executor": "vmvx", "ordinal": 0, "device": "local-sync"},
                                          {"executor": "llvm-cpu", "ordinal": 1, "device": "local-task"}],
              "shared_executables": 1, "unplaced": {}, "placement": placement}
    return {"schema": "torq-gen-config/full-model-result/1", "mode": mode, "mode_reason": "run mode module: why",
            "status": "success", "summary": "all 4 elements within tolerance", "tolerance_used": {},
            "metrics": None, "num_over_tolerance": 0, "share_over_tolerance": 0.0, "failure": None,
            "source": "report", "source_file": "r.json", "options": {}, "num_partitions": 1,
            "partitions": [{"index": 0, "pid": module["pid"], "executor": "module", "backend": "module",
                            "first_node": 0, "last_node": 2, "num_nodes": 3, "layer_ids": ["A", "B", "C"],
                            "compile_ms": 2015.0, "run_ms": 15.0, "status": "ran", "partition_check": None}],
            "timing": {"compile_ms_total": 2015.0, "run_ms_total": 15.0, "wall_ms": 20.0},
            "reference": {"status": "ok"}, "fallbacks": [], "warnings": [],
            "layer_executors": {"A": "vmvx", "B": "vmvx", "C": "llvm-cpu"}, "generated_at": "now", "module": module,
            **({"verdict": "one module differs from the reference, partitions pass: the failure is in compiling the "
                           "assignment as one program"} if mode == "partitions" else {})}


def test_layer_placement_per_layer():
    p = _module_result()["module"]["placement"]
    assert p["layers"]["A"] == {"assigned": "vmvx", "ran_on": ["vmvx"], "status": "as assigned"}
    assert p["layers"]["B"]["status"] == "elsewhere" and p["elsewhere"] == ["B"]
    assert p["layers"]["C"]["status"] == "no kernel"
    assert p["counts"] == {"as assigned": 1, "elsewhere": 1, "no kernel": 1}


@pytest.mark.parametrize("mode", ["module", "partitions"])
def test_result_schema_section_and_text(mode):
    result = _module_result(status="success" if mode == "module" else "difference", mode=mode)
    jsonschema.validate(result, load_schema("full_result.schema.yaml"))
    section = full_model_section(result, tolerance={}, result_file="work/x/full/result.json")
    assert section["mode"] == mode and section["mode_reason"] == "run mode module: why"
    assert section["placement"]["elsewhere"] == ["B"]
    text = render_full_model_text(section)
    assert f"Mode: {mode} (run mode module: why)" in text
    assert "Placement (read back from the compiled program): as assigned: 1, elsewhere: 1, no kernel: 1" in text
    assert "RAN ELSEWHERE: B: assigned vmvx, ran on llvm-cpu, vmvx" in text
    assert "TWO BACKENDS: executable main_dispatch_3" in text
    assert "compile 2.02 s, run 15.0 ms" in text
    if mode == "partitions":
        assert "Verdict: one module differs" in text and "Partitions:" in text


def test_html_and_graph_panel_show_the_placement():
    from torq_gen_config.report.graph import full_run_placement
    from torq_gen_config.report.html import _full_model

    section = full_model_section(_module_result(), tolerance={})
    report = {"full_model": section, "ops": {}}
    html = _full_model(report)
    assert "run mode module: why" in html and "RAN ELSEWHERE" in html and "TWO BACKENDS" in html
    assert "placement (read back)" in html
    panel = full_run_placement(report)
    assert panel["B"]["placement"] == "elsewhere" and panel["B"]["ran_on"] == ["llvm-cpu", "vmvx"]


@pytest.mark.parametrize("partitions_status", ["success", "difference"])
def test_a_module_that_differs_runs_the_partitions_and_keeps_both(monkeypatch, partitions_status):
    from torq_gen_config.fullrun.module import run as module_run

    module_res = {**_module_result(), "status": "difference", "summary": "3 of 4 elements over tolerance"}
    module_res["module"] = {**module_res["module"], "status": "difference"}
    part_res = {**_module_result(mode="partitions"), "status": partitions_status, "summary": "partitions"}
    part_res.pop("module")
    part_res.pop("verdict")
    monkeypatch.setattr(module_run, "run_module", lambda plan, **kw: dict(module_res))
    seen = []
    monkeypatch.setattr(module_run, "run_partitions", lambda plan, **kw: seen.append(plan) or dict(part_res))
    compiled = []
    plan = {"mode": "module", "mode_reason": "auto: one module", "module": {"pid": "module-0123456789ab"},
            "partitions": [{"pid": "a"}, {"pid": "b"}]}
    res = module_run.run_module_plan(plan, reference_npz="r.npz", compiled={}, tolerance={}, timeout_s=1,
                                     partitions_dir="p", compile_partition=lambda p: compiled.append(p["pid"]) or {})
    assert compiled == ["a", "b"] and res["mode"] == "partitions" and res["status"] == partitions_status
    assert seen[0]["mode"] == "partitions" and "module" not in seen[0]  # the chain, run as a partitions plan
    assert res["module"]["status"] == "difference" and res["module"]["placement"]["elsewhere"] == ["B"]
    assert "the module differs from the reference" in res["mode_reason"] and "so the partitions ran" in res["mode_reason"]
    if partitions_status == "success":
        assert "compiling the assignment as one program" in res["verdict"] and "transfers" in res["verdict"]
    else:
        assert "partitions differ from the reference too" in res["verdict"]
    section = full_model_section(res, tolerance={})
    assert section["module"]["status"] == "difference" and section["verdict"] == res["verdict"]
    jsonschema.validate(res, load_schema("full_result.schema.yaml"))


def test_a_module_that_matches_is_the_result(monkeypatch):
    from torq_gen_config.fullrun.module import run as module_run

    monkeypatch.setattr(module_run, "run_module", lambda plan, **kw: _module_result())
    monkeypatch.setattr(module_run, "run_partitions", lambda plan, **kw: pytest.fail("partitions ran"))
    res = module_run.run_module_plan({"mode": "module", "module": {"pid": "m"}, "partitions": [{"pid": "a"}]},
                                     reference_npz="r",
                                     compiled={}, tolerance={}, timeout_s=1, partitions_dir="p",
                                     compile_partition=lambda p: pytest.fail("compiled"))
    assert res["mode"] == "module" and "verdict" not in res


def test_region_keys_of_an_imported_if(tmp_path):
    """The If's body ops are found under its key in full.mlir (the importer's real output)."""
    import onnx
    from onnx import TensorProto, helper

    from torq_gen_config.fullrun.module.mode import region_keys_of
    from torq_gen_config.mlir.importer import import_full_model

    f = TensorProto.FLOAT
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [helper.make_tensor_value_info("t", f, [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", f, [2])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [2])],
                              [helper.make_tensor_value_info("y", f, [2])],
                              [onnx.numpy_helper.from_array(__import__("numpy").zeros((), "float32"), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "if.onnx")
    loc = import_full_model(tmp_path / "if.onnx", tmp_path / "full.mlir")
    assert loc["status"] == "ok", loc["message"]
    if_key = f"{loc['nodes'][2]['line']}:{loc['nodes'][2]['col']}"
    regions = region_keys_of(tmp_path / "full.mlir")
    assert if_key in regions and regions[if_key]
    conflicts = region_conflicts(regions, {if_key: "llvm-cpu", regions[if_key][0]: "vmvx"})
    assert conflicts and if_key in conflicts[0]


def test_a_runtime_option_keeps_the_partition_ids():
    """--runtime-option adds run_flags (and an empty compile_flags list): the partitions'
    compile definitions, hence their ids, stay the same (found by a fresh-user test)."""
    from torq_gen_config.fullrun.partition import compile_definition, partition_id

    plain = {"name": "llvm-cpu", "backend": "iree", "options": {"target": "llvm-cpu"}}
    with_option = {"name": "llvm-cpu", "backend": "iree",
                   "options": {"target": "llvm-cpu", "compile_flags": [], "device": "local-sync",
                               "run_flags": ["--task_topology_group_count=1"]}}
    assert compile_definition(with_option) == compile_definition(plain)
    assert partition_id(b"m", compile_definition(with_option), None) == partition_id(b"m", compile_definition(plain), None)
    flags = {**plain, "options": {**plain["options"], "compile_flags": ["--iree-opt-level=O3"]}}
    assert partition_id(b"m", compile_definition(flags), None) != partition_id(b"m", compile_definition(plain), None)


# --- issue 38: a module whose outputs match while layers ran elsewhere is not plain success


def test_judge_placement_names_the_layers_that_ran_elsewhere():
    from torq_gen_config.fullrun.common import NOT_AS_ASSIGNED
    from torq_gen_config.fullrun.module.run import judge_placement

    res = judge_placement(_module_result())
    assert res["status"] == NOT_AS_ASSIGNED and res["module"]["status"] == NOT_AS_ASSIGNED
    assert "1 of 3 layer(s) ran elsewhere than assigned: B (assigned vmvx, ran on llvm-cpu, vmvx)" in res["summary"]
    jsonschema.validate(res, load_schema("full_result.schema.yaml"))
    # a difference stays a difference; every layer as assigned (or without a kernel) stays success
    assert judge_placement({**_module_result(), "status": "difference"})["status"] == "difference"
    clean = _module_result()
    clean["module"]["placement"] = layer_placement(
        {"ops": {"3:10": {"assigned": "vmvx", "ran_on": ["vmvx"], "status": "as assigned"},
                 "5:10": {"assigned": "llvm-cpu", "ran_on": [], "status": "no kernel"}}},
        {"3:10": "A", "5:10": "C"}, {"A": "vmvx", "C": "llvm-cpu"})
    assert judge_placement(clean)["status"] == "success"


@pytest.mark.parametrize("run_mode", ["auto", "module"])
def test_not_as_assigned_falls_back_to_partitions_only_under_auto(monkeypatch, run_mode):
    from torq_gen_config.commands.run import run_exit_status
    from torq_gen_config.fullrun.module import run as module_run
    from torq_gen_config.fullrun.common import NOT_AS_ASSIGNED

    mres = module_run.judge_placement(_module_result())
    part_res = {**_module_result(mode="partitions"), "status": "success", "summary": "partitions"}
    part_res.pop("module")
    part_res.pop("verdict")
    monkeypatch.setattr(module_run, "run_module", lambda plan, **kw: dict(mres))
    monkeypatch.setattr(module_run, "run_partitions", lambda plan, **kw: dict(part_res))
    plan = {"mode": "module", "run_mode": run_mode, "mode_reason": f"{run_mode}: one module",
            "module": {"pid": "m"}, "partitions": [{"pid": "a"}]}
    res = module_run.run_module_plan(plan, reference_npz="r", compiled={}, tolerance={}, timeout_s=1,
                                     partitions_dir="p", compile_partition=lambda p: {})
    section = full_model_section(res, tolerance={})
    text = render_full_model_text(section)
    if run_mode == "module":  # asked for: the verdict, exit 1
        assert res["mode"] == "module" and section["status"] == NOT_AS_ASSIGNED
        assert f"Status: {NOT_AS_ASSIGNED}" in text and "ran elsewhere than assigned: B" in text
        assert run_exit_status(section) == 1
    else:  # auto: the partitions keep the assignment; the reason says why they ran
        assert res["mode"] == "partitions" and section["status"] == "success"
        assert "did not keep the assignment" in res["mode_reason"] and "partitions ran" in res["mode_reason"]
        assert section["module"]["status"] == NOT_AS_ASSIGNED and "verdict" not in res
        assert f"One module: {NOT_AS_ASSIGNED}" in text
        assert run_exit_status(section) == 0
    jsonschema.validate(res, load_schema("full_result.schema.yaml"))


def test_not_as_assigned_in_the_html_is_a_caution():
    from torq_gen_config.core.statuses import DIFFERENCE, HTML_COLORS
    from torq_gen_config.fullrun.module.run import judge_placement
    from torq_gen_config.report.html import _full_model

    section = full_model_section(judge_placement(_module_result()), tolerance={})
    html = _full_model({"full_model": section, "ops": {}})
    assert "success, not as assigned" in html and HTML_COLORS[DIFFERENCE] in html


def test_run_exit_status():
    from torq_gen_config.commands.run import run_exit_status

    assert run_exit_status({"status": "success"}) == 0
    assert run_exit_status({"status": "difference"}) == 1
    assert run_exit_status({"status": "success", "mode": "partitions", "module": {"status": "difference"}}) == 1
    assert run_exit_status({"status": "success", "mode": "module", "module": {"status": "success"}}) == 0
