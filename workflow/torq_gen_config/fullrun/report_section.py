"""The report's ``full_model`` section and its part of ``final_report_text``."""

from __future__ import annotations

import os
from typing import Mapping

from ..backends import capabilities
from ..compare import count_over_tolerance, derive_status, engine_widened_tolerances, normalize_tolerance
from .common import MODULE_MODE, NOT_AS_ASSIGNED, PARTITIONS_MODE, TWO_BACKENDS_NOTE, _layer_span, not_as_assigned_summary
from .execute import full_summary, widened_record
from .selection import _executor_name

#: Marker of the full-model part of ``final_report_text``.
TEXT_MARKER = "--- Full Model Comparison ---"


def full_model_section(result: Mapping, *, tolerance: Mapping, result_file: str | None = None) -> dict:
    """The report's ``full_model`` section, with the verdict re-derived from the
    metrics with ``tolerance`` (the report's ``default_tolerance``), each float output's
    widened to what ONNX Runtime with all optimizations needs as the run does
    (:func:`~torq_gen_config.fullrun.execute._compare_and_finish`: ``tolerance_widened``,
    ``difference_partition``)."""
    tol = normalize_tolerance(tolerance)
    mode = result.get("mode") or PARTITIONS_MODE
    status, summary = result.get("status"), result.get("summary")
    count, share = result.get("num_over_tolerance"), result.get("share_over_tolerance")
    widened_rec, carrier = result.get("tolerance_widened"), result.get("difference_partition")
    if result.get("metrics") and status in ("success", "difference", NOT_AS_ASSIGNED):
        ref = result.get("reference") or {}
        opt = (ref.get("optimized") or {}).get("metrics") if ref.get("used", ref.get("engine")) == ref.get("engine") \
            else None
        widened = engine_widened_tolerances(tol, opt)
        status, summary = derive_status(result["metrics"], tol, widened)
        count, share = count_over_tolerance(result["metrics"], tol, widened)
        widened_rec = widened_record(tol, widened, opt)
        summary, carrier = full_summary(status, summary, result.get("partitions") or [], widened_rec)
        fallback = ref.get("fallback")
        if fallback:  # judged against the spec: the summary says so, as the result's does
            summary = f"{summary} ({fallback})"
        away = not_as_assigned_summary((result.get("module") or {}).get("placement")) if mode == MODULE_MODE else None
        if status == "success" and away:  # the outputs match, the program is not the assignment
            status, summary = NOT_AS_ASSIGNED, away
    execs: dict[str, int] = {}
    for ex in (result.get("layer_executors") or {}).values():
        execs[ex] = execs.get(ex, 0) + 1
    parts: dict[str, int] = {}
    for p in result.get("partitions") or []:
        parts[p["executor"]] = parts.get(p["executor"], 0) + 1
    return {
        "status": status,
        "summary": summary,
        "mode": mode,
        "tolerance_used": tol,
        "tolerance_widened": widened_rec,
        "difference_partition": carrier,
        "metrics": result.get("metrics"),
        "num_over_tolerance": count,
        "share_over_tolerance": share,
        "failure": result.get("failure"),
        "assignment": {"source": result.get("source"), "source_file": result.get("source_file"),
                       "layer_counts": execs, "layer_executors": dict(result.get("layer_executors") or {}),
                       "layers_without_recommendation": list(result.get("fallbacks") or [])},
        "num_partitions": result.get("num_partitions"),
        "partition_counts": parts,
        "partitions": result.get("partitions"),
        "timing": result.get("timing"),
        "reference": result.get("reference"),
        "options": result.get("options"),
        "warnings": result.get("warnings") or [],
        **({mode: result.get(mode)} if mode not in (PARTITIONS_MODE, MODULE_MODE) else {}),  # the backend's fields
        "mode_reason": result.get("mode_reason"),
        # module mode (fullrun/module/run.py): the one-module run, also when the partitions ran after it
        **({"module": result["module"], "placement": (result["module"] or {}).get("placement")}
           if result.get("module") else {}),
        **({"verdict": result["verdict"]} if result.get("verdict") else {}),
        "result_file": result_file,
        # the model's outputs of the run (full/outputs.npz), beside its result
        "outputs_file": (os.path.join(os.path.dirname(result_file), result["outputs_file"])
                         if result_file and result.get("outputs_file") else None),
        "generated_at": result.get("generated_at"),
    }


def stale_layers(section: Mapping, ops: Mapping) -> dict[str, tuple[str, str]]:
    """``{layer_id: (executor the run placed it on, executor recommended now)}``: the layers
    of a report's ``full_model`` section whose assignment changed since that run (empty
    when none did, or when it cannot be told: a section without
    ``assignment.layer_executors``, written before they were recorded). The one rule for
    "out of date": :func:`stale_reason` (``view``, the report JSON's text) and the HTML
    report (its full-model section and the model graph) all use it."""
    placed = (section.get("assignment") or {}).get("layer_executors")
    if not isinstance(placed, Mapping):
        return {}
    changed = {}
    for layer_id, executor in placed.items():
        name = _executor_name((ops.get(layer_id) or {}).get("recommended_executor"))
        if name is not None and name != executor:
            changed[layer_id] = (executor, name)
    return changed


def stale_reason(section: Mapping, ops: Mapping) -> str | None:
    """Why a report's ``full_model`` section no longer describes the report's own
    assignment, or None when it still does (or cannot be told: a section without
    ``assignment.layer_executors``, written before they were recorded).

    The section is out of date when a layer the run placed on one executor is now
    recommended on another (``edit`` changed it, or a later discovery did): the
    comparison then belongs to an assignment that the compiler JSON no longer holds
    (:func:`stale_layers`).
    """
    changed = [f"{lid} ({was} -> {now})" for lid, (was, now) in stale_layers(section, ops).items()]
    if not changed:
        return None
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return (f"the assignment changed since this run: {', '.join(changed[:3])}{more}; "
            f"run `torq-gen-config run` again to check the current one")


def render_full_model_text(section: Mapping) -> str:
    """The ``--- Full Model Comparison ---`` part of ``final_report_text``."""
    m = section.get("metrics") or {}
    t = section.get("timing") or {}
    a = section.get("assignment") or {}
    status = section.get("status")
    if status == "success" and m.get("inconclusive"):
        status = "success* (inconclusive: the comparison could not have failed, see below)"
    lines = [TEXT_MARKER, f"Status: {status}"]
    if section.get("stale"):
        lines.append(f"  OUT OF DATE: {section['stale']}")
    if section.get("summary"):
        lines.append(f"  {section['summary']}")
    lines.append(f"Assignment: {a.get('source_file') or a.get('source')} "
                 f"({', '.join(f'{k}: {v}' for k, v in (a.get('layer_counts') or {}).items())} layers)")
    parts = section.get("partition_counts") or {}
    mode = section.get("mode") or PARTITIONS_MODE
    if section.get("mode_reason"):
        lines.append(f"Mode: {mode} ({section['mode_reason']})")
    if section.get("verdict"):
        lines.append(f"Verdict: {section['verdict']}")
    if mode == MODULE_MODE:
        lines.extend(module_lines(section))
    elif mode != PARTITIONS_MODE:
        hooks = capabilities(mode).whole_model()
        lines.extend(hooks.text_lines(section) if hooks is not None else [f"Mode: whole model on {mode}"])
        lines.append(f"Compile time: {_fmt_ms(t.get('compile_ms_total'))}; run time: {_fmt_ms(t.get('run_ms_total'))}")
    else:
        if section.get("module"):
            lines.extend(module_lines(section))
        lines.append(f"Partitions: {section.get('num_partitions')} "
                     f"({', '.join(f'{k}: {v}' for k, v in parts.items())})")
        lines.append(f"Compile time: {_fmt_ms(t.get('compile_ms_total'))} total; run time: "
                     f"{_fmt_ms(t.get('run_ms_total'))} total (sum over partitions)")
        shared = [p for p in section.get("partitions") or [] if (p.get("compile_batch") or {}).get("compile_ms_is")]
        if shared:
            n = len({(p["compile_batch"].get("executor"), p["compile_batch"]["id"]) for p in shared})
            lines.append(f"  {len(shared)} of {len(section.get('partitions') or [])} partitions compiled in {n} "
                         f"batch module(s) (compile_batch): their compile times are shares of their batch's, "
                         f"not measured per partition")
    if section.get("outputs_file"):
        lines.append(f"Outputs: {section['outputs_file']} (the model's outputs of this run, by output name)")
    ref = section.get("reference") or {}
    second = ref.get("second") or {}
    if ref.get("fallback"):
        lines.append(f"Judged against: {ref['fallback']}")
    elif ref.get("status") not in (None, "ok") and status != "unverified":
        spec = ("onnx's reference implementation ran" if second.get("status") == "ok" else
                f"onnx's reference implementation: {second.get('status')}"
                + (f" ({second['message']})" if second.get("message") else ""))
        lines.append(f"Reference: {ref.get('message') or ref.get('status')}; {spec} (the outputs were not compared: "
                     "the run failed first)")
    elif ref.get("status") not in (None, "ok"):
        spec = (f"; onnx's reference implementation failed too: {second.get('message') or second.get('status')}"
                if second.get("status") not in (None, "ok", "not run") else "")
        lines.append(f"Reference failed: {ref.get('message') or ref.get('status')}{spec} (the outputs were not "
                     "compared)")
    if m:
        outs = m.get("outputs") or []
        has_float = any(o.get("kind") == "float" for o in outs)
        if has_float:
            lines.append(f"Max relative difference: {_fmt(m.get('max_rel_diff'))} (float outputs)")
        lines.append(f"Max absolute difference: {_fmt(m.get('max_abs_diff'))}")
        if has_float:
            lines.append(f"Mean relative difference: {_fmt(m.get('mean_rel_diff'))}")
        if m.get("cosine_similarity") is not None:
            lines.append(f"Cosine similarity: {m['cosine_similarity']:.6f} (min over float outputs; required "
                         f">= {m.get('min_cosine')})")
        lines.append(f"Number of differences (over tolerance): {section.get('num_over_tolerance')} "
                     f"of {m.get('num_elements')} elements")
    lines.extend(tolerance_lines(section))
    f = section.get("failure")
    if f and f.get("summary") != section.get("summary"):
        lines.append(f"Failure: {f.get('summary')}")
    fb = a.get("layers_without_recommendation") or []
    if fb:
        lines.append(f"Layers without a recommendation: {len(fb)}")
        for item in fb[:20]:
            lines.append(f"  - {item['layer_id']} -> {item['executor'] or 'compiler'} ({item['reason']})")
        if len(fb) > 20:
            lines.append(f"  ... and {len(fb) - 20} more (see full_model.assignment in the report JSON)")
    checks = [p for p in section.get("partitions") or [] if (p.get("partition_check") or {}).get("status")
              not in (None, "success")]
    if checks:
        lines.append("Partitions that differ from their own reference (ONNX Runtime; onnx's reference implementation "
                     "where it fails) on their own inputs:")
        for p in checks[:20]:
            c = p["partition_check"]
            lines.append(f"  - #{p['index']} {p['executor']} nodes {p['first_node']}-{p['last_node']} "
                         f"({_layer_span(p['layer_ids'])}): {c.get('status')}: {c.get('summary')}")
    lines.extend(reduced_lines(section.get("reduced")))
    return "\n".join(lines) + "\n"


def tolerance_lines(section: Mapping) -> list[str]:
    """The lines on what the full model was judged with beyond the configured tolerance:
    the tolerance widened to ONNX Runtime with all optimizations (``tolerance_widened``:
    the rule, per output from what to what and that engine's error) and, for a
    ``difference``, the partition that carries it (``difference_partition``); also a
    failed optimized run (nothing widened, the configured tolerance stands)."""
    lines = []
    w = section.get("tolerance_widened")
    if w:
        lines.append(f"Tolerance: {w.get('note')} (rule: {w.get('rule')})")
    opt = (section.get("reference") or {}).get("optimized") or {}
    if opt and opt.get("status") not in ("ok", "not run"):
        lines.append(f"Tolerance: as configured (ONNX Runtime with all optimizations could not be measured: "
                     f"{opt.get('message') or opt.get('status')})")
    c = section.get("difference_partition")
    if c and section.get("status") == "difference":
        lines.append(f"Difference: {c.get('line')}")
    return lines


def module_lines(section: Mapping) -> list[str]:
    """The lines on the one-module run (``full_model.module``, ``full_model.placement``):
    its status, compile and run time, devices, transfers, where the layers ran (counts),
    the layers that ran elsewhere than assigned and executables built for two backends.
    Placement is what was read back from the compiled program, not the assignment."""
    m = section.get("module") or {}
    pl = section.get("placement") or m.get("placement") or {}
    devs = ", ".join(f"{d.get('executor')} ({d.get('device')})" for d in m.get("devices") or [])
    lines = [f"One module: {m.get('status')}" + (f": {m['summary']}" if m.get("summary") and
                                                  section.get("mode") != "module" else ""),
             f"  compile {_fmt_ms(m.get('compile_ms'))}, run {_fmt_ms(m.get('run_ms'))}; devices: {devs or 'n/a'}; "
             + ("transfers: n/a" if m.get("transfers") is None else f"{m['transfers']} transfer(s)")
             + f"; {m.get('shared_executables') or 0} executable(s) shared between "
             "devices (each device given its own copy)"]
    lines.extend(first_difference_lines(m.get("first_difference")))
    if pl:
        counts = pl.get("counts") or {}
        lines.append("  Placement (read back from the compiled program): "
                     + ", ".join(f"{k}: {counts.get(k, 0)}" for k in ("as assigned", "elsewhere", "no kernel"))
                     + " layer(s)")
        rows = pl.get("layers") or {}
        for lid in (pl.get("elsewhere") or [])[:20]:
            r = rows.get(lid) or {}
            lines.append(f"  RAN ELSEWHERE: {lid}: assigned {r.get('assigned')}, ran on {', '.join(r.get('ran_on') or [])}")
        if len(pl.get("elsewhere") or []) > 20:
            lines.append(f"  ... and {len(pl['elsewhere']) - 20} more layer(s) ran elsewhere")
        for exe, variants in (pl.get("two_backends") or {}).items():
            lines.append(f"  TWO BACKENDS: executable {exe} built for {', '.join(variants)} ({TWO_BACKENDS_NOTE})")
    return lines


def first_difference_lines(fd: Mapping | None) -> list[str]:
    """The lines on where a one module that failed or differed first differs
    (``full_model.module.first_difference``, :mod:`.module.bisect`): the first model output
    over tolerance, the first differing layer or why it was not located, and the cost."""
    if not fd:
        return []
    lines = []
    if fd.get("output"):
        lines.append(f"  First differing output: {fd['output']}" + (f" ({fd['output_problem']})"
                                                                    if fd.get("output_problem") else ""))
    note = fd.get("note") or fd.get("status")
    if fd.get("status") == "located":
        note = f"First differing layer: {note.removeprefix('first differing layer: ')}"
        if fd.get("tensor"):
            note += f"; tensor {fd['tensor']}"
    elif note:
        note = f"First differing layer {note}"
    cost = [f"{k} {_fmt_ms(fd[f'{k}_ms'])}" for k in ("compile", "run") if fd.get(f"{k}_ms") is not None]
    if fd.get("num_exposed"):
        cost.insert(0, f"{fd['num_exposed']} value(s) exposed ({fd.get('selection')})")
    lines.append(f"  {note}" + (f" [diagnostic module: {', '.join(cost)}]" if cost else ""))
    return lines


def reduced_lines(r: Mapping | None) -> list[str]:
    """The lines of ``run --reduce``'s result (``full_model.reduced``)."""
    if not r:
        return []
    n, total, where = r.get("num_nodes"), r.get("from_nodes"), f"{r.get('dir')}/"
    head = {"reduced": f"Reduced to {n} of {total} nodes ({where})",
            "not reduced": f"Not reduced: all {total} nodes are needed ({where})",
            "stopped": f"Reduction stopped: {n} of {total} nodes kept ({where})",
            "not reproduced": f"Not reduced: the failure did not reproduce in the reducer ({where})"}
    status = r.get("status")
    lines = [f"{head.get(status) or f'Reduction {status}: {n} of {total} nodes ({where})'}: {r.get('note')}"]
    for node in (r.get("nodes") or [])[:20]:
        lines.append(f"  - node {node['index']} {node['op_type']} {node.get('name') or ''} ({node.get('layer_id')}) "
                     f"on {node['executor']}")
    if len(r.get("nodes") or []) > 20:
        lines.append(f"  ... and {len(r['nodes']) - 20} more (reduce.json)")
    if r.get("reproducer"):
        lines.append(f"  Reproduce (from {r.get('cwd') or 'the directory run --reduce ran in'}): {r['reproducer']}")
    return lines


def with_full_model_text(text: str, section: Mapping) -> str:
    """``final_report_text`` with its full-model part replaced by (or appended as) the current one."""
    text = text or ""
    pos = text.find(TEXT_MARKER)
    if pos >= 0:
        text = text[:pos]
    text = text.rstrip("\n") + "\n\n" if text.strip() else ""
    return text + render_full_model_text(section)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3e}"


def _fmt_ms(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x / 1000.0:.2f} s" if x >= 1000 else f"{x:.1f} ms"
