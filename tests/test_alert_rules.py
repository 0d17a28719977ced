"""The shipped alert rules, checked and unit-tested by Prometheus's own promtool (Debian's
prometheus package, which CI installs; no server runs): `promtool check rules` on both files,
`promtool test rules` on the cases in tests/monitoring/ (issue 36 item 5)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from plugins import deploy

HERE = Path(__file__).resolve().parent / "monitoring"


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    assert shutil.which("promtool"), "promtool missing: apt-get install prometheus (.ci/apt-packages.txt)"
    for name in ("alert-rules", "saline-alert-rules"):
        deploy.install(deploy.find(name), tmp_path)
    for case in HERE.glob("*.test.yml"):
        shutil.copy(case, tmp_path / case.name)
    return tmp_path


def _promtool(where: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *argv], cwd=where, capture_output=True, text=True, timeout=120)


def test_promtool_accepts_both_rule_files(rules: Path) -> None:
    r = _promtool(rules, "check", "rules", "vjob-alerts.yml", "vjob-saline-alerts.yml")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("case", ["agent-rules.test.yml", "saline-rules.test.yml"])
def test_the_rules_fire_when_and_only_when_they_should(rules: Path, case: str) -> None:
    r = _promtool(rules, "test", "rules", case)
    assert r.returncode == 0, r.stdout + r.stderr
