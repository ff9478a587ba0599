"""A model sweep end to end with the real tools (issue 39 item 1): ``torq-gen-config sweep``
on a sheet of three small models and one that cannot be read; every model is a discovery
of its own in ``zoo/<name>/`` (``run`` works on it), ``sweep.json`` (schema-valid) and
``sweep.html`` sum them up, the unreadable one is a row with its reason and the exit
status is 1; a model added to the sheet runs alone (the others' reports are not touched);
a removed one leaves the summary and nothing is deleted; the Snakemake form does the same.
About 2 minutes on 2 cores."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from conftest import run_cli, run_snakemake
from onnx import TensorProto, helper, numpy_helper

from torq_gen_config.core.schemas import validator

pytestmark = pytest.mark.slow


def _mlp(seed: int, op: str) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node(op, ["m"], ["y"])]
    graph = helper.make_graph(nodes, f"g{seed}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
                              [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    for name, seed, op in (("relu", 0, "Relu"), ("tanh", 1, "Tanh"), ("sig", 2, "Sigmoid")):
        onnx.save(_mlp(seed, op), d / f"{name}.onnx")
    (d / "broken.onnx").write_text("not an ONNX model")
    (d / "models.tsv").write_text("name\tmodel\nrelu\trelu.onnx\ntanh\ttanh.onnx\nbroken\tbroken.onnx\n")
    r = run_cli("sweep", "--models", d / "models.tsv", "--output-dir", d / "zoo", "-j", "2", "-q")
    return d, r


def test_sweep_discovers_each_model_and_sums_up(zoo):
    d, r = zoo
    assert r.returncode == 1, r.stderr[-3000:]  # a model could not run
    assert "broken: could not run:" in r.stdout and "relu: 2 layers" in r.stdout
    summary = json.loads((d / "zoo" / "sweep.json").read_text())
    validator("sweep.schema.yaml").validate(summary)
    assert [(m["name"], m["status"]) for m in summary["models"]] == [
        ("relu", "discovered"), ("tanh", "discovered"), ("broken", "failed")]
    assert "broken.onnx" in summary["models"][2]["reason"]
    for name in ("relu", "tanh"):
        assert (d / "zoo" / name / f"torq_gen_config_{name}.json").is_file()
        assert (d / "zoo" / name / f"torq_gen_config_{name}.html").is_file()
    assert set(summary["op_types"]) == {"MatMul", "Relu", "Tanh"}
    page = (d / "zoo" / "sweep.html").read_text()
    assert "href='relu/torq_gen_config_relu.html'" in page
    # each model is a discovery of its own: run works on it
    r = run_cli("run", "--model", d / "relu.onnx", "--output-dir", d / "zoo" / "relu", "-q")
    assert r.returncode == 0 and "Status: success" in r.stdout, r.stderr[-3000:]


def test_added_model_runs_alone_and_removed_one_leaves_the_summary(zoo):
    d, _ = zoo
    relu = d / "zoo" / "relu" / "torq_gen_config_relu.json"
    before = relu.stat().st_mtime_ns
    (d / "models.tsv").write_text("name\tmodel\nrelu\trelu.onnx\nsig\tsig.onnx\n")  # tanh out, sig in
    r = run_cli("sweep", "--models", d / "models.tsv", "--output-dir", d / "zoo", "-j", "2", "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    assert relu.stat().st_mtime_ns == before  # not run again
    summary = json.loads((d / "zoo" / "sweep.json").read_text())
    assert [m["name"] for m in summary["models"]] == ["relu", "sig"]
    assert (d / "zoo" / "tanh" / "torq_gen_config_tanh.json").is_file()  # nothing deleted


def test_snakemake_form(zoo, tmp_path):
    d, _ = zoo
    sheet = tmp_path / "models.tsv"
    sheet.write_text(f"name\tmodel\nrelu\t{d / 'relu.onnx'}\n")
    r = run_snakemake("--cores", "2", "--config", f"models={sheet}", f"output_dir={tmp_path / 'zoo'}")
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "zoo" / "sweep.json").read_text())
    assert [m["name"] for m in summary["models"]] == ["relu"] and summary["totals"]["failed"] == 0
