"""Logging: JSON lines on stderr when not on a terminal, never on stdout, job ids as a field."""

from __future__ import annotations

import json
import subprocess
import sys

SNIPPET = """
from vjob import log
log.get("agent").info("preempt", jobs=["12", "13"])
print("the command's own output")
"""


def test_logs_are_json_on_stderr_and_stdout_stays_clean() -> None:
    r = subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True, timeout=60, check=True)
    assert r.stdout == "the command's own output\n"
    record = json.loads(r.stderr.strip().splitlines()[-1])
    assert record["event"] == "preempt" and record["jobs"] == ["12", "13"] and record["component"] == "agent"
    assert record["level"] == "info" and "timestamp" in record


def test_level_filters() -> None:
    code = "\n".join(
        [
            "from vjob import log",
            "log.configure('warning', 'json')",
            "log.get('x').info('quiet')",
            "log.get('x').warning('loud')",
        ]
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    events = [json.loads(line)["event"] for line in r.stderr.strip().splitlines()]
    assert events == ["loud"]
