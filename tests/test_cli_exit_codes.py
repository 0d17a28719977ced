"""Exit codes automation can trust, walked over every command of `vjob` (issue 36): 0 success,
1 a runtime failure, 2 bad usage; an error is one line on stderr, stdout carries data only.

Why a table of every command: the walk fails when a command is added without saying how it
behaves with its store unreachable, so no command escapes the rule by being new. The store is a
PostgreSQL URL on a closed loopback port (nothing listens on 127.0.0.1:1) with a one-second
connect timeout: every command that needs it must fail with exit 1 and say so; one that does
not need it runs to 0, or its row says why it exits otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vjob.cli import build_full_parser, main
from vjob.model import ClusterView, Job, Node

REPO = Path(__file__).resolve().parents[1]
DEAD = "postgresql://vjob:pw@127.0.0.1:1/vjob"
SQUEUE = REPO / "tests/data/fixtures/slurm/debian-22.05-squeue.json"

INSTANCE = {
    "nodes": [{"id": "n1", "cpu": 2, "mem": 4096}],
    "vms": [{"id": "v1", "vjob": "j1", "cpu": 1, "mem": 512, "state": "waiting", "host": None}],
    "target": {"j1": "running"},
}
VIEW = ClusterView(
    now=1000.0, nodes=(Node("n1", 8, 16384),), jobs=(Job("1", "alice", nodes=1, submit_time=900.0),)
).to_dict()

STORE = "store"
"""The `expect` of a command that needs the store: exit 1, the store named on stderr."""

# command → (arguments; STORE, or (exit code, a phrase of stderr) for one that does not need it)
WALK: dict[str, tuple[list[str], object]] = {
    "db upgrade": (["head"], STORE),
    "db downgrade": (["base"], STORE),
    "db current": ([], STORE),
    "db check": ([], STORE),
    "db backup": (["{tmp}/backup"], STORE),
    "db restore": (["{backup}"], STORE),
    "config check": (["{cfg}"], (0, "")),
    "config show": ([], (0, "")),
    "config reference": ([], (0, "")),
    "plan": (["{instance}", "--optimizer", "ffd"], (0, "")),
    "schema": (["instance"], (0, "")),
    "completion": (["bash"], (0, "")),
    "status": ([], STORE),
    "agent": (["--once", "--rms", "slurm", "--metrics-port", "0"], STORE),
    "drain": (["--rms", "slurm"], STORE),
    "uninstall": (["--rms", "slurm", "--root", "{tmp}/root"], STORE),
    "run": (["true"], (2, "no job id")),
    "prio": (["--from", "{view}"], (0, "")),
    "trace generate": (["--nodes", "4", "--jobs", "10", "-o", "{tmp}/gen.swf"], (0, "10 jobs for 4 nodes")),
    "trace info": (["{trace}", "--nodes", "4"], (0, "")),
    "simulate": (["--trace", "{trace}", "--nodes", "4", "--out", "{tmp}/sim"], (0, "")),
    # the tuner keeps its studies in its own Optuna file, not the state store
    "tune run": (["--trace", "{trace}", "--nodes", "4", "--study", "bad name"], (2, "--study")),
    "tune worker": ([], (2, "--study")),
    "tune show": (["nosuch"], (2, "study 'nosuch'")),
    "tune apply": (["nosuch", "--trial", "0"], (2, "study 'nosuch'")),
    "image add": (["x", "--file", "{instance}"], STORE),
    "image build": (["x"], STORE),
    "image list": ([], STORE),
    "image remove": (["x"], STORE),
    "image verify": (["x"], STORE),
    "image distribute": (["x", "--nodes", "n1"], STORE),
    "vm list": ([], STORE),
    "vm save": (["v", "--node", "n1"], STORE),
    "vm restore": (["v", "--node", "n1"], STORE),
    "vm migrate": (["v", "--from", "n1", "--to", "n2"], STORE),
    "vm destroy": (["v", "--node", "n1"], STORE),
    "rms parse": (["--rms", "slurm", "--kind", "jobs", str(SQUEUE)], (0, "")),
    "deploy list": ([], (0, "")),
    "deploy path": (["agent-unit"], (0, "")),
    "deploy install": (["agent-unit", "--dest", "{tmp}/files"], (0, "")),
    # a root daemon that never opens the store and runs until stopped: its own tests start it
    "node-service": (["--socket", "{tmp}/node.sock"], None),
    # the client commands talk to the Saline manager, not the store: none listens here
    "besteffort submit": (["--image", "x", "true"], (1, "no Saline manager")),
    "besteffort manager": ([], STORE),
    "besteffort list": ([], (1, "no Saline manager")),
    "besteffort show": (["k"], (1, "no Saline manager")),
    "besteffort cancel": (["k"], (1, "no Saline manager")),
    "besteffort output": (["k"], (1, "no Saline manager")),
    "besteffort stage": (["k"], (1, "no Saline manager")),
    # OAR's own command is replaced by /bin/false: the failure path, never the site's OAR
    "oar install-rules": ([], (2, "--site")),
    "oar uninstall-rules": (["--oaradmissionrules", "/bin/false"], (1, "/bin/false")),
    "oar install-deadline-rule": ([], (2, "--threshold-file")),
    "oar uninstall-deadline-rule": (["--oaradmissionrules", "/bin/false"], (1, "/bin/false")),
    "oar install-size-rule": (["--print"], (0, "")),
    "oar uninstall-size-rule": (["--oaradmissionrules", "/bin/false"], (1, "/bin/false")),
}


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[str, argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {" ".join(path): parser}
    out: dict[str, argparse.ArgumentParser] = {}
    for name, sub in subs[0].choices.items():
        out |= _leaves(sub, (*path, name))
    return out


LEAVES = _leaves(build_full_parser(strict=True))


def test_the_walk_covers_every_command() -> None:
    """A new command must be given a row: how it behaves with its store unreachable."""
    assert sorted(LEAVES) == sorted(WALK)


@pytest.mark.parametrize("command", sorted(LEAVES))
def test_a_bad_option_exits_2_with_one_line_naming_it(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command.split(), "--no-such-option"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "--no-such-option" in err and err.startswith("vjob: error: "), err


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("walk")
    cfg = tmp / "vjob.toml"
    cfg.write_text(
        f'data_dir = "{tmp / "data"}"\n[database]\nurl = "{DEAD}"\nconnect_timeout_s = 1\n'
        f'[saline]\nsocket = "{tmp / "saline.sock"}"\n'
        # Slurm's commands looked up in an empty directory: the agent reaches no cluster, fast
        f'[slurm]\nbin_dir = "{tmp / "no-slurm"}"\n[agent]\ncommand_timeout_s = 5\n'
    )
    (tmp / "no-slurm").mkdir()
    (tmp / "instance.json").write_text(json.dumps(INSTANCE))
    (tmp / "view.json").write_text(json.dumps(VIEW))
    live = tmp / "live.toml"  # a backup to restore, from a SQLite store that exists
    live.write_text(f'data_dir = "{tmp / "live"}"\n')
    assert main(["--config", str(live), "db", "upgrade"]) == 0
    assert main(["--config", str(live), "db", "backup", str(tmp / "live.backup")]) == 0
    assert main(["trace", "generate", "--nodes", "4", "--jobs", "10", "--seed", "3", "-o", str(tmp / "t.swf")]) == 0
    return {
        "cfg": str(cfg),
        "tmp": str(tmp),
        "instance": str(tmp / "instance.json"),
        "view": str(tmp / "view.json"),
        "trace": str(tmp / "t.swf"),
        "backup": str(tmp / "live.backup"),
        "live": str(live),
    }


def vjob(work: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`vjob --config CFG ARGS` as an operator runs it."""
    env = {**os.environ, "COLUMNS": "80"}
    cmd = [sys.executable, "-m", "vjob.cli", "--config", work["cfg"], *args]
    return subprocess.run(cmd, cwd=work["tmp"], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("command", sorted(c for c in WALK if WALK[c][1] is not None))
def test_with_the_store_unreachable(command: str, work: dict[str, str]) -> None:
    args, expect = WALK[command]
    res = vjob(work, *command.split(), *(a.format(**work) for a in args))
    if expect == STORE:
        assert res.returncode == 1, res.stdout + res.stderr
        assert "127.0.0.1:1" in res.stderr and "unreachable" in res.stderr, res.stderr
        assert "pw@" not in res.stderr + res.stdout  # the password masked
        # stdout: data only (status prints what the pilots' files say), no warning or error
        assert "warning" not in res.stdout and "error" not in res.stdout, res.stdout
    else:
        code, phrase = expect  # type: ignore[misc]
        assert res.returncode == code, res.stdout + res.stderr
        assert phrase in res.stderr, res.stderr
        if code:
            assert res.stdout == "" and res.stderr.startswith("vjob: error: "), res.stdout + res.stderr
            assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "Traceback" not in res.stderr, res.stderr


def test_status_json_is_one_document_on_stdout_with_the_store_unreachable(work: dict[str, str]) -> None:
    res = vjob(work, "status", "--json")
    assert res.returncode == 1
    data = json.loads(res.stdout)
    assert data["vjobs"] == [] and any("unreachable" in e for e in data["errors"])
    assert "vjob: warning: state store:" in res.stderr


@pytest.mark.parametrize("value", ["-1", "10001", "x"])
def test_status_refuses_a_bad_count(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    for option in ("--switches", "--snapshots"):
        assert main(["status", option, value]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and option in err and value in err, err


TABLES = {
    "status",
    "prio",
    "trace info",
    "simulate",
    "tune show",
    "image list",
    "image distribute",
    "vm list",
    "deploy list",
    "deploy install",
    "besteffort list",
}
"""The commands that print a table (or aligned columns) on a terminal."""

# command → its arguments with --json against a store that works, or the test that parses it
JSON_RUNS: dict[str, list[str] | str] = {
    "status": ["--rms", "slurm"],
    "prio": ["--from", "{view}"],
    "trace info": ["{trace}", "--nodes", "4"],
    "simulate": ["--trace", "{trace}", "--nodes", "4", "--out", "{tmp}/simjson", "--no-plots"],
    "tune show": "a finished study: tests/test_tune_cli.py",
    "image list": [],
    "image distribute": "an image on a node: tests/test_provisioning_images.py",
    "vm list": "libvirt on the node: tests/test_provisioning_images.py",
    "deploy list": [],
    "deploy install": ["agent-unit", "--dest", "{tmp}/jsonfiles"],
    "besteffort list": "a running Saline manager: tests/test_saline_manager.py",
    "drain": "an RMS to drain: tests/test_drain_slurm.py",
    "uninstall": "a staging root: tests/test_uninstall_root.py",
}


def _has_json(parser: argparse.ArgumentParser) -> bool:
    return any("--json" in a.option_strings for a in parser._actions)


def test_every_command_that_prints_a_table_has_json() -> None:
    assert sorted(c for c in TABLES if not _has_json(LEAVES[c])) == []
    assert sorted(c for c in LEAVES if _has_json(LEAVES[c])) == sorted(JSON_RUNS)


@pytest.mark.parametrize("command", sorted(c for c in JSON_RUNS if isinstance(JSON_RUNS[c], list)))
def test_json_is_one_document_on_stdout(command: str, work: dict[str, str]) -> None:
    args = [a.format(**work) for a in JSON_RUNS[command]]
    res = vjob(work, "--config", work["live"], *command.split(), *args, "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    json.loads(res.stdout)  # one document: json.loads refuses anything after it
