"""End-to-end ``run --reduce`` with the real tools and two compiler stand-ins (TEST
FIXTURES, tests/fixtures/standin_compilers.py, selected through ``IREE_COMPILE``; they run
the real ``iree-compile`` for everything else):

- ``two_convs`` fails whenever one function holds two ``onnx.Conv`` ops: on
  light_squeezenet every layer passes alone and the full-model run fails to compile;
  the reduction must find exactly two Convs, and its reproducer must fail the same way;
- ``conv_relu`` compiles a Relu that follows a Conv in one function as a Sigmoid: a model's
  run differs from the reference; the reduction must keep one Conv and one Relu.

Marked ``slow`` (about 3 minutes on 2 cores, most of it one squeezenet discovery).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TensorProto, helper, make_model, run_cli, tvi, work
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from standin_compilers import make_standin_compiler  # noqa: E402

pytestmark = pytest.mark.slow
NAME = "light_squeezenet"


def cli(*args, env=None, cwd=None, timeout=900):
    exe = str(Path(sys.executable).parent / "torq-gen-config")
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd)


@pytest.fixture(scope="module")
def discovered(squeezenet_discovery) -> Path:
    """One discovery of light_squeezenet with the real compiler (every layer passes): the
    session's shared one (conftest), read only; the tests work on ``copy_of`` it."""
    out, r = squeezenet_discovery
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def compilers(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("compilers")
    return {mode: make_standin_compiler(d, mode) for mode in ("two_convs", "conv_relu")}


def copy_of(discovered: Path, tmp_path: Path) -> Path:
    out = tmp_path / "sq"
    shutil.copytree(discovered, out, symlinks=True)
    return out


def test_two_convs_reduced_to_exactly_two_with_a_reproducer_that_fails_the_same_way(discovered, compilers,
                                                                                       squeezenet_path, tmp_path):
    out = copy_of(discovered, tmp_path)
    env = {"IREE_COMPILE": compilers["two_convs"]}
    report = json.loads((out / f"torq_gen_config_{NAME}.json").read_text())
    assert all(e["status"] != "error" for op in report["ops"].values() for e in op["executors"].values())

    r = cli("run", "--model", squeezenet_path, "--output-dir", out, "-j", "2", "-q", "--reduce", env=env,
            cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]
    red = json.loads((out / "reduced" / "reduce.json").read_text())
    assert red["status"] == "reduced" and red["minimal"], red
    assert [n["op_type"] for n in red["nodes"]] == ["Conv", "Conv"]
    assert red["target"]["stage"] == "compile" and red["outcome"]["stage"] == "compile"
    assert "two onnx.Conv ops in one function" in red["outcome"]["summary"]
    assert red["from_nodes"] > 60 and red["num_nodes"] == 2
    assert "Reduced to 2 of" in r.stdout and "Reproduce (from " in r.stdout
    for f in ("model.onnx", "inputs.npz", "reference_outputs.npz", "README.txt",
              "torq_gen_config_model_compiler.json"):
        assert (out / "reduced" / f).is_file(), f
    # the report and view name the nodes kept
    report = json.loads((out / f"torq_gen_config_{NAME}.json").read_text())
    assert [n["layer_id"] for n in report["full_model"]["reduced"]["nodes"]] == [n["layer_id"] for n in red["nodes"]]
    v = run_cli("view", out / f"torq_gen_config_{NAME}.json")
    assert v.returncode == 0, v.stderr[-2000:]
    assert "Reduced to 2 of" in v.stdout and red["nodes"][1]["layer_id"] in v.stdout

    # the one-line reproducer (led by the compiler it ran with) fails the same way
    argv = shlex.split(red["reproducer"])
    assert argv[:3] == [f"IREE_COMPILE={compilers['two_convs']}", "torq-gen-config", "run"]
    rr = cli(*argv[2:], env=env, cwd=red["cwd"])
    assert rr.returncode == 1, rr.stdout[-2000:] + rr.stderr[-2000:]
    result = json.loads((out / "reduced" / "work" / "model" / "full" / "result.json").read_text())
    assert result["status"] == "error" and result["failure"]["stage"] == "compile"
    assert "two onnx.Conv ops in one function" in result["failure"]["message"]
    # and so does the raw compiler command, which the real compiler accepts
    raw = shlex.split(red["raw_commands"][0])
    assert raw[0] == compilers["two_convs"]
    p = subprocess.run(raw, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "two onnx.Conv ops" in p.stderr
    real = subprocess.run([_real_compiler(compilers["two_convs"]), *raw[1:]], capture_output=True, text=True,
                          timeout=300)
    assert real.returncode == 0, real.stderr[-2000:]

    # a rerun replays the search from the kept candidates: nothing is compiled again
    r2 = cli("run", "--model", squeezenet_path, "--output-dir", out, "-j", "2", "-q", "--reduce", env=env,
             cwd=tmp_path)
    assert r2.returncode == 1
    red2 = json.loads((out / "reduced" / "reduce.json").read_text())
    assert red2["nodes"] == red["nodes"] and red2["candidates_run"] == 0 and red2["compiles"] == 0
    assert red2["candidates_reused"] >= red["candidates_run"]


def _real_compiler(standin: str) -> str:
    for line in Path(standin).read_text().splitlines():
        if line.startswith("REAL = "):
            return eval(line[len("REAL = "):])  # the repr the fixture wrote
    raise AssertionError("no REAL line")


def test_a_budget_stops_the_search_and_the_next_run_resumes_it(discovered, compilers, squeezenet_path, tmp_path):
    out = copy_of(discovered, tmp_path)
    env = {"IREE_COMPILE": compilers["two_convs"]}

    def reduce(*extra):
        r = cli("run", "--model", squeezenet_path, "--output-dir", out, "-j", "2", "-q", "--reduce", *extra, env=env)
        assert r.returncode == 1, r.stderr[-3000:]
        return json.loads((out / "reduced" / "reduce.json").read_text()), r

    # spent right after reproducing the failure: stopped, not "the whole set is needed"
    red, r = reduce("--reduce-budget", "1c")
    assert red["status"] == "stopped" and red["compiles"] == 1 and not red["minimal"], red
    assert "compile budget (1 compile) is spent" in red["budget_spent"] and "run again to continue" in red["note"]
    assert "Reduction stopped: 68 of 68 nodes kept" in r.stdout
    red, _ = reduce("--reduce-budget", "3c")
    assert red["status"] == "reduced" and not red["minimal"] and red["compiles"] == 3
    assert "compile budget (3 compiles) is spent" in red["budget_spent"]
    assert "stopped early" in red["note"] and red["num_nodes"] < red["from_nodes"]
    # damaged work files of the search: a value file and the values index are made again
    values = work(out) / "full" / "reduce" / "values"
    index = json.loads((values / "index.json").read_text())
    (values / next(iter(index["files"].values()))).write_bytes(b"junk")
    red2, _ = reduce()
    assert red2["minimal"] and [n["op_type"] for n in red2["nodes"]] == ["Conv", "Conv"]
    assert red2["candidates_reused"] >= 3
    (values / "index.json").write_text('{"digest": ')
    red3, _ = reduce()
    assert red3["nodes"] == red2["nodes"] and red3["candidates_run"] == 0

    # another compiler is another search: nothing is reused, and the real compiler compiles
    # the whole set (the main run still shows its kept error: not reproduced here)
    env = {"IREE_COMPILE": ""}
    red4, _ = reduce()
    assert red4["candidates_reused"] == 0 and red4["status"] == "not reproduced", red4


def test_subgraph_full_test_reduced_in_discover(compilers, squeezenet_path, tmp_path):
    # the subgraph's layers pass alone (one Conv per function); its full test fails
    out = tmp_path / "sub"
    env = {"IREE_COMPILE": compilers["two_convs"]}
    r = cli("discover", "--model", squeezenet_path, "--output-dir", out, "-j", "2", "-q",
            "--subgraph-from", "Conv_r3", "--subgraph-to", "Concat_r9", "--skip-executors", "vmvx,ort",
            "--reduce", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    dirs = [d for d in out.iterdir() if d.name.startswith("reduced_subgraph_")]
    assert len(dirs) == 1, list(out.iterdir())
    red = json.loads((dirs[0] / "reduce.json").read_text())
    assert [n["op_type"] for n in red["nodes"]] == ["Conv", "Conv"] and red["minimal"]
    report = json.loads(next(out.glob("torq_gen_config_*_subgraph_*.json")).read_text())
    assert report["full_model"]["status"] == "error"
    assert report["full_model"]["reduced"]["num_nodes"] == 2


def conv_relu_stack(blocks: int = 3, seed: int = 0):
    """x -> (Conv 3x3 -> Relu) x blocks, random weights: outputs with both signs."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for b in range(blocks):
        w = numpy_helper.from_array(rng.normal(0, 0.5, (4, 4 if b else 3, 3, 3)).astype(np.float32), f"w{b}")
        inits.append(w)
        nodes.append(helper.make_node("Conv", [prev, f"w{b}"], [f"c{b}"], name=f"conv{b}", pads=[1, 1, 1, 1]))
        prev = f"r{b}" if b < blocks - 1 else "y"
        nodes.append(helper.make_node("Relu", [f"c{b}"], [prev], name=f"relu{b}"))
    return make_model(nodes, [tvi("x", TensorProto.FLOAT, [1, 3, 8, 8])], [tvi("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                      inits)


def test_conv_relu_difference_reduced_to_one_conv_and_one_relu(compilers, tmp_path):
    import onnx

    model = tmp_path / "stack.onnx"
    onnx.save(conv_relu_stack(), model)
    out = tmp_path / "o"
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--skip-executors", "vmvx,ort")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "torq_gen_config_stack.json").read_text())
    assert {e["status"] for op in report["ops"].values() for e in op["executors"].values()} == {"success"}
    r = cli("run", "--model", model, "--output-dir", out, "-j", "2", "-q", "--reduce",
            env={"IREE_COMPILE": compilers["conv_relu"]})
    assert r.returncode == 1, r.stderr[-3000:]
    red = json.loads((out / "reduced" / "reduce.json").read_text())
    assert red["target"]["status"] == "difference" and red["outcome"]["status"] == "difference"
    assert [n["op_type"] for n in red["nodes"]] == ["Conv", "Relu"] and red["minimal"], red
    assert red["nodes"][0]["index"] < red["nodes"][1]["index"]
    # the reduced subgraph differs: the reference values of its outputs are not what the stand-in computes
    ref = np.load(out / "reduced" / "reference_outputs.npz")
    assert set(ref.files) == set(red["outputs"])
