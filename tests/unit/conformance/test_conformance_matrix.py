"""The conformance matrix from synthetic per-test records: aggregation, expected-failure lists,
the written JSON (against its schemas), Markdown and HTML, and when a stored record is current."""

from __future__ import annotations

import json

import numpy as np
import pytest

from torq_gen_config.conformance import matrix, render, runner
from torq_gen_config.conformance.cases import Selection
from torq_gen_config.conformance.expected import close_to_expected
from torq_gen_config.core.errors import ConfigError
from torq_gen_config.core.schemas import schema_for, validator

FP = "0" * 64


def rec(test, op, opset, **executors) -> dict:
    """A per-test record; executors: name -> (outcome, stage, verdict, message)."""
    return {"schema": matrix.TEST_SCHEMA, "test": test, "op_type": op, "domain": "", "opset": opset,
            "fingerprint": FP, "timeout_s": 600.0, "seconds": 1.5, "rtol": 1e-3, "atol": 1e-7,
            "discover": {"status": "ok", "exit_status": 0, "message": None},
            "reference": {"status": "match", "message": None, "second_engine_mismatch": [], "reference_dispute": False},
            "executors": {n: {"outcome": o, "stage": s, "verdict": v, "message": m}
                          for n, (o, s, v, m) in executors.items()}}


OK = ("passed", None, "success", None)
RECORDS = [
    rec("test_relu", "Relu", 14, cpu=OK, ort=OK),
    rec("test_conv_b", "Conv", 11, cpu=("failed", "compile", "error", "conv: no lowering"), ort=OK),
    rec("test_conv_a", "Conv", 22, cpu=("differing", None, "success", "output 'y': 3 of 9 elements outside"),
        ort=OK),
    rec("test_conv_c", "Conv", 11, cpu=("failed", "run", "error", "trap"),
        ort=("not judged", "refused", None, "exit 1: boom")),
    rec("test_shape", "Shape", 15, cpu=("not judged", "no layer", None, "no layer writes the model output(s) ['y']"),
        ort=("not judged", "no layer", None, "no layer writes the model output(s) ['y']")),
]


@pytest.fixture
def settings(tmp_path):
    config = {"executors": [{"name": "cpu", "backend": "iree"}, {"name": "ort", "backend": "onnxruntime"}],
              "skip_executors": [], "tolerance": {"fp_avg_tol": 0.01}}
    return runner.Settings(out=tmp_path / "out", config=config, timeout_s=600.0)


def test_aggregate_counts_stages_opsets_and_first_error():
    agg = matrix.aggregate(RECORDS, ["cpu", "ort"])
    assert list(agg["ops"]) == ["Conv", "Relu", "Shape"]
    conv = agg["ops"]["Conv"]
    assert conv["tests"] == 3 and conv["opsets"] == [11, 22] and conv["reference"] == {"match": 3}
    cpu = conv["executors"]["cpu"]
    assert (cpu["tests"], cpu["passed"], cpu["differing"], cpu["failed"], cpu["not judged"]) == (3, 0, 1, 2, 0)
    assert cpu["stages"] == {"compile": 1, "run": 1}
    assert cpu["verdicts"] == {"success": 1, "error": 2}
    assert cpu["failing_tests"] == ["test_conv_a", "test_conv_b", "test_conv_c"]
    assert cpu["first_error"] == {"test": "test_conv_a", "outcome": "differing", "stage": None,
                                  "message": "output 'y': 3 of 9 elements outside"}
    # a test the discovery refused is not the executor's failure: not judged, with the reason
    ort = conv["executors"]["ort"]
    assert (ort["passed"], ort["failed"], ort["not judged"]) == (2, 0, 1)
    assert ort["stages"] == {} and ort["not_judged_reasons"] == {"refused": 1}
    assert ort["failing_tests"] == [] and ort["not_judged_tests"] == ["test_conv_c"] and ort["first_error"] is None
    s = agg["summary"]
    assert s["tests"] == 5 and s["executors"]["cpu"]["passed"] == 1 and s["executors"]["ort"]["passed"] == 3
    assert s["executors"]["cpu"]["not judged"] == 1 and s["executors"]["ort"]["not_judged_reasons"] == \
        {"refused": 1, "no layer": 1}
    assert "failing_tests" not in s["executors"]["cpu"] and "not_judged_tests" not in s["executors"]["cpu"]
    assert render.cell_text(cpu) == "0/3 (1 differing, 1 compile, 1 run)"
    assert render.cell_text(ort) == "2/2 (1 not judged: 1 refused)"
    assert render.cell_text(agg["ops"]["Shape"]["executors"]["cpu"]) == "1 not judged: 1 no layer"
    assert render.cell_text(agg["ops"]["Relu"]["executors"]["cpu"]) == "1/1"
    lines = render.summary_lines({"summary": s})
    assert lines[0] == "cpu: passed 1 of 4 judged (25.0%), differing 1, failed 2 (compile 1, run 1); " \
                       "1 not judged: 1 no layer"
    assert lines[1] == "ort: passed 3 of 3 judged (100.0%), differing 0, failed 0; 2 not judged: 1 no layer, 1 refused"


def test_expected_failure_files(tmp_path):
    iree = tmp_path / "config_cpu_llvm_sync.json"
    iree.write_text(json.dumps({"config_name": "cpu", "expected_compile_failures": ["onnx/node/generated/test_conv_b"],
                                "expected_run_failures": ["onnx/node/generated/test_relu", "test_missing"]}))
    assert matrix.load_expected_failures(iree) == {"test_conv_b": "compile", "test_relu": "run",
                                                   "test_missing": "run"}
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps(["test_relu"]))
    assert matrix.load_expected_failures(listed) == {"test_relu": "listed"}
    text = tmp_path / "list.txt"
    text.write_text("# known\ntest_relu\n\ntest_conv_a  # numerics\n")
    assert matrix.load_expected_failures(text) == {"test_relu": "listed", "test_conv_a": "listed"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"skip_run_tests": []}))
    with pytest.raises(ConfigError, match="expected_compile_failures"):
        matrix.load_expected_failures(bad)
    with pytest.raises(ConfigError, match="no-such"):
        matrix.load_expected_failures(tmp_path / "no-such.json")

    comp = matrix.compare_expected(RECORDS, "cpu", matrix.load_expected_failures(iree), str(iree))
    assert comp["listed"] == 3 and comp["listed_not_run"] == 1 and comp["expected_failures"] == 1
    assert comp["unexpected_passes"] == [{"test": "test_relu", "listed_as": "run"}]
    assert [e["test"] for e in comp["unexpected_failures"]] == ["test_conv_a", "test_conv_c"]
    assert comp["stage_differs"] == []
    assert comp["not_judged"] == [{"test": "test_shape", "listed_as": None, "stage": "no layer"}]
    ort = matrix.compare_expected(RECORDS, "ort", {"test_conv_c": "compile"}, "x")  # listed, but not judged here
    assert ort["not_judged"][0] == {"test": "test_conv_c", "listed_as": "compile", "stage": "refused"}
    assert (ort["expected_failures"], ort["unexpected_passes"], ort["unexpected_failures"]) == (0, [], [])
    marked = matrix.mark_records(RECORDS, [comp], [matrix.load_expected_failures(iree)])
    by = {r["test"]: r["executors"]["cpu"] for r in marked}
    assert by["test_relu"]["mark"] == matrix.UNEXPECTED_PASS and by["test_relu"]["expected_failure"] == "run"
    assert by["test_conv_c"]["mark"] == matrix.UNEXPECTED_FAILURE
    assert by["test_conv_b"]["mark"] is None and by["test_conv_b"]["expected_failure"] == "compile"
    assert "mark" not in RECORDS[0]["executors"]["cpu"]  # the records themselves are not changed


def test_written_files_validate_and_render(settings, tmp_path):
    listed = {"test_relu": "run"}
    settings.expected = [("cpu", "list.txt", listed)]
    sel = Selection(cases=[], collected=10, expanded=2, non_tensor_io=1, considered=7, ops=["Conv", "Relu"])
    doc = runner.write_outputs(settings, sel, RECORDS, {"onnx": "1.23.2"}, seconds=3.0, ran=2)
    out = settings.out
    for name in (runner.MATRIX_FILE, runner.VERDICTS_FILE):
        errors = list(validator(schema_for(name)).iter_errors(json.loads((out / name).read_text())))
        assert not errors, errors[:3]
    for r in RECORDS:
        assert not list(validator(schema_for(f"tests/{r['test']}/{runner.RESULT_FILE}")).iter_errors(r))
    assert doc["run"] == {"tests_run": 2, "tests_current": 3, "seconds": 3.0, "jobs": 1}
    md = (out / runner.MARKDOWN_FILE).read_text()
    assert "| Conv | 11-22 | 3 | 0/3 (1 differing, 1 compile, 1 run) | 2/2 (1 not judged: 1 refused) |" in md
    assert "| Shape | 15 | 1 | 1 not judged: 1 no layer | 1 not judged: 1 no layer |" in md
    assert "| Relu | 14 | 1 | 1/1 | 1/1 |" in md
    assert "| Conv | cpu | test_conv_a | differing |  | output 'y': 3 of 9 elements outside |" in md
    assert "unexpected pass: test_relu (listed as a run failure)" in md
    page = (out / runner.HTML_FILE).read_text()
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page and "http" not in page
    assert "class='none'" in page and "class='all'" in page and "conv: no lowering" in page


def test_current_record_fingerprint_and_timeout(tmp_path):
    path = tmp_path / runner.RESULT_FILE
    assert runner.current_record(path, FP, 600) is None  # none yet
    r = rec("test_relu", "Relu", 14, cpu=OK)
    path.write_text(json.dumps(r))
    assert runner.current_record(path, FP, 600) == r
    assert runner.current_record(path, "1" * 64, 600) is None  # something that decides it changed
    r["executors"]["cpu"] = {"outcome": "failed", "stage": "timeout", "verdict": "error", "message": "t"}
    path.write_text(json.dumps(r))
    assert runner.current_record(path, FP, 600) is not None  # a timeout stays with the same limit
    assert runner.current_record(path, FP, 1200) is None  # and is run again with a larger one
    path.write_text("{damaged")
    assert runner.current_record(path, FP, 600) is None


def test_fingerprint_follows_config_and_executors(settings):
    vers = {"onnx": "1.23.2"}
    fp = runner.fingerprint("abc", settings, vers)
    assert fp == runner.fingerprint("abc", settings, vers)
    assert fp != runner.fingerprint("abd", settings, vers)
    assert fp != runner.fingerprint("abc", settings, {"onnx": "1.24.0"})
    settings.config["timeout_s"] = 10  # handled apart (a larger limit redoes timeouts only)
    assert fp == runner.fingerprint("abc", settings, vers)
    settings.config["tolerance"] = {"fp_avg_tol": 0.02}
    fp2 = runner.fingerprint("abc", settings, vers)
    assert fp2 != fp
    settings.config["skip_executors"] = ["ort"]
    assert runner.fingerprint("abc", settings, vers) != fp2


def test_close_to_expected_rule():
    e = np.array([1.0, np.nan, np.inf], dtype=np.float32)
    assert close_to_expected(e.copy(), e, 1e-3, 1e-7) is None
    assert "1 of 3 elements outside" in close_to_expected(np.array([1.01, np.nan, np.inf], np.float32), e, 1e-3, 1e-7)
    assert "dtype" in close_to_expected(e.astype(np.float64), e, 1e-3, 1e-7)
    assert close_to_expected(np.array([1, 2]), np.array([1, 3]), 0, 0).startswith("1 of 2 elements differ exactly")


def test_empty_ops_is_refused_not_every_test(capsys):
    """``--ops ""`` (an empty shell variable) would otherwise select all ~1400 tests."""
    from torq_gen_config.cli.main import main

    assert main(["conformance", "--ops", " , ", "--output-dir", "never-made"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("torq-gen-config: error: --ops names no op type") and "\n" not in err


def test_output_dir_that_cannot_be_made_is_a_config_error(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    settings = runner.Settings(out=afile, config={"executors": []})
    with pytest.raises(ConfigError, match=r"cannot create the output directory .*afile: File exists"):
        runner.run(settings, Selection(cases=[]))
