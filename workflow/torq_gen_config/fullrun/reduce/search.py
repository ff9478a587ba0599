"""``run --reduce``: the smallest subgraph that still fails the way the full-model run did.

When the run of the whole model (or of a subgraph) fails (an import, compile or run
error, or outputs beyond tolerance) although every layer passed alone, the cause needs
several ops together (a fusion, a transfer, a compiler bug). :meth:`Reducer.search` finds
the smallest set of nodes that fails *the same way* (the same verdict; for an error the
same stage on the same executor) under the *same assignment*: Polygraphy's ``debug
reduce`` (bisect, then linear) followed by single-node removal:

1. **Bisect**: keep the first or the second half of the nodes (topological order) while
   one of them still fails.
2. **Ends**: drop ``k`` nodes from the front or the back, ``k`` halving down to 1.
3. **Single nodes**: drop any one node whose removal keeps the failure, until none can
   be: the result is 1-minimal.

A candidate (any subset of the nodes) is fed every tensor it reads from outside from the
whole-model reference run (:mod:`.values`), and its outputs (what a node outside
it, or the model output, reads) are compared with that run's values with the run's
tolerance; its nodes run on their executors as a chain of partitions, each compiled alone
(:func:`~.compile.compile_partition`, no compile batches; :func:`~.execute.run_partitions`).

Bounded (``--reduce-budget``: seconds of this invocation and/or compiles), parallel (the
candidates of a step, ``-j``) and resumable: every candidate's outcome and compiled
partition is kept in ``work/<name>/full/reduce/``, so a stopped reduction replays the
search from those files and continues. The user's folder is :mod:`.reproducer`'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ...core.layout import COMPILED_FILE, MODEL_FILE, PARTITION_RUN_DIR, REFERENCE_FILE, RESULT_FILE
from ...core.errors import ConfigError
from ...core.fileio import read_json, save_npz, write_json
from ...core.limits import DEFAULT_TIMEOUT_S, SUMMARY_CHARS
from ...model.extract import extract_model
from ...model.folding import fold_constants
from ...model.graph import tensor_consumers, value_types
from ..compile import compile_partition, safe_describe
from ..execute import run_partitions
from ..common import PARTITIONS_MODE
from ...core.external_data import load_model, model_bytes
from ..partition import build_partition_model, compile_definition, partition_id, partition_runs
from ..plan import QDQ_OPS
from .values import TensorValues

#: Folder of the reduction's own files, in the work directory's ``full/`` folder.
REDUCE_WORK = "reduce"
#: Version of the candidate outcome files (a change makes old ones be ignored).
_CANDIDATE_VERSION = 1
#: What a candidate can do (``invalid``: it could not be built or fed).
OUTCOME_STATUSES = ("success", "difference", "error", "unverified", "invalid")


@dataclass(frozen=True)
class Budget:
    """The bound of one reduction: wall-clock seconds of this invocation and/or compiles
    (partition compiles actually run; cached ones are free). None: unbounded."""
    seconds: float | None = None
    compiles: int | None = None

    def describe(self) -> str:
        parts = ([f"{self.seconds:g} s"] if self.seconds is not None else []) + (
            [_count(self.compiles, "compile")] if self.compiles is not None else [])
        return " and ".join(parts) or "unbounded"


def parse_budget(text: str | None) -> Budget:
    """``--reduce-budget``: comma-separated bounds: a time (``600`` or ``600s`` seconds,
    ``10m``, ``1h``, ``1h30m``) and/or partition compiles (``40c``, ``40compiles``); e.g.
    ``10m,40c``. None or ``""``: unbounded.

    Raises:
        ConfigError: a part that is none of these, a bound that is not > 0, or two
            bounds of one kind.
    """
    if not text:
        return Budget()
    usage = (f"--reduce-budget {text!r}: expected a time (600, 600s, 10m, 1h30m) and/or a number of compiles (40c), "
             "comma-separated, each > 0 and each kind once")
    seconds = compiles = None
    for part in str(text).replace(" ", "").lower().split(","):
        m = re.fullmatch(r"(\d+)(c|compiles?)", part)
        if m:
            if compiles is not None or int(m.group(1)) <= 0:
                raise ConfigError(usage)
            compiles = int(m.group(1))
            continue
        pieces = re.findall(r"(\d+(?:\.\d+)?)([hms])", part)
        if re.fullmatch(r"\d+(?:\.\d+)?", part):
            value = float(part)
        elif pieces and "".join(n + u for n, u in pieces) == part and len({u for _, u in pieces}) == len(pieces):
            value = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in pieces)
        else:
            raise ConfigError(usage)
        if seconds is not None or not value > 0:
            raise ConfigError(usage)
        seconds = value
    return Budget(seconds, compiles)


@dataclass(frozen=True)
class Outcome:
    """What one candidate did: its verdict (``success``, ``difference``, ``error``,
    ``unverified``, or ``invalid`` when it cannot be built or fed), the failing stage and
    executor of an error, and the summary line."""
    status: str
    stage: str | None = None
    executor: str | None = None
    summary: str = ""

    def same_failure(self, target: "Outcome") -> bool:
        """True when this fails the way ``target`` does (module docstring)."""
        if self.status != target.status or target.status not in ("error", "difference"):
            return False
        return target.status == "difference" or (self.stage == target.stage and self.executor == target.executor)

    def as_dict(self) -> dict:
        return {"status": self.status, "stage": self.stage, "executor": self.executor, "summary": self.summary}


def outcome_of(result: Mapping) -> Outcome:
    """The :class:`Outcome` of a full-model ``result.json`` (or report ``full_model`` section)."""
    failure = result.get("failure") or {}
    status = result.get("status") or "error"
    if status != "error":
        return Outcome(status, summary=(result.get("summary") or "")[:SUMMARY_CHARS])
    return Outcome(status, failure.get("stage"), failure.get("executor"),
                   (failure.get("summary") or result.get("summary") or "")[:SUMMARY_CHARS])


class _Stop(Exception):
    """The budget is spent: no new candidate is started."""


class Reducer:
    """The search state of one reduction (see the module docstring).

    Args:
        model_path: the model the run partitioned (``plan.json``'s ``prepared_model``).
        manifest: its layer manifest (``prepared_node_indices`` per layer).
        layer_executors: layer ID -> executor name (``plan.json``).
        executors: executor name -> definition as run (``plan.json``'s ``executor_def``
            of a partition on it, compile and runtime options included).
        reference_npz: the run's ``reference.npz`` (its inputs feed the reference run).
        tolerance: the run's tolerance.
        work_dir: ``work/<name>/full/reduce`` (values, candidates, partitions, logs).
        jobs: candidates evaluated at once.
        timeout_s: per tool call (s).
        budget: :class:`Budget`.
        progress: called with one line per step (None: silent).
    """

    def __init__(self, *, model_path: str, manifest: Mapping, layer_executors: Mapping[str, str],
                 executors: Mapping[str, dict], reference_npz: str, tolerance: Mapping, work_dir: str | os.PathLike,
                 jobs: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S, budget: Budget = Budget(), progress=None):
        self.model_path = model_path
        self.model = load_model(model_path, weights=False)
        self.work = Path(work_dir)
        self.jobs = max(1, int(jobs))
        self.timeout_s = float(timeout_s)
        self.tolerance = dict(tolerance)
        self.budget = budget
        self.progress = progress or (lambda line: None)
        self.executors = dict(executors)
        self.reference_npz = reference_npz
        self.constants, folded, _ = fold_constants(self.model, keep_op_types=QDQ_OPS)
        node_layer = {j: layer["layer_id"] for layer in manifest["layers"] for j in layer["prepared_node_indices"]}
        self.node_layer = node_layer
        self.node_executor: dict[int, str] = {}
        for j, node in enumerate(self.model.graph.node):
            if j in folded:
                continue
            if j not in node_layer or node_layer[j] not in layer_executors:
                raise ValueError(f"node {j} ({node.op_type} {node.name!r}) has no layer or executor in the plan; "
                                 "run `torq-gen-config run` again first")
            self.node_executor[j] = layer_executors[node_layer[j]]
        unknown = sorted(set(self.node_executor.values()) - set(self.executors))
        if unknown:
            raise ValueError(f"no executor definition for {unknown} in the plan")
        self.nodes = list(self.node_executor)
        self.types = value_types(self.model)
        self.consumers = tensor_consumers(self.model)
        self.graph_outputs = [o.name for o in self.model.graph.output]
        self.toolchain = _toolchain(self.executors, self.timeout_s)
        self.digest = self._model_digest()
        self.compiles = 0
        self.evaluated = 0
        self.cached = 0
        self.started = time.monotonic()
        self.exhausted: str | None = None
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self.values: TensorValues | None = None

    # ------------------------------------------------------------------ inputs
    def _model_digest(self) -> str:
        """Digest of what every candidate's outcome depends on (model, inputs, tolerance,
        executors, assignment, the tools: another ``iree-compile`` is another search);
        ``self.values_digest``: of what the reference values do."""
        h = hashlib.sha256()
        with open(self.model_path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        with open(self.reference_npz, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        self.values_digest = h.copy().hexdigest()[:16]
        h.update(json.dumps({"tolerance": self.tolerance, "executors": self.executors, "nodes": self.node_executor,
                             "toolchain": self.toolchain}, sort_keys=True, default=str).encode())
        return h.hexdigest()[:16]

    def record_values(self) -> dict:
        """The whole-model reference run's values (:class:`~.values.TensorValues`),
        kept for a rerun on the same model and inputs; returns the run's summary."""
        self.values = TensorValues(self.work / "values")
        return self.values.record(self.model, self.reference_npz, self.values_digest, timeout_s=self.timeout_s * 4,
                                  progress=self.progress)

    def value(self, name: str):
        """The reference run's value of tensor ``name`` (a folded constant, or a kept
        value); KeyError when the run has none."""
        if name in self.constants:
            return self.constants[name]
        return self.values.load(name)

    # --------------------------------------------------------------- candidates
    def candidate_model(self, nodes: Sequence[int]):
        """``(model, io)``: the stand-alone ONNX model of ``nodes`` (boundary tensors as
        inputs, folded constants as initializers, every tensor read outside it as an output)."""
        return extract_model(self.model, list(nodes), constants=self.constants, types=self.types,
                             consumers=self.consumers, graph_outputs=self.graph_outputs, outputs="read_outside",
                             value_info_policy="produced", infer_shapes=True)

    def _key(self, nodes: Sequence[int]) -> str:
        data = json.dumps({"v": _CANDIDATE_VERSION, "model": self.digest, "nodes": list(nodes)})
        return hashlib.sha256(data.encode()).hexdigest()[:20]

    def _spend(self) -> None:
        """Raise :class:`_Stop` when the budget is spent."""
        if self.exhausted:
            raise _Stop(self.exhausted)
        b = self.budget
        if b.seconds is not None and time.monotonic() - self.started >= b.seconds:
            self.exhausted = f"the time budget ({b.seconds:g} s) is spent"
        elif b.compiles is not None and self.compiles >= b.compiles:
            self.exhausted = f"the compile budget ({_count(b.compiles, 'compile')}) is spent"
        if self.exhausted:
            raise _Stop(self.exhausted)

    def evaluate(self, nodes: Sequence[int]) -> Outcome:
        """Run the candidate ``nodes`` (kept in ``candidates/<key>.json``); never raises
        for a failing candidate.

        Raises:
            _Stop: the budget is spent (the candidate is not run).
        """
        path = self.work / "candidates" / f"{self._key(nodes)}.json"
        if path.is_file():
            try:
                doc = read_json(path, "reduction candidate")
                outcome = Outcome(**doc["outcome"])
                if doc["nodes"] != list(nodes) or outcome.status not in OUTCOME_STATUSES:
                    raise ValueError("not this candidate's outcome")
                with self._lock:
                    self.cached += 1
                return outcome
            except Exception:  # a damaged file: run it again
                path.unlink(missing_ok=True)
        self._spend()
        try:
            outcome = self._run_candidate(list(nodes), path.with_suffix(""))
        except _Stop:
            raise
        except Exception as e:  # building or feeding it failed here: it does not count, and is not kept
            with self._lock:
                self.evaluated += 1
            return Outcome("invalid", summary=f"{type(e).__name__}: {e}"[:SUMMARY_CHARS])
        with self._lock:
            self.evaluated += 1
        write_json(path, {"nodes": list(nodes), "outcome": outcome.as_dict()})
        return outcome

    def evaluate_many(self, candidates: list[Sequence[int]]) -> list[Outcome | None]:
        """Run up to ``jobs`` candidates at a time; None for one the budget stopped."""
        def one(c):
            try:
                return self.evaluate(c)
            except _Stop:
                return None
        if self.jobs == 1 or len(candidates) == 1:
            return [one(c) for c in candidates]
        with ThreadPoolExecutor(max_workers=min(self.jobs, len(candidates))) as pool:
            return list(pool.map(one, candidates))

    def plan_of(self, nodes: Sequence[int], cdir: Path) -> dict:
        """The chain of partitions of candidate ``nodes`` (a plan like :func:`~.plan.make_plan`'s),
        the partition models written under ``partitions/<pid>/``; ``cdir`` gets the
        candidate's own model."""
        parts_dir = self.work / "partitions"
        model, io = self.candidate_model(nodes)
        cdir.mkdir(parents=True, exist_ok=True)
        model_path = cdir / MODEL_FILE
        model_path.write_bytes(model_bytes(model, model_path))
        partitions = []
        for index, (ex_name, members) in enumerate(partition_runs([(j, self.node_executor[j]) for j in nodes])):
            pmodel, pio = build_partition_model(self.model, members, self.constants, types=self.types,
                                                consumers=self.consumers, graph_outputs=self.graph_outputs)
            data = model_bytes(pmodel, parts_dir / "pid" / MODEL_FILE)  # same depth as the file
            run_def = self.executors[ex_name]
            comp_def = compile_definition(run_def)
            pid = partition_id(data, comp_def, None)
            ppath = parts_dir / pid / MODEL_FILE
            if not ppath.is_file():
                ppath.parent.mkdir(parents=True, exist_ok=True)
                tmp = ppath.with_suffix(f".{threading.get_ident()}.tmp")
                tmp.write_bytes(data)
                os.replace(tmp, ppath)
            partitions.append({
                "index": index, "pid": pid, "executor": ex_name, "backend": run_def.get("backend"),
                "first_node": members[0], "last_node": members[-1], "num_nodes": len(members),
                "layer_ids": list(dict.fromkeys(self.node_layer[j] for j in members)),
                "inputs": pio["inputs"], "outputs": pio["outputs"], "model": str(ppath),
                "executor_def": run_def, "compile_def": comp_def,
            })
        return {"mode": PARTITIONS_MODE, "partitions": partitions, "graph_inputs": io["inputs"],
                "graph_outputs": io["outputs"], "constant_outputs": [], "prepared_model": str(model_path),
                "layer_executors": None, "fallbacks": [], "warnings": []}

    def _compiled(self, p: Mapping, log_path: str) -> dict:
        """The partition's ``compiled.json`` (compiled once per pid, also across runs)."""
        pdir = self.work / "partitions" / p["pid"]
        path = pdir / COMPILED_FILE
        with self._lock:
            lock = self._locks.setdefault(p["pid"], threading.Lock())
        with lock:
            if path.is_file():
                try:
                    c = read_json(path, "compiled partition")
                    if c.get("toolchain") == self.toolchain.get(p["executor"]):
                        return c
                except Exception:  # a damaged file: compiled again
                    pass
            self._spend()
            with self._lock:
                self.compiles += 1
            c = compile_partition(pid=p["pid"], model_path=p["model"], executor=p["compile_def"], work_dir=str(pdir),
                                  timeout_s=self.timeout_s, log_path=log_path)
            c["toolchain"] = self.toolchain.get(p["executor"])
            write_json(path, c)
            return c

    def _run_candidate(self, nodes: list[int], cdir: Path) -> Outcome:
        plan = self.plan_of(nodes, cdir)
        missing = [n for n in plan["graph_inputs"] + plan["graph_outputs"]
                   if n not in self.constants and n not in self.values]
        if missing:
            return Outcome("invalid", summary=f"the reference run has no value for {missing[0]!r}")
        log_path = str(cdir / "candidate.log")
        compiled = {p["pid"]: self._compiled(p, log_path) for p in plan["partitions"]}
        ref = cdir / REFERENCE_FILE
        arrays = {f"input_{i}": self.value(n) for i, n in enumerate(plan["graph_inputs"])}
        arrays.update({f"output_{i}": self.value(n) for i, n in enumerate(plan["graph_outputs"])})
        save_npz(ref, arrays, {"status": "ok", "message": None, "engine": "onnxruntime (node by node)",
                               "input_names": plan["graph_inputs"], "output_names": plan["graph_outputs"]})
        try:
            result = run_partitions(plan, reference_npz=str(ref), compiled=compiled, tolerance=self.tolerance,
                                    timeout_s=self.timeout_s, partitions_dir=str(self.work / "partitions"),
                                    log_path=log_path, check_partitions=False, run_dir=str(cdir / PARTITION_RUN_DIR))
        finally:
            ref.unlink(missing_ok=True)
            shutil.rmtree(cdir / PARTITION_RUN_DIR, ignore_errors=True)
        write_json(cdir / RESULT_FILE, result)
        return outcome_of(result)

    # ------------------------------------------------------------------ search
    def search(self, target: Outcome) -> dict:
        """Reduce the whole node set to a smallest set failing like ``target``.

        Returns:
            ``{"nodes": [node indices], "outcome": Outcome of them, "reproduced": bool
            (the whole set failed like ``target`` here), "minimal": bool (every
            single-node removal was tried and none failed so), "steps": [lines]}``.
        """
        steps: list[str] = []

        def note(line: str) -> None:
            steps.append(line)
            self.progress(line)

        best = list(self.nodes)
        first = self.evaluate_many([best])[0]
        if first is None or not first.same_failure(target):
            what = "the budget was spent first" if first is None else f"{first.status}: {first.summary}"
            note(f"the whole set of {_count(len(best), 'node')} does not fail the same way in the reducer ({what})")
            return {"nodes": best, "outcome": first, "reproduced": False, "minimal": False, "steps": steps}
        best_outcome = first
        note(f"reproduced on the whole set ({_count(len(best), 'node')}): {first.summary}")

        def same(o: Outcome | None) -> bool:
            return o is not None and o.same_failure(target)

        # 1. bisect
        while len(best) >= 2 and not self.exhausted:
            h = len(best) // 2
            halves = [best[:h], best[h:]]
            outs = self.evaluate_many(halves)
            hit = next((i for i, o in enumerate(outs) if same(o)), None)
            if hit is None:
                break
            best, best_outcome = halves[hit], outs[hit]
            note(f"bisect: kept the {'first' if hit == 0 else 'second'} half: {_count(len(best), 'node')}")
        # 2. the ends, k nodes at a time, k halving to 1
        k = max(1, len(best) // 4)
        while len(best) >= 2 and not self.exhausted:
            k = min(k, len(best) - 1)
            cands = [best[k:], best[:-k]]
            outs = self.evaluate_many(cands)
            hit = next((i for i, o in enumerate(outs) if same(o)), None)
            if hit is not None:
                best, best_outcome = cands[hit], outs[hit]
                note(f"ends: dropped {_count(k, 'node')} from the {'front' if hit == 0 else 'back'}: "
                     f"{_count(len(best), 'node')}")
            elif k == 1:
                break
            else:
                k //= 2
        # 3. single nodes anywhere, until none can be dropped
        minimal = False
        while len(best) >= 2 and not self.exhausted:
            dropped = False
            i = 0
            while i < len(best) and len(best) >= 2 and not self.exhausted:
                idx = list(range(i, min(i + self.jobs, len(best))))
                cands = [best[:t] + best[t + 1:] for t in idx]
                outs = self.evaluate_many(cands)
                hit = next((n for n, o in enumerate(outs) if same(o)), None)
                if hit is None:
                    i += len(idx)
                    continue
                node = best[idx[hit]]
                best, best_outcome = cands[hit], outs[hit]
                note(f"dropped node {node} ({self.model.graph.node[node].op_type}): {_count(len(best), 'node')}")
                dropped = True
                i = idx[hit]
            if not dropped and not self.exhausted:
                minimal = True
                break
        if len(best) == 1 and not self.exhausted:
            minimal = True
        return {"nodes": best, "outcome": best_outcome, "reproduced": True, "minimal": minimal, "steps": steps}

    def describe_nodes(self, nodes: Sequence[int]) -> list[dict]:
        """``[{"index", "name", "op_type", "layer_id", "executor"}]`` of ``nodes``."""
        out = []
        for j in nodes:
            n = self.model.graph.node[j]
            out.append({"index": j, "name": n.name, "op_type": n.op_type, "layer_id": self.node_layer.get(j),
                        "executor": self.node_executor[j]})
        return out


def executor_definitions(plan: Mapping) -> dict[str, dict]:
    """Executor name -> its definition as the plan ran it (a partition's ``executor_def``)."""
    return {p["executor"]: p["executor_def"] for p in plan.get("partitions") or []}


def _toolchain(executors: Mapping[str, dict], timeout_s: float) -> dict:
    """Executor name -> its tools as found now (:func:`~.compile.safe_describe`: paths and
    versions; an ``IREE_COMPILE`` override is another path; None when it cannot be had), so
    that candidates run with other tools are not reused."""
    return {name: safe_describe(ex, timeout_s) for name, ex in executors.items()}



def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
