"""Where a one-module run first differs (issue 22, item 5): when the module (:mod:`.run`)
fails or differs from the reference and the partitions of the same assignment pass, name
the first model output over tolerance and, where it can be found, the first placed layer
whose value differs.

The layer is found with ONE diagnostic module: the same assignment compiled again with the
values of the chosen ops exposed as extra function results (``place_module``'s
``extra_results``: each transferred back to the default device), run once, each exposed value
compared with the reference value of the same tensor (the reference engine on the prepared
model with those tensors as extra outputs), with the run's compare function and tolerance
(:func:`~torq_gen_config.compare.judge`, ``FULL_MODEL_MIN_COSINE``). The first value in
topological order (the prepared model's node order) over tolerance names the layer.

Which values: every placed op's, up to :data:`MAX_EXPOSED` ops (light SqueezeNet has 69: all
of them). Above that, the ops at device boundaries (the last op before and the first op after
the executor changes, where the one-program compile differs most from the partitions) and
every N-th op, so that at most :data:`MAX_EXPOSED` are exposed: the difference is then located
between the last matching exposed value and the first differing one. Each exposed value is a
result the compiler must materialize (no fusion across it) and ``iree-run-module`` writes it
to a ``.npy`` file, so the values' total size is bounded too (:data:`MAX_EXPOSED_BYTES`).

Exposing values changes fusion: the diagnostic module can match where the module did not;
the record says so rather than naming a layer. It costs one more compile and run (about as
much as the module's own) and one reference run.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from . import program
from ...backends.base import StageError
from ...compare import FULL_MODEL_MIN_COSINE, judge, quantized_data_outputs_of_file, status_details
from ...core.external_data import load_model
from ...core.lazy import helper, np
from ...core.tools import first_error_line
from ...mlir.placement import executor_of
from ...model.graph import expose_outputs
from ...reference import judged_reference, load_reference
from ...reference.reference_run import run_reference
from ...core.layout import PARTITION_RUN_DIR

#: at most this many ops' values are exposed (above: boundaries and every N-th op)
MAX_EXPOSED = 128
#: the exposed values' total size (bytes, from the model's value types); above: skipped
MAX_EXPOSED_BYTES = 1 << 30
#: the diagnostic module's work directory, beside the module's
DIAG_DIR = "bisect"
NOTE_FUSION = ("not located: with the intermediate values exposed the module matches the reference "
               "(exposing them changes fusion)")


def first_output_over(metrics: Mapping | None, tolerance: Mapping | None) -> dict | None:
    """The first model output (model order) over tolerance in a run's comparison metrics:
    ``{"name", "problem"}`` (:func:`~torq_gen_config.compare.status_details`' reason), or None."""
    for out in (metrics or {}).get("outputs") or []:
        one = {**metrics, "outputs": [out], "num_outputs": 1, "num_actual_outputs": 1,
               "output_count_mismatch": False}
        lines = status_details(one, tolerance)
        if lines:
            return {"name": out.get("name"), "problem": lines[0]}
    return None


def candidate_ops(node_keys: list[str | None], key_layer: Mapping[str, str], assignment: Mapping[str, Any],
                  node_outputs: list[list[str]], default: str | None) -> list[dict]:
    """The placed ops in topological order (the prepared model's node order), each with
    its layer, executor and ONNX output names: ``[{"key", "layer", "executor", "node",
    "outputs"}]``; nodes without a key or a layer are left out."""
    out, seen = [], set()
    for j, key in enumerate(node_keys):
        if not key or key not in key_layer or key in seen or j >= len(node_outputs):
            continue
        seen.add(key)
        out.append({"key": key, "layer": key_layer[key], "executor": executor_of(assignment.get(key)) or default,
                    "node": j, "outputs": list(node_outputs[j])})
    return out


def choose_exposed(cands: list[Mapping], limit: int = MAX_EXPOSED) -> tuple[list[Mapping], str]:
    """The candidates (:func:`candidate_ops`) whose values are exposed, and how they were
    chosen: all when at most ``limit``; else the ops at device boundaries (executor
    differs from the previous or the next op's), the last op, and every N-th op, at most
    ``limit`` in all (boundaries thinned first when they alone are too many)."""
    n = len(cands)
    if n <= limit:
        return list(cands), f"all {n} placed ops"
    ex = [c["executor"] for c in cands]
    bound = [i for i in range(n) if (i and ex[i] != ex[i - 1]) or (i + 1 < n and ex[i] != ex[i + 1])]
    if len(bound) + 1 > limit // 2:  # leave room for the regular ones
        step = math.ceil(len(bound) / max(1, limit // 2 - 1))
        bound = bound[::step]
    keep = set(bound) | {n - 1}
    room = max(1, limit - len(keep))
    every = math.ceil(n / room)
    keep |= set(range(every - 1, n, every))
    chosen = sorted(keep)[:limit] if len(keep) > limit else sorted(keep)
    if n - 1 not in chosen:
        chosen[-1] = n - 1
    return ([cands[i] for i in chosen],
            f"{len(chosen)} of {n} placed ops (more than {limit}): those at device boundaries and every {every}-th")


def first_difference(comparisons: list[Mapping]) -> tuple[Mapping | None, Mapping | None]:
    """The first comparison (topological order) whose status is not ``success``, and the
    last one before it that is (None when none)."""
    last_ok = None
    for c in comparisons:
        if c.get("status") != "success":
            return c, last_ok
        last_ok = c
    return None, last_ok


def value_bytes(model, names: list[str]) -> int | None:
    """The total size of the tensors ``names`` from the model's value types (None when
    one has no static shape or no known type)."""
    types = {v.name: v.type.tensor_type for v in [*model.graph.value_info, *model.graph.output, *model.graph.input]}
    total = 0
    for name in names:
        t = types.get(name)
        if t is None or not t.elem_type or not t.HasField("shape"):
            return None
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if any(d is None for d in dims):
            return None
        try:
            size = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)).itemsize
        except Exception:  # an element type numpy has no dtype for
            size = 4
        total += int(np.prod(dims, dtype=np.int64)) * size
    return total


def reference_values(prepared_model: str, inputs: Mapping, names: list[str], *, engine: str,
                     timeout_s: float) -> dict:
    """The reference values of the tensors ``names``: the prepared model with them as
    extra graph outputs, run on the reference engine (``onnxruntime`` or ``onnx``)."""
    model = load_model(prepared_model, weights=False)
    expose_outputs(model, names)
    outs = run_reference(model, dict(inputs), list(names), engine=engine, timeout_s=timeout_s)
    return dict(zip(names, outs))


def compare_values(actual: Mapping, reference: Mapping, exposed: list[Mapping], tolerance: Mapping,
                   quantized: set[str] = frozenset()) -> list[dict]:
    """Each exposed value against its reference, with the run's compare and tolerance.

    Args:
        actual / reference: tensor name -> array.
        exposed: ``[{"key", "layer", "tensor", "executor"}]`` in topological order.

    Returns:
        ``[{"key", "layer", "tensor", "executor", "status", "summary", "max_abs_diff"}]``;
        ``status`` ``success``, ``difference`` or ``error`` (the compare raised).
    """
    out = []
    for e in exposed:
        t = e["tensor"]
        row = {k: e.get(k) for k in ("key", "layer", "tensor", "executor")}
        try:
            status, summary, metrics = judge({t: actual[t]}, {t: reference[t]}, [t], tolerance,
                                             quantized_outputs=quantized & {t}, min_cosine=FULL_MODEL_MIN_COSINE)
            o = (metrics.get("outputs") or [{}])[0]
            row.update(status=status, summary=summary, max_abs_diff=o.get("max_abs_diff"))
        except Exception as ex:  # a value the compare cannot take (a sequence, a dtype): not judged
            row.update(status="error", summary=f"compare failed: {type(ex).__name__}: {ex}", max_abs_diff=None)
        out.append(row)
    return out


def locate_first_difference(*, mlir_text: Callable[[str], str], side: Mapping, prepared_model: str,
                            inputs: Mapping, input_names: list[str], output_names: list[str],
                            reference_outputs: Mapping, tolerance: Mapping, work_dir: str | Path,
                            timeout_s: float, engine: str = "onnxruntime", ran_on: Mapping[str, list] | None = None,
                            limit: int = MAX_EXPOSED, max_bytes: int = MAX_EXPOSED_BYTES, split: bool = True,
                            log_path: str | None = None) -> dict:
    """Compile and run the diagnostic module once and name the first differing layer;
    never raises.

    Args:
        mlir_text: returns ``full.mlir``'s text with its weights, given a work directory
            (:func:`~.run.weighted_mlir`).
        side: the module's ``placement.json`` (``assignment``, ``executors``, ``key_layer``,
            ``node_keys``).
        prepared_model: the prepared model (the reference and the ONNX names of the values).
        inputs / input_names / output_names: the reference inputs, the model's inputs and
            outputs in order.
        reference_outputs: the reference outputs (the diagnostic module's own outputs are
            compared with them too).
        work_dir: the diagnostic module's files (created; its large files removed after).
        engine: the reference engine the run was judged against.
        ran_on: layer -> executors the module's read-back says it ran on (named in the note).
        split: the compile's executable split (False only in the test that forces the IREE bug).

    Returns:
        ``{"status": "located" | "not located" | "failed" | "skipped", "layer", "key",
        "tensor", "max_abs_diff", "executor", "after": the last matching exposed layer before
        it, "note": one line, "selection", "num_candidates", "num_exposed",
        "num_over_tolerance", "compile_ms", "run_ms", "reference_ms", "values": per exposed
        value {"layer", "tensor", "status", "max_abs_diff"}}``.
    """
    rec: dict[str, Any] = {"status": None, "layer": None, "key": None, "tensor": None, "max_abs_diff": None,
                           "executor": None, "after": None, "note": None, "selection": None, "num_candidates": 0,
                           "num_exposed": 0, "num_over_tolerance": None, "compile_ms": None, "run_ms": None,
                           "reference_ms": None, "values": []}

    def done(status: str, note: str) -> dict:
        rec.update(status=status, note=note)
        return rec

    if not side or not side.get("node_keys") or not prepared_model:
        return done("skipped", "not located: no map from the module's ops to the model's tensors "
                               "(no placement record or prepared model)")
    try:
        model = load_model(prepared_model, weights=False)
    except Exception as e:
        return done("failed", f"not located: the prepared model could not be read ({type(e).__name__}: {e})")
    default = next((e["name"] for e in side.get("executors") or []
                    if e["name"] in {v for v in (side.get("assignment") or {}).values()}), None)
    cands = candidate_ops(list(side["node_keys"]), side.get("key_layer") or {}, side.get("assignment") or {},
                          [list(n.output) for n in model.graph.node], default)
    rec["num_candidates"] = len(cands)
    if not cands:
        return done("skipped", "not located: no placed op has a known location")
    chosen, rec["selection"] = choose_exposed(cands, limit)
    names = [t for c in chosen for t in c["outputs"] if t]
    size = value_bytes(model, names)
    if size is not None and size > max_bytes:
        return done("skipped", f"not located: the {len(names)} values to expose hold {size / 2**20:.0f} MiB "
                               f"(limit {max_bytes / 2**20:.0f} MiB)")
    work = Path(work_dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t = time.perf_counter()
    try:
        ref = reference_values(prepared_model, {n: inputs[n] for n in input_names}, names, engine=engine,
                               timeout_s=timeout_s)
    except Exception as e:
        return done("failed", f"not located: the reference run with the values exposed failed: "
                              f"{first_error_line(f'{type(e).__name__}: {e}')}")
    rec["reference_ms"] = round((time.perf_counter() - t) * 1000.0, 1)
    t = time.perf_counter()
    try:
        c = program.compile_one_module(mlir_text(str(work)), side["assignment"], side["executors"], work_dir=work,
                                          timeout_s=timeout_s, split=split, extra_results=[x["key"] for x in chosen], log_path=log_path)
    except StageError as e:
        rec["compile_ms"] = round((time.perf_counter() - t) * 1000.0, 1)
        return done("failed", f"not located: the diagnostic module (values exposed) failed to compile: "
                              f"{e.stage}: {first_error_line(e.message)}")
    except Exception as e:  # a bindings error, a key that matches no op
        return done("failed", f"not located: the diagnostic module (values exposed) could not be built: "
                              f"{type(e).__name__}: {first_error_line(str(e))}")
    rec["compile_ms"] = round((time.perf_counter() - t) * 1000.0, 1)
    by_key = {x["key"]: x for x in chosen}
    exposed = []
    for i, e in enumerate(c.get("extra_results") or []):
        cand = by_key.get(e["key"]) or {}
        outs = cand.get("outputs") or []
        tensor = outs[e["result"]] if e["result"] < len(outs) else None
        exposed.append({"key": e["key"], "layer": cand.get("layer"), "executor": cand.get("executor"),
                        "tensor": tensor, "slot": f"exposed_{i}"})
    rec["num_exposed"] = len(exposed)
    if not exposed:
        return done("skipped", "not located: no value could be exposed (no top-level tensor op)")
    try:
        outs, run_ms = program.run_one_module(c, side["executors"], inputs=inputs, input_names=input_names,
                                                 output_names=[*output_names, *[e["slot"] for e in exposed]],
                                                 work_dir=work / PARTITION_RUN_DIR, timeout_s=timeout_s, log_path=log_path)
    except StageError as e:
        return done("failed", f"not located: the diagnostic module (values exposed) failed to run: "
                              f"{e.stage}: {first_error_line(e.message)}")
    except Exception as e:
        return done("failed", f"not located: the diagnostic module (values exposed) failed to run: "
                              f"{type(e).__name__}: {first_error_line(str(e))}")
    finally:
        for name in ("stream.mlirbc", "split.mlirbc", "full_weights.mlir", "placed.mlir"):
            (work / name).unlink(missing_ok=True)
        shutil.rmtree(work / "ir", ignore_errors=True)
    rec["run_ms"] = round(run_ms, 1)
    judged = [e for e in exposed if e["tensor"] and e["tensor"] in ref]
    actual = {e["tensor"]: outs[e["slot"]] for e in judged}
    rows = compare_values(actual, ref, judged, tolerance, set(quantized_data_outputs_of_file(prepared_model)))
    rec["values"] = [{k: r[k] for k in ("layer", "tensor", "status", "max_abs_diff")} for r in rows]
    rec["num_over_tolerance"] = sum(1 for r in rows if r["status"] != "success")
    first, before = first_difference(rows)
    if first is not None:
        where = list((ran_on or {}).get(first["layer"]) or []) or [first["executor"]]
        rec.update(layer=first["layer"], key=first["key"], tensor=first["tensor"], max_abs_diff=first["max_abs_diff"],
                   executor=", ".join(w for w in where if w), after=(before or {}).get("layer"))
        diff = "n/a" if first["max_abs_diff"] is None else f"{first['max_abs_diff']:.3g}"
        note = f"first differing layer: {first['layer']} (max |diff| {diff}), on {rec['executor']}"
        if len(chosen) < len(cands):
            note += f" (between {rec['after']} and it: not every op's value was exposed)" if rec["after"] else \
                " (the first exposed value: earlier ops' values were not all exposed)"
        return done("located", note)
    try:
        status, _, _ = judge({n: outs[n] for n in output_names}, reference_outputs, list(output_names), tolerance,
                             min_cosine=FULL_MODEL_MIN_COSINE)
    except Exception:
        status = None
    if status == "success":
        return done("not located", NOTE_FUSION)
    return done("not located", "not located: every exposed value matches, but the diagnostic module's outputs "
                               "differ (the difference is after the last exposed value, or in a value not exposed)")


def bisect_module(plan: Mapping, module_result: Mapping, *, side: Mapping | None, reference_npz: str,
                  tolerance: Mapping, timeout_s: float, partitions_dir: str, mlir_text: Callable[[str], str],
                  log_path: str | None = None) -> dict:
    """The ``first_difference`` record of a module that failed or differed (the partitions
    passed): the first output over tolerance (``output``, ``output_problem``) and
    :func:`locate_first_difference`'s record, or ``status: "skipped"`` with why (the module
    failed to compile: nothing to expose values of); ``bisect_ms`` its wall time."""
    t0 = time.perf_counter()
    first_out = first_output_over(module_result.get("metrics"), tolerance)
    head = {"output": (first_out or {}).get("name"), "output_problem": (first_out or {}).get("problem")}
    failure = module_result.get("failure") or {}
    if module_result.get("status") == "error" and (failure.get("stage") in ("compile", "import")
                                                   or failure.get("during") == "compile"):
        return {**head, "status": "skipped", "note": "not located: the module failed to compile (nothing to expose "
                                                     "values of)", "bisect_ms": None}
    inputs, ref_outputs, meta = load_reference(reference_npz)
    used, ref_outputs, _ = judged_reference(meta, ref_outputs)
    if used is None:
        return {**head, "status": "skipped", "note": "not located: the reference failed", "bisect_ms": None}
    p = plan["module"]
    layers = ((module_result.get("module") or {}).get("placement") or {}).get("layers") or {}
    run_side = {**(side or {}), "executors": p.get("run_executors") or (side or {}).get("executors") or []}
    rec = locate_first_difference(mlir_text=mlir_text, side=run_side,
                                  prepared_model=plan.get("prepared_model") or (side or {}).get("prepared_model"),
                                  inputs=inputs, input_names=list(p.get("inputs") or meta.get("input_names") or []),
                                  output_names=list(p.get("outputs") or meta.get("output_names") or []),
                                  reference_outputs=ref_outputs, tolerance=tolerance,
                                  work_dir=str(Path(partitions_dir) / p["pid"] / DIAG_DIR), timeout_s=timeout_s,
                                  engine=used, ran_on={k: r.get("ran_on") for k, r in layers.items()},
                                  log_path=log_path)
    return {**head, **rec, "bisect_ms": round((time.perf_counter() - t0) * 1000.0, 1)}


def verdict_tail(first: Mapping | None) -> str:
    """What the verdict adds: ``"; first differing output: 'y'; first differing layer: ..."``."""
    if not first:
        return ""
    out = f"; first differing output: '{first['output']}'" if first.get("output") else ""
    return out + (f"; {first['note']}" if first.get("note") else "")
