"""Runtime timing (collect_timing) and the timing-based recommendation (recommend_by_timing).

Backend measurements use the real tools (iree-benchmark-module, onnxruntime) on a
small Conv layer; the end-to-end tests (marked ``slow``) run the workflow in both
forms on a hand-built Conv -> Relu model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import TensorProto, helper, make_model, run_cli, run_snakemake, tvi
from onnx import numpy_helper

from torq_gen_config.backends import StageError, make_backend
from torq_gen_config.backends.base import Backend, CompiledArtifact
from torq_gen_config.backends.iree_tools import parse_benchmark_json
from torq_gen_config.backends.timing import runtime_stats
from torq_gen_config.report.build import build_report
from torq_gen_config.report.summary import summarize
from torq_gen_config.report.recommend import (
    REASON_NO_TIMING,
    recommend_executor,
    recommend_with_reason,
)
from torq_gen_config.core.tools import find_tool, run_tool

EXECUTORS = [
    {"name": "llvm-cpu", "backend": "iree", "options": {"target": "llvm-cpu", "device": "local-task"}},
    {"name": "vmvx", "backend": "iree", "options": {"target": "vmvx", "device": "local-task"}},
    {"name": "ort", "backend": "onnxruntime", "options": {"providers": ["CPUExecutionProvider"]}},
]
NAMES = [e["name"] for e in EXECUTORS]
TOL = {"fp_avg_tol": 0.01, "fp_max_tol": 0.01}
INPUT_SETTINGS = {"seed": 1234, "float_range": [-1.0, 1.0], "int_range": [-40, 40], "uint8_range": [0, 80]}


# ----------------------------------------------------------------------- models

def conv_layer(path: Path) -> str:
    """One Conv 1x3x32x32 -> 1x8x32x32, graph named "main" (the IREE function)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((8,)).astype(np.float32), "b")
    m = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], name="conv")],
                   [tvi("x", TensorProto.FLOAT, [1, 3, 32, 32])], [tvi("y", TensorProto.FLOAT, [1, 8, 32, 32])],
                   [w, b], name="main")
    onnx.save(m, path)
    return str(path)


def conv_relu_model(path: Path) -> Path:
    """Conv -> Relu on 1x3x32x32: two layers, fast to compile on every executor."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.2).astype(np.float32), "w")
    b = numpy_helper.from_array(np.full((8,), 0.1, np.float32), "b")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    m = make_model(nodes, [tvi("x", TensorProto.FLOAT, [1, 3, 32, 32])], [tvi("y", TensorProto.FLOAT, [1, 8, 32, 32])],
                   [w, b])
    onnx.save(m, path)
    return path


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    d = tmp_path_factory.mktemp("conv")
    onnx_path = conv_layer(d / "conv.onnx")
    mlir = str(d / "conv.mlir")
    res = run_tool([find_tool("iree-import-onnx"), onnx_path, "-o", mlir], timeout_s=120)
    assert res.returncode == 0, res.stderr
    x = np.random.default_rng(2).uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32)
    return {"onnx": onnx_path, "mlir": mlir, "inputs": {"x": x}}


def _compile(executor: dict, conv: dict, work: Path):
    backend = make_backend(executor)
    artifact = backend.compile(onnx_path=conv["onnx"], mlir_path=conv["mlir"] if backend.needs_mlir else None,
                               work_dir=str(work), timeout_s=300, log_path=str(work / "log.txt"))
    return backend, artifact


def _bench(backend, artifact, conv, work: Path, runs=5, warmup=1, inputs=None):
    return backend.benchmark(artifact, inputs=inputs or conv["inputs"], input_names=["x"], output_names=["y"],
                             work_dir=str(work), runs=runs, warmup=warmup, timeout_s=120,
                             log_path=str(work / "log.txt"))


# ------------------------------------------------------------ backend.benchmark

MEASURED: dict[str, float] = {}


@pytest.mark.parametrize("executor", EXECUTORS, ids=NAMES)
def test_backend_benchmark_conv(executor, conv, tmp_path):
    backend, artifact = _compile(executor, conv, tmp_path)
    outputs, run_ms = backend.run(artifact, inputs=conv["inputs"], input_names=["x"], output_names=["y"],
                                  work_dir=str(tmp_path), timeout_s=120, log_path=None)
    t = _bench(backend, artifact, conv, tmp_path, runs=5, warmup=2)
    assert set(t) == {"runs", "warmup", "median_ms", "min_ms", "mean_ms", "max_ms", "samples_ms", "method"}
    assert t["runs"] == 5 and t["warmup"] == 2 and len(t["samples_ms"]) == 5
    assert 0 < t["min_ms"] <= t["median_ms"] <= t["max_ms"]
    assert t["min_ms"] <= t["mean_ms"] <= t["max_ms"]
    assert t["min_ms"] == min(t["samples_ms"]) and t["max_ms"] == max(t["samples_ms"])
    assert t["median_ms"] == sorted(t["samples_ms"])[2]
    json.dumps(t)
    if backend.kind == "iree":
        assert t["method"].startswith("iree-benchmark-module") and "start-up" in t["method"]
        # in-process: well below the wall time of an iree-run-module process
        assert t["median_ms"] < run_ms
        log = (tmp_path / "log.txt").read_text()
        assert "--benchmark_repetitions=7" in log and "--benchmark_min_time=1x" in log
    else:
        assert t["method"].startswith("onnxruntime")
    MEASURED[executor["name"]] = t["median_ms"]
    print(f"{executor['name']}: median {t['median_ms']} ms, min {t['min_ms']} ms, samples {t['samples_ms']}")


def test_iree_benchmark_failure_is_a_stage_error(conv, tmp_path):
    backend, artifact = _compile(EXECUTORS[0], conv, tmp_path)
    wrong = {"x": np.zeros((1, 3, 16, 16), np.float32)}
    with pytest.raises(StageError) as ei:
        _bench(backend, artifact, conv, tmp_path, inputs=wrong)
    assert ei.value.stage == "run" and ei.value.message


def test_iree_benchmark_timeout(conv, tmp_path):
    backend, artifact = _compile(EXECUTORS[1], conv, tmp_path)  # vmvx: ~6 ms per call
    with pytest.raises(StageError) as ei:
        backend.benchmark(artifact, inputs=conv["inputs"], input_names=["x"], output_names=["y"],
                          work_dir=str(tmp_path), runs=100000, warmup=0, timeout_s=1, log_path=None)
    assert ei.value.stage == "timeout" and ei.value.during == "run"


def test_ort_benchmark_timeout(conv, tmp_path):
    backend, artifact = _compile(EXECUTORS[2], conv, tmp_path)
    with pytest.raises(StageError) as ei:
        backend.benchmark(artifact, inputs=conv["inputs"], input_names=["x"], output_names=["y"],
                          work_dir=str(tmp_path), runs=10**8, warmup=0, timeout_s=0.2, log_path=None)
    assert ei.value.stage == "timeout" and ei.value.during == "run"


@pytest.mark.parametrize("runs,warmup", [(0, 1), (3, -1), (True, 1), (2.5, 0)])
def test_benchmark_rejects_bad_counts(conv, tmp_path, runs, warmup):
    backend, artifact = _compile(EXECUTORS[2], conv, tmp_path)
    with pytest.raises(ValueError, match="benchmark"):
        _bench(backend, artifact, conv, tmp_path, runs=runs, warmup=warmup)


def test_base_backend_has_no_benchmark():
    class Plain(Backend):
        kind = "plain"

        def compile(self, **kw):  # pragma: no cover - not called
            raise AssertionError

        def run(self, artifact, **kw):  # pragma: no cover - not called
            raise AssertionError

        def describe(self):
            return {}

    with pytest.raises(NotImplementedError, match="plain"):
        Plain("p", {}).benchmark(CompiledArtifact(None, None), inputs={}, input_names=[], output_names=[],
                                 work_dir=".", runs=1, warmup=0, timeout_s=1, log_path=None)


def test_runtime_stats():
    t = runtime_stats([4.0, 1.0, 3.0, 2.0], warmup=1, method="m")
    assert t == {"runs": 4, "warmup": 1, "median_ms": 2.5, "min_ms": 1.0, "mean_ms": 2.5, "max_ms": 4.0,
                 "samples_ms": [4.0, 1.0, 3.0, 2.0], "method": "m"}
    t = runtime_stats([0.123456789, 0.2, 0.1], warmup=0, method="m")
    assert t["median_ms"] == 0.1235 and t["min_ms"] == 0.1 and t["samples_ms"][0] == 0.1235
    with pytest.raises(ValueError):
        runtime_stats([], warmup=0, method="m")


def test_parse_benchmark_json_uses_repetitions_not_aggregates():
    rows = [{"name": "BM_main/process_time/real_time", "run_name": "BM_main/process_time/real_time",
             "run_type": "iteration", "repetition_index": i, "iterations": 1, "real_time": t, "time_unit": unit}
            for i, (t, unit) in enumerate([(50.0, "us"), (0.04, "ms"), (30000.0, "ns")])]
    rows.append({"name": "BM_main/process_time/real_time_median", "run_name": "BM_main/process_time/real_time",
                 "run_type": "aggregate", "aggregate_name": "median", "iterations": 3, "real_time": 9.0,
                 "time_unit": "ms"})
    text = "some banner\n" + json.dumps({"context": {}, "benchmarks": [rows[1], rows[0], rows[3], rows[2]]})
    assert parse_benchmark_json(text) == pytest.approx([0.05, 0.04, 0.03])
    with pytest.raises(StageError, match="no JSON"):
        parse_benchmark_json("Failed to match any benchmarks")


# ----------------------------------------------------------- run_layer_test

def _layer_test(conv, tmp_path, executor, timing):
    from torq_gen_config.discovery.layer_test import run_layer_test
    from torq_gen_config.reference import compute_reference

    ref = tmp_path / "reference.npz"
    compute_reference(conv["onnx"], ref, INPUT_SETTINGS)
    work = tmp_path / executor["name"]
    return run_layer_test(layer={"layer_id": "Conv_y", "slug": "Conv_y", "op_type": "Conv", "node_index": 0},
                          executor=executor, layer_onnx=conv["onnx"], reference_npz=str(ref),
                          layer_mlir=conv["mlir"], import_status=None, work_dir=str(work),
                          result_path=str(work / "result.json"), log_path=str(work / "log.txt"),
                          tolerance=TOL, timeout_s=300, timing=timing)


def test_run_layer_test_records_runtime(conv, tmp_path):
    res = _layer_test(conv, tmp_path, EXECUTORS[0], {"runs": 3, "warmup": 1})
    assert res["status"] == "success"
    t = res["timing"]
    assert t["compile_ms"] > 0 and t["run_ms"] > 0
    assert t["runtime"]["runs"] == 3 and t["runtime"]["warmup"] == 1 and len(t["runtime"]["samples_ms"]) == 3
    assert "runtime_error" not in t
    assert json.loads((tmp_path / "llvm-cpu" / "result.json").read_text())["timing"] == t
    # without timing: no runtime measured
    res = _layer_test(conv, tmp_path, EXECUTORS[2], None)
    assert set(res["timing"]) == {"compile_ms", "run_ms"}


def test_benchmark_failure_keeps_the_verdict(conv, tmp_path, monkeypatch):
    from torq_gen_config.backends.onnxruntime import OnnxRuntimeBackend

    def broken(self, artifact, **kw):
        raise StageError("crash", "benchmark died: SIGSEGV", during="run")

    monkeypatch.setattr(OnnxRuntimeBackend, "benchmark", broken)
    res = _layer_test(conv, tmp_path, EXECUTORS[2], {"runs": 3, "warmup": 0})
    assert res["status"] == "success" and res["failure_report"] is None
    assert "runtime" not in res["timing"]
    assert res["timing"]["runtime_error"]["stage"] == "crash"
    assert "SIGSEGV" in res["timing"]["runtime_error"]["summary"]
    assert res["timing"]["compile_ms"] is not None and res["timing"]["run_ms"] is not None


# --------------------------------------------------------- recommendation

def _r(status, median=None):
    timing = {"compile_ms": 1.0, "run_ms": 1.0}
    if median is not None:
        timing["runtime"] = {"median_ms": median, "min_ms": median, "runs": 3}
    return {"status": status, "timing": timing}


def test_fastest_success_wins_over_priority():
    results = {"llvm-cpu": _r("success", 0.06), "vmvx": _r("success", 6.2), "ort": _r("success", 0.018)}
    assert recommend_with_reason(results, NAMES) == ("llvm-cpu", "priority")
    name, reason = recommend_with_reason(results, NAMES, by_timing=True)
    assert name == "ort" and reason == "fastest success (0.018 ms median)"
    assert recommend_executor(results, NAMES, by_timing=True) == "ort"
    assert recommend_executor(results, NAMES) == "llvm-cpu"


def test_fastest_success_beats_faster_difference_and_ignores_untimed():
    results = {"llvm-cpu": _r("success"), "vmvx": _r("success", 6.0), "ort": _r("difference", 0.01)}
    assert recommend_with_reason(results, NAMES, by_timing=True) == ("vmvx", "fastest success (6.000 ms median)")
    # ties go to the higher priority
    results = {"llvm-cpu": _r("success", 1.0), "vmvx": _r("success", 1.0)}
    assert recommend_with_reason(results, NAMES, by_timing=True)[0] == "llvm-cpu"


def test_fastest_difference_only_without_success():
    results = {"llvm-cpu": _r("error"), "vmvx": _r("difference", 6.0), "ort": _r("difference", 0.02)}
    assert recommend_with_reason(results, NAMES, by_timing=True) == ("ort", "fastest difference (0.020 ms median)")
    results["vmvx"] = _r("success", 9.0)
    assert recommend_with_reason(results, NAMES, by_timing=True)[0] == "vmvx"


def test_by_timing_falls_back_to_priority_without_timing():
    results = {"llvm-cpu": _r("difference", 0.01), "vmvx": _r("success"), "ort": _r("success")}
    assert recommend_with_reason(results, NAMES, by_timing=True) == ("vmvx", REASON_NO_TIMING)
    assert REASON_NO_TIMING == "priority (no timing data)"
    assert recommend_with_reason({"a": _r("error")}, ["a"], by_timing=True) == (None, "no working executor")
    name, reason = recommend_with_reason({"a": _r("unverified", 1.0)}, ["a"], by_timing=True)
    assert name == "a" and reason.startswith("priority")


def test_report_entries_summary_and_text_with_timing():
    layers = [{"layer_id": f"L{i}", "slug": f"l{i}", "op_type": "Conv", "node_index": i, "mlir_location": f"{i + 1}:3",
               "mac_count": None, "skipped_reason": None} for i in range(2)]
    timed = {
        "llvm-cpu": {"status": "success", "timing": {"compile_ms": 500.0, "run_ms": 6.0, "runtime": runtime_stats(
            [0.07, 0.06, 0.065], warmup=1, method="iree")}},
        "ort": {"status": "success", "timing": {"compile_ms": 3.0, "run_ms": 0.5, "runtime": runtime_stats(
            [0.02, 0.0181, 0.019], warmup=1, method="ort")}},
        "vmvx": {"status": "success", "timing": {"compile_ms": 400.0, "run_ms": 11.0,
                                                 "runtime_error": {"stage": "crash", "summary": "died"}}},
    }
    untimed = {n: {"status": "success", "timing": {"compile_ms": 1.0, "run_ms": 1.0}} for n in NAMES}
    results = {"L0": timed, "L1": untimed}
    rep = build_report(model_name="m", layers=layers, results=results, executors=EXECUTORS, default_tolerance=TOL,
                       mlir_file=None, provenance={}, recommend_by_timing=True)
    l0 = rep["ops"]["L0"]
    assert l0["recommended_executor"] == "ort" and l0["recommendation_reason"] == "fastest success (0.019 ms median)"
    t = l0["executors"]["ort"]["timing"]
    assert t["runtime_ms"] == 0.019 and t["runs"] == 3 and t["median_ms"] == 0.019 and t["min_ms"] == 0.0181
    assert t["compile_ms"] == 3.0 and t["run_ms"] == 0.5 and t["warmup"] == 1
    assert l0["executors"]["vmvx"]["timing"]["runtime_error"] == "died"
    assert "runtime_ms" not in l0["executors"]["vmvx"]["timing"]
    l1 = rep["ops"]["L1"]
    assert l1["recommended_executor"] == "llvm-cpu" and l1["recommendation_reason"] == REASON_NO_TIMING
    assert l1["executors"]["ort"]["timing"] == {"compile_ms": 1.0, "run_ms": 1.0}
    s = rep["discovery_report"]["summary"]
    assert s["recommendation_rule"] == "timing"
    assert s["recommendations_by_timing"] == 1 and s["timing_fallback_layers"] == 1
    assert len(s["notes"]) == 1 and "priority order" in s["notes"][0]
    assert s["timing_summary"]["ort"]["runtime_ms"] == {"avg_ms": 0.019, "min_ms": 0.019, "max_ms": 0.019,
                                                       "samples": 1}
    assert s["timing_summary"]["ort"]["runtime_samples_ms"]["samples"] == 3
    assert s["timing_summary"]["ort"]["runtime_samples_ms"]["min_ms"] == 0.018
    assert "runtime_ms" not in s["timing_summary"]["vmvx"]
    text = rep["final_report_text"]
    assert "Recommendation rule: by timing" in text and s["notes"][0] in text
    assert "Runtime per layer" in text and "ort: avg 0.019" in text
    # the summary alone (as edit/view recompute it) gives the same counts
    s2, _ = summarize(rep["ops"], NAMES)
    assert s2["timing_fallback_layers"] == 1 and s2["recommendation_rule"] == "timing"
    # priority rule: same data, reasons say so, no note
    rep = build_report(model_name="m", layers=layers, results=results, executors=EXECUTORS, default_tolerance=TOL,
                       mlir_file=None, provenance={})
    assert rep["ops"]["L0"]["recommended_executor"] == "llvm-cpu"
    assert rep["ops"]["L0"]["recommendation_reason"] == "priority"
    assert rep["discovery_report"]["summary"]["notes"] == []
    assert rep["discovery_report"]["summary"]["recommendation_rule"] == "priority"
    assert "Recommendation rule" not in rep["final_report_text"]


# ------------------------------------------------------------------ config / CLI

def test_config_keys_defaults_and_validation():
    from torq_gen_config.config import validate_config
    from torq_gen_config.core.errors import ConfigError

    base = {"model": "m.onnx", "executors": EXECUTORS}
    cfg = validate_config(base)
    assert (cfg["collect_timing"], cfg["timing_runs"], cfg["timing_warmup"], cfg["recommend_by_timing"]) == \
        (False, 5, 1, False)
    assert validate_config({**base, "recommend_by_timing": True})["recommend_by_timing"] is True
    with pytest.raises(ConfigError, match="timing_runs"):
        validate_config({**base, "timing_runs": 0})
    with pytest.raises(ConfigError, match="timing_warmup"):
        validate_config({**base, "timing_warmup": -1})


def test_cli_build_config_sets_keys_only_when_given(tmp_path):
    import argparse

    from torq_gen_config.cli.discover import add_parser
    from torq_gen_config.cli.options import build_config

    model = conv_relu_model(tmp_path / "cr.onnx")
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["discover", "--model", str(model)])
    cfg = build_config(args)
    assert (cfg["collect_timing"], cfg["timing_runs"], cfg["timing_warmup"], cfg["recommend_by_timing"]) == \
        (False, 5, 1, False)
    args = parser.parse_args(["discover", "--model", str(model), "--collect-timing", "--timing-runs", "3",
                              "--timing-warmup", "0", "--recommend-by-timing"])
    cfg = build_config(args)
    assert (cfg["collect_timing"], cfg["timing_runs"], cfg["timing_warmup"], cfg["recommend_by_timing"]) == \
        (True, 3, 0, True)


# ----------------------------------------------------------------- end to end

def _load(out: Path, name: str) -> dict:
    return json.loads((out / f"torq_gen_config_{name}.json").read_text())


def _jobs_run(r) -> list[str]:
    return sorted(ln.split(":")[0] for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("[") and "] " in ln)


def _check_timed_report(report: dict, runs: int) -> None:
    for lid, op in report["ops"].items():
        assert set(op["executors"]) == set(NAMES), lid
        successes = {}
        for name, e in op["executors"].items():
            t = e["timing"]
            assert e["status"] in ("success", "difference"), (lid, name, e["status"])
            assert t["runs"] == runs and len(t["samples_ms"]) == runs, (lid, name, t)
            assert t["runtime_ms"] == round(t["median_ms"], 3)
            assert 0 < t["min_ms"] <= t["median_ms"] <= t["max_ms"]
            assert t["compile_ms"] > 0 and t["run_ms"] > 0
            if e["status"] == "success":
                successes[name] = t["median_ms"]
        assert successes, lid
        fastest = min(successes, key=lambda n: (successes[n], NAMES.index(n)))
        assert op["recommended_executor"] == fastest, (lid, successes)
        assert op["recommendation_reason"].startswith("fastest success ("), op["recommendation_reason"]


@pytest.mark.slow
def test_e2e_cli_collect_timing_and_recommend_by_timing(tmp_path):
    model = conv_relu_model(tmp_path / "convrelu.onnx")
    out = tmp_path / "out"
    r = run_cli("discover", "--model", model, "--output-dir", out, "--collect-timing", "--timing-runs", "3",
                "--recommend-by-timing", "-j", "2", "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    report = _load(out, "convrelu")
    assert len(report["ops"]) == 2
    _check_timed_report(report, runs=3)
    opts = report["provenance"]["options"]
    assert (opts["collect_timing"], opts["timing_runs"], opts["timing_warmup"], opts["recommend_by_timing"]) == \
        (True, 3, 1, True)
    summary = report["discovery_report"]["summary"]
    assert summary["recommendation_rule"] == "timing" and summary["recommendations_by_timing"] == 2
    assert summary["timing_fallback_layers"] == 0 and summary["notes"] == []
    for name in NAMES:
        assert summary["timing_summary"][name]["runtime_ms"]["samples"] == 2
        assert summary["timing_summary"][name]["runtime_samples_ms"]["samples"] == 6
    assert "Recommendation rule: by timing" in r.stdout and "Runtime per layer" in r.stdout
    compiler = json.loads((out / "torq_gen_config_convrelu_compiler.json").read_text())
    assert {a["executor"] for a in compiler["op_assignments"].values()} == \
        {op["recommended_executor"] for op in report["ops"].values()}
    conv = report["ops"]["Conv_c"]["executors"]
    print("Conv 1x3x32x32 -> 1x8x32x32 runtime medians (ms):",
          {n: conv[n]["timing"]["median_ms"] for n in NAMES})


@pytest.mark.slow
def test_e2e_snakemake_form_fallback_then_timing(tmp_path):
    """--config keys: recommend_by_timing alone falls back to priority and says so;
    adding collect_timing reruns the tests and measures; toggling recommend_by_timing
    afterwards re-aggregates only."""
    model = conv_relu_model(tmp_path / "convrelu.onnx")
    out = tmp_path / "out"
    cfg = ["--config", f"model={model}", f"output_dir={out}"]
    r = run_snakemake("--cores", "2", *cfg, "recommend_by_timing=true")
    assert r.returncode == 0, r.stderr[-3000:]
    report = _load(out, "convrelu")
    summary = report["discovery_report"]["summary"]
    assert summary["timing_fallback_layers"] == 2 and summary["recommendations_by_timing"] == 0
    assert summary["notes"] and "no runtime timing data" in summary["notes"][0]
    assert summary["notes"][0] in report["final_report_text"]
    for op in report["ops"].values():
        assert op["recommendation_reason"] == "priority (no timing data)"
        assert op["recommended_executor"] == "llvm-cpu"
        assert all("runtime_ms" not in e["timing"] for e in op["executors"].values())
    assert report["provenance"]["options"]["recommend_by_timing"] is True
    assert report["provenance"]["options"]["collect_timing"] is False

    r = run_snakemake("--cores", "2", *cfg, "recommend_by_timing=true", "collect_timing=true", "timing_runs=2",
                      "timing_warmup=0")
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(_jobs_run(r)) == 6, r.stdout  # every (layer, executor) test ran again to measure
    report = _load(out, "convrelu")
    _check_timed_report(report, runs=2)
    assert all(e["timing"]["warmup"] == 0 for op in report["ops"].values() for e in op["executors"].values())
    assert report["discovery_report"]["summary"]["notes"] == []

    r = run_snakemake("--cores", "2", *cfg, "collect_timing=true", "timing_runs=2", "timing_warmup=0")
    assert r.returncode == 0, r.stderr[-3000:]
    assert _jobs_run(r) == [], r.stdout  # only the report was rebuilt
    report = _load(out, "convrelu")
    assert all(op["recommendation_reason"] == "priority" and op["recommended_executor"] == "llvm-cpu"
               for op in report["ops"].values())
    assert all(e["timing"]["runs"] == 2 for op in report["ops"].values() for e in op["executors"].values())
