"""Tests of the TORQ backend (executors nss, css, host) without the TORQ toolchain.

The TORQ tools are replaced by the TEST FIXTURES ``tests/fixtures/fake_torq/torq-compile``
and ``torq-run-module``: each records its argv as one JSON line in ``$FAKE_TORQ_LOG``,
checks its flags like a real tool, and hands the real work to IREE's llvm-cpu
compiler and runtime. So the whole path runs (lookup, exact command lines, raw
``.bin`` inputs and outputs, comparison with ONNX Runtime, the workflow), and the
assertions check the command lines the backend produced.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import (FAKE_COMPILE, FAKE_DIR, FAKE_RUN, REPO, TORQ_VARS, VENV_BIN, TensorProto,  # noqa: F401
                      helper, make_model, run_cli, tvi, work)
from onnx import numpy_helper

from torq_gen_config.backends import StageError, backend_class, make_backend, needs_mlir
from torq_gen_config.backends.torq import (
    FORCING_FLAGS,
    TorqBackend,
    find_torq_tool,
    full_model_compile_argv,
    input_spec,
    read_output_bin,
    run_module_argv,
    write_input_bin,
)
from torq_gen_config.core.errors import ConfigError
from torq_gen_config.core.tools import ToolNotFoundError, find_tool, run_tool

TIMEOUT_S = 300


# ------------------------------------------------------------------- helpers


def _clear_torq_env(monkeypatch):
    for var in TORQ_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def fake_torq(monkeypatch, tmp_path) -> Path:
    """The fake TORQ tools found through TORQ_TOOL_PATH; returns the argv log file."""
    _clear_torq_env(monkeypatch)
    log = tmp_path / "fake_torq_log.jsonl"
    monkeypatch.setenv("TORQ_TOOL_PATH", str(FAKE_DIR))
    monkeypatch.setenv("FAKE_TORQ_LOG", str(log))
    # the fixtures run with the `python3` on PATH: this virtual environment's
    monkeypatch.setenv("PATH", VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    return log


def read_log(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def _exe(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


def _import(onnx_path: Path) -> str:
    mlir = onnx_path.with_suffix(".mlir")
    res = run_tool([find_tool("iree-import-onnx"), str(onnx_path), "-o", str(mlir)], timeout_s=120)
    assert res.returncode == 0, res.stderr
    return str(mlir)


def _save(path: Path, nodes, inputs, outputs, inits=()) -> Path:
    m = make_model(nodes, inputs, outputs, inits, name="main")
    onnx.save(m, path)
    return path


def conv_layer(d: Path) -> tuple[Path, str]:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((4,)).astype(np.float32), "b")
    p = _save(d / "conv.onnx", [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
              [tvi("x", TensorProto.FLOAT, [1, 3, 8, 8])], [tvi("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w, b])
    return p, _import(p)


def ort_outputs(model: Path, feeds: dict) -> dict:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


# ---------------------------------------------------------------- lookup


@pytest.fixture
def lookup_setup(monkeypatch, tmp_path):
    """One torq-compile in every place of the lookup; returns their paths."""
    _clear_torq_env(monkeypatch)
    places = {
        "env": _exe(tmp_path / "env" / "my-torq-compile"),
        "tool_path": _exe(tmp_path / "tp2" / "torq-compile"),
        "wheel": _exe(tmp_path / "site" / "torq" / "_compiler_libs" / "torq-compile"),
        "build": _exe(tmp_path / "build" / "tools" / "torq-compile"),
        "sibling": _exe(tmp_path / "iree-build" / "tools" / "torq-compile"),
        "path": _exe(tmp_path / "bin" / "torq-compile"),
    }
    (tmp_path / "tp1").mkdir()  # a TORQ_TOOL_PATH entry without the tool: skipped
    (tmp_path / "site" / "torq" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    monkeypatch.setenv("TORQ_COMPILE", places["env"])
    monkeypatch.setenv("TORQ_TOOL_PATH", f"{tmp_path / 'tp1'}{os.pathsep}{tmp_path / 'tp2'}")
    monkeypatch.setenv("IREE_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    return places, tmp_path / "repo"  # repo_root: its sibling ../iree-build is tmp_path/iree-build


def test_lookup_precedence(lookup_setup, monkeypatch):
    places, repo = lookup_setup
    assert find_torq_tool("torq-compile", repo_root=repo) == places["env"]
    monkeypatch.delenv("TORQ_COMPILE")
    assert find_torq_tool("torq-compile", repo_root=repo) == places["tool_path"]
    monkeypatch.delenv("TORQ_TOOL_PATH")
    assert find_torq_tool("torq-compile", repo_root=repo) == places["wheel"]
    os.unlink(places["wheel"])
    assert find_torq_tool("torq-compile", repo_root=repo) == places["build"]
    monkeypatch.delenv("IREE_BUILD_DIR")
    assert find_torq_tool("torq-compile", repo_root=repo) == places["sibling"]
    os.unlink(places["sibling"])
    assert find_torq_tool("torq-compile", repo_root=repo) == places["path"]


def test_lookup_env_var_takes_a_name_on_path_and_never_falls_back(lookup_setup, monkeypatch, tmp_path):
    places, repo = lookup_setup
    monkeypatch.setenv("TORQ_COMPILE", "torq-compile")  # a name: looked up on PATH
    assert find_torq_tool("torq-compile", repo_root=repo) == places["path"]
    monkeypatch.setenv("TORQ_COMPILE", str(tmp_path / "nope" / "torq-compile"))
    with pytest.raises(ToolNotFoundError, match=r"\$TORQ_COMPILE=.*nope.*is not an executable"):
        find_torq_tool("torq-compile", repo_root=repo)


def test_lookup_runtime_uses_its_own_variable_and_wheel_dir(monkeypatch, tmp_path):
    _clear_torq_env(monkeypatch)
    wheel_rt = _exe(tmp_path / "site" / "torq" / "_runtime_libs" / "torq-run-module")
    (tmp_path / "site" / "torq" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("TORQ_COMPILE", _exe(tmp_path / "x" / "torq-compile"))  # not used for the runtime
    assert find_torq_tool("torq-run-module", repo_root=tmp_path / "repo") == wheel_rt
    monkeypatch.setenv("TORQ_RUN_MODULE", FAKE_RUN)
    assert find_torq_tool("torq-run-module") == FAKE_RUN
    with pytest.raises(ValueError, match="unknown tool"):
        find_torq_tool("iree-compile")


def test_missing_tool_error_lists_every_place(monkeypatch, tmp_path):
    _clear_torq_env(monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))
    monkeypatch.setattr("torq_gen_config.backends.torq.toolchain._torq_package_dir", lambda: None)
    with pytest.raises(ToolNotFoundError) as ei:
        find_torq_tool("torq-compile", repo_root=tmp_path / "repo")
    msg = str(ei.value)
    for part in ("'torq-compile' not found", "$TORQ_COMPILE (unset)", "$TORQ_TOOL_PATH (unset)",
                 "torq/_compiler_libs/torq-compile (package 'torq' not installed)",
                 f"build tree {tmp_path / 'iree-build' / 'tools' / 'torq-compile'} (../iree-build next to the repository)",
                 f"PATH={tmp_path / 'nobin'}"):
        assert part in msg, (part, msg)
    # with the variables set, the message names their directories
    monkeypatch.setenv("TORQ_TOOL_PATH", f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}")
    monkeypatch.setenv("IREE_BUILD_DIR", str(tmp_path / "bld"))
    msg = str(pytest.raises(ToolNotFoundError, find_torq_tool, "torq-run-module").value)
    for part in ("$TORQ_RUN_MODULE (unset)", str(tmp_path / "a" / "torq-run-module"),
                 str(tmp_path / "b" / "torq-run-module"),
                 f"{tmp_path / 'bld' / 'tools' / 'torq-run-module'} ($IREE_BUILD_DIR)",
                 "torq/_runtime_libs/torq-run-module"):
        assert part in msg, (part, msg)


# -------------------------------------------------------- options, registry


def test_registry_and_options():
    assert backend_class("torq") is TorqBackend and needs_mlir("torq") is TorqBackend.needs_mlir is True
    b = make_backend({"name": "nss", "backend": "torq"})
    assert (b.executor, b.torq_hw, b.torq_hw_type, b.compile_flags, b.run_flags) == ("nss", "default", "sim", [], [])
    b = make_backend({"name": "npu-a", "backend": "torq", "options": {"executor": "css", "torq_hw": "sl2610",
                                                                        "torq_hw_type": "aws_fpga"}})
    assert b.executor == "css" and b.forcing_flags() == ["--torq-disable-slices", "--torq-disable-host"]
    with pytest.raises(ConfigError, match="not a TORQ executor.*options.executor"):
        make_backend({"name": "npu", "backend": "torq"})
    with pytest.raises(ConfigError, match="'executor' must be one of nss, css, host"):
        make_backend({"name": "nss", "backend": "torq", "options": {"executor": "gpu"}})
    with pytest.raises(ConfigError, match="unknown option 'target'"):
        make_backend({"name": "nss", "backend": "torq", "options": {"target": "llvm-cpu"}})
    with pytest.raises(ConfigError, match="'compile_flags' must be a list of strings"):
        make_backend({"name": "nss", "backend": "torq", "options": {"compile_flags": [1]}})


def test_describe_without_tools_reports_the_search(monkeypatch, tmp_path):
    _clear_torq_env(monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("torq_gen_config.backends.torq.toolchain._torq_package_dir", lambda: None)
    monkeypatch.setattr("torq_gen_config.backends.torq.toolchain.REPO_ROOT", tmp_path / "repo")
    d = make_backend({"name": "host", "backend": "torq"}).describe()
    assert d["executor"] == "host" and d["forcing_flags"] == ["--torq-disable-slices", "--torq-disable-css"]
    assert "$TORQ_COMPILE (unset)" in d["torq_compile"]["error"]
    assert "$TORQ_RUN_MODULE (unset)" in d["torq_run_module"]["error"]
    assert d["torq_compiler_version"] is None


# ------------------------------------------------------------------ raw data


def test_raw_input_and_output_files(tmp_path):
    import ml_dtypes

    cases = [
        (np.arange(6, dtype=np.float32).reshape(2, 3), "2x3xf32"),
        (np.array(2.5, np.float32), "f32"),
        (np.array([[True, False]]), "1x2xi1"),
        (np.array([1, -2], np.int64), "2xi64"),
        (np.array([1, 200], np.uint8), "2xui8"),
        (np.array([-1, 2], np.int8), "2xi8"),
        (np.linspace(-1, 1, 4).astype(ml_dtypes.bfloat16), "4xbf16"),
        (np.ones((1, 0, 2), np.float16), "1x0x2xf16"),
        (np.array([1.5, 2], dtype=">f8"), "2xf64"),
    ]
    for i, (arr, spec) in enumerate(cases):
        p = tmp_path / f"a{i}.bin"
        assert write_input_bin(arr, p) == spec == input_spec(arr)
        assert p.stat().st_size == arr.size * arr.dtype.itemsize
        back = read_output_bin(p, list(arr.shape), np.dtype(arr.dtype).newbyteorder("=").name)
        assert back.shape == arr.shape and back.dtype == arr.dtype.newbyteorder("=")
        np.testing.assert_array_equal(back, arr)
    # raw files are little-endian
    assert (tmp_path / "a8.bin").read_bytes() == np.array([1.5, 2], "<f8").tobytes()
    # one dynamic dimension is inferred from the size; ill-sized files are errors
    np.arange(12, dtype=np.int32).tofile(tmp_path / "d.bin")
    assert read_output_bin(tmp_path / "d.bin", [None, 4], "int32").shape == (3, 4)
    with pytest.raises(ValueError, match="more than one dynamic"):
        read_output_bin(tmp_path / "d.bin", [None, None], "int32")
    with pytest.raises(ValueError, match="holds 12 int32 values, expected 10"):
        read_output_bin(tmp_path / "d.bin", [2, 5], "int32")
    with pytest.raises(ValueError, match="no IREE element type"):
        input_spec(np.array(["a"]))


# ------------------------------------------------------ layers through the fakes


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    return conv_layer(tmp_path_factory.mktemp("conv"))


@pytest.mark.parametrize("executor", ["nss", "css", "host"])
def test_conv_layer_command_lines_and_outputs(fake_torq, tmp_path, conv, executor):
    onnx_path, mlir = conv
    b = make_backend({"name": executor, "backend": "torq", "options": {"executor": executor}})
    work = tmp_path / "work"
    art = b.compile(onnx_path=str(onnx_path), mlir_path=mlir, work_dir=str(work), timeout_s=TIMEOUT_S,
                    log_path=str(tmp_path / "job.log"))
    vmfb = str(work / "module.vmfb")
    expected_compile = [FAKE_COMPILE, mlir, "-o", vmfb, "--torq-hw=default", "--torq-target-host-triple=native",
                        *FORCING_FLAGS[executor]]
    assert art.path == vmfb and art.info["argv"] == expected_compile
    assert art.info["signature"]["outputs"] == [{"shape": [1, 4, 8, 8], "dtype": "float32"}]
    x = np.random.default_rng(1).uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)
    outputs, run_ms = b.run(art, inputs={"x": x}, input_names=["x"], output_names=["y"], work_dir=str(work),
                            timeout_s=TIMEOUT_S, log_path=str(tmp_path / "job.log"))
    expected_run = [FAKE_RUN, f"--module={vmfb}", "--function=main", f"--output=@{work}/outputs/output_0.bin",
                    "--torq_hw_type=sim", f"--input=1x3x8x8xf32=@{work}/inputs/input_0.bin"]
    log = read_log(fake_torq)
    assert [r["tool"] for r in log] == ["torq-compile", "torq-run-module"]
    assert log[0]["argv"] == expected_compile and log[0]["forced_executor"] == executor
    assert log[0]["torq_hw"] == "default" and log[0]["executor_map"] is None and log[0]["cwd"] == str(work)
    assert log[1]["argv"] == expected_run and log[1]["torq_hw_type"] == "sim"
    # the outputs are the runtime's raw files, equal to the ONNX Runtime reference
    assert (work / "outputs" / "output_0.bin").stat().st_size == 4 * 4 * 8 * 8
    np.testing.assert_array_equal(np.fromfile(work / "inputs" / "input_0.bin", np.float32).reshape(x.shape), x)
    ref = ort_outputs(onnx_path, {"x": x})["y"]
    assert outputs["y"].shape == ref.shape and outputs["y"].dtype == np.float32
    np.testing.assert_allclose(outputs["y"], ref, rtol=1e-4, atol=1e-4)
    assert run_ms > 0
    # the tool command lines are in the job log
    text = (tmp_path / "job.log").read_text()
    assert "torq-compile" in text and "--torq_hw_type=sim" in text


def test_options_in_command_lines(fake_torq, tmp_path, conv):
    onnx_path, mlir = conv
    b = make_backend({"name": "c", "backend": "torq", "options": {
        "executor": "css", "torq_hw": "SL2610", "torq_hw_type": "hw",
        "compile_flags": ["--mlir-elide-elementsattrs-if-larger=50"], "run_flags": ["--print_statistics"]}})
    work = tmp_path / "w"
    art = b.compile(onnx_path=str(onnx_path), mlir_path=mlir, work_dir=str(work), timeout_s=TIMEOUT_S, log_path=None)
    x = np.zeros((1, 3, 8, 8), np.float32)
    b.run(art, inputs={"x": x}, input_names=["x"], output_names=["y"], work_dir=str(work), timeout_s=TIMEOUT_S,
          log_path=None)
    log = read_log(fake_torq)
    vmfb = str(work / "module.vmfb")
    # torq_hw_type "hw": no --torq-target-host-triple=native
    assert log[0]["argv"] == [FAKE_COMPILE, mlir, "-o", vmfb, "--torq-hw=SL2610", "--torq-disable-slices",
                              "--torq-disable-host", "--mlir-elide-elementsattrs-if-larger=50"]
    assert log[0]["forced_executor"] == "css"
    assert log[1]["argv"] == [FAKE_RUN, f"--module={vmfb}", "--function=main",
                              f"--output=@{work}/outputs/output_0.bin", "--torq_hw_type=hw", "--print_statistics",
                              f"--input=1x3x8x8xf32=@{work}/inputs/input_0.bin"]
    d = b.describe()
    assert d["torq_compile"] == FAKE_COMPILE and d["torq_run_module"] == FAKE_RUN
    assert "TEST FIXTURE" in d["torq_compiler_version"]


def test_two_inputs_two_outputs_and_int_bool_dtypes(fake_torq, tmp_path):
    """TopK (f32 + i64 outputs) and Greater (bool output): raw files of every dtype."""
    k = numpy_helper.from_array(np.array([2], np.int64), "k")
    p = _save(tmp_path / "m.onnx",
              [helper.make_node("TopK", ["x", "k"], ["values", "indices"]),
               helper.make_node("Greater", ["x", "z"], ["gt"])],
              [tvi("x", TensorProto.FLOAT, [3, 5]), tvi("z", TensorProto.FLOAT, [3, 5])],
              [tvi("values", TensorProto.FLOAT, [3, 2]), tvi("indices", TensorProto.INT64, [3, 2]),
               tvi("gt", TensorProto.BOOL, [3, 5])], [k])
    mlir = _import(p)
    b = make_backend({"name": "host", "backend": "torq"})
    art = b.compile(onnx_path=str(p), mlir_path=mlir, work_dir=str(tmp_path / "w"), timeout_s=TIMEOUT_S, log_path=None)
    rng = np.random.default_rng(3)
    feeds = {"x": rng.permutation(15).astype(np.float32).reshape(3, 5), "z": np.full((3, 5), 7.0, np.float32)}
    outs, _ = b.run(art, inputs=feeds, input_names=["x", "z"], output_names=["values", "indices", "gt"],
                    work_dir=str(tmp_path / "w"), timeout_s=TIMEOUT_S, log_path=None)
    ref = ort_outputs(p, feeds)
    for name in ("values", "indices", "gt"):
        assert outs[name].dtype == ref[name].dtype, name
        np.testing.assert_array_equal(outs[name], ref[name])
    run_argv = read_log(fake_torq)[-1]["argv"]
    w = tmp_path / "w"
    assert run_argv[3:] == [f"--output=@{w}/outputs/output_{i}.bin" for i in range(3)] + [
        "--torq_hw_type=sim", f"--input=3x5xf32=@{w}/inputs/input_0.bin", f"--input=3x5xf32=@{w}/inputs/input_1.bin"]
    # output shapes/dtypes passed in override the signature
    outs, _ = b.run(art, inputs=feeds, input_names=["x", "z"], output_names=["values", "indices", "gt"],
                    work_dir=str(tmp_path / "w"), timeout_s=TIMEOUT_S, log_path=None,
                    output_specs=[{"shape": [6], "dtype": "float32"}, {"shape": [3, 2], "dtype": "int64"},
                                  {"shape": [15], "dtype": "uint8"}])
    assert outs["values"].shape == (6,) and outs["gt"].dtype == np.uint8
    np.testing.assert_array_equal(outs["gt"], ref["gt"].reshape(-1).astype(np.uint8))


def test_unknown_flag_is_a_compile_error(fake_torq, tmp_path, conv):
    onnx_path, mlir = conv
    b = make_backend({"name": "nss", "backend": "torq", "options": {"compile_flags": ["--torq-bogus"]}})
    with pytest.raises(StageError) as ei:
        b.compile(onnx_path=str(onnx_path), mlir_path=mlir, work_dir=str(tmp_path), timeout_s=TIMEOUT_S, log_path=None)
    assert ei.value.stage == "compile" and "Unknown command line argument '--torq-bogus'" in ei.value.message
    assert not (tmp_path / "module.vmfb").exists()
    b = make_backend({"name": "nss", "backend": "torq", "options": {"run_flags": ["--bogus_flag"]}})
    art = b.compile(onnx_path=str(onnx_path), mlir_path=mlir, work_dir=str(tmp_path), timeout_s=TIMEOUT_S, log_path=None)
    with pytest.raises(StageError) as ei:
        b.run(art, inputs={"x": np.zeros((1, 3, 8, 8), np.float32)}, input_names=["x"], output_names=["y"],
              work_dir=str(tmp_path), timeout_s=TIMEOUT_S, log_path=None)
    assert ei.value.stage == "run" and "Unknown command line argument '--bogus_flag'" in ei.value.message


@pytest.mark.parametrize("mode,stage,during", [("crash-compile", "crash", "compile"), ("hang-compile", "timeout", "compile"),
                                               ("crash-run", "crash", "run"), ("hang-run", "timeout", "run")])
def test_crash_and_timeout(fake_torq, monkeypatch, tmp_path, conv, mode, stage, during):
    onnx_path, mlir = conv
    b = make_backend({"name": "nss", "backend": "torq"})
    art = None
    if during == "run":
        art = b.compile(onnx_path=str(onnx_path), mlir_path=mlir, work_dir=str(tmp_path), timeout_s=TIMEOUT_S,
                        log_path=None)
    monkeypatch.setenv("FAKE_TORQ_MODE", mode)
    with pytest.raises(StageError) as ei:
        if art is None:
            b.compile(onnx_path=str(onnx_path), mlir_path=mlir, work_dir=str(tmp_path), timeout_s=3, log_path=None)
        else:
            b.run(art, inputs={"x": np.zeros((1, 3, 8, 8), np.float32)}, input_names=["x"], output_names=["y"],
                  work_dir=str(tmp_path), timeout_s=3, log_path=None)
    tool = "torq-compile" if during == "compile" else "torq-run-module"
    assert (ei.value.stage, ei.value.during) == (stage, during)
    assert ei.value.message.startswith(f"{tool} timed out after 3 s" if stage == "timeout" else f"{tool} crashed: killed by SIG")


def test_missing_tools_are_stage_errors(monkeypatch, tmp_path, conv):
    onnx_path, mlir = conv
    _clear_torq_env(monkeypatch)
    monkeypatch.setenv("PATH", VENV_BIN)
    monkeypatch.setattr("torq_gen_config.backends.torq.toolchain._torq_package_dir", lambda: None)
    monkeypatch.setattr("torq_gen_config.backends.torq.toolchain.REPO_ROOT", tmp_path / "repo")
    b = make_backend({"name": "css", "backend": "torq"})
    with pytest.raises(StageError) as ei:
        b.compile(onnx_path=str(onnx_path), mlir_path=mlir, work_dir=str(tmp_path / "w"), timeout_s=TIMEOUT_S,
                  log_path=str(tmp_path / "job.log"))
    assert ei.value.stage == "compile"
    assert "'torq-compile' not found" in ei.value.message and "$TORQ_TOOL_PATH (unset)" in ei.value.message
    assert "'torq-compile' not found" in (tmp_path / "job.log").read_text()
    # compiler found, runtime not: a run error that names the places searched
    monkeypatch.setenv("TORQ_COMPILE", FAKE_COMPILE)
    art = b.compile(onnx_path=str(onnx_path), mlir_path=mlir, work_dir=str(tmp_path / "w"), timeout_s=TIMEOUT_S,
                    log_path=None)
    with pytest.raises(StageError) as ei:
        b.run(art, inputs={"x": np.zeros((1, 3, 8, 8), np.float32)}, input_names=["x"], output_names=["y"],
              work_dir=str(tmp_path / "w"), timeout_s=TIMEOUT_S, log_path=None)
    assert ei.value.stage == "run" and "'torq-run-module' not found" in ei.value.message
    assert "$TORQ_RUN_MODULE (unset)" in ei.value.message


# ------------------------------------------------------------- full model


def test_full_model_compile_with_executor_map(fake_torq, tmp_path):
    """The full-model command line: no forcing flags, --torq-executor-map=<compiler JSON> last;
    run through the fakes, the whole model's outputs equal ONNX Runtime's."""
    p = _save(tmp_path / "full.onnx",
              [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
              [tvi("x", TensorProto.FLOAT, [2, 3])], [tvi("y", TensorProto.FLOAT, [2, 3])])
    mlir = _import(p)
    cj = tmp_path / "torq_gen_config_full_compiler.json"
    cj.write_text(json.dumps({"op_assignments": {"4:10": {"executor": "nss"}, "5:10": {"executor": "host"}},
                              "model_name": "full"}))
    out = tmp_path / "full.vmfb"
    argv = full_model_compile_argv(mlir, out, cj, {"torq_hw": "SL2610", "compile_flags": ["--mlir-elide-elementsattrs-if-larger=8"]})
    assert argv == [FAKE_COMPILE, mlir, "-o", str(out), "--torq-hw=SL2610", "--torq-target-host-triple=native",
                    "--mlir-elide-elementsattrs-if-larger=8", f"--torq-executor-map={cj}"]
    assert full_model_compile_argv(mlir, out, cj) == [FAKE_COMPILE, mlir, "-o", str(out), "--torq-hw=default",
                                                      "--torq-target-host-triple=native", f"--torq-executor-map={cj}"]
    res = run_tool(argv, timeout_s=TIMEOUT_S)
    assert res.returncode == 0, res.stderr
    rec = read_log(fake_torq)[-1]
    assert rec["argv"] == argv and rec["forced_executor"] is None
    assert rec["executor_map"] == str(cj) and rec["executor_map_assignments"] == 2
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    spec = write_input_bin(x, tmp_path / "in0.bin")
    rargv = run_module_argv(out, [(spec, tmp_path / "in0.bin")], [tmp_path / "out0.bin"], {"torq_hw_type": "sim"})
    assert rargv == [FAKE_RUN, f"--module={out}", "--function=main", f"--output=@{tmp_path / 'out0.bin'}",
                     "--torq_hw_type=sim", f"--input=2x3xf32=@{tmp_path / 'in0.bin'}"]
    res = run_tool(rargv, timeout_s=TIMEOUT_S)
    assert res.returncode == 0, res.stderr
    np.testing.assert_array_equal(read_output_bin(tmp_path / "out0.bin", [2, 3], "float32"),
                                  ort_outputs(p, {"x": x})["y"])
    # a map the compiler cannot read is a compile error of the real kind
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    res = run_tool(full_model_compile_argv(mlir, out, bad), timeout_s=TIMEOUT_S)
    assert res.returncode == 1 and "op_assignments" in res.stderr


# --------------------------------------------------------------- workflow


def three_layer_model(path: Path) -> Path:
    """Conv -> Relu -> Add: 3 layers."""
    w = numpy_helper.from_array(np.full((4, 3, 3, 3), 0.05, np.float32), "w")
    b = numpy_helper.from_array(np.full((4,), 0.1, np.float32), "b")
    c = numpy_helper.from_array(np.full((1, 4, 8, 8), 0.5, np.float32), "c")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["conv_out"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["conv_out"], ["relu_out"], name="relu"),
        helper.make_node("Add", ["relu_out", "c"], ["y"], name="add"),
    ]
    m = make_model(nodes, [tvi("x", TensorProto.FLOAT, [1, 3, 8, 8])], [tvi("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                   [w, b, c])
    onnx.save(m, path)
    return path


def _torq_config_copy(tmp_path: Path) -> Path:
    cfg = tmp_path / "torq.yaml"
    shutil.copy(REPO / "config" / "torq.yaml", cfg)
    return cfg


def test_config_torq_yaml_is_valid():
    from torq_gen_config.config import load_config_file, validate_config

    raw = load_config_file(REPO / "config" / "torq.yaml")
    assert set(raw) == set(load_config_file(REPO / "config" / "config.yaml"))
    cfg = validate_config(raw)
    assert [(e["name"], e["backend"]) for e in cfg["executors"]] == [("nss", "torq"), ("css", "torq"), ("host", "torq")]
    for e in cfg["executors"]:
        assert make_backend(e).executor == e["name"]


@pytest.mark.slow
def test_discover_with_fake_tools(fake_torq, tmp_path):
    model = three_layer_model(tmp_path / "m3.onnx")
    out = tmp_path / "out"
    r = run_cli("discover", "--model", model, "--output-dir", out, "--config-file", _torq_config_copy(tmp_path),
                "-j", "2", "-q")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((out / "torq_gen_config_m3.json").read_text())
    assert set(report["ops"]) == {"Conv_conv_out", "Relu_relu_out", "Add_y"}
    for lid, op in report["ops"].items():
        assert set(op["executors"]) == {"nss", "css", "host"}, lid
        for name, e in op["executors"].items():
            assert e["status"] == "success", (lid, name, e)
        assert op["recommended_executor"] == "nss"
    assert [e["name"] for e in report["provenance"]["executors"]] == ["nss", "css", "host"]
    compiler = json.loads((out / "torq_gen_config_m3_compiler.json").read_text())
    assert sorted(a["executor"] for a in compiler["op_assignments"].values()) == ["nss"] * 3
    log = read_log(fake_torq)
    compiles = [r for r in log if r["tool"] == "torq-compile" and r["argv"][1:] != ["--version"]]
    runs = [r for r in log if r["tool"] == "torq-run-module"]
    assert len(compiles) == 9 and len(runs) == 9
    seen = set()
    for rec in compiles:
        argv = rec["argv"]
        slug, executor = Path(rec["cwd"]).parent.name, Path(rec["cwd"]).name
        layer_dir = work(out) / "layers" / slug
        # a layer whose weights are in the weight store compiles its MLIR written out with them
        # (backends/iree_tools.compile_mlir_module; removed after the compile)
        with_weights = layer_dir / executor / ".with_weights" / "model.mlir"
        assert argv[1] in (str(layer_dir / "model.mlir"), str(with_weights)) and not with_weights.exists()
        assert argv[:1] + argv[2:] == [FAKE_COMPILE, "-o", str(layer_dir / executor / "module.vmfb"),
                                       "--torq-hw=default", "--torq-target-host-triple=native", *FORCING_FLAGS[executor]]
        assert rec["forced_executor"] == executor
        seen.add((slug, executor))
    assert len(seen) == 9
    for rec in runs:
        cwd = Path(rec["cwd"])
        assert rec["argv"] == [FAKE_RUN, f"--module={cwd / 'module.vmfb'}", "--function=main",
                               f"--output=@{cwd}/outputs/output_0.bin", "--torq_hw_type=sim",
                               f"--input=1x{3 if cwd.parent.name.startswith('Conv') else 4}x8x8xf32=@{cwd}/inputs/input_0.bin"]



@pytest.mark.slow
def test_discover_with_fake_tools_in_compile_batches(fake_torq, tmp_path):
    """--compile-batch 3: one torq-compile per executor for the three layers (a module
    with three functions), each layer run by its function; the verdicts of one-layer compiles."""
    model = three_layer_model(tmp_path / "m3.onnx")
    out = tmp_path / "out"
    r = run_cli("discover", "--model", model, "--output-dir", out, "--config-file", _torq_config_copy(tmp_path),
                "-j", "2", "-q", "--compile-batch", "3")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((out / "torq_gen_config_m3.json").read_text())
    for lid, op in report["ops"].items():
        assert {n: e["status"] for n, e in op["executors"].items()} == dict.fromkeys(("nss", "css", "host"),
                                                                                      "success"), lid
        assert op["executors"]["nss"]["timing"]["compile_batch"]["members"] == 3
    log = read_log(fake_torq)
    compiles = [r for r in log if r["tool"] == "torq-compile" and r["argv"][1:] != ["--version"]]
    runs = [r for r in log if r["tool"] == "torq-run-module"]
    assert sorted(r["forced_executor"] for r in compiles) == ["css", "host", "nss"] and len(runs) == 9
    for rec in compiles:
        batch = Path(rec["cwd"])
        assert batch.parent.name == rec["forced_executor"]
        assert rec["argv"][1] in (str(batch / "batch.mlir"), str(batch / ".with_weights" / "batch.mlir"))
    functions = sorted(a for r in runs for a in r["argv"] if a.startswith("--function="))
    assert functions == sorted(["--function=l_Add_y", "--function=l_Conv_conv_out", "--function=l_Relu_relu_out"] * 3)

def _no_torq_tools(monkeypatch, tmp_path):
    if importlib.util.find_spec("torq") is not None:
        pytest.skip("a torq package is installed: its tools would be found")
    if (REPO.parent / "iree-build" / "tools" / "torq-compile").exists():
        pytest.skip("a sibling build tree has torq-compile")
    _clear_torq_env(monkeypatch)
    path = os.pathsep.join([VENV_BIN, "/usr/bin", "/bin"])
    if shutil.which("torq-compile", path=path):
        pytest.skip("torq-compile is on PATH")
    monkeypatch.setenv("PATH", path)


def test_discover_without_tools_gives_compile_errors(monkeypatch, tmp_path):
    _no_torq_tools(monkeypatch, tmp_path)
    model = three_layer_model(tmp_path / "m3.onnx")
    out = tmp_path / "out"
    r = run_cli("discover", "--model", model, "--output-dir", out, "--config-file", _torq_config_copy(tmp_path),
                "-j", "2", "-q")
    # every executor failed every layer: the compiler JSON assigns nothing and says why (exit 3)
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-3000:]
    assert "no executor passed any layer" in r.stderr
    report = json.loads((out / "torq_gen_config_m3.json").read_text())
    assert len(report["ops"]) == 3
    for lid, op in report["ops"].items():
        assert set(op["executors"]) == {"nss", "css", "host"}, lid
        for name, e in op["executors"].items():
            fr = e["failure_report"]
            assert e["status"] == "error" and fr["stage"] == "compile", (lid, name, e)
            for part in ("'torq-compile' not found", "$TORQ_COMPILE (unset)", "$TORQ_TOOL_PATH (unset)",
                         "torq/_compiler_libs/torq-compile", "iree-build", "PATH="):
                assert part in fr["message"], (part, fr["message"])
            assert "torq-compile" in fr["summary"]
        assert op["recommended_executor"] is None
    assert len(report["discovery_report"]["critical_failures"]) == 3
    assert "CRITICAL" in r.stdout
