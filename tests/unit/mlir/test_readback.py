"""Where each op ran, read back (mlir/readback.py): an op's own kernels decide; a location
fused from several ops (IREE merged identical ops of two layers: the same broadcast in two
LayerNormalizations, a QuantizeLinear's load merged into the next dispatch) only counts for
an op with no kernel of its own (found by a fresh-user test of issue 38: LayerNormalization
on llvm-cpu reported as "ran on llvm-cpu, vmvx" because LN2's vmvx kernel held a merged op)."""

from __future__ import annotations

from torq_gen_config.mlir.readback import read_placement

DEVICES = {"device_llvm_cpu": "llvm-cpu", "device_vmvx": "vmvx"}


def test_merged_locations_do_not_move_an_op_with_its_own_kernel():
    flow = [{"loc": ["15:11"], "executable": "d0", "ops": ["15:11"], "merged": []},
            {"loc": ["26:11"], "executable": "d11", "ops": ["26:11"], "merged": ["15:11"]},
            {"loc": ["30:11"], "executable": "d12", "ops": ["30:11"], "merged": ["40:11"]}]
    stream = [{"loc": ["15:11"], "executable": "d0", "device": "device_llvm_cpu"},
              {"loc": ["26:11"], "executable": "d11", "device": "device_vmvx"},
              {"loc": ["30:11"], "executable": "d12", "device": "device_vmvx"}]
    p = read_placement(flow=flow, stream=stream, devices=DEVICES,
                       assignment={"15:11": "llvm-cpu", "26:11": "vmvx", "30:11": "vmvx", "40:11": "llvm-cpu",
                                   "50:11": "llvm-cpu"})
    ops = p["ops"]
    assert ops["15:11"] == {"assigned": "llvm-cpu", "ran_on": ["llvm-cpu"], "status": "as assigned"}
    assert ops["26:11"]["status"] == "as assigned"
    # no kernel of its own: the merged op is where it ran (elsewhere here), never hidden
    assert ops["40:11"] == {"assigned": "llvm-cpu", "ran_on": ["vmvx"], "status": "elsewhere"}
    assert ops["50:11"]["status"] == "no kernel" and p["elsewhere"] == ["40:11"]
