"""Running configurations with the fake ckProfiler (tests/fixtures/fake_ck): results, failure
modes, binary lookup, and the seed's runner command line (dry-run, no-save, output, max-ops)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from irgen import FAKE_DIR
from torq_gen_config.ck import cli, profile, profiler_args as pa
from torq_gen_config.ck.problem import ConvProblem

REPO = FAKE_DIR.parents[2]
P = ConvProblem(G=2, N=4, K=8, C=4, filter=(3, 3), input=(14, 14), strides=(1, 1), dilations=(1, 1),
                left_pads=(1, 1), right_pads=(1, 1), dtype="fp16")
BINARY = str(FAKE_DIR / "ckProfiler")


def config(op, rank=1, problem=P):
    from torq_gen_config.ck.convert import describe

    return pa.make_config(problem, op, layout="NGCHW_GKCYX_NGKHW",
                          metadata={"priority_rank": rank, "description": describe(op, problem), "pytorch_op": "t"})


def run(op, mode="ok", timeout=30, monkeypatch=None):
    if monkeypatch:
        monkeypatch.setenv("FAKE_CK_MODE", mode)
    c = pa.normalize_config(config(op))
    return profile.run_config(c, backend="ckprofiler", binary=BINARY, timeout_s=timeout, build=profile.probe_build(BINARY))


@pytest.mark.parametrize("op", pa.OPERATIONS)
def test_success_parses_best_and_instances(op, monkeypatch, tmp_path):
    r = run(op, monkeypatch=monkeypatch)
    assert r["success"] and r["status"] == "success" and r["returncode"] == 0 and r["error"] is None
    assert r["avg_time_ms"] > 0 and r["tflops"] > 0 and r["gb_per_s"] > 0
    assert r["avg_time_ms"] == min(i["ms"] for i in r["instances"])  # the best block names the fastest
    assert r["tflops"] == pytest.approx(P.flops() / 1e9 / r["avg_time_ms"], rel=1e-4)  # CK's formula
    assert r["command"].startswith(BINARY + " " + op)
    assert "Best configuration parameters" in r["stdout"]
    if op == pa.BWD_WEIGHT:
        assert r["command"].endswith(" all") and r["best"]["split_k"]
    if op == pa.BWD_DATA:
        assert r["command"].endswith(" 0") and r["valids"] is None


@pytest.mark.parametrize("mode,status,message", [
    ("valids0", "failed", "valids: 0"),
    ("nobest", "failed", "no 'Best configuration parameters' block"),
    ("fail", "failed", "exit status 1: Error: Incorrect results"),
    ("crash", "crash", "crashed: killed by SIGSEGV"),
])
def test_failure_modes(mode, status, message, monkeypatch):
    r = run(pa.FWD, mode, monkeypatch=monkeypatch)
    assert not r["success"] and r["status"] == status and message in r["error"]
    if mode == "valids0":
        assert r["returncode"] == 0  # the real exit code reflects only verification
    if mode == "crash":
        assert r["signal"] == "SIGSEGV" and r["returncode"] == -11


def test_timeout_kills_the_profiler(monkeypatch):
    r = run(pa.FWD, "hang", timeout=2, monkeypatch=monkeypatch)
    assert r["status"] == "timeout" and "timed out after 2 s" in r["error"] and r["elapsed_time"] < 10


def test_long_output_keeps_a_bounded_tail_with_the_best_block(monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_CK_MODE", "long")
    log = tmp_path / "p.log"
    r = profile.run_config(pa.normalize_config(config(pa.FWD)), backend="ckprofiler", binary=BINARY, timeout_s=60,
                           log_path=log, build=None)
    assert r["success"] and len(r["instances"]) > 2000
    assert len(r["stdout"]) <= profile.STDOUT_TAIL and "Best configuration parameters" in r["stdout"]
    assert log.stat().st_size > 100_000 and log.read_text().count("Perf:") == len(r["instances"])


def test_old_build_gets_the_2024_argument_count(monkeypatch, tmp_path):
    calls = tmp_path / "calls"
    monkeypatch.setenv("FAKE_CK_LOG", str(calls))
    # an old build whose bwd_data has no split_k: the fitted command still has the right count
    r = profile.run_config(pa.normalize_config(config(pa.BWD_DATA)), backend="ckprofiler", binary=BINARY,
                           timeout_s=30, build={"bwd_data_split_k": False, "note": None})
    assert len(r["command"].split()) == pa.expected_argc(pa.BWD_DATA, 2, bwd_data_split_k=False)
    # the fake enforces the real rule: one argument short -> help and rc 1
    assert r["status"] == "failed" and "exit status 1" in r["error"]
    assert calls.read_text().count("\n") == 1


def test_locate_profiler_order(tmp_path, monkeypatch):
    monkeypatch.delenv(profile.ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(profile.ProfilerNotFound) as e:
        profile.locate_profiler(None)
    msg = str(e.value)
    assert "./build/bin/ckProfiler (no such file)" in msg and "$CK_PROFILER (not set)" in msg and "PATH" in msg
    assert profile.locate_profiler(FAKE_DIR) == BINARY          # a directory
    assert profile.locate_profiler(BINARY) == BINARY            # the binary itself
    monkeypatch.setenv(profile.ENV_VAR, str(FAKE_DIR))
    assert profile.locate_profiler(None) == BINARY              # $CK_PROFILER after the default path
    (tmp_path / "build" / "bin").mkdir(parents=True)
    local = tmp_path / "build" / "bin" / "ckProfiler"
    local.write_text("#!/bin/sh\n")
    local.chmod(0o755)
    assert profile.locate_profiler(None) == str(local)          # ./build/bin first
    monkeypatch.delenv(profile.ENV_VAR)
    os.unlink(local)
    monkeypatch.setenv("PATH", f"{FAKE_DIR}:/usr/bin:/bin")
    assert profile.locate_profiler(None) == BINARY              # then PATH


def write_configs(path, n_ranks=3):
    cs = []
    for rank in range(n_ranks, 0, -1):  # written in reverse rank order
        p = ConvProblem(**{**P.__dict__, "N": rank})
        cs += [config(op, rank, p) for op in pa.OPERATIONS]
    path.write_text(json.dumps(cs))
    return path


def seed_runner(*args, cwd, env=None):
    return subprocess.run([sys.executable, str(REPO / "scripts" / "run_ck_profiler.py"), *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env={**os.environ, **(env or {})}, timeout=600)


def test_seed_runner_dry_run_prints_commands_and_writes_nothing(tmp_path):
    cfgs = write_configs(tmp_path / "c.json")
    r = seed_runner(cfgs, "--profiler-path", FAKE_DIR, "--dry-run", "--max-ops", "4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "Command:" in ln]
    assert len(lines) == 4 and all(BINARY in ln for ln in lines)
    assert "[1/4]" in r.stdout and "(rank 1)" in r.stdout.split("[2/4]")[0]  # priority-rank order
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json"]


def test_seed_runner_output_max_ops_and_exit_status(tmp_path):
    cfgs = write_configs(tmp_path / "c.json")
    out = tmp_path / "mine.json"
    r = seed_runner(cfgs, "--profiler-path", FAKE_DIR, "--max-ops", "4", "--output", out, "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["stats"] == {"total": 4, "success": 4, "failed": 0, "skipped": 0, "timeout": 0, "crash": 0}
    assert [x["priority_rank"] for x in doc["results"]] == [1, 1, 1, 2]
    for x in doc["results"]:
        assert set(x) >= {"operation", "description", "priority_rank", "success", "returncode", "elapsed_time",
                          "command", "error", "stdout", "best", "instances", "tflops", "gb_per_s"}
        assert os.path.isfile(x["log"]) and "Best configuration parameters" in open(x["log"]).read()
    assert not (tmp_path / "profiler_results.json").exists()  # --output honoured
    assert "Success rate: 100.0%" in r.stdout and f"Results saved to: {out}" in r.stdout
    # a failing configuration: exit 1, recorded
    r = seed_runner(cfgs, "--profiler-path", FAKE_DIR, "--max-ops", "1", "--output", out, "--work-dir",
                    tmp_path / "w2", cwd=tmp_path, env={"FAKE_CK_MODE": "valids0"})
    assert r.returncode == 1 and json.loads(out.read_text())["stats"]["failed"] == 1


def test_seed_runner_no_save_writes_nothing(tmp_path):
    cfgs = write_configs(tmp_path / "c.json", n_ranks=1)
    r = seed_runner(cfgs, "--profiler-path", FAKE_DIR, "--no-save", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Success rate: 100.0%" in r.stdout and "Results saved" not in r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json"]


def test_missing_binary_is_one_line(tmp_path):
    cfgs = write_configs(tmp_path / "c.json", n_ranks=1)
    r = seed_runner(cfgs, "--profiler-path", tmp_path / "nowhere", cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("run_ck_profiler.py: error: ckProfiler not found; looked in --profiler-path")


@pytest.mark.parametrize("content,message", [
    ("{oops", "is not valid JSON"),
    ('{"a": 1}', "expected a JSON list of configurations"),
    ('[]', "holds no configurations"),
])
def test_bad_configuration_files(tmp_path, content, message):
    (tmp_path / "c.json").write_text(content)
    r = seed_runner(tmp_path / "c.json", "--profiler-path", FAKE_DIR, cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_trace_given_to_run_says_convert_first(tmp_path, capsys):
    (tmp_path / "ir.json").write_text(json.dumps([{"op_name": "aten::add"}]))
    assert cli.main(["run", str(tmp_path / "ir.json")]) == 2
    assert "convert it first" in capsys.readouterr().err


def test_bad_entry_is_skipped_and_the_rest_runs(tmp_path):
    cs = json.loads(write_configs(tmp_path / "c.json", n_ranks=1).read_text())
    cs.append({"operation_type": "grouped_conv_fwd", "profiler_args": {"G": 1}, "metadata": {"priority_rank": 2}})
    (tmp_path / "c.json").write_text(json.dumps(cs))
    out = tmp_path / "r.json"
    r = seed_runner(tmp_path / "c.json", "--profiler-path", FAKE_DIR, "--output", out, "--quiet", cwd=tmp_path)
    doc = json.loads(out.read_text())
    assert r.returncode == 1 and doc["stats"]["success"] == 3 and doc["stats"]["skipped"] == 1
    bad = doc["results"][-1]
    assert bad["status"] == "skipped" and "configuration 3: profiler_args lacks" in bad["error"]


def test_time_zero_is_refused_and_inf_never_reaches_the_json(tmp_path, monkeypatch):
    cs = json.loads(write_configs(tmp_path / "c.json", n_ranks=1).read_text())
    cs[0]["profiler_args"]["time"] = 0
    (tmp_path / "c.json").write_text(json.dumps(cs))
    out = tmp_path / "r.json"
    r = seed_runner(tmp_path / "c.json", "--profiler-path", FAKE_DIR, "--output", out, "--quiet", cwd=tmp_path)
    doc = json.loads(out.read_text())
    assert r.returncode == 1 and doc["stats"]["success"] == 2 and doc["stats"]["skipped"] == 1
    assert "time must be 1" in [x for x in doc["results"] if x["status"] == "skipped"][0]["error"]
    # CK's own output for time=0 (avg_time 0, tflops inf) parses without non-finite numbers
    from torq_gen_config.ck import profiler_output as po

    p = po.parse("Perf:          0 ms, inf TFlops, inf GB/s, X\nBest configuration parameters:\nname: X\n"
                 "avg_time: 0\ntflops: inf\nGB/s: inf\n")
    assert p.instances[0].tflops is None and p.best.tflops is None and po.judge(p)


def test_notes_reach_the_results(tmp_path):
    seed = config(pa.BWD_WEIGHT)
    seed["operation_type"] = "profile_grouped_conv_bwd_weight"
    seed["profiler_args"]["layout"] = 3  # what the seed's converter wrote
    seed["profiler_args"]["extra"] = 1
    data = config(pa.BWD_DATA)
    data["operation_type"] = "profile_grouped_conv_bwd_data"
    data["profiler_args"]["split_k"] = "all"
    data["metadata"]["notes"] = ["a converter note"]
    (tmp_path / "c.json").write_text(json.dumps([seed, data]))
    out = tmp_path / "r.json"
    r = seed_runner(tmp_path / "c.json", "--profiler-path", FAKE_DIR, "--output", out, "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    w, d = json.loads(out.read_text())["results"]
    assert any("layout 3 is NGCHW_GKYXC_NGKHW" in n for n in w["notes"])
    assert any("ignored profiler_args" in n and "extra" in n for n in w["notes"])
    assert "a converter note" in d["notes"] and any("sent as 0" in n for n in d["notes"])
    assert d["command"].endswith(" 0") and w["command"].split()[3] == "3"


def test_impossible_problems_are_refused_before_running(tmp_path):
    cs = json.loads(write_configs(tmp_path / "c.json", n_ranks=1).read_text())
    cs[0]["profiler_args"]["input_spatial"] = [1, 1]
    cs[0]["profiler_args"]["left_pads"] = cs[0]["profiler_args"]["right_pads"] = [0, 0]
    cs[1]["profiler_args"]["strides"] = [0, 1]
    (tmp_path / "c.json").write_text(json.dumps(cs))
    out = tmp_path / "r.json"
    seed_runner(tmp_path / "c.json", "--profiler-path", FAKE_DIR, "--output", out, "--quiet", cwd=tmp_path)
    errors = sorted(x["error"] for x in json.loads(out.read_text())["results"] if x["status"] == "skipped")
    assert len(errors) == 2 and "output size [-1, -1] is not positive" in errors[0] and "strides" in errors[1]


def test_the_cross_check_refuses_codes_it_does_not_know(tmp_path):
    c = pa.normalize_config(config(pa.FWD))
    c["profiler_args"]["data_type"] = 4  # fp8: real for ckProfiler, not for the ONNX Runtime formulation
    r = profile.run_config(c, backend="onnxruntime", binary=None, timeout_s=60)
    assert r["status"] == "skipped" and "not run on onnxruntime: data_type 4" in r["error"]
    from torq_gen_config.ck.convert import describe

    assert describe(pa.FWD, pa.problem_of_config(c)).endswith(", data_type 4")  # not called fp16


def test_error_line_comes_from_stderr(tmp_path):
    tool = tmp_path / "ckProfiler"
    tool.write_text("#!/bin/sh\necho 'check: matches the reference (relative error 1e-7)'\n"
                    "echo 'error: _ArrayMemoryError: Unable to allocate 4.00 TiB' >&2\nexit 1\n")
    tool.chmod(0o755)
    r = profile.run_config(pa.normalize_config(config(pa.FWD)), backend="ckprofiler", binary=str(tool), timeout_s=30)
    assert r["status"] == "failed" and "Unable to allocate 4.00 TiB" in r["error"]


def test_values_beyond_32_bits_are_refused(tmp_path):
    cs = json.loads(write_configs(tmp_path / "c.json", n_ranks=1).read_text())
    cs[0]["profiler_args"]["N"] = 10 ** 20
    (tmp_path / "c.json").write_text(json.dumps(cs))
    out = tmp_path / "r.json"
    seed_runner(tmp_path / "c.json", "--profiler-path", FAKE_DIR, "--output", out, "--quiet", cwd=tmp_path)
    bad = [x for x in json.loads(out.read_text())["results"] if x["status"] == "skipped"]
    assert len(bad) == 1 and "outside ckProfiler's 32-bit arguments" in bad[0]["error"]


@pytest.mark.parametrize("value", ["inf", "nan", "0", "1e300"])
def test_timeout_must_be_finite_and_bounded(tmp_path, value):
    cfgs = write_configs(tmp_path / "c.json", n_ranks=1)
    r = seed_runner(cfgs, "--profiler-path", FAKE_DIR, "--timeout", value, cwd=tmp_path)
    assert r.returncode == 2 and "--timeout" in r.stderr and "Traceback" not in r.stderr


def test_deeply_nested_files_are_one_line_errors(tmp_path):
    (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)
    for argv in (["convert", tmp_path / "deep.json", tmp_path / "x.json"], ["run", tmp_path / "deep.json"]):
        exe = os.path.join(os.path.dirname(sys.executable), "ck-profile")
        r = subprocess.run([exe, *map(str, argv)], capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 2 and "nested too deeply" in r.stderr and "Traceback" not in r.stderr


def test_unwritable_output_is_refused_before_running(tmp_path):
    cfgs = write_configs(tmp_path / "c.json", n_ranks=1)
    (tmp_path / "adir").mkdir()
    r = seed_runner(cfgs, "--profiler-path", FAKE_DIR, "--output", tmp_path / "adir", cwd=tmp_path,
                    env={"FAKE_CK_LOG": str(tmp_path / "calls")})
    assert r.returncode == 2 and "is a directory" in r.stderr and not (tmp_path / "calls").exists()


def test_retry_failed_runs_only_the_failed_again(tmp_path):
    cfgs = write_configs(tmp_path / "c.json", n_ranks=1)
    log = tmp_path / "calls"
    r = seed_runner(cfgs, "--profiler-path", FAKE_DIR, "--max-ops", "1", "--quiet", "--work-dir", tmp_path / "w",
                    cwd=tmp_path, env={"FAKE_CK_MODE": "valids0"})
    assert r.returncode == 1
    r = seed_runner(cfgs, "--profiler-path", FAKE_DIR, "--quiet", "--work-dir", tmp_path / "w", "--retry-failed",
                    cwd=tmp_path, env={"FAKE_CK_LOG": str(log)})
    assert r.returncode == 0 and "Retrying 1 configuration(s)" in r.stdout, r.stderr[-2000:]
    ran = [json.loads(x) for x in log.read_text().splitlines() if len(json.loads(x)) > 2]
    assert len(ran) == 3  # the failed one again and the two never run; nothing else


def test_console_block_with_missing_figures_and_dry_run_of_unknown_codes(tmp_path, capsys):
    from torq_gen_config.ck import results

    rec = {"success": True, "status": "success", "avg_time_ms": 1.5, "tflops": None, "gb_per_s": None,
           "config_id": "fwd_x", "description": "d", "error": None, "backend": "ckprofiler", "command": "c",
           "elapsed_time": 1.0, "best": {"name": "n", "split_k": None}, "notes": []}
    assert "1.5 ms, ? TFlops, ? GB/s" in results.run_block(rec, quiet=True)
    assert "? TFlops" in results.run_block(rec)
    c = config(pa.FWD)
    c["profiler_args"]["data_type"] = 4
    (tmp_path / "c.json").write_text(json.dumps([c]))
    assert cli.main(["run", str(tmp_path / "c.json"), "--backend", "onnxruntime", "--dry-run"]) == 0
    assert "not run on onnxruntime: data_type 4" in capsys.readouterr().out
