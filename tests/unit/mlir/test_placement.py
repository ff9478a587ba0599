"""The placement step (mlir/placement.py) on a small model built with onnx.helper and imported with the
package's importer: devices declared, transfers exactly on the crossing edges, results
transferred back, the compiler JSON's value forms, a key that matches no op. The
stream-level split is tested end to end (tests/workflow/test_one_module_e2e.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from torq_gen_config.core.errors import ConfigError, TorqGenConfigError
from torq_gen_config.mlir.importer import import_full_model
from torq_gen_config.mlir.placement import builtin_tensor_type, place_module

TARGETS = {"cpu": '#hal.executable.target<"llvm-cpu", "embedded-elf-x86_64", {target_triple = '
                  '"x86_64-unknown-unknown-eabi-elf", data_layout = "e-m:e-p270:32:32-p271:32:32-p272:64:64-'
                  'i64:64-i128:128-f80:128-n8:16:32:64-S128", native_vector_size = 16 : i64}>',
           "vm": '#hal.executable.target<"vmvx", "vmvx-bytecode-fb">'}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """conv -> (relu, sigmoid) -> add, and two identical Relus of the input, results of the
    model (a shared executable when they run on two devices). Returns (mlir text, {node name: "L:C"})."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
             helper.make_node("Add", ["r", "s"], ["y"], name="add"),
             helper.make_node("Relu", ["x"], ["p"], name="relu_a"),
             helper.make_node("Relu", ["x"], ["q"], name="relu_b")]
    f = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "main", [helper.make_tensor_value_info("x", f, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", f, [1, 4, 8, 8]),
                               helper.make_tensor_value_info("p", f, [1, 3, 8, 8]),
                               helper.make_tensor_value_info("q", f, [1, 3, 8, 8])], [w])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    d = tmp_path_factory.mktemp("placement")
    onnx.save(model, d / "small.onnx")
    loc = import_full_model(d / "small.onnx", d / "full.mlir")
    assert loc["status"] == "ok" and loc["n_unverified"] == 0
    keys = {n.name: f"{r['line']}:{r['col']}" for n, r in zip(model.graph.node, loc["nodes"])}
    return (d / "full.mlir").read_text(), keys


def _ops(text: str):
    """(name, text) of every op of the placed function, in order."""
    from iree.compiler import ir

    module = ir.Module.parse(text, ir.Context())
    func = next(op.operation for op in module.body.operations if op.operation.name == "func.func")
    return module, [op.operation for op in func.regions[0].blocks[0].operations]


def _transfers(text: str) -> list[tuple[str, str]]:
    """(device symbol, consumer op's ONNX name) per flow.tensor.transfer: where each goes and who reads it."""
    _, ops = _ops(text)
    out = []
    for i, op in enumerate(ops):
        if op.name != "flow.tensor.transfer":
            continue
        target = str(op.attributes["target"]).split("@")[1].rstrip(">")
        back = ops[i + 1]  # torch_c.from_builtin_tensor
        users = [o for o in ops if any(v == back.results[0] for v in o.operands)]
        out.append((target, ",".join(str(u.attributes["name"]).strip('"') if u.name == "torch.operator" else u.name
                                     for u in users)))
    return out


def test_devices_declared_in_order_with_default(small):
    text, keys = small
    res = place_module(text, {keys["relu"]: "vm"}, TARGETS, default="cpu")
    assert [(d["executor"], d["symbol"], d["ordinal"]) for d in res["devices"]] == [
        ("cpu", "device_cpu", 0), ("vm", "device_vm", 1)]
    module, _ = _ops(res["text"])
    globals_ = {str(op.operation.attributes["sym_name"]).strip('"'): str(op.operation.attributes["initial_value"])
                for op in module.body.operations if op.operation.name == "util.global"}
    assert set(globals_) == {"device_cpu", "device_vm"}
    assert '#hal.device.target<"local", {ordinal = 1 : index}, [#hal.executable.target<"vmvx"' in globals_["device_vm"]
    assert str(module.operation.attributes["stream.affinity.default"]) == "#hal.device.affinity<@device_cpu>"


def test_devices_of_different_kinds_get_a_topology(small):
    """A CPU and a CUDA device: links with transparent access both ways (IREE needs them
    to compile, docs/toolchain.md); two local devices get none."""
    text, keys = small
    cuda = '#hal.executable.target<"cuda", "cuda-nvptx-fb">'
    res = place_module(text, {keys["relu"]: "gpu"}, {**TARGETS, "gpu": cuda}, default="cpu",
                       hal_devices={"cpu": "local", "gpu": "cuda"})
    module, _ = _ops(res["text"])
    topo = str(module.operation.attributes["stream.topology"])
    assert "@device_cpu -> @device_gpu = {transparent_access = true}" in topo
    assert "@device_gpu -> @device_cpu = {transparent_access = true}" in topo
    assert res["devices"][1]["hal_device"] == "cuda"
    local, _ = _ops(place_module(text, {keys["relu"]: "vm"}, TARGETS, default="cpu")["text"])
    assert "stream.topology" not in local.operation.attributes


def test_transfers_exactly_on_crossing_edges(small):
    """relu on vm: conv -> relu crosses to vm, relu -> add back to cpu; nothing else."""
    text, keys = small
    res = place_module(text, {keys["conv"]: "cpu", keys["relu"]: "vm"}, TARGETS)
    assert res["transfers"] == 2
    assert sorted(_transfers(res["text"])) == [("device_cpu", "onnx.Add"), ("device_vm", "onnx.Relu")]
    assert res["placed"][keys["relu"]] == "vm" and res["placed"][keys["sig"]] == "cpu"


def test_one_transfer_per_value_and_device(small):
    """relu and sigmoid both on vm read conv's result through ONE transfer."""
    text, keys = small
    res = place_module(text, {keys["relu"]: "vm", keys["sig"]: "vm", keys["add"]: "vm"}, TARGETS, default="cpu")
    moves = _transfers(res["text"])
    assert ("device_vm", "onnx.Relu,onnx.Sigmoid") in moves
    assert ("device_cpu", "func.return") in moves  # add's result goes back to the default device
    assert res["transfers"] == 2 and len(moves) == 2  # relu_a and relu_b follow the default device


def test_results_transferred_back_and_arguments_start_on_default(small):
    text, keys = small
    res = place_module(text, {keys["relu_a"]: "vm", keys["relu_b"]: "vm"}, TARGETS, default="cpu")
    moves = _transfers(res["text"])
    assert moves.count(("device_vm", "onnx.Relu,onnx.Relu")) == 1  # the argument, once, for both Relus
    assert moves.count(("device_cpu", "func.return")) == 2  # each Relu's result
    assert res["transfers"] == 3


def test_all_on_one_executor_needs_no_transfer(small):
    text, keys = small
    res = place_module(text, {k: "vm" for k in keys.values()}, TARGETS)
    assert res["transfers"] == 0 and res["default"] == "vm" and [d["executor"] for d in res["devices"]] == ["vm"]


def test_compiler_json_value_forms(small):
    """Values as in a compiler JSON: {"executor": name}, null (the default device)."""
    text, keys = small
    a = place_module(text, {keys["relu"]: {"executor": "vm"}, keys["sig"]: None}, TARGETS, default="cpu")
    b = place_module(text, {keys["relu"]: "vm"}, TARGETS, default="cpu")
    assert a["transfers"] == b["transfers"] == 2 and a["placed"] == b["placed"]


def test_key_matching_no_op_is_a_one_line_error(small):
    text, keys = small
    with pytest.raises(ConfigError) as e:
        place_module(text, {keys["relu"]: "vm", "999:7": "vm"}, TARGETS)
    assert isinstance(e.value, TorqGenConfigError)
    assert "'999:7'" in str(e.value) and "\n" not in str(e.value)


def test_unknown_executor_is_an_error(small):
    text, keys = small
    with pytest.raises(ConfigError, match="'gpu'"):
        place_module(text, {keys["relu"]: "gpu"}, TARGETS)


def test_locations_kept(small):
    text, keys = small
    res = place_module(text, {keys["relu"]: "vm"}, TARGETS, default="cpu")
    for key in keys.values():
        assert f'loc("full.mlir":{key})' in res["text"] or f'= loc("full.mlir":{key})' in res["text"]
    assert 'loc("placement.transfer")' in res["text"]


def test_builtin_tensor_type():
    assert builtin_tensor_type("!torch.vtensor<[1,4,?],si64>") == "tensor<1x4x?xi64>"
    assert builtin_tensor_type("!torch.vtensor<[],f32>") == "tensor<f32>"
    with pytest.raises(ConfigError):
        builtin_tensor_type("!torch.vtensor<*,unk>")


def test_an_if_body_reads_outer_values_on_the_if_device(tmp_path):
    """An If on ``vm`` whose branches read ``x`` directly (no operand): ``x`` crosses to
    vm for the body (else its kernels follow the data: measured, they ran on the default
    device), and the body ops are placed with the If."""
    from conftest import if_model

    onnx.save(if_model(), tmp_path / "if.onnx")
    loc = import_full_model(tmp_path / "if.onnx", tmp_path / "full.mlir")
    assert loc["status"] == "ok", loc["message"]
    if_key = f"{loc['nodes'][2]['line']}:{loc['nodes'][2]['col']}"
    res = place_module((tmp_path / "full.mlir").read_text(), {if_key: "vm"}, TARGETS, default="cpu")
    body = {k: ex for k, ex in res["placed"].items() if k not in {if_key} and ex == "vm"}
    assert len(body) == 2  # Relu and Neg, with the If
    _, ops = _ops(res["text"])
    if_op = next(o for o in ops if o.name == "torch.operator" and str(o.attributes["name"]) == '"onnx.If"')
    moved = {str(o.results[0]) for o in ops if o.name == "torch_c.from_builtin_tensor"}

    def inner_operands(op):
        for region in op.regions:
            for block in region.blocks:
                for child in block.operations:
                    yield from (str(v) for v in child.operation.operands)
                    yield from inner_operands(child.operation)

    assert moved & set(inner_operands(if_op)), "the body does not read the transferred x"
    assert str(if_op.operands[0]) in moved  # the condition moved too
    assert res["transfers"] == 3  # c and x to vm, y back to cpu


def test_keys_matching_no_op(small, tmp_path):
    """Every key of the importer's ops is found; a key past the end, inside an op's text, on a
    result name, or not line:col is reported."""
    from torq_gen_config.mlir.placement import keys_matching_no_op

    text, keys = small
    (tmp_path / "full.mlir").write_text(text)
    good = list(keys.values())
    line, col = (int(x) for x in good[0].split(":"))
    bad = [f"{line}:{col + 3}", f"{line}:5", "9999:10", "conv"]
    assert keys_matching_no_op(good, tmp_path / "full.mlir") == []
    assert set(keys_matching_no_op(good + bad, tmp_path / "full.mlir")) == set(bad)
