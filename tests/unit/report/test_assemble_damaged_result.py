"""A damaged layer result (cut short by something outside the workflow) is named, removed
so that the next run redoes that one test, and is one line."""

import json

import pytest

from torq_gen_config.core.errors import ReportError
from torq_gen_config.report.assemble import _read_result


@pytest.mark.parametrize("content,words", [('{"status": "succ', "is not valid JSON (line 1"),
                                           ("[1, 2]", "is not a JSON object"),
                                           (b"\xff\xfe", "is not a UTF-8 text file")])
def test_a_damaged_result_is_named_and_removed(tmp_path, content, words):
    p = tmp_path / "result.json"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ReportError) as e:
        _read_result(p)
    msg = str(e.value)
    assert str(p) in msg and words in msg and msg.endswith("removed it: run the same command again to redo that test")
    assert "\n" not in msg and not p.exists()


def test_a_good_result_is_read_and_kept(tmp_path):
    p = tmp_path / "result.json"
    p.write_text(json.dumps({"status": "success"}))
    assert _read_result(p) == {"status": "success"} and p.exists()
