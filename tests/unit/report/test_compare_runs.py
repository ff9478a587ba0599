"""``torq-gen-config compare OLD NEW`` (report/diff.py, cli/compare.py; issue 39 item 2):
verdicts matched by model, layer and executor, grouped as regressions, changes, fixes and
additions; layers and executors added or removed; a changed model file said; differing
versions and options; directories of reports (a sweep); exit 1 on a regression only;
--json; the Model Explorer overlay loads into Model Explorer's own builder and names nodes
of the adapter's graph."""

from __future__ import annotations

import copy
import json

import pytest
from conftest import cli_in_process
from onnx import TensorProto as T
from onnx import helper as h

from conftest import make_model, tvi
from sample_report import _err, _ok
from torq_gen_config.core.errors import ReportError
from torq_gen_config.report.diff import KIND_COLORS, compare_sides, diff_reports, load_side, render_text

from test_model_explorer import adapter_graphs, load_with_builder, make_report


def _model():
    nodes = [h.make_node("Relu", ["x"], ["a"]), h.make_node("Neg", ["a"], ["b"]), h.make_node("Sigmoid", ["b"], ["y"])]
    return make_model(nodes, [tvi("x", T.FLOAT, [2])], [tvi("y", T.FLOAT, [2])], name="main")


def _pair():
    """(old, new) reports of the same model: on the new side llvm-cpu regresses on Neg_b
    (success -> error), vmvx is fixed on Neg_b, ort changes error -> difference on
    Sigmoid_y... as built below."""
    old = make_report(_model())
    new = copy.deepcopy(old)
    ops_o, ops_n = old["ops"], new["ops"]
    ops_o["Neg_b"]["executors"]["llvm-cpu"] = _ok(1e-6)
    ops_n["Neg_b"]["executors"]["llvm-cpu"] = _err("compile", "new compiler crashes")
    ops_o["Neg_b"]["executors"]["vmvx"] = _err("run", "trap")
    ops_n["Neg_b"]["executors"]["vmvx"] = _ok(1e-6)
    ops_o["Sigmoid_y"]["executors"]["ort"] = _err("run", "x")
    ops_n["Sigmoid_y"]["executors"]["ort"] = _ok(0.5)  # a difference
    for r, sha in ((old, "a" * 64), (new, "a" * 64)):
        r["provenance"] = {"model": {"sha256": sha}, "versions": {"iree-base-compiler": "3.13.0", "onnx": "1.23.2"},
                           "options": {"model": "/x/m.onnx", "output_dir": ".", "timeout_s": 300}}
    new["provenance"]["versions"]["iree-base-compiler"] = "3.14.0"
    new["provenance"]["options"]["model"] = "/elsewhere/m.onnx"  # where, not how: not a difference
    return old, new


def test_kinds_of_change():
    old, new = _pair()
    d = diff_reports(old, new)
    got = {(c["layer"], c["executor"]): (c["old"], c["new"], c["kind"]) for c in d["changes"]}
    assert got == {("Neg_b", "llvm-cpu"): ("success", "error", "regression"),
                   ("Neg_b", "vmvx"): ("error", "success", "fix"),
                   ("Sigmoid_y", "ort"): ("error", "difference", "changed")}
    assert d["counts"] == {"regression": 1, "changed": 1, "fix": 1, "added": 0}
    assert d["model_changed"] is False and d["layers_added"] == d["layers_removed"] == []
    reg = next(c for c in d["changes"] if c["kind"] == "regression")
    assert reg["summary"] == "new compiler crashes" and reg["op_type"] == "Neg"


def test_layers_and_executors_added_or_removed_and_a_changed_model():
    old, new = _pair()
    old["ops"]["Sigmoid_y"]["executors"]["vmvx"] = _ok(1e-6)
    del new["ops"]["Relu_a"]
    new["ops"]["Tanh_z"] = copy.deepcopy(old["ops"]["Sigmoid_y"])
    for op in new["ops"].values():  # vmvx no longer run; its successes are regressions
        op["executors"].pop("vmvx", None)
    new["executors"] = [e for e in new["executors"] if e != "vmvx"]
    new["provenance"]["model"]["sha256"] = "b" * 64
    d = diff_reports(old, new)
    assert d["layers_removed"] == ["Relu_a"] and d["layers_added"] == ["Tanh_z"]
    assert d["executors_removed"] == ["vmvx"] and d["model_changed"] is True
    gone = [c for c in d["changes"] if c["executor"] == "vmvx"]
    # a success that is gone is a regression; an error that is gone is no change
    assert [(c["layer"], c["kind"], c["old"], c["new"]) for c in gone] == [("Sigmoid_y", "regression", "success", None)]


def test_sides_from_directories_and_text(tmp_path):
    old, new = _pair()
    for side, rep in (("before", old), ("after", new)):
        (tmp_path / side / "m").mkdir(parents=True)
        (tmp_path / side / "m" / "torq_gen_config_m.json").write_text(json.dumps({**rep, "model_name": "m"}))
        (tmp_path / side / "m" / "torq_gen_config_m_compiler.json").write_text('{"op_assignments": {}}')
    other = {**copy.deepcopy(old), "model_name": "only_old"}
    (tmp_path / "before" / "torq_gen_config_only_old.json").write_text(json.dumps(other))
    result = compare_sides(load_side(tmp_path / "before"), load_side(tmp_path / "after"))
    assert result["regressions"] == 1 and result["models_removed"] == ["only_old"]
    m = result["models"]["m"]
    assert m["versions"] == {"iree-base-compiler": ["3.13.0", "3.14.0"]} and m["options"] == {}
    text = render_text(result)
    assert "== m: same model file; regression 1, changed 1, fix 1, added 0" in text
    assert "Neg_b (Neg) on llvm-cpu: success -> error: new compiler crashes" in text
    assert "version iree-base-compiler: 3.13.0 -> 3.14.0" in text
    assert "== only_old: model removed" in text and text.rstrip().endswith("models removed: only_old")


def test_bad_sides_are_one_line_errors(tmp_path):
    with pytest.raises(ReportError, match="no such report JSON or directory"):
        load_side(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="no report JSON"):
        load_side(tmp_path / "empty")
    old, _ = _pair()
    for sub in ("a", "b"):
        (tmp_path / "dup" / sub).mkdir(parents=True)
        (tmp_path / "dup" / sub / "torq_gen_config_m.json").write_text(json.dumps({**old, "model_name": "m"}))
    with pytest.raises(ReportError, match="two reports of model 'm'"):
        load_side(tmp_path / "dup")


def test_cli_exit_status_json_and_model_explorer(tmp_path, capsys):
    import onnx

    old, new = _pair()
    paths = {}
    onnx.save(_model(), tmp_path / "m.onnx")
    for side, rep in (("old", old), ("new", new)):
        rep["provenance"]["model"]["source"] = str(tmp_path / "m.onnx")
        paths[side] = tmp_path / f"torq_gen_config_m_{side}.json"
        paths[side].write_text(json.dumps({**rep, "model_name": "m"}))
    r = cli_in_process(capsys, "compare", paths["old"], paths["new"], "--json", tmp_path / "c.json",
                       "--model-explorer", tmp_path / "me")
    assert r.returncode == 1, r.stderr  # a regression
    assert "REGRESSION (1):" in r.stdout and json.loads((tmp_path / "c.json").read_text())["regressions"] == 1
    overlay = tmp_path / "me" / "m" / "changes.json"
    data = load_with_builder(overlay, numeric=False)
    ids = {n.id for g in adapter_graphs(tmp_path / "m.onnx") for n in g.nodes}
    results = next(iter(data.graphsData.values())).results
    assert set(results) <= ids and len(results) == 2  # Neg_b and Sigmoid_y
    neg = next(v for v in results.values() if "llvm-cpu success -> error" in v.value)
    assert neg.bgColor == KIND_COLORS["regression"]
    # no regression: exit 0
    r = cli_in_process(capsys, "compare", paths["old"], paths["old"])
    assert r.returncode == 0 and "Total: regression 0, changed 0, fix 0, added 0" in r.stdout
    # a compiler JSON given as a side: one line, exit 2
    comp = tmp_path / "torq_gen_config_m_compiler.json"
    comp.write_text('{"op_assignments": {}}')
    r = cli_in_process(capsys, "compare", comp, paths["new"])
    assert r.returncode == 2 and "compiler JSON" in r.stderr
