"""Running a model on a reference engine: ONNX Runtime or onnx's reference implementation.

Two engines give the expected outputs of a layer (docs/comparison.md, "References"):

* ``onnxruntime``: ONNX Runtime's CPU execution provider with every graph optimization
  off, one intra-op thread (deterministic), no weight pre-packing (external weights stay
  memory-mapped: the session's own memory is bounded by the values, not the model's
  weights). The default reference.
* ``onnx``: ``onnx.reference.ReferenceEvaluator``, the Python implementation that
  follows the operator specification text (onnx.ai/onnx/operators); slow on big
  tensors, but the second opinion where ONNX Runtime deviates from the spec. Its LRN
  is replaced by the spec page's formula (onnx 1.23's loops over the wrong axis).

Both run a model with bfloat16 tensors widened to float32 (bf16 constants and inputs
upcast exactly) and round its bf16 outputs to bf16 (round to nearest even): ONNX
Runtime CPU has no bf16 kernels for most ops (docs/toolchain.md, 'bf16 and int8'). Both are
bounded in time: ONNX Runtime by ``RunOptions.terminate`` (checked between kernels),
the reference evaluator by a deadline after which its thread is abandoned (it keeps
running in the background until its current op returns; an isolated worker process
would stop it, see the closing notes).
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Any, Callable

from ..core.lazy import np, onnx, ort
from ..core.ort_io import run as run_session  # float8/int4/... feeds and outputs through OrtValues
from ..model.graph import copy_proto
from ..core.external_data import (
    ORT_FOLDER_OPTION,
    detach_locations,
    free_dims,
    is_external,
    load_model,
    load_weights,
    model_tensors,
    session_options,
)
from ..precision.bf16_rounding import round_to_bf16
from ..model.spec_ops import spec_evaluator
from ..precision.widening import widen_bf16_to_fp32, widen_fp32_to_fp64

ENGINES = ("onnxruntime", "onnx")
"""Reference engine names (config ``reference``, ``--reference``)."""

SPEC_FLOAT64 = "onnx-float64"
"""The arbiter of a reference dispute: the spec evaluated in float64 (onnx's reference
implementation on the layer with its float32 tensors widened to float64,
:func:`run_spec_float64`); not a configurable engine."""


class ReferenceTimeout(TimeoutError):
    """A reference engine did not finish within its time limit."""


def engine_version(engine: str) -> str | None:
    """The installed version of a reference engine (``onnxruntime`` or ``onnx``)."""
    try:
        if engine == "onnxruntime":
            return ort.__version__

        return onnx.__version__
    except Exception:  # pragma: no cover - both are dependencies
        return None


def engine_label(engine: str) -> str:
    """A human name of an engine, for messages: "ONNX Runtime", "the ONNX reference
    implementation" or "the spec in float64" (:data:`SPEC_FLOAT64`)."""
    if engine == SPEC_FLOAT64:
        return "the spec in float64"
    return "ONNX Runtime" if engine == "onnxruntime" else "the ONNX reference implementation"


def run_reference(model: "onnx.ModelProto", feeds: dict, output_names: list[str], *,  # noqa: F821
                  engine: str = "onnxruntime", timeout_s: float | None = None,
                  model_path: str | os.PathLike | None = None, intra_op_num_threads: int | None = 1,
                  optimized: bool = False) -> list:
    """Run ``model`` on a reference engine and return the arrays of ``output_names``.

    Args:
        model: the model (a layer, a node, or a whole model).
        feeds: graph input name -> numpy array (bf16 as ``ml_dtypes.bfloat16``).
        output_names: names to fetch, in order.
        engine: ``"onnxruntime"`` or ``"onnx"`` (:data:`ENGINES`).
        timeout_s: wall-clock limit in seconds (None: no limit).
        model_path: the model's file, if any (ONNX Runtime loads it from there).
        intra_op_num_threads: ONNX Runtime intra-op threads (1: deterministic).
        optimized: ONNX Runtime only: all graph optimizations on (``ORT_ENABLE_ALL``:
            fusions, layout transforms, other kernels), the engine as deployed; not a
            reference, the measure of what such an engine differs by (the full model's
            ``optimized`` record, :func:`~torq_gen_config.reference.compute_reference`).

    Returns:
        One numpy array per name (sequence outputs as lists of arrays).

    Raises:
        ReferenceTimeout: the limit was reached.
        ValueError: an unknown engine.
        Exception: whatever the engine raises (callers record the message).
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown reference engine {engine!r}; expected one of {ENGINES}")
    bf16 = has_bfloat16(model)
    folder = None
    if any(is_external(t) for t in model_tensors(model)):
        if engine == "onnxruntime" and model_path is None and not bf16:
            model, folder = detach_locations(model)  # ONNX Runtime reads the stored tensors itself
        elif engine != "onnxruntime" or model_path is None or bf16:
            model = copy_proto(model)  # the engine gets the model from memory: its weights are read in
            load_weights(model)
    if bf16:
        types = {v.name: v.type.tensor_type.elem_type for v in list(model.graph.value_info) + list(model.graph.output)
                 + list(model.graph.input)}
        model = widen_bf16_to_fp32(model)
        model_path = None
        feeds = {k: (np.asarray(v).astype(np.float32) if getattr(np.asarray(v).dtype, "name", "") == "bfloat16" else v)
                 for k, v in feeds.items()}
    if engine == "onnxruntime":
        outs = _run_onnxruntime(model, feeds, output_names, timeout_s=timeout_s, model_path=model_path,
                                intra_op_num_threads=intra_op_num_threads, data_folder=folder, optimized=optimized)
    else:
        outs = call_with_deadline(lambda: _run_onnx_reference(model, feeds, output_names), timeout_s,
                                  what=f"the ONNX reference implementation")
    if bf16:
        outs = [round_to_bf16(o) if types.get(n) == onnx.TensorProto.BFLOAT16 else o for o, n in zip(outs, output_names)]
    return outs


def run_reference_file(model_path: str, feeds: dict, output_names: list[str], engine: str,
                       timeout_s: float | None, intra_op_num_threads: int | None = 1,
                       optimized: bool = False) -> tuple[list, float]:
    """:func:`run_reference` on the model file ``model_path`` (for a worker process:
    the path crosses the process boundary, not the model): ``(outputs, run_ms)``,
    ``run_ms`` the engine's wall time in milliseconds.

    Raises:
        as :func:`run_reference`.
    """
    model = load_model(model_path, weights=False)
    t0 = time.perf_counter()
    outs = run_reference(model, feeds, output_names, engine=engine, timeout_s=timeout_s, model_path=model_path,
                         intra_op_num_threads=intra_op_num_threads, optimized=optimized)
    return outs, (time.perf_counter() - t0) * 1000.0


def _run_onnxruntime(model, feeds: dict, output_names: list[str], *, timeout_s: float | None,
                     model_path, intra_op_num_threads: int | None, data_folder: str | None = None,
                     optimized: bool = False) -> list:
    def options(folder: str | None):
        so = ort.SessionOptions()
        so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimized
                                       else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        if intra_op_num_threads is not None:
            so.intra_op_num_threads = intra_op_num_threads
        so.log_severity_level = 4  # failures come back as exceptions; no stderr noise
        # weights from the store stay memory-mapped (file pages): pre-packing would copy every
        # constant MatMul operand (a 4 GB decoder: 4 GB of anonymous memory); results agree to ~1 ulp
        so.add_session_config_entry("session.disable_prepacking", "1")
        if folder is not None:
            so.add_session_config_entry(ORT_FOLDER_OPTION, folder)
        return so

    try:
        if model_path is not None:
            sess = ort.InferenceSession(str(model_path), session_options(model_path, options(None)),
                                        providers=["CPUExecutionProvider"])
        else:
            sess = ort.InferenceSession(model.SerializeToString(), options(data_folder),
                                        providers=["CPUExecutionProvider"])
    except Exception as refusal:  # onnxruntime's own exception types
        # the prepared model's fixed dims can make an If branch that never runs fail ONNX
        # Runtime's type inference: the model is tried once more with its dims free
        try:
            free, folder = detach_locations(free_dims(model))
            sess = ort.InferenceSession(free.SerializeToString(), options(folder or data_folder),
                                        providers=["CPUExecutionProvider"])
        except Exception:  # refused as well: the first message says what is wrong
            raise refusal from None
    run_options = ort.RunOptions()
    fired = threading.Event()
    timer = None
    if timeout_s is not None:
        def _terminate() -> None:
            fired.set()
            run_options.terminate = True

        timer = threading.Timer(timeout_s, _terminate)
        timer.daemon = True
        timer.start()

    try:
        if timeout_s is None:
            return run_session(sess, list(output_names), dict(feeds), run_options)
        # terminate is checked between kernels only: a kernel that never returns (a Loop
        # of 2**40 iterations) is abandoned after a grace period instead
        return call_with_deadline(lambda: run_session(sess, list(output_names), dict(feeds), run_options),
                                  float(timeout_s) + min(5.0, float(timeout_s)), what="ONNX Runtime")
    except ReferenceTimeout:
        raise
    except Exception:
        if fired.is_set():
            raise ReferenceTimeout(f"ONNX Runtime did not finish within {timeout_s:g} s (terminated)") from None
        raise
    finally:
        if timer is not None:
            timer.cancel()


def run_spec_float64(model: "onnx.ModelProto", feeds: dict, output_names: list[str], *,  # noqa: F821
                     timeout_s: float | None = None) -> list:
    """The operator specification evaluated in float64: onnx's reference implementation
    on ``model`` with every float32 tensor widened to float64
    (:func:`~torq_gen_config.precision.widening.widen_fp32_to_fp64`) and the float32 feeds
    upcast exactly; each output rounded back to its declared type (float32: round to
    nearest). The arbiter where ONNX Runtime and the float32 reference implementation
    disagree (docs/comparison.md, "References"): the formula of the spec page
    (onnx.ai/onnx/operators) computed with 29 more mantissa bits than either engine.

    Returns:
        One numpy array per name of ``output_names``, in the model's declared dtypes.

    Raises:
        ModelError: the widened model fails the ONNX checker.
        ReferenceTimeout: not done within ``timeout_s`` seconds.
        Exception: whatever the evaluator raises (an op without float64 support, ...).
    """
    if any(is_external(t) for t in model_tensors(model)):
        model = copy_proto(model)
        load_weights(model)
    declared = {v.name: v.type.tensor_type.elem_type for v in model.graph.output}
    wide = widen_fp32_to_fp64(model)
    feeds = {k: (np.asarray(v, dtype=np.float64) if np.asarray(v).dtype == np.float32 else v) for k, v in feeds.items()}
    outs = call_with_deadline(lambda: _run_onnx_reference(wide, feeds, output_names), timeout_s,
                              what=engine_label(SPEC_FLOAT64))
    with np.errstate(over="ignore"):  # beyond float32's range: inf, as float32 arithmetic gives
        return [o.astype(np.float32) if declared.get(n) == onnx.TensorProto.FLOAT and isinstance(o, np.ndarray) else o
                for o, n in zip(outs, output_names)]


def run_spec_float64_file(model_path: str, feeds: dict, output_names: list[str],
                          timeout_s: float | None) -> tuple[list, float]:
    """:func:`run_spec_float64` on the model file ``model_path`` (for a worker process):
    ``(outputs, run_ms)``, ``run_ms`` its wall time in milliseconds.

    Raises:
        as :func:`run_spec_float64`.
    """
    model = load_model(model_path, weights=False)
    t0 = time.perf_counter()
    outs = run_spec_float64(model, feeds, output_names, timeout_s=timeout_s)
    return outs, (time.perf_counter() - t0) * 1000.0


def _run_onnx_reference(model, feeds: dict, output_names: list[str]) -> list:
    ev = spec_evaluator(model)
    # an overflow to inf (exp of a large input) is what the spec computes, not news for the console
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        outs = ev.run(list(output_names), dict(feeds))
    return [o if isinstance(o, list) else np.asarray(o) for o in outs]


def call_with_deadline(fn: Callable[[], Any], timeout_s: float | None, *, what: str = "the call") -> Any:
    """Call ``fn()`` and return its result, or raise :class:`ReferenceTimeout` after
    ``timeout_s`` seconds (None: wait). ``fn`` runs in a daemon thread that is
    abandoned on timeout (Python threads cannot be stopped); its exception is re-raised."""
    if timeout_s is None:
        return fn()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=target, daemon=True, name="tgc-deadline")
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise ReferenceTimeout(f"{what} did not finish within {timeout_s:g} s (abandoned)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def has_bfloat16(model: "onnx.ModelProto") -> bool:  # noqa: F821
    """True when any graph input, output, value_info or initializer of ``model``
    (main graph) is BFLOAT16, or a node casts to it."""
    bf = onnx.TensorProto.BFLOAT16
    g = model.graph
    if any(v.type.tensor_type.elem_type == bf for v in list(g.input) + list(g.output) + list(g.value_info)):
        return True
    if any(t.data_type == bf for t in g.initializer):
        return True
    return any(n.op_type == "Cast" and any(a.name == "to" and a.i == bf for a in n.attribute) for n in g.node)
