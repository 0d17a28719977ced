"""Stand-in PBS client commands for the adapter tests.

Torque and OpenPBS cannot run on the development machine, so — the one sanctioned exception
to "test against the real thing" — the tests put executables named qstat, pbsnodes, qalter,
qhold, qrls, qrerun, qsig and qsub first in the adapter's way (bin_dir or PATH). Each one
replays a recorded real output (or a scripted failure) and appends its argument list to
calls.jsonl, so the tests see exactly what the adapter asked for.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

COMMANDS = ("qstat", "pbsnodes", "qalter", "qhold", "qrls", "qrerun", "qsig", "qsub")

_PROGRAM = """#!{python}
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
name = os.path.basename(sys.argv[0])
with open(os.path.join(here, "calls.jsonl"), "a") as fh:
    fh.write(json.dumps([name, *sys.argv[1:]]) + "\\n")
spec_path = os.path.join(here, name + ".json")
spec = json.load(open(spec_path)) if os.path.exists(spec_path) else {{}}
time.sleep(spec.get("sleep", 0))
if "stdout_file" in spec:
    sys.stdout.write(open(spec["stdout_file"], encoding="utf-8").read())
sys.stdout.write(spec.get("stdout", ""))
sys.stderr.write(spec.get("stderr", ""))
sys.exit(spec.get("exit", 0))
"""


class StandIns:
    """A directory of stand-in commands and what they were asked."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        for name in COMMANDS:
            path = directory / name
            path.write_text(_PROGRAM.format(python=sys.executable))
            path.chmod(path.stat().st_mode | stat.S_IXUSR)

    def script(self, name: str, **spec: Any) -> None:
        """What `name` does next: stdout_file, stdout, stderr, exit, sleep."""
        (self.dir / f"{name}.json").write_text(
            json.dumps({k: str(v) if isinstance(v, os.PathLike) else v for k, v in spec.items()})
        )

    def calls(self) -> list[list[str]]:
        path = self.dir / "calls.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]


PBS_MODULE = '''"""A stand-in for the `pbs` module PBS gives its hooks: one event, described in JSON."""
import atexit, json, os

QUEUEJOB, RUNJOB, EXECJOB_POSTSUSPEND, EXECJOB_PRERESUME, MODIFYJOB, EXECJOB_LAUNCH = 1, 2, 3, 4, 5, 6
EXECJOB_EPILOGUE, EXECJOB_END = 7, 8
LOG_DEBUG, LOG_WARNING, LOG_ERROR = 1, 2, 3
_spec = json.load(open(os.environ["PBS_STANDIN_EVENT"]))
hook_config_filename = _spec.get("config")
_result = {"outcome": None, "message": None, "log": []}


class _Resources(dict):
    def __getitem__(self, key):
        return self.get(key)


class _Job:
    def __init__(self, attrs):
        self.id = attrs.get("id")
        self.queue = attrs.get("queue")
        self.interactive = attrs.get("interactive")
        self.Variable_List = attrs.get("Variable_List")
        self.Resource_List = _Resources(attrs.get("Resource_List") or {})
        self.resources_used = dict(attrs.get("resources_used") or {})


def size(text):
    """pbs.size: a PBS size; the stand-in keeps its text."""
    return str(text)


class _Event:
    def __init__(self, spec):
        self.type = globals()[spec["type"]] if spec["type"] in globals() else spec["type"]
        self.job = _Job(spec.get("job", {}))
        # execjob_launch: what the MoM is about to start (a login shell reading the script on stdin)
        self.progname = spec.get("progname")
        self.argv = spec.get("argv")
        self.env = spec.get("env")

    def accept(self):
        _result["outcome"] = "accept"
        raise SystemExit(0)

    def reject(self, message=None):
        _result["outcome"], _result["message"] = "reject", message
        raise SystemExit(0)


_event = _Event(_spec)


def event():
    return _event


def logmsg(level, message):
    _result["log"].append([level, message])


@atexit.register
def _write():
    _result["Variable_List"] = _event.job.Variable_List
    _result["resources_used"] = _event.job.resources_used
    _result["progname"], _result["argv"] = _event.progname, _event.argv
    with open(os.environ["PBS_STANDIN_RESULT"], "w") as fh:
        json.dump(_result, fh)
'''

PILOT = """#!{python}
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "pilot_calls.jsonl"), "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
spec = json.load(open(os.path.join(here, "pilot.json"))) if os.path.exists(os.path.join(here, "pilot.json")) else {{}}
time.sleep(spec.get("sleep", 0))
sys.stderr.write(spec.get("stderr", ""))
sys.exit(spec.get("exit", 0))
"""
