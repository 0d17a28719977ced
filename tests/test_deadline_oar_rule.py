"""Rendering vjob's OAR deadline rule (saline_bew.deadline_rule) and its `vjob oar` commands;
the rule itself runs in a real OAR in tests/test_oar_admission.py."""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

import pytest

from preemption.deadline.threshold_file import DEFAULT_STALE_S, MAX_STALE_S, write_threshold
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
    given = _parser().parse_args(
        ["--config", str(conf), "oar", "install-deadline-rule", "--print", "--threshold-file", "/elsewhere/t"]
    )
    assert given.func(given) == 0 and "'/elsewhere/t'" in capsys.readouterr().out
    conf.write_text("")
    with pytest.raises(UsageError, match=r"--threshold-file: required, or set \[deadline\] threshold_file"):
        args.func(args)


HARNESS = r"""
package OAR::IO;
sub sql_to_local { return time() + 600; }  # OAR's own date parser: the deadline is 10 min away
package main;
my $type_list = ["deadline=2030-01-01 00:00:00"];
my $ref_resource_list = [[[], 3600]];
my $rules = do { local $/; open(my $f, "<", $ENV{VJOB_RULE_FILE}) or die; <$f> };
eval $rules;
print("REFUSED: $@") if $@;
print("DONE\n");
"""


def _run_rule(tmp_path: Path, threshold: Path) -> str:
    rule = tmp_path / "rule.pl"
    rule.write_text(deadline_rule.render(threshold_file=str(threshold)))
    env = {**os.environ, "VJOB_RULE_FILE": str(rule)}
    # 60 s bounds a rule that hangs (it did, on a FIFO: no alarm); the rule's own bound is 2 s
    proc = subprocess.run(["perl", "-e", HARNESS], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_threshold_file_that_blocks_costs_the_submission_its_alarm_then_no_check(tmp_path: Path) -> None:
    """Issue 39 item 13: the rule read the file with no alarm; a FIFO there hung every oarsub."""
    fifo = tmp_path / "vjob-deadline.threshold"
    os.mkfifo(fifo)
    out = _run_rule(tmp_path, fifo)
    assert f"deadline check skipped (the threshold file was not read within {deadline_rule.READ_TIMEOUT_S} s)" in out
    assert "REFUSED" not in out and out.endswith("DONE\n")


def test_a_readable_threshold_file_still_refuses_a_late_job(tmp_path: Path) -> None:
    """The same harness with a plain file: 60 min to run, deadline in 10 min, X = 0: refused."""
    path = tmp_path / "vjob-deadline.threshold"
    write_threshold(path, 0.0, 1.0, time.time())
    out = _run_rule(tmp_path, path)
    assert "REFUSED: [ADMISSION RULE] vjob: refused: the job cannot be expected to meet its deadline" in out, out
