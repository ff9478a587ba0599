#!/usr/bin/env python
"""Benchmark: the product against ONNX's own node tests.

Node tests: ``onnx.backend.test.case.node.collect_testcases(None)`` from the installed
onnx wheel; ``*_expanded*`` function expansions and models with sequence/optional graph
inputs or outputs are left out. Tests whose model ONNX Runtime (CPU, optimizations off)
cannot load are counted separately: "tests ORT can load" is the denominator of figures
1 and 2 (they are still run through discovery, for figure 3).

Each test is one subprocess::

    python -m torq_gen_config discover --model M --output-dir D -j 1 -q \
        --input-data IN.npz --skip-executors <all configured executors but --executor> \
        --timeout <half of --timeout>

(``IN.npz`` = the test's own inputs, ``data_sets[0]``; TensorProto values through
``onnx.numpy_helper.to_array``, object arrays of ``str`` as unicode arrays, ml_dtypes
arrays as ``numpy.savez`` writes them.) Then the report JSON and the layer files
(``D/work/<name>/layers/manifest.json``, ``<slug>/reference.npz``, ``<slug>/<executor>/result.json``)
are read. Every model output is looked up in the manifest as the output of a layer
(node tests are one node: one layer whose outputs are the model's outputs; a model output
that no layer writes is its own category, "no layer").

Figures (default mode):

1. **reference vs expected**: the layer reference's outputs (the configured engine,
   ONNX Runtime by default) against ONNX's expected outputs, with the test's own
   ``rtol``/``atol`` (every onnx 1.23 node test carries them: 1e-3 / 1e-7; the fall-back
   for a case without them is rtol=1e-3, atol=1e-5): floats (also bfloat16, float8,
   float4) ``|r - e| <= atol + rtol * |e|`` in float64 with NaN equal to NaN and equal
   infinities equal; integers (also int4/int2), bools and strings exactly; the dtype and
   shape must be the expected ones. Also checked: the layer's stored inputs are the
   test's inputs (bit for bit), otherwise the comparison would be meaningless ("inputs
   differ"). Goal >= 97% of the tests ORT can load.
2. **verdict agreement**: the product does not store an executor's outputs in a form
   meant to be read back (IREE's ``out_<i>.npy`` files stay in the job directory, ONNX
   Runtime's are not written), so the compiled layer is run again with the product's own
   backend (``make_backend(executor).run(...)``; IREE: ``<slug>/<executor>/module.vmfb``
   with the MLIR signature, ONNX Runtime: a session on ``<slug>/model.onnx``) on the
   layer's stored inputs (those the verdict was computed on). Those outputs are compared
   with ONNX's expected outputs **by the product's own rule** (``compare.judge``, with
   the report's default tolerance), i.e. the verdict the product
   would have given with the expected outputs as its reference. The test agrees when the
   verdict is ``success`` iff that comparison is ``success``. Disagreements are a
   *false success* (the executor is wrong the way the reference is) or a *false
   difference* (the reference is wrong, the executor right). ``error``, ``unverified``,
   ``not testable`` (and a rerun that fails) are their own categories, outside the
   denominator (tests ORT can load with a ``success``/``difference`` verdict).
   Goal >= 98%. As a second, stricter column the executor's outputs are also checked
   with the test's rtol/atol (figure 1's rule), for information.
3. **refusals**: discover exits non-zero, times out, or writes no report; each with
   its one-line error. Goal 0 for valid models (ORT-loadable and not, listed apart).
4. **median seconds per test**: wall time of the discover subprocess.

``--generated``: the same tests without ``--input-data`` (op-aware generated model
inputs, docs/inputs.md); the figure is the share of layers (of the tests ORT can load)
whose reference failed (``reference.npz`` meta ``status != "ok"``); goal <= 5%. Not
testable layers (no reference) are counted apart. Refusals and the median time are
printed too.

Failures are grouped by op type and first line of the message; ``--json FILE`` writes
one row per test (name, op types, categories, messages, seconds).

Usage::

    python benchmarks/conformance.py --sample 40 --seed 1 --jobs 2
    python benchmarks/conformance.py --jobs 2 --json conf.json            # all ~1380 tests
    python benchmarks/conformance.py --jobs 2 --generated --json gen.json

The node tests, figure 1's rule, the discover command, its refusal message and the re-run of a
compiled layer are the product's (``torq_gen_config.conformance``, also behind
``torq-gen-config conformance``, which writes an op type x executor support matrix for all
executors: README, "Conformance: ONNX's node tests").

Median 2.2 s per test (process start-up, Snakemake, compile): all 1381 tests in about 30 min
with --jobs 2 on 2 cores. Results and their causes: docs/comparison.md, "Conformance benchmark".
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

GOALS = {"fig1": 97.0, "fig2": 98.0, "fig3": 0.0, "gen": 5.0}

# the node tests, the expected-output rule, the discover subprocess and the re-run of a compiled
# layer are the product's own (torq_gen_config.conformance, shared with `torq-gen-config conformance`)
from torq_gen_config.conformance.cases import as_array, collect, op_types, tolerances, widen  # noqa: E402
from torq_gen_config.conformance.discovery import (discover_command, discover_env, first_line,  # noqa: E402
                                                   read_discovery, refusal_message, reports_in, rerun_executor,
                                                   run_discover, tidy)
from torq_gen_config.conformance.evaluate import reference_check  # noqa: E402
from torq_gen_config.conformance.expected import close_to_expected  # noqa: E402


def evaluate(case, d: Path, args, executor: dict, generated: bool) -> dict:
    """Everything this benchmark reads from one finished discovery in ``d``."""
    import onnx

    from torq_gen_config.compare import judge
    from torq_gen_config.reference import load_reference

    row: dict = {}
    disc = read_discovery(d)
    report, manifest, layers_dir, ops = disc.report, disc.manifest, disc.layers_dir, disc.ops
    tolerance = report.get("default_tolerance")
    model_outputs = [o.name for o in case.model.graph.output]
    expected = {n: as_array(v) for n, v in zip(model_outputs, case.data_sets[0][1])}
    rtol, atol = tolerances(case)
    row["layers"] = len(manifest["layers"])

    # ---- every layer: reference status (the generated figure) and its verdict
    layer_rows = []
    for L in manifest["layers"]:
        lid, slug = L["layer_id"], L["slug"]
        op = ops.get(lid) or {}
        lr = {"layer": lid, "op_type": L["op_type"]}
        if op.get("not_testable_reason"):
            lr["reference"] = "not testable"
            lr["message"] = first_line(op["not_testable_reason"])
        else:
            ref = layers_dir / slug / "reference.npz"
            if not ref.is_file():
                lr["reference"] = "missing"
                lr["message"] = "no reference.npz"
            else:
                _, _, meta = load_reference(ref)
                lr["reference"] = "ok" if meta.get("status") == "ok" else "failed"
                if meta.get("status") != "ok":
                    lr["message"] = first_line(meta.get("message") or "")
                lr["layer_inputs"] = meta.get("layer_inputs")
        res = disc.result(L, executor["name"])
        lr["verdict"] = res["status"] if res else ("not testable" if op.get("not_testable_reason") else "missing")
        layer_rows.append(lr)
    row["layer_rows"] = layer_rows
    if generated:
        return row

    # ---- figure 1: the references of the layers that write model outputs (the product's check)
    out_layers, missing = disc.output_layers(model_outputs)
    row["output_layers"] = [L["layer_id"] for L in out_layers]
    check, loaded = reference_check(disc, case, out_layers, missing)
    fig1, msg1 = check["status"], check["message"]
    if check["second_engine_mismatch"]:
        row["second_engine_mismatch"] = check["second_engine_mismatch"]
    if check["reference_dispute"]:
        row["reference_dispute"] = True
    row["fig1"], row["fig1_message"] = fig1, msg1

    # ---- figure 2: verdict of the chosen executor vs its outputs against the expected ones
    verdicts = []
    for L in out_layers:
        r = disc.result(L, executor["name"])
        op = ops.get(L["layer_id"]) or {}
        if op.get("not_testable_reason"):
            verdicts.append(("not testable", first_line(op["not_testable_reason"]), L))
        elif r is None:
            verdicts.append(("missing", "no result.json", L))
        else:
            fr = r.get("failure_report") or {}
            verdicts.append((r["status"], fr.get("summary"), L))
    statuses = [v[0] for v in verdicts]
    if missing or not verdicts:
        fig2, msg2, verdict = "no layer", msg1, None
    elif any(s not in ("success", "difference") for s in statuses):
        first = next(v for v in verdicts if v[0] not in ("success", "difference"))
        fig2, msg2, verdict = first[0], first_line(first[1] or ""), first[0]
    else:
        verdict = "success" if all(s == "success" for s in statuses) else "difference"
        exec_ok, strict_ok, msg2 = True, True, None
        try:
            for status, summary, L in verdicts:
                ins, outs, meta = loaded.get(L["layer_id"]) or load_reference(layers_dir / L["slug"] / "reference.npz")
                work = d / "conformance_rerun" / L["slug"]
                got = rerun_executor(executor, layers_dir / L["slug"], executor["name"], ins, meta, work,
                                     args.timeout)
                names = [n for n in meta["output_names"] if n in expected]
                layer_model = onnx.load(str(layers_dir / L["slug"] / "model.onnx"))
                st, summ, metrics = judge({n: got[n] for n in names}, {n: expected[n] for n in names}, names,
                                          tolerance, model=layer_model)
                if st != "success":
                    exec_ok = False
                    msg2 = msg2 or f"{L['layer_id']}: executor vs expected: {summ}"
                for n in names:
                    why = close_to_expected(got[n], expected[n], rtol, atol)
                    if why:
                        strict_ok = False
                        row.setdefault("executor_strict_message", f"output {n!r}: {why}")
                if status != "success" and summary:
                    row.setdefault("verdict_summary", first_line(summary))
        except Exception as e:  # the rerun itself failed: its own category
            fig2, msg2 = "rerun failed", f"{type(e).__name__}: {first_line(str(e))}"
        else:
            row["executor_matches_expected"] = exec_ok
            row["executor_matches_expected_strict"] = strict_ok
            if verdict == "success":
                fig2 = "agree (success)" if exec_ok else "false success"
            else:
                fig2 = "false difference" if exec_ok else "agree (difference)"
            if fig2 == "false difference":
                msg2 = row.get("verdict_summary")
    row["verdict"], row["fig2"], row["fig2_message"] = verdict, fig2, msg2
    return row


def run_one(case, loadable: bool, root: Path, args, executor: dict, others: list[str], env: dict,
            generated: bool) -> dict:
    import numpy as np
    import onnx

    d = root / case.name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    model_path = d / "model.onnx"
    onnx.save(case.model, str(model_path))
    row = {"name": case.name, "ops": op_types(case.model), "ort_loadable": loadable}
    if not generated:
        names = [i.name for i in case.model.graph.input]
        arrays = {n: as_array(v) for n, v in zip(names, case.data_sets[0][0])}
        if args.widen_inputs:
            arrays = {n: widen(a) for n, a in arrays.items()}
        np.savez(d / "inputs.npz", **arrays)
    cmd = discover_command(model_path, d / "out", tool_timeout_s=args.timeout // 2, skip_executors=others,
                           input_data=None if generated else d / "inputs.npz")
    rc, out, err, secs = run_discover(cmd, d, args.timeout, env)
    row["rc"], row["seconds"] = rc, round(secs, 2)
    (d / "discover.stdout").write_text(out or "")
    (d / "discover.stderr").write_text(err or "")
    reports = reports_in(d / "out")
    if rc is None:
        row["refused"] = f"timed out after {args.timeout:g} s"
    elif rc != 0:
        row["refused"] = f"exit {rc}: {refusal_message(out, err)}"
    elif not reports:
        row["refused"] = "exit 0 but no report JSON"
    if "refused" not in row:
        try:
            row.update(evaluate(case, d / "out", args, executor, generated))
        except Exception as e:  # a bug of this script, or a file the product did not write
            import traceback

            row["benchmark_error"] = f"{type(e).__name__}: {e}"
            row["benchmark_traceback"] = traceback.format_exc()[-2000:]
    if args.cleanup:
        shutil.rmtree(d, ignore_errors=True)
    return row


# --------------------------------------------------------------------- printing
def pct(k: int, n: int) -> str:
    return f"{k} of {n} ({100.0 * k / n:.1f}%)" if n else f"{k} of 0"


def group_key(msg: str) -> str:
    msg = re.sub(r"/\S+", "PATH", msg or "")
    return re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "N", msg)[:140]


def breakdown(items: list[tuple[str, str, str]], title: str, limit_names: int = 12) -> None:
    """items: (test name, ops, message)."""
    if not items:
        return
    groups = collections.defaultdict(list)
    for name, ops, msg in items:
        msg = tidy(msg)
        groups[(ops, group_key(msg))].append((name, msg))
    print(f"\n{title} ({len(items)}):")
    for (ops, _), its in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0][0])):
        names = ", ".join(n for n, _ in its[:limit_names]) + (f", ... (+{len(its) - limit_names})"
                                                                if len(its) > limit_names else "")
        print(f"  {ops} ({len(its)}): {its[0][1]}")
        print(f"      {names}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample", type=int, help="a random sample of N node tests (drawn with --seed)")
    ap.add_argument("--seed", type=int, default=1, help="sample seed (default 1)")
    ap.add_argument("--match", help="only node tests whose name matches the regular expression RE (re.search)")
    ap.add_argument("--widen-inputs", action="store_true",
                    help="write ml_dtypes inputs other than bfloat16 (float8, float4, int4, int2, ...) widened to "
                         "float32 / int8 / uint8 (exact values) instead of as numpy.savez stores them: a work-around "
                         "for --input-data refusing them (see the report)")
    ap.add_argument("--jobs", "-j", type=int, default=1, help="discoveries run at once (default 1)")
    ap.add_argument("--out", help="directory for the per-test work directories (kept); default a temporary "
                                  "directory, removed test by test")
    ap.add_argument("--executor", default="llvm-cpu", help="the executor to test (default llvm-cpu); the other "
                                                           "configured executors are skipped")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds per discovery (default 600); discover's own per-tool limit is half of it")
    ap.add_argument("--generated", action="store_true",
                    help="the second figure: generated model inputs (no --input-data); layers whose reference fails")
    ap.add_argument("--json", help="write one row per test to FILE")
    ap.add_argument("--keep", action="store_true", help="keep the work directories of a temporary --out")
    args = ap.parse_args()

    warnings.filterwarnings("ignore")
    import numpy as np  # noqa: F401
    import onnxruntime as ort
    import yaml

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    executors = {e["name"]: e for e in config["executors"]}
    if args.executor not in executors:
        sys.exit(f"unknown executor {args.executor!r}; config/config.yaml has {list(executors)}")
    executor = executors[args.executor]
    others = [n for n in executors if n != args.executor]

    t_start = time.perf_counter()
    sel = collect(match=args.match, sample=args.sample or None, seed=args.seed)
    cases, n_all, n_expanded, n_seq, n_considered = (sel.cases, sel.collected, sel.expanded, sel.non_tensor_io,
                                                     sel.considered)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    ort_loadable = {}
    for c in cases:
        try:
            ort.InferenceSession(c.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            ort_loadable[c.name] = True
        except Exception:
            ort_loadable[c.name] = False

    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="conformance_"))
    root.mkdir(parents=True, exist_ok=True)
    args.cleanup = not args.out and not args.keep
    env = discover_env()

    rows = []
    done = 0
    with cf.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futs = {pool.submit(run_one, c, ort_loadable[c.name], root, args, executor, others, env, args.generated): c
                for c in cases}
        for f in cf.as_completed(futs):
            c = futs[f]
            try:
                row = f.result()
            except Exception as e:
                row = {"name": c.name, "ops": op_types(c.model), "ort_loadable": ort_loadable[c.name],
                       "benchmark_error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            done += 1
            if done % 20 == 0 or done == len(cases):
                el = time.perf_counter() - t_start
                print(f"[{done}/{len(cases)}] {el:.0f} s", file=sys.stderr, flush=True)
    rows.sort(key=lambda r: r["name"])
    if args.cleanup:
        shutil.rmtree(root, ignore_errors=True)
    total_s = time.perf_counter() - t_start

    loadable = [r for r in rows if r["ort_loadable"]]
    unloadable = [r for r in rows if not r["ort_loadable"]]
    which = (f"sample of {args.sample}, seed {args.seed}" if args.sample and args.sample < n_considered
             else "all") + (f", matching {args.match!r}" if args.match else "")
    import onnx

    from torq_gen_config.reference.reference_run import engine_version

    print(f"\nnode tests (onnx {onnx.__version__}, onnxruntime {ort.__version__}): {n_all} collected, {n_expanded} "
          f"*_expanded* and {n_seq} with sequence/optional I/O left out, {n_considered} considered; "
          f"{len(rows)} run ({which}); {len(loadable)} that ONNX Runtime can load, {len(unloadable)} it cannot")
    ref_engine = config.get("reference", "onnxruntime")
    inputs_kind = ("generated (no --input-data)" if args.generated else
                   "the tests' own (--input-data" + (", ml_dtypes widened" if args.widen_inputs else "") + ")")
    print(f"executor: {args.executor} (skipped: {','.join(others) or '-'}); "
          f"inputs: {inputs_kind}; reference engine {ref_engine} {engine_version(ref_engine)}")
    bench_errors = [r for r in rows if r.get("benchmark_error")]

    refused = [r for r in rows if r.get("refused")]
    refused_l = [r for r in refused if r["ort_loadable"]]
    secs = [r["seconds"] for r in rows if r.get("seconds") is not None]
    med = statistics.median(secs) if secs else float("nan")

    if not args.generated:
        ok1 = [r for r in loadable if r.get("fig1") == "match"]
        print(f"\n1. reference matches ONNX's expected outputs: {pct(len(ok1), len(loadable))}   "
              f"[goal >= {GOALS['fig1']:g}%]")
        c1 = collections.Counter(r.get("fig1") or ("refused" if r.get("refused") else "benchmark error")
                                 for r in loadable)
        print("   categories: " + ", ".join(f"{k} {v}" for k, v in c1.most_common()))
        ran = [r for r in loadable if not r.get("refused")]
        print(f"   (of the tests ORT can load that discover did not refuse: {pct(len(ok1), len(ran))})")
        tested = [r for r in ran if r.get("fig1") != "no layer"]
        print(f"   (of those with a layer to test -- a model whose only node is a constant (Shape, Size, Constant) "
              f"is folded and has none: {pct(len(ok1), len(tested))})")
        in2 = [r for r in loadable if r.get("fig2") in ("agree (success)", "agree (difference)", "false success",
                                                        "false difference")]
        agree = [r for r in in2 if r["fig2"].startswith("agree")]
        print(f"\n2. verdict ({args.executor}) agrees with its output vs the expected outputs: "
              f"{pct(len(agree), len(in2))}"
              f"   [goal >= {GOALS['fig2']:g}%]  (tests ORT can load with a success/difference verdict)")
        c2 = collections.Counter(r.get("fig2") or ("refused" if r.get("refused") else "benchmark error")
                                 for r in loadable)
        print("   categories: " + ", ".join(f"{k} {v}" for k, v in c2.most_common()))
        strict = [r for r in in2 if r.get("executor_matches_expected_strict")]
        dis = [r for r in in2 if not r["fig2"].startswith("agree")]
        print(f"   of the {len(dis)} disagreements, {sum(1 for r in dis if r.get('reference_dispute'))} are layers the "
              f"product lists as reference disputes (ONNX Runtime vs the ONNX reference implementation)")
        print(f"   (for information: executor output within the test's own rtol/atol: {pct(len(strict), len(in2))}; "
              f"verdict success: {sum(1 for r in in2 if r['verdict'] == 'success')})")
        c2u = collections.Counter(r.get("fig2") or ("refused" if r.get("refused") else "benchmark error")
                                  for r in unloadable)
        if unloadable:
            print("   tests ORT cannot load (not in the figures): "
                  + ", ".join(f"{k} {v}" for k, v in c2u.most_common()))
        sec_bad = [r for r in loadable if r.get("second_engine_mismatch")]
        print(f"   (second opinion, ONNX reference implementation, differs from the expected outputs on "
              f"{len(sec_bad)} of the tests ORT can load)")
    else:
        layers = [(r, L) for r in loadable for L in r.get("layer_rows") or []]
        with_ref = [(r, L) for r, L in layers if L["reference"] in ("ok", "failed")]
        failed = [(r, L) for r, L in with_ref if L["reference"] == "failed"]
        print(f"\nG. layers whose reference fails on generated inputs: {pct(len(failed), len(with_ref))}   "
              f"[goal <= {GOALS['gen']:g}%]  (layers of the tests ORT can load)")
        cl = collections.Counter(L["reference"] for _, L in layers)
        print("   layers: " + ", ".join(f"{k} {v}" for k, v in cl.most_common()))
        cv = collections.Counter(L["verdict"] for _, L in layers)
        print(f"   {args.executor} verdicts: " + ", ".join(f"{k} {v}" for k, v in cv.most_common()))
        lu = [(r, L) for r in unloadable for L in r.get("layer_rows") or []]
        if lu:
            cu = collections.Counter(L["reference"] for _, L in lu)
            print("   layers of tests ORT cannot load (not in the figure): "
                  + ", ".join(f"{k} {v}" for k, v in cu.most_common()))

    print(f"\n3. discover refuses the model: {pct(len(refused_l), len(loadable))} of the tests ORT can load   "
          f"[goal {GOALS['fig3']:g}]; {pct(len(refused) - len(refused_l), len(unloadable))} of those it cannot load")
    print(f"\n4. median seconds per test (discover wall time): {med:.2f} s "
          f"(mean {statistics.mean(secs) if secs else 0:.2f}, "
          f"max {max(secs) if secs else 0:.1f}); {len(rows)} tests in {total_s:.0f} s with {args.jobs} job(s)")
    if bench_errors:
        print(f"\nbenchmark errors (this script failed to read a run; not counted as the product's): "
              f"{len(bench_errors)}")
        for r in bench_errors:
            print(f"  {r['name']}: {r['benchmark_error']}")

    # ---- breakdowns
    if not args.generated:
        breakdown([(r["name"], r["ops"], f"[{r['fig1']}] {r.get('fig1_message')}") for r in loadable
                   if r.get("fig1") not in (None, "match")], "figure 1 failures: reference vs expected")
        breakdown([(r["name"], r["ops"], f"[{r['fig2']}] {r.get('fig2_message')}") for r in loadable
                   if r.get("fig2") in ("false success", "false difference")], "figure 2 disagreements")
        breakdown([(r["name"], r["ops"], f"[{r['fig2']}] {r.get('fig2_message')}") for r in loadable
                   if r.get("fig2") not in (None, "agree (success)", "agree (difference)", "false success",
                                            "false difference")], "figure 2, outside the denominator")
    else:
        lrows = [(r, L) for r in loadable for L in r.get("layer_rows") or []]
        breakdown([(r["name"], L["op_type"], L.get("message") or "") for r, L in lrows if L["reference"] == "failed"],
                  "G failures: layers whose reference fails")
        breakdown([(r["name"], L["op_type"], L.get("message") or "") for r, L in lrows
                   if L["reference"] not in ("ok", "failed")], "layers without a reference (not in G)")
    breakdown([(r["name"], r["ops"], r["refused"]) for r in refused_l], "3. refusals (tests ORT can load)",
              limit_names=40)
    breakdown([(r["name"], r["ops"], r["refused"]) for r in refused if not r["ort_loadable"]],
              "3. refusals (tests ORT cannot load)", limit_names=40)

    if args.json:
        Path(args.json).write_text(json.dumps({
            "onnx": onnx.__version__, "onnxruntime": ort.__version__, "executor": args.executor,
            "generated": args.generated, "widen_inputs": args.widen_inputs, "sample": args.sample, "seed": args.seed,
            "match": args.match,
            "jobs": args.jobs, "seconds": round(total_s, 1), "rows": rows}, indent=1, default=str))
        print(f"\nrows: {args.json}")


if __name__ == "__main__":
    main()
