"""Per-node pilots under a real OAR 2.5.9: a real `oarsub -l /host=2` whose first node's leader
starts a real `vjob run --member --rms oar` on the other node through the real `oarsh`.

What it proves: oarsh (ssh to the node's OAR sshd, the job's cpuset) starts the member; the
token and the leader's address reach it on its stdin, not in its environment (which oarsh does
not pass) nor on a command line; the member checks it is on the node it was told (the
name is an address of its host), proves the token over TCP, is set up by the leader and
released, and its oarsh ends with 0. The two "nodes" are the test OAR's hosts `localhost` and
`127.0.0.1` (tests/services/oar.py), one machine; the member's VM steps are
test_multinode_members.py's (libvirt's test driver), not repeated here.
"""

from __future__ import annotations

import json
import pwd
import shutil
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from plugins.oar.client import OarCommands, SubmitRequest

pytestmark = pytest.mark.oar
REPO = Path(__file__).resolve().parents[1]

LEADER = """
import json, os, sys, time
from pilot.members.launch import launcher
from pilot.members.leader import Members
from plugins.member_launch import short_name

t0 = time.monotonic()
lines = open(os.environ["OAR_NODEFILE"]).read().splitlines()
nodes = list(dict.fromkeys(short_name(x) for x in lines if x.strip()))
members = Members(nodes[1:], secret=launcher("oar").leader_secret(os.environ))
answers = {}
try:
    members.launch("oar", config=sys.argv[1])
    members.join(timeout_s=60)
    joined_s = time.monotonic() - t0
    for rank, node in enumerate(members.nodes, start=1):
        link = members.links[node]
        link.send({"op": "setup", "rank": rank, "vm": "oar-%s-%d" % (os.environ["OAR_JOB_ID"], rank), "subnet_id": 9})
        answers[node] = link.recv(30)
finally:
    members.close(wait_s=30)
print(json.dumps({"nodes": nodes, "joined": sorted(members.links), "answers": answers, "joined_s": joined_s,
                  "codes": [s.proc.returncode for s in members.steps],
                  "argv": [list(s.proc.args) for s in members.steps], "token": members.token}))
"""


def test_oarsh_starts_a_member_on_the_other_node_that_joins_its_leader(oar_cluster) -> None:
    user = oar_cluster.user
    home = Path(pwd.getpwnam(user).pw_dir)
    work = Path(tempfile.mkdtemp(prefix="vjob-oar-members-"))
    try:
        work.chmod(0o755)
        (work / "leader.py").write_text(LEADER)
        (work / "vjob.toml").write_text(f'data_dir = "{work / "data"}"\n')
        cli = OarCommands(timeout_s=30)
        # The venv's interpreter may live where the user cannot reach (/root): the system python3
        # with this checkout and the venv's packages, as test_realjob_slurm.py's shim does.
        path = f"PYTHONPATH={REPO}:{sysconfig.get_paths()['purelib']}"
        name = f"vjobmembers{uuid.uuid4().hex[:8]}"  # OAR's job ids restart with each test OAR
        started = time.monotonic()
        job = cli.submit(
            SubmitRequest(
                command=["env", path, "/usr/bin/python3", str(work / "leader.py"), str(work / "vjob.toml")],
                name=name,
                resource="/host=2/core=1",
                walltime="0:05:00",
                directory=str(home),
            ),
            user=user,
        )
        state = ""
        while time.monotonic() - started < 150:
            found = cli.job(job, user=user)
            state = found.state if found is not None else "gone"
            if state in ("Terminated", "Error", "gone"):
                break
            time.sleep(0.5)
        ran_s = time.monotonic() - started
        out = home / f"OAR.{name}.{job}.stdout"
        err = home / f"OAR.{name}.{job}.stderr"
        text = out.read_text() if out.exists() else ""
        detail = f"state {state}; stdout {text[-800:]!r}; stderr {err.read_text()[-2000:] if err.exists() else ''!r}"
        assert state == "Terminated", detail
        result = json.loads(text.strip().splitlines()[-1])
        print(
            f"OAR per-node launch: job {job}, submit to end {ran_s:.1f} s, leader start to joined "
            f"{result['joined_s']:.2f} s"
        )
        assert sorted(result["nodes"]) == ["127.0.0.1", "localhost"], detail
        other = result["nodes"][1]
        assert result["joined"] == [other] and result["answers"] == {other: {"ok": True}}, detail
        assert result["codes"] == [0], detail  # the member released by `bye` ended well, and oarsh with it
        (argv,) = result["argv"]
        assert argv[:3] == ["oarsh", other, "--"] and argv[3].endswith("run --member --rms oar"), argv
        assert argv[3].startswith("env PYTHONPATH=") and " /usr/bin/python3 -m vjob.cli --config " in argv[3], argv
        assert result["token"] not in " ".join(argv)
        for f in (out, err):
            f.unlink(missing_ok=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
