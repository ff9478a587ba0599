"""The README's usage examples, executed: the docs never rot (Polygraphy's test_examples).

Which blocks: every fenced ```bash block whose first command starts with
``torq-gen-config``, ``snakemake``, ``ck-profile`` or ``rm`` (the usage examples; the
install and test blocks start with ``python3``/``.`` and are not rerun). Each line is one
command (trailing ``# ...`` comments dropped). They run verbatim in a scratch copy of the
workflow files (Snakefile, rules/, config/, profiles/, scripts/), with the README's
placeholder inputs made real there: ``path/to/model.onnx`` and ``m.onnx`` are a small
Conv/Relu/MaxPool model, ``light_squeezenet.onnx`` is onnx's light_squeezenet,
``conv_repros_ir.json`` the three cheapest convolutions of the ResNet-50 trace of ``tests/data``. A command that
needs what this machine lacks (ROCm's ckProfiler, TORQ's tools, a GPU, a SLURM cluster, the network) is
skipped with the reason. Each command must exit 0 (``run``: 0, the outputs match) and
write the files it promises (the report and compiler JSON of its model and output
directory, a Snakemake target, a converted or results file).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, SQUEEZENET
from test_output_schemas import small_cnn

README = REPO / "README.md"
EXAMPLE_WORDS = ("torq-gen-config", "snakemake", "ck-profile", "rm")
WORKFLOW_FILES = ("Snakefile", "rules", "config", "profiles", "scripts")
# a command that mentions one of these cannot run here: the reason
NEEDS = {
    "--profiler-path": "needs AMD's ckProfiler (ROCm), not installed here",
    "ck_profiler_path=": "needs AMD's ckProfiler (ROCm), not installed here",
    "config/torq.yaml": "needs TORQ's torq-compile/torq-run-module, not installed here",
    "target: cuda": "needs an NVIDIA GPU",
    "profiles/slurm": "needs a SLURM cluster (tests/workflow/test_slurm_e2e.py runs these forms on a local one)",
    "http://": "needs the network", "https://": "needs the network",
}


def example_blocks(text: str) -> list[list[str]]:
    """The commands of each usage-example block of ``text`` (see the module docstring)."""
    blocks = []
    for body in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        body = body.replace("\\\n", " ")
        cmds = [shlex.join(shlex.split(line, comments=True)) for line in body.splitlines()
                if shlex.split(line, comments=True)]
        if cmds and cmds[0].split()[0] in EXAMPLE_WORDS:
            blocks.append(cmds)
    return blocks


def report_files(out: str, model: str) -> list[str]:
    name = Path(model).stem
    return [f"{out}/torq_gen_config_{name}.json", f"{out}/torq_gen_config_{name}_compiler.json"]


def promised_files(cmd: str) -> list[str]:
    """The files ``cmd`` promises to write (relative to its working directory)."""
    argv = shlex.split(cmd)
    opts = dict(zip(argv, argv[1:]))
    if argv[0] == "torq-gen-config" and argv[1] in ("discover", "run"):
        return report_files(opts["--output-dir"], opts["--model"])
    if argv[0] == "torq-gen-config" and argv[1] == "report":
        return [f"{opts['--output-dir']}/torq_gen_config_{Path(opts['--model']).stem}.html"]
    if argv[0] == "snakemake" and "--report" in argv:
        return [opts["--report"]]
    if argv[0] == "snakemake" and "report_html" in argv and "--config" not in argv:
        return [f"results/{SQUEEZENET.stem}/torq_gen_config_{SQUEEZENET.stem}.html"]
    if argv[0] == "snakemake":
        targets = [a for a in argv[1:] if a.endswith(".json") and "=" not in a]
        if targets:
            return targets
        if "ck_profile" in argv:
            return []
        config = dict(a.split("=", 1) for a in argv[argv.index("--config") + 1:] if "=" in a) if "--config" in argv else {}
        model = config.get("model", SQUEEZENET.name)
        return report_files(config.get("output_dir", f"results/{Path(model).stem}"), model)
    if argv[0] == "ck-profile" and argv[1] == "convert":
        return [argv[3]]
    if argv[0] == "ck-profile" and argv[1] == "run":
        return [opts.get("--output", "profiler_results.json")]
    return []


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A scratch directory with the workflow files and the README's example inputs."""
    root = tmp_path_factory.mktemp("readme")
    for name in WORKFLOW_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, root / name)
    (root / "path" / "to").mkdir(parents=True)
    small_cnn(root / "path" / "to" / "model.onnx")
    shutil.copy2(root / "path" / "to" / "model.onnx", root / "m.onnx")
    shutil.copy2(SQUEEZENET, root / "light_squeezenet.onnx")
    # the three cheapest convolutions of the ResNet-50 trace (all 106 at batch 32 take minutes on ORT)
    records = json.loads((REPO / "tests" / "data" / "resnet50_conv_ir.json").read_text())
    (root / "conv_repros_ir.json").write_text(json.dumps(sorted(records, key=_cost)[:3]))
    return root


def _cost(record: dict) -> int:
    """Input elements times weight elements: the order of a convolution's work."""
    args = record["replay_ir"]["list_pos_args"]
    return int(np.prod(args[0]["value"]["shape"])) * int(np.prod(args[1]["value"]["shape"]))


def test_readme_has_usage_examples():
    blocks = example_blocks(README.read_text())
    words = {cmd.split()[0] for block in blocks for cmd in block}
    assert {"torq-gen-config", "snakemake", "ck-profile"} <= words, blocks
    assert not any(cmd.startswith(("python3 -m venv", "pip ")) for block in blocks for cmd in block)


def test_example_selection_and_promises():
    text = "x\n```bash\npip install -e .\n```\n```bash\ntorq-gen-config discover --model a/b.onnx --output-dir o  # c\n```\n"
    assert example_blocks(text) == [["torq-gen-config discover --model a/b.onnx --output-dir o"]]
    assert promised_files("snakemake --cores 2") == report_files("results/light_squeezenet", "light_squeezenet.onnx")
    assert promised_files("snakemake --cores 2 --config model=m.onnx output_dir=out/m") == report_files("out/m", "m")
    assert promised_files("torq-gen-config report --model a/m.onnx --output-dir o") == ["o/torq_gen_config_m.html"]
    assert promised_files("snakemake --report r/s.html report_html") == ["r/s.html"]


@pytest.mark.slow
def test_readme_examples_run(checkout):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    ran, skipped = [], []
    for block in example_blocks(README.read_text()):
        if any(c.startswith("torq-gen-config view out/torq_gen_config_light_squeezenet") or "light_squeezenet.onnx --output-dir out" in c
               for c in block) and not (checkout / "out" / "torq_gen_config_light_squeezenet.json").exists():
            # the review examples read a discovery of light_squeezenet in out/: the default run's
            shutil.copytree(checkout / "results" / "light_squeezenet", checkout / "out", dirs_exist_ok=True)
        for cmd in block:
            reason = next((why for key, why in NEEDS.items() if key in cmd), None)
            if reason:
                skipped.append(f"{cmd}: {reason}")
                continue
            t0 = time.perf_counter()
            r = subprocess.run(["bash", "-c", cmd], cwd=checkout, env=env, capture_output=True, text=True, timeout=900)
            print(f"{time.perf_counter() - t0:6.1f} s  {cmd}")
            assert r.returncode == 0, f"`{cmd}` exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            missing = [f for f in promised_files(cmd) if not (checkout / f).is_file()]
            assert not missing, f"`{cmd}` did not write {missing}"
            ran.append(cmd)
    assert len(ran) >= 12, ran
    # what the review and run examples promise, beyond exit 0
    report = json.loads((checkout / "out" / "torq_gen_config_light_squeezenet.json").read_text())
    assert report["ops"]["Relu_r1"]["recommended_executor"] is None
    assert report["ops"]["Conv_r0"]["recommended_executor"] == "vmvx"
    model_report = json.loads((checkout / "out" / "torq_gen_config_model.json").read_text())
    assert model_report["full_model"]["status"] == "success"
    print("skipped README commands:\n" + "\n".join(skipped))
