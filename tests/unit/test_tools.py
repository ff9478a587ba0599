"""Tests of torq_gen_config.core.tools: run_tool (timeouts, crashes, logs), find_tool, message bounding."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from torq_gen_config.core.tools import (
    ToolNotFoundError,
    bounded_message,
    find_tool,
    first_error_line,
    run_tool,
)


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


# ------------------------------------------------------------------ run_tool


def test_run_tool_success_captures_output_and_time(tmp_path):
    res = run_tool(
        [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(0)"],
        timeout_s=30,
    )
    assert res.returncode == 0 and res.ok
    assert res.stdout == "out\n"
    assert res.stderr == "err\n"
    assert not res.timed_out and not res.crashed and res.signal_name is None
    assert res.wall_ms > 0
    assert res.argv[0] == sys.executable


def test_run_tool_nonzero_exit_is_reported_not_raised():
    res = run_tool([sys.executable, "-c", "import sys; sys.exit(3)"], timeout_s=30)
    assert res.returncode == 3
    assert not res.ok and not res.crashed and not res.timed_out
    assert res.describe_failure() == "exit status 3"


def test_run_tool_cwd_and_env(tmp_path):
    env = dict(os.environ, TORQ_TEST_VAR="hello")
    res = run_tool(
        [sys.executable, "-c", "import os; print(os.getcwd()); print(os.environ['TORQ_TEST_VAR'])"],
        timeout_s=30,
        cwd=tmp_path,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [str(tmp_path), "hello"]


def test_run_tool_timeout_kills_sleep():
    start = time.perf_counter()
    res = run_tool(["sleep", "10"], timeout_s=0.5)
    elapsed = time.perf_counter() - start
    assert res.timed_out
    assert not res.crashed
    assert res.returncode == -signal.SIGKILL
    assert elapsed < 5, f"run_tool waited {elapsed:.1f} s for a 0.5 s timeout"
    assert 400 <= res.wall_ms < 5000
    assert "timed out" in res.describe_failure()


def test_run_tool_timeout_kills_whole_process_group():
    # The shell starts a background sleep, prints its pid and waits: on timeout the
    # background child must die too (it is in the same process group).
    res = run_tool(["sh", "-c", "sleep 30 & echo $!; wait"], timeout_s=0.5)
    assert res.timed_out
    child = int(res.stdout.split()[0])
    deadline = time.time() + 5
    while _pid_alive(child) and time.time() < deadline:
        time.sleep(0.05)
    assert not _pid_alive(child), f"background child {child} survived the timeout"


def test_run_tool_keeps_partial_output_on_timeout():
    res = run_tool(
        [sys.executable, "-u", "-c", "import time; print('started', flush=True); time.sleep(30)"],
        timeout_s=1.5,
    )
    assert res.timed_out
    assert "started" in res.stdout


def test_run_tool_crash_reports_signal():
    res = run_tool(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
        timeout_s=30,
    )
    assert res.crashed
    assert not res.timed_out
    assert res.returncode == -signal.SIGSEGV
    assert res.signal_name == "SIGSEGV"
    assert res.describe_failure() == "killed by SIGSEGV"


def test_run_tool_abort_reports_sigabrt():
    res = run_tool([sys.executable, "-c", "import os; os.abort()"], timeout_s=30)
    assert res.crashed and res.signal_name == "SIGABRT"


def test_run_tool_missing_executable_raises():
    with pytest.raises(ToolNotFoundError, match="no-such-tool-xyz"):
        run_tool(["/nonexistent/no-such-tool-xyz", "--help"], timeout_s=5)


def test_run_tool_rejects_bad_arguments():
    with pytest.raises(ValueError, match="empty command line"):
        run_tool([], timeout_s=5)
    with pytest.raises(ValueError, match="timeout_s"):
        run_tool(["true"], timeout_s=0)


def test_run_tool_log_file(tmp_path):
    log = tmp_path / "logs" / "tool.log"
    code = "import sys; print('hello stdout'); print('hello stderr', file=sys.stderr); sys.exit(2)"
    r1 = run_tool([sys.executable, "-c", code], timeout_s=30, log_path=log)
    r2 = run_tool(["sleep", "5"], timeout_s=0.3, log_path=log)
    r3 = run_tool(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
        timeout_s=30,
        log_path=log,
    )
    assert r1.returncode == 2 and r2.timed_out and r3.crashed
    text = log.read_text()
    # Appended, one record per run, in order.
    assert text.count("=== ") == 3
    first = text.index("hello stdout")
    assert r1.command_line() in text
    assert "--- return code 2" in text
    assert "hello stdout" in text and "hello stderr" in text
    assert text.index("hello stderr") > first
    assert "TIMED OUT after 0.3 s" in text
    assert "CRASHED: killed by SIGSEGV" in text
    assert text.index("sleep 5") > first


def test_run_tool_log_keeps_full_output(tmp_path):
    log = tmp_path / "big.log"
    res = run_tool([sys.executable, "-c", "print('x' * 100000)"], timeout_s=30, log_path=log)
    assert len(res.stdout) == 100001
    assert "x" * 100000 in log.read_text()


# ----------------------------------------------------------------- find_tool


def test_find_tool_in_interpreter_dir():
    # The venv bin holds the interpreter itself.
    name = os.path.basename(sys.executable)
    found = find_tool(name)
    assert os.path.dirname(found) == os.path.abspath(os.path.dirname(sys.executable))


def test_find_tool_iree_compile_in_venv():
    found = find_tool("iree-compile")
    assert os.access(found, os.X_OK)


def test_find_tool_env_var_overrides(tmp_path, monkeypatch):
    exe = tmp_path / "my-tool"
    exe.write_text("#!/bin/sh\necho hi\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("TORQ_MY_TOOL", str(exe))
    assert find_tool("iree-compile", "TORQ_MY_TOOL") == str(exe)


def test_find_tool_env_var_bad_value_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TORQ_MY_TOOL", str(tmp_path / "missing"))
    with pytest.raises(ToolNotFoundError, match=r"\$TORQ_MY_TOOL=.*not an executable"):
        find_tool("iree-compile", "TORQ_MY_TOOL")


def test_find_tool_search_dirs(tmp_path):
    exe = tmp_path / "special-tool-abc"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert find_tool("special-tool-abc", search_dirs=[tmp_path]) == str(exe)


def test_find_tool_not_found_lists_searched_places(monkeypatch):
    monkeypatch.delenv("TORQ_NOPE", raising=False)
    with pytest.raises(FileNotFoundError) as ei:
        find_tool("no-such-tool-xyz", "TORQ_NOPE")
    msg = str(ei.value)
    assert "no-such-tool-xyz" in msg
    assert "$TORQ_NOPE (unset)" in msg
    assert os.path.dirname(sys.executable) in msg
    assert "PATH=" in msg


# ---------------------------------------------------------- bounded messages

_COMPILER_OUTPUT = (
    "layer.mlir:4:10: warning: something harmless\n"
    "note: more harmless\n"
    "layer.mlir:5:10: error: failed to legalize operation 'torch.operator'\n"
    "    %0 = torch.operator \"onnx.LpPool\"(%arg0)\n"
    "         ^\n"
    "layer.mlir:5:10: note: see current operation\n"
)


def test_bounded_message_starts_at_first_error_line():
    msg = bounded_message(_COMPILER_OUTPUT)
    assert msg.startswith("layer.mlir:5:10: error: failed to legalize")
    assert "warning: something harmless" not in msg
    assert msg.endswith("note: see current operation")


def test_bounded_message_without_error_keeps_start():
    assert bounded_message("line one\nline two\n") == "line one\nline two"
    assert bounded_message("") == ""
    assert bounded_message("   \n\n") == ""


def test_bounded_message_prefers_error_word_over_substring():
    text = 'File "/x/errors.py", line 3\nValueError: bad\nerror: the real one\n'
    assert bounded_message(text).startswith("error: the real one")
    assert bounded_message('File "/x/errors.py"\nValueError: bad\n').startswith("ValueError: bad")


def test_bounded_message_from_error_false_keeps_start():
    assert bounded_message("head\nerror: x\n", from_error=False) == "head\nerror: x"


def test_bounded_message_cuts_at_line_boundary_with_note():
    lines = [f"error line {i:04d} " + "x" * 80 for i in range(200)]
    text = "\n".join(lines) + "\n"
    msg = bounded_message(text, limit=1000)
    assert len(msg) <= 1000
    body, note = msg.rsplit("\n", 1)
    # Whole lines only.
    assert all(line in lines for line in body.split("\n"))
    n_more = int(note.split("(")[1].split()[0])
    assert note == f"... ({n_more} more chars)"
    assert len(body) + n_more == len(text.rstrip())


def test_bounded_message_cuts_inside_one_huge_line():
    text = "error: " + "dense<" + "1.0, " * 5000 + ">\nnext line\n"
    msg = bounded_message(text, limit=500)
    assert len(msg) <= 500
    assert msg.startswith("error: dense<1.0, ")
    assert msg.rsplit("\n", 1)[1].endswith("more chars)")


def test_bounded_message_short_text_unchanged():
    assert bounded_message("error: short\n", limit=4000) == "error: short"


def test_first_error_line():
    assert first_error_line(_COMPILER_OUTPUT) == "layer.mlir:5:10: error: failed to legalize operation 'torch.operator'"
    assert first_error_line("") == ""
    assert first_error_line("\n\n  hello  \nworld") == "hello"
    # IREE runtime status line, no "error" word.
    run_err = (
        "EXEC @main\n"
        "c/runtime/src/iree/modules/hal/utils/buffer_diagnostics.c:225: INVALID_ARGUMENT; tensor shape dimension 0 mismatch\n"
    )
    assert first_error_line(run_err).startswith("c/runtime/src/iree/modules/hal/utils/buffer_diagnostics.c:225: INVALID_ARGUMENT;")
    long = "error: " + "y" * 2000
    line = first_error_line(long)
    assert len(line) == 512 and line.endswith("...")
    assert len(first_error_line(long, limit=100)) == 100


def test_run_tool_real_iree_compile_error_is_bounded(tmp_path):
    """A real compiler error: the bounded message starts at iree-compile's error line."""
    bad = tmp_path / "bad.mlir"
    bad.write_text("func.func @main( -> {\n")
    res = run_tool([find_tool("iree-compile"), str(bad), "-o", str(tmp_path / "x.vmfb")], timeout_s=120)
    assert res.returncode != 0 and not res.crashed
    msg = bounded_message(res.stderr)
    assert "error:" in msg.splitlines()[0]
    assert "bad.mlir:1:" in first_error_line(res.stderr)


def test_python_wrapper_hides_signal():
    """Document why the IREE backend uses the native binaries: a Python wrapper that
    does ``sys.exit(subprocess.call(...))`` turns SIGSEGV into exit status 245."""
    code = (
        "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', "
        "'import os, signal; os.kill(os.getpid(), signal.SIGSEGV)']))"
    )
    res = run_tool([sys.executable, "-c", code], timeout_s=30)
    assert res.returncode == 256 - signal.SIGSEGV
    assert not res.crashed
    assert subprocess.call([sys.executable, "-c", "pass"]) == 0


def test_first_error_line_of_a_flags_error_banner():
    """iree-run-module with an unknown flag prints a coloured banner, then the cause."""
    text = "\x1b[31mFLAGS ERROR: (\u256f\u00b0\u25a1\u00b0)\u256f\ufe35\U0001f47b\x1b[0m\nflag 'bogus_flag' not recognized\n"
    assert first_error_line(text) == "FLAGS ERROR: flag 'bogus_flag' not recognized"
    assert first_error_line("\x1b[1mwarning\x1b[0m\nerror: real cause") == "error: real cause"
