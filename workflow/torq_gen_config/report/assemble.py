"""The discovery report assembled from a run's work files: the layers of the split, the
(layer, executor) verdicts, the user's choices, the precision section and the run's
provenance (rule ``aggregate_report``; :mod:`torq_gen_config.report.publish` writes it)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .. import __version__
from ..backends import capabilities
from ..compare.metrics import share_threshold_grids
from ..config import PRECISION_KEYS
from ..core.errors import ReportError
from ..core.fileio import damaged_work_file, read_json
from ..core.layout import LAYER_REFERENCE_FILE, layer_result_file
from ..core.lazy import metadata, platform
from ..mlir.importer import IMPORTER_PACKAGE, layer_location
from ..model.tested_layers import DUPLICATE, NOT_TESTABLE, SKIP_OPS, TEST, plan_layer_tests
from .build import build_op, check_report_settings, finish_report
from .staleness import model_digest
from .text import render_final_report_text

__all__ = ["assemble_report", "build_provenance", "precision_section"]


def assemble_report(*, model_name: str, manifest: str, prepare_info: str, locations: str, results_root: str,
                    executors: list[dict], tolerance: dict, options: dict, output_dir: str,
                    skip_ops: list[str] = (), dedup_layers: bool = False, user_choices: str | None = None,
                    recommend_by_timing: bool = False, quantized_manifest: str | None = None,
                    quantize_info: str | None = None, unavailable: list[dict] = (),
                    parameters: dict | None = None) -> dict:
    """The discovery report (dict) from the work files of a run: the layer manifest
    (``manifest``), the preparation info, the MLIR locations, the (layer, executor)
    verdicts under ``results_root`` and the user's choices; paths in the report are
    relative to ``output_dir``. Writes nothing (rule ``aggregate_report`` publishes it).

    Statuses are re-derived from the stored metrics with the current ``tolerance``,
    so a tolerance change needs no recompile. With ``dedup_layers``, a layer whose
    signature was seen before copies the verdicts of that first layer and is marked
    ``duplicate_of`` in the report. ``recommend_by_timing`` recommends the fastest
    success (else the fastest difference) by measured runtime median, falling back
    to priority order where no runtime was measured (see
    :func:`~torq_gen_config.report.recommend.recommend_with_reason`).

    With ``--quantize``, ``quantized_manifest`` (the layers mapped onto the quantized
    model, whose MLIR ``locations`` describes) gives each layer its ``line:col``; a
    layer fused away in the quantized model has none (so it is left out of the
    compiler JSON) and a note says why; ``quantize_info`` (the whole model's
    quantization) goes into the report's ``precision`` section with the flags and
    the bf16/int32 conversion reports of the preparation.

    ``unavailable`` (``[{"name", "backend", "reason"}]``): the configured executors this
    machine cannot run (no device or execution provider), which got no layer jobs; the
    report names each once (``unavailable_executors`` and a line of the text).

    ``parameters``: the resolved weights mode (:func:`torq_gen_config.backends.parameters.resolve`),
    recorded as ``provenance.parameters`` and said in the text (docs/parameters.md).
    """
    man = read_json(manifest, "layer manifest")
    info = read_json(prepare_info, "preparation info")
    locs = read_json(locations, "MLIR locations")
    plan = plan_layer_tests(man["layers"], skip_ops, dedup_layers)
    qlayers = {}
    if quantized_manifest:
        qlayers = {l["layer_id"]: l for l in read_json(quantized_manifest, "quantized layer map")["layers"]}
    names, default_tol = check_report_settings(executors, tolerance)
    prev_ops = ((read_json(user_choices, "user choices") if user_choices and Path(user_choices).exists() else None)
                or {}).get("ops") or {}
    # One layer's results at a time: read, turned into its op (sharing the result's dicts),
    # dropped; only the layers whose verdicts duplicates copy keep theirs. The report's ops
    # are then the one copy of the results in memory (docs/scale.md, "The report").
    sources = {src for d, src in plan.values() if d == DUPLICATE}
    kept: dict[str, dict] = {}
    ops: dict[str, dict] = {}
    ort_versions: set[str] = set()
    tools: dict[str, dict] = {}
    tested = 0
    for layer in man["layers"]:
        lid = layer["layer_id"]
        if lid in ops:
            raise ReportError(f"build_report: duplicate layer id {lid!r}")
        decision, src = plan[lid]
        skipped = decision == SKIP_OPS
        row = {
            "layer_id": lid, "slug": layer["slug"], "op_type": layer["op_type"],
            "node_index": layer["node_index"],
            "mlir_location": layer_location(qlayers.get(lid, layer) if quantized_manifest else layer, locs),
            "mac_count": layer.get("mac_count"),
            "skipped_reason": f"op type {layer['op_type']} skipped (skip_ops)" if skipped else None,
            "not_testable": None if skipped else layer.get("not_testable"),
        }
        per: dict[str, dict] = {}
        if decision == DUPLICATE:
            per = kept[src]
        elif decision not in (SKIP_OPS, NOT_TESTABLE):
            for name in names:
                p = Path(layer_result_file(results_root, layer["slug"], name))
                if p.exists():
                    per[name] = _read_result(p)
                    if per[name].get("outputs_file"):  # kept beside the result: named from the report's folder
                        per[name]["outputs_file"] = os.path.relpath(p.parent / per[name]["outputs_file"], output_dir)
            _add_engines_agreement(per, Path(results_root) / layer["slug"] / LAYER_REFERENCE_FILE)
            for name, r in per.items():
                version = (r.get("reference") or {}).get("ort_version")
                if version:
                    ort_versions.add(version)
                if name not in tools and r.get("tool"):
                    tools[name] = r["tool"]
            if lid in sources:
                kept[lid] = per
            tested += bool(per)
        # a source's results serve its duplicates too: their ops get copies (the
        # re-derivation updates an op's reference_check with that op's tolerance)
        ops[lid] = build_op(row, per, names, default_tol, prev_ops.get(lid), recommend_by_timing=recommend_by_timing,
                            copy_results=lid in sources or decision == DUPLICATE)
        if decision == DUPLICATE:
            ops[lid]["duplicate_of"] = src
    del kept
    mlir_file = os.path.relpath(Path(locations).parent / locs["mlir_file"], output_dir) if locs.get("status") == "ok" else None
    provenance = build_provenance(info=info, locations=locs, executors=executors, options=options,
                                  tool_version=__version__, ort_versions=sorted(ort_versions), executor_tools=tools)
    if parameters:  # weights inline or as IREE parameters, and why
        provenance["parameters"] = dict(parameters)
    if man.get("layer_inputs"):  # the whole-model run that gave the layers their inputs
        provenance["layer_inputs_run"] = man["layer_inputs"]
    rep = finish_report(model_name=model_name, ops=ops, names=names, default_tolerance=default_tol,
                        mlir_file=mlir_file, provenance=provenance, recommend_by_timing=recommend_by_timing)
    rep["precision"] = precision_section(options, info, quantize_info, Path(results_root))
    rep["folded_nodes"] = man.get("folded_nodes") or []  # constant nodes: values of the layers, not layers
    for layer in man["layers"]:
        q = qlayers.get(layer["layer_id"])
        if q is not None:
            op = rep["ops"][layer["layer_id"]]
            op["quantized_op_type"] = q.get("quantized_op_type")
            if q.get("quantized_note"):
                op["note"] = q["quantized_note"]
    if info.get("subgraph"):  # subgraph mode: the range, in the user's model, and where its files are
        rep["subgraph"] = {**info["subgraph"],
                           "work_dir": os.path.relpath(Path(prepare_info).parent, output_dir).replace(os.sep, "/")}
    rep["discovery_report"]["summary"]["distinct_layers_tested"] = (
        sum(1 for d, _ in plan.values() if d == TEST) if dedup_layers else tested)
    rep["unavailable_executors"] = [dict(u) for u in unavailable]
    if sources or rep["folded_nodes"] or unavailable:  # the text shows copied verdicts, folded nodes
        # and unavailable executors
        rep["final_report_text"] = render_final_report_text(rep)
    return rep


def precision_section(options: dict, prepare_info: dict, quantize_info: str | None, layers_dir: Path) -> dict:
    """The report's ``precision`` section: the flags discovery used (``run`` checks
    them, docs/precision.md), the bf16/int32 conversion reports (per narrowed
    constant: values, max_abs_error, mean_abs_error, rmse, max_rel_error; clamped
    INT64_MIN/MAX sentinels), and with ``--quantize`` the whole model's quantization
    info and the layers that needed Q/DQ pairs on their I/O."""
    section: dict = {"flags": {k: options.get(k) for k in PRECISION_KEYS}}
    conv = prepare_info.get("precision") or {}
    if "bf16" in conv:
        section["bf16_conversion"] = conv["bf16"]
    if "int32" in conv:
        section["int32_conversion"] = conv["int32"]
    if quantize_info:
        section["quantization"] = read_json(quantize_info, "quantization info")
        wrapped, failed = [], {}
        for p in sorted(layers_dir.glob("*/quantize.json")):
            q = read_json(str(p), "layer quantization info")
            if q.get("wrapped_io"):
                wrapped.append(p.parent.name)
            if q.get("status") == "error":
                failed[p.parent.name] = q.get("message")
        section["layers_with_wrapped_io"] = wrapped
        section["layers_not_quantized"] = failed
    return section


def build_provenance(*, info: dict, locations: dict, executors: list[dict], options: dict, tool_version: str,
                     ort_versions: list[str], executor_tools: dict[str, dict]) -> dict:
    """Versions, options and inputs that produced a report (JSON-safe): ``ort_versions``
    are the ONNX Runtime versions the layers' references were computed with,
    ``executor_tools`` each executor's tool record (the first of its results)."""
    versions = {"torq-gen-config": tool_version, "python": platform.python_version()}
    for mod in ("onnx", "onnxruntime", "numpy", "snakemake"):
        versions[mod] = _module_version(mod)
    # the importer's and the configured backends' own packages (Backend.packages)
    packages = [IMPORTER_PACKAGE, *(p for e in executors for p in capabilities(e.get("backend")).packages)]
    for dist in dict.fromkeys(packages):
        versions.setdefault(dist, _dist_version(dist))
    return {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": versions,
        "reference": {"engine": options.get("reference") or "onnxruntime",
                      "second_opinion": "onnx" if (options.get("reference") or "onnxruntime") == "onnxruntime"
                      else "onnxruntime",
                      "execution_provider": "CPUExecutionProvider",
                      "graph_optimization_level": "disabled", "ort_versions": list(ort_versions),
                      "onnx_version": versions.get("onnx")},
        "executors": executors,
        "executor_tools": dict(executor_tools),
        "options": options,
        "model": {"source": info.get("source"), "sha256": _model_digest(info.get("source")),
                  "opset": info.get("opset"), "fixed_dims": info.get("fixed_dims"),
                  "warnings": info.get("warnings"), "shapes": info.get("shapes"),
                  "model_inputs": info.get("model_inputs"), "model_run": info.get("model_run")},
        "mlir": {"status": locations.get("status"), "message": locations.get("message"),
                 "unverified_nodes": locations.get("n_unverified")},
    }


def _model_digest(path: str | None) -> str | None:
    return model_digest(path) if path else None


def _module_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except Exception:
        return None


_dist_version = _module_version


def _add_engines_agreement(results: dict, reference: Path) -> None:
    """Put the layer's ``engines_agreement`` (the two reference engines' metrics, recorded
    once per layer in its ``reference.json``) and ``arbiter`` (the spec in float64 where
    they disagree) into each result's ``reference`` that lacks them (in memory; the report's dispute is derived from it). An unreadable record gives
    None: no dispute can be derived, the report says nothing of one."""
    refs = [r["reference"] for r in results.values() if isinstance(r.get("reference"), dict)
            and "engines_agreement" not in r["reference"]]
    if not refs:
        return
    try:
        record = json.loads(reference.read_text(encoding="utf-8"))
        agreement, arbiter = record.get("engines_agreement"), record.get("arbiter")
    except (OSError, ValueError, AttributeError):
        agreement, arbiter = None, None
    for ref in refs:
        ref["engines_agreement"] = agreement
        if arbiter:
            ref["arbiter"] = arbiter


def _read_result(path: Path) -> dict:
    """One (layer, executor) ``result.json``. A damaged one (cut short, not JSON, not an
    object: the results are written atomically, so only something outside the workflow
    does that) is removed, so that the next run redoes that one test.

    Raises:
        ReportError: the file is damaged (it was removed; the message says so).
    """
    try:
        result = read_json(path, "layer result")
        if not isinstance(result, dict):
            raise ReportError(f"layer result {path} is not a JSON object")
    except ReportError as e:
        raise ReportError(str(damaged_work_file(path, e, redo="redo that test"))) from None
    share_threshold_grids(result.get("metrics"))
    check = result.get("reference_check")
    share_threshold_grids(check.get("metrics") if isinstance(check, dict) else None)
    return result
