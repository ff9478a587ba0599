"""The jobs of rules/ck_profiler.smk: read the inputs, call the library, write the outputs.

Data flow (every file written atomically; ``<out>`` is ``ck_output_dir``)::

    trace IR (ck_trace)     -> <out>/ck_profiler_configs.json     ck_convert
    configurations          -> <out>/manifest.json                ck_select (checkpoint)
                               + <out>/configs/<id>.json          (rewritten only when changed)
    <out>/configs/<id>.json -> <out>/runs/<id>/result.json        ck_profile_config, one job each
                               + <out>/runs/<id>/profiler.log     (the full output)
    manifest + results      -> <out>/profiler_results.json        ck_profile
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import ConfigError, TorqGenConfigError
from ..core.fileio import atomic_write_text, json_bytes, read_json, write_bytes_if_changed, write_json
from . import convert, profile, profiler_args as pa, results

#: Config keys of the CK workflow and their defaults (``--config ck_configs=...``).
DEFAULTS = {"ck_configs": None, "ck_trace": None, "ck_output_dir": None, "ck_backend": "ckprofiler",
            "ck_profiler_path": None, "ck_timeout_s": 600, "ck_max_ops": None, "ck_quiet": False,
            "ck_summary": True}
CONFIGS_FILE = "ck_profiler_configs.json"
RESULTS_FILE = "profiler_results.json"
LOCK_FILE = ".ck-profile.lock"
#: Longest per-configuration timeout accepted (seconds; a week).
MAX_TIMEOUT_S = 7 * 24 * 3600


def settings(config: dict) -> dict:
    """The CK workflow's settings from a Snakemake config, checked.

    Raises:
        ConfigError: neither or both of ck_configs / ck_trace, an unknown backend, a
            non-positive timeout or max_ops (one line).
    """
    s = {k: config.get(k, v) for k, v in DEFAULTS.items()}
    if bool(s["ck_configs"]) == bool(s["ck_trace"]):
        raise ConfigError("give exactly one of ck_configs (a CK profiler configurations JSON) or "
                          "ck_trace (a TraceLens IR trace to convert first)")
    if s["ck_backend"] not in profile.BACKENDS:
        raise ConfigError(f"ck_backend {s['ck_backend']!r}: choose one of {', '.join(profile.BACKENDS)}")
    for key, low in (("ck_timeout_s", 0), ("ck_max_ops", 0)):
        v = s[key]
        if v is None and key == "ck_max_ops":
            continue
        try:
            v = float(v) if key == "ck_timeout_s" else int(v)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} must be a number, not {s[key]!r}") from None
        if not v > low or (key == "ck_timeout_s" and not v <= MAX_TIMEOUT_S):
            raise ConfigError(f"{key} must be > {low}" + (f" and at most {MAX_TIMEOUT_S}" if key == "ck_timeout_s" else "")
                              + f", not {v}")
        s[key] = v
    source = s["ck_configs"] or s["ck_trace"]
    if not os.path.isfile(source):
        raise ConfigError(f"{'ck_configs' if s['ck_configs'] else 'ck_trace'} file not found: {source}")
    if not s["ck_output_dir"]:
        s["ck_output_dir"] = os.path.join("results", "ck", Path(source).stem)
    for key in ("ck_quiet", "ck_summary"):
        s[key] = str(s[key]).lower() in ("1", "true", "yes")
    return s


def _emit(text: str, log: str | None, *, show: bool = True) -> None:
    """Print ``text`` (unless ``show`` is false) and write it as the job's log."""
    if show:
        print(text, flush=True)
    if log:
        atomic_write_text(log, text + "\n")


def convert_job(*, trace: str, output: str, quiet: bool, log: str | None = None) -> None:
    """Convert a trace; print the per-record lines (unless quiet) and the summary; the log
    gets both.

    Raises:
        TraceFormatError: the trace is malformed (one line).
    """
    conv = convert.convert_file(trace, output)
    if not conv.configs:
        raise TorqGenConfigError(f"no convolution in {trace} could be converted: "
                                 + ("; ".join(sorted({r for *_, r in conv.skipped})[:3]) or "no convolution records"))
    if not quiet:
        print("\n".join(conv.lines))
    _emit(convert.summary_text(conv, output), None)
    if log:
        atomic_write_text(log, "\n".join(conv.lines) + "\n" + convert.summary_text(conv, output) + "\n")


def select_job(*, configs: str, manifest: str, configs_dir: str, max_ops: int | None, log: str | None = None) -> None:
    """Pick the configurations to run and write one file per distinct configuration (only
    when its content changed, so unchanged configurations keep their results) and the manifest."""
    entries = results.load_configs(configs)
    selected = results.select(entries, max_ops)
    ids = []
    for e in selected:
        if e["config_id"] and e["config_id"] not in ids:
            ids.append(e["config_id"])
            cfg = e["config"]
            # what is run, nothing else: a new description or rank does not rerun it
            write_bytes_if_changed(os.path.join(configs_dir, f"{e['config_id']}.json"),
                                   json_bytes({"operation_type": cfg["operation_type"],
                                               "profiler_args": cfg["profiler_args"]}))
    write_json(manifest, {"configs_file": os.path.abspath(configs), "configs_in_file": len(entries),
                          "max_ops": max_ops, "run_ids": ids,
                          "selected": [{k: v for k, v in e.items() if k != "config"} for e in selected]})
    bad = [e for e in selected if e["config_id"] is None]
    lines = [f"{len(selected)} of {len(entries)} configurations selected"
             + (f" (max_ops {max_ops}, by priority rank)" if max_ops else "") + f", {len(ids)} distinct to run"]
    lines += [f"⚠ not run: {e['error']}" for e in bad]
    _emit("\n".join(lines), log)


def run_ids(manifest: str) -> list[str]:
    """The configuration IDs a manifest asks to run."""
    return list(read_json(manifest, "CK manifest")["run_ids"])


def resolve_profiler(backend: str, profiler_path: str | None) -> dict | None:
    """The ckprofiler backend's binary as a fingerprint (a Snakemake param: a rebuilt binary
    reruns the measurements); None for the onnxruntime backend.

    Raises:
        ProfilerNotFound: the binary is not found (the message says where it looked).
    """
    if backend != "ckprofiler":
        return None
    return profile.fingerprint(profile.locate_profiler(profiler_path))


def profile_job(*, config_file: str, result: str, log: str, backend: str, profiler: dict | None,
                timeout_s: float, quiet: bool) -> None:
    """Run one configuration and write its result record; a failed run is a result, not an error."""
    cfg = pa.normalize_config(read_json(config_file, "CK configuration"), where=config_file)
    binary = profiler["path"] if profiler else None
    build = profile.probe_build(binary) if binary else None
    if os.path.exists(log):
        os.remove(log)  # the log holds this run only
    record = profile.run_config(cfg, backend=backend, binary=binary, timeout_s=timeout_s, log_path=log, build=build)
    record["log"] = os.path.abspath(log) if os.path.exists(log) else None
    write_json(result, record)
    print(results.run_block(record, quiet=quiet), flush=True)


def aggregate_job(*, manifest: str, result_files: list[str], output: str, backend: str, profiler: dict | None,
                  log: str | None = None, summary: bool = True) -> dict:
    """Assemble the results document from the manifest and the per-configuration records;
    print the execution summary unless ``summary`` is false (``ck-profile run`` prints its own)."""
    man = read_json(manifest, "CK manifest")
    runs = {}
    for path in result_files:
        rec = read_json(path, "CK result")
        runs[rec["config_id"]] = rec
    missing = [i for i in man["run_ids"] if i not in runs]
    if missing:
        raise TorqGenConfigError(f"no result for configuration(s) {', '.join(missing[:5])}")
    doc = results.assemble(man["selected"], runs, configs_file=man["configs_file"], backend=backend,
                           profiler=profiler["path"] if profiler else None, total_in_file=man["configs_in_file"])
    write_json(output, doc)
    _emit(results.summary_text(doc, output), log, show=summary)
    return doc
