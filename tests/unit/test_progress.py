"""Tests of the progress display (torq_gen_config/core/progress.py) fed with the log records
Snakemake emits (same event names and fields as snakemake's scheduler and jobs), and of its
installation in place of Snakemake's console handler (workflow_api)."""

from __future__ import annotations

import io
import logging
import sys

import pytest
from snakemake_interface_logger_plugins.common import LogEvent

from torq_gen_config.pipeline import cluster
from torq_gen_config.core import progress
from torq_gen_config.core.progress import ProgressDisplay, display_mode


def rec(msg=None, level=logging.INFO, **extra):
    r = logging.LogRecord("snakemake", level, __file__, 1, msg, None, None)
    for k, v in extra.items():
        setattr(r, k, v)
    return r


def job_info(jobid, rule="test_layer", **wildcards):
    return rec(f" Rule: {rule}, Jobid: {jobid}", event=LogEvent.JOB_INFO, jobid=jobid, rule_name=rule,
               wildcards=wildcards, input=["in"], output=["out"], log=[], rule_msg=None, local=True, benchmark=None,
               reason="Missing output files", resources={}, priority=0, threads=1, indent=False,
               is_checkpoint=False, printshellcmd=False, is_handover=False, shellcmd=None)


class _Captured:
    """capsys's text so far, as ``getvalue()`` of the two streams."""

    def __init__(self, capsys):
        self.capsys, self.out, self.err = capsys, "", ""

    def read(self):
        o, e = self.capsys.readouterr()
        self.out += o
        self.err += e
        return self


@pytest.fixture()
def streams(capsys):
    return _Captured(capsys)


def test_lines_mode_counts_verdicts_and_hides_job_blocks(streams, monkeypatch):
    monkeypatch.setattr(progress, "LINE_MIN_S", 0.0)
    before = (sys.stdout, sys.stderr)
    with ProgressDisplay("lines", what="discovery of m") as d:
        d.emit(rec("Building DAG of jobs..."))
        d.emit(job_info(7, layer="Conv_r0", executor="llvm-cpu"))
        assert d.running == {7: "Conv_r0 on llvm-cpu"}
        progress.job_verdict("success", "[llvm-cpu] Conv_r0: success (400 ms compile, 2.0 ms run)")
        progress.job_verdict("error", "[vmvx] Conv_r0: error - compile failed: x")
        print("[ort] Conv_r0: success (a printed line is shown, never parsed into a count)")
        print("split: 3 layers", file=sys.stderr)
        d.emit(rec(None, event=LogEvent.JOB_FINISHED, job_id=7))
        d.emit(rec(None, event=LogEvent.PROGRESS, done=5, total=10))
        assert d.running == {} and d.counts == {"success": 1, "error": 1}
    out, err = streams.read().out, streams.err
    # the jobs' lines where they were written; Snakemake's bookkeeping nowhere
    assert out == ("[llvm-cpu] Conv_r0: success (400 ms compile, 2.0 ms run)\n"
                   "[vmvx] Conv_r0: error - compile failed: x\n"
                   "[ort] Conv_r0: success (a printed line is shown, never parsed into a count)\n")
    lines = err.splitlines()
    assert lines[0] == "split: 3 layers"
    assert lines[1].startswith("progress: 5 of 10 steps (50%); verdicts: success 1, error 1; ") and "left" in lines[1]
    assert lines[2].startswith("discovery of m: 5 of 10 steps done in ")
    assert "Building DAG" not in err and "Rule: test_layer" not in err
    assert (sys.stdout, sys.stderr) == before  # restored


def test_lines_mode_is_short(streams, monkeypatch):
    """At most one line per tenth of the jobs (and none closer than LINE_MIN_S)."""
    monkeypatch.setattr(progress, "LINE_MIN_S", 0.0)
    with ProgressDisplay("lines") as d:
        for done in range(1, 201):
            d.emit(rec(None, event=LogEvent.PROGRESS, done=done, total=200))
    lines = streams.read().err.splitlines()
    assert len(lines) == 10 and lines[-1].startswith("workflow: 200 of 200 steps done")
    monkeypatch.setattr(progress, "LINE_MIN_S", 3600.0)
    with ProgressDisplay("lines") as d:
        for done in range(1, 201):
            d.emit(rec(None, event=LogEvent.PROGRESS, done=done, total=200))
    assert len(streams.capsys.readouterr().err.splitlines()) == 1  # a short run: the summary only


def test_errors_and_nothing_to_be_done_get_through(streams):
    with ProgressDisplay("lines") as d:
        d.emit(rec("Nothing to be done (all requested files are present and up to date)."))
        d.emit(rec("Error in rule prepare_model, jobid: 3", level=logging.ERROR, event=LogEvent.JOB_ERROR,
                   rule_name="prepare_model", rule_msg=None, jobid=3, input=["m.onnx"], output=["p.onnx"], log=[],
                   conda_env=None, container_img=None, aux={}, indent=False, shellcmd=None))
        d.emit(rec("some warning", level=logging.WARNING))
    text = streams.read().err
    assert text.startswith("Nothing to be done") and "some warning" in text
    # a failed job is one line (Snakemake's block, with every input, is in the log file)
    assert "job failed: rule prepare_model for p.onnx" in text and "Error in rule" not in text
    assert "steps done" not in text  # no job ran: no summary line


def test_error_blocks_of_the_jobs_being_stopped_go_to_the_log_file_only(streams, tmp_path):
    """After Ctrl-C every running job ends with Snakemake's RuleException block (30-145
    lines on the console before); the caller's one line says what happened."""
    log = tmp_path / "diag.log"
    stopping = []
    with ProgressDisplay("lines", log_file=str(log), stopping=lambda: bool(stopping)) as d:
        stopping.append(2)
        d.emit(rec("RuleException:\nRunStopped in file layer_tests.smk, line 30", level=logging.ERROR))
        d.emit(rec("Error in rule test_layer, jobid: 11", level=logging.ERROR, event=LogEvent.JOB_ERROR,
                   rule_name="test_layer", rule_msg=None, jobid=11, input=["a"], output=["b"], log=[],
                   conda_env=None, container_img=None, aux={}, indent=False, shellcmd=None))
    err = streams.read().err
    assert "RuleException" not in err and "Error in rule" not in err
    assert "RunStopped" in log.read_text() and "Error in rule test_layer" in log.read_text()


def test_live_mode_shows_failures_only(streams):
    with ProgressDisplay("live", what="discovery of m") as d:
        d.emit(job_info(1, rule="split_layers"))
        assert d.running == {1: "split_layers"}
        progress.job_verdict("success", "[ort] Relu_a: success (1 ms compile, 0.3 ms run)")
        progress.job_verdict("error", "[vmvx] LpPool_p: error - compile failed")
        d.emit(rec(None, event=LogEvent.PROGRESS, done=2, total=4))
        rendered = d._render()  # the live display renders without error
        assert rendered is not None
    text = streams.read().err
    assert "[vmvx] LpPool_p: error" in text and "Relu_a: success" not in text  # counted, not printed
    assert "discovery of m: 2 of 4 steps done" in text and "verdicts: success 1, error 1" in text
    assert streams.out == ""



def test_the_closing_line_counts_the_layers_not_tested(streams):
    """The split job hands the number of layers that are not testable: the closing line
    counts them (a partial run does not read as a clean one)."""
    with ProgressDisplay("lines", what="discovery of m") as d:
        d.emit(job_info(1, rule="split_layers"))
        progress.job_verdict("success", "[ort] Relu_a: success (1 ms compile, 0.3 ms run)")
        progress.job_verdict("not tested", "not tested: 2 of 3 layers are not testable", count=2)
        d.emit(rec(None, event=LogEvent.PROGRESS, done=4, total=4))
    text = streams.read().err
    assert "not tested: 2 of 3 layers are not testable" in streams.out
    assert "discovery of m: 4 of 4 steps done" in text and "verdicts: success 1, not tested 2 layers" in text


def test_log_file_gets_snakemake_blocks(streams, tmp_path):
    log = tmp_path / "diag.log"
    with ProgressDisplay("lines", log_file=str(log)) as d:
        d.emit(job_info(4, layer="Relu_a", executor="ort"))
        d.emit(rec(None, event=LogEvent.PROGRESS, done=1, total=2))
    text = log.read_text()
    assert "rule test_layer:" in text and "jobid: 4" in text and "1 of 2 steps (50%) done" in text
    assert "rule test_layer" not in streams.read().err


def test_display_mode():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert display_mode(quiet=False, verbose=False, dryrun=False, stream=Tty()) == "live"
    assert display_mode(quiet=True, verbose=False, dryrun=False, stream=Tty()) == "lines"
    assert display_mode(quiet=False, verbose=False, dryrun=False, stream=io.StringIO()) == "lines"
    assert display_mode(quiet=False, verbose=True, dryrun=False, stream=Tty()) is None
    assert display_mode(quiet=False, verbose=False, dryrun=True, stream=Tty()) is None
    with pytest.raises(ValueError):
        ProgressDisplay("fancy")


def test_installed_in_place_of_snakemakes_console_handler(streams):
    """workflow_api._progress_display swaps Snakemake's console handler for the display and back."""
    from snakemake.logging import logger

    from torq_gen_config.pipeline.workflow_api import _progress_display

    console = logging.StreamHandler(io.StringIO())
    console.name = "DefaultStreamHandler"
    logger.addHandler(console)
    try:
        with _progress_display("lines", "discovery of m", None) as d:
            assert console not in logger.handlers and d in logger.handlers
        assert console in logger.handlers and d not in logger.handlers
    finally:
        logger.removeHandler(console)


def test_live_mode_catches_what_other_processes_write(capfd, tmp_path):
    """On a terminal, what worker processes and native code write to fd 1/2 comes above the
    display, not through it; ONNX Runtime's own log lines go only to the log file."""
    import os
    import subprocess

    log = tmp_path / "diag.log"
    with ProgressDisplay("live", what="discovery of m", log_file=str(log)):
        os.write(1, b"split: 3 layers (from a worker)\n")
        os.write(2, b"\x1b[0;93m2026-12-01 10:00:00.1 [W:onnxruntime:, graph.cc:4 F] Removing initializer w\x1b[m\n")
        subprocess.run(["sh", "-c", "echo child line"], check=True)
    out, err = capfd.readouterr()
    assert "split: 3 layers (from a worker)" in err and "child line" in err
    assert "onnxruntime" not in out + err
    assert "Removing initializer w" in log.read_text()
    os.write(1, b"after\n")  # the descriptors are back
    assert capfd.readouterr().out == "after\n"


def test_a_success_that_could_not_have_failed_is_counted_apart(streams):
    """success* (an inconclusive comparison, from layer_test.one_line_summary) is its own
    count, not a success."""
    from torq_gen_config.discovery.layer_test import one_line_summary

    res = {"executor": "ort", "layer_id": "Softmax_s", "status": "success", "failure_report": None,
           "timing": {"compile_ms": 3.0, "run_ms": 1.0},
           "metrics": {"inconclusive": True, "inconclusive_reasons": ["reference is constant (all 1000 ...)"]}}
    line = one_line_summary(res)
    assert line == ("[ort] Softmax_s: success* (3 ms compile, 1.0 ms run; inconclusive: reference is constant "
                    "(all 1000 ...))")
    plain = one_line_summary({**res, "metrics": {"inconclusive": False}})
    assert plain == "[ort] Softmax_s: success (3 ms compile, 1.0 ms run)"
    from torq_gen_config.compare import shown_status

    with ProgressDisplay("lines", what="discovery of m") as d:
        progress.job_verdict(shown_status(res), line)
        progress.job_verdict(shown_status({**res, "metrics": {"inconclusive": False}}), plain)
        assert d.counts == {"success*": 1, "success": 1}
        assert d.counts_text() == "success 1, success* 1"
    progress.job_verdict("success", plain)  # no display (a cluster job's process): the line on stdout
    assert streams.read().out.endswith(plain + "\n")


def _unit_dir(tmp_path, slugs=("Conv_a", "Relu_b", "Add_c")):
    import json

    unit = tmp_path / "work" / "m" / "units" / "0001"
    unit.mkdir(parents=True)
    (unit / "prepared.json").write_text(json.dumps({"unit": "0001", "members": [{"slug": s} for s in slugs]}))
    return unit


def job_error(rule, inputs, outputs, logs, rule_msg=None, aux=None):
    return rec(f"Error in rule {rule}, jobid: 8", level=logging.ERROR, event=LogEvent.JOB_ERROR, rule_name=rule,
               rule_msg=rule_msg, jobid=8, input=inputs, output=outputs, log=logs, conda_env=None,
               container_img=None, aux=aux or {}, indent=False, shellcmd=None)


def test_a_failed_unit_job_names_its_layers_and_its_slurm_job(tmp_path):
    """The line of a SLURM job cancelled mid-run: the unit, its layers (from the unit's
    prepared.json), the SLURM job id and state, and the SLURM job's log."""
    unit = _unit_dir(tmp_path)
    slurm_log = ".snakemake/slurm_logs/rule_test_unit/0001_vmvx/57.log"
    line = progress.short_error(job_error(
        "test_unit", [str(unit / "prepared.json")], [str(unit / "vmvx.json")], ["work/m/logs/test_unit/0001.vmvx.log",
                                                                                 slurm_log],
        rule_msg="SLURM-job '57' failed, SLURM status is: 'CANCELLED'. Detailed failure reason unavailable "
                 "(status command is not 'sacct').For further error details see the cluster/cloud log",
        aux={"external_jobid": "57"}))
    assert line == (f"job failed: rule test_unit, unit 0001 on vmvx (layers Conv_a .. Add_c (3)): SLURM job 57 "
                    f"CANCELLED, cancelled (scancel, or an administrator) (log: {slurm_log})")
    # past its time limit; a unit's preparation; a local failure (no SLURM job)
    line = progress.short_error(job_error("test_unit", [str(unit / "prepared.json")], [str(unit / "ort.json")],
                                           ["l.log", "58.log"], rule_msg="SLURM status is: 'TIMEOUT'.",
                                           aux={"external_jobid": "58"}))
    assert "unit 0001 on ort (layers Conv_a .. Add_c (3)): SLURM job 58 TIMEOUT, past its time limit (log: 58.log)" \
        in line
    assert progress.short_error(job_error("prepare_unit", ["manifest.json"], [str(unit / "prepared.json")],
                                           ["p.log"])) == \
        "job failed: rule prepare_unit, unit 0001 (layers Conv_a .. Add_c (3)) (log: p.log)"
    # no prepared.json yet: the unit without its layers
    assert progress.short_error(job_error("prepare_unit", [], ["work/m/units/0009/prepared.json"], [])) == \
        "job failed: rule prepare_unit, unit 0009"


def test_layers_text():
    assert progress.layers_text(["a"]) == "layer a"
    assert progress.layers_text(["a", "b"]) == "layers a, b"
    assert progress.layers_text(["a", "b", "c", "d"]) == "layers a .. d (4)"


def test_job_failure_lines_sees_snakemakes_records_past_its_console_filter(tmp_path):
    """Installed on the `snakemake` logger: a JOB_ERROR logged on `snakemake.logging`
    (whose own handler may drop it: quiet rules) becomes one line."""
    out = io.StringIO()
    child = logging.getLogger("snakemake.logging")
    dropped = logging.Handler()
    dropped.emit = lambda record: None
    child.addHandler(dropped)
    try:
        with cluster.job_failure_lines(out):
            child.error("Error in rule prepare_model, jobid: 3", extra=dict(
                event=LogEvent.JOB_ERROR, rule_name="prepare_model", rule_msg=None, jobid=3, input=["m.onnx"],
                output=["p.onnx"], log=["l.log"], conda_env=None, container_img=None, aux={}, indent=False,
                shellcmd=None))
        assert out.getvalue() == "job failed: rule prepare_model for p.onnx (log: l.log)\n"
        assert not [h for h in logging.getLogger("snakemake").handlers if isinstance(h, cluster.JobFailureLines)]
    finally:
        child.removeHandler(dropped)


def test_a_job_pending_on_a_drained_node_gets_one_line(tmp_path, monkeypatch):
    unit = _unit_dir(tmp_path)
    out = io.StringIO()
    lines = cluster.JobFailureLines(out, check_s=3600)
    job = job_info(7, rule="test_unit")
    job.input, job.output = [str(unit / "prepared.json")], [str(unit / "llvm-cpu.json")]
    lines.emit(job)
    lines.emit(rec("Job 7 has been submitted with SLURM jobid 61 (log: /o/.snakemake/slurm_logs/61.log)."))
    lines.emit(rec("Job 9 has been submitted with SLURM jobid 62 (log: /o/.snakemake/slurm_logs/62.log)."))
    assert lines.submitted == {"61": 7, "62": 9}
    monkeypatch.setattr(cluster, "_node_states_text", lambda: "; node(s) drain: localhost (reason: test)")
    squeue = lambda ids: [("61", "PENDING", "ReqNodeNotAvail, UnavailableNodes:localhost"),  # noqa: E731
                          ("62", "PENDING", "Priority")]
    lines.check_pending(squeue)
    lines.check_pending(squeue)  # said once
    assert out.getvalue() == ("waiting: SLURM job 61 (rule test_unit, unit 0001 on llvm-cpu (layers Conv_a .. Add_c "
                              "(3))) is pending: ReqNodeNotAvail, UnavailableNodes:localhost; node(s) drain: "
                              "localhost (reason: test)\n")
    lines.check_pending(lambda ids: [("62", "COMPLETED", "None")])
    assert lines.finished == {"62"}
    lines.close()
