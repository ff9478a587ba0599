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
