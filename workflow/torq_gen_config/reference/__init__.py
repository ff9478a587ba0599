"""Layer references: each layer's inputs and its outputs on both reference engines.

Inputs are the values the layer receives in the whole-model reference run
(:func:`propagate_layer_inputs`, ``--layer-inputs propagate``, the default), else
op-aware generated values (:func:`make_inputs`, :mod:`torq_gen_config.inputs`:
axes, shapes, indices, ... are valid for their op; docs/inputs.md). References come
from ONNX Runtime CPU with all graph optimizations disabled and from onnx's reference
implementation (:mod:`torq_gen_config.reference.reference_run`); the configured one is what the
verdicts are computed against, and the spec's outputs where ONNX Runtime, the configured
one, failed on the layer. Where the two disagree, the spec evaluated in float64 (the
arbiter) is computed too and the verdicts rest on it (:func:`judged_reference`;
docs/comparison.md, "References").

A layer's reference (``reference.json``, :data:`~torq_gen_config.core.layout.LAYER_REFERENCE_FILE`)
is a record of the value store (:mod:`torq_gen_config.core.value_store`): its metadata
(names, both engines' status, message and version, how the inputs were made, the engines'
agreement metrics) and value references ``inputs``, ``outputs`` (the configured engine's)
and ``second_outputs`` (the other engine's, kept only where the two engines disagree: more
than a tenth of the tolerance apart, :data:`SECOND_KEEP_FRACTION`) and, there,
``arbiter_outputs`` (the spec in float64, rounded to the declared types). A layer's input is the
same stored value as its producer's output in the whole-model run (``inputs.json``). The
whole model's reference (``full/reference.npz``, rule ``full_reference``) keeps the arrays
in the file: ``input_<i>``, ``output_<i>``, ``second_output_<i>`` and ``__meta__``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..compare import FULL_MODEL_MIN_COSINE, compare_on_model, derive_status
from ..core.errors import DamagedWorkFile
from ..core.fileio import load_npz, save_npz
from ..core.value_store import ValueStore, read_record, write_record
from ..core.isolation import WorkerCrash, WorkerTimeout, run_isolated_each
from ..core.lazy import ml_dtypes, np, onnx
from ..core.ort_io import numpy_dtype
from ..inputs import DEFAULT_INPUT_SETTINGS, make_inputs
from ..core.external_data import load_model
from .model_inputs import load_model_inputs
from .model_run import run_model_by_node, run_summary
from .reference_run import (ENGINES, SPEC_FLOAT64, ReferenceTimeout, engine_label, engine_version, has_bfloat16,
                            run_reference, run_reference_file, run_spec_float64_file)
from ..core.layout import LAYER_INPUTS_FILE, MANIFEST_FILE
from ..core.limits import DEFAULT_TIMEOUT_S, DETAIL_CHARS, NOTE_CHARS
from ..core.limits import call_limit

#: the second engine's outputs are kept (for the executors' second opinion) where the two
#: engines are further apart than this fraction of the tolerance: a tolerance edit up to
#: ten times stricter still finds them where it makes a dispute
SECOND_KEEP_FRACTION = 0.1
_FLOAT_TOLERANCES = ("fp_avg_tol", "fp_max_tol", "bf16_avg_tol", "bf16_max_tol")


def engines_disagree(agreement: dict | None, tolerance: dict | None) -> bool:
    """True when the engines' agreement metrics (``meta["engines_agreement"]``) are not a
    success at :data:`SECOND_KEEP_FRACTION` of ``tolerance`` (its float tolerances scaled;
    None: always True, everything is kept). No metrics (a non-numeric output): True."""
    if tolerance is None or not agreement:
        return True
    tight = {k: (v * SECOND_KEEP_FRACTION if k in _FLOAT_TOLERANCES and v is not None else v)
             for k, v in tolerance.items()}
    try:
        return derive_status(agreement, tight)[0] != "success"
    except ValueError:
        return True


def _save_reference(out_path: str | os.PathLike, values_dir: str | os.PathLike | None, inputs: dict,
                    outputs: list, second_outputs: list, meta: dict, arbiter_outputs: list = ()) -> None:
    """Write a reference: a value-store record (``.json``: arrays into ``values_dir``) or,
    for any other suffix, an ``.npz`` holding the arrays (a whole model has no arbiter)."""
    if str(out_path).endswith(".json"):
        if values_dir is None:
            raise ValueError(f"a reference record ({out_path}) needs the value store's folder")
        store = ValueStore(values_dir)
        names = meta.get("output_names") or []
        record = {**meta, "inputs": {n: store.put(a) for n, a in inputs.items()},
                  "outputs": {n: store.put(a) for n, a in zip(names, outputs)},
                  "second_outputs": {n: store.put(a) for n, a in zip(names, second_outputs)}}
        if arbiter_outputs:
            record["arbiter_outputs"] = {n: store.put(a) for n, a in zip(names, arbiter_outputs)}
        write_record(out_path, record, store)
        return
    arrays = {f"input_{i}": a for i, a in enumerate(inputs.values())}
    arrays.update({f"output_{i}": np.asarray(a) for i, a in enumerate(outputs)})
    arrays.update({f"second_output_{i}": np.asarray(a) for i, a in enumerate(second_outputs)})
    save_npz(out_path, arrays, meta)


def compute_reference(layer_path: str | os.PathLike, out_path: str | os.PathLike, settings: dict | None = None,
                      *, intra_op_num_threads: int = 1, inputs_path: str | os.PathLike | None = None,
                      input_ranges: dict[str, list[float]] | None = None, engine: str = "onnxruntime",
                      timeout_s: float | None = None, inputs: dict | None = None, inputs_source: str | None = None,
                      second_opinion: bool | str = True, subject: str = "the layer",
                      values_dir: str | os.PathLike | None = None, tolerance: dict | None = None,
                      optimized_check: bool = False) -> dict:
    """A layer's inputs and its outputs on both reference engines, stored in one file.

    Inputs: with ``inputs_path`` (``--layer-inputs propagate``, the default) the
    values the layer receives in the whole-model run (:func:`propagate_layer_inputs`),
    checked against the layer's declared inputs (names, dtypes, shapes); where that
    run could not produce them, or they do not match, generated values
    (:func:`make_inputs`; ``input_ranges`` as there), and ``meta["layer_inputs"]``
    says so and why. ``inputs`` (name -> array, described by ``inputs_source``) are
    used as given. Otherwise: generated values.

    Outputs: ``engine`` (``onnxruntime`` or ``onnx``, :mod:`torq_gen_config.reference.reference_run`)
    gives the reference the verdicts are computed against (``output_<i>``); the other
    engine gives the second opinion (``second_output_<i>``, ``meta["second"]``;
    ``subject`` names what ran in the engines' failure messages, "the layer" by default;
    ``second_opinion=False`` skips it; ``"on_failure"`` runs it only when the configured
    engine failed, to stand in for it (a whole model: :func:`judged_reference`). When
    both ran, ``meta["engines_agreement"]`` holds the metrics of ONNX Runtime's
    outputs against the ONNX reference implementation's (:func:`~torq_gen_config.compare.compare_outputs`),
    from which the report derives a reference dispute for any tolerance.

    ``optimized_check`` (the whole model, rule ``full_reference``): where the reference
    ran, ONNX Runtime also runs the model as deployed, all graph optimizations on, on the
    same inputs (same threads, no weight pre-packing), and ``meta["optimized"]`` records
    its ``status``, ``message``, ``run_ms`` and ``metrics`` against the reference (with
    the full-model cosine bound): what a production engine legitimately differs by, from
    which the full-model verdict widens its tolerance
    (:func:`~torq_gen_config.compare.engine_widened_tolerances`). Its outputs are not kept.

    Storage: ``out_path`` ending in ``.json`` (a layer's ``reference.json``) is a record of
    the value store in ``values_dir`` (:mod:`torq_gen_config.core.value_store`); the second
    engine's outputs are stored only where :func:`engines_disagree` at ``tolerance`` (the
    configured one; None keeps them always), and ``meta["second"]["outputs_kept"]`` says
    whether. Where they are stored because the engines disagree (a ``tolerance`` given),
    the spec evaluated in float64 settles it: ``meta["arbiter"]`` (status, run_ms, each
    engine's metrics against it) and its outputs, on which the verdicts then rest
    (:func:`judged_reference`; issue 42: ONNX Runtime's Sigmoid is 1.3 % off on inputs
    near -50, the spec and IREE are not). Another suffix: an ``.npz`` with the arrays (the whole model's reference).

    A layer with bfloat16 tensors (``--auto-convert-bf16``) gets its references from
    the same layer widened to float32, run on the bf16 inputs, with the bf16 outputs
    rounded to bf16 (round to nearest even): ONNX Runtime CPU has no bf16 kernels for
    most ops (docs/toolchain.md, 'bf16 and int8'; docs/precision.md).
    ``meta["reference_precision"]`` says which was used.

    A failing engine (it refuses the model, fails on the inputs, or exceeds
    ``timeout_s`` seconds) is recorded, not raised: the file then holds the inputs and
    that engine's ``status: error`` (or ``timeout``) and message; the executors still
    run. Where ONNX Runtime (the primary) failed and the spec ran, the verdicts are
    computed against the spec's outputs (:func:`judged_reference`); where no reference
    ran, they are "unverified".

    Returns:
        The metadata dict stored as ``__meta__`` (``status``, ``message``, ``engine``,
        ``engine_version``, ``ort_version``, ``input_names``, ``output_names``,
        ``run_ms``, ``layer_inputs``, ``second``, ``engines_agreement``, ``arbiter`` where it ran).
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown reference engine {engine!r}; expected one of {ENGINES}")
    layer = load_model(layer_path, weights=False)
    how = "random"
    if inputs is not None:
        how = inputs_source or "given"
    elif inputs_path is not None:
        inputs, how = _propagated_inputs(inputs_path, layer)
    output_names = [o.name for o in layer.graph.output]
    if inputs is None:
        try:
            inputs = make_inputs(layer, settings, input_ranges)
        except Exception as e:  # e.g. an input without a static shape: no values, no reference
            message = f"cannot make the layer's inputs: {type(e).__name__}: {str(e)[:DETAIL_CHARS]}"
            meta = {"status": "error", "message": message, "engine": engine, "engine_version": None,
                    "ort_version": engine_version("onnxruntime"), "input_names": [], "output_names": output_names,
                    "settings": {**DEFAULT_INPUT_SETTINGS, **(settings or {})}, "run_ms": None,
                    "layer_inputs": f"none ({message})", "inputs_missing": True,
                    "second": {"engine": next(x for x in ENGINES if x != engine), "status": "not run",
                               "message": None, "run_ms": None}, "engines_agreement": None}
            _save_reference(out_path, values_dir, {}, [], [], meta)
            return meta
    bf16 = has_bfloat16(layer)

    second_engine = next(e for e in ENGINES if e != engine)
    engines = [engine, second_engine] if second_opinion is True else [engine]
    limit = call_limit(timeout_s if timeout_s is not None else DEFAULT_TIMEOUT_S)

    def run(engs: list[str]) -> list:
        # the engines in one supervised worker, each bounded on its own (a hang or crash
        # of one stops that worker: its status is then "timeout" or "crash")
        return run_isolated_each(
            [(run_reference_file, (str(layer_path), inputs, output_names, eng, timeout_s, intra_op_num_threads), {})
             for eng in engs],
            limit_s=limit, what=[f"{engine_label(eng)} on the layer" for eng in engs])

    outcomes = run(engines)
    if second_opinion == "on_failure" and isinstance(outcomes[0], BaseException):
        outcomes += run([second_engine])

    def engine_result(eng: str, outcome) -> tuple[dict, list]:
        info: dict[str, Any] = {"engine": eng, "engine_version": engine_version(eng), "status": "ok",
                                "message": None, "run_ms": None}
        if not isinstance(outcome, BaseException):
            outs, run_ms = outcome
            info["run_ms"] = round(run_ms, 3)
            return info, outs
        info["status"] = _failure_status(outcome)
        info["message"] = f"{engine_label(eng)} failed on {subject}: {str(outcome).strip()[:DETAIL_CHARS]}"
        return info, []

    primary, outputs = engine_result(engine, outcomes[0])
    if len(outcomes) > 1:
        second, second_outputs = engine_result(second_engine, outcomes[1])
    else:
        second, second_outputs = {"engine": second_engine, "status": "not run", "message": None, "run_ms": None}, []
    meta: dict[str, Any] = {
        "status": "ok" if primary["status"] == "ok" else "error", "message": primary["message"],
        "engine": engine, "engine_version": primary["engine_version"], "ort_version": engine_version("onnxruntime"),
        "graph_optimization_level": "disabled", "input_names": list(inputs), "output_names": output_names,
        "settings": {**DEFAULT_INPUT_SETTINGS, **(settings or {})}, "run_ms": primary["run_ms"],
        "layer_inputs": how,
        "reference_precision": "fp32 on bf16 values, outputs rounded to bf16" if bf16 else "as the model",
        "second": second, "engines_agreement": None,
    }
    if primary["status"] == "timeout":
        meta["timed_out"] = True
    if outputs and second_outputs:
        ort_outs, spec_outs = (outputs, second_outputs) if engine == "onnxruntime" else (second_outputs, outputs)
        try:
            meta["engines_agreement"] = compare_on_model(layer, dict(zip(output_names, ort_outs)),
                                                         dict(zip(output_names, spec_outs)), output_names)
        except Exception as e:  # a non-numeric output: no agreement check
            meta["engines_agreement_error"] = f"{type(e).__name__}: {e}"[:NOTE_CHARS]
    arbiter_outputs: list = []
    if second_outputs and outputs and not engines_disagree(meta["engines_agreement"], tolerance):
        second_outputs = []  # the engines agree: the primary's outputs stand for both
        second["outputs_kept"] = False
    elif second_outputs:
        second["outputs_kept"] = True
        if outputs and tolerance is not None:  # they disagree: the spec in float64 settles it
            meta["arbiter"], arbiter_outputs = _arbitrate(layer, layer_path, inputs, output_names, outputs,
                                                          second_outputs, engine, timeout_s, limit)
    if optimized_check:
        meta["optimized"] = _optimized_record(layer, layer_path, inputs, output_names, outputs, timeout_s, limit,
                                              intra_op_num_threads, subject)
    _save_reference(out_path, values_dir, inputs, outputs, second_outputs, meta, arbiter_outputs)
    return meta


def _failure_status(outcome: BaseException) -> str:
    """The status of an engine run in a supervised worker that failed: ``timeout`` (its own
    limit or the worker's), ``crash`` (the worker died) or ``error`` (each engine raises its
    own exception types)."""
    if isinstance(outcome, (ReferenceTimeout, WorkerTimeout)):
        return "timeout"
    return "crash" if isinstance(outcome, WorkerCrash) else "error"


def _optimized_record(layer, layer_path, inputs: dict, output_names: list[str], outputs: list,
                      timeout_s: float | None, limit: float, threads: int, subject: str) -> dict:
    """``meta["optimized"]`` of :func:`compute_reference`: ONNX Runtime with all graph
    optimizations on the same inputs, compared with the reference's ``outputs`` (none:
    ``status: "not run"``, nothing to compare with)."""
    rec: dict[str, Any] = {"engine": "onnxruntime", "graph_optimization_level": "all", "intra_op_num_threads": threads,
                           "status": "not run", "message": None, "run_ms": None, "metrics": None}
    if not outputs:
        rec["message"] = "the reference did not run"
        return rec
    outcome = run_isolated_each([(run_reference_file, (str(layer_path), inputs, output_names, "onnxruntime",
                                                       timeout_s, threads), {"optimized": True})],
                                limit_s=limit, what=["ONNX Runtime (all optimizations) on " + subject])[0]
    if isinstance(outcome, BaseException):
        rec["status"] = _failure_status(outcome)
        rec["message"] = (f"ONNX Runtime (all optimizations) failed on {subject}: "
                          f"{str(outcome).strip()[:DETAIL_CHARS]}")
        return rec
    outs, run_ms = outcome
    rec["run_ms"] = round(run_ms, 3)
    try:
        rec["metrics"] = compare_on_model(layer, dict(zip(output_names, outs)), dict(zip(output_names, outputs)),
                                          output_names, min_cosine=FULL_MODEL_MIN_COSINE)
        rec["status"] = "ok"
    except Exception as e:  # a non-numeric output: nothing to widen from
        rec["status"] = "error"
        rec["message"] = f"compare failed: {type(e).__name__}: {e}"[:NOTE_CHARS]
    return rec


def _arbitrate(layer, layer_path, inputs: dict, output_names: list[str], outputs: list, second_outputs: list,
               engine: str, timeout_s: float | None, limit: float) -> tuple[dict, list]:
    """The spec evaluated in float64 on a layer where the two engines disagree
    (:func:`~torq_gen_config.reference.reference_run.run_spec_float64`, in a supervised
    worker): ``(meta["arbiter"], its outputs)``. ``meta["arbiter"]``: ``engine``
    (:data:`SPEC_FLOAT64`), ``status`` (ok, error, timeout, crash), ``message``,
    ``run_ms`` and ``agreement``: engine -> metrics of that engine's outputs against the
    arbiter's (:func:`~torq_gen_config.compare.compare_on_model`), from which the report
    says whom the spec sides with at any tolerance."""
    info: dict[str, Any] = {"engine": SPEC_FLOAT64, "status": "ok", "message": None, "run_ms": None, "agreement": {}}
    outcome = run_isolated_each([(run_spec_float64_file, (str(layer_path), inputs, output_names, timeout_s), {})],
                                limit_s=limit, what=[f"{engine_label(SPEC_FLOAT64)} on the layer"])[0]
    if isinstance(outcome, BaseException):
        info["status"] = _failure_status(outcome)
        info["message"] = f"{engine_label(SPEC_FLOAT64)} failed on the layer: {str(outcome).strip()[:DETAIL_CHARS]}"
        return info, []
    spec_outs, run_ms = outcome
    info["run_ms"] = round(run_ms, 3)
    second_engine = next(e for e in ENGINES if e != engine)
    try:
        for eng, outs in ((engine, outputs), (second_engine, second_outputs)):
            info["agreement"][eng] = compare_on_model(layer, dict(zip(output_names, outs)),
                                                      dict(zip(output_names, spec_outs)), output_names)
    except Exception as e:  # a non-numeric output: nothing to settle with
        info.update(status="error", message=f"cannot compare with {engine_label(SPEC_FLOAT64)}: "
                                            f"{type(e).__name__}: {e}"[:DETAIL_CHARS], agreement={})
        return info, []
    return info, spec_outs


def _propagated_inputs(path: str | os.PathLike, layer) -> tuple[dict | None, str]:
    """A layer's inputs from its ``inputs.json`` if they fit its declared inputs, else
    ``(None, "generated: <why>")``.

    Raises:
        DamagedWorkFile: a value the record names is gone from the value store (removed
            outside the workflow): the whole-model run must make it again, so the layer
            manifest (the split checkpoint's output) is removed and the message says so.
    """
    try:
        arrays, meta = load_layer_inputs(path, layer)
    except DamagedWorkFile as e:
        if Path(path).is_file():  # the record is fine, a value it names is not: split and run the model again
            Path(path).parent.parent.joinpath(MANIFEST_FILE).unlink(missing_ok=True)
            raise DamagedWorkFile(f"{e}: the whole-model run makes it; removed the layer manifest: run the same "
                                  "command again to split and run the model again") from None
        return None, f"generated (the whole-model run's inputs.json could not be read: {str(e)[:NOTE_CHARS]})"
    except Exception as e:  # unreadable file: generate, and say so
        return None, f"generated (the whole-model run's inputs.json could not be read: {str(e)[:NOTE_CHARS]})"
    if meta.get("fallback"):
        return None, f"generated ({meta['fallback']})"
    for vi in layer.graph.input:
        tt = vi.type.tensor_type
        a = arrays.get(vi.name)
        if a is None:
            return None, f"generated (the whole-model run gave no value for input {vi.name!r})"
        want = [d.dim_value for d in tt.shape.dim]
        try:
            dtype = numpy_dtype(tt.elem_type)
        except Exception:
            dtype = None
        if dtype == np.dtype(object) and a.dtype.kind in "USO":  # strings are stored as unicode arrays
            arrays[vi.name] = a = a.astype(object)
        if list(a.shape) != want or (dtype is not None and a.dtype != dtype):
            return None, (f"generated (input {vi.name!r} is {a.dtype}{list(a.shape)} in the whole-model run, the "
                          f"layer declares {getattr(dtype, 'name', tt.elem_type)}{want})")
    return arrays, f"propagate ({meta.get('source') or 'whole-model run'})"


def reference_outputs(model: "onnx.ModelProto", feeds: dict, output_names: list[str], *,  # noqa: F821
                      intra_op_num_threads: int | None = None, model_path: str | os.PathLike | None = None,
                      timeout_s: float | None = None) -> list:
    """Run ``model`` in ONNX Runtime CPU with graph optimizations off (the reference
    engine) and return ``output_names``' arrays; bfloat16 models widened as
    :func:`torq_gen_config.reference.reference_run.run_reference` describes.

    Args:
        feeds: input name -> array (bf16 arrays as ml_dtypes.bfloat16).
        model_path: the model's file, if any (ONNX Runtime loads it from there).
        timeout_s: wall-clock limit in seconds (None: none).

    Raises:
        Exception: whatever ONNX Runtime raises (callers record it).
    """
    return run_reference(model, feeds, output_names, engine="onnxruntime", timeout_s=timeout_s,
                         model_path=model_path, intra_op_num_threads=intra_op_num_threads)


def load_layer_inputs(path: str | os.PathLike, layer: "onnx.ModelProto") -> tuple[dict, dict]:  # noqa: F821
    """A layer's inputs from its ``inputs.json`` (:func:`propagate_layer_inputs`): ``(arrays
    by name, meta)``, the arrays memory-mapped from the value store; ``meta["fallback"]`` is
    set (and ``arrays`` empty) when the whole-model run could not produce them. An input the
    layer declares BFLOAT16 comes back as ml_dtypes.bfloat16.

    Raises:
        FileNotFoundError: no such file.
        DamagedWorkFile: the record or a value it names is damaged or missing (removed: the
            next run makes it again).
    """
    record, store = read_record(path)
    arrays = store.load_all(record.get("values") or {})
    meta = {k: v for k, v in record.items() if k not in ("values", "values_dir")}
    for vi in layer.graph.input:
        a = arrays.get(vi.name)
        if (a is not None and vi.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16
                and a.dtype.name != "bfloat16" and a.dtype.itemsize == 2 and a.dtype.kind in "uV"):
            arrays[vi.name] = a.view(ml_dtypes.bfloat16)
    return arrays, meta


def propagate_layer_inputs(prepared_path: str | os.PathLike, manifest: dict, layers_dir: str | os.PathLike,
                           model_inputs: str | os.PathLike, *, values_dir: str | os.PathLike,
                           timeout_s: float | None = None, failed: str | None = None) -> dict:
    """The whole-model reference run, and each layer's inputs from it (``--layer-inputs
    propagate``, the default): every layer sees the values it gets in the model.

    The prepared model runs node by node (:func:`torq_gen_config.reference.model_run.run_model_by_node`,
    bounded memory) on the model input values of ``model_inputs``
    (:mod:`torq_gen_config.reference.model_inputs`). Each value a layer receives is put
    into the value store in ``values_dir`` once (:class:`~torq_gen_config.core.value_store.ValueStore`:
    a value read by several layers, or unchanged since the last run, is not written again),
    and each layer's ``<layers_dir>/<slug>/inputs.json`` (a record of references to those
    values) is written as soon as its inputs exist, only when it changed (so unchanged
    layers are not retested). A layer whose inputs the run could not produce (a node
    upstream that neither engine can evaluate) gets an ``inputs.json`` without values
    whose ``fallback`` says why; its reference
    job then generates its inputs (:func:`compute_reference`) and says so. ``failed``:
    the run is not done (it crashed or hung in an earlier attempt, this reason): every
    layer falls back so.

    Returns:
        JSON-safe ``{"model_inputs": source, "layers": N, "rewritten": M,
        "fallback": {slug: reason}, "run": run summary}`` (the summary has ``error``
        when ``failed``).

    Raises:
        ModelError: ``model_inputs`` lacks an input of the model.
    """
    model = load_model(prepared_path, weights=False)  # each node reads its weights from the store
    feeds, meta = load_model_inputs(model_inputs, model)
    source = f"whole-model run on {meta.get('source') or 'model inputs'}"
    layers = [layer for layer in manifest["layers"] if not layer.get("not_testable")]
    waiting: dict[str, list[str]] = {}
    need: dict[str, set[str]] = {}
    got: dict[str, dict] = {}
    order: dict[str, list[str]] = {}
    for layer in layers:
        names = [i["name"] for i in layer["inputs"]]
        order[layer["slug"]] = names
        need[layer["slug"]] = set(names)
        got[layer["slug"]] = {}
        for n in names:
            waiting.setdefault(n, []).append(layer["slug"])
    rewritten = 0

    store = ValueStore(values_dir)
    stored: dict[str, dict] = {}  # tensor name -> its value reference (each value put once)

    def write(slug: str, arrays: dict, extra: dict) -> None:
        nonlocal rewritten
        path = Path(layers_dir) / slug / LAYER_INPUTS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        refs = {}
        for n, a in arrays.items():
            if n not in stored:
                stored[n] = store.put(a)
            refs[n] = stored[n]
        if write_record(path, {"kind": "layer_inputs", "layer": slug, **extra, "values": refs}, store,
                        only_if_changed=True):
            rewritten += 1

    def on_value(name: str, value) -> None:
        for slug in waiting.get(name, ()):
            got[slug][name] = value
            if len(got[slug]) == len(need[slug]):
                arrays = got.pop(slug)
                if any(isinstance(a, list) for a in arrays.values()):
                    continue  # a sequence value: such layers are not testable (the split says so)
                write(slug, {n: arrays[n] for n in order[slug]}, {"source": source})

    for slug, names in order.items():  # layers without run-time inputs
        if not names:
            write(slug, {}, {"source": source})
            got.pop(slug)
    if failed:
        fallback = {slug: f"the whole-model run failed: {failed}" for slug in got}
        for slug, reason in fallback.items():
            write(slug, {}, {"fallback": reason})
        run = {"engines": [], "nodes_run": 0, "seconds": 0.0, "peak_live_bytes": 0, "fallback_nodes": [],
               "failed_nodes": [], "unavailable": {}, "num_unavailable": 0, "error": failed}
        return {"model_inputs": meta.get("source"), "layers": len(layers), "rewritten": rewritten,
                "fallback": fallback, "run": run}
    res = run_model_by_node(model, feeds, on_value=on_value, timeout_s=timeout_s)
    fallback = {}
    for slug, have in got.items():
        missing = [n for n in order[slug] if n not in have]
        why = res["unavailable"].get(missing[0]) if missing else None
        reason = (f"the whole-model run gave no value for input {missing[0]!r}: {why or 'not computed'}"
                  if missing else "the whole-model run gave a sequence value")
        fallback[slug] = reason
        write(slug, {}, {"fallback": reason})
    return {"model_inputs": meta.get("source"), "layers": len(layers), "rewritten": rewritten,
            "fallback": fallback, "run": run_summary(res)}


#: The engine a layer is judged against when ONNX Runtime, the configured reference,
#: fails on it: onnx's reference implementation of the spec (docs/comparison.md, "References").
FALLBACK_ENGINE = "onnx"


def judged_reference(meta: dict, outputs: dict) -> tuple[str | None, dict, str | None]:
    """The reference a layer's verdicts are computed against, from :func:`load_reference`'s
    ``outputs`` and ``meta``: ``(engine, outputs by name, fallback line)``.

    Where the two engines disagree and the spec evaluated in float64 ran
    (``meta["arbiter"]``, :func:`compute_reference`), its outputs (:data:`SPEC_FLOAT64`,
    with a line saying so): a dispute is settled by the spec, not by either engine (issue
    42). Else the configured engine (``meta["engine"]``) when it ran. When it is ``onnxruntime`` and
    ONNX Runtime failed on the layer (error, crash, timeout) but onnx's reference
    implementation ran and gave every output, the latter, with the line
    ``"reference: onnx (ONNX Runtime failed: <first line of its message>)"``. Otherwise
    ``(None, {}, None)``: no reference, the verdicts are ``unverified``. With
    ``--reference onnx`` a failing spec has no fallback: ONNX Runtime is only its second
    opinion (an engine outside the spec cannot stand in for it).
    """
    arbiter, settled = meta.get("arbiter") or {}, meta.get("arbiter_outputs") or {}
    names = meta.get("output_names") or []
    if meta.get("status") == "ok" and arbiter.get("status") == "ok" and names and all(n in settled for n in names):
        return SPEC_FLOAT64, settled, (f"reference: {SPEC_FLOAT64} (the two reference engines are further apart than "
                                       "a tenth of the tolerance; the spec evaluated in float64 is the reference)")
    if meta.get("status") == "ok":
        return meta.get("engine") or "onnxruntime", outputs, None
    second = meta.get("second") or {}
    spec = meta.get("second_outputs") or {}
    if (meta.get("engine") == "onnxruntime" and second.get("engine") == FALLBACK_ENGINE
            and second.get("status") == "ok" and names and all(n in spec for n in names)):
        return FALLBACK_ENGINE, spec, f"reference: {FALLBACK_ENGINE} (ONNX Runtime failed: {_failure_line(meta)})"
    return None, {}, None


def _failure_line(meta: dict) -> str:
    """The first line of a failed engine's message, without the "<engine> failed on the
    layer: " prefix that :func:`compute_reference` puts before it."""
    text = str(meta.get("message") or "").strip()
    text = re.sub(r"^ONNX Runtime failed on [^:]*:", "", text).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "") or f"status {meta.get('status')}"
    return line if len(line) <= NOTE_CHARS else line[:NOTE_CHARS - 3] + "..."


def load_reference(path: str | os.PathLike) -> tuple[dict, dict, dict]:
    """Read a reference: ``(inputs by name, reference outputs by name, meta)``.

    A layer's ``reference.json`` (a record of the value store: the arrays are memory-mapped
    from it) or the whole model's ``reference.npz``. Outputs are empty when the reference
    failed (``meta["status"] != "ok"``); the second engine's outputs are in
    ``meta["second_outputs"]`` (name -> array; empty when it failed, or where its outputs
    were not kept because the engines agree: ``meta["second"]["outputs_kept"]`` False).

    Raises:
        FileNotFoundError: no such file.
        DamagedWorkFile: a layer's record or one of its values is damaged or missing.
    """
    if str(path).endswith(".json"):
        record, store = read_record(path)
        meta = {k: v for k, v in record.items()
                if k not in ("inputs", "outputs", "second_outputs", "arbiter_outputs", "values_dir")}
        try:
            inputs = store.load_all(record.get("inputs") or {})
            outputs = store.load_all(record.get("outputs") or {})
            meta["second_outputs"] = store.load_all(record.get("second_outputs") or {})
            meta["arbiter_outputs"] = store.load_all(record.get("arbiter_outputs") or {})
        except DamagedWorkFile as e:  # the record is made again with its values by the next run
            Path(path).unlink(missing_ok=True)
            raise DamagedWorkFile(f"{e}; removed the layer's {Path(path).name}: run the same command again to make "
                                  "it anew") from None
        meta["input_names"] = meta.get("input_names") or list(inputs)
        return inputs, outputs, meta
    arrays, meta = load_npz(path)
    inputs = {n: arrays[f"input_{i}"] for i, n in enumerate(meta["input_names"])}
    outputs = {n: arrays[f"output_{i}"] for i, n in enumerate(meta["output_names"]) if f"output_{i}" in arrays}
    meta["second_outputs"] = {n: arrays[f"second_output_{i}"] for i, n in enumerate(meta["output_names"])
                              if f"second_output_{i}" in arrays}
    return inputs, outputs, meta
