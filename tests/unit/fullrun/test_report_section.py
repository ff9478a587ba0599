"""The one-module lines of the full-model section (issue 42 item 6: `None transfer(s)`)."""

from torq_gen_config.fullrun.report_section import module_lines


def test_a_module_that_was_not_placed_says_its_transfers_are_not_known():
    failed = " ".join(module_lines({"module": {"status": "error", "transfers": None}}))
    assert "None" not in failed and "transfers: n/a" in failed
    assert "3 transfer(s)" in " ".join(module_lines({"module": {"status": "ok", "transfers": 3}}))
