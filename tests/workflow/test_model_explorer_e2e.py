"""The Model Explorer overlays of a real discovery, shown by the real Model Explorer.

A small model with a named MatMul, unnamed nodes, two nodes of one name and a chain the
product folds (Shape of a static shape -> Cast -> ReduceSum) is discovered with timing
(llvm-cpu and ort); ``torq-gen-config report --model-explorer`` writes the overlays; every
key is a node id of the model as Model Explorer's ONNX adapter converts it. Then the Model
Explorer server (``model-explorer ... --no_open_in_browser``, offline: its web app is in the
wheel) opens the model with the overlays in headless Chromium with every request outside
localhost refused: the node-data table shows the values in their colours, and the expanded
graph has nodes drawn in them. ``MODEL_EXPLORER_SCREENSHOT=/tmp/x.png`` keeps the screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

from conftest import folding_model, run_cli

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
MODEL_EXPLORER = Path(sys.executable).parent / "model-explorer"
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(model: Path, files: list[Path], log: Path) -> tuple[subprocess.Popen, str]:
    """The Model Explorer server on a free port with the ONNX adapter; (process, URL)."""
    proc = subprocess.Popen([str(MODEL_EXPLORER), str(model), "--extensions=model_explorer_onnx",
                             f"--node_data_paths={','.join(map(str, files))}", "--no_open_in_browser",
                             "--port", str(_free_port())],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"(http://localhost:\d+/\?data=\S+)", log.read_text())
        if found:
            return proc, found.group(1)
        assert proc.poll() is None, log.read_text()
        time.sleep(0.5)
    raise AssertionError(f"no server URL in 120 s:\n{log.read_text()}")


def _count_colours(page, png: bytes, colours: dict[str, tuple[int, int, int]]) -> dict[str, int]:
    """Pixels of each colour (within 6 per channel) in a PNG, counted by the browser."""
    page.set_content("<canvas id=c></canvas>")
    return page.evaluate("""async ([src, colours]) => {
        const img = new Image(); img.src = src; await img.decode();
        const c = document.getElementById('c'); c.width = img.width; c.height = img.height;
        const g = c.getContext('2d'); g.drawImage(img, 0, 0);
        const d = g.getImageData(0, 0, img.width, img.height).data;
        const out = {};
        for (const [name, [r, gg, b]] of Object.entries(colours)) {
            let n = 0;
            for (let i = 0; i < d.length; i += 4)
                if (Math.abs(d[i] - r) <= 6 && Math.abs(d[i + 1] - gg) <= 6 && Math.abs(d[i + 2] - b) <= 6) n++;
            out[name] = n;
        }
        return out;
    }""", ["data:image/png;base64," + base64.b64encode(png).decode(), colours])


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def test_overlays_in_model_explorer(tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    from model_explorer_onnx.main import ONNXAdapter

    model = tmp_path / "small.onnx"
    onnx.save(folding_model(), model)
    out = tmp_path / "out"
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "--skip-executors", "vmvx",
                "--collect-timing", "--timing-runs", "3", "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "torq_gen_config_small.json").read_text())
    assert [f["op_type"] for f in report["folded_nodes"]] == ["Shape", "Cast", "ReduceSum"]

    me = tmp_path / "me"
    r = run_cli("report", "--model", model, "--output-dir", out, "--model-explorer", me)
    assert r.returncode == 0, r.stderr[-3000:]
    line = r.stdout.strip().splitlines()[-1].strip()
    assert line.startswith(f"model-explorer {model} --extensions=model_explorer_onnx --node_data_paths="), r.stdout
    files = [Path(p) for p in line.split("--node_data_paths=", 1)[1].split(",")]
    assert [p.name for p in files] == ["recommended.json", "verdict_llvm-cpu.json", "max_rel_diff_llvm-cpu.json",
                                       "runtime_llvm-cpu.json", "verdict_ort.json", "max_rel_diff_ort.json",
                                       "runtime_ort.json"]

    graph = ONNXAdapter().convert(str(model), {})["graphs"][0]
    labels = {n.id: n.label for n in graph.nodes}
    rec = json.loads(files[0].read_text())[graph.id]["results"]
    assert {labels[k] for k in rec} == {"MatMul", "Relu", "Mul", "Add", "Sigmoid", "Shape", "Cast", "ReduceSum"}
    assert {k for k, v in rec.items() if v["value"] == "folded"} == {"shape_fold", "node_2", "sum_fold"}
    for p in files:
        (gid, data), = json.loads(p.read_text()).items()
        assert gid == graph.id and set(data["results"]) <= set(labels), p

    if not Path(CHROMIUM).exists():
        pytest.skip("chromium not installed (apt-get install chromium; .ci/run installs it)")
    proc, url = _start_server(model, [files[0], files[1]], tmp_path / "server.log")
    refused, errors = [], []
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.on("pageerror", lambda e: errors.append(str(e)))

                def local_only(route):
                    if route.request.url.startswith("http://localhost"):
                        return route.continue_()
                    refused.append(route.request.url)
                    return route.abort()

                page.route("**/*", local_only)
                page.goto(url)
                page.wait_for_selector("text=verdict_llvm-cpu.json", timeout=60000)
                page.wait_for_function("() => [...document.querySelectorAll('td.value-col')]"
                                       ".some(td => td.innerText.trim() === 'folded')", timeout=60000)
                cells = page.evaluate("""() => [...document.querySelectorAll('td.value-col')].map(td =>
                    [td.parentElement.querySelector('td.node-label')?.innerText.trim(), td.innerText.trim(),
                     getComputedStyle(td).backgroundColor])""")
                page.locator("text=unfold_more_double").first.click()  # expand all layers
                page.wait_for_timeout(3000)
                shot = page.screenshot(clip={"x": 0, "y": 0, "width": 1000, "height": 900})
                if os.environ.get("MODEL_EXPLORER_SCREENSHOT"):
                    Path(os.environ["MODEL_EXPLORER_SCREENSHOT"]).write_bytes(shot)
                pixels = _count_colours(browser.new_page(), shot, {
                    "success": _rgb("#2e7d32"), "folded": _rgb("#b0bec5"), "llvm-cpu": _rgb("#1e88e5")})
            finally:
                browser.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert not errors, errors
    assert all(u.startswith("https://fonts.gstatic.com/") for u in refused), refused  # only the web font
    by_node = {(label, value): bg for label, value, bg in cells}
    assert by_node[("Shape", "folded")] == "rgb(176, 190, 197)"
    assert by_node[("MatMul", "success")] == "rgb(46, 125, 50)"
    assert by_node[("MatMul", rec["matmul0"]["value"])].startswith("rgb(")
    assert not [c for c in cells if c[0] == "Constant" and c[1] != "-"]  # a Constant node has no data
    # the graph, expanded: layers drawn in a verdict or executor colour, the folded chain in grey
    assert pixels["folded"] > 1000 and pixels["success"] + pixels["llvm-cpu"] > 1000, pixels
