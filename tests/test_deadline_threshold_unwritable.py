"""Deadline admission must not be silently off (issue 39, item 12).

With the shipped unit (ProtectSystem=strict, only /var/lib/vjob writable) the agent could not
write vjob-deadline.threshold beside slurm.conf: each tick logged a warning, the hooks found no
file and accepted every job. Now the unit lets it write there, and an agent that cannot (a
read-only mount, as the sandbox makes one: here a real read-only bind mount in a private mount
namespace) says so at startup and on every tick as an error, and counts it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.deadline_threshold import threshold_path
from tests.test_operator_deploy import _unit
from vjob.config import parse

REPO = Path(__file__).resolve().parents[1]
UNIT = REPO / "vjob" / "deploy_files" / "agent" / "vjob-agent.service"

_AGENT = r"""
import json, sys, threading
from agent.loop import Agent
from agent.metrics import AgentMetrics
from plugins import job_environment
from vjob.config import load
from vjob.rms import Abilities, PriorityKnob
from vjob.store.db import Store
import structlog

seen = []
structlog.configure(processors=[lambda _l, level, ev: seen.append((level, ev.get("event"), str(ev.get("error")))) or ev,
                                structlog.processors.JSONRenderer()])

class EmptyRMS:
    name = "slurm"
    abilities = Abilities(priority=PriorityKnob(0, 1000), requeue_hold=True, hold_release=True, suspend=False,
                          pin_nodes=True, start_now=False, environment=job_environment("slurm"))
    def jobs(self): return []
    def nodes(self): return []

cfg = load(sys.argv[1])
Store(cfg.database_url).upgrade()
metrics = AgentMetrics()
agent = Agent(cfg, EmptyRMS(), rms="slurm", metrics=metrics)
stop = threading.Event()
agent.run(stop, once=True)  # startup, then one tick
count = metrics.errors.labels(kind="deadline_threshold")._value.get()
print(json.dumps({"logged": seen, "count": count}))
"""


def test_the_shipped_unit_lets_the_agent_write_the_default_threshold_file() -> None:
    default = threshold_path(parse({"deadline": {"admission": "static"}}), "slurm")
    assert default is not None
    writable = [p.lstrip("-") for line in _unit(UNIT.read_text())["Service"]["ReadWritePaths"] for p in line.split()]
    assert any(default.parent == Path(p) or Path(p) in default.parents for p in writable), (default, writable)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare is part of Debian's base system")
def test_an_unwritable_threshold_file_is_an_error_at_startup_and_each_tick(tmp_path: Path) -> None:
    etc = tmp_path / "etc-slurm"
    etc.mkdir()
    (etc / "slurm.conf").write_text("# the cluster's\n")
    config = tmp_path / "vjob.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "data"}"\n[slurm]\nconf = "{etc / "slurm.conf"}"\n[deadline]\nadmission = "static"\n'
    )
    # The sandbox's read-only /etc, for this process only: a read-only bind mount of the directory.
    script = f'mount --bind "{etc}" "{etc}" && mount -o remount,bind,ro "{etc}" && exec "{sys.executable}" -c "$0" "$1"'
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, _AGENT, str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    errors = [e for e in seen["logged"] if e[0] == "error" and e[1] == "cannot publish the deadline threshold"]
    assert errors, seen["logged"]
    assert str(etc / "vjob-deadline.threshold") in errors[0][2] and "Read-only file system" in errors[0][2]
    assert seen["count"] >= 2  # at startup, and by the tick
    assert not (etc / "vjob-deadline.threshold").exists()
