"""Tests of the HTML report's model graph data (report/graph.py) on the shared hand-made
report (tests/sample_report.py) with a layers manifest made to match; the page in a real
browser: tests/workflow/test_html_report_e2e.py."""

from __future__ import annotations

import json

import pytest

from sample_report import LAYERS, make_report
from torq_gen_config.report import graph
from torq_gen_config.core.statuses import HTML_COLORS as STATUS_COLORS
from torq_gen_config.core.statuses import worst
from torq_gen_config.report.html import render_html, write_report_html

# Conv_conv1 -> Relu_relu1 -> Conv_conv2 -> Relu_relu2 -> MatMul_fc -> Gather_critical, plus a skip
# connection Relu_relu1 -> MatMul_fc (a tensor read twice); scoped node names
NAMES = ["/backbone/stem/conv1/Conv", "/backbone/stem/Relu", "/backbone/block/conv2/Conv", "/backbone/block/Relu",
         "/head/fc/MatMul", "Gather_7"]
TENSORS = [(["x"], ["t0"]), (["t0"], ["t1"]), (["t1"], ["t2"]), (["t2"], ["t3"]), (["t3", "t1", "w"], ["t4"]),
           (["t4", "idx"], ["y"])]


def manifest():
    return {"layers": [{"layer_id": lid, "op_type": op, "node_index": i, "node_name": NAMES[i],
                        "inputs": [{"name": n} for n in TENSORS[i][0]], "outputs": [{"name": n} for n in TENSORS[i][1]]}
                       for i, (lid, op, _, _) in enumerate(LAYERS)]}


@pytest.fixture()
def report():
    rep = make_report()
    entry = rep["ops"]["Relu_relu1"]["executors"]["vmvx"]  # an inconclusive success and a dispute, as in test_html
    entry["metrics"]["inconclusive"] = True
    entry["metrics"]["inconclusive_reasons"] = ["reference below the absolute floor"]
    rep["ops"]["Conv_conv2"]["reference"] = {"status": "ok", "dispute": {"summary": "onnxruntime and onnx differ"}}
    dr = rep["discovery_report"]
    dr["reference_disputes"] = [{"layer_id": "Conv_conv2", "summary": "onnxruntime and onnx differ", "agree_with": {}}]
    dr["inconclusive_checks"] = [{"layer_id": "Relu_relu1", "executor": "vmvx", "reason": "below the floor"}]
    dr["generated_inputs"] = [{"layer_id": "Relu_relu2", "reason": "generated (seed 1)"}]
    return rep


def test_nodes_are_the_layers_and_edges_the_tensors(report):
    data = graph.graph_data(report, manifest())
    assert [n["id"] for n in data["nodes"]] == list(report["ops"])
    assert [n["row"] for n in data["nodes"]] == list(range(6))  # the matrix row: the key of the cell details
    # one edge per (writer, reader); model inputs and weights (x, w, idx) join nothing
    assert data["edges"] == [[0, 1, "t0"], [1, 2, "t1"], [2, 3, "t2"], [3, 4, "t3"], [1, 4, "t1"], [4, 5, "t4"]]
    assert data["nodes"][0]["scope"] == ["backbone", "stem", "conv1"] and data["nodes"][5]["scope"] == []
    assert data["level"] is None and data["depth"] == 3 and data["note"] is None


def test_colours_by_worst_verdict_and_recommendation(report):
    nodes = {n["id"]: n for n in graph.graph_data(report, manifest())["nodes"]}
    assert nodes["Conv_conv1"]["worst"] == "difference" and nodes["Conv_conv1"]["rec"] == "vmvx"
    assert nodes["Relu_relu1"]["worst"] == "success*"  # vmvx's success could not have failed
    assert nodes["Relu_relu1"]["verdicts"] == {"llvm-cpu": "success", "vmvx": "success*", "ort": "success"}
    assert nodes["MatMul_fc"]["worst"] == "error" and nodes["MatMul_fc"]["rec"] == "ort"
    assert nodes["Gather_critical"]["worst"] == "error" and nodes["Gather_critical"]["rec"] is None
    assert nodes["Relu_relu2"]["worst"] == "success"
    data = graph.graph_data(report, manifest())
    assert data["status_colors"]["error"] == STATUS_COLORS["error"]
    assert set(data["executor_colors"]) == {"llvm-cpu", "vmvx", "ort"}
    assert len(set(data["executor_colors"].values())) == 3


def test_the_reports_marks_are_flags(report):
    nodes = {n["id"]: n for n in graph.graph_data(report, manifest())["nodes"]}
    assert nodes["Relu_relu1"]["flags"] == ["success*"]
    assert nodes["Conv_conv2"]["flags"] == ["dispute"]
    assert nodes["Gather_critical"]["flags"] == ["critical"]
    assert nodes["Relu_relu2"]["flags"] == ["generated inputs"]
    assert nodes["Conv_conv1"]["flags"] == []


def test_worst_status_order():
    assert worst(["success", "success*", "difference"]) == "difference"
    assert worst(["success", "unverified"]) == "unverified"
    assert worst(["skipped", "success"]) == "skipped"
    assert worst([]) == "not tested"
    names = ["llvm-cpu", "vmvx", "ort"]
    assert graph.majority_recommendation(["ort", "vmvx", "ort", None], names) == "ort"
    assert graph.majority_recommendation(["ort", "vmvx"], names) == "vmvx"  # a tie: priority order
    assert graph.majority_recommendation([None, None, "ort"], names) is None


def test_scopes_collapse_to_a_level_that_fits():
    assert graph.scope_of("/encoder/layers.3/attn/MatMul") == ("encoder", "layers.3", "attn")
    assert graph.scope_of("MatMul_12") == () and graph.scope_of(None) == ()
    # 40 blocks of 10 layers: /enc/layers.N/{attn (6 layers), mlp (3)}/..., and one Add per block
    scopes = []
    for b in range(40):
        scopes += [("enc", f"layers.{b}", "attn")] * 6 + [("enc", f"layers.{b}", "mlp")] * 3 + [("enc", f"layers.{b}")]
    assert graph.visible_count(scopes, None) == 400
    assert graph.visible_count(scopes, 3) == 400  # nothing deeper than 3 to collapse
    assert graph.visible_count(scopes, 2) == 40 * 3  # attn, mlp, Add per block
    assert graph.visible_count(scopes, 1) == 40  # one per block
    assert graph.visible_count(scopes, 0) == 1  # all of enc
    assert graph.initial_level(scopes, 300) == 2
    assert graph.initial_level(scopes, 100) == 1
    assert graph.initial_level(scopes, 30) == 0
    assert graph.initial_level(scopes, 0) == 0  # even the top level does not fit: the fewest nodes
    assert graph.initial_level(scopes, 400) is None  # fits as it is
    # a scope of one layer shows as that layer, not as a scope
    assert graph.visible_count([("a", "x"), ("a", "y"), ("b",)], 0) == 2
    assert graph.visible_count([("a", "x"), ("a", "y"), ("b",)], 1) == 3


def test_large_graph_starts_collapsed(report):
    data = graph.graph_data(report, manifest(), max_visible=3)
    # level 0: backbone (4 layers), head/fc/MatMul (alone in its scope: itself), Gather
    assert data["level"] == 0 and graph.visible_count([tuple(n["scope"]) for n in data["nodes"]], 0) == 3
    data = graph.graph_data(report, manifest(), max_visible=4)
    assert data["level"] == 1  # stem, block, MatMul, Gather


def test_full_model_placement(report):
    report["full_model"] = {"status": "success", "assignment": {"layer_executors": {"Conv_conv1": "vmvx",
                                                                                    "Relu_relu1": "llvm-cpu"}},
                            "partitions": [{"index": 0, "pid": "p0", "executor": "vmvx", "layer_ids": ["Conv_conv1"],
                                            "partition_check": {"status": "success", "summary": "ok"}}]}
    data = graph.graph_data(report, manifest())
    nodes = {n["id"]: n for n in data["nodes"]}
    assert nodes["Conv_conv1"]["full"] == {"executor": "vmvx", "run_status": "success", "partition": 0, "pid": "p0",
                                           "check": "success", "check_summary": "ok"}
    assert nodes["Relu_relu1"]["full"] == {"executor": "llvm-cpu", "run_status": "success"}
    assert "full" not in nodes["MatMul_fc"]
    assert data["full_model_stale"] is None


def test_full_model_placement_of_a_moved_layer_is_out_of_date(report):
    """`edit` moved a layer the run placed: its placement is flagged by the rule `view`
    uses (fullrun.stale_reason), and the page says OUT OF DATE where `view` does."""
    import io

    from torq_gen_config.fullrun.report_section import stale_reason
    from torq_gen_config.report.view import render_summary
    from torq_gen_config.report.view_format import make_console

    report["full_model"] = {"status": "success", "assignment": {"layer_executors": {"Conv_conv1": "vmvx",
                                                                                    "Relu_relu1": "llvm-cpu"}},
                            "partitions": [{"index": 2, "pid": "p2", "executor": "llvm-cpu",
                                            "layer_ids": ["Relu_relu1"], "partition_check": {"status": "success"}}]}
    report["ops"]["Relu_relu1"]["recommended_executor"] = "ort"  # as `edit --layer Relu_relu1 --executor ort` sets it
    data = graph.graph_data(report, manifest())
    nodes = {n["id"]: n for n in data["nodes"]}
    full = nodes["Relu_relu1"]["full"]
    assert full["stale"] is True and full["executor"] == "llvm-cpu" and full["now"] == "ort" and full["partition"] == 2
    assert "assignment changed since" in full["stale_reason"] and "llvm-cpu -> ort" in full["stale_reason"]
    assert "stale" not in nodes["Conv_conv1"]["full"]
    reason = stale_reason(report["full_model"], report["ops"])
    assert reason and data["full_model_stale"] == reason
    page = render_html(report, manifest=manifest())
    section = page[page.index("<h2>Full-model comparison</h2>"):]
    assert 'id="full-model-stale"' in section and "OUT OF DATE" in section and "Relu_relu1 (llvm-cpu -&gt; ort)" in section
    assert "(out of date)" in section  # next to the status
    assert page.index("OUT OF DATE") < page.index("<h2>Summary</h2>")  # and at the top of the page
    assert "out of date: " in graph.asset("graph.js") and "stale_reason" in graph.asset("graph.js")
    buf = io.StringIO()
    render_summary(report, make_console(file=buf))
    assert f"OUT OF DATE: {reason}" in " ".join(buf.getvalue().split())  # the same words in `view`
    report["ops"]["Relu_relu1"]["recommended_executor"] = "llvm-cpu"  # moved back: current again
    page = render_html(report, manifest=manifest())
    assert "OUT OF DATE" not in page and "full-model-stale" not in page


def test_graph_unavailable_says_why(report):
    assert "no layers manifest" in graph.graph_data(report, None)["unavailable"]
    assert "none of the report's layers" in graph.graph_data(report, {"layers": [{"layer_id": "x"}]})["unavailable"]
    assert "not a JSON object" in graph.graph_data(report, [])["unavailable"]
    page = render_html(report)
    assert 'id="graph-unavailable"' in page and "graph unavailable: no layers manifest" in page
    assert "dagre" not in page  # no script for a graph that is not there
    part = manifest()
    part["layers"] = part["layers"][:4]
    data = graph.graph_data(report, part)
    assert len(data["nodes"]) == 6 and "2 layers of the report are not in the layers manifest" in data["note"]


def test_page_inlines_the_graph(report):
    page = render_html(report, manifest=manifest())
    assert page.count('id="graph-data"') == 1 and 'id="graph-svg"' in page
    assert "Copyright (c) 2012-2014 Chris Pettitt" in page  # dagre, with its licence header
    assert "torqGraph" in page and "<script src" not in page  # every script inlined
    data = json.loads(page.split('id="graph-data">')[1].split("</script>")[0])
    assert len(data["nodes"]) == 6
    assert page.index("Model graph") < page.index("Verdicts per layer and executor")


def test_write_report_html_reads_the_manifest_next_to_the_report(tmp_path, report):
    path = tmp_path / "torq_gen_config_tiny.json"
    path.write_text(json.dumps(report))
    page = write_report_html(path).read_text()
    assert "graph unavailable: no layers manifest" in page
    mdir = tmp_path / "work" / "tiny" / "layers"
    mdir.mkdir(parents=True)
    (mdir / "manifest.json").write_text(json.dumps(manifest()))
    assert graph.find_manifest(path, report) == mdir / "manifest.json"
    page = write_report_html(path).read_text()
    assert 'id="graph-data"' in page and "graph unavailable" not in page
    (mdir / "manifest.json").write_text('{"layers": [{"layer_id"')  # truncated: a warning, the rest stays
    page = write_report_html(path).read_text()
    assert "the model graph is left out" in page and "graph unavailable" in page
    # the graph says the manifest there could not be read (the file and why), not that there is none
    line = page.split('id="graph-unavailable">')[1].split("</p>")[0]
    assert "no layers manifest" not in line and "could not be read" in line, line
    assert str(mdir / "manifest.json") in line and "not valid JSON" in line, line
