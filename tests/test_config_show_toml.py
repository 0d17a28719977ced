"""`vjob config show` prints TOML that loads back to the same configuration, whatever the
names in it (issue 36 item 7): user and account names are keys of `[priority.targets]`, and a
dot, an `@`, a quote, a newline or a non-ASCII letter in one must stay one key of the same name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import tomli_w
from hypothesis import given, settings
from hypothesis import strategies as st

from vjob.config import load, masked

REPO = Path(__file__).resolve().parents[1]
HOSTILE = ["alice.smith", "bob@lab", 'x"y', "a b", "é", "[t]", "k=v", "line\nbreak", "#c", "1.5"]


def _show(conf: Path, fmt: str = "toml") -> str:
    res = subprocess.run(
        [sys.executable, "-m", "vjob.cli", "--config", str(conf), "config", "show", "--format", fmt],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_hostile_names_survive_show_and_load(tmp_path: Path) -> None:
    conf = tmp_path / "vjob.toml"
    targets = {name: round(0.05 + 0.01 * k, 2) for k, name in enumerate(HOSTILE)}
    conf.write_text(tomli_w.dumps({"data_dir": str(tmp_path / "d"), "priority": {"targets": targets}}))
    shown = tmp_path / "shown.toml"
    shown.write_text(_show(conf))
    again = load(shown)
    assert again.priority.targets == targets
    assert masked(again) == masked(load(conf))
    assert json.loads(_show(shown, "json")) == json.loads(_show(conf, "json"))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.dictionaries(st.text(min_size=1, max_size=12), st.floats(0.0, 0.09), max_size=5))
def test_any_name_round_trips_through_the_writer(targets: dict[str, float]) -> None:
    from vjob.cli.config_cmd import _to_toml
    from vjob.config.toml_file import parse_toml

    text = _to_toml({"priority": {"targets": targets}, "tune": {"policy": None}})
    assert text.startswith("# unset: tune.policy\n")
    assert parse_toml(text.encode(), "shown").get("priority", {}).get("targets", {}) == targets
