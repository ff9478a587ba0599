"""Tests of ``torq-gen-config view`` (report/view.py, cli/view.py).

Reports come from report.build.build_report on hand-made results with real
metrics (compare.compare_outputs on small arrays); output is captured with a
non-terminal rich console, so it must be plain text.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from torq_gen_config.compare import compare_outputs
from torq_gen_config.core.errors import ReportError
from torq_gen_config.report.build import build_compiler_json, build_report
from torq_gen_config.report.edit import edit_report_file
from torq_gen_config.report.view import render_summary, resolve_view_path
from torq_gen_config.report.view_compiler import render_compiler, sorted_assignments
from torq_gen_config.report.view_format import make_console
from torq_gen_config.report.view_layer import render_layer

TOL = {"fp_avg_tol": 0.01, "fp_max_tol": 0.01}
# deliberately not the default executor names: columns must come from the report
EXECUTORS = [
    {"name": "npu-a", "backend": "iree", "options": {}},
    {"name": "gpu-b", "backend": "iree", "options": {}},
    {"name": "host", "backend": "onnxruntime", "options": {}},
]
LONG_ID = "Gather_" + "very_long_output_name_" * 5  # 117 characters
ANSI = re.compile(r"\x1b\[")


def _metrics(rel):
    r = np.linspace(1.0, 2.0, 100)
    return compare_outputs({"y": r * (1 + rel)}, {"y": r}, ["y"])


def _ok(rel=1e-6, compile_ms=10.0, run_ms=2.0):
    return {"status": "success" if rel <= 0.01 else "difference", "backend": "iree", "tolerance_used": TOL,
            "metrics": _metrics(rel), "failure_report": None,
            "timing": {"compile_ms": compile_ms, "run_ms": run_ms}, "reference": {"status": "ok"}}


def _err(stage, summary, message):
    return {"status": "error", "backend": "iree", "tolerance_used": TOL, "metrics": None,
            "failure_report": {"type": "error", "stage": stage, "summary": summary, "message": message},
            "timing": {"compile_ms": 7.0, "run_ms": None}, "reference": {"status": "ok"}}


def make_report(**kw):
    layers = [
        {"layer_id": "Conv_conv1", "slug": "c1", "op_type": "Conv", "node_index": 0, "mlir_location": "100:12",
         "mac_count": 442368, "skipped_reason": None},
        {"layer_id": "Relu_relu1", "slug": "r1", "op_type": "Relu", "node_index": 1, "mlir_location": "42:12",
         "mac_count": None, "skipped_reason": None},
        {"layer_id": LONG_ID, "slug": "g", "op_type": "Gather", "node_index": 2, "mlir_location": None,
         "mac_count": None, "skipped_reason": None},
        {"layer_id": "Add_out", "slug": "a", "op_type": "Add", "node_index": 3, "mlir_location": "42:3",
         "mac_count": None, "skipped_reason": None},
    ]
    results = {
        "Conv_conv1": {"npu-a": _ok(0.03, compile_ms=12.0, run_ms=4.0), "gpu-b": _ok(compile_ms=20.0, run_ms=1.0),
                       "host": _ok(compile_ms=1.0, run_ms=3.0)},
        "Relu_relu1": {
            "npu-a": _err("compile", "legalization failed",
                          "error: failed to legalize 'linalg.generic'\n" + "\n".join(f"note {i}" for i in range(20))),
            "gpu-b": _err("run", "device lost", "device lost"),
            "host": _err("timeout", "timed out after 300 s", "timed out after 300 s"),
        },
        LONG_ID: {"npu-a": _ok(compile_ms=14.0, run_ms=6.0), "host": _ok()},
        "Add_out": {"npu-a": _ok(compile_ms=4.0, run_ms=2.0), "gpu-b": _ok(), "host": _ok()},
    }
    args = dict(model_name="tiny", layers=layers, results=results, executors=EXECUTORS, default_tolerance=TOL,
                mlir_file="work/full.mlir", provenance={})
    args.update(kw)
    return build_report(**args)


def render(fn, data, *args):
    buf = io.StringIO()
    fn(data, *args, make_console(file=buf)) if args else fn(data, make_console(file=buf))
    text = buf.getvalue()
    assert not ANSI.search(text), "colour codes in non-terminal output"
    return text


@pytest.fixture()
def out_dir(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    rep = make_report()
    (out / "torq_gen_config_tiny.json").write_text(json.dumps(rep))
    (out / "torq_gen_config_tiny_compiler.json").write_text(json.dumps(build_compiler_json(rep)))
    return out


def cli(*argv):
    """``torq-gen-config view ARGV`` in this process, through the console script's own
    entry point: returns its exit status (errors: status 2 and the one-line message)."""
    from torq_gen_config.cli.main import main

    return main(["view", *map(str, argv)])


def _row(text, first_cell):
    rows = [ln.split() for ln in text.splitlines() if ln.startswith(first_cell)]
    assert len(rows) == 1, (first_cell, rows)
    return rows[0]


# ---------------------------------------------------------------- summary


def test_summary_counts_timing_critical_and_tolerance():
    text = render(render_summary, make_report())
    assert "MODEL: tiny" in text
    assert "Executors (priority order): npu-a, gpu-b, host" in text
    assert "  success: 7" in text and "  difference: 1" in text and "  error: 3" in text
    assert "  unverified: 0" in text
    recs = text[text.index("RECOMMENDED EXECUTORS:"):text.index("TIMING SUMMARY")]
    assert [ln.strip() for ln in recs.splitlines()[1:5]] == ["npu-a: 2", "gpu-b: 1", "host: 0", "(none): 1"]
    # timing: npu-a over its 3 non-error runs: compile 12, 14, 4 -> avg 10.0; run 4, 6, 2 -> avg 4.0
    assert _row(text, "npu-a ")[:9] == ["npu-a", "10.0", "4.0", "14.0", "3", "4.0", "2.0", "6.0", "3"]
    assert _row(text, "gpu-b ")[-1] == "2"
    assert "CRITICAL FAILURES (all executors error; no executor ran the layer): 1" in text
    assert "  - Relu_relu1 (node: 1)" in text
    assert "DEFAULT TOLERANCE: fp_avg_tol=0.01, fp_max_tol=0.01" in text


def test_summary_table_columns_from_report_and_rows():
    text = render(render_summary, make_report())
    header = _row(text, "Layer ")
    assert header == ["Layer", "npu-a", "gpu-b", "host", "Recommended"]
    assert _row(text, "Conv_conv1 ") == ["Conv_conv1", "difference", "success", "success", "gpu-b"]
    assert _row(text, "Relu_relu1 ") == ["Relu_relu1", "error", "error", "error", "-"]
    # long id cut to 60 characters; missing executor shown as "-"
    cut = LONG_ID[:57] + "..."
    assert _row(text, cut) == [cut, "success", "-", "success", "npu-a"]
    assert LONG_ID not in text
    assert "Tolerance override" not in text


def test_summary_marks_person_made_choices(tmp_path, out_dir):
    path = out_dir / "torq_gen_config_tiny.json"
    edit_report_file(path, "Add_out", executor="host")
    edit_report_file(path, "Conv_conv1", tolerance_avg=0.05, tolerance_max=0.05)
    text = render(render_summary, json.loads(path.read_text()))
    assert _row(text, "Add_out ")[-2:] == ["host", "(user)"]
    conv = _row(text, "Conv_conv1 ")
    assert conv[:5] == ["Conv_conv1", "success", "success", "success", "npu-a"]
    assert conv[5:] == ["avg=0.05", "max=0.05"]
    assert "set by a person: 1" in text


def test_summary_without_timing_has_no_timing_section():
    rep = make_report()
    for op in rep["ops"].values():  # the summary shown is computed from the layers
        for entry in op["executors"].values():
            entry.pop("timing", None)
    assert "TIMING SUMMARY" not in render(render_summary, rep)
    assert "TIMING SUMMARY" in render(render_summary, make_report())


def test_colours_only_on_a_terminal():
    buf = io.StringIO()
    render_summary(make_report(), make_console(file=buf, force_terminal=True))
    assert ANSI.search(buf.getvalue())
    plain = io.StringIO()
    render_summary(make_report(), make_console(file=plain))
    assert not ANSI.search(plain.getvalue())


def test_cli_output_piped_is_plain(out_dir):
    """The command's own console, writing to a pipe, prints no colour codes."""
    code = textwrap.dedent(f"""
        import argparse
        from torq_gen_config.cli import view
        p = argparse.ArgumentParser(); sub = p.add_subparsers()
        view.add_parser(sub)
        a = p.parse_args(["view", {str(out_dir / "torq_gen_config_tiny.json")!r}])
        a.func(a)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"TERM": "xterm-256color", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert "Per-Layer Status:" in proc.stdout
    assert not ANSI.search(proc.stdout)
    # not wrapped at 80 columns
    assert any(len(ln) > 80 for ln in proc.stdout.splitlines())


def test_cli_output_into_a_pipe_closed_early_exits_0_without_traceback(out_dir):
    """`torq-gen-config view ... | head -1`: the reader had enough; no traceback, status 0."""
    import os

    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # the reader is gone before the first line
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-m", "torq_gen_config", "view", str(out_dir / "torq_gen_config_tiny.json")],
                          stdout=write_fd, stderr=subprocess.PIPE, text=True, timeout=120, env=env)
    os.close(write_fd)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_edit_list_into_a_pipe_closed_early_exits_0(out_dir):
    """`torq-gen-config edit --list ... | head -1` only prints: the same rule as view (issue 38)."""
    import os

    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    proc = subprocess.run([sys.executable, "-m", "torq_gen_config", "edit", str(out_dir / "torq_gen_config_tiny.json"),
                           "--list"], stdout=write_fd, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write_fd)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------- layer details


def test_layer_details_difference_layer():
    text = render(render_layer, make_report(), "Conv_conv1")
    assert "LAYER: Conv_conv1" in text
    assert "Node index:     0" in text
    assert "Op type:        Conv" in text
    assert "MLIR location:  100:12 (in work/full.mlir)" in text
    assert "MACs:           442,368" in text
    assert "Recommended:    gpu-b  (chosen by discovery)" in text
    assert "Tolerance:      default fp_avg_tol=0.01, fp_max_tol=0.01" in text
    assert "[npu-a] difference   compile 12.0 ms, run 4.0 ms" in text
    assert "max rel diff:      0.03" in text
    assert "mean rel diff:     0.03" in text
    assert "cosine similarity: 1.000000" in text
    assert "over tolerance:    100 of 100 (100.00%)" in text
    assert "failure:           accuracy_failure at stage compare" in text
    assert "[gpu-b] success   compile 20.0 ms, run 1.0 ms" in text
    assert "over tolerance:    0 of 100 (0.00%)" in text
    assert text.index("[npu-a]") < text.index("[gpu-b]") < text.index("[host]")


def test_layer_details_errors_and_message_lines():
    text = render(render_layer, make_report(), "Relu_relu1")
    assert "Recommended:    -" in text
    assert "[npu-a] error   compile 7.0 ms, run - ms" in text
    assert "failure:           error at stage compile" in text
    assert "summary:           legalization failed" in text
    assert "error: failed to legalize 'linalg.generic'" in text
    assert "note 6" in text and "note 7" not in text  # first 8 lines only
    assert "13 more line(s)" in text
    assert "failure:           error at stage timeout" in text
    assert "MACs" not in text


def test_layer_details_person_made_choices(out_dir):
    path = out_dir / "torq_gen_config_tiny.json"
    edit_report_file(path, "Conv_conv1", executor="host")
    edit_report_file(path, "Conv_conv1", tolerance_avg=0.05, tolerance_max=0.05)
    text = render(render_layer, json.loads(path.read_text()), "conv_CONV1")  # case-insensitive
    assert "Recommended:    host (user)  (set by a person with 'edit')" in text
    assert "Tolerance:      override fp_avg_tol=0.05, fp_max_tol=0.05 (set by a person)" in text
    assert "[npu-a] success" in text
    assert "tolerance used:    fp_avg_tol=0.05, fp_max_tol=0.05" in text


def test_layer_details_unmapped_location():
    text = render(render_layer, make_report(), LONG_ID)
    assert "MLIR location:  Gather (no MLIR line:col; not in the compiler JSON)" in text


def test_unknown_layer_lists_close_matches():
    with pytest.raises(ReportError) as e:
        render(render_layer, make_report(), "Conv_conv")
    assert "no layer 'Conv_conv'" in str(e.value) and "Conv_conv1" in str(e.value)


# ---------------------------------------------------------------- compiler JSON


def test_compiler_view_sorted_numerically():
    data = {"op_assignments": {"100:12": {"executor": "npu-a"}, "42:12": {"executor": "host"},
                               "9:3": {"executor": "npu-a"}, "42:3": {"executor": "npu-a"}},
            "model_name": "tiny"}
    text = render(render_compiler, data)
    assert "MODEL: tiny (compiler format)" in text
    assert "Total assignments: 4" in text
    assert "  npu-a: 3" in text and "  host: 1" in text
    lines = [ln.strip() for ln in text.splitlines() if "->" in ln]
    assert lines == ["9:3 -> npu-a", "42:3 -> npu-a", "42:12 -> host", "100:12 -> npu-a"]
    assert [loc for loc, _ in sorted_assignments(data["op_assignments"])] == ["9:3", "42:3", "42:12", "100:12"]


def test_cli_compiler_view_from_report_output(out_dir, capsys):
    assert cli(out_dir / "torq_gen_config_tiny_compiler.json") == 0
    text = capsys.readouterr().out
    assert text.index("42:3 -> npu-a") < text.index("100:12 -> gpu-b")
    # Relu_relu1 (42:12) has no recommendation, the Gather no location
    assert "Total assignments: 2" in text and "42:12" not in text


# ---------------------------------------------------------------- paths and CLI


def test_cli_report_path_and_layer(out_dir, capsys):
    path = out_dir / "torq_gen_config_tiny.json"
    assert cli(path) == 0
    assert "Per-Layer Status:" in capsys.readouterr().out
    assert cli(path, "Add_out") == 0
    assert "LAYER: Add_out" in capsys.readouterr().out
    assert cli(path, "Nope") == 2
    assert "no layer 'Nope'" in capsys.readouterr().err


def test_cli_model_output_dir(out_dir, tmp_path, capsys):
    assert cli("--model", tmp_path / "tiny.onnx", "--output-dir", out_dir) == 0
    assert "MODEL: tiny" in capsys.readouterr().out
    assert cli("--model", "tiny.onnx", "--output-dir", out_dir, "Conv_conv1") == 0
    assert "LAYER: Conv_conv1" in capsys.readouterr().out


def test_cli_model_falls_back_to_compiler_json(out_dir, capsys):
    (out_dir / "torq_gen_config_tiny.json").unlink()
    assert cli("--model", "tiny.onnx", "--output-dir", out_dir) == 0
    captured = capsys.readouterr()
    assert "MODEL: tiny (compiler format)" in captured.out
    assert "note: report JSON" in captured.err and "showing the compiler JSON" in captured.err
    assert cli("--model", "tiny.onnx", "--output-dir", out_dir, "Conv_conv1") == 2
    assert "layer details need the report JSON" in capsys.readouterr().err


def test_cli_model_neither_file(tmp_path, capsys):
    assert cli("--model", "tiny.onnx", "--output-dir", tmp_path) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "torq_gen_config_tiny.json") in err
    assert str(tmp_path / "torq_gen_config_tiny_compiler.json") in err
    with pytest.raises(ReportError, match="give a report JSON path"):
        resolve_view_path(None, None, None)


def test_cli_bad_json(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    assert cli(bad) == 2
    assert "is not valid JSON" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text('{"a": 1}')
    assert cli(other) == 2
    assert "neither a torq-gen-config report JSON" in capsys.readouterr().err


def test_narrow_terminal_does_not_cut_table_cells():
    buf = io.StringIO()
    console = make_console(file=buf, force_terminal=True)
    console.width = 40
    render_summary(make_report(), console)
    text = re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue())
    assert _row(text, LONG_ID[:57] + "...")[1:] == ["success", "-", "success", "npu-a"]
    assert _row(text, "Conv_conv1 ")[1:] == ["difference", "success", "success", "gpu-b"]


def test_view_says_when_nan_elements_were_equal_and_left_out_of_the_diffs():
    import numpy as np

    from torq_gen_config.compare import compare_outputs
    from torq_gen_config.report.view_layer import _nonfinite_equal_text

    r = np.array([1.0, np.nan, 2.0, np.inf], np.float32)
    m = compare_outputs({"y": r.copy()}, {"y": r}, ["y"])
    assert m["max_abs_diff"] == 0.0 and not m["inconclusive"]
    assert _nonfinite_equal_text(m) == ("2 of 4 element(s) NaN/inf in both output and reference (equal); the diffs "
                                        "above are over the finite ones")
    clean = compare_outputs({"y": np.ones(3, np.float32)}, {"y": np.ones(3, np.float32) * 2}, ["y"])
    assert _nonfinite_equal_text(clean) is None


def test_layer_details_mark_a_success_that_could_not_have_failed():
    """The per-executor head line says success*, as the layer table does (found by a new user)."""
    rep = make_report()
    entry = rep["ops"]["Add_out"]["executors"]["host"]
    const = np.full(8, 0.001, np.float32)
    entry["metrics"] = compare_outputs({"y": const}, {"y": const}, ["y"])
    text = render(render_layer, rep, "Add_out")
    assert "[host] success*" in text and "INCONCLUSIVE:      reference is constant" in text
    assert "[npu-a] success " in text  # the others unchanged


# ---------------------------------------------------------------- the original tool's reports

#: A report as the original tool wrote it (docs/original_tool.md, "Commands and files" and
#: "Report JSON": TFLite layer IDs, no model_name, a summary with only total_layers and status_counts).
SEED_REPORT = {
    "ops": {
        "CONV_2D_0": {"executors": {"nss": {"status": "success"}, "css": {"status": "difference"},
                                    "host": {"status": "success"}},
                      "recommended_executor": "nss", "_node_index": 0, "mlir_location": "42:12"},
        "DEQUANTIZE_1": {"executors": {"nss": {"status": "error"}, "css": {"status": "difference"},
                                       "host": {"status": "success"}},
                         "recommended_executor": "css", "_node_index": 1, "mlir_location": "43:12"},
        "SOFTMAX_2": {"executors": {"nss": {"status": "error"}, "css": {"status": "error"},
                                    "host": {"status": "error"}},
                      "recommended_executor": None, "_node_index": 2, "mlir_location": "44:12"},
    },
    "discovery_report": {"summary": {"total_layers": 3, "status_counts": {"success": 3}},
                         "critical_failures": []},
}


def test_seed_format_report_views_and_edits_like_ours(tmp_path, capsys):
    """The original tool's report: the name from the file name, the counts from the ops (its
    stored summary says 3 successes and lists no critical failure), and an edit writes a
    compiler JSON that carries the name."""
    path = tmp_path / "torq_gen_config_mobilenet_v1.json"
    path.write_text(json.dumps(SEED_REPORT))
    assert cli(path) == 0
    text = capsys.readouterr().out
    assert "MODEL: mobilenet_v1 (name from the file name)" in text and "MODEL: None" not in text
    assert "Executors (priority order): nss, css, host" in text
    assert re.search(r"success:\s+3\b", text) and re.search(r"difference:\s+2\b", text)
    assert re.search(r"error:\s+4\b", text)
    rec = text[text.index("RECOMMENDED EXECUTORS"):]
    assert re.search(r"nss: 1\b", rec) and re.search(r"css: 1\b", rec) and re.search(r"host: 0\b", rec)
    assert re.search(r"\(none\): 1\b", rec)
    assert "CRITICAL FAILURES (all executors error; no executor ran the layer): 1" in text
    assert "SOFTMAX_2" in text[text.index("CRITICAL FAILURES"):]

    edit_report_file(path, "SOFTMAX_2", executor="host")
    compiler = json.loads((tmp_path / "torq_gen_config_mobilenet_v1_compiler.json").read_text())
    assert compiler["model_name"] == "mobilenet_v1" and compiler["op_assignments"]["44:12"] == {"executor": "host"}
    rep = json.loads(path.read_text())
    assert rep["discovery_report"]["summary"]["executor_counts"] == {"nss": 1, "css": 1, "host": 1}

    from torq_gen_config.cli.main import main

    assert main(["report", str(path)]) == 0  # the HTML page: the same name and counts
    page = (tmp_path / "torq_gen_config_mobilenet_v1.html").read_text()
    assert "<h1>torq-gen-config: mobilenet_v1</h1>" in page and "priority order: nss, css, host" in page

    bare = tmp_path / "torq_gen_config_resnet_compiler.json"  # a compiler JSON without model_name
    bare.write_text(json.dumps({"op_assignments": {"42:12": "nss"}}))
    assert cli(bare) == 0
    assert "MODEL: resnet (name from the file name) (compiler format)" in capsys.readouterr().out
