#!/usr/bin/env python
"""Benchmark: does ONNX Runtime run ONNX's own node tests on generated inputs?

Over the node tests shipped in the onnx wheel (``onnx.backend.test.case.node.collect_testcases``;
``*_expanded*`` function expansions and models with sequence/optional graph inputs or
outputs left out), for every model that ONNX Runtime (CPU, optimizations off) can load:

  - the figure: the share of models whose ORT run fails on the values of
    ``torq_gen_config.inputs.generate.generate_inputs`` (run through
    ``torq_gen_config.core.ort_io.run``), as "X of Y (Z%)";
  - the baseline, measured in the same run: the uniform per-dtype generator that came
    before the op rules (reimplemented below: floats in [-1, 1), ints in [-40, 40),
    uint8 in [0, 80), bools, index inputs of Gather/GatherElements/ScatterElements/
    GatherND/ScatterND bounded by the indexed dim, 0 dims made 1) fed with plain
    ``session.run``; and the same baseline values fed through ``ort_io.run`` (what the
    dtype handling alone changes);
  - how many successful runs produce outputs whose shapes differ from the model's
    declared output shapes (values the op accepts but that do not match the graph);
  - with ``--show-failures``: the failing tests grouped by op type and message, each
    marked with whether ORT also fails on the test's own input values (then the
    failure is ONNX Runtime's, whatever the values).

Usage: python benchmarks/generated_inputs.py [--sample N] [--seed S] [--show-failures] [--match TEXT]
About 1-2 minutes for all ~1300 loadable models on one core.
"""

from __future__ import annotations

import argparse
import collections
import random
import re
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))


# --------------------------------------------------------------------- the baseline generator
_OLD_INDEX_INPUTS = {("Gather", 1): "gather", ("GatherElements", 1): "gather", ("ScatterElements", 1): "gather",
                     ("GatherND", 1): "gathernd", ("ScatterND", 1): "gathernd"}


def baseline_inputs(model, seed: int) -> dict:
    """The generator before the op rules (make_inputs of the former module
    torq_gen_config.input_generation up to commit e54ac8a), reimplemented: uniform values
    per dtype, index inputs bounded."""
    import numpy as np
    from onnx import helper

    rng = np.random.default_rng(seed)
    shapes = {}
    for vi in list(model.graph.input) + list(model.graph.value_info):
        tt = vi.type.tensor_type
        if tt.HasField("shape"):
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else 0 for d in tt.shape.dim]
    for t in model.graph.initializer:
        shapes[t.name] = list(t.dims)
    names = {vi.name for vi in model.graph.input}
    bounds = {}
    for node in model.graph.node:
        for pos, t in enumerate(node.input):
            kind = _OLD_INDEX_INPUTS.get((node.op_type, pos))
            data_shape = shapes.get(node.input[0])
            if kind is None or t not in names or not data_shape:
                continue
            if kind == "gather":
                axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 0)
                dim = data_shape[axis % len(data_shape)]
            else:
                dim = min(d for d in data_shape if d > 0) if any(d > 0 for d in data_shape) else 1
            if dim > 0:
                bounds[t] = min(bounds.get(t, dim), dim)
    feeds = {}
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tt.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if vi.name in bounds:
            feeds[vi.name] = rng.integers(0, max(1, bounds[vi.name]), size=shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[vi.name] = rng.integers(0, 2, size=shape).astype(np.bool_)
        elif np.issubdtype(dtype, np.integer):
            lo, hi = (0, 80) if dtype == np.uint8 else (-40, 40)
            info = np.iinfo(dtype)
            feeds[vi.name] = rng.integers(max(lo, info.min), min(hi, int(info.max) + 1), size=shape).astype(dtype)
        else:
            feeds[vi.name] = rng.uniform(-1.0, 1.0, size=shape).astype(np.float32).astype(dtype)
    return feeds


# --------------------------------------------------------------------- helpers
def tensor_io_only(model) -> bool:
    return all(v.type.HasField("tensor_type") for v in list(model.graph.input) + list(model.graph.output))


def short(e: BaseException) -> str:
    """First line of an error, without ORT's source-location boilerplate."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    msg = re.sub(r"\[ONNXRuntimeError\] : \d+ : \w+ : ", "", msg)
    msg = re.sub(r"Non-zero status code returned while running (\w+) node\. Name:'[^']*' Status Message: ",
                 r"\1: ", msg)
    msg = re.sub(r"/onnxruntime_src/\S+:\d+ ", "", msg)
    msg = re.sub(r"onnxruntime::\S+\([^)]*\)( const)? ", "", msg)
    return msg[:220]


def group_key(msg: str) -> str:
    return re.sub(r"-?\d+(\.\d+)?", "N", msg)[:160]


def declared_shapes(model) -> dict:
    out = {}
    for o in model.graph.output:
        tt = o.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            out[o.name] = tuple(d.dim_value for d in tt.shape.dim)
    return out


def own_inputs_note(sess, case, ort_io) -> str:
    """" [ORT fails on the test's own inputs too]" when it does (an ONNX Runtime
    limitation, not a matter of generated values); "" otherwise."""
    if not case.data_sets:
        return ""
    names = [i.name for i in case.model.graph.input]
    try:
        ort_io.run(sess, None, dict(zip(names, case.data_sets[0][0])))
    except Exception:
        return " [ORT fails on the test's own inputs too]"
    return " [ORT runs the test's own inputs]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample", type=int, help="test a random sample of N node tests (drawn with --seed)")
    ap.add_argument("--seed", type=int, default=1234, help="input seed (and sample seed); default 1234")
    ap.add_argument("--show-failures", action="store_true", help="list the failing tests by op and message")
    ap.add_argument("--match", help="only node tests whose name contains TEXT (for iterating on one op)")
    args = ap.parse_args()

    warnings.filterwarnings("ignore")
    import onnxruntime as ort
    from onnx.backend.test.case.node import collect_testcases

    from torq_gen_config.core import ort_io
    from torq_gen_config.inputs.generate import generate_inputs

    t0 = time.perf_counter()
    cases = collect_testcases(None)
    n_all = len(cases)
    cases = [c for c in cases if "_expanded" not in c.name]
    n_expanded = n_all - len(cases)
    if args.match:
        cases = [c for c in cases if args.match in c.name]
    if args.sample and args.sample < len(cases):
        cases = sorted(random.Random(args.seed).sample(cases, args.sample), key=lambda c: c.name)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 4
    counts = collections.Counter()
    fails, base_fails, mismatches = [], [], []
    for c in cases:
        m = c.model
        if not tensor_io_only(m):
            counts["sequence/optional I/O"] += 1
            continue
        try:
            sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception:
            counts["ORT cannot load"] += 1
            continue
        counts["loadable"] += 1
        ops = "+".join(sorted({n.op_type for n in m.graph.node})) or "-"
        try:
            base = baseline_inputs(m, args.seed)
        except Exception as e:  # e.g. a dtype the old mapping lacks
            base = None
            base_fails.append((c.name, ops, f"generate: {short(e)}"))
        if base is not None:
            try:
                sess.run(None, base)
            except Exception as e:
                base_fails.append((c.name, ops, short(e)))
            try:
                ort_io.run(sess, None, base)
            except Exception:
                counts["baseline values + ort_io fail"] += 1
        else:
            counts["baseline values + ort_io fail"] += 1
        try:
            feeds = generate_inputs(m, {"seed": args.seed})
        except Exception as e:
            fails.append((c.name, ops, f"generate_inputs: {type(e).__name__}: {short(e)}"))
            continue
        try:
            outs = ort_io.run(sess, None, feeds)
        except Exception as e:
            fails.append((c.name, ops, short(e) + own_inputs_note(sess, c, ort_io)))
            continue
        want = declared_shapes(m)
        got = {o.name: tuple(a.shape) for o, a in zip(sess.get_outputs(), outs)}
        bad = {k: (want[k], got[k]) for k in want if k in got and want[k] != got[k]}
        if bad:
            mismatches.append((c.name, ops, bad))
    y = counts["loadable"]
    pct = lambda k: f"{k} of {y} ({100.0 * k / y:.1f}%)" if y else f"{k} of 0"  # noqa: E731
    which = (f" (sample of {args.sample}, seed {args.seed})" if args.sample else "") + \
        (f" matching {args.match!r}" if args.match else "")
    print(f"node tests: {n_all} collected, {n_expanded} *_expanded* left out, {len(cases)} considered{which}; "
          f"{counts['sequence/optional I/O']} with sequence/optional I/O left out, "
          f"{counts['ORT cannot load']} that ONNX Runtime {ort.__version__} cannot load, {y} loadable")
    print(f"ORT run fails on generate_inputs values:        {pct(len(fails))}")
    print(f"baseline: uniform per dtype, session.run:        {pct(len(base_fails))}")
    print(f"          uniform per dtype, through ort_io.run: {pct(counts['baseline values + ort_io fail'])}")
    print(f"successful runs whose output shapes differ from the declared ones: {len(mismatches)} of {y - len(fails)}")
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.show_failures:
        groups = collections.defaultdict(list)
        for name, ops, msg in fails:
            groups[(ops, group_key(msg))].append((name, msg))
        print(f"\nfailures on generate_inputs values, by op and message ({len(fails)}):")
        for (ops, _), items in sorted(groups.items(), key=lambda kv: (kv[0][0], -len(kv[1]))):
            print(f"  {ops} ({len(items)}): {items[0][1]}")
            print(f"      {', '.join(n for n, _ in items)}")
        if mismatches:
            print(f"\noutput shapes differ from the declared ones ({len(mismatches)}):")
            for name, ops, bad in mismatches:
                print(f"  {ops}: {name}: " + "; ".join(f"{k} declared {w} got {g}" for k, (w, g) in bad.items()))


if __name__ == "__main__":
    main()
