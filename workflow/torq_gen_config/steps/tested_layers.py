"""Old home of the layer-test policy (re-export shim): :mod:`torq_gen_config.model.tested_layers`."""

from __future__ import annotations

from ..model.tested_layers import DUPLICATE, NOT_TESTABLE, SKIP_OPS, TEST, plan_layer_tests  # noqa: F401

__all__ = ["TEST", "SKIP_OPS", "NOT_TESTABLE", "DUPLICATE", "plan_layer_tests"]
