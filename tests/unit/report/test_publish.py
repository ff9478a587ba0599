"""report.publish: the one writer of a report and its compiler JSON (discovery, edit and
run all finish there) and the out-of-date mark of a full-model section."""

from __future__ import annotations

import json
import os

import pytest
from sample_report import make_report

from torq_gen_config.core.fileio import json_bytes
from torq_gen_config.fullrun.report_section import stale_reason
from torq_gen_config.report.build import build_compiler_json
from torq_gen_config.report.publish import compiler_json_error, publish_report, read_report_summary


def test_writes_the_report_and_its_compiler_json_together(tmp_path):
    report, compiler = tmp_path / "r.json", tmp_path / "r_compiler.json"
    rep = make_report()
    got = publish_report(report, compiler, rep, rederive=False)
    assert json.loads(report.read_text()) == rep
    assert json.loads(compiler.read_text()) == got == build_compiler_json(rep)


def test_unchanged_files_keep_their_mtime_unless_forced(tmp_path):
    report, compiler = tmp_path / "r.json", tmp_path / "r_compiler.json"
    rep = make_report()
    publish_report(report, compiler, rep, rederive=False)
    old = 1_000_000_000_000_000_000
    for p in (report, compiler):
        os.utime(p, ns=(old, old))
    publish_report(report, compiler, json.loads(report.read_text()), rederive=False)
    assert report.stat().st_mtime_ns == compiler.stat().st_mtime_ns == old
    publish_report(report, compiler, json.loads(report.read_text()), rederive=False, force=True)
    assert report.stat().st_mtime_ns > old and compiler.stat().st_mtime_ns > old


def test_a_failing_write_replaces_no_file(tmp_path):
    report, compiler = tmp_path / "r.json", tmp_path / "r_compiler.json"
    rep = make_report()
    publish_report(report, compiler, rep, rederive=False)
    before = report.read_bytes(), compiler.read_bytes()
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a directory must be")
    rep["ops"][next(iter(rep["ops"]))]["recommended_executor"] = "ort"
    with pytest.raises(OSError):
        publish_report(report, compiler, rep, extra_files={blocked / "user_choices.json": b"{}"})
    assert (report.read_bytes(), compiler.read_bytes()) == before


def test_stale_reason_names_the_moved_layers():
    rep = make_report()
    placed = {lid: (op["recommended_executor"] or "llvm-cpu") for lid, op in rep["ops"].items()}
    section = {"status": "success", "assignment": {"layer_executors": placed}}
    assert stale_reason(section, rep["ops"]) is None
    assert stale_reason({"assignment": {}}, rep["ops"]) is None  # not recorded: cannot be told
    lid = next(lid for lid, op in rep["ops"].items() if op["recommended_executor"] not in (None, "ort"))
    rep["ops"][lid]["recommended_executor"] = "ort"
    reason = stale_reason(section, rep["ops"])
    assert f"{lid} ({placed[lid]} -> ort)" in reason and "torq-gen-config run" in reason
    # the render step puts it in the section and the text, and takes it out again
    rep["full_model"] = section
    publish_copy = json.loads(json_bytes(rep))
    from torq_gen_config.report.build import render_report

    render_report(publish_copy)
    assert publish_copy["full_model"]["stale"] == reason and f"OUT OF DATE: {reason}" in publish_copy["final_report_text"]
    publish_copy["ops"][lid]["recommended_executor"] = placed[lid]
    render_report(publish_copy)
    assert "stale" not in publish_copy["full_model"] and "OUT OF DATE" not in publish_copy["final_report_text"]


def test_the_report_has_one_op_per_line_and_no_other_line_changes(tmp_path):
    report, compiler = tmp_path / "r.json", tmp_path / "r_compiler.json"
    rep = make_report()
    publish_report(report, compiler, rep, rederive=False)
    lines = report.read_text().splitlines()
    op_lines = [l for l in lines if l.startswith("    ") and not l.startswith("     ")
                and l.lstrip().split(":", 1)[0].strip('"') in rep["ops"]]
    assert len(op_lines) == len(rep["ops"])
    for line, (lid, op) in zip(op_lines, rep["ops"].items()):
        key, value = line.strip().rstrip(",").split(": ", 1)
        assert json.loads(key) == lid and json.loads(value) == op
    # everything but the ops is indented as every other JSON file of the tool
    without_ops = {k: v for k, v in rep.items() if k != "ops"}
    text = report.read_text()
    head, tail = text.split('  "ops": {\n', 1)
    assert json.loads(head + tail.split("\n  },\n", 1)[1]) == without_ops
    assert json_bytes(without_ops).decode().splitlines()[1:3] == lines[1:3]


def test_a_compiler_json_that_assigns_nothing_says_why(tmp_path):
    """A model with layers whose compiler JSON would be empty (issue 42 item 2): the
    compiler JSON carries the one-line cause as its error, the report's summary and text
    too (the commands exit non-zero on it), and a later good report clears it."""
    report, compiler = tmp_path / "r.json", tmp_path / "r_compiler.json"
    assert "error" not in publish_report(report, compiler, make_report(), rederive=False)

    no_import = make_report()  # the full-model import failed: no layer has a location
    for op in no_import["ops"].values():
        op["mlir_location"] = None
    no_import["provenance"]["mlir"] = {"status": "error", "message": "ValueError: cannot reshape array of size 0 "
                                       "into shape (130,1,128)\n  more", "unverified_nodes": 3}
    written = publish_report(report, compiler, no_import, rederive=False)
    msg = written["error"]
    assert json.loads(compiler.read_text()) == written and written["op_assignments"] == {}
    assert "\n" not in msg and f"although the model has {len(no_import['ops'])} layer(s)" in msg
    assert "the full-model MLIR import failed (ValueError: cannot reshape array of size 0" in msg
    text, summary = read_report_summary(report)
    assert compiler_json_error(summary) == msg and f"ERROR: {msg}" in text

    no_executor = make_report()  # every executor failed on every layer
    for op in no_executor["ops"].values():
        op["recommended_executor"] = None
    assert "no executor passed any layer" in publish_report(report, compiler, no_executor, rederive=False)["error"]
    assert "error" not in publish_report(report, compiler, make_report(), rederive=False)
    assert compiler_json_error(read_report_summary(report)[1]) is None

    empty = make_report()  # no layer at all: nothing to assign, nothing missing
    empty["ops"] = {}
    assert publish_report(report, compiler, empty, rederive=False)["op_assignments"] == {}
