"""Per-job cost of the supervised workers (torq_gen_config.core.isolation): the same layer
jobs run in this process (``TORQ_GEN_CONFIG_INLINE=1``, what the product did before)
and in a forkserver worker (the product), measured in the same run.

    python benchmarks/worker_overhead.py [--repeat 20] [--layers 5]

Jobs measured, on single-layer models of SqueezeNet's sizes (Conv 3x3 and 1x1, Relu,
MaxPool, Concat on 1x64x55x55 float32):

* ``reference``: a layer's reference job (both engines, :func:`compute_reference`, in
  one worker);
* ``ort``: the ONNX Runtime executor's compile (session) and verification run of the
  layer (``compile_and_run``, one worker, as a layer test does);
* ``empty``: ``time.time()`` in a worker (the bare cost of a worker).

Prints per job the mean wall time (ms) inline and isolated, the difference (ms per job)
and the ratio isolated / inline. The issue's goal: at most +20 ms per job. Workers are
reused (the product's pool); ``--no-reuse`` starts one per call instead, to show what
the pool saves (a fresh worker pays the process start and the libraries' first-use
costs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))


def _time(fn, repeat: int) -> float:
    """Median wall time of ``fn()`` in ms over ``repeat`` calls (after one warm-up round)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20, help="calls per job and mode (default 20)")
    ap.add_argument("--layers", type=int, default=5, help="how many of the 5 layer models to use (default all)")
    ap.add_argument("--no-reuse", action="store_true",
                    help="a new worker for every call (isolation.MAX_USES = 1): what the pool saves")
    args = ap.parse_args()

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from torq_gen_config.core import isolation
    from torq_gen_config.backends import make_backend
    from torq_gen_config.reference import compute_reference, load_reference

    if args.no_reuse:
        isolation.MAX_USES = 1

    tmp = Path(tempfile.mkdtemp(prefix="tgc-overhead-"))
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 55, 55])

    def layer(name, node, out_shape, inits=(), extra_inputs=()):
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)
        g = helper.make_graph([node], name, [x, *extra_inputs], [y], initializer=list(inits))
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        path = tmp / f"{name}.onnx"
        onnx.save(m, path)
        return path

    def weight(name, shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.05, name)

    specs = [
        ("conv3x3", helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]), [1, 64, 55, 55],
         [weight("w", [64, 64, 3, 3])], ()),
        ("conv1x1", helper.make_node("Conv", ["x", "w"], ["y"]), [1, 16, 55, 55], [weight("w", [16, 64, 1, 1])], ()),
        ("relu", helper.make_node("Relu", ["x"], ["y"]), [1, 64, 55, 55], (), ()),
        ("maxpool", helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2]),
         [1, 64, 27, 27], (), ()),
        ("concat", helper.make_node("Concat", ["x", "x2"], ["y"], axis=1), [1, 128, 55, 55], (),
         (helper.make_tensor_value_info("x2", TensorProto.FLOAT, [1, 64, 55, 55]),)),
    ]
    layers = [layer(*spec) for spec in specs][: args.layers]
    ort = make_backend({"name": "ort", "backend": "onnxruntime"})

    def reference_jobs():
        for i, layer in enumerate(layers):
            compute_reference(layer, tmp / f"ref{i}.npz", timeout_s=60)

    def ort_jobs():
        for i, layer in enumerate(layers):
            inputs, _, meta = load_reference(str(tmp / f"ref{i}.npz"))
            ort.compile_and_run(onnx_path=str(layer), mlir_path=None, inputs=inputs, input_names=meta["input_names"],
                                output_names=meta["output_names"], work_dir=str(tmp), timeout_s=60, log_path=None)

    def empty_jobs():
        for _ in layers:
            isolation.run_isolated(time.time, limit_s=60, what="nothing")

    rows = []
    for name, fn in (("empty", empty_jobs), ("reference", reference_jobs), ("ort", ort_jobs)):
        os.environ[isolation.INLINE_ENV] = "1"
        inline = _time(fn, args.repeat) / len(layers)
        del os.environ[isolation.INLINE_ENV]
        isolated = _time(fn, args.repeat) / len(layers)
        rows.append((name, inline, isolated))
    print(f"per job, median of {args.repeat} rounds over {len(layers)} layer models "
          f"({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
          f"{'a new worker per call' if args.no_reuse else 'workers reused'}):")
    print(f"{'job':<10} {'inline ms':>10} {'worker ms':>10} {'+ms':>8} {'ratio':>7}")
    for name, inline, isolated in rows:
        print(f"{name:<10} {inline:>10.1f} {isolated:>10.1f} {isolated - inline:>+8.1f} "
              f"{isolated / inline if inline > 0.05 else float('nan'):>7.2f}")
    worst = max(isolated - inline for name, inline, isolated in rows if name != "empty")
    print(f"largest added cost of a real job: {worst:+.1f} ms (goal <= +20 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
