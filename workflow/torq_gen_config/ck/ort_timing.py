"""The cross-check backend: the configurations' convolutions timed with ONNX Runtime (CPU).

ROCm is not on every machine, so ``ck-profile run --backend onnxruntime`` measures the same
problems with a real library here, and prints the result in ckProfiler's own output format
(a ``Perf:`` line, ``valids``, the best block), parsed by the same code:

- forward: one ``Conv`` (group G, the config's strides, dilations, left/right pads);
- backward data: ``ConvTranspose`` of dY with the same weight (output_padding recovers the
  input size that the forward's floor division lost);
- backward weight: the weight gradient as a ``Conv`` whose batch and channel axes are
  swapped: X as ``[C, G*N, *in]`` convolved with dY as ``[G*K, N, *out]`` (group G, the
  forward's dilations as strides and strides as dilations), cropped to the filter and
  transposed to ``[G*K, C, *filter]``; the reshapes and transposes are part of what is timed.

Each formulation is checked once against a float64 numpy reference of the definition (with N
at most 2) before it is timed. Timing follows ckProfiler (stream_config.hpp): 5 warm-up runs,
then up to 50 timed runs (at least 3, stopped early after ``--max-seconds``); the average is
reported, in fp32 whatever the trace's dtype (ONNX Runtime's CPU provider has no fp16/bf16
convolution kernels). TFLOPS and GB/s use CK's formulas (:mod:`.problem`), with 4-byte elements.

Run as ``python -m torq_gen_config.ck.ort_timing --config-json '<configuration>'``; exit 1
when the numpy check fails.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time


from . import profiler_args as pa
from ..core.lazy import helper, np, onnx, ort
from .problem import ConvProblem, throughput

WARMUP_RUNS, TIMED_RUNS, MIN_RUNS = 5, 50, 3
CHECK_BATCH = 2


def _spatial_slices(tap, problem: ConvProblem, out) -> tuple:
    return tuple(slice(t * d, t * d + (o - 1) * s + 1, s) for t, d, o, s in zip(tap, problem.dilations, out, problem.strides))


def _padded(x: np.ndarray, problem: ConvProblem) -> np.ndarray:
    return np.pad(x, [(0, 0)] * 3 + list(zip(problem.left_pads, problem.right_pads)))


def reference(op: str, problem: ConvProblem, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The definition of each pass in float64 numpy, tap by tap.

    Args:
        op: a CK operation name.
        a, b: fwd: x ``[N, G*C, *in]``, w ``[G*K, C, *f]``; bwd_data: dy ``[N, G*K, *out]``, w;
            bwd_weight: x, dy.

    Returns:
        fwd: y ``[N, G*K, *out]``; bwd_data: dx ``[N, G*C, *in]``; bwd_weight: dw ``[G*K, C, *f]``.
    """
    p, G = problem, problem.G
    out = p.output()
    sp = p.ndim
    if op == pa.FWD:
        x, w = a.astype(np.float64), b.astype(np.float64)
        xp = _padded(x.reshape(x.shape[0], G, p.C, *p.input), p)
        wg = w.reshape(G, p.K, p.C, *p.filter)
        y = np.zeros((x.shape[0], G, p.K, *out))
        for tap in itertools.product(*(range(f) for f in p.filter)):
            xs = xp[(Ellipsis, *_spatial_slices(tap, p, out))]
            y += np.einsum("ngc...,gkc->ngk...", xs, wg[(Ellipsis, *tap)])
        return y.reshape(x.shape[0], G * p.K, *out)
    if op == pa.BWD_DATA:
        dy, w = a.astype(np.float64), b.astype(np.float64)
        n = dy.shape[0]
        dyg = dy.reshape(n, G, p.K, *out)
        wg = w.reshape(G, p.K, p.C, *p.filter)
        dxp = np.zeros((n, G, p.C, *(i + lp + rp for i, lp, rp in zip(p.input, p.left_pads, p.right_pads))))
        for tap in itertools.product(*(range(f) for f in p.filter)):
            dxp[(Ellipsis, *_spatial_slices(tap, p, out))] += np.einsum("ngk...,gkc->ngc...", dyg, wg[(Ellipsis, *tap)])
        crop = tuple(slice(lp, lp + i) for lp, i in zip(p.left_pads, p.input))
        return dxp[(Ellipsis, *crop)].reshape(n, G * p.C, *p.input)
    x, dy = a.astype(np.float64), b.astype(np.float64)
    n = x.shape[0]
    xp = _padded(x.reshape(n, G, p.C, *p.input), p)
    dyg = dy.reshape(n, G, p.K, *out)
    dw = np.zeros((G, p.K, p.C, *p.filter))
    for tap in itertools.product(*(range(f) for f in p.filter)):
        xs = xp[(Ellipsis, *_spatial_slices(tap, p, out))]
        dw[(Ellipsis, *tap)] = np.einsum("ngc" + "xyz"[:sp] + ",ngk" + "xyz"[:sp] + "->gkc", xs, dyg)
    return dw.reshape(G * p.K, p.C, *p.filter)


def build_model(op: str, problem: ConvProblem):
    """A one-pass ONNX model (opset 17, fp32) computing ``op`` on ``problem``.

    Returns:
        ``(model, input shapes)``: inputs ``a`` and ``b`` as in :func:`reference`, output ``y``.
    """
    p = problem
    G, N, sp = p.G, p.N, p.ndim
    out = p.output()
    pads = list(p.left_pads) + list(p.right_pads)
    nodes, inits = [], []

    def const(name, values):
        inits.append(helper.make_tensor(name, onnx.TensorProto.INT64, [len(values)], list(values)))
        return name

    if op == pa.FWD:
        shapes = {"a": [N, G * p.C, *p.input], "b": [G * p.K, p.C, *p.filter]}
        y_shape = [N, G * p.K, *out]
        nodes.append(helper.make_node("Conv", ["a", "b"], ["y"], group=G, strides=list(p.strides),
                                      dilations=list(p.dilations), pads=pads, kernel_shape=list(p.filter)))
    elif op == pa.BWD_DATA:
        shapes = {"a": [N, G * p.K, *out], "b": [G * p.K, p.C, *p.filter]}
        y_shape = [N, G * p.C, *p.input]
        out_pad = [i - (s * (o - 1) + (f - 1) * d + 1 - lp - rp)
                   for i, s, o, f, d, lp, rp in zip(p.input, p.strides, out, p.filter, p.dilations, p.left_pads, p.right_pads)]
        nodes.append(helper.make_node("ConvTranspose", ["a", "b"], ["y"], group=G, strides=list(p.strides),
                                      dilations=list(p.dilations), pads=pads, kernel_shape=list(p.filter),
                                      output_padding=out_pad))
    else:
        shapes = {"a": [N, G * p.C, *p.input], "b": [N, G * p.K, *out]}
        y_shape = [G * p.K, p.C, *p.filter]
        rest = list(range(3, 3 + sp))
        nodes += [helper.make_node("Reshape", ["a", const("xs5", [N, G, p.C, *p.input])], ["x5"]),
                  helper.make_node("Transpose", ["x5"], ["xt"], perm=[2, 1, 0, *rest]),
                  helper.make_node("Reshape", ["xt", const("xs", [p.C, G * N, *p.input])], ["xr"]),
                  helper.make_node("Reshape", ["b", const("ds5", [N, G, p.K, *out])], ["d5"]),
                  helper.make_node("Transpose", ["d5"], ["dt"], perm=[1, 2, 0, *rest]),
                  helper.make_node("Reshape", ["dt", const("ds", [G * p.K, N, *out])], ["dr"])]
        right = [max(0, (f - 1) * d + (o - 1) * s + 1 - i - lp)
                 for f, d, o, s, i, lp in zip(p.filter, p.dilations, out, p.strides, p.input, p.left_pads)]
        nodes.append(helper.make_node("Conv", ["xr", "dr"], ["z"], group=G, strides=list(p.dilations),
                                      dilations=list(p.strides), pads=list(p.left_pads) + right, kernel_shape=list(out)))
        nodes.append(helper.make_node("Slice", ["z", const("st", [0] * sp), const("en", list(p.filter)),
                                                const("ax", list(range(2, 2 + sp)))], ["zc"]))
        nodes.append(helper.make_node("Transpose", ["zc"], ["y"], perm=[1, 0, *range(2, 2 + sp)]))
    graph = helper.make_graph(nodes, f"ck_{pa.SHORT[op]}",
                              [helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, v) for k, v in shapes.items()],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, y_shape)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model, shapes


def _session(model, threads: int | None):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _inputs(shapes: dict, rng) -> dict:
    return {k: rng.uniform(-1.0, 1.0, size=v).astype(np.float32) for k, v in shapes.items()}


def check(op: str, problem: ConvProblem, threads: int | None = None) -> float:
    """Run the formulation with N <= 2 against :func:`reference`.

    Returns:
        The largest absolute error relative to the largest reference magnitude.

    Raises:
        AssertionError: shapes differ or the error exceeds 1e-4 (fp32 sums of this size
            stay far below it; a wrong formulation is off by O(1)).
    """
    small = ConvProblem(**{**problem.__dict__, "N": min(problem.N, CHECK_BATCH)})
    model, shapes = build_model(op, small)
    feeds = _inputs(shapes, np.random.default_rng(0))
    got = _session(model, threads).run(None, feeds)[0]
    want = reference(op, small, feeds["a"], feeds["b"])
    assert got.shape == want.shape, f"shape {got.shape} != reference {want.shape}"
    err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
    assert err <= 1e-4, f"relative difference {err:.3g} from the numpy reference"
    return err


def time_config(config: dict, *, max_seconds: float = 10.0, threads: int | None = None) -> None:
    """Check, time and print one normalized configuration in ckProfiler's output format."""
    op = config["operation_type"]
    p = pa.problem_of_config(config)
    print(f"onnxruntime {ort.__version__} CPUExecutionProvider: {op}, {json.dumps(p.to_dict())}")
    if p.dtype != "fp32":
        print(f"note: timed in fp32 (the configuration's {p.dtype} has no ONNX Runtime CPU convolution kernel)")
    err = check(op, p, threads)
    print(f"check: matches the float64 numpy reference (N={min(p.N, CHECK_BATCH)}, relative difference {err:.2e})")
    model, shapes = build_model(op, p)
    sess = _session(model, threads)
    feeds = _inputs(shapes, np.random.default_rng(1))
    for _ in range(WARMUP_RUNS):
        sess.run(None, feeds)
    times = []
    start = time.perf_counter()
    while len(times) < TIMED_RUNS and (len(times) < MIN_RUNS or time.perf_counter() - start < max_seconds):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1000.0)
    ms = float(np.mean(times))
    tflops, gbs = throughput(p, ms, element_bytes=4)
    name = f"onnxruntime_cpu_{pa.SHORT[op]}_fp32 ({len(times)} timed runs, min {min(times):.4f} ms)"
    print("found 1 instances")
    print(f"Perf: {ms:10.4f} ms, {tflops:.6g} TFlops, {gbs:.6g} GB/s, {name}")
    print("\x1b[36mvalids: 1\x1b[0m")
    print("Best configuration parameters:")
    print(f"name: {name}")
    print(f"avg_time: {ms:.6g}")
    print(f"tflops: {tflops:.6g}")
    print(f"GB/s: {gbs:.6g}")


def main(argv: list[str] | None = None) -> int:
    """Command line of the subprocess the runner starts (one configuration per process)."""
    ap = argparse.ArgumentParser(prog="python -m torq_gen_config.ck.ort_timing",
                                 description="Time one CK grouped-convolution configuration with ONNX Runtime (CPU).")
    ap.add_argument("--config-json", required=True, help="one configuration (JSON text)")
    ap.add_argument("--max-seconds", type=float, default=10.0, help="stop timing after this many seconds (default 10)")
    ap.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: its own)")
    args = ap.parse_args(argv)
    config = pa.normalize_config(json.loads(args.config_json))
    try:
        time_config(config, max_seconds=args.max_seconds, threads=args.threads)
    except AssertionError as e:
        print(f"error: the ONNX Runtime formulation of {config['operation_type']} does not match the numpy "
              f"reference: {e}", file=sys.stderr)
        return 1
    except (MemoryError, Exception) as e:  # one line for the result (numpy's allocation error, ORT's own)
        print(f"error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
