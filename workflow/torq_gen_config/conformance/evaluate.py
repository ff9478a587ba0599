"""One finished discovery of a node test, judged against the test's expected outputs: the
layer reference (does the product's reference agree with ONNX?) and, per executor, the
outcome (``passed``, ``differing``, ``failed`` with its stage, or ``not judged`` with the
reason) next to the product's verdict."""

from __future__ import annotations

from pathlib import Path

from .. import backends
from ..backends.base import StageError
from ..core.layout import LAYER_REFERENCE_FILE, MLIR_FILE, MODEL_FILE
from ..core.lazy import onnx
from ..mlir.importer import import_layer
from ..reference import judged_reference, load_reference
from .cases import expected_of, inputs_of, tolerances
from .discovery import Discovery, first_line, rerun_executor, tidy
from .expected import close_to_expected, same_values

#: outcomes of (test, executor): the executor's outputs against the test's expected outputs;
#: ``not judged`` when the executor's outputs could not be had for a reason that is not the
#: executor's (the discovery refused the test, ...)
PASSED, DIFFERING, FAILED, NOT_JUDGED = "passed", "differing", "failed", "not judged"


def not_judged(reason: str, message: str | None, verdict: str | None = None, **extra) -> dict:
    """The outcome of an executor whose outputs could not be judged (``stage`` = the reason)."""
    return {"outcome": NOT_JUDGED, "stage": reason, "verdict": verdict, "message": message, **extra}


def reference_check(disc: Discovery, case, out_layers: list[dict], missing: list[str]) -> tuple[dict, dict]:
    """The layer references of the layers that write the model outputs against the test's
    expected outputs (with its rtol/atol).

    Returns:
        ``({"status": match | mismatch | no layer | not testable | no reference |
        reference failed | inputs differ, "message", "second_engine_mismatch": [output
        names where the second opinion differs from the expected], "reference_dispute"},
        {layer ID: load_reference(...) of the layers read})``.
    """
    expected, test_inputs = expected_of(case), inputs_of(case)
    rtol, atol = tolerances(case)
    check = {"status": "match", "message": None, "second_engine_mismatch": [], "reference_dispute": False}
    loaded: dict = {}
    if missing:
        check.update(status="no layer", message=f"no layer writes the model output(s) {missing}")
        return check, loaded
    for L in out_layers:
        op = disc.ops.get(L["layer_id"]) or {}
        if op.get("not_testable_reason"):
            check.update(status="not testable", message=first_line(op["not_testable_reason"]))
            break
        ref = disc.layers_dir / L["slug"] / LAYER_REFERENCE_FILE
        if not ref.is_file():
            check.update(status="no reference", message=f"{L['layer_id']}: no {LAYER_REFERENCE_FILE}")
            break
        ins, outs, meta = loaded[L["layer_id"]] = load_reference(ref)
        if meta.get("status") != "ok":
            check.update(status="reference failed", message=first_line(meta.get("message") or ""))
            break
        outs = judged_reference(meta, outs)[1]  # what the verdicts rest on (the spec in float64 in a dispute)
        bad_in = [k for k, v in ins.items() if k in test_inputs and not same_values(v, test_inputs[k])]
        if bad_in:
            check.update(status="inputs differ", message=f"{L['layer_id']}: stored layer input(s) {bad_in} are not "
                                                         f"the test's values (layer_inputs: {meta.get('layer_inputs')})")
            break
        for n in [o["name"] for o in L["outputs"] if o["name"] in expected]:
            why = close_to_expected(outs[n], expected[n], rtol, atol) if n in outs else "no reference output"
            if why:
                check.update(status="mismatch", message=f"output {n!r}: {why}")
                break
        sec = meta.get("second_outputs") or {}  # the second opinion: does the other engine match the spec?
        bad = [n for n in sec if n in expected and close_to_expected(sec[n], expected[n], rtol, atol)]
        check["second_engine_mismatch"] += bad
        if check["status"] == "mismatch" and sec:
            check["message"] += (f" [second opinion ({(meta.get('second') or {}).get('engine')}) "
                                 f"{'differs too' if bad else 'matches the expected outputs'}]")
        if (op.get("reference") or {}).get("dispute"):
            check["reference_dispute"] = True
        if check["status"] != "match":
            break
    return check, loaded


def executor_outcome(disc: Discovery, case, executor: dict, out_layers: list[dict], missing: list[str],
                     loaded: dict, work: Path, timeout_s: float) -> dict:
    """One executor on one test: ``{"outcome", "stage", "verdict", "message"}``. The verdict
    is the product's (against its reference; for several layers the worst); the outcome
    comes from the executor's outputs, obtained by running the compiled layer again, against
    the test's expected outputs with the test's rtol/atol. ``failed`` carries the verdict's
    failure stage (``import``, ``compile``, ``run``, ``timeout``, ``crash``, ...); ``not
    judged`` the reason the executor's outputs are unknown through no fault of its own:
    ``not testable``, ``unavailable`` (its device is
    missing), ``skipped`` (skip mode), ``missing`` (no verdict file) or ``rerun`` (running it
    again failed, so its outputs are unknown). A node folded to a constant (no layer) is
    judged on the test's own model (:func:`unfolded_outcome`)."""
    name = executor["name"]
    if missing or not out_layers:  # folded to a constant: the executor runs the test's own model
        return unfolded_outcome(executor, case, work / "unfolded" / name, timeout_s)
    unavailable = {u.get("name"): u for u in disc.report.get("unavailable_executors") or []
                   if isinstance(u, dict)}
    if name in unavailable:
        return not_judged("unavailable", first_line(str(unavailable[name].get("reason") or unavailable[name])))
    verdicts = []
    for L in out_layers:
        op = disc.ops.get(L["layer_id"]) or {}
        if op.get("not_testable_reason"):
            return not_judged("not testable", first_line(op["not_testable_reason"]), "not testable")
        r = disc.result(L, name)
        if r is None:
            return not_judged("missing", f"{L['layer_id']}: no verdict")
        fr = r.get("failure_report") or {}
        if r["status"] == "skipped":
            return not_judged("skipped", first_line(str(r.get("skipped_because") or "")), "skipped")
        if r["status"] == "error":
            return {"outcome": FAILED, "stage": fr.get("stage") or "error", "verdict": "error",
                    "message": tidy(first_line(fr.get("summary") or fr.get("message") or ""))}
        verdicts.append((r["status"], fr.get("summary"), L))
    statuses = [v[0] for v in verdicts]
    verdict = next((s for s in ("unverified", "difference") if s in statuses), "success")
    summary = next((tidy(first_line(s)) for st, s, _ in verdicts if st != "success" and s), None)
    expected = expected_of(case)
    rtol, atol = tolerances(case)
    try:
        for _, _, L in verdicts:
            ins, _, meta = loaded.get(L["layer_id"]) or load_reference(disc.layers_dir / L["slug"] / LAYER_REFERENCE_FILE)
            got = rerun_executor(executor, disc.layers_dir / L["slug"], name, ins, meta,
                                 work / L["slug"] / name, timeout_s)
            for n in [n for n in meta["output_names"] if n in expected]:
                why = close_to_expected(got[n], expected[n], rtol, atol) if n in got else "no output"
                if why:
                    return {"outcome": DIFFERING, "stage": None, "verdict": verdict, "message": f"output {n!r}: {why}",
                            "verdict_message": summary}
    except Exception as e:  # running it again failed: the outputs are unknown
        return not_judged("rerun", f"{type(e).__name__}: {first_line(str(e))}", verdict, verdict_message=summary)
    return {"outcome": PASSED, "stage": None, "verdict": verdict, "message": None, "verdict_message": summary}


def unfolded_outcome(executor: dict, case, work: Path, timeout_s: float) -> dict:
    """The outcome of ``executor`` on a test whose node the product folds to a constant (no
    layer writes its outputs, so no discovery runs an executor on it; issue 42: ONNX
    Runtime fails ``OptionalHasElement`` without an input, which a "not judged" hid): the
    test's own model, imported as a layer is (MLIR backends) and compiled and run by the
    product's backend on the test's inputs, against its expected outputs. ``verdict`` is
    None (the product gave none) and ``unfolded`` True; a stage failure is ``failed`` at
    that stage (``import``, ``session``, ``compile``, ``run``, ...)."""
    work.mkdir(parents=True, exist_ok=True)
    model_path = work / MODEL_FILE
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    model.graph.name = "main"  # the function name the backends run, as for a layer model
    onnx.save(model, str(model_path))
    inputs, expected = inputs_of(case), expected_of(case)
    rtol, atol = tolerances(case)
    base = {"verdict": None, "unfolded": True}
    try:
        backend = backends.make_backend(executor)
    except Exception as e:  # noqa: BLE001 - its device or tool is missing here
        return not_judged("unavailable", f"{type(e).__name__}: {first_line(str(e))}", **base)
    mlir = None
    if backend.needs_mlir:
        mlir = work / MLIR_FILE
        st = import_layer(model_path, mlir)
        if st["status"] != "ok":
            return {"outcome": FAILED, "stage": "import", "message": tidy(first_line(st["message"] or "")), **base}
    try:
        _, outs, _ = backend.compile_and_run(onnx_path=str(model_path), mlir_path=str(mlir) if mlir else None,
                                             inputs=inputs, input_names=list(inputs),
                                             output_names=[o.name for o in case.model.graph.output],
                                             work_dir=str(work), timeout_s=timeout_s, log_path=None)
    except StageError as e:
        return {"outcome": FAILED, "stage": e.stage, "message": tidy(first_line(e.message)), **base}
    except Exception as e:  # noqa: BLE001 - a backend bug: said, not hidden
        return not_judged("rerun", f"{type(e).__name__}: {first_line(str(e))}", **base)
    for n, want in expected.items():
        why = close_to_expected(outs[n], want, rtol, atol) if n in outs else "no output"
        if why:
            return {"outcome": DIFFERING, "stage": None, "message": f"output {n!r}: {why}", **base}
    return {"outcome": PASSED, "stage": None, "message": None, **base}
