"""Where a one module that differs first differs (fullrun/module/bisect.py; issue 22, item 5):
the extra results of the placement (the values returned, their types, on the default device),
which values are exposed, the first output over tolerance, the first differing layer from given
comparisons, the diagnostic run's outcomes (located, matches once exposed, skipped) with the
compile and run faked, and the record in the verdict, the result schema and the report text.
The real diagnostic module: tests/workflow/test_module_bisect_e2e.py."""

from __future__ import annotations

import jsonschema
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from torq_gen_config.fullrun.report_section import full_model_section, render_full_model_text
from torq_gen_config.fullrun.module import bisect as module_bisect
from torq_gen_config.fullrun.module.bisect import (
    NOTE_FUSION,
    candidate_ops,
    choose_exposed,
    compare_values,
    first_difference,
    first_output_over,
    locate_first_difference,
)
from torq_gen_config.mlir.importer import import_full_model
from torq_gen_config.mlir.placement import place_module
from torq_gen_config.core.schemas import load_schema

TARGETS = {"cpu": '#hal.executable.target<"llvm-cpu", "embedded-elf-x86_64", {target_triple = '
                  '"x86_64-unknown-unknown-eabi-elf"}>',
           "vm": '#hal.executable.target<"vmvx", "vmvx-bytecode-fb">'}
F = TensorProto.FLOAT


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """conv -> relu -> add(relu, sigmoid(conv)): (prepared model path, full.mlir text, node keys, {name: key})."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
             helper.make_node("Add", ["r", "s"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "main", [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", F, [1, 4, 8, 8])], [w])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    d = tmp_path_factory.mktemp("bisect")
    onnx.save(model, d / "small.onnx")
    loc = import_full_model(d / "small.onnx", d / "full.mlir")
    assert loc["status"] == "ok"
    node_keys = [f"{r['line']}:{r['col']}" for r in loc["nodes"]]
    return str(d / "small.onnx"), (d / "full.mlir").read_text(), node_keys, dict(zip([n.name for n in nodes], node_keys))


def _func(text: str):
    from iree.compiler import ir

    module = ir.Module.parse(text, ir.Context())
    func = next(op.operation for op in module.body.operations if op.operation.name == "func.func")
    return module, func, [op.operation for op in func.regions[0].blocks[0].operations]  # module: keeps it alive


def test_extra_results_are_returned_with_their_types_on_the_default_device(small):
    from iree.compiler import ir

    _, text, _, keys = small
    res = place_module(text, {keys["relu"]: "vm"}, TARGETS, default="cpu",
                       extra_results=[keys["relu"], keys["conv"], "1:1"])
    assert [(e["key"], e["result"], e["type"]) for e in res["extra_results"]] == [
        (keys["relu"], 0, "!torch.vtensor<[1,4,8,8],f32>"), (keys["conv"], 0, "!torch.vtensor<[1,4,8,8],f32>")]
    assert list(res["not_exposed"]) == ["1:1"]
    _module, func, ops = _func(res["text"])
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    assert [str(t) for t in ftype.results] == ["!torch.vtensor<[1,4,8,8],f32>"] * 3  # y, then the two values
    ret = ops[-1]
    assert ret.name == "func.return" and len(ret.operands) == 3

    def origin(v):
        """(the op that computes v, the device a transfer on its way puts it on or None)."""
        op, device = v.owner.operation, None
        while op.name in ("torch_c.from_builtin_tensor", "flow.tensor.transfer", "torch_c.to_builtin_tensor"):
            if op.name == "flow.tensor.transfer":
                device = device or str(op.attributes["target"]).split("@")[1].rstrip(">")
            op = op.operands[0].owner.operation
        return op, device

    relu, relu_dev = origin(ret.operands[1])
    conv, conv_dev = origin(ret.operands[2])
    assert str(relu.attributes["name"]) == '"onnx.Relu"' and relu_dev == "device_cpu"  # vmvx's value comes back
    assert str(conv.attributes["name"]) == '"onnx.Conv"' and conv_dev is None  # on the default device already
    # the relu's value is transferred back once: the Add (on cpu) and the return share it
    assert sum(1 for op in ops if op.name == "flow.tensor.transfer") == 2
    assert res["transfers"] == 2


def test_without_extra_results_nothing_changes(small):
    _, text, _, keys = small
    a = place_module(text, {keys["relu"]: "vm"}, TARGETS, default="cpu")
    b = place_module(text, {keys["relu"]: "vm"}, TARGETS, default="cpu", extra_results=[])
    assert a["text"] == b["text"] and a["extra_results"] == [] and a["not_exposed"] == {}


def test_candidates_in_node_order_with_layers_and_executors():
    cands = candidate_ops(["3:1", None, "5:1", "6:1"], {"3:1": "A", "5:1": "B"}, {"5:1": "vm"},
                          [["a"], ["b"], ["c", "c2"], ["d"]], "cpu")
    assert cands == [{"key": "3:1", "layer": "A", "executor": "cpu", "node": 0, "outputs": ["a"]},
                     {"key": "5:1", "layer": "B", "executor": "vm", "node": 2, "outputs": ["c", "c2"]}]


def test_choose_all_below_the_limit_else_boundaries_and_every_nth():
    cands = [{"key": f"{i}:1", "executor": "vm" if 40 <= i < 45 else "cpu"} for i in range(100)]
    chosen, why = choose_exposed(cands, limit=100)
    assert len(chosen) == 100 and why == "all 100 placed ops"
    chosen, why = choose_exposed(cands, limit=20)
    idx = [int(c["key"].split(":")[0]) for c in chosen]
    assert len(idx) <= 20 and idx == sorted(idx) and idx[-1] == 99
    assert {39, 40, 44, 45} <= set(idx)  # the ops on both sides of each device boundary
    assert "device boundaries and every" in why and "of 100" in why


def test_first_difference_is_the_first_over_tolerance_in_order():
    rows = [{"layer": "A", "status": "success"}, {"layer": "B", "status": "success"},
            {"layer": "C", "status": "difference"}, {"layer": "D", "status": "difference"}]
    assert first_difference(rows) == (rows[2], rows[1])
    assert first_difference(rows[:2]) == (None, rows[1])
    assert first_difference([{"layer": "E", "status": "error"}]) == ({"layer": "E", "status": "error"}, None)


def test_compare_values_uses_the_run_compare_and_tolerance():
    rng = np.random.default_rng(0)
    r = {"a": rng.standard_normal(64).astype(np.float32), "b": rng.standard_normal(64).astype(np.float32)}
    actual = {"a": r["a"] + 1e-7, "b": r["b"] + np.float32(0.5)}
    rows = compare_values(actual, r, [{"key": "1:1", "layer": "A", "tensor": "a", "executor": "cpu"},
                                      {"key": "2:1", "layer": "B", "tensor": "b", "executor": "vm"}], {})
    assert [x["status"] for x in rows] == ["success", "difference"]
    assert rows[1]["max_abs_diff"] == pytest.approx(0.5, rel=1e-5) and rows[1]["layer"] == "B"


def test_first_output_over_names_the_first_in_model_order():
    from torq_gen_config.compare import FULL_MODEL_MIN_COSINE, judge

    rng = np.random.default_rng(1)
    ref = {n: rng.standard_normal(32).astype(np.float32) for n in ("o1", "o2", "o3")}
    act = {"o1": ref["o1"], "o2": ref["o2"] * 2, "o3": ref["o3"] + 1}
    _, _, metrics = judge(act, ref, ["o1", "o2", "o3"], {}, min_cosine=FULL_MODEL_MIN_COSINE)
    first = first_output_over(metrics, {})
    assert first["name"] == "o2" and "max rel diff" in first["problem"]
    _, _, ok = judge(ref, ref, ["o1", "o2", "o3"], {})
    assert first_output_over(ok, {}) is None and first_output_over(None, {}) is None


def _ort_values(path: str, x):
    """ONNX Runtime's y, c, r, s of the small model for input x."""
    import onnxruntime as ort

    m = onnx.load(path)
    for t in ("c", "r", "s"):
        m.graph.output.append(onnx.ValueInfoProto(name=t))
    return dict(zip(["y", "c", "r", "s"], ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})))


def _fake_compile_and_run(monkeypatch, small, bad: set[str]) -> dict:
    """compile/run of the diagnostic module faked: the exposed values are ONNX Runtime's, plus 1
    for the tensors ``bad`` (and for the output when any is bad)."""
    from torq_gen_config.fullrun.module import program as one_module

    path, _, _, keys = small
    calls: dict = {}

    def compile_(text, assignment, executors, *, work_dir, timeout_s, split=True, extra_results=None, **kw):
        calls["extra"] = list(extra_results)
        return {"extra_results": [{"key": k, "result": 0, "type": "t"} for k in extra_results]}

    def run_(c, executors, *, inputs, input_names, output_names, work_dir, timeout_s, log_path=None):
        full = _ort_values(path, inputs["x"])
        by_key = {v: k for k, v in keys.items()}
        names = {"conv": "c", "relu": "r", "sig": "s", "add": "y"}
        out = {"y": full["y"] + (1.0 if bad else 0.0)}
        for e, slot in zip(c["extra_results"], output_names[1:]):
            t = names[by_key[e["key"]]]
            out[slot] = (full[t] + 1.0) if t in bad else full[t]
        return out, 12.0

    monkeypatch.setattr(one_module, "compile_one_module", compile_)
    monkeypatch.setattr(one_module, "run_one_module", run_)
    return calls


def _side(small) -> dict:
    _, _, node_keys, keys = small
    return {"assignment": {keys["relu"]: "vm", keys["conv"]: "cpu", keys["sig"]: "cpu", keys["add"]: "cpu"},
            "executors": [{"name": "cpu"}, {"name": "vm"}], "key_layer": {k: n.upper() for n, k in keys.items()},
            "node_keys": node_keys}


def _fake_diagnostic(monkeypatch, small, *, bad: set[str]):
    path = small[0]
    calls = _fake_compile_and_run(monkeypatch, small, bad)
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    y = _ort_values(path, x)["y"]
    return locate_first_difference(mlir_text=lambda wd: "", side=_side(small), prepared_model=path, inputs={"x": x},
                                   input_names=["x"], output_names=["y"], reference_outputs={"y": y},
                                   tolerance={}, work_dir=str(small[0]) + ".diag", timeout_s=10,
                                   ran_on={"RELU": ["vm"]}), calls


def test_from_the_module_plan_side_file_and_reference(monkeypatch, small, tmp_path):
    """module_run.first_difference_of: the plan's side file, full.mlir, reference.npz and the
    module's comparison and read-back reach the diagnostic run (compile and run faked)."""
    from torq_gen_config.compare import judge
    from torq_gen_config.core.fileio import write_json
    from torq_gen_config.fullrun.module.run import first_difference_of
    from torq_gen_config.reference import compute_reference, load_reference

    path, text, _, _ = small
    calls = _fake_compile_and_run(monkeypatch, small, {"s", "y"})
    compute_reference(path, tmp_path / "ref.npz", {"seed": 7})
    (tmp_path / "full.mlir").write_text(text)
    side_file = tmp_path / "parts" / "module-x" / "placement.json"
    side_file.parent.mkdir(parents=True)
    write_json(side_file, {**_side(small), "full_mlir": str(tmp_path / "full.mlir"), "prepared_model": None})
    _, ref, _ = load_reference(tmp_path / "ref.npz")
    _, _, metrics = judge({"y": ref["y"] + 1}, ref, ["y"], {})
    mres = {"status": "difference", "metrics": metrics, "failure": None,
            "module": {"placement": {"layers": {"SIG": {"ran_on": ["cpu"]}}}}}
    plan = {"module": {"pid": "module-x", "model": str(side_file), "inputs": ["x"], "outputs": ["y"]},
            "prepared_model": path}
    first = first_difference_of(plan, mres, reference_npz=str(tmp_path / "ref.npz"), tolerance={}, timeout_s=30,
                                partitions_dir=str(tmp_path / "parts"))
    assert first["output"] == "y" and "max rel diff" in first["output_problem"]
    assert first["status"] == "located" and first["layer"] == "SIG" and first["tensor"] == "s", first
    assert first["executor"] == "cpu" and first["after"] == "RELU" and first["bisect_ms"] > 0
    assert len(calls["extra"]) == 4 and (tmp_path / "parts" / "module-x" / "bisect").is_dir()


def test_located_names_the_first_differing_layer(monkeypatch, small):
    rec, calls = _fake_diagnostic(monkeypatch, small, bad={"r", "y"})
    assert calls["extra"] == small[2]  # every placed op, in node order
    assert rec["status"] == "located" and rec["layer"] == "RELU" and rec["tensor"] == "r"
    assert rec["executor"] == "vm" and rec["after"] == "CONV"
    assert rec["note"] == "first differing layer: RELU (max |diff| 1), on vm"
    assert rec["num_exposed"] == 4 and rec["num_over_tolerance"] == 2 and rec["run_ms"] == 12.0
    assert [v["status"] for v in rec["values"]] == ["success", "difference", "success", "difference"]


def test_matching_once_exposed_is_said_honestly(monkeypatch, small):
    rec, _ = _fake_diagnostic(monkeypatch, small, bad=set())
    assert rec["status"] == "not located" and rec["note"] == NOTE_FUSION and rec["layer"] is None


def test_too_many_bytes_is_skipped_before_any_compile(monkeypatch, small):
    monkeypatch.setattr(module_bisect, "reference_values", lambda *a, **k: pytest.fail("reference ran"))
    path, _, node_keys, _ = small
    side = {"assignment": {k: "cpu" for k in node_keys}, "executors": [{"name": "cpu"}],
            "key_layer": {k: "L" for k in node_keys}, "node_keys": node_keys}
    rec = locate_first_difference(mlir_text=lambda wd: pytest.fail("compiled"), side=side, prepared_model=path,
                                  inputs={}, input_names=["x"], output_names=["y"], reference_outputs={},
                                  tolerance={}, work_dir="unused", timeout_s=1, max_bytes=100)
    assert rec["status"] == "skipped" and "MiB" in rec["note"] and rec["note"].startswith("not located")


def test_a_module_that_failed_to_compile_is_skipped():
    res = module_bisect.bisect_module({"module": {"pid": "m"}}, {"status": "error", "failure": {
        "stage": "crash", "during": "compile"}}, side=None, reference_npz="unused", tolerance={}, timeout_s=1,
        partitions_dir="p", mlir_text=lambda wd: "")
    assert res["status"] == "skipped" and "failed to compile" in res["note"] and res["output"] is None


FIRST = {"status": "located", "output": "y2", "output_problem": "output 'y2': max rel diff 3.0e-01 > fp_max_tol",
         "layer": "B", "key": "4:10", "tensor": "b_out", "max_abs_diff": 0.33, "executor": "vmvx", "after": "A",
         "note": "first differing layer: B (max |diff| 0.33), on vmvx", "selection": "all 3 placed ops",
         "num_candidates": 3, "num_exposed": 3, "num_over_tolerance": 2, "compile_ms": 2100.0, "run_ms": 40.0,
         "reference_ms": 3.0, "bisect_ms": 2200.0,
         "values": [{"layer": "A", "tensor": "a_out", "status": "success", "max_abs_diff": 1e-7},
                    {"layer": "B", "tensor": "b_out", "status": "difference", "max_abs_diff": 0.33}]}


def test_the_verdict_result_and_report_name_the_first_difference(monkeypatch):
    from test_module_mode import _module_result
    from torq_gen_config.fullrun.module import run as module_run

    module_res = {**_module_result(), "status": "difference", "summary": "output 'y2': ... (+1 more problem)"}
    module_res["module"] = {**module_res["module"], "status": "difference"}
    part_res = {**_module_result(mode="partitions"), "summary": "partitions"}
    part_res.pop("module")
    part_res.pop("verdict")
    monkeypatch.setattr(module_run, "run_module", lambda plan, **kw: dict(module_res))
    monkeypatch.setattr(module_run, "run_partitions", lambda plan, **kw: dict(part_res))
    seen = {}
    monkeypatch.setattr(module_run, "bisect_module", lambda plan, mres, **kw: seen.update(kw, mres=mres) or FIRST)
    plan = {"mode": "module", "module": {"pid": "module-0123456789ab"}, "partitions": [{"pid": "a"}]}
    res = module_run.run_module_plan(plan, reference_npz="r.npz", compiled={}, tolerance={}, timeout_s=1,
                                     partitions_dir="p", compile_partition=lambda p: {})
    assert seen["mres"]["status"] == "difference" and seen["side"] is None  # no placement.json here
    assert res["module"]["first_difference"] == FIRST
    assert res["verdict"].endswith("; first differing output: 'y2'; first differing layer: B (max |diff| 0.33), "
                                   "on vmvx")
    jsonschema.validate(res, load_schema("full_result.schema.yaml"))
    text = render_full_model_text(full_model_section(res, tolerance={}))
    assert "  First differing output: y2 (output 'y2': max rel diff" in text
    assert ("  First differing layer: B (max |diff| 0.33), on vmvx; tensor b_out [diagnostic module: 3 value(s) "
            "exposed (all 3 placed ops), compile 2.10 s, run 40.0 ms]") in text


def test_partitions_that_differ_too_get_no_bisect(monkeypatch):
    from test_module_mode import _module_result
    from torq_gen_config.fullrun.module import run as module_run

    module_res = {**_module_result(), "status": "difference"}
    part_res = {**_module_result(mode="partitions"), "status": "difference"}
    part_res.pop("module")
    monkeypatch.setattr(module_run, "run_module", lambda plan, **kw: dict(module_res))
    monkeypatch.setattr(module_run, "run_partitions", lambda plan, **kw: dict(part_res))
    monkeypatch.setattr(module_run, "bisect_module", lambda *a, **k: pytest.fail("bisected"))
    res = module_run.run_module_plan({"mode": "module", "module": {"pid": "m"}, "partitions": [{"pid": "a"}]},
                                     reference_npz="r", compiled={}, tolerance={}, timeout_s=1, partitions_dir="p",
                                     compile_partition=lambda p: {})
    assert "first_difference" not in res["module"] and "differ from the reference too" in res["verdict"]


@pytest.mark.parametrize("fd,line", [
    ({"status": "not located", "output": "y", "note": NOTE_FUSION, "compile_ms": 900.0, "run_ms": 20.0,
      "num_exposed": 5, "selection": "all 5 placed ops"},
     "  First differing layer not located: with the intermediate values exposed the module matches"),
    ({"status": "failed", "output": None, "note": "not located: the diagnostic module (values exposed) failed to "
                                                   "compile: crash: iree-compile crashed: killed by SIGSEGV"},
     "  First differing layer not located: the diagnostic module (values exposed) failed to compile: crash"),
])
def test_report_lines_of_a_layer_not_located(fd, line):
    from torq_gen_config.fullrun.report_section import first_difference_lines

    lines = first_difference_lines(fd)
    assert any(x.startswith(line) for x in lines), lines
    assert ("  First differing output: y" in lines) == bool(fd["output"])
