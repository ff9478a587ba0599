"""Jobs of rules/quantize.smk (``--quantize``, docs/precision.md): calibrate, quantize
the whole model, map the layers onto the quantized model; and the quantization of each
layer, a step of rule ``prepare_unit`` (:func:`quantize_layer_job`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ...core.fileio import read_json, write_bytes_if_changed, write_json
from ...core.isolation import WorkerCrash, WorkerTimeout, run_isolated
from ...core.job_support import in_worker, records_failure
from ...core.layout import QUANTIZED_MODEL_FILE, QUANTIZE_INFO_FILE
from ...core.lazy import onnx
from ...core.logs import append_record
from ...core.limits import DEFAULT_TIMEOUT_S, call_limit, model_job_limit
from ...core.external_data import load_model
from ...precision import quantize
from ...precision.calibration import calibration_samples
from ...precision.layer_mapping import map_layers_to_quantized, mapping_summary, quantized_tensor_names
from ...precision.ort_quantization import QuantizationError
from ...precision.ranges import tensor_ranges
from . import step

@records_failure
def calibrate_job(*, timeout_s: float | None = None, **kwargs) -> None:
    """:func:`_calibrate_job` in a supervised worker (ONNX Runtime runs the model; :func:`in_worker`)."""

    in_worker(_calibrate_job, "the calibration", model_job_limit(timeout_s or DEFAULT_TIMEOUT_S), **kwargs)


def _calibrate_job(*, prepared: str, ranges: str, samples: int, seed: int, float_range: list[float],
                  data: str | None = None, log: str | None = None) -> None:
    """Rule ``calibrate_model``: the calibration samples (``data`` .npz, else ``samples``
    seeded random ones in ``float_range``) run through the FP32 prepared model in
    ONNX Runtime; the min/max of every float tensor go to ``ranges`` (JSON). Each
    layer is quantized with these ranges on its I/O, so it gets the scales it has in
    the whole model.

    Raises:
        QuantizationError: bad calibration data, or ONNX Runtime cannot run the model.
    """
    t0 = time.perf_counter()
    model = onnx.load(prepared)
    data_samples = calibration_samples(model, n=samples, seed=seed, float_range=tuple(float_range), data_path=data)
    rng = tensor_ranges(model, data_samples)
    write_json(ranges, {"source": data or "random", "samples": len(data_samples), "seed": None if data else seed,
                        "float_range": None if data else list(float_range), "ranges": rng})
    append_record(log, f"calibrated {len(rng)} tensors on {len(data_samples)} samples ({data or 'random'}) "
                       f"in {time.perf_counter() - t0:.2f} s")
    print(f"calibration: {len(data_samples)} samples ({data or 'seeded random'}), {len(rng)} tensors", file=sys.stderr)


def _quantize_settings(settings: dict) -> dict:
    return {"quant_format": settings["quant_format"], "per_channel": bool(settings["per_channel"]),
            "full_integer": bool(settings["full_integer"])}


@records_failure
def quantize_full_model_job(*, timeout_s: float | None = None, **kwargs) -> None:
    """:func:`_quantize_full_model_job` in a supervised worker (ONNX Runtime runs the model; :func:`in_worker`)."""

    in_worker(_quantize_full_model_job, "the quantization of the full model", model_job_limit(timeout_s or DEFAULT_TIMEOUT_S), **kwargs)


def _quantize_full_model_job(*, prepared: str, ranges: str, quantized: str, info: str, settings: dict,
                            samples: int, seed: int, float_range: list[float], data: str | None = None,
                            log: str | None = None) -> None:
    """Rule ``quantize_full_model``: the whole FP32 prepared model quantized once
    (``settings``: quant_format, per_channel, full_integer), calibrated on the same
    samples as :func:`calibrate_job` with the ranges of ``ranges`` (so the layers,
    quantized one by one with those ranges, have the same scales).

    Raises:
        QuantizationError: quantization failed (the run stops with the reason; the
            original tool silently fell back to the float model).
    """
    t0 = time.perf_counter()
    model = onnx.load(prepared)
    rng = read_json(ranges, "calibration ranges")["ranges"]
    data_samples = calibration_samples(model, n=samples, seed=seed, float_range=tuple(float_range), data_path=data)
    qmodel, qinfo = quantize.quantize_model(model, ranges=rng, samples=data_samples, **_quantize_settings(settings))
    write_bytes_if_changed(quantized, qmodel.SerializeToString(deterministic=True))

    qinfo["quantized_tensors"] = quantized_tensor_names(qmodel)
    qinfo["quantize_s"] = round(time.perf_counter() - t0, 3)
    write_json(info, qinfo)
    append_record(log, f"quantized the full model: {qinfo}")
    print(f"quantized the full model ({qinfo.get('format_used')}, {qinfo.get('quantized_nodes')} quantized nodes) in "
          f"{qinfo['quantize_s']:.1f} s", file=sys.stderr)
    for w in qinfo.get("warnings") or []:
        print(f"warning: {w}", file=sys.stderr)


@records_failure
def quantize_layer_job(*, timeout_s: float | None = None, **kwargs) -> None:
    """:func:`_quantize_layer_job` in a supervised worker; a hang or a crash of the
    quantizer is recorded like a failed quantization (the layer's tests report it at
    stage ``quantize``, the other layers go on)."""
    try:
        run_isolated(_quantize_layer_job, kwargs=kwargs, limit_s=call_limit(timeout_s or DEFAULT_TIMEOUT_S),
                     what="the quantization of the layer")
    except (WorkerTimeout, WorkerCrash) as e:
        write_bytes_if_changed(kwargs["quantized"], Path(kwargs["layer_onnx"]).read_bytes())
        write_json(kwargs["info"], {"status": "error", "message": str(e), "quant_format": None})
        append_record(kwargs.get("log"), f"quantization of {kwargs['layer_onnx']} stopped: {e}")


def _quantize_layer_job(*, layer_onnx: str, ranges: str, quantized: str, info: str, settings: dict,
                       full_model_info: str | None = None, log: str | None = None) -> None:
    """Step ``quantize_layer`` of rule ``prepare_unit``: one FP32 layer model quantized on its own with the
    whole model's calibration ranges on its inputs and outputs, in the format the
    whole model got (``full_model_info``'s ``format_used``: with ``hybrid`` the
    choice is made once, for the model); float32 I/O that ONNX Runtime leaves float
    when the op is alone (a lone Relu, MaxPool, ...) get QuantizeLinear /
    DequantizeLinear pairs where the whole model holds that tensor quantized
    (``quantized_tensors`` of ``full_model_info``), and stay float where it does not.

    A layer that cannot be quantized does not stop the others: ``info`` gets
    ``status: error`` and the reason, ``quantized`` holds the FP32 layer, and the
    layer's tests record an ``error`` verdict at stage ``quantize``
    (:func:`quantize_failure`).
    """
    t0 = time.perf_counter()
    model = load_model(layer_onnx)
    rng = read_json(ranges, "calibration ranges")["ranges"]
    qsettings = _quantize_settings(settings)
    wrap_only = None
    if full_model_info:
        full = read_json(full_model_info, "quantization info")
        qsettings["quant_format"] = full.get("format_used") or qsettings["quant_format"]
        if full.get("quantized_tensors") is not None:
            wrap_only = set(full["quantized_tensors"])
    try:
        qmodel, qinfo = quantize.quantize_model(model, ranges=rng, samples=None, wrap_unquantized_io=True,
                                                wrap_only=wrap_only, **qsettings)
    except QuantizationError as e:
        write_bytes_if_changed(quantized, model.SerializeToString(deterministic=True))
        write_json(info, {"status": "error", "message": str(e), "quant_format": qsettings["quant_format"]})
        append_record(log, f"quantization of {layer_onnx} failed: {e}")
        print(f"warning: layer {Path(layer_onnx).parent.name} could not be quantized: {e}", file=sys.stderr)
        return
    qinfo["status"] = "ok"
    write_bytes_if_changed(quantized, qmodel.SerializeToString(deterministic=True))
    qinfo["quantize_s"] = round(time.perf_counter() - t0, 3)
    write_json(info, qinfo)
    append_record(log, f"quantized layer {layer_onnx}: {qinfo}")


def quantize_failure(layer_onnx: str) -> str | None:
    """The reason a layer could not be quantized (``quantize.json`` next to its
    quantized model says ``status: error``), or None."""
    p = Path(layer_onnx).parent / QUANTIZE_INFO_FILE
    if Path(layer_onnx).name != QUANTIZED_MODEL_FILE or not p.exists():
        return None
    q = read_json(str(p), "layer quantization info")
    return q.get("message") or "quantization failed" if q.get("status") == "error" else None


@records_failure
def map_quantized_layers_job(*, manifest: str, quantized: str, mapped: str, log: str | None = None) -> None:
    """Rule ``map_quantized_layers``: the layers mapped onto the quantized model's
    nodes (:func:`torq_gen_config.precision.layer_mapping.map_layers_to_quantized`)."""
    man = read_json(manifest, "layer manifest")
    out = map_layers_to_quantized(man, onnx.load(quantized))
    write_json(mapped, out)
    text = mapping_summary(out)
    append_record(log, text)
    print(text, file=sys.stderr)


def quantized_input_ranges(layer_onnx: str, ranges: dict) -> dict[str, list[float]]:
    """Per input of a quantized layer model, the range its test inputs are drawn from:
    a float input its calibrated [min, max] (so values are not saturated, unlike the
    original tool's (-40, 40) inputs against a [-1, 1) calibration), an int8/uint8
    input (``--full-integer``) all values of its type."""
    out = {}
    for vi in onnx.load(layer_onnx, load_external_data=False).graph.input:
        et = vi.type.tensor_type.elem_type
        if et == onnx.TensorProto.INT8:
            out[vi.name] = [-128, 128]
        elif et == onnx.TensorProto.UINT8:
            out[vi.name] = [0, 256]
        elif vi.name in ranges:
            lo, hi = (float(x) for x in ranges[vi.name])
            if hi <= lo:
                hi = lo + 1e-3
            out[vi.name] = [lo, hi]
    return out


@step(feeds_report=True)
def calibrate_model(input, output, params, log) -> None:
    """Rule ``calibrate_model``: calibration.json (:func:`calibrate_job`)."""
    calibrate_job(prepared=input.model, ranges=output.ranges, samples=params.samples, seed=params.seed,
                  float_range=params.float_range, data=input.data[0] if input.data else None,
                  timeout_s=params.timeout_s, log=log[0])


@step(feeds_report=True)
def quantize_full_model(input, output, params, log) -> None:
    """Rule ``quantize_full_model``: the quantized model and its info (:func:`quantize_full_model_job`)."""
    quantize_full_model_job(prepared=input.model, ranges=input.ranges, quantized=output.model, info=output.info,
                            settings=params.settings, samples=params.samples, seed=params.seed,
                            float_range=params.float_range, data=input.data[0] if input.data else None,
                            timeout_s=params.timeout_s, log=log[0])


@step(feeds_report=True)
def map_quantized_layers(input, output, params, log) -> None:
    """Rule ``map_quantized_layers``: the layers mapped onto the quantized model
    (:func:`map_quantized_layers_job`)."""
    map_quantized_layers_job(manifest=input.manifest, quantized=input.model, mapped=output.manifest, log=log[0])
