"""Stand-in Slurm client commands (squeue, sinfo, sprio, scontrol) that print recorded-format output.

Why: a real `squeue --json` over 120,000 jobs and 10,000 nodes cannot exist on a 2-core
development machine, yet the agent's tick at that size is what must be measured (issue 37),
through the real adapter, its real subprocess calls and its real parsers. These executables are
put in the adapter's `bin_dir`; they print what a directory holds, as Slurm would:

- `jobs.base`: the JSON text of every job (pretty-printed job objects, as squeue prints them),
  with `jobs.idx` (one "id offset length" line per job), written once;
- `jobs.delta`: {job id: its JSON text now, or null once it is gone}, the changes since the
  base, rewritten by whoever moves the cluster on;
- `listing.txt` (`squeue -h -t all -o ...`), `sprio.txt`, `sinfo.json` (also for `scontrol
  --json show node`, which data_parser Slurm is asked instead; `sinfo -O`'s node listing is
  made from it, `sinfo-listing.txt`), `config.txt`
  (`scontrol show config`), `meta.json` (the recording's "meta"), `version` (`sinfo --version`).

`squeue --json --jobs=...` honours the filter only when `version` is 23.02 or later, as Slurm
does (22.05 ignores every filter with --json: shared notes on Slurm). The jobs come in
slurmctld's order (seen on 22.05): a changed job where it was, a new one at the end. Every call is appended to
`calls.jsonl` with its arguments (and scontrol's standard input), so RMS calls are counted.
"""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

COMMANDS = ("squeue", "sinfo", "sprio", "scontrol")

PROGRAM = r"""#!{python}
import json, mmap, os, re, sys
here = os.path.dirname(os.path.abspath(__file__))
name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
stdin = sys.stdin.read() if name == "scontrol" and not args else None
with open(os.path.join(here, "calls.jsonl"), "a") as fh:
    fh.write(json.dumps([name, *args] + ([stdin] if stdin is not None else [])) + "\n")
out = sys.stdout.buffer

def text(file):
    with open(os.path.join(here, file), "rb") as fh:
        return fh.read()

version = text("version").decode().split()[-1]
major, minor = (int(x) for x in version.split(".")[:2])

def jobs_json(only):
    delta = json.loads(text("jobs.delta"))
    out.write(b'{\n  "meta": ' + text("meta.json") + b',\n  "errors": [],\n  "jobs": [\n')
    first = True
    with open(os.path.join(here, "jobs.base"), "rb") as base:
        mm = mmap.mmap(base.fileno(), 0, access=mmap.ACCESS_READ) if os.path.getsize(base.name) else b""
        for line in open(os.path.join(here, "jobs.idx")):
            job, at, size = line.split()
            if job in delta:  # changed in place (slurmctld's job list keeps its order), or gone
                item = delta.pop(job)
                if item is None or (only is not None and job not in only):
                    continue
                data = item.encode()
            elif only is not None and job not in only:
                continue
            else:
                data = mm[int(at) : int(at) + int(size)]
            out.write((b"" if first else b",\n") + data)
            first = False
    for job, item in delta.items():  # new since the base: appended, as slurmctld appends them
        if item is None or (only is not None and job not in only):
            continue
        out.write((b"" if first else b",\n") + item.encode())
        first = False
    out.write(b"\n  ]\n}\n")

if name == "sinfo":
    if "--version" in args:
        out.write(text("version"))
    elif "-O" in args:  # the node listing (plugins.slurm.node_listing), made from sinfo.json
        out.write(text("sinfo-listing.txt"))
    else:
        out.write(text("sinfo.json"))
elif name == "sprio":
    out.write(text("sprio.txt"))
elif name == "scontrol":
    if args[:2] == ["show", "config"]:
        out.write(text("config.txt"))
    elif args[1:3] == ["show", "node"] and args[0].startswith("--json"):
        out.write(text("sinfo.json"))  # 23.02+: each node from scontrol, same "nodes" list
elif any(a.startswith("--json") for a in args):
    ids = [a.split("=", 1)[1] for a in args if a.startswith("--jobs=")]
    honours = (major, minor) >= (23, 2)
    jobs_json(set(ids[0].split(",")) if ids and honours else None)
elif "-o" in args:
    out.write(text("listing.txt"))
else:
    sys.exit("stand-in " + name + ": arguments not recorded: " + " ".join(args))
"""


def _number(item: dict[str, object], key: str) -> int:
    """A number as either layout prints it (plain, or {"set", "infinite", "number"})."""
    value = item.get(key, 0)
    if isinstance(value, dict):
        return int(value.get("number", 0)) if value.get("set", True) and not value.get("infinite") else 0
    return int(value) if isinstance(value, int) else 0


def _when(seconds: int) -> str:
    """A time as squeue prints it with the listing's SLURM_TIME_FORMAT=%s (POSIX seconds; 22.05
    on the dev cluster, tests/data/fixtures/slurm/transitions-22.05), "N/A" when not set."""
    return str(seconds) if seconds > 0 else "N/A"


def listing_line(item: dict[str, object]) -> str:
    """The line `SLURM_TIME_FORMAT=%s squeue -h -t all -o "%A|%T|%D|%C|%m|%l|%V|%S|%N|%Q"`
    prints for one job object of squeue --json (either layout): what slurmctld would answer
    about the same job (a suspended job's priority is 0 there: it is in the JSON too)."""
    state = item.get("job_state", "")
    word = state[0] if isinstance(state, list) else str(state)
    limit = _number(item, "time_limit")
    memory = _number(item, "memory_per_node") or _number(item, "memory_per_cpu")
    hours, minutes = divmod(limit, 60)
    running = word in ("RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING")
    fields = (
        str(_number(item, "job_id")),
        word,
        str(_number(item, "node_count") or 1),
        str(_number(item, "cpus") or 1),
        f"{memory}M",
        f"{hours}:{minutes:02d}:00" if limit else "UNLIMITED",
        _when(_number(item, "submit_time")),
        _when(_number(item, "start_time")),
        str(item.get("nodes", "")) if running else "",
        str(0 if item.get("hold") is True else _number(item, "priority")),
    )
    return "|".join(fields)


def _words(value: object) -> list[str]:
    return [value] if isinstance(value, str) and value else [str(v) for v in value] if isinstance(value, list) else []


def node_listing_line(item: dict[str, object]) -> str:
    """The line `sinfo -h -N -O NodeList:0|,CPUs:0|,Memory:0|,StateComplete:0|,features_act:0|,
    Features:0|,Weight:0` prints for one node object of sinfo --json (either layout): the
    state lower-case with its flags after "+", "(null)" for no features (as 22.05 prints them,
    tests/data/fixtures/slurm/node-listing-22.05)."""

    def features(key: str) -> str:
        value = item.get(key, "")
        text = ",".join(str(v) for v in value) if isinstance(value, list) else str(value or "")
        return text or "(null)"

    state = "+".join(w.lower() for w in _words(item.get("state")) + _words(item.get("state_flags")))
    sizes = (_number(item, "cpus"), _number(item, "real_memory"))
    tail = (features("active_features"), features("features"), _number(item, "weight"))
    return "|".join(str(f) for f in (item.get("name", ""), *sizes, state, *tail))


class SlurmStandIn:
    """A directory of stand-in Slurm commands and what they print."""

    def __init__(self, directory: Path, *, version: str | None = None, meta: dict[str, object] | None = None) -> None:
        """Make the directory (with `version` and `meta`), or attach to one made before (neither)."""
        self.dir = directory
        if version is None or meta is None:
            return
        directory.mkdir(parents=True, exist_ok=True)
        for name in COMMANDS:
            path = directory / name
            path.write_text(PROGRAM.replace("{python}", sys.executable))
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
        (directory / "version").write_text(f"slurm {version}\n")
        (directory / "meta.json").write_text(json.dumps(meta, indent=2))
        for name, content in (("listing.txt", ""), ("sprio.txt", ""), ("config.txt", ""), ("jobs.delta", "{}")):
            (directory / name).write_text(content)
        self.write_base(())

    def write_base(self, jobs: Iterable[tuple[str, str]]) -> None:
        """The base listing: (job id, its JSON text), in that order; the delta emptied."""
        at = 0
        with open(self.dir / "jobs.base", "wb") as base, open(self.dir / "jobs.idx", "w") as idx:
            for job_id, item in jobs:
                data = item.encode()
                base.write(data)
                idx.write(f"{job_id} {at} {len(data)}\n")
                at += len(data)
        self.write_delta({})

    def write_delta(self, delta: dict[str, str | None]) -> None:
        """The jobs changed since the base (None: gone)."""
        (self.dir / "jobs.delta").write_text(json.dumps(delta))

    def write(self, name: str, content: str) -> None:
        """One of listing.txt, sprio.txt, sinfo.json (and from it sinfo -O's node listing), config.txt."""
        (self.dir / name).write_text(content)
        if name == "sinfo.json":
            nodes = json.loads(content).get("nodes", [])
            (self.dir / "sinfo-listing.txt").write_text("".join(node_listing_line(n) + "\n" for n in nodes))

    def calls(self) -> list[list[str]]:
        path = self.dir / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def forget_calls(self) -> None:
        (self.dir / "calls.jsonl").unlink(missing_ok=True)


__all__ = ["COMMANDS", "SlurmStandIn", "listing_line", "node_listing_line"]
