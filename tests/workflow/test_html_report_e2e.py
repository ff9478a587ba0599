"""The HTML report of a real discovery, opened in a real browser.

A small model where IREE fails on one layer (LpPool: compile errors on llvm-cpu and vmvx,
ONNX Runtime runs it) is discovered with timing and run as a whole model; then
``torq-gen-config report`` and the Snakemake forms (``report_html``, ``--report``) write
their pages, and headless Chromium (Debian's ``chromium``, driven by playwright) opens the
page with every network request refused, takes a screenshot and checks that the matrix
and the plots rendered, that a click on a cell shows its message, and that the console
has no error; and that the model graph (report/graph.py) draws one node per layer, shows a
layer's verdicts and full-model placement on a click, is not blank, changes colours with
the switch, and that its search finds a layer.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import run_cli, run_snakemake
from test_e2e import lppool_model

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.slow


def browse(page_path: Path, screenshot: Path) -> dict:
    """Open ``page_path`` in headless Chromium with the network refused; returns what
    rendered: ``errors`` (console errors and page exceptions), ``requests`` (URLs other
    than the file that were asked for), ``plots`` ({div id: number of SVG marks}),
    ``detail`` (the click panel's text after clicking the matrix's first cell), ``graph``
    (:func:`graph_checks`)."""
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium not installed (apt-get install chromium; .ci/run installs it)")
    found: dict = {"errors": [], "requests": []}
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("console", lambda m: found["errors"].append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: found["errors"].append(str(e)))

            def refuse(route):
                if route.request.url.startswith("file:"):
                    return route.continue_()
                found["requests"].append(route.request.url)
                return route.abort()

            page.route("**/*", refuse)
            page.goto(page_path.resolve().as_uri())
            page.wait_for_selector("#status-matrix .main-svg", timeout=30000)
            found["plots"] = page.evaluate("""() => Object.fromEntries(
                [...document.querySelectorAll('.plotly-graph-div')].map(d => [d.id,
                 d.querySelectorAll('.heatmaplayer image, .point, .bars path, .boxlayer path').length]))""")
            # the matrix's top in view (the model graph is above it)
            page.evaluate("() => document.getElementById('status-matrix').scrollIntoView({block: 'start'})")
            box = page.locator("#status-matrix .nsewdrag").first.bounding_box()
            x, y = box["x"] + box["width"] / 6, box["y"] + 4  # the first layer on the first executor
            page.mouse.move(x, y)
            page.wait_for_timeout(200)
            page.mouse.click(x, y)
            page.wait_for_timeout(300)
            found["detail"] = page.locator("#cell-detail").inner_text()
            found["graph"] = graph_checks(page, screenshot.with_name("graph.png"))
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return found


def graph_checks(page, screenshot: Path) -> dict:
    """Drive the model graph: ``nodes`` (drawn), ``detail`` (panel text after clicking the
    second node), ``colours`` (distinct colours in its screenshot), ``ink`` (share of pixels
    that are not the background), ``fills`` ({mode: node fills}), ``search`` ([selected node,
    result line] after searching the last layer's ID)."""
    import base64

    out: dict = {}
    page.wait_for_selector("#graph-box[data-done-ms]", timeout=30000)
    page.locator("#graph-svg").scroll_into_view_if_needed()
    out["nodes"] = page.locator("#graph-svg .gnode").count()
    page.locator("#graph-svg .gnode").nth(1).click()
    page.wait_for_timeout(200)
    out["detail"] = page.locator("#graph-detail").inner_text()
    shot = page.locator("#graph-svg").screenshot(path=str(screenshot))
    # count the screenshot's colours in the page itself (a canvas; no image library here)
    out["colours"], out["ink"] = page.evaluate("""async (src) => {
        const img = new Image(); img.src = src; await img.decode();
        const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
        const g = c.getContext('2d'); g.drawImage(img, 0, 0);
        const d = g.getImageData(0, 0, c.width, c.height).data, seen = new Set(); let ink = 0;
        for (let i = 0; i < d.length; i += 4) {
          seen.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
          if (!(d[i] > 245 && d[i + 1] > 245 && d[i + 2] > 245)) ink++;
        }
        return [seen.size, ink / (d.length / 4)];
    }""", "data:image/png;base64," + base64.b64encode(shot).decode())
    fills = "() => [...document.querySelectorAll('#graph-svg .gbody')].map(r => r.getAttribute('fill'))"
    out["fills"] = {"worst": page.evaluate(fills)}
    page.locator('input[name="graph-color"][value="rec"]').check()
    page.wait_for_timeout(200)
    out["fills"]["rec"] = page.evaluate(fills)
    out["mode"] = page.locator("#graph-box").get_attribute("data-mode")
    last = page.evaluate("() => JSON.parse(document.getElementById('graph-data').textContent).nodes.slice(-1)[0].id")
    page.fill("#graph-search", last)
    page.press("#graph-search", "Enter")
    page.wait_for_timeout(300)
    out["search"] = [page.locator("#graph-box").get_attribute("data-selected"),
                     page.locator("#graph-search-result").inner_text(), page.locator("#graph-detail").inner_text()]
    return out


def test_html_report_in_chromium(tmp_path):
    model = lppool_model(tmp_path / "failing.onnx")
    out = tmp_path / "out"
    r = run_cli("discover", "--model", model, "--output-dir", out, "-j", "2", "-q", "--collect-timing",
                "--timing-runs", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_cli("run", "--model", model, "--output-dir", out, "-j", "2", "-q")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    r = run_cli("report", "--model", model, "--output-dir", out)
    page = out / "torq_gen_config_failing.html"
    assert r.returncode == 0 and r.stdout.strip() == f"HTML report: {page}", r.stdout + r.stderr
    text = page.read_text()
    report = json.loads((out / "torq_gen_config_failing.json").read_text())
    assert report["full_model"]["status"] == "success"
    for needle in ("Full-model comparison", "partitions", "compile", "LpPool_p"):
        assert needle in text, needle

    found = browse(page, tmp_path / "report.png")
    if os.environ.get("HTML_REPORT_SCREENSHOT"):  # to look at it: HTML_REPORT_SCREENSHOT=/tmp/shot.png
        shutil.copy(tmp_path / "report.png", os.environ["HTML_REPORT_SCREENSHOT"])
    assert found["errors"] == [] and found["requests"] == [], found
    plots = found["plots"]
    assert plots["status-matrix"] >= 1  # the heatmap's cell image
    for div in ("op-types", "timing", "speedup", "error-stages"):
        assert plots.get(div, 0) > 0, (div, plots)
    first = next(iter(report["ops"]))
    assert first in found["detail"] and "llvm-cpu" in found["detail"], found["detail"]

    # the model graph: a node per layer (3: nothing collapsed), a click shows the layer's verdicts
    # and where the full-model run put it, a drawing that is not blank, the colour switch, the search
    g = found["graph"]
    layers = list(report["ops"])
    assert g["nodes"] == len(layers) == 3, g
    assert layers[1] in g["detail"] and "LpPool" in g["detail"] and "failed to legalize" in g["detail"], g["detail"]
    assert "full-model run (success): on ort" in g["detail"], g["detail"]
    assert g["colours"] >= 8 and g["ink"] > 0.01, g  # nodes, edges and text on the background
    assert g["mode"] == "rec" and g["fills"]["worst"] != g["fills"]["rec"], g["fills"]
    assert len(g["fills"]["rec"]) == 3
    assert g["search"][0] == "n:2" and layers[2] in g["search"][1] and layers[2] in g["search"][2], g["search"]

    # the Snakemake forms: the rule writes the same page; --report packs it with its caption
    cfg = ["--config", f"model={model}", f"output_dir={out}"]
    (page).unlink()
    r = run_snakemake("--cores", "1", "report_html", *cfg)
    assert r.returncode == 0, r.stderr[-3000:]
    assert page.read_text().count('id="status-matrix"') == 1
    r = run_snakemake("--report", str(out / "snakemake_report.html"), "report_html", *cfg)
    assert r.returncode == 0, r.stderr[-3000:]
    packed = (out / "snakemake_report.html").read_text(errors="replace")
    assert "torq_gen_config_failing.html" in packed and "Executor discovery of" in packed
