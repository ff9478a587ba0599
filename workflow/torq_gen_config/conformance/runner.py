"""The conformance run: every selected node test is one ``discover`` into
``<output dir>/tests/<test>/out`` (tests in parallel, each stopped at its timeout), judged
per executor and recorded in ``tests/<test>/conformance_result.json`` (written atomically)
with a fingerprint of what decides it; a rerun skips the tests whose record is current, an
interrupted run resumes. Then the matrix: ``conformance.json``, ``.md``, ``.html`` and
every test's record in ``conformance_verdicts.json``."""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import io
import json
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path


from ..core import run_lock
from ..core.errors import EXIT_NOTHING_ASSIGNED, ConfigError
from ..core.fileio import atomic_write_text, write_bytes_if_changed, write_json
from ..core.layout import CASE_INPUTS_FILE, CASE_MODEL_FILE, lock_file
from ..core.lazy import metadata, np
from ..core.tools import kill_all_tools
from . import cases as node_cases
from .discovery import (discover_command, discover_env, first_line, read_discovery, refusal_message, reports_in,
                        run_discover)
from .evaluate import executor_outcome, not_judged, reference_check
from .matrix import MATRIX_SCHEMA, TEST_SCHEMA, VERDICTS_SCHEMA, aggregate, compare_expected, mark_records
from .progress import TestProgress
from .render import html_page, markdown

RESULT_FILE = "conformance_result.json"
MATRIX_FILE, VERDICTS_FILE = "conformance.json", "conformance_verdicts.json"
MARKDOWN_FILE, HTML_FILE = "conformance.md", "conformance.html"
#: configuration keys that do not decide a test's outcome (the timeout is handled apart)
_NOT_DECIDING = ("model", "output_dir", "timeout_s", "verbose", "log_file", "input_data")
_stopping = threading.Event()


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (``signum``: SIGINT or SIGTERM)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signum)
        self.signum = int(signum)


@dataclass
class Settings:
    """What a conformance run was asked to do."""

    out: Path
    config: dict  # the validated workflow config (executors, tolerance, ...)
    config_file: str | None = None
    timeout_s: float = 600.0
    jobs: int = 1
    quiet: bool = False
    rerun: bool = False
    expected: list[tuple[str, str, dict]] = field(default_factory=list)  # (executor, file, listed names)

    @property
    def executors(self) -> list[dict]:
        """The executors tested: the configured ones less ``skip_executors``."""
        skip = set(self.config.get("skip_executors") or [])
        return [e for e in self.config["executors"] if e["name"] not in skip]


def versions() -> dict:
    """The versions that decide the outcomes: the product, onnx, onnxruntime, IREE, Python."""
    out = {}
    for dist in ("torq-gen-config", "onnx", "onnxruntime", "iree-base-compiler", "iree-base-runtime"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    out["python"] = ".".join(map(str, sys.version_info[:3]))
    return out


def config_digest(config: dict) -> str:
    """SHA-256 of the config keys that decide a test's outcome (executors, tolerance, ...)."""
    deciding = {k: v for k, v in sorted(config.items()) if k not in _NOT_DECIDING}
    return hashlib.sha256(json.dumps(deciding, sort_keys=True, default=str).encode()).hexdigest()


def fingerprint(case_digest: str, settings: Settings, vers: dict) -> str:
    """What decides one test's record: the test (model bytes, inputs, expected outputs,
    rtol/atol), the config and its tested executors, and the versions."""
    data = {"case": case_digest, "config": config_digest(settings.config),
            "executors": [e["name"] for e in settings.executors], "versions": vers}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def timed_out(rec: dict) -> bool:
    """True when the test or one of its tools ran into its time limit."""
    return (rec.get("discover") or {}).get("status") == "timeout" or any(
        r.get("stage") == "timeout" for r in (rec.get("executors") or {}).values())


def current_record(path: Path, fp: str, timeout_s: float) -> dict | None:
    """The stored record at ``path`` when it is current: same fingerprint, and not a timeout
    that the (larger) ``timeout_s`` now allows to finish; else None (also when unreadable)."""
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("schema") != TEST_SCHEMA or rec.get("fingerprint") != fp:
        return None
    if timed_out(rec) and timeout_s > float(rec.get("timeout_s") or 0):
        return None
    return rec


def _npz_bytes(arrays: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def run_test(case, settings: Settings, fp: str, case_digest: str, env: dict) -> dict | None:
    """One test: its discovery (files kept in ``tests/<name>/``, a discovery that was cut
    short resumes there), then its record, written atomically. None when the run is
    stopping (no record is written for a discovery the stop killed)."""
    d = settings.out / "tests" / case.name
    d.mkdir(parents=True, exist_ok=True)
    write_bytes_if_changed(d / CASE_MODEL_FILE, case.model.SerializeToString(deterministic=True))
    changed = write_bytes_if_changed(d / "case.sha256", case_digest.encode())
    if changed or not (d / CASE_INPUTS_FILE).is_file():  # only then: the discovery's --input-data keeps its mtime
        write_bytes_if_changed(d / CASE_INPUTS_FILE, _npz_bytes(node_cases.inputs_of(case)))
    executors = settings.executors
    skip = sorted(set(settings.config.get("skip_executors") or []))
    cmd = discover_command(d / CASE_MODEL_FILE, d / "out", tool_timeout_s=settings.timeout_s / 2,
                           input_data=d / CASE_INPUTS_FILE, skip_executors=skip, config_file=settings.config_file)
    rc, stdout, stderr, secs = run_discover(cmd, d, settings.timeout_s, env)
    if _stopping.is_set():
        return None
    atomic_write_text(d / "discover.stdout", stdout or "")
    atomic_write_text(d / "discover.stderr", stderr or "")
    rtol, atol = node_cases.tolerances(case)
    node = case.model.graph.node[0] if len(case.model.graph.node) else None
    rec = {"schema": TEST_SCHEMA, "test": case.name, "op_type": node_cases.op_types(case.model),
           "domain": (node.domain if node is not None else "") or "", "opset": node_cases.opset(case.model),
           "fingerprint": fp, "timeout_s": settings.timeout_s, "seconds": round(secs, 2), "rtol": rtol, "atol": atol,
           "discover": {"status": "ok", "exit_status": rc, "message": None}, "reference": None, "executors": {}}
    # EXIT_NOTHING_ASSIGNED: every executor failed the op (the compiler JSON assigns nothing): still judged
    if rc is None or rc not in (0, EXIT_NOTHING_ASSIGNED) or not reports_in(d / "out"):
        # the product, not an executor, stopped the test: no executor's outputs to judge
        status, reason = ("timeout", "test timeout") if rc is None else ("refused", "refused")
        msg = (f"the test's discovery timed out after {settings.timeout_s:g} s" if rc is None else
               refusal_message(stdout, stderr) if rc != 0 else "discover exited 0 but wrote no report")
        rec["discover"] = {"status": status, "exit_status": rc, "message": msg}
        rec["executors"] = {e["name"]: not_judged(reason, msg) for e in executors}
    else:
        try:
            disc = read_discovery(d / "out")
            out_layers, missing = disc.output_layers([o.name for o in case.model.graph.output])
            rec["reference"], loaded = reference_check(disc, case, out_layers, missing)
            for e in executors:
                rec["executors"][e["name"]] = executor_outcome(disc, case, e, out_layers, missing, loaded,
                                                               d / "rerun", settings.timeout_s / 2)
        except Exception as e:  # a file the product did not write, or a bug here: said, not hidden
            msg = f"reading the discovery failed: {type(e).__name__}: {first_line(str(e))}"
            rec["executors"] = {x["name"]: not_judged("evaluate", msg) for x in executors}
    if _stopping.is_set():
        return None
    write_json(d / RESULT_FILE, rec)
    return rec


def _on_signal(signum, frame):  # noqa: ARG001
    raise Interrupted(signum)


def run(settings: Settings, selection: node_cases.Selection, *, stream=None) -> dict:
    """Run (or resume) the conformance tests of ``selection`` and write the matrix files.

    Returns:
        The matrix document (``conformance.json``).

    Raises:
        run_lock.RunLocked: another conformance run uses the output directory.
        ConfigError: the output directory cannot be created.
        Interrupted: Ctrl-C or SIGTERM; the tests finished so far are kept.
    """
    out = settings.out
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create the output directory {out}: {e.strerror or e}") from None
    lock = out / lock_file("conformance")
    run_lock.acquire(lock, what=f"the conformance output directory {out}")
    old_term = signal.signal(signal.SIGTERM, _on_signal) if threading.current_thread() is threading.main_thread() \
        else None
    _stopping.clear()
    try:
        return _run_locked(settings, selection, stream or sys.stderr)
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        run_lock.release(lock)


def _run_locked(settings: Settings, selection: node_cases.Selection, stream) -> dict:
    t0 = time.perf_counter()
    vers = versions()
    records: dict[str, dict] = {}
    todo = []
    for case in selection.cases:
        digest = node_cases.case_digest(case)
        fp = fingerprint(digest, settings, vers)
        rec = None if settings.rerun else current_record(settings.out / "tests" / case.name / RESULT_FILE, fp,
                                                         settings.timeout_s)
        if rec is not None:
            records[case.name] = rec
        else:
            todo.append((case, fp, digest))
    env = discover_env()
    progress = TestProgress(len(todo), len(records), quiet=settings.quiet, stream=stream)
    with progress, cf.ThreadPoolExecutor(max_workers=max(1, settings.jobs)) as pool:
        futures = {pool.submit(run_test, case, settings, fp, digest, env): case for case, fp, digest in todo}
        try:
            for f in cf.as_completed(futures):
                rec = f.result()
                if rec is not None:
                    records[rec["test"]] = rec
                    progress.done(rec)
        except BaseException:
            _stopping.set()
            for f in futures:
                f.cancel()
            kill_all_tools()  # the running discoveries and the layers being run again
            raise
    doc = write_outputs(settings, selection, [records[c.name] for c in selection.cases if c.name in records], vers,
                        seconds=time.perf_counter() - t0, ran=len(todo))
    return doc


def write_outputs(settings: Settings, selection: node_cases.Selection, records: list[dict], vers: dict, *,
                  seconds: float, ran: int) -> dict:
    """Write ``conformance.json`` (the matrix), ``conformance.md``, ``conformance.html`` and
    ``conformance_verdicts.json`` (every test's record) into the output directory."""
    names = [e["name"] for e in settings.executors]
    agg = aggregate(records, names)
    comparisons = [compare_expected(records, ex, listed, src) for ex, src, listed in settings.expected]
    doc = {"schema": MATRIX_SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "versions": vers,
           "executors": names, "skipped_executors": sorted(set(settings.config.get("skip_executors") or [])),
           "config_file": settings.config_file, "timeout_s": settings.timeout_s,
           "selection": {"ops": selection.ops, "match": selection.match, "sample": selection.sample,
                         "seed": selection.seed,
                         "collected": selection.collected, "expanded": selection.expanded,
                         "non_tensor_io": selection.non_tensor_io, "considered": selection.considered,
                         "selected": len(selection.cases)},
           "run": {"tests_run": ran, "tests_current": len(records) - ran, "seconds": round(seconds, 1),
                   "jobs": settings.jobs},
           "summary": agg["summary"], "ops": agg["ops"], "expected_failures": comparisons}
    out = settings.out
    write_json(out / MATRIX_FILE, doc)
    marked = mark_records(records, comparisons, [listed for _, _, listed in settings.expected])
    write_json(out / VERDICTS_FILE, {"schema": VERDICTS_SCHEMA, "executors": names, "tests": marked})
    atomic_write_text(out / MARKDOWN_FILE, markdown(doc))
    atomic_write_text(out / HTML_FILE, html_page(doc))
    return doc
