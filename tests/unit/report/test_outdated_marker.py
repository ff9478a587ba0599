"""The report's out-of-date marker after a ``run`` that finished (issue 38 item 3): removed
when the files the report rests on are what they were, else rewritten with the true
reason, which the report's staleness then says (not "a later run did not finish")."""

from __future__ import annotations

from torq_gen_config.commands.run import settle_outdated_marker
from torq_gen_config.core.layout import OUTDATED_MARKER, mark_outdated, work_dir
from torq_gen_config.report.staleness import layer_files_digest, staleness


def _work(tmp_path):
    w = tmp_path / work_dir("m")
    (w / "layers" / "A").mkdir(parents=True)
    (w / "layers" / "manifest.json").write_text('{"layers": ["A"]}')
    (w / "layers" / "A" / "inputs.json").write_text('{"x": "sha-1"}')
    (w / "prepare.json").write_text("{}")
    return w


def test_unchanged_files_clear_the_marker(tmp_path):
    w = _work(tmp_path)
    before = layer_files_digest(w)
    mark_outdated(w / OUTDATED_MARKER)  # a job re-made the split: the same bytes
    (w / "layers" / "A" / "inputs.json").write_text('{"x": "sha-1"}')
    settle_outdated_marker(w / OUTDATED_MARKER, before, w)
    assert not (w / OUTDATED_MARKER).exists()


def test_changed_layer_inputs_say_why(tmp_path):
    w = _work(tmp_path)
    before = layer_files_digest(w)
    mark_outdated(w / OUTDATED_MARKER)
    (w / "layers" / "A" / "inputs.json").write_text('{"x": "sha-2"}')
    assert layer_files_digest(w) != before
    settle_outdated_marker(w / OUTDATED_MARKER, before, w)
    lines = staleness(tmp_path / "torq_gen_config_m.json", {"model_name": "m"})
    assert len(lines) == 1 and "a run that finished re-made" in lines[0] and "did not finish" not in lines[0]
    assert lines[0].endswith("rerun discover to update the report")


def test_a_run_that_did_not_finish_keeps_its_words(tmp_path):
    w = _work(tmp_path)
    mark_outdated(w / OUTDATED_MARKER)
    lines = staleness(tmp_path / "torq_gen_config_m.json", {"model_name": "m"})
    assert "did not finish (it failed or was stopped)" in lines[0]

