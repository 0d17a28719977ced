"""The node service's OAR authority: a recorded `oarstat -f -J`, and the real OAR 2.5.9 of the
tests (tests/services/oar.py) with a job of its ordinary user, asked through a real service.

Run the oar-marked test under `flock /tmp/vjob-oar.lock` (the OAR server is shared).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from plugins.oar.client import OarCommands
from plugins.oar.job_grant import OarJobAuthority, grant_of
from plugins.oar.parse import parse_jobs
from provisioning.node_service.grant import Grant
from provisioning.node_service.operations import registry
from provisioning.node_service.server import NodeService
from tests.node_service_peer import Peer
from tests.services import wait_for
from tests.services.oar import OarCluster

FIXTURE = Path(__file__).parent / "data" / "fixtures" / "oar" / "oartui_oarstat_array_u_J_f.json"


def test_a_running_job_gets_its_resources_on_the_node_as_cpus() -> None:
    jobs = {j.id: j for j in parse_jobs(FIXTURE.read_text(), source="oartui")}
    running, waiting = jobs["13056639"], jobs["13056638"]
    host = running.hosts[0]
    # The resource table is the test's: this recording has no `oarnodes -J` beside it.
    resources = [{"resource_id": rid, "network_address": host, "state": "Alive"} for rid in running.resources[:6]]
    resources += [{"resource_id": rid, "network_address": "other", "state": "Alive"} for rid in running.resources[6:]]
    user = pwd.getpwuid(os.getuid()).pw_name
    mine = dataclasses.replace(running, user=user)
    assert grant_of(mine, resources, host) == Grant(
        "oar", "13056639", os.getuid(), os.getgid(), user, host, (host,), 6, 0
    )
    assert grant_of(mine, resources, "elsewhere") is None
    assert grant_of(dataclasses.replace(waiting, user=user), resources, host) is None


@pytest.mark.oar
def test_the_owner_of_a_running_oar_job_is_answered_and_nobody_refused(oar_cluster: OarCluster) -> None:
    user = oar_cluster.user
    home = os.path.expanduser(f"~{user}")
    env = {"PATH": os.environ["PATH"], "PWD": home, "HOME": home, "LANG": "C"}
    props = oar_cluster.properties("a")
    done = subprocess.run(
        ["runuser", "-u", user, "--", "oarsub", "-p", props, "-l", "/resource_id=2,walltime=0:05:00", "sleep 120"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=home,
        env=env,
    )
    job = re.search(r"OAR_JOB_ID=(\d+)", done.stdout)
    assert job, (done.stdout, done.stderr)
    oar_id = job.group(1)
    work = Path(tempfile.mkdtemp(prefix="vjob-nodeoar-", dir="/var/tmp"))
    work.chmod(0o755)
    stop = threading.Event()
    try:
        authority = OarJobAuthority(OarCommands())
        wait_for(
            lambda: authority.client.job(oar_id) is not None and authority.client.job(oar_id).state == "Running",
            60,
            f"OAR job {oar_id} running",
        )
        host = oar_cluster.sites["a"]
        service = NodeService(work / "node.sock", registry(()), authority, frozenset({host, oar_cluster.sites["b"]}))
        service.bind()
        thread = threading.Thread(target=service.serve, args=(stop,), daemon=True)
        thread.start()
        line = json.dumps({"op": "hello", "job": oar_id, "node": host})
        with Peer(user, service.path) as peer:
            peer.ask("open")
            answer = json.loads(peer.ask(f"send 0 {line}"))
        owner = pwd.getpwnam(user)
        assert answer == {
            "ok": True,
            "rms": "oar",
            "job": oar_id,
            "uid": owner.pw_uid,
            "gid": owner.pw_gid,
            "user": user,
            "node": host,
            "nodes": [host],
            "cpus": 2,
            "memory_mib": 0,
        }
        with Peer("nobody", work / "node.sock") as peer:
            peer.ask("open")
            refused = json.loads(peer.ask(f"send 0 {line}"))
        nobody = pwd.getpwnam("nobody").pw_uid
        assert refused == {"ok": False, "error": f"job '{oar_id}' is not a job of uid {nobody} on node '{host}'"}
        other = json.dumps({"op": "hello", "job": oar_id, "node": oar_cluster.sites["b"]})
        with Peer(user, work / "node.sock") as peer:
            peer.ask("open")
            elsewhere = json.loads(peer.ask(f"send 0 {other}"))
        assert elsewhere["error"] == f"job '{oar_id}' is not running on node '{oar_cluster.sites['b']}'"
        stop.set()
        thread.join(10)
        service.close()
    finally:
        stop.set()
        subprocess.run(["oardel", oar_id], capture_output=True, timeout=60)
        shutil.rmtree(work, ignore_errors=True)
