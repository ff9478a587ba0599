"""Tests of torq_gen_config.discovery.batch_compile: batch plans, one compile per batch with the
real IREE compiler, failing layers left to compile alone (located, bisected, timeout)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from torq_gen_config import backends
from torq_gen_config.discovery import batch_compile
from torq_gen_config.backends.base import CompiledArtifact, StageError
from torq_gen_config.discovery.batch_compile import (
    ALONE,
    COMPILED,
    IMPORT_FAILED,
    compile_batch,
    member_artifact,
    plan_batches,
    settings_key,
)
from torq_gen_config.mlir.importer import import_model
from torq_gen_config.pipeline.steps.layer_tests import compile_batch_job

vi = h.make_tensor_value_info
VMVX = {"name": "vmvx", "backend": "iree", "options": {"target": "vmvx"}}


def _model(op: str, **attrs) -> onnx.ModelProto:
    if op == "Conv":
        w = numpy_helper.from_array(np.full((2, 2, 1, 1), 0.5, np.float32), "w")
        node, inits, out = h.make_node("Conv", ["x", "w"], ["y"]), [w], [1, 2, 4, 4]
    else:
        node, inits = h.make_node(op, ["x"], ["y"], **attrs), []
        out = [1, 2, 3, 3] if op == "LpPool" else [1, 2, 4, 4]
    g = h.make_graph([node], "main", [vi("x", T.FLOAT, [1, 2, 4, 4])], [vi("y", T.FLOAT, out)], initializer=inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def members(tmp_path_factory) -> list[dict]:
    d = tmp_path_factory.mktemp("layers")
    out = []
    for slug, model in (("Conv_a", _model("Conv")), ("LpPool_b", _model("LpPool", kernel_shape=[2, 2])),
                        ("Relu_c", _model("Relu")), ("Neg_d", _model("Neg"))):
        (d / slug).mkdir()
        import_model(model, d / slug / "model.mlir")
        (d / slug / "import.json").write_text(json.dumps({"status": "ok"}))
        out.append({"slug": slug, "layer_id": slug, "mlir": str(d / slug / "model.mlir"),
                    "import_status": str(d / slug / "import.json")})
    return out


def test_plan_batches_ids_follow_membership():
    plan = plan_batches([f"L{i}" for i in range(5)], 2)
    assert [b["members"] for b in plan] == [["L0", "L1"], ["L2", "L3"], ["L4"]]
    assert [b["id"][:5] for b in plan] == ["0000-", "0001-", "0002-"]
    assert plan == plan_batches([f"L{i}" for i in range(5)], 2)  # stable
    other = plan_batches(["L0", "X", "L2", "L3", "L4"], 2)
    assert other[0]["id"] != plan[0]["id"] and other[1:] == plan[1:]  # only the changed batch gets a new id
    assert plan_batches([], 4) == []
    with pytest.raises(ValueError):
        plan_batches(["a"], 0)


def test_plan_batches_ids_are_slots_of_the_settings():
    """Ids are slots (index + settings key), not memberships: another membership keeps the
    directories (its batch jobs rerun by their members param), other settings do not."""
    key = settings_key({"name": "vmvx", "options": {"target": "vmvx"}})
    assert len(key) == 10 and key == settings_key({"options": {"target": "vmvx"}, "name": "vmvx"})
    assert key != settings_key({"name": "vmvx", "options": {"target": "llvm-cpu"}})
    plan = plan_batches([f"L{i}" for i in range(5)], 2, key)
    assert [b["members"] for b in plan] == [["L0", "L1"], ["L2", "L3"], ["L4"]]
    assert [b["id"] for b in plan] == [f"000{i}-{key}" for i in range(3)]
    assert plan == plan_batches([f"L{i}" for i in range(5)], 2, key)  # stable
    other = plan_batches(["L0", "X", "L2", "L3", "L4"], 2, key)
    assert [b["id"] for b in other] == [b["id"] for b in plan] and other[0]["members"] == ["L0", "X"]
    assert plan_batches([], 4, key) == []
    with pytest.raises(ValueError):
        plan_batches(["a"], 0, key)


def test_failing_layer_leaves_the_batch(members, tmp_path):
    """LpPool fails to compile: its error location names it, the rest compiles in a second run."""
    rec = compile_batch(executor=VMVX, members=members, out_dir=str(tmp_path), timeout_s=300)
    status = {m["slug"]: m["status"] for m in rec["members"]}
    assert status == {"Conv_a": COMPILED, "LpPool_b": ALONE, "Relu_c": COMPILED, "Neg_d": COMPILED}
    assert [c["status"] for c in rec["compiles"]] == ["compile", "ok"] and rec["compiled"] == 3
    assert rec["batch_ms"] == pytest.approx(sum(c["wall_ms"] for c in rec["compiles"]))
    assert json.loads((tmp_path / "batch.json").read_text()) == rec
    assert (tmp_path / "module.vmfb").stat().st_size == rec["module_bytes"] > 0
    art, timing = member_artifact(tmp_path / "batch.json", tmp_path / "module.vmfb", "Relu_c", members[2]["mlir"])
    assert art.info["function"] == "l_Relu_c" and art.compile_ms == pytest.approx(rec["batch_ms"] / 3)
    assert art.info["signature"]["outputs"] == [{"shape": [1, 2, 4, 4], "dtype": "float32"}]
    assert timing["members"] == 3 and timing["compile_ms_is"] == "share"
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(1, 2, 4, 4)
    out, _ = backends.make_backend(VMVX).run(art, inputs={"x": x}, input_names=["x"], output_names=["y"],
                                             work_dir=str(tmp_path / "run"), timeout_s=120, log_path=None)
    np.testing.assert_array_equal(out["y"], np.maximum(x, 0))
    art, timing = member_artifact(tmp_path / "batch.json", tmp_path / "module.vmfb", "LpPool_b", None)
    assert art is None and "failed at this layer" in timing["compiled_alone"]


def test_import_failure_and_unmergeable_mlir(members, tmp_path):
    failed = tmp_path / "import.json"
    failed.write_text(json.dumps({"status": "error", "message": "boom"}))
    empty = tmp_path / "empty.mlir"
    empty.write_text("")
    ms = [{**members[0], "import_status": str(failed)}, {**members[2], "mlir": str(empty)}, members[3]]
    rec = compile_batch(executor=VMVX, members=ms, out_dir=str(tmp_path / "b"), timeout_s=300)
    assert [m["status"] for m in rec["members"]] == [IMPORT_FAILED, ALONE, COMPILED]
    assert "cannot be merged" in rec["members"][1]["reason"]


class _Fake(backends.base.Backend):
    """Fails any compile whose module holds @l_Bad (with no location in the message), or times out."""

    kind = "fake"
    mode = "error"

    def compile(self, *, onnx_path, mlir_path, work_dir, timeout_s, log_path):
        text = Path(mlir_path).read_text()
        if self.mode == "timeout":
            raise StageError("timeout", "fake-compile timed out after 1 s", during="compile")
        if "@l_Bad_" in text:
            raise StageError("compile", "<unknown>:0: error: something went wrong")
        Path(work_dir, "module.vmfb").write_bytes(b"vmfb")
        return CompiledArtifact(path=str(Path(work_dir, "module.vmfb")), compile_ms=1.0, info={"argv": ["fake"]})

    def run(self, *a, **k):
        raise NotImplementedError

    def describe(self, **k):
        return {}


def _fake_members(tmp_path, n_bad, members):
    out = []
    for i in range(8):
        slug = f"Bad_{i}" if i == n_bad else f"Ok_{i}"
        out.append({**members[2], "slug": slug, "layer_id": slug})
    return out


def test_bisection_finds_a_layer_the_errors_do_not_name(members, tmp_path, monkeypatch):
    monkeypatch.setattr(backends, "make_backend", lambda ex: _Fake("f", {}))
    rec = compile_batch(executor={"name": "f", "backend": "fake"}, members=_fake_members(tmp_path, 5, members),
                        out_dir=str(tmp_path), timeout_s=1)
    assert [m["slug"] for m in rec["members"] if m["status"] == ALONE] == ["Bad_5"]
    assert rec["compiled"] == 7 and rec["compiles"][-1]["status"] == "ok"
    assert len(rec["compiles"]) <= 6  # 8 -> halves down to one, then the rest
    assert not (tmp_path / "probe").exists()


def test_timeout_leaves_every_layer_to_compile_alone(members, tmp_path, monkeypatch):
    fake = _Fake("f", {})
    fake.mode = "timeout"
    monkeypatch.setattr(backends, "make_backend", lambda ex: fake)
    rec = compile_batch(executor={"name": "f", "backend": "fake"}, members=_fake_members(tmp_path, 99, members),
                        out_dir=str(tmp_path), timeout_s=1)
    assert {m["status"] for m in rec["members"]} == {ALONE} and rec["compiled"] == 0
    assert "timed out" in rec["members"][0]["reason"] and len(rec["compiles"]) == 1
    assert (tmp_path / "module.vmfb").read_bytes() == b""
    # the job records the timeout: a rerun with a larger --timeout compiles the batch again
    from torq_gen_config.pipeline.markers import TIMED_OUT_SUFFIX, timeout_rerun_token

    job_dir = tmp_path / "job"
    compile_batch_job(executor={"name": "f", "backend": "fake"}, members=_fake_members(tmp_path, 99, members),
                      out_dir=str(job_dir), timeout_s=1)
    assert (job_dir / ("batch.json" + TIMED_OUT_SUFFIX)).read_text().strip() == "1"
    assert timeout_rerun_token(str(job_dir / "batch.json"), 2) is not None


def test_job_writes_its_files_when_the_backend_is_unavailable(members, tmp_path, capsys):
    out = tmp_path / "b"
    compile_batch_job(executor={"name": "x", "backend": "no-such-backend", "options": {}}, members=members[:2],
                      out_dir=str(out), timeout_s=10, log=str(tmp_path / "log"))
    rec = json.loads((out / batch_compile.BATCH_FILE).read_text())
    assert {m["status"] for m in rec["members"]} == {ALONE} and "not compiled" in rec["members"][0]["reason"]
    assert (out / "module.vmfb").read_bytes() == b""
    assert "0 of 2 layers compiled together" in capsys.readouterr().out
