"""The node service's socket loop over a real Unix socket, with real peers of other uids
(tests/node_service_peer.py: processes as `nobody` and `daemon`, seen through SO_PEERCRED).

The RMS here is a table of grants (`_Table`): what is under test is the service's own checks,
limits and deadlines; the Slurm authority is tested against the real dev cluster in
tests/test_node_service_slurm.py.
"""

from __future__ import annotations

import json
import pwd
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from plugins import deploy
from provisioning.node_service.grant import Grant
from provisioning.node_service.operations import registry
from provisioning.node_service.protocol import Integer, OperationSpec
from provisioning.node_service.server import Limits, NodeService
from tests.as_user import as_nobody
from tests.node_service_peer import Peer
from vjob.errors import InputError, VjobError

NOBODY = pwd.getpwnam("nobody").pw_uid
DAEMON = pwd.getpwnam("daemon").pw_uid


class _Table:
    """Job → Grant on node n1 (a running job); anything else is not running."""

    def __init__(self) -> None:
        self.jobs = {
            "7": Grant("slurm", "7", NOBODY, NOBODY, "nobody", "n1", ("n1", "n2"), 2, 768),
            "8": Grant("slurm", "8", DAEMON, DAEMON, "daemon", "n1", ("n1",), 1, 256),
        }

    def grant(self, job: str, node: str) -> Grant | None:
        found = self.jobs.get(job)
        return found if found is not None and node in found.nodes and node == "n1" else None

    def owned(self, job: str, node: str) -> Grant | None:
        """Job 9 of nobody: requeued, listed but not running anywhere."""
        return Grant("slurm", "9", NOBODY, NOBODY, "nobody", node, (), 0, 0) if job == "9" else None


def _boom(grant: Grant, fields: Mapping[str, Any]) -> dict[str, Any]:
    raise RuntimeError("a bug in an operation")


def _refuse(grant: Grant, fields: Mapping[str, Any]) -> dict[str, Any]:
    raise InputError(f"field 'vms': {fields['vms']} VMs but job {grant.job} has {grant.cpus} CPUs")


def _slow(grant: Grant, fields: Mapping[str, Any]) -> dict[str, Any]:
    time.sleep(fields["seconds"])
    return {"slept": fields["seconds"]}


OPS = {
    **registry(()),
    "test.boom": OperationSpec(_boom, {}),
    "test.refuse": OperationSpec(_refuse, {"vms": Integer(1, 64)}),
    "test.slow": OperationSpec(_slow, {"seconds": Integer(0, 10)}, deadline_s=0.5),
    "test.cleanup": OperationSpec(lambda grant, fields: {"cleaned": grant.job}, {}, after_end=True),
}


class Running:
    def __init__(self, limits: Limits) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="vjob-nodesvc-", dir="/var/tmp"))
        self.dir.chmod(0o755)
        self.socket = self.dir / "run" / "node.sock"
        self.service = NodeService(self.socket, OPS, _Table(), frozenset({"n1"}), limits)
        self.service.bind()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.service.serve, args=(self.stop,), daemon=True)
        self.thread.start()

    def peer(self, user: str) -> Peer:
        return Peer(user, self.socket)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.service.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def start() -> Iterator[Callable[..., Running]]:
    """start(**limits) → a service on its own socket, stopped at the end of the test."""
    started: list[Running] = []

    def make(**limits: Any) -> Running:
        started.append(Running(Limits(**limits)))
        return started[-1]

    try:
        yield make
    finally:
        for running in started:
            running.close()


@pytest.fixture
def service(start: Callable[..., Running]) -> Running:
    return start()


def _req(op: str = "hello", job: str = "7", node: str = "n1", **fields: Any) -> str:
    return json.dumps({"op": op, "job": job, "node": node, **fields})


def _send(peer: Peer, conn: int, line: str) -> dict[str, Any]:
    answer = peer.ask(f"send {conn} {line}")
    assert answer.startswith("{"), answer
    return dict(json.loads(answer))


def test_the_socket_is_0666_in_a_0755_directory_and_never_replaces_a_file(service: Running) -> None:
    assert stat.S_IMODE(service.socket.stat().st_mode) == 0o666
    assert stat.S_IMODE(service.socket.parent.stat().st_mode) == 0o755
    plain = service.dir / "plain"
    plain.write_text("keep me")
    with pytest.raises(VjobError, match="not a socket"):
        NodeService(plain, OPS, _Table(), frozenset({"n1"})).bind()
    assert plain.read_text() == "keep me"


def test_the_owner_is_answered_from_the_grant_and_every_other_caller_refused(service: Running) -> None:
    with service.peer("nobody") as nobody, service.peer("daemon") as daemon:
        assert nobody.ask("open") == "opened 0" and daemon.ask("open") == "opened 0"
        answer = _send(nobody, 0, _req())
        assert answer == {
            "ok": True,
            "rms": "slurm",
            "job": "7",
            "uid": NOBODY,
            "gid": NOBODY,
            "user": "nobody",
            "node": "n1",
            "nodes": ["n1", "n2"],
            "cpus": 2,
            "memory_mib": 768,
        }
        refused = _send(daemon, 0, _req())
        assert refused == {"ok": False, "error": f"job '7' is not a job of uid {DAEMON} on node 'n1'"}
        assert _send(daemon, 0, _req(job="8"))["uid"] == DAEMON
        assert _send(nobody, 0, _req(node="n2"))["error"].startswith("field 'node': 'n2' is not served here")
        assert _send(nobody, 0, _req(job="9")) == {"ok": False, "error": "job '9' is not running on node 'n1'"}
        assert _send(nobody, 0, _req(op="test.refuse", vms=3)) == {
            "ok": False,
            "error": "field 'vms': 3 VMs but job 7 has 2 CPUs",
        }
        assert "unknown to operation 'hello'" in _send(nobody, 0, _req(extra=1))["error"]


def test_the_per_uid_limit_holds_while_another_uid_is_served(start: Callable[..., Running]) -> None:
    service = start(max_connections_per_user=2, read_deadline_s=20)
    with service.peer("nobody") as nobody, service.peer("daemon") as daemon:
        assert [nobody.ask("open") for _ in range(3)] == ["opened 0", "opened 1", "opened 2"]
        third = json.loads(nobody.ask("read 2"))
        assert third == {
            "ok": False,
            "error": f"uid {NOBODY} holds 2 connections or running operations, the limit per user",
        }
        assert daemon.ask("open") == "opened 0"
        assert _send(daemon, 0, _req(job="8"))["ok"] is True
        assert _send(nobody, 0, _req())["ok"] is True, "its first connections are still served"
        assert nobody.ask("close 0") == "closed 0"
        time.sleep(0.2)
        assert nobody.ask("open") == "opened 3"
        assert _send(nobody, 3, _req())["ok"] is True, "a slot given back serves a new connection"


def test_an_idle_connection_is_closed_by_the_read_deadline(start: Callable[..., Running]) -> None:
    service = start(read_deadline_s=0.5)
    with service.peer("nobody") as nobody:
        nobody.ask("open")
        waited = nobody.ask("wait 0")
        assert waited.startswith("EOF after"), waited
        assert 0.3 <= float(waited.split()[-1]) <= 3.0
        nobody.ask("open")
        assert _send(nobody, 1, _req())["ok"] is True, "the service goes on"


def test_a_slow_loris_writer_is_cut_at_the_deadline_whatever_it_keeps_sending(start: Callable[..., Running]) -> None:
    service = start(read_deadline_s=1.0)
    with service.peer("nobody") as nobody:
        nobody.ask("open")
        started = time.monotonic()
        result = nobody.ask(f"drip 0 0.05 {_req()}")  # ~70 bytes, 3.5 s at a byte per 50 ms
        assert result.startswith("cut after"), result
        assert time.monotonic() - started < 3.0


def test_a_raising_or_late_operation_is_answered_and_the_service_keeps_serving(service: Running) -> None:
    with service.peer("nobody") as nobody:
        nobody.ask("open")
        assert _send(nobody, 0, _req(op="test.boom")) == {
            "ok": False,
            "error": "test.boom: internal error (see the node service's log)",
        }
        assert _send(nobody, 0, _req())["ok"] is True
        started = time.monotonic()
        late = _send(nobody, 0, _req(op="test.slow", seconds=2))
        assert late["error"] == "test.slow: no answer within 0.5 s (the operation may still complete)"
        assert time.monotonic() - started < 1.5
        assert nobody.ask("wait 0").startswith("EOF"), "the connection of a late operation is closed"
        nobody.ask("open")
        assert _send(nobody, 1, _req(op="test.slow", seconds=0))["slept"] == 0


def test_a_late_operation_holds_its_uids_slot_until_it_ends(start: Callable[..., Running]) -> None:
    service = start(max_connections_per_user=1, read_deadline_s=20)
    with service.peer("nobody") as nobody:
        nobody.ask("open")
        assert "no answer within" in _send(nobody, 0, _req(op="test.slow", seconds=2))["error"]
        nobody.ask("open")
        assert "holds 1 connections or running operations" in nobody.ask("read 1")
        time.sleep(2.0)
        nobody.ask("open")
        assert _send(nobody, 2, _req())["ok"] is True


def test_an_oversize_line_or_garbage_gets_an_error_not_a_crash(service: Running) -> None:
    with service.peer("nobody") as nobody:
        nobody.ask("open")
        big = _req(pad="x" * 9000)
        assert "request longer than 8192 bytes" in nobody.ask(f"send 0 {big}")
        nobody.ask("open")
        assert "not JSON" in _send(nobody, 1, "{not json")["error"]
        assert "not a JSON object" in _send(nobody, 1, "[]")["error"]
        assert _send(nobody, 1, _req())["ok"] is True, "a bad request leaves the connection usable"


def test_requests_per_minute_are_limited_per_uid(start: Callable[..., Running]) -> None:
    service = start(requests_per_minute_per_user=3)
    with service.peer("nobody") as nobody, service.peer("daemon") as daemon:
        nobody.ask("open")
        daemon.ask("open")
        minute = int(time.monotonic() // 60)
        answers = [_send(nobody, 0, _req()) for _ in range(4)]
        if int(time.monotonic() // 60) == minute:  # a minute turning in between resets the count
            assert [a["ok"] for a in answers[:3]] == [True, True, True]
            assert answers[3]["error"] == f"uid {NOBODY}: more than 3 requests a minute, try again later"
        assert _send(daemon, 0, _req(job="8"))["ok"] is True


def test_the_total_connection_limit_refuses_at_accept(start: Callable[..., Running]) -> None:
    service = start(max_connections=2, read_deadline_s=20)
    with service.peer("nobody") as nobody, service.peer("daemon") as daemon:
        nobody.ask("open")
        daemon.ask("open")
        time.sleep(0.2)
        nobody.ask("open")
        assert "the node service is serving 2 connections, its limit" in nobody.ask("read 1")
        assert _send(daemon, 0, _req(job="8"))["ok"] is True


def test_the_client_raises_the_services_message(service: Running) -> None:
    from provisioning.node_service.client import NodeClient, NodeServiceError, NodeServiceUnavailable

    def work() -> int:
        client = NodeClient(str(service.socket), timeout=5)
        assert client.call("hello", job="7", node="n1")["cpus"] == 2
        try:
            client.call("hello", job="8", node="n1")
        except NodeServiceError as exc:
            print(exc)
        try:
            NodeClient(str(service.dir / "none.sock"), timeout=1).call("hello", job="7", node="n1")
        except NodeServiceUnavailable as exc:
            print(type(exc).__name__, exc)
        return 0

    done = as_nobody(work)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"node service: job '8' is not a job of uid {NOBODY} on node 'n1'"
    assert lines[1].startswith("NodeServiceUnavailable hello: cannot reach") and "No such file" in lines[1]


def test_the_command_refuses_to_run_as_an_ordinary_user(tmp_path: Path) -> None:
    import plugins.node_service_cmd  # noqa: F401 - imported here: `nobody` cannot read this venv's stdlib
    from vjob.cli import main

    tmp_path.chmod(0o755)
    done = as_nobody(lambda: main(["node-service", "--socket", str(tmp_path / "s.sock"), "--names", "n1"]))
    assert done.returncode == 2 and "must run as root" in done.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_accepts_the_node_unit(tmp_path: Path) -> None:
    path, _ = deploy.install(deploy.find("node-unit"), tmp_path)
    r = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    complaints = [line for line in r.stderr.splitlines() if "man vjob" not in line and "not executable" not in line]
    assert complaints == [], r.stderr
    assert "ExecStart=" + deploy.installed_vjob() + " --config /etc/vjob/vjob.toml node-service" in path.read_text()


def test_a_clean_up_serves_the_owner_of_a_job_that_stopped_running_and_nobody_else(service: Running) -> None:
    """The pilot's `*.down` after a requeue's save: the job is no longer running, its owner may
    still give back what it made; another uid may not, and nothing else is served for it."""
    with service.peer("nobody") as nobody, service.peer("daemon") as daemon:
        assert nobody.ask("open") == "opened 0" and daemon.ask("open") == "opened 0"
        assert _send(nobody, 0, _req("test.cleanup", job="9")) == {"ok": True, "cleaned": "9"}
        refused = _send(daemon, 0, _req("test.cleanup", job="9"))
        assert refused["ok"] is False and "job '9'" in refused["error"]
        not_cleanup = _send(nobody, 0, _req("hello", job="9"))
        assert not_cleanup["ok"] is False and "not running" in not_cleanup["error"]
