"""Per-node pilots started by each RMS's launcher (plugins/<rms>/member_launch.py, picked by
pilot.members.launch), and how a member learns
its leader, the token and its node.

PBS cannot run here: its launch is tested against a stand-in `pbsdsh` (below), a script that
runs the command on this machine the way a MOM starts a TM task. What it reproduces, from the
sources: OpenPBS's pbsdsh calls `tm_spawn(argc, argv, NULL, node, …)` (no environment of its
own; Torque's passes only TM_STDOUT_PORT), so the task has the job's environment as the MOM
builds it — HOME, USER, PBS_JOBID, PBS_JOBNAME, PBS_QUEUE, PBS_JOBCOOKIE, PBS_NODENUM,
PBS_VNODENUM, PBS_TASKNUM, PBS_MOMPORT (the list mpiexec's TM code takes from PBS's
resmom/start_exec.c start_process; tm_init fails without PBS_JOBCOOKIE/NODENUM/TASKNUM) — and
nothing of the caller's (here: no $VJOB_MEMBER_*, no $VJOB_CONFIG), its stdin is not the
caller's (/dev/null), and it runs on another host (here: its own UTS namespace named after the
node, so the member's host name is that node's). The members it starts are real
`vjob run --member --rms pbs` processes talking real TCP to the leader.
The real OAR launch (oarsh) is test_multinode_members_oar.py.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import sys
import threading
from pathlib import Path

import pytest

from pilot.members import link as member_link
from pilot.members.launch import launcher, member_command
from pilot.members.leader import Members
from pilot.members.link import LinkError
from plugins import member_launch
from plugins.oar import member_launch as oar_launch
from plugins.pbs import member_launch as pbs_launch
from vjob.errors import InputError, UsageError, VjobError

STAND_IN_PBSDSH = r"""#!/bin/bash
# Stand-in for `pbsdsh -n INDEX -- PROGRAM ARGS...` (tests/test_multinode_members_launch.py).
set -eu
[ "$1" = "-n" ] || { echo "stand-in pbsdsh: only -n INDEX is built" >&2; exit 1; }
index=$2; shift 2
[ "$1" = "--" ] && shift
host=$(sed -n "$((index + 1))p" "$PBS_NODEFILE"); host=${host%%.*}
nodenum=$(sed 's/\..*//' "$PBS_NODEFILE" | awk '!seen[$0]++' | grep -nx -- "$host" | cut -d: -f1)
exec unshare --uts /bin/sh -c 'hostname "$1" && shift && exec "$@"' sh "$host" \
  env -i HOME="$HOME" USER="${USER:-root}" PATH="$PATH" PBS_ENVIRONMENT=PBS_BATCH \
  PBS_JOBID="$PBS_JOBID" PBS_JOBNAME=STDIN PBS_QUEUE=workq PBS_JOBCOOKIE="$PBS_JOBCOOKIE" \
  PBS_NODENUM="$((nodenum - 1))" PBS_VNODENUM="$index" PBS_TASKNUM="$((index + 1))" PBS_MOMPORT=15003 \
  "$@" </dev/null
"""


def _stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str) -> None:
    """`name` on PATH, running `text` (a stand-in launcher)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(text)
    (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def _setup_and_release(members: Members, job: str) -> None:
    for rank, node in enumerate(members.nodes, start=1):
        link = members.links[node]
        link.send({"op": "setup", "rank": rank, "vm": f"{job}-{rank}", "subnet_id": 77})
        assert link.recv(30) == {"ok": True}


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="root and unshare --uts")
def test_pbsdsh_starts_a_member_per_node_that_proves_the_job_cookie(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stand_in(tmp_path, monkeypatch, "pbsdsh", STAND_IN_PBSDSH)
    node_file = tmp_path / "nodes"
    node_file.write_text("n1.cluster\nn1.cluster\nn2.cluster\nn3.cluster\n")  # n1 has two slots
    cookie = secrets.token_hex(16).upper()
    monkeypatch.setenv("PBS_NODEFILE", str(node_file))
    monkeypatch.setenv("PBS_JOBID", "77.server")
    monkeypatch.setenv("PBS_JOBCOOKIE", cookie)
    conf = tmp_path / "vjob.toml"
    conf.write_text(f'data_dir = "{tmp_path / "data"}"\n')

    secret = launcher("pbs").leader_secret(os.environ)
    members = Members(["n2", "n3"], host="127.0.0.1", secret=secret)
    try:
        members.launch("pbs", config=str(conf))
        argvs = [list(s.proc.args) for s in members.steps]  # type: ignore[arg-type]
        assert [a[:4] for a in argvs] == [["pbsdsh", "-n", "2", "--"], ["pbsdsh", "-n", "3", "--"]]
        words = [w for a in argvs for w in a]
        assert secret.nonce in words and secret.token not in " ".join(words) and cookie not in " ".join(words)
        members.join(timeout_s=120)
        assert sorted(members.links) == ["n2", "n3"]  # each named its node by its own host name
        _setup_and_release(members, "pbs-77")
    finally:
        members.close(wait_s=30)
    assert [s.proc.returncode for s in members.steps] == [0, 0]


def test_a_member_with_the_nonce_but_another_jobs_cookie_is_refused() -> None:
    secret = launcher("pbs").leader_secret({"PBS_JOBCOOKIE": "A" * 32})
    members = Members(["n2"], host="127.0.0.1", secret=secret)
    errors: list[str] = []

    def member(cookie: str) -> None:
        call = launcher("pbs").calling(
            {"PBS_JOBCOOKIE": cookie}, "n2", leader=members.address, nonce=secret.nonce, stdin_fd=0
        )
        try:
            member_link.connect(call.leader, call.token, call.node, timeout=10).close()
        except LinkError as exc:
            errors.append(str(exc))

    joins = threading.Thread(target=members.join, kwargs={"timeout_s": 30})
    joins.start()
    member("B" * 32)  # the leader closes on its proof: it learns nothing
    assert len(errors) == 1 and "closed" in errors[0], errors
    member("A" * 32)
    joins.join(30)
    members.close(wait_s=1)
    assert len(errors) == 1, errors
    assert list(members.links) == ["n2"]


def test_an_oar_member_reads_its_leader_from_stdin_and_checks_it_is_on_the_node_it_was_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def told(node: str) -> member_launch.Calling:
        r, w = os.pipe()
        os.write(w, json.dumps({"leader": "10.0.0.1:4000", "token": "ab" * 32, "node": node}).encode() + b"\n")
        os.close(w)
        try:
            return launcher("oar").calling({}, "ignored", leader="", nonce="", stdin_fd=r)
        finally:
            os.close(r)

    assert told("127.0.0.1") == member_launch.Calling("10.0.0.1:4000", "ab" * 32, "127.0.0.1")
    assert told("localhost").node == "localhost"
    with pytest.raises(InputError, match=r"stdin node = '192\.0\.2\.7': not an address of this host"):
        told("192.0.2.7")  # TEST-NET-1: no host has it
    with pytest.raises(InputError, match="not a node name"):
        told("n1;reboot")
    monkeypatch.setattr(oar_launch, "STDIN_TIMEOUT_S", 0.2)
    r, w = os.pipe()
    try:
        with pytest.raises(UsageError, match=r"no line from the leader on stdin within 0\.2 s"):
            launcher("oar").calling({}, "n2", leader="", nonce="", stdin_fd=r)
    finally:
        os.close(r)
        os.close(w)


def test_the_oarsh_command_is_one_quoted_string_and_the_token_goes_on_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in `oarsh` records what it got: host, `--`, one command string (ssh joins its
    words into one shell string on the node) and stdin; not the token in either argv or environment."""
    record = tmp_path / "record"
    _stand_in(tmp_path, monkeypatch, "oarsh", f'#!/bin/sh\n{{ printf "%s\\n" "$@"; cat; env; }} > {record}\n')
    secret = launcher("oar").leader_secret({})
    command = member_command("oar", "/etc/my vjob.toml")
    started = launcher("oar").start(["node-2"], "10.0.0.1:4000", secret, command, os.environ)
    assert started[0].proc.wait(10) == 0
    lines = record.read_text().splitlines()
    assert lines[:2] == ["node-2", "--"]
    assert lines[2].endswith("-m vjob.cli --config '/etc/my vjob.toml' run --member --rms oar")
    assert json.loads(lines[3]) == {"leader": "10.0.0.1:4000", "token": secret.token, "node": "node-2"}
    assert all(secret.token not in line for line in lines[:3] + lines[4:])
    with pytest.raises(InputError, match="not a node name"):
        launcher("oar").start(["n2 n3"], "10.0.0.1:4000", secret, member_command("oar", None), os.environ)


def test_per_node_under_an_rms_without_a_launcher_is_refused_by_name() -> None:
    with pytest.raises(UsageError, match=r"no per-node launcher for rms 'lsf' \(built: slurm, oar, pbs\)"):
        launcher("lsf")
    with pytest.raises(Exception, match=r"\$PBS_JOBCOOKIE is unset"):
        launcher("pbs").leader_secret({})
    with pytest.raises(UsageError, match="--leader HOST:PORT and --nonce"):
        launcher("pbs").calling({"PBS_JOBCOOKIE": "x"}, "n2", leader="h:1", nonce="not-hex", stdin_fd=0)


def test_node_file_lines_keep_addresses_and_drop_domains() -> None:
    assert [member_launch.short_name(x) for x in ("n1.cluster.org\n", " 127.0.0.1", "localhost", "::1")] == [
        "n1",
        "127.0.0.1",
        "localhost",
        "::1",
    ]
    assert pbs_launch.node_index("n2", ["n1.c", "n1.c", "n2.c"]) == 2
    with pytest.raises(InputError, match=r"node n9: not in \$PBS_NODEFILE"):
        pbs_launch.node_index("n9", ["n1.c"])
    assert re.fullmatch(r"[0-9a-f]{64}", pbs_launch.pbs_token("cookie", "00" * 16))
    assert oar_launch.is_this_host(socket.gethostname())


def test_srun_gets_one_step_for_all_other_nodes_and_the_token_in_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "record"
    _stand_in(tmp_path, monkeypatch, "srun", f'#!/bin/sh\n{{ printf "%s\\n" "$@"; env; }} > {record}\n')
    monkeypatch.setenv("PYTHONPATH", "/not/passed/on/argv")  # srun passes the environment itself
    secret = launcher("slurm").leader_secret({})
    command = member_command("slurm", None)
    (started,) = launcher("slurm").start(["n2", "n3"], "10.0.0.1:4000", secret, command, os.environ)
    assert started.nodes == ("n2", "n3") and started.proc.wait(10) == 0
    lines = record.read_text().splitlines()
    assert lines[:6] == [
        "--ntasks-per-node=1",
        "--nodes=2",
        "--relative=1",
        "--kill-on-bad-exit=0",
        "--overlap",
        sys.executable,
    ]
    assert lines[6:11] == ["-m", "vjob.cli", "run", "--member", "--rms"]
    assert f"{member_launch.TOKEN_ENV}={secret.token}" in lines and f"{member_launch.LEADER_ENV}=10.0.0.1:4000" in lines


def test_a_launcher_that_ends_before_its_member_joined_fails_the_join_naming_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    oarsh = '#!/bin/sh\ncase "$1" in n3) exec sleep 30 ;; esac\necho "oarsh: refused" >&2\nexit 3\n'
    _stand_in(tmp_path, monkeypatch, "oarsh", oarsh)
    members = Members(["n2", "n3"], host="127.0.0.1", secret=launcher("oar").leader_secret({}))
    try:
        members.launch("oar")
        with pytest.raises(
            VjobError, match=r"member pilots on n2, n3 did not connect: their launcher \(n2\) ended with 3"
        ):
            members.join(timeout_s=20)
    finally:
        members.close(wait_s=0.5)  # n3's still running: ended by pid
    assert members.steps[0].proc.returncode == 3 and members.steps[1].proc.returncode is not None
