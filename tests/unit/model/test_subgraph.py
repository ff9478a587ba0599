"""Subgraph mode (``--subgraph-from``/``--subgraph-to``): name resolution, the
extracted model, and (marked ``slow``) discovery, ``run`` and the Snakemake form
on light_squeezenet's fire3 module (layers Conv_r10 .. Concat_r16, user node
indices 49 .. 55)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import TensorProto, cli_in_process, helper, make_model, run_cli, run_snakemake, tvi
from onnx import numpy_helper

from torq_gen_config.core.errors import ConfigError
from torq_gen_config.model.graph import user_node_table
from torq_gen_config.model.prepare import prepare_model
from torq_gen_config.model.split import split_layers
from torq_gen_config.model.subgraph import resolve_range, subgraph_of_config

NAME = "light_squeezenet"
FIRE3 = ["Conv_r10", "Relu_r11", "Conv_r12", "Relu_r13", "Conv_r14", "Relu_r15", "Concat_r16"]
SUFFIX = "_subgraph_49_55"


@pytest.fixture(scope="module")
def sq_nodes(squeezenet_path):
    return user_node_table(onnx.load(str(squeezenet_path)))


# ------------------------------------------------------------------ name resolution


@pytest.mark.parametrize("a,b", [("Conv_r10", "Concat_r16"), ("r10", "r16"), ("Conv_r10", "r16")])
def test_resolve_layer_id_or_output_name(sq_nodes, a, b):
    rng = resolve_range(sq_nodes, a, b)
    assert rng["from"]["layer_id"] == "Conv_r10" and rng["from"]["node_index"] == 49
    assert rng["to"]["layer_id"] == "Concat_r16" and rng["to"]["node_index"] == 55
    assert rng["suffix"] == SUFFIX and "work_dir" not in rng


def test_single_node_range(sq_nodes):
    rng = resolve_range(sq_nodes, "Conv_r10", "Conv_r10")
    assert rng["suffix"] == "_subgraph_49_49"


def test_unknown_name_lists_near_matches(sq_nodes):
    with pytest.raises(ConfigError) as e:
        resolve_range(sq_nodes, "Conv_r10x", "Concat_r16")
    msg = str(e.value)
    assert "\n" not in msg and "--subgraph-from 'Conv_r10x'" in msg and "near matches:" in msg and "Conv_r10" in msg
    with pytest.raises(ConfigError, match="subgraph_to 'Concat_r1600'.*near matches: .*Concat_r16"):
        resolve_range(sq_nodes, "Conv_r10", "Concat_r1600", labels=("subgraph_from", "subgraph_to"))


def test_reversed_range(sq_nodes):
    with pytest.raises(ConfigError, match=r"reversed subgraph range: --subgraph-from Concat_r16 \(node 55\) comes after "
                                          r"--subgraph-to Conv_r10 \(node 49\)"):
        resolve_range(sq_nodes, "Concat_r16", "r10")


def test_config_form(squeezenet_path):
    assert subgraph_of_config({"model": str(squeezenet_path)}) is None
    assert subgraph_of_config({"model": str(squeezenet_path), "subgraph_from": "", "subgraph_to": ""}) is None
    sub = subgraph_of_config({"model": str(squeezenet_path), "subgraph_from": "r10", "subgraph_to": "Concat_r16"})
    assert sub["suffix"] == SUFFIX
    with pytest.raises(ConfigError, match="must be given together"):
        subgraph_of_config({"model": str(squeezenet_path), "subgraph_from": "r10"})


@pytest.mark.parametrize("cmd", ["discover", "run"])
def test_cli_bad_names_exit_2(tmp_path, capsys, squeezenet_path, cmd):
    out = tmp_path / "out"
    r = cli_in_process(capsys, cmd, "--model", squeezenet_path, "--output-dir", out, "--subgraph-from", "Conv_r10x",
                       "--subgraph-to", "Concat_r16")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torq-gen-config: error: --subgraph-from 'Conv_r10x'")
    assert "Conv_r10" in lines[0]
    r = cli_in_process(capsys, cmd, "--model", squeezenet_path, "--output-dir", out, "--subgraph-from=Concat_r16",
                       "--subgraph-to=Conv_r10")
    assert r.returncode == 2 and "reversed subgraph range" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()  # nothing ran


# ------------------------------------------------------------------ the extracted model


def test_squeezenet_fire3_subgraph(tmp_path, squeezenet_path):
    sub, info = prepare_model(squeezenet_path, subgraph=("Conv_r10", "Concat_r16"))
    sg = info["subgraph"]
    assert sg["from"]["layer_id"] == "Conv_r10" and sg["to"]["layer_id"] == "Concat_r16"
    assert [i.name for i in sub.graph.input] == ["r9"] == sg["inputs"]
    assert [d.dim_value for d in sub.graph.input[0].type.tensor_type.shape.dim] == [1, 128, 55, 55]
    assert [o.name for o in sub.graph.output] == ["r16"] == sg["outputs"]
    # the weights come from ConstantOfShape nodes at the start of the user's graph (nodes 6-8)
    assert [n["graph_index"] for n in sg["outside_constant_nodes"]] == [6, 7, 8]
    assert {n["op_type"] for n in sg["outside_constant_nodes"]} == {"ConstantOfShape"}
    assert [n.op_type for n in sub.graph.node].count("ConstantOfShape") == 3
    assert info["opset"]["prepared"] == 17 and not info["warnings"]
    onnx.checker.check_model(sub)

    man = split_layers(sub, info, tmp_path / "layers")
    assert [l["layer_id"] for l in man["layers"]] == FIRE3
    assert [l["node_index"] for l in man["layers"]] == list(range(49, 56))  # the user's indices
    assert {f["node_index"] for f in man["folded_nodes"]} == {6, 7, 8}
    for layer in man["layers"]:
        assert all(not i["name"].startswith("fire3/") for i in layer["inputs"]), layer["layer_id"]
        if layer["op_type"] == "Conv":  # weights and bias folded in as initializers
            assert len(layer["initializers"]) == 2 and len(layer["inputs"]) == 1

    # the subgraph computes what the range computes inside the whole model
    full, _ = prepare_model(squeezenet_path)
    types = {vi.name: vi for vi in full.graph.value_info}
    full.graph.output.extend([types["r9"], types["r16"]])
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32)
    sess = ort.InferenceSession(full.SerializeToString(), providers=["CPUExecutionProvider"])
    r9, r16 = sess.run(["r9", "r16"], {sess.get_inputs()[0].name: x})
    got = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"r9": r9})[0]
    np.testing.assert_allclose(got, r16, rtol=1e-5, atol=1e-5)


def small_graph() -> onnx.ModelProto:
    """A range (Add_b .. Reshape_r) that reads a Constant from before it, a Shape of
    run-time data, holds a Constant itself, and whose results are used after it."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.full((1, 4), 2.0, np.float32))),
        helper.make_node("Shape", ["a"], ["s"], name="shape"),
        helper.make_node("Add", ["a", "c"], ["b"], name="add"),
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.full((1, 4), 3.0, np.float32))),
        helper.make_node("Mul", ["b", "k"], ["m"], name="mul"),
        helper.make_node("Reshape", ["m", "s"], ["r"], name="reshape"),
        helper.make_node("Add", ["r", "b"], ["y"], name="add2"),
        helper.make_node("Neg", ["k"], ["z"], name="neg"),
    ]
    return make_model(nodes, [tvi("x", TensorProto.FLOAT, [1, 4])],
                      [tvi("y", TensorProto.FLOAT, [1, 4]), tvi("m", TensorProto.FLOAT, [1, 4]),
                       tvi("z", TensorProto.FLOAT, [1, 4])])


def test_boundary_of_a_small_graph(tmp_path):
    path = tmp_path / "g.onnx"
    onnx.save(small_graph(), path)
    sub, info = prepare_model(path, subgraph=("Add_b", "r"))
    sg = info["subgraph"]
    assert info["subgraph"]["suffix"] == "_subgraph_2_4"  # Constants have no node index
    assert sg["inputs"] == ["a"]
    assert sg["outputs"] == ["b", "m", "r"]  # b and r used after the range, m a model output; k is a constant
    # the Constant c (graph position 1, no node index); the Shape of `a` became its value
    assert sg["outside_constant_nodes"] == [{"graph_index": 1, "node_index": None, "op_type": "Constant",
                                             "outputs": ["c"]}]
    assert [n.op_type for n in sub.graph.node] == ["Constant", "Add", "Constant", "Mul", "Reshape"]
    assert numpy_helper.to_array(next(t for t in sub.graph.initializer if t.name == "s")).tolist() == [1, 4]
    assert [u["node_index"] for u in info["user_nodes"]] == [None, 2, None, 3, 4]
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b, m, r = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})
    np.testing.assert_allclose(b, a + 2)
    np.testing.assert_allclose(m, (a + 2) * 3)
    np.testing.assert_allclose(r, (a + 2) * 3)
    man = split_layers(sub, info, tmp_path / "layers")
    assert [(l["layer_id"], l["node_index"]) for l in man["layers"]] == [("Add_b", 2), ("Mul_m", 3), ("Reshape_r", 4)]


def test_whole_model_unchanged_without_subgraph(squeezenet_path):
    m, info = prepare_model(squeezenet_path)
    assert "subgraph" not in info and len(info["user_nodes"]) == 105


# ------------------------------------------------------------------ end to end


def _snapshot(out: Path) -> dict:
    """path -> (mtime_ns, sha1) of every file of the output directory except Snakemake's
    own state and the run lock."""
    snap = {}
    for p in sorted(out.rglob("*")):
        rel = p.relative_to(out).as_posix()
        if not p.is_file() or rel.startswith(".snakemake/") or rel == ".torq-gen-config.lock":
            continue
        snap[rel] = (p.stat().st_mtime_ns, hashlib.sha1(p.read_bytes()).hexdigest())
    return snap


def _check_subgraph_outputs(out: Path) -> dict:
    report = json.loads((out / f"torq_gen_config_{NAME}{SUFFIX}.json").read_text())
    compiler = json.loads((out / f"torq_gen_config_{NAME}{SUFFIX}_compiler.json").read_text())
    from torq_gen_config.mlir.importer import operator_at

    assert report["model_name"] == f"{NAME}{SUFFIX}"
    assert list(report["ops"]) == FIRE3
    assert [op["_node_index"] for op in report["ops"].values()] == list(range(49, 56))
    assert report["mlir_file"] == f"work/{NAME}{SUFFIX}/full.mlir"
    lines = (out / report["mlir_file"]).read_text().splitlines()
    by_loc = {op["mlir_location"]: op for op in report["ops"].values()}
    assert len(compiler["op_assignments"]) == 7
    for loc, a in compiler["op_assignments"].items():
        assert operator_at(lines, loc) == f"onnx.{by_loc[loc]['op_type']}", loc
        assert a["executor"] == by_loc[loc]["recommended_executor"]
    opts = report["provenance"]["options"]
    assert opts["subgraph_from"] == "Conv_r10" and opts["subgraph_to"] == "Concat_r16"
    assert report["subgraph"]["work_dir"] == f"work/{NAME}{SUFFIX}"
    return report


@pytest.mark.slow
def test_subgraph_discover_run_and_snakemake_form(tmp_path, squeezenet_path):
    out = tmp_path / "out"
    # a full-model discovery in the same directory (ORT only, to keep it short)
    r = run_cli("discover", "--model", squeezenet_path, "--output-dir", out, "-j", "2", "-q",
                "--skip-executors", "llvm-cpu,vmvx")
    assert r.returncode == 0, r.stderr[-3000:]
    before = _snapshot(out)
    assert f"torq_gen_config_{NAME}.json" in before and f"work/{NAME}/layers/manifest.json" in before

    flags = ["--subgraph-from", "Conv_r10", "--subgraph-to", "Concat_r16"]
    r = run_cli("discover", "--model", squeezenet_path, "--output-dir", out, "-j", "2", "-q", *flags)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--- Full Model Comparison ---" in r.stdout
    report = _check_subgraph_outputs(out)
    assert all(len(op["executors"]) == 3 for op in report["ops"].values())
    fm = report["full_model"]
    assert fm["status"] == "success" and fm["metrics"]  # all on llvm-cpu, within tolerance (measured)
    assert fm["result_file"] == f"work/{NAME}{SUFFIX}/full/result.json"
    assert "--- Full Model Comparison ---" in report["final_report_text"]

    # an edit of the subgraph report keeps its choices in the subgraph's work directory
    rep_path = out / f"torq_gen_config_{NAME}{SUFFIX}.json"
    r = run_cli("edit", rep_path, "--layer", "Relu_r11", "--executor", "ort", timeout=120)
    assert r.returncode == 0, r.stderr
    assert (out / "work" / f"{NAME}{SUFFIX}" / "user_choices.json").is_file()
    r = run_cli("run", "--model", squeezenet_path, "--output-dir", out, "-j", "2", "-q",
                "--subgraph-from=r10", "--subgraph-to=r16")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(rep_path.read_text())
    fm = report["full_model"]
    assert fm["status"] == "success" and fm["assignment"]["layer_counts"].get("ort") == 1
    assert fm["num_partitions"] == 3  # llvm-cpu [Conv_r10], ort [Relu_r11], llvm-cpu [the 5 others]

    # nothing of the full model's discovery was written or changed
    after = _snapshot(out)
    assert {k: v for k, v in after.items() if k in before} == before
    new = sorted(set(after) - set(before))
    assert all(k.startswith((f"work/{NAME}{SUFFIX}/", f"torq_gen_config_{NAME}{SUFFIX}",
                             f".torq-gen-config-{NAME}{SUFFIX}.lock")) for k in new), new

    # the Snakemake form gives the same file names (and runs the full-subgraph test)
    sm = tmp_path / "sm"
    r = run_snakemake("--cores", "2", "--config", f"model={squeezenet_path}", f"output_dir={sm}",
                      "subgraph_from=Conv_r10", "subgraph_to=Concat_r16")
    assert r.returncode == 0, r.stderr[-3000:]
    _check_subgraph_outputs(sm)
    assert (sm / "work" / f"{NAME}{SUFFIX}" / "full" / "result.json").is_file()
    lock = f".torq-gen-config-{NAME}{SUFFIX}.lock"  # the run lock's file (torq_gen_config.core.run_lock)
    assert sorted(os.listdir(sm)) == sorted([lock] + [n for n in os.listdir(out)
                                                      if n.startswith(f"torq_gen_config_{NAME}{SUFFIX}")]) + ["work"]
