"""Model Explorer overlays (torq_gen_config.report.model_explorer, ``report --model-explorer``)
checked against the real packages: every file written loads into
``model_explorer.node_data_builder`` (ModelNodeData of GraphNodeData, through dacite,
Model Explorer's own dependency, strictly: no unknown field), and every key is a node id of
the model's main graph as Model Explorer's ONNX adapter (``model_explorer_onnx``) converts
it, on models with unnamed nodes, repeated names, If/Loop bodies, folded constants."""

from __future__ import annotations

import json
from pathlib import Path

import dacite
import numpy as np
import onnx
import pytest
from model_explorer import node_data_builder as ndb
from model_explorer_onnx.main import ONNXAdapter
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from conftest import folding_model, make_model, tvi
from sample_report import EXECUTORS, TOL, _err, _ok
from torq_gen_config.cli.main import main
from torq_gen_config.report.build import build_report
from torq_gen_config.report.cells import EXECUTOR_PALETTE
from torq_gen_config.report.model_explorer import FOLDED, adapter_node_ids, overlays


# --------------------------------------------------------------------------- models


def _body(prefix: str, named: bool) -> onnx.GraphProto:
    """An If branch: Relu (named or not) then an unnamed Neg."""
    return h.make_graph([h.make_node("Relu", ["x"], [f"{prefix}_r"], name=f"{prefix}_relu" if named else ""),
                         h.make_node("Neg", [f"{prefix}_r"], [f"{prefix}_o"])],
                        f"{prefix}_g", [], [tvi(f"{prefix}_o", T.FLOAT, [2])])


def tricky_model() -> onnx.ModelProto:
    """Unnamed nodes, a Constant, a repeated name, a named node called ``node`` (the name
    the adapter gives unnamed ones), an If whose branches have unnamed nodes (they share
    the adapter's name counter with the main graph), a Loop with a body, and unnamed nodes
    after them."""
    body = h.make_graph([h.make_node("Identity", ["cond_in"], ["cond_out"]), h.make_node("Add", ["v", "x"], ["v2"])],
                        "loop_body", [tvi("i", T.INT64, []), tvi("cond_in", T.BOOL, []), tvi("v", T.FLOAT, [2])],
                        [tvi("cond_out", T.BOOL, []), tvi("v2", T.FLOAT, [2])])
    nodes = [
        h.make_node("Relu", ["x"], ["a"]),
        h.make_node("Constant", [], ["c"], value=nh.from_array(np.array([1.0, 2.0], np.float32), "cv")),
        h.make_node("Add", ["a", "c"], ["b"], name="dup"),
        h.make_node("Greater", ["b", "c"], ["gt"], name="node"),
        h.make_node("ReduceMin", ["gt"], ["cond"], keepdims=0),
        h.make_node("Cast", ["cond"], ["condb"], to=T.BOOL),
        h.make_node("If", ["condb"], ["ifo"], then_branch=_body("t", False), else_branch=_body("e", True)),
        h.make_node("Mul", ["ifo", "b"], ["m"], name="dup"),
        h.make_node("Constant", [], ["M"], value=nh.from_array(np.array(3, np.int64), "mv")),
        h.make_node("Loop", ["M", "condb", "m"], ["lo"], body=body),
        h.make_node("Sigmoid", ["lo"], ["y"]),
    ]
    return make_model(nodes, [tvi("x", T.FLOAT, [2])], [tvi("y", T.FLOAT, [2])], name="main")


FOLDED_OPS = ("Shape", "Cast", "ReduceSum")


# --------------------------------------------------------------------------- reports


def _layer_id(node: onnx.NodeProto) -> str:
    return f"{node.op_type}_{node.output[0]}"


def make_report(model: onnx.ModelProto, *, folded_ops=(), timing=True, only=None) -> dict:
    """A report of ``model`` built by build_report: every non-Constant node a layer (its
    ``_node_index`` as the split counts it) except those of ``folded_ops`` (then in
    ``folded_nodes``); llvm-cpu differs on the first layer and fails on the second, vmvx
    fails everywhere, ort succeeds with a runtime median when ``timing``. ``only``: the
    layer indices to keep (a subgraph report)."""
    layers, results, folded = [], {}, []
    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    for k, node in enumerate(nodes):
        if node.op_type in folded_ops:
            folded.append({"node_index": k, "op_type": node.op_type, "outputs": list(node.output)})
            continue
        if only is not None and k not in only:
            continue
        lid = _layer_id(node)
        layers.append({"layer_id": lid, "slug": lid.lower(), "op_type": node.op_type, "node_index": k,
                       "mlir_location": f"{k + 1}:1", "mac_count": None, "skipped_reason": None})
        ort = _ok(run_ms=1.0)
        if timing:
            ort["timing"]["runtime"] = {"median_ms": 0.01 * (k + 1), "runs": 3, "warmup": 1, "min_ms": 0.01,
                                        "mean_ms": 0.02, "max_ms": 0.03, "samples_ms": [0.01], "method": "test"}
        results[lid] = {"llvm-cpu": _ok(0.03) if k == 0 else _err() if k == 1 else _ok(1e-5),
                        "vmvx": _err("run", "trap"), "ort": ort}
    report = build_report(model_name="m", layers=layers, results=results, executors=EXECUTORS,
                          default_tolerance=TOL, mlir_file="work/full.mlir", provenance={"tool": "test"})
    report["folded_nodes"] = folded
    return report


def write_inputs(tmp_path: Path, model: onnx.ModelProto, report: dict, name: str = "m") -> tuple[Path, Path]:
    """The model and its report as ``report --model`` finds them."""
    mpath = tmp_path / f"{name}.onnx"
    onnx.save(model, mpath)
    report["provenance"]["model"] = {"source": str(mpath)}
    rpath = tmp_path / f"torq_gen_config_{name}.json"
    rpath.write_text(json.dumps(report))
    return mpath, rpath


# --------------------------------------------------------------------------- helpers


def adapter_graphs(model_path: Path) -> list:
    """The graphs Model Explorer's ONNX adapter makes of the model file."""
    return ONNXAdapter().convert(str(model_path), {})["graphs"]


def load_with_builder(path: Path, *, numeric: bool) -> ndb.ModelNodeData:
    """The file as the builder's ModelNodeData (every field known, types checked when the
    values are ``numeric``: the builder types ``value`` as a number; the categorical
    overlays hold strings, which the web app shows as labels), and it writes back the same
    data."""
    data = json.loads(path.read_text())
    cfg = dacite.Config(strict=True, check_types=numeric)
    model = ndb.ModelNodeData(graphsData={g: dacite.from_dict(ndb.GraphNodeData, d, config=cfg) for g, d in data.items()})
    again = json.loads(model.to_json_string())
    assert {g: dacite.from_dict(ndb.GraphNodeData, d, config=cfg) for g, d in again.items()} == model.graphsData
    for gid, gd in data.items():
        assert again[gid]["results"] == gd["results"]
    return model


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("model", [tricky_model(), folding_model()], ids=["tricky", "folding"])
def test_node_ids_are_the_adapters(tmp_path, model):
    """adapter_node_ids gives each main-graph node the id the adapter gives it, in order."""
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    main_graph = adapter_graphs(path)[0]
    assert main_graph.id == model.graph.name
    ids = adapter_node_ids(model.graph)
    nodes = {n.id: n for n in main_graph.nodes}
    assert [n.label for n in (nodes[i] for i in ids)] == [n.op_type for n in model.graph.node]
    assert [n.id for n in main_graph.nodes if n.id in set(ids)] == ids  # the adapter's order
    assert len(set(ids)) == len(ids)


def test_tricky_names():
    """What the adapter's naming does, spelled out for the tricky model."""
    assert adapter_node_ids(tricky_model().graph) == [
        "node", "node_1", "dup", "node_2", "node_3", "node_4", "node_5", "dup_1", "node_7", "node_8", "node_10"]


@pytest.mark.parametrize("model, folded_ops", [(tricky_model(), ()), (folding_model(), FOLDED_OPS)],
                         ids=["tricky", "folding"])
def test_every_file_loads_and_every_key_is_an_adapter_node(tmp_path, capsys, model, folded_ops):
    mpath, _ = write_inputs(tmp_path, model, make_report(model, folded_ops=folded_ops))
    out = tmp_path / "me"
    assert main(["report", "--model", str(mpath), "--output-dir", str(tmp_path), "--model-explorer", str(out)]) == 0
    printed = capsys.readouterr().out
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(["recommended.json"] + [f"{k}_{e}.json" for e in ("llvm-cpu", "vmvx", "ort")
                                                   for k in ("verdict", "max_rel_diff")] + ["runtime_ort.json"])
    assert f"model-explorer {mpath} --extensions=model_explorer_onnx --node_data_paths={out}/recommended.json," in printed
    main_graph = adapter_graphs(mpath)[0]
    labels = {n.id: n.label for n in main_graph.nodes}
    report = json.loads((tmp_path / "torq_gen_config_m.json").read_text())
    layer_ops = {op["op_type"] for op in report["ops"].values()}
    for name in files:
        data = load_with_builder(out / name, numeric=name.startswith(("max_rel_diff", "runtime")))
        assert list(data.graphsData) == [main_graph.id]
        results = data.graphsData[main_graph.id].results
        assert set(results) <= set(labels), name
        assert {labels[k] for k in results} <= layer_ops | set(folded_ops), name
    rec = json.loads((out / "recommended.json").read_text())[main_graph.id]["results"]
    assert len(rec) == len(report["ops"]) + len(folded_ops)
    ids = adapter_node_ids(model.graph)
    for k, node in enumerate(n for n in model.graph.node if n.op_type != "Constant"):
        nid = ids[[i for i, n in enumerate(model.graph.node) if n.op_type != "Constant"][k]]
        if node.op_type in folded_ops:
            assert rec[nid] == {"value": FOLDED, "bgColor": "#b0bec5"}
        else:
            assert rec[nid]["value"] == report["ops"][_layer_id(node)]["recommended_executor"]


def test_values_and_colours(tmp_path):
    model = folding_model()
    report = make_report(model, folded_ops=FOLDED_OPS)
    files = overlays(report, model.graph)
    g = "small"
    assert report["ops"]["MatMul_mm"]["recommended_executor"] == "ort"  # llvm-cpu differs, vmvx fails
    assert files["recommended.json"][g]["results"]["matmul0"] == {"value": "ort", "bgColor": EXECUTOR_PALETTE[2]}
    verdict = files["verdict_llvm-cpu.json"][g]["results"]
    assert verdict["matmul0"] == {"value": "difference", "bgColor": "#f9a825"}
    assert verdict["node"] == {"value": "error", "bgColor": "#c62828"}  # the unnamed Relu
    assert verdict["shape_fold"]["value"] == verdict["node_2"]["value"] == FOLDED  # folded, also unnamed
    rel = files["max_rel_diff_llvm-cpu.json"][g]
    assert "node" not in rel["results"] and "shape_fold" not in rel["results"]  # no metric: no entry
    assert rel["results"]["matmul0"]["value"] == pytest.approx(0.03, rel=0.2)
    assert [t["value"] for t in rel["thresholds"]][:3] == [1e-6, 1e-5, 1e-4]
    runtime = files["runtime_ort.json"][g]
    assert runtime["results"]["matmul0"] == {"value": 0.01} and runtime["gradient"][0]["stop"] == 0.0
    assert "runtime_llvm-cpu.json" not in files and "runtime_vmvx.json" not in files  # no median there


def test_without_timing_no_runtime_files_and_stale_ones_go(tmp_path, capsys):
    model = folding_model()
    mpath, _ = write_inputs(tmp_path, model, make_report(model, folded_ops=FOLDED_OPS, timing=False))
    out = tmp_path / "me"
    out.mkdir()
    (out / "runtime_ort.json").write_text("{}")  # from an earlier report with timing
    (out / "notes.txt").write_text("mine")
    assert main(["report", "--model", str(mpath), "--output-dir", str(tmp_path), "--model-explorer", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert "runtime_ort.json" not in names and "notes.txt" in names and "recommended.json" in names


def test_subgraph_report_colours_its_range_only(tmp_path):
    """A subgraph-mode report holds a range of the user's model (its layer IDs and
    ``_node_index`` refer to the user's model): only those nodes get data."""
    model = tricky_model()
    report = make_report(model, only={2, 3, 4})
    rec = overlays(report, model.graph)["recommended.json"]["main"]["results"]
    assert set(rec) == {"node_2", "node_3", "node_4"}  # Greater 'node', the unnamed ReduceMin and Cast


def test_if_and_loop_are_one_layer_each(tmp_path):
    """The If and Loop nodes are layers (their bodies are not): keyed by the If/Loop node's
    own id; no key for the nodes of their bodies (which the adapter embeds for If, and
    puts in a graph of their own for Loop)."""
    model = tricky_model()
    mpath = tmp_path / "m.onnx"
    onnx.save(model, mpath)
    graphs = adapter_graphs(mpath)
    rec = overlays(make_report(model), model.graph)["recommended.json"]["main"]["results"]
    labels = {n.id: n.label for n in graphs[0].nodes}
    assert labels["node_5"] == "If" and labels["node_8"] == "Loop" and {"node_5", "node_8"} <= set(rec)
    assert not [k for k in rec if "/" in k]
    assert [g.id for g in graphs[1:]] == ["node_8/body"]


def test_missing_report_is_one_line_exit_2(tmp_path, capsys):
    onnx.save(folding_model(), tmp_path / "m.onnx")
    assert main(["report", "--model", str(tmp_path / "m.onnx"), "--output-dir", str(tmp_path),
                 "--model-explorer", str(tmp_path / "me")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("torq-gen-config: error: report JSON not found"), err
    assert not (tmp_path / "me").exists()


def test_model_of_another_report_is_one_line_exit_2(tmp_path, capsys):
    _, rpath = write_inputs(tmp_path, folding_model(), make_report(folding_model(), folded_ops=FOLDED_OPS))
    other = tmp_path / "other.onnx"
    onnx.save(tricky_model(), other)
    rpath.rename(tmp_path / "torq_gen_config_other.json")
    assert main(["report", "--model", str(other), "--output-dir", str(tmp_path), "--model-explorer",
                 str(tmp_path / "me")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is this the model the report was made from?" in err[0], err
    assert not (tmp_path / "me").exists() and not (tmp_path / "torq_gen_config_other.html").exists()


def test_model_in_the_onnx_package(tmp_path, capsys):
    """--model onnx:<path> (the default job's model) is the file in the onnx package, as for
    discover: here the wrong model for the report, so the error is that it does not fit."""
    _, rpath = write_inputs(tmp_path, folding_model(), make_report(folding_model(), folded_ops=FOLDED_OPS))
    assert main(["report", str(rpath), "--model", "onnx:backend/test/data/light/light_squeezenet.onnx",
                 "--model-explorer", str(tmp_path / "me")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is this the model the report was made from?" in err[0], err


def test_report_path_alone_finds_the_model_it_names(tmp_path, capsys):
    mpath, rpath = write_inputs(tmp_path, folding_model(), make_report(folding_model(), folded_ops=FOLDED_OPS))
    assert main(["report", str(rpath), "--model-explorer", str(tmp_path / "me")]) == 0
    assert (tmp_path / "me" / "recommended.json").is_file()
    mpath.unlink()
    assert main(["report", str(rpath), "--model-explorer", str(tmp_path / "me")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model-explorer needs the model the report was made from: give --model" in err[0], err


def test_moved_model_with_report_json_and_model(tmp_path, capsys):
    """A model moved and renamed since discover: REPORT_JSON --model M --model-explorer DIR
    (the error for a missing model says to give --model); both without --model-explorer
    stay refused, with an error that says when they go together."""
    mpath, rpath = write_inputs(tmp_path, folding_model(), make_report(folding_model(), folded_ops=FOLDED_OPS))
    moved = tmp_path / "elsewhere" / "renamed.onnx"
    moved.parent.mkdir()
    mpath.rename(moved)
    assert main(["report", str(rpath), "--model-explorer", str(tmp_path / "me")]) == 2
    assert "give --model" in capsys.readouterr().err
    assert main(["report", str(rpath), "--model", str(moved), "--model-explorer", str(tmp_path / "me")]) == 0, \
        capsys.readouterr().err
    out = capsys.readouterr().out
    assert (tmp_path / "me" / "recommended.json").is_file() and rpath.with_suffix(".html").is_file()
    assert f"model-explorer {moved}" in out, out
    assert main(["report", str(rpath), "--model", str(moved)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not both" in err[0] and "only with --model-explorer" in err[0], err


def test_model_explorer_dir_that_is_a_file_is_one_line_exit_2(tmp_path, capsys):
    _, rpath = write_inputs(tmp_path, folding_model(), make_report(folding_model(), folded_ops=FOLDED_OPS))
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["report", str(rpath), "--model-explorer", str(afile)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"torq-gen-config: error: cannot create the Model Explorer output directory {afile}: it is a file"]
    assert afile.read_text() == "x" and not rpath.with_suffix(".html").exists()
    assert main(["report", str(rpath), "--model-explorer", str(afile / "sub")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot create the Model Explorer output directory" in err[0], err
