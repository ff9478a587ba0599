"""Which layers of the split get (layer, executor) test jobs: the one copy of the policy
that the workflow (rules/common.smk, the DAG) and the report (report/assemble.py) share.

A layer is not tested when its op type is in ``skip_ops`` (case-insensitive) or the
split marked it ``not_testable`` (e.g. an input or output of unknown type); with
``dedup_layers`` only the first layer of each ``signature`` (same op, attributes,
shapes and constants) is tested, the others copy its verdicts.
"""

from __future__ import annotations

from typing import Iterable, Mapping

__all__ = ["TEST", "SKIP_OPS", "NOT_TESTABLE", "DUPLICATE", "plan_layer_tests"]

TEST, SKIP_OPS, NOT_TESTABLE, DUPLICATE = "test", "skip_ops", "not_testable", "duplicate"


def plan_layer_tests(layers: Iterable[Mapping], skip_ops: Iterable[str] = (),
                     dedup_layers: bool = False) -> dict[str, tuple[str, str | None]]:
    """What happens to each layer of a manifest.

    Args:
        layers: the manifest's layers in order (``layer_id``, ``op_type``, ``signature``,
            optional ``not_testable``).
        skip_ops: op types not tested (``--skip-ops``), any case.
        dedup_layers: test only the first layer of each signature (``--dedup-layers``).

    Returns:
        ``{layer_id: (decision, first)}`` in manifest order: decision :data:`TEST`,
        :data:`SKIP_OPS`, :data:`NOT_TESTABLE` or :data:`DUPLICATE` (then ``first`` is
        the layer ID whose verdicts it copies; else None).
    """
    skip = {op.lower() for op in skip_ops}
    first_of: dict[str, str] = {}
    plan: dict[str, tuple[str, str | None]] = {}
    for layer in layers:
        lid = layer["layer_id"]
        if layer["op_type"].lower() in skip:
            plan[lid] = (SKIP_OPS, None)
        elif layer.get("not_testable"):
            plan[lid] = (NOT_TESTABLE, None)
        elif dedup_layers and layer["signature"] in first_of:
            plan[lid] = (DUPLICATE, first_of[layer["signature"]])
        else:
            first_of.setdefault(layer["signature"], lid)
            plan[lid] = (TEST, None)
    return plan
