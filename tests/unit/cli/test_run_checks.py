"""``run``'s checks before any job (commands/run.py check_runnable): an executor that cannot run
on this machine and a compiler JSON key that names no op are one-line bad input."""

import pytest

from torq_gen_config.backends import iree
from torq_gen_config.commands.run import check_runnable
from torq_gen_config.core.errors import ReportError

EXECUTORS = [{"name": "llvm-cpu", "backend": "iree", "options": {"target": "llvm-cpu"}},
             {"name": "cuda", "backend": "iree", "options": {"target": "cuda"}}]
CONFIG = {"executors": EXECUTORS, "compiler_options": [], "runtime_options": [], "timeout_s": 5}
MLIR = "module {\n  func.func @main(%arg0: !torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> {\n" \
       "    %0 = torch.operator \"onnx.Relu\"(%arg0) : (!torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32>\n" \
       "    return %0 : !torch.vtensor<[2],f32>\n  }\n}\n"


def test_an_unavailable_gpu_executor_is_named_with_its_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(iree.IreeBackend, "unavailable_reason",
                        lambda self, timeout_s=60.0: "no cuda device" if self.target == "cuda" else None)
    sel = {"source_file": "r.json", "layers": {"Relu_y": {"executor": "cuda"}}, "locations": None}
    with pytest.raises(ReportError, match="assigns executor 'cuda' \\(e.g. to Relu_y\\), which cannot run on this "
                                          "machine: no cuda device"):
        check_runnable(sel, CONFIG, tmp_path)
    check_runnable({**sel, "layers": {"Relu_y": {"executor": "llvm-cpu"}}}, CONFIG, tmp_path)


def test_a_compiler_json_key_that_names_no_op(tmp_path):
    (tmp_path / "full.mlir").write_text(MLIR)
    sel = {"source": "compiler_json", "source_file": "c.json", "layers": None,
           "locations": {"3:10": "llvm-cpu", "99:10": "llvm-cpu"}}
    with pytest.raises(ReportError, match="c.json: op_assignments key '99:10' names no op of"):
        check_runnable(sel, CONFIG, tmp_path)
    check_runnable({**sel, "locations": {"3:10": "llvm-cpu"}}, CONFIG, tmp_path)
    check_runnable(sel, {**CONFIG, "quantize": True}, tmp_path)  # keys of the quantized model's MLIR: not checked


def test_module_mode_with_an_if_body_op_elsewhere_is_refused(tmp_path):
    """A compiler JSON that puts an If's body op elsewhere than the If: --run-mode module is
    impossible (one line before any job); auto leaves it to the plan (partitions, with the reason)."""
    import onnx
    from conftest import if_model

    from torq_gen_config.mlir.importer import import_full_model

    onnx.save(if_model(), tmp_path / "if.onnx")
    loc = import_full_model(tmp_path / "if.onnx", tmp_path / "full.mlir")
    if_key = f"{loc['nodes'][2]['line']}:{loc['nodes'][2]['col']}"
    from torq_gen_config.fullrun.module.mode import region_keys_of

    body = region_keys_of(tmp_path / "full.mlir")[if_key][0]
    sel = {"source": "compiler_json", "source_file": "c.json", "layers": None,
           "locations": {if_key: "llvm-cpu", body: "vmvx"}}
    with pytest.raises(ReportError, match="--run-mode module is impossible: an op with bodies"):
        check_runnable(sel, {**CONFIG, "run_mode": "module"}, tmp_path)
    check_runnable(sel, {**CONFIG, "run_mode": "auto"}, tmp_path)


def test_a_run_that_did_not_pass_on_sizes_the_tool_chose_says_so():
    """run's closing note: the sizes the tool chose for dynamic dims are the first suspect
    of a failing run (a fresh user's model whose Reshape needed other sizes)."""
    from torq_gen_config.commands.run import chosen_sizes_note

    chosen = {"provenance": {"model": {"fixed_dims": [
        {"input": "x", "axis": 0, "was": "batch", "to": 1, "source": "default 1"},
        {"input": "x", "axis": 2, "was": "h", "to": 64, "source": "the model's stride 32"}]}}}
    given = {"provenance": {"model": {"fixed_dims": [
        {"input": "x", "axis": 2, "was": "h", "to": 640, "source": "--input-shapes"}]}}}
    note = chosen_sizes_note(chosen, {"status": "error"})
    assert note.startswith("Note: the tool chose the sizes of dynamic input dims (x dim 2 = 64)")
    assert "--input-shapes" in note
    assert chosen_sizes_note(chosen, {"status": "success"}) is None
    assert chosen_sizes_note(given, {"status": "difference"}) is None
    assert chosen_sizes_note(None, {"status": "error"}) is None
