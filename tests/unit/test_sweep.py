"""The model sheet and the sweep's summary (pipeline/sweep.py, report/sweep.py; issue 39
item 1): a sheet's one-line errors, rows resolved against the sheet's folder with their
own config files, a model that cannot be read kept as a row with its reason, and the
summary (models x executors, op type x executor) valid against its schema."""

from __future__ import annotations

import json

import pytest
from onnx import TensorProto as T
from onnx import helper as h

from conftest import make_model, tvi
from sample_report import make_report
from torq_gen_config.core.errors import ConfigError
from torq_gen_config.core.schemas import validator
from torq_gen_config.pipeline.sweep import read_model_sheet, sweep_rows
from torq_gen_config.report.sweep import build_sweep, render_sweep_html


def _sheet(tmp_path, text: str):
    p = tmp_path / "models.tsv"
    p.write_text(text)
    return p


@pytest.mark.parametrize("text, message", [
    ("model\tname_x\na.onnx\tA\n", "needs the columns name and model"),
    ("name\tmodel\tcolour\na\ta.onnx\tred\n", "unknown column 'colour'"),
    ("name\tmodel\n1a\ta.onnx\n", "row 2 (name): '1a' does not match"),
    ("name\tmodel\na\ta.onnx\na\tb.onnx\n", "row 3: name 'a' is also row 2"),
    ("name\tmodel\na\ta.onnx\textra\n", "row 2: more cells than columns"),
    ("name\tmodel\n", "no model rows"),
])
def test_sheet_errors_are_one_line(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_model_sheet(_sheet(tmp_path, text))
    with pytest.raises(ConfigError, match="no such file"):
        read_model_sheet(tmp_path / "missing.tsv")


def test_rows_resolve_paths_and_configs_and_keep_a_broken_model(tmp_path):
    import onnx

    (tmp_path / "m").mkdir()
    onnx.save(make_model([h.make_node("Relu", ["x"], ["y"])], [tvi("x", T.FLOAT, ["N", 4])],
                         [tvi("y", T.FLOAT, ["N", 4])]), tmp_path / "m" / "relu.onnx")
    (tmp_path / "strict.yaml").write_text("tolerance: {fp_avg_tol: 0.001, fp_max_tol: 0.002}\n")
    (tmp_path / "junk.onnx").write_text("not onnx")
    sheet = _sheet(tmp_path, "# the zoo\nname\tmodel\tinput_shapes\tconfig\n"
                             "relu\tm/relu.onnx\tx:2x4\tstrict.yaml\n"
                             "junk\tjunk.onnx\t\t\n"
                             "shipped\tonnx:backend/test/data/light/light_squeezenet.onnx\t\t\n")
    rows = sweep_rows(sheet, {"timeout_s": 60, "models": str(sheet), "output_dir": "zoo"}, "zoo")
    assert [r.name for r in rows] == ["relu", "junk", "shipped"]
    relu, junk, shipped = rows
    assert relu.failure is None and relu.model == str(tmp_path / "m" / "relu.onnx")
    assert relu.config["input_shapes"] == ["x:2x4"] and relu.config["tolerance"]["fp_avg_tol"] == 0.001
    assert relu.config["output_dir"] == "zoo/relu" and relu.config["timeout_s"] == 60 and "models" not in relu.config
    assert relu.prefix == "relu__" and relu.module == "sweep_relu"
    assert junk.failure and "junk.onnx" in junk.failure
    assert shipped.failure is None and shipped.model.startswith("onnx:")


def test_summary_rows_schema_and_page(tmp_path):
    good = make_report()
    good["ops"]["Conv_conv1"]["executors"]["vmvx"]["status"] = "error"
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "torq_gen_config_a.json").write_text(json.dumps({**good, "model_name": "a"}))
    rows = [{"name": "a", "model": "a.onnx", "failure": None, "report": str(tmp_path / "a" / "torq_gen_config_a.json")},
            {"name": "bad", "model": "bad.onnx", "failure": "model file not found: bad.onnx", "report": None}]
    s = build_sweep(rows, sheet="models.tsv", output_dir=str(tmp_path))
    validator("sweep.schema.yaml").validate(s)
    a, bad = s["models"]
    assert a["status"] == "discovered" and a["layers"] == len(good["ops"])
    assert a["statuses"]["vmvx"]["error"] >= 1 and sum(a["recommended"].values()) == len(good["ops"])
    assert bad == {**bad, "status": "failed", "reason": "model file not found: bad.onnx", "layers": None}
    assert s["totals"] == {"models": 2, "failed": 1, "layers": len(good["ops"])}
    conv = s["op_types"]["Conv"]["vmvx"]
    assert conv["failed"] >= 1 and conv["models"] == ["a"]
    page = render_sweep_html(s)
    assert "href='a/torq_gen_config_a.html'" in page and "could not run: model file not found" in page
