"""Bad input gets one clear line and exit status 2, and loses nothing.

Each case builds its bad file in a temporary directory and runs the command; the
error must be one ``torq-gen-config: error:`` line naming the problem, with no
traceback. Cases the command line checks itself run in-process; those the workflow
finds (in its prepare job) run the console script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import SQUEEZENET, make_model, run_cli, tvi
from torq_gen_config.cli.main import main


def _zero_nodes(d):
    g = helper.make_graph([], "g", [tvi("x", TensorProto.FLOAT, [2])], [tvi("x", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, d / "m.onnx")
    return d / "m.onnx"


def _external_data_missing(d):
    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [tvi("x", TensorProto.FLOAT, [1, 64])],
                   [tvi("y", TensorProto.FLOAT, [1, 64])], [w])
    onnx.save(m, d / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True, location="m.bin",
              size_threshold=0)
    (d / "m.bin").unlink()
    return d / "m.onnx"


def _write(name, data: bytes):
    def make(d):
        (d / name).write_bytes(data)
        return d / name
    return make


def _npz(**arrays):
    """An .npz of zero arrays: name -> (shape, dtype)."""
    def make(d):
        import numpy as np

        np.savez(d / "in.npz", **{k: np.zeros(shape, dtype) for k, (shape, dtype) in arrays.items()})
        return d / "in.npz"
    return make


REPORT_OK = {"ops": {}, "executors": [], "model_name": "m"}

#: (case, files to make -> path, argv with {p} for the path and {d} for the directory, words in the error)
CASES = [
    ("missing model", lambda d: d / "nope.onnx", ["discover", "--model", "{p}"], "model file not found"),
    ("empty model", _write("m.onnx", b""), ["discover", "--model", "{p}"], "file is empty"),
    ("corrupt model", _write("m.onnx", os.urandom(64) + b"\xff" * 64), ["discover", "--model", "{p}"],
     "not a valid ONNX model"),
    ("zero nodes", _zero_nodes, ["discover", "--model", "{p}"], "has no nodes"),
    ("external data missing", _external_data_missing, ["discover", "--model", "{p}"], "external data file"),
    ("output dir is a file", _write("afile", b"x"),
     ["discover", "--model", str(SQUEEZENET), "--output-dir", "{p}"], "it is a file"),
    ("input data missing", lambda d: d / "nope.npz", ["discover", "--model", str(SQUEEZENET), "--input-data", "{p}"],
     "no such file"),
    ("input data not npz", _write("x.npz", b"garbage\n"),
     ["discover", "--model", str(SQUEEZENET), "--input-data", "{p}", "--output-dir", "{d}/out"],
     "is neither an .npz archive nor an .npy array"),
    ("input data without the model's input", _npz(wrong=((1, 3, 224, 224), "float32")),
     ["discover", "--model", str(SQUEEZENET), "--input-data", "{p}", "--output-dir", "{d}/out"],
     "has no array 'data_0'; the model's inputs are ['data_0'], the file has ['wrong']"),
    ("input data of another shape", _npz(data_0=((1, 3, 10, 10), "float32")),
     ["discover", "--model", str(SQUEEZENET), "--input-data", "{p}", "--output-dir", "{d}/out"],
     "'data_0' has shape 1x3x10x10, the model expects 1x3x224x224"),
    ("input data of another kind", _npz(data_0=((1, 3, 224, 224), "int64")),
     ["discover", "--model", str(SQUEEZENET), "--input-data", "{p}", "--output-dir", "{d}/out"],
     "'data_0' has dtype int64, the model input is float32"),
    ("config not YAML", _write("c.yaml", b"timeout_s: [1\n"),
     ["discover", "--model", str(SQUEEZENET), "--config-file", "{p}"], "is not valid YAML (line"),
    ("config not UTF-8", _write("c.yaml", b"timeout_s: 5\n# caf\xe9\n"),
     ["discover", "--model", str(SQUEEZENET), "--config-file", "{p}"], "is not UTF-8 text"),
    ("config out of range", _write("c.yaml", b"timeout_s: -3\n"),
     ["discover", "--model", str(SQUEEZENET), "--config-file", "{p}"], "timeout_s"),
    ("report not UTF-8", _write("r.json", b'{"ops": "\xe9"}'), ["view", "{p}"], "not a UTF-8 text file"),
    ("report truncated", _write("r.json", b'{"ops": {"a": '), ["view", "{p}"], "not valid JSON (line 1"),
    ("report field wrong type", _write("r.json", json.dumps({**REPORT_OK, "executors": "a"}).encode()),
     ["view", "{p}"], "at executors: 'a' is not of type 'array'"),
    ("report op wrong type", _write("r.json", json.dumps({**REPORT_OK, "ops": {"Conv_x": 3}}).encode()),
     ["view", "{p}"], "at ops/Conv_x"),
    ("report is a directory", lambda d: d, ["view", "{p}"], "is a directory"),
    ("edit report wrong type", _write("r.json", json.dumps({**REPORT_OK, "executors": "a"}).encode()),
     ["edit", "{p}", "--list"], "not a valid torq-gen-config report"),
    ("run without report", lambda d: d / "out", ["run", "--model", str(SQUEEZENET), "--output-dir", "{p}"],
     "no report JSON"),
]


@pytest.mark.parametrize("case,make,argv,words", CASES, ids=[c[0] for c in CASES])
def test_one_line_error(tmp_path, capsys, case, make, argv, words):
    path = make(tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    args = [a.format(p=path, d=tmp_path) for a in argv]
    code = main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("torq-gen-config: error: "), err
    assert words in lines[0], err
    assert "Traceback" not in err
    after = sorted(p.name for p in tmp_path.rglob("*"))
    assert set(before) <= set(after)  # nothing of the user's was removed


# found by the workflow's prepare job: the last line is the error, no traceback
WORKFLOW_CASES = [
    ("input shape of another rank", ["--input-shapes", "data_0:1x3"], "has rank 2, the model's input has rank 4"),
    ("input shape of an unknown input", ["--input-shapes", "nosuch:1x3x224x224"], "which the model does not have"),
]


@pytest.mark.parametrize("case,extra,words", WORKFLOW_CASES, ids=[c[0] for c in WORKFLOW_CASES])
def test_workflow_found_error(tmp_path, case, extra, words):
    p = run_cli("discover", "--model", SQUEEZENET, "--output-dir", tmp_path, "-q", *extra, timeout=300)
    last = [line for line in p.stderr.splitlines() if line.strip()][-1]
    assert p.returncode == 2, p.stderr[-2000:]
    assert last.startswith("torq-gen-config: error: ") and words in last, p.stderr[-2000:]
    assert "Traceback" not in p.stderr


def test_the_snakemake_form_checks_the_model_as_the_command_line_does(tmp_path):
    """preflight in the run context's parse: an input shape the model does not take is the
    same one line before any job (it was a failed prepare job), here in a dry run."""
    snakefile = Path(__file__).resolve().parents[2] / "Snakefile"
    p = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "-s", str(snakefile), "-n", "--cores", "1",
                        "--config", 'input_shapes=["nosuch:1x3x224x224"]', f"output_dir={tmp_path / 'out'}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "--input-shapes names 'nosuch', which the model does not have as input" in p.stdout + p.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("errno_name", ["ENOSPC", "EACCES", "EROFS"])
def test_edit_on_full_or_read_only_disk_changes_nothing(tmp_path, capsys, monkeypatch, errno_name):
    """A full disk or a read-only directory: one line, and the report, the compiler JSON
    and the user choices are all as before (no half-written edit)."""
    import errno
    import tempfile

    from sample_report import make_report

    from torq_gen_config.report.build import build_compiler_json

    out = tmp_path / "out"
    out.mkdir()
    rep = make_report()
    report = out / "torq_gen_config_tiny.json"
    report.write_text(json.dumps(rep, indent=2))
    compiler = out / "torq_gen_config_tiny_compiler.json"
    compiler.write_text(json.dumps(build_compiler_json(rep), indent=2))
    before = {p: p.read_bytes() for p in (report, compiler)}
    real_mkstemp = tempfile.mkstemp
    calls = []

    def failing_mkstemp(*a, **k):  # the second file of the edit cannot be written
        calls.append(k.get("prefix"))
        if len(calls) >= 2:
            code = getattr(errno, errno_name)
            raise OSError(code, os.strerror(code), str(k.get("dir")))
        return real_mkstemp(*a, **k)

    monkeypatch.setattr(tempfile, "mkstemp", failing_mkstemp)
    layer = next(iter(rep["ops"]))
    code = main(["edit", str(report), "--layer", layer, "--executor", "null"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("torq-gen-config: error: "), err
    assert os.strerror(getattr(errno, errno_name)) in lines[0]
    assert {p: p.read_bytes() for p in (report, compiler)} == before
    assert not list(out.glob(".*.tmp")) and not (out / "work").exists()
