"""Rendering vjob's OAR deadline rule (saline_bew.deadline_rule) and its `vjob oar` commands;
the rule itself runs in a real OAR in tests/test_oar_admission.py."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from preemption.deadline.threshold_file import DEFAULT_STALE_S, MAX_STALE_S
from saline_bew import admission, deadline_rule, oar_cmd
from vjob.errors import InputError, UsageError


def test_the_rule_names_its_file_and_the_reader_limits() -> None:
    rule = deadline_rule.render(threshold_file="/var/lib/vjob/vjob-deadline.threshold")
    assert rule.startswith(deadline_rule.MARK) and not rule.startswith(admission.MARK)
    assert "open(my $fh, '<', '/var/lib/vjob/vjob-deadline.threshold')" in rule
    assert f": {DEFAULT_STALE_S};" in rule and f"$stale <= {MAX_STALE_S} " in rule
    assert "@" + "THRESHOLD@" not in rule and "@DEFAULT_STALE@" not in rule


@pytest.mark.parametrize(
    "bad", ["relative/path", "/tmp/a'b", "/tmp/$(reboot)", "/tmp/a b", "/tmp/../etc/shadow", "/" + "a" * 2000, ""]
)
def test_a_path_that_could_break_out_of_perl_quotes_is_refused(bad: str) -> None:
    with pytest.raises(InputError, match=r"threshold_file = .*: must be an absolute path of plain characters"):
        deadline_rule.render(threshold_file=bad)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vjob")
    parser.add_argument("--config")
    oar_cmd.register(parser.add_subparsers(dest="command"))
    return parser


def test_install_deadline_rule_print_takes_the_configured_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "vjob.toml"
    conf.write_text('[deadline]\nthreshold_file = "/srv/vjob/x.threshold"\n')
    args = _parser().parse_args(["--config", str(conf), "oar", "install-deadline-rule", "--print"])
    assert args.func(args) == 0
    assert "open(my $fh, '<', '/srv/vjob/x.threshold')" in capsys.readouterr().out
    given = _parser().parse_args(["--config", str(conf), "oar", "install-deadline-rule", "--print",
                                  "--threshold-file", "/elsewhere/t"])  # fmt: skip
    assert given.func(given) == 0 and "'/elsewhere/t'" in capsys.readouterr().out
    conf.write_text("")
    with pytest.raises(UsageError, match=r"--threshold-file: required, or set \[deadline\] threshold_file"):
        args.func(args)
