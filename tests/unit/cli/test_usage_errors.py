"""A usage error of torq-gen-config is one line naming the command, exit status 2."""

import pytest

from torq_gen_config.cli.main import main


@pytest.mark.parametrize("argv,words", [
    (["discover", "--reference", "foo"], "torq-gen-config discover: error: argument --reference: invalid choice: 'foo'"),
    (["bogus"], "torq-gen-config: error: argument COMMAND: invalid choice: 'bogus'"),
    (["view", "--no-such-flag"], "torq-gen-config: error: unrecognized arguments: --no-such-flag"),
])
def test_a_usage_error_is_one_line(capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(words) and "--help)" in err and "usage:" not in err


def test_report_help_and_error_agree_on_report_json_with_model(capsys, tmp_path):
    """`report REPORT_JSON --model M` goes only with --model-explorer: the help says so and
    the refusal (one line, exit 2) says the same."""
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "REPORT_JSON --model M --model-explorer DIR" in help_text
    assert "with REPORT_JSON and --model-explorer: the model file for the overlays" in help_text
    assert main(["report", str(tmp_path / "r.json"), "--model", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not both" in err[0] and "only with --model-explorer" in err[0], err
