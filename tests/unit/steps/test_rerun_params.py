"""The rerun params of the per-layer jobs (torq_gen_config.pipeline.markers): computed
read-only while the DAG is built, new when a skipped verdict or a timeout under a smaller
limit asks for a rerun, and the same again after the rerun dealt with it."""

from __future__ import annotations

import os

from torq_gen_config.pipeline.markers import (
    SKIPPED_MARKER,
    consume_rerun_marker,
    record_timeout,
    skipped_rerun_token,
    timeout_rerun_token,
)


def files(d):
    return sorted((p.name, p.stat().st_mtime_ns) for p in d.iterdir())


def test_timeout_token_changes_only_under_a_larger_limit(tmp_path):
    out = tmp_path / "result.json"
    out.write_text("{}")
    assert timeout_rerun_token(str(out), 5) is None
    record_timeout(str(out), True, 5)
    before = files(tmp_path)
    assert timeout_rerun_token(str(out), 5) is None  # same limit: the verdict stands
    assert timeout_rerun_token(str(out), 3) is None
    token = timeout_rerun_token(str(out), 60)
    assert token is not None and timeout_rerun_token(str(out), 60) == token
    assert files(tmp_path) == before  # read-only
    consume_rerun_marker(str(out) + ".timed-out", token)  # the rerun (at 60 s) starts
    record_timeout(str(out), False, 60)  # and finishes in time
    assert timeout_rerun_token(str(out), 60) == token  # the param the rerun ran with: no rerun
    assert timeout_rerun_token(str(out), 600) == token
    record_timeout(str(out), True, 60)  # a later run times out at 60 s
    assert timeout_rerun_token(str(out), 60) == token
    assert timeout_rerun_token(str(out), 600) not in (None, token)


def test_skipped_token_reruns_once_outside_skip_mode(tmp_path):
    d = tmp_path / "vmvx"
    d.mkdir()
    (d / "result.json").write_text("{}")
    assert skipped_rerun_token(str(d), skip_mode=False) is None
    (d / SKIPPED_MARKER).touch()  # a skip-mode run skipped it
    assert skipped_rerun_token(str(d), skip_mode=True) is None  # skip mode again: nothing to do
    token = skipped_rerun_token(str(d), skip_mode=False)
    assert token is not None
    consume_rerun_marker(str(d / SKIPPED_MARKER), token)  # the rerun without skip mode
    assert not (d / SKIPPED_MARKER).exists()
    assert skipped_rerun_token(str(d), skip_mode=False) == token
    assert skipped_rerun_token(str(d), skip_mode=True) == token
    consume_rerun_marker(str(d / "missing"), token)  # nothing to consume: no error
    assert os.path.exists(d / (SKIPPED_MARKER + ".done"))
