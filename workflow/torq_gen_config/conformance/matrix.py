"""The op type x executor support matrix from the per-test records, and the comparison of
one executor's outcomes with a backend's own expected-failure list (IREE's iree-test-suites
``onnx_ops/config_*.json``: ``expected_compile_failures``, ``expected_run_failures``)."""

from __future__ import annotations

import collections
import json
from pathlib import Path

from ..core.errors import ConfigError
from .evaluate import DIFFERING, FAILED, NOT_JUDGED, PASSED

#: schema identifiers of the files the conformance command writes
TEST_SCHEMA = "torq-gen-config/conformance-test/1"
MATRIX_SCHEMA = "torq-gen-config/conformance/1"
VERDICTS_SCHEMA = "torq-gen-config/conformance-verdicts/1"
#: a test the expected-failure list says fails but passes here, and the reverse
UNEXPECTED_PASS, UNEXPECTED_FAILURE = "unexpected pass", "unexpected failure"


def _cell() -> dict:
    return {"tests": 0, PASSED: 0, DIFFERING: 0, FAILED: 0, NOT_JUDGED: 0, "stages": {}, "not_judged_reasons": {},
            "verdicts": {}, "first_error": None, "failing_tests": [], "not_judged_tests": []}


def judged(cell: dict) -> int:
    """The tests of a cell whose outputs were judged (passed, differing or failed)."""
    return cell["tests"] - cell[NOT_JUDGED]


def _count(d: dict, key) -> None:
    key = "none" if key is None else str(key)
    d[key] = d.get(key, 0) + 1


def aggregate(records: list[dict], executors: list[str]) -> dict:
    """Per op type (the test's node) and executor: tests, passed / differing / failed / not
    judged, the failures by stage, the not judged by reason, the product's verdicts, the
    failing and the not-judged tests and the first error (of the first differing or failing
    test by name); per op type the opset range and the reference checks.

    Returns:
        ``{"ops": {op type: {...}}, "summary": {"tests", "executors": {name: cell without
        the test lists}, "reference": {status: count}}}``.
    """
    ops: dict[str, dict] = {}
    totals = {name: _cell() for name in executors}
    reference: dict[str, int] = {}
    for rec in sorted(records, key=lambda r: r["test"]):
        row = ops.setdefault(rec["op_type"], {"tests": 0, "domain": rec.get("domain") or "", "opsets": None,
                                              "reference": {}, "executors": {n: _cell() for n in executors}})
        row["tests"] += 1
        if rec.get("opset") is not None:
            lo, hi = row["opsets"] or (rec["opset"], rec["opset"])
            row["opsets"] = [min(lo, rec["opset"]), max(hi, rec["opset"])]
        _count(row["reference"], (rec.get("reference") or {}).get("status"))
        _count(reference, (rec.get("reference") or {}).get("status"))
        for name in executors:
            res = (rec.get("executors") or {}).get(name)
            if res is None:
                continue
            for cell in (row["executors"][name], totals[name]):
                cell["tests"] += 1
                cell[res["outcome"]] += 1
                _count(cell["verdicts"], res.get("verdict"))
                if res["outcome"] == FAILED:
                    _count(cell["stages"], res.get("stage"))
                if res["outcome"] == NOT_JUDGED:
                    _count(cell["not_judged_reasons"], res.get("stage"))
                    cell["not_judged_tests"].append(rec["test"])
                elif res["outcome"] != PASSED:
                    cell["failing_tests"].append(rec["test"])
                    if cell["first_error"] is None:
                        cell["first_error"] = {"test": rec["test"], "outcome": res["outcome"],
                                               "stage": res.get("stage"), "message": res.get("message")}
    for cell in totals.values():
        del cell["failing_tests"], cell["first_error"], cell["not_judged_tests"]
    return {"ops": dict(sorted(ops.items(), key=lambda kv: kv[0].lower())),
            "summary": {"tests": len(records), "executors": totals, "reference": reference}}


def load_expected_failures(path: str | Path) -> dict[str, str]:
    """The tests an expected-failure file lists: test name -> ``compile``, ``run`` or
    ``listed``. Accepted: a JSON object with ``expected_compile_failures`` and/or
    ``expected_run_failures`` (IREE's iree-test-suites ``config_*.json``; entries such as
    ``onnx/node/generated/test_abs`` are read as ``test_abs``), a JSON list of names, or a
    text file with one name a line (``#`` comments).

    Raises:
        ConfigError: the file is missing or holds none of these.
    """
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"--expected-failures {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--expected-failures {path} is not a text file") from None
    try:
        data = json.loads(text)
    except ValueError:
        data = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
        if text.lstrip().startswith(("{", "[")):
            raise ConfigError(f"--expected-failures {path} is not valid JSON") from None
    listed: dict[str, str] = {}
    if isinstance(data, dict):
        keys = [("expected_compile_failures", "compile"), ("expected_run_failures", "run")]
        if not any(k in data for k, _ in keys):
            raise ConfigError(f"--expected-failures {path}: a JSON object needs expected_compile_failures or "
                              f"expected_run_failures (it has {', '.join(sorted(data)) or 'no keys'})")
        for key, kind in keys:
            entries = data.get(key) or []
            if not isinstance(entries, list):
                raise ConfigError(f"--expected-failures {path}: {key} is not a list")
            for e in entries:
                listed.setdefault(str(e).rstrip("/").rsplit("/", 1)[-1], kind)
    elif isinstance(data, list):
        for e in data:
            if str(e).strip():
                listed.setdefault(str(e).strip().rstrip("/").rsplit("/", 1)[-1], "listed")
    else:
        raise ConfigError(f"--expected-failures {path}: expected a JSON object or list, or one name a line")
    return listed


def compare_expected(records: list[dict], executor: str, listed: dict[str, str], source: str) -> dict:
    """``executor``'s outcomes against an expected-failure list (:func:`load_expected_failures`).
    A test fails here when its outcome is ``differing`` or ``failed``; a ``not judged`` one is
    neither a pass nor a failure (listed apart).

    Returns:
        ``{"executor", "file", "listed", "listed_not_run", "expected_failures",
        "unexpected_passes": [{"test", "listed_as"}], "unexpected_failures": [{"test",
        "outcome", "stage", "message"}], "stage_differs": [{"test", "listed_as", "outcome",
        "stage"}], "not_judged": [{"test", "listed_as", "stage"}]}`` (stage_differs: a compile
        failure listed as a run failure, or the reverse).
    """
    run = {r["test"]: (r.get("executors") or {}).get(executor) for r in records}
    run = {t: res for t, res in run.items() if res is not None}
    out = {"executor": executor, "file": source, "listed": len(listed),
           "listed_not_run": sum(1 for t in listed if t not in run), "expected_failures": 0,
           "unexpected_passes": [], "unexpected_failures": [], "stage_differs": [], "not_judged": []}
    for test, res in sorted(run.items()):
        kind = listed.get(test)
        if res["outcome"] == NOT_JUDGED:
            out["not_judged"].append({"test": test, "listed_as": kind, "stage": res.get("stage")})
        elif kind and res["outcome"] == PASSED:
            out["unexpected_passes"].append({"test": test, "listed_as": kind})
        elif not kind and res["outcome"] != PASSED:
            out["unexpected_failures"].append({"test": test, "outcome": res["outcome"], "stage": res.get("stage"),
                                               "message": res.get("message")})
        elif kind:
            out["expected_failures"] += 1
            here = "compile" if res.get("stage") in ("import", "compile", "session") else "run"
            if kind in ("compile", "run") and here != kind:
                out["stage_differs"].append({"test": test, "listed_as": kind, "outcome": res["outcome"],
                                             "stage": res.get("stage")})
    return out


def mark_records(records: list[dict], comparisons: list[dict], listed: list[dict[str, str]]) -> list[dict]:
    """The records with ``expected_failure`` (what the list says) and ``mark`` (unexpected pass /
    failure) on the compared executors' results (copies; the per-test files stay as they are)."""
    marks = {}
    for comp, names in zip(comparisons, listed):
        for e in comp["unexpected_passes"]:
            marks[(e["test"], comp["executor"])] = UNEXPECTED_PASS
        for e in comp["unexpected_failures"]:
            marks[(e["test"], comp["executor"])] = UNEXPECTED_FAILURE
    out = []
    for rec in records:
        rec = json.loads(json.dumps(rec))
        for comp, names in zip(comparisons, listed):
            res = (rec.get("executors") or {}).get(comp["executor"])
            if res is not None:
                res["expected_failure"] = names.get(rec["test"])
                res["mark"] = marks.get((rec["test"], comp["executor"]))
        out.append(rec)
    return out


def outcome_counts(records: list[dict]) -> dict[str, collections.Counter]:
    """Per executor, the count of each outcome (for the final line)."""
    counts: dict[str, collections.Counter] = {}
    for rec in records:
        for name, res in (rec.get("executors") or {}).items():
            counts.setdefault(name, collections.Counter())[res["outcome"]] += 1
    return counts
