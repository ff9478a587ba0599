"""TORQ's whole-model run (``torq-gen-config run`` when every assigned executor is a
torq one): the model is not cut into partitions.

TORQ's compiler has a per-op assignment pass (``--torq-executor-map``, keyed by
``line:col`` in ``work/full.mlir``), so the plan has a single "partition" (pid
``torq-<12 hex>``, a hash of the executor map, of ``full.mlir`` and of the compile
options) whose ``compile_def`` carries ``whole_model_torq``: it is compiled once,
``torq-compile <full.mlir> ... --torq-executor-map=partitions/<pid>/executor_map.json``,
and run once with ``torq-run-module`` on the reference inputs. Layers without a
choice are absent from the map (the compiler places them).

The full-model run (:mod:`torq_gen_config.fullrun`) calls these hooks through
:meth:`TorqBackend.whole_model <torq_gen_config.backends.torq.TorqBackend.whole_model>`
and does the rest (files, result, comparison).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .. import effective_executor
from ...core.errors import ConfigError
from ...core.fileio import file_digest
from ...core.logs import append_record
from ...core.tools import ToolNotFoundError, run_tool
from ...mlir.importer import layer_location
from ..base import CompiledArtifact, StageError, raise_for_tool_failure
from ..iree_tools import parse_mlir_signature
from ..whole_model import WholeModel
from ...core.layout import MODULE_FILE, PARTITION_RUN_DIR
from .toolchain import _parse_options, full_model_compile_argv

__all__ = ["TORQ_PARTITION", "TORQ_MAP_FILE", "TorqWholeModel", "torq_options", "mlir_function"]

#: Name (and pid prefix) of the single whole-model "partition" of a torq plan.
TORQ_PARTITION = "torq"
#: The executor map of a torq plan, in ``partitions/<pid>/``.
TORQ_MAP_FILE = "executor_map.json"


def torq_options(executors: list[dict], compiler_options: Iterable[str] = (),
                 runtime_options: Iterable[str] = ()) -> tuple[dict, dict[str, str]]:
    """The options of the one whole-model compile and run of these torq executors.

    Returns:
        ``(options, torq_names)``: ``options`` = ``torq_hw``, ``torq_hw_type``,
        ``compile_flags``, ``run_flags`` (with ``--compiler-option`` /
        ``--runtime-option`` appended); ``torq_names`` maps each executor's name to
        its TORQ executor (its ``executor`` option: ``nss``, ``css`` or ``host``), the
        name the executor map must use.

    Raises:
        ConfigError: invalid options, or executors that differ in one of the four
            options (the model is compiled once, with one set).
    """
    opts: dict | None = None
    first = None
    names: dict[str, str] = {}
    for e in executors:
        o = _parse_options(e["name"], effective_executor(e, compiler_options, runtime_options).get("options"))
        names[e["name"]] = o["executor"]
        o = {k: o[k] for k in ("torq_hw", "torq_hw_type", "compile_flags", "run_flags")}
        if opts is None:
            opts, first = o, e["name"]
        elif o != opts:
            k = next(k for k in o if o[k] != opts[k])
            raise ConfigError(
                f"the torq executors {first!r} and {e['name']!r} differ in option {k!r} ({opts[k]!r} vs {o[k]!r}): "
                "the whole model is compiled and run once, with one torq_hw, torq_hw_type, compile_flags and "
                "run_flags, so they must be equal"
            )
    return opts or {}, names


def mlir_function(mlir_path: str | os.PathLike) -> tuple[str | None, dict | None]:
    """The name and signature of the first ``func.func`` of an imported model (the
    graph name becomes the function name; a quoted name is returned unquoted).

    Returns:
        ``(name, signature)`` (signature as
        :func:`~torq_gen_config.backends.iree_tools.parse_mlir_signature`), ``(None, None)``
        when there is no function header.

    Raises:
        OSError: the file cannot be read.
    """
    pat = re.compile(r'func\.func @("(?:[^"\\]|\\.)*"|[A-Za-z0-9_$.-]+)\(')
    with open(mlir_path, "r", encoding="utf-8", errors="replace") as f:
        for line in f:
            m = pat.search(line)
            if m:
                token = m.group(1)
                return token.strip('"'), parse_mlir_signature(mlir_path, function=token)
    return None, None


def _torq_backend_options(opts: Mapping) -> dict:
    """Options for a TorqBackend that runs (or describes) a whole-model module; the
    ``executor`` option only selects forcing flags, which a whole-model compile has not."""
    return {**{k: v for k, v in opts.items() if k in ("torq_hw", "torq_hw_type", "compile_flags", "run_flags")},
            "executor": "nss"}


def _assigned(layer: Mapping, loc: str | None, chosen: Mapping | None, by_loc: Mapping | None) -> tuple[Any, str]:
    """``(executor name or None, why there is none)`` of one layer."""
    ex, why = None, ""
    if chosen is not None:
        entry = chosen.get(layer["layer_id"])
        if entry is None:
            why = "not in the report (the model changed since discovery?)"
        else:
            ex = entry.get("executor")
            st = entry.get("statuses") or {}
            why = "no recommendation (" + (", ".join(f"{k}: {v}" for k, v in st.items()) or "not tested") + ")"
    else:
        ex = (by_loc or {}).get(loc) if loc else None
        if loc is None:
            why = "the layer has no verified line:col in full.mlir, so the compiler JSON cannot name it"
        elif loc in (by_loc or {}):
            why = f"the compiler JSON has no executor for {loc}"
        else:
            why = f"not in the compiler JSON ({loc})"
    return ex, why


class TorqWholeModel(WholeModel):
    """The hooks of :class:`~torq_gen_config.backends.whole_model.WholeModel` for TORQ.

    Args:
        backend_cls: the :class:`~torq_gen_config.backends.torq.TorqBackend` class
            that runs and describes the whole-model module (passed in by
            ``TorqBackend.whole_model()``, so that this module does not import it).
    """

    kind = "torq"
    how = "compiled as one whole model by torq-compile (--torq-executor-map)"

    def __init__(self, backend_cls: type) -> None:
        self.backend_cls = backend_cls

    def plan(self, model, manifest: Mapping, locations: Mapping | None, assignment: Mapping, executors: list[dict],
             partitions_dir: str | os.PathLike, *, compiler_options: Sequence[str] = (),
             runtime_options: Sequence[str] = (), full_mlir: str | None = None) -> tuple[dict, dict[str, bytes]]:
        """The plan of a torq assignment: the whole model in one "partition".

        The executor map (``partitions/<pid>/executor_map.json``, the compiler JSON's
        form: ``{"op_assignments": {"L:C": {"executor": "nss"}}, "model_name"}``) has
        one entry per layer with a choice (report ``recommended_executor``, or the
        compiler JSON's entry for the layer's ``line:col``), keyed by the layer's
        ``line:col`` in ``full_mlir`` and naming its TORQ executor (the ``executor``
        option). A layer without a choice (or without a verified ``line:col``) is not
        in the map: the compiler places it; ``fallbacks`` lists it with ``executor: None``.

        The pid is ``torq-<12 hex>``: a hash of the map, of ``full_mlir``'s content
        and of the compile options (and ``debug_ir``), so a changed assignment
        recompiles and an unchanged one reruns nothing.

        Returns:
            ``(plan body, {map path: map bytes})``: a plan like
            :func:`torq_gen_config.fullrun.plan.make_plan`'s without ``schema``, with
            ``mode: "torq"``, one partition (``model`` = the executor map,
            ``whole_model_torq: True``), plus ``executor_map``, ``num_map_entries``,
            ``torq_executors``, ``full_mlir``.

        Raises:
            ConfigError: unknown executors, torq executors with different options.
        """
        layers = manifest["layers"]
        by_name = {e["name"]: e for e in executors}
        locs = locations or {}
        chosen, by_loc = assignment.get("layers"), assignment.get("locations")
        left = "not in the executor map: torq-compile places it"
        entries: dict[str, str] = {}
        by_layer: dict[str, str] = {}
        fallbacks: list[dict] = []
        warnings: list[str] = []
        layer_locs: set[str] = set()
        for layer in layers:
            lid = layer["layer_id"]
            loc = layer_location(layer, locs)
            if loc:
                layer_locs.add(loc)
            ex, why = _assigned(layer, loc, chosen, by_loc)
            if ex and ex not in by_name:
                raise ConfigError(f"the assignment names executor {ex!r}, which is not configured "
                                  f"(configured: {', '.join(by_name)})")
            if ex and loc is None:
                why = f"assigned to {ex}, but the layer has no verified line:col in full.mlir, so the map cannot name it"
                ex = None
            if ex:
                entries[loc] = ex
                by_layer[lid] = ex
            else:
                fallbacks.append({"layer_id": lid, "executor": None, "reason": f"{why}; {left}"})
        if chosen is not None:
            known = {l["layer_id"] for l in layers}
            stale = [lid for lid in chosen if lid not in known]
            if stale:
                warnings.append(f"{len(stale)} layer(s) of the report are not in the model (e.g. {stale[0]}); ignored")
        else:
            stray = [k for k, v in (by_loc or {}).items() if v and k not in layer_locs]
            if stray:
                warnings.append(f"{len(stray)} entr(y/ies) of the compiler JSON match no layer's line:col "
                                f"(e.g. {stray[0]}); not in the executor map")
        if locs.get("status") not in (None, "ok"):
            warnings.append(f"the full-model MLIR import failed ({locs.get('message') or 'no message'}): "
                            "torq-compile has nothing to compile")
        used = [n for n in by_name if n in set(entries.values())] or \
               [n for n, e in by_name.items() if e.get("backend") == self.kind]
        opts, torq_names = torq_options([by_name[n] for n in used], compiler_options, runtime_options)
        ordered = sorted(entries, key=lambda k: tuple(int(x) for x in k.split(":")))
        doc = {"op_assignments": {k: {"executor": torq_names[entries[k]]} for k in ordered},
               "model_name": assignment.get("model_name")}
        data = (json.dumps(doc, indent=2) + "\n").encode("utf-8")
        mlir_sha = file_digest(full_mlir) if full_mlir and os.path.isfile(full_mlir) else None
        debug_ir = (assignment.get("options") or {}).get("debug_ir")
        comp_opts = {k: opts[k] for k in ("torq_hw", "torq_hw_type", "compile_flags")}
        h = hashlib.sha256(data)
        h.update(json.dumps({"options": comp_opts, "mlir_sha256": mlir_sha, "debug_ir": debug_ir},
                            sort_keys=True).encode("utf-8"))
        pid = f"{TORQ_PARTITION}-{h.hexdigest()[:12]}"
        if debug_ir:
            comp_opts["compile_flags"] = comp_opts["compile_flags"] + \
                [f"--dump-compilation-phases-to={os.path.join(debug_ir, pid)}"]
        whole = {"mlir": full_mlir, "mlir_sha256": mlir_sha,
                 "executor_map_sha256": hashlib.sha256(data).hexdigest(),
                 "import_status": locs.get("status"), "import_message": locs.get("message")}
        comp_def = {"name": TORQ_PARTITION, "backend": self.kind, "executors": used, "options": comp_opts,
                    "whole_model_torq": whole}
        run_def = {**copy.deepcopy(comp_def), "options": {**comp_opts, "run_flags": opts["run_flags"]}}
        map_path = Path(partitions_dir) / pid / TORQ_MAP_FILE
        inits = {t.name for t in model.graph.initializer}
        graph_inputs = [i.name for i in model.graph.input if i.name not in inits]
        graph_outputs = [o.name for o in model.graph.output]
        nodes = sorted(j for l in layers for j in l["prepared_node_indices"])
        part = {
            "index": 0, "pid": pid, "executor": TORQ_PARTITION, "backend": self.kind, "needs_mlir": True,
            "whole_model_torq": True,
            "first_node": nodes[0] if nodes else None, "last_node": nodes[-1] if nodes else None,
            "num_nodes": len(nodes), "layer_ids": [l["layer_id"] for l in layers],
            "inputs": graph_inputs, "outputs": graph_outputs, "num_initializers": len(inits),
            "model": str(map_path), "executor_def": run_def, "compile_def": comp_def,
        }
        body = {
            "mode": self.kind,
            "source": assignment.get("source"), "source_file": assignment.get("source_file"),
            "options": {"compiler_options": list(compiler_options), "runtime_options": list(runtime_options),
                        "debug_ir": debug_ir},
            "num_partitions": 1,
            "partitions": [part],
            "graph_inputs": graph_inputs, "graph_outputs": graph_outputs, "constant_outputs": [],
            "layer_executors": by_layer,
            "fallbacks": fallbacks,
            "warnings": warnings,
            "executor_map": str(map_path),
            "num_map_entries": len(ordered),
            "torq_executors": used,
            "full_mlir": full_mlir,
        }
        return body, {str(map_path): data}

    def is_whole_model(self, executor: Mapping) -> bool:
        """A torq plan's partition: its definition carries ``whole_model_torq``."""
        return bool(executor.get("whole_model_torq"))

    def compile(self, executor: Mapping, *, model_path: str, work_dir: str, timeout_s: float,
                log_path: str | None) -> dict:
        """``torq-compile <full.mlir> -o <work>/module.vmfb --torq-hw=... [--torq-target-host-triple=native]
        <compile_flags> --torq-executor-map=<model_path>``, run inside ``work_dir``
        (``model_path`` is the executor map).

        Returns:
            ``{"compile_ms" (ms), "artifact": {"path": the .vmfb, "info": {"argv",
            "mlir_path", "executor_map", "executors", "function", "signature", "torq_hw",
            "torq_hw_type", "vmfb_bytes"}}, "tool"}``.

        Raises:
            StageError: ``import`` (``full.mlir`` missing or empty: its import failed),
                ``compile`` (``torq-compile`` not found: the message names every place
                searched; invalid options; a non-zero exit), ``timeout`` / ``crash``.
        """
        whole = executor["whole_model_torq"]
        mlir = whole.get("mlir")
        if whole.get("import_status") not in (None, "ok") or not mlir or not os.path.isfile(mlir) \
                or os.path.getsize(mlir) == 0:
            detail = f": {whole['import_message']}" if whole.get("import_message") else ""
            raise StageError("import", f"the full-model MLIR {mlir} is missing or empty: the import of the prepared "
                                       f"model failed{detail}")
        work = Path(work_dir).absolute()
        out = work / MODULE_FILE
        out.unlink(missing_ok=True)
        opts = dict(executor.get("options") or {})
        try:
            argv = full_model_compile_argv(mlir, out, model_path, opts)
        except ToolNotFoundError as e:
            append_record(log_path, f"torq backend: {e}")
            raise StageError("compile", str(e)) from None
        except ConfigError as e:
            raise StageError("compile", str(e)) from None
        try:
            tr = run_tool(argv, timeout_s=timeout_s, cwd=str(work), log_path=log_path)
            raise_for_tool_failure(tr, tool="torq-compile", during="compile", timeout_s=timeout_s)
            if not out.is_file():
                raise StageError("compile", f"torq-compile exited with status 0 but wrote no module ({out})")
        except StageError:
            out.unlink(missing_ok=True)
            raise
        except Exception as e:  # e.g. the tool is not executable
            out.unlink(missing_ok=True)
            raise StageError("compile", f"{type(e).__name__}: {e}") from None
        try:
            function, signature = mlir_function(mlir)
        except OSError:
            function, signature = None, None
        artifact = {"path": str(out), "info": {
            "argv": argv, "mlir_path": os.path.abspath(mlir), "executor_map": os.path.abspath(model_path),
            "executors": executor.get("executors"), "function": function, "signature": signature,
            "torq_hw": opts.get("torq_hw"), "torq_hw_type": opts.get("torq_hw_type"),
            "vmfb_bytes": out.stat().st_size}}
        try:
            tool = self.backend_cls(TORQ_PARTITION, _torq_backend_options(opts)).describe(
                probe_timeout_s=min(float(timeout_s), 60.0))
            tool = {k: v for k, v in tool.items() if k not in ("executor", "forcing_flags")}
        except Exception:
            tool = None
        return {"compile_ms": tr.wall_ms, "artifact": artifact, "tool": tool}

    def run(self, partition: Mapping, compiled: Mapping, *, inputs: Mapping[str, Any], partition_dir: str,
            timeout_s: float, log_path: str | None) -> tuple[dict[str, Any], float]:
        """``torq-run-module --module=<pid>/module.vmfb --function=<the model's function>
        --output=@<pid>/run/outputs/output_<i>.bin ... --torq_hw_type=... <run_flags>
        --input=<spec>=@<pid>/run/inputs/input_<i>.bin ...`` on ``inputs`` (the model's
        graph inputs), outputs read with the shapes and dtypes of ``full.mlir``'s
        signature.

        Returns:
            ``(outputs by name, run_ms)`` (ms: the wall time of torq-run-module).

        Raises:
            StageError: as ``TorqBackend.run``.
        """
        info = (compiled.get("artifact") or {}).get("info") or {}
        pdir = Path(partition_dir)
        backend = self.backend_cls(TORQ_PARTITION,
                              _torq_backend_options((partition.get("executor_def") or {}).get("options") or {}))
        artifact = CompiledArtifact(path=str(pdir / MODULE_FILE), compile_ms=compiled.get("compile_ms"),
                                    info={"function": info.get("function"), "signature": info.get("signature")})
        return backend.run(artifact, inputs={n: inputs[n] for n in partition["inputs"]},
                           input_names=partition["inputs"], output_names=partition["outputs"],
                           work_dir=str(pdir / PARTITION_RUN_DIR), timeout_s=timeout_s, log_path=log_path)

    def result_fields(self, plan: Mapping, compiled: Mapping) -> dict:
        """``{"torq": {"executor_map", "num_map_entries", "executors", "compile_argv"}}``."""
        info = (compiled.get("artifact") or {}).get("info") or {}
        return {"torq": {"executor_map": plan.get("executor_map"), "num_map_entries": plan.get("num_map_entries"),
                         "executors": plan.get("torq_executors"), "compile_argv": info.get("argv")}}

    def failure_where(self, partition: Mapping) -> str:
        return (f"whole model on torq (one torq-compile with --torq-executor-map, "
                f"{len(partition['layer_ids'])} layers)")

    def text_lines(self, section: Mapping) -> list[str]:
        tq = section.get("torq") or {}
        return [f"Mode: whole model, one torq-compile with --torq-executor-map "
                f"({tq.get('num_map_entries')} line:col entries: {tq.get('executor_map')})"]

    def side_files(self, section: Mapping) -> list[tuple[str, str]]:
        path = (section.get("torq") or {}).get("executor_map")
        return [("Executor map", path)] if path else []

    def summary(self, plan: Mapping) -> str:
        return (f"whole model on torq ({', '.join(plan['torq_executors'])}), one torq-compile with an "
                f"executor map of {plan['num_map_entries']} entr(y/ies); {len(plan['fallbacks'])} layer(s) "
                "without a recommendation left to the compiler")
