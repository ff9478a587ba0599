"""The report text suggests --layer-inputs random where many verdicts are success* on the
whole model's values (issue 38 item 4), and the message naming a run in progress shortens
a long command line with an ellipsis."""

from __future__ import annotations

import json

from torq_gen_config.core import run_lock
from torq_gen_config.report.text import layer_inputs_hint


def _report(n_layers: int, layer_inputs: str = "propagate") -> dict:
    ops = {f"L{i}": {"executors": {"llvm-cpu": {}, "vmvx": {}}} for i in range(n_layers)}
    return {"ops": ops, "provenance": {"options": {"layer_inputs": layer_inputs}}}


def test_hint_from_a_tenth_of_the_verdicts():
    assert layer_inputs_hint(_report(20), 3) is None  # 3 of 40: under a tenth
    hint = layer_inputs_hint(_report(20), 4)
    assert hint.startswith("4 of 40 verdicts could not have failed") and "--layer-inputs random" in hint
    assert layer_inputs_hint(_report(2), 2) is None  # fewer than 3
    assert layer_inputs_hint(_report(20, "random"), 30) is None  # already generated inputs


def test_a_long_command_in_the_lock_message_ends_in_an_ellipsis(tmp_path):
    lock = tmp_path / "x.lock"
    (tmp_path / "x.lock.json").write_text(json.dumps({"pid": 7, "command": "torq-gen-config discover " + "--x " * 80,
                                                      "started": "t"}))
    text = run_lock.holder(lock)
    assert text.startswith("pid 7 (torq-gen-config discover --x") and " ..., since t)" in text
    assert len(text) < 200
