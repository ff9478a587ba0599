"""One node test through the product: a ``discover`` subprocess (``tools.run_tool``: its own
process group, stopped at a timeout, or with every other tool on an interrupt), its one-line refusal, the
files it wrote read back, and a compiled layer run again with the product's backend to get
an executor's outputs (the product does not keep them in a form meant to be read back)."""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import backends, workflow_files
from ..backends.base import CompiledArtifact
from ..backends.iree_tools import parse_mlir_signature
from ..core import layout
from ..core.tools import first_error_line, run_tool
from ..core.layout import LayerFolder, WorkDir

#: source folders whose frames a refusal message names (this package and the rules)
_OWN_CODE = (str(workflow_files.PACKAGE_DIR), str(workflow_files.root()))


def first_line(text: str) -> str:
    """The first error line of a tool message (at most 300 characters)."""
    return first_error_line(text or "", 300)


def tidy(msg: str | None) -> str:
    """A message without the work directory's paths (``.../model.mlir:4:10: `` removed)."""
    return re.sub(r"\S*/(model\.mlir|model\.onnx)(:\d+:\d+)?:? ?", "", msg or "")


def discover_command(model: Path, out: Path, *, tool_timeout_s: float, input_data: Path | None = None,
                     skip_executors: list[str] | None = None, config_file: str | None = None) -> list[str]:
    """The ``discover`` command line of one test: one job, line-based progress; the layers'
    compiled modules and MLIR kept (``--keep-work all``): :func:`rerun_executor` runs them again."""
    cmd = [sys.executable, "-m", "torq_gen_config", "discover", "--model", str(model), "--output-dir", str(out),
           "-j", "1", "-q", "--timeout", str(max(10, int(tool_timeout_s))), "--keep-work", "all"]
    if config_file:
        cmd += ["--config-file", str(config_file)]
    if skip_executors:
        cmd += ["--skip-executors", ",".join(skip_executors)]
    if input_data is not None:
        cmd += ["--input-data", str(input_data)]
    return cmd


def discover_env() -> dict:
    """The environment of a discover subprocess: this package first on the path, no warnings."""
    env = dict(os.environ)
    here = str(workflow_files.PACKAGE_DIR.parent)
    env["PYTHONPATH"] = os.pathsep.join([here] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONWARNINGS"] = "ignore"
    return env


def run_discover(cmd: list[str], cwd: Path, timeout_s: float, env: dict) -> tuple[int | None, str, str, float]:
    """Run one discovery through :func:`torq_gen_config.core.tools.run_tool` (its own process group,
    killed at ``timeout_s`` or by ``tools.kill_all_tools`` when the run stops).

    Returns:
        ``(exit status or None when it timed out, stdout, stderr, seconds)``.
    """
    res = run_tool(cmd, timeout_s=timeout_s, cwd=cwd, env=env)
    return (None if res.timed_out else res.returncode), res.stdout, res.stderr, res.wall_ms / 1000.0


def refusal_message(stdout: str, stderr: str) -> str:
    """The one-line error of a discover run that failed."""
    lines = (stderr or "").splitlines() + (stdout or "").splitlines()
    # a job that raised: Snakemake prints "RuleException:", "<Exc> in file <rule>, line N:", the message and
    # the traceback; the CLI then only says "At least one job did not complete successfully."
    for i, ln in enumerate(lines):
        if ln.strip() == "RuleException:" and i + 2 < len(lines):
            m = re.match(r"\s*(\w+) in file", lines[i + 1])
            frames = []  # the innermost frame of this package or the rules (not numpy's)
            for f in lines[i + 3:]:
                fm = re.match(r'\s*File "([^"]+)", line (\d+), in (\S+)', f)
                if not fm:
                    break
                if fm.group(1).startswith(_OWN_CODE):
                    frames.append(f"{Path(fm.group(1)).name}:{fm.group(2)} {fm.group(3)}")
            where = f" (at {frames[-1]})" if frames else ""
            return f"{m.group(1) if m else 'error'}: {lines[i + 2].strip()}{where}"[:300]
    for ln in lines:
        if ln.startswith("torq-gen-config: error:"):
            return ln.strip()[:300]
    exc = [ln for ln in lines if re.match(r"^\s*[A-Za-z_.]*(Error|Exception)\b.*:", ln)]
    if exc:
        return exc[-1].strip()[:300]
    return first_line(stderr or stdout)


@dataclass
class Discovery:
    """What one finished discovery wrote: its report, layer manifest and layers folder."""

    name: str
    report: dict
    manifest: dict
    layers_dir: Path

    @property
    def ops(self) -> dict:
        """The report's per-layer entries, by layer ID."""
        return self.report.get("ops") or {}

    def output_layers(self, model_outputs: list[str]) -> tuple[list[dict], list[str]]:
        """The manifest's layers that write ``model_outputs`` (in order, once each), and the
        outputs no layer writes (a node folded to a constant)."""
        by_output = {o["name"]: L for L in self.manifest["layers"] for o in L["outputs"]}
        layers = []
        for n in model_outputs:
            L = by_output.get(n)
            if L is not None and L not in layers:
                layers.append(L)
        return layers, [n for n in model_outputs if n not in by_output]

    def result(self, layer: dict, executor: str) -> dict | None:
        """The layer's verdict file for ``executor`` (``result.json``), or None."""
        res = LayerFolder(self.layers_dir / layer["slug"]).executor(executor).result
        return json.loads(res.read_text()) if res.is_file() else None


def reports_in(out: Path) -> list[Path]:
    """The report JSON files (not the compiler JSON) in a discover output directory."""
    return sorted(p for p in Path(out).glob(f"{layout.REPORT_PREFIX}*.json") if not p.name.endswith("_compiler.json"))


def read_discovery(out: Path) -> Discovery:
    """The report and layer manifest of the discovery in output directory ``out``.

    Raises:
        FileNotFoundError: no report there.
    """
    reports = reports_in(out)
    if not reports:
        raise FileNotFoundError(f"no report JSON in {out}")
    name = reports[0].name[len(layout.REPORT_PREFIX):-len(".json")]
    work = WorkDir.of(out, name)
    return Discovery(name=name, report=json.loads(reports[0].read_text()),
                     manifest=json.loads(work.manifest.read_text()), layers_dir=work.layers)


def rerun_executor(executor: dict, layer_dir: Path, name: str, inputs: dict, meta: dict, work: Path,
                   timeout_s: float) -> dict:
    """The executor's outputs for the layer in ``layer_dir``, by running the compiled layer
    again with the product's backend on ``inputs`` (IREE and TORQ: ``<executor>/module.vmfb``
    with the MLIR signature; ONNX Runtime: a session on ``model.onnx``).

    Raises:
        FileNotFoundError: the layer has no compiled module; the backend's own errors.
    """
    backend = backends.make_backend(executor)
    layer = LayerFolder(layer_dir)
    if backend.needs_mlir:
        module = layer.executor(name).module
        if not module.is_file():
            raise FileNotFoundError(f"no compiled module {module}")
        art = CompiledArtifact(path=str(module), compile_ms=None, info={"signature": parse_mlir_signature(layer.mlir)})
    else:
        art = CompiledArtifact(path=None, compile_ms=None, info={"onnx_path": str(layer.model)})
    outs, _ = backend.run(art, inputs=inputs, input_names=meta["input_names"], output_names=meta["output_names"],
                          work_dir=str(work), timeout_s=timeout_s, log_path=None)
    return outs
