"""Helpers for the Saline tests: a stand-in OAR REST API and a manager on test-driver nodes.

The stand-in is a real HTTP server on 127.0.0.1 speaking the few OAR API calls the manager
makes, with answers the test sets (including garbage): the manager's real REST client, real
parsing and real store are what is tested. Real OAR is in test_saline_e2e (marker `oar`).
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import pwd
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from plugins.oar.client import OarCommands, OarRest
from provisioning.driver import Driver
from provisioning.images import Catalogue
from saline_bew import journal
from saline_bew.manager import Manager
from saline_bew.repository import Repository
from saline_bew.sites import Site
from saline_bew.vms import SalineVMs, nat_network
from vjob.config import ProvisioningConfig, parse
from vjob.errors import CommandError
from vjob.store.db import Store, now


class FakeOar:
    """OAR's REST API as the manager uses it. `jobs[id]` is what GET /jobs/ID.json answers
    (a dict, or bytes sent as they are); POST /jobs.json hands out new ids, counted."""

    def __init__(self, *, delay_s: float = 0.0) -> None:
        self.jobs: dict[str, Any] = {}
        self.resources = [{"resource_id": i, "id": i, "state": "Alive", "network_address": "n1"} for i in range(1, 5)]
        self.details: list[dict[str, Any]] = []
        """What GET /jobs/details.json lists (current jobs), paged with offset/limit like OAR."""
        self.after_page: Any = None
        """Called with the offset after each page of jobs/details is sent (jobs end meanwhile)."""
        self.submitted: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.delay_s = delay_s
        self._next = 100
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                time.sleep(fake.delay_s)
                path = self.path.removeprefix("/oarapi/")
                if path.split("?")[0] == "resources/full.json":
                    return self._send(200, {"items": fake.resources})
                if path.startswith("jobs/details.json"):
                    query = parse_qs(urlsplit(path).query)
                    offset = int(query.get("offset", ["0"])[0])
                    limit = int(query.get("limit", ["500"])[0])  # OAR's API answers 500 by default
                    wanted = query["state"][0].split(",") if "state" in query else None
                    found = [j for j in fake.details if wanted is None or j.get("state") in wanted]
                    page = found[offset : offset + limit]
                    self._send(200, {"items": page, "total": len(found), "offset": offset})
                    if fake.after_page is not None:
                        fake.after_page(offset)
                    return None
                if path.startswith("jobs/") and path.endswith(".json"):
                    found = fake.jobs.get(path[len("jobs/") : -len(".json")])
                    return self._send(200, found) if found is not None else self._send(404, {})
                return self._send(404, {})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/oarapi/jobs.json":
                    with fake._lock:
                        fake._next += 1
                        job_id = str(fake._next)
                        fake.submitted.append(json.loads(body or b"{}"))
                        fake.jobs[job_id] = {"id": job_id, "state": "Waiting", "owner": "x", "events": []}
                    return self._send(201, {"id": job_id})
                return self._send(200, {})

            def do_DELETE(self) -> None:
                fake.deleted.append(self.path)
                return self._send(202, {})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/oarapi"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeOar:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def killed(self, job_id: str, user: str) -> None:
        """OAR's scheduler killed this best-effort job (as oarstat/the API show it)."""
        self.jobs[job_id] = {
            "id": job_id,
            "state": "Error",
            "owner": user,
            "types": ["besteffort"],
            "events": [{"event_id": 7, "type": "BESTEFFORT_KILL", "date": now(), "description": "kill"}],
        }


def make_image(store: Store, tmp_path: Path) -> None:
    image = tmp_path / "empty.qcow2"
    if not image.exists():
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "16M"], check=True, timeout=30)
    Catalogue(store, ProvisioningConfig(), data_dir=tmp_path).add("empty", image)


def make_real_image(store: Store, tmp_path: Path) -> None:
    """A catalogue entry `real` with its own kernel, as `vjob image build` leaves it (the test
    driver boots nothing): the guest agent's path, a job disk per VM."""
    disk = tmp_path / "real.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "16M"], check=True, timeout=30)
    for part in ("vmlinuz", "initrd"):
        (tmp_path / part).write_bytes(b"not booted by the test driver")
    Catalogue(store, ProvisioningConfig(), data_dir=tmp_path).add_or_reuse(
        "real",
        disk,
        kernel=tmp_path / "vmlinuz",
        initrd=tmp_path / "initrd",
        cmdline="root=/dev/vda init=/sbin/vjob-init",
    )


@contextmanager
def manager_on(
    store: Store,
    tmp_path: Path,
    nodes: dict[str, str],
    api_url: str,
    *,
    vm_dir: str | None = None,
    saline: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Iterator[Manager]:
    """A manager of one site `a` whose OAR is `api_url`, VMs on the test-driver `nodes`, each
    node with its own vm_dir unless `vm_dir` is given (one for all: live migration possible);
    `saline`: more `[saline]` keys (e.g. the NAT network)."""
    cfg = parse(
        {
            "data_dir": str(tmp_path),
            "provisioning": {
                "nodes": nodes,
                "snapshot_dir": str(tmp_path / "snap" / "{node}"),
                "vm_dir": vm_dir or str(tmp_path / "vms" / "{node}"),
            },
            "saline": {
                "sites": [{"name": "a", "oar_api_url": api_url, "repository": str(tmp_path / "repo")}],
                **(saline or {}),
            },
        }
    )
    sites = {"a": Site("a", OarRest(api_url, timeout_s=5), Repository("a", str(tmp_path / "repo")))}
    with Driver(cfg.provisioning, data_dir=tmp_path, store=store) as driver:
        yield Manager(cfg, store, sites, SalineVMs(driver, store, nat_network=nat_network(cfg.saline)), **kwargs)


@contextmanager
def stand_in_manager(tmp_path: Path, nodes: dict[str, str], oar: FakeOar, **kwargs: Any) -> Iterator[Manager]:
    """`manager_on` the stand-in OAR `oar`, with its own SQLite store holding the image `empty`."""
    store = Store(f"sqlite:///{tmp_path / 'vjob.sqlite'}")
    store.upgrade()
    make_image(store, tmp_path)
    try:
        with manager_on(store, tmp_path, nodes, oar.url, **kwargs) as m:
            yield m
    finally:
        store.close()


def new_job(store: Store, key: str, *, user: str = "nobody", phase: str = "submitted", **changes: Any) -> None:
    """A vjob row as a manager would have written it."""
    journal.create(
        store,
        key=key,
        user=user,
        image="empty",
        command=["true"],
        vm_count=1,
        vcpus=1,
        memory_mb=128,
        walltime="1:00:00",
        site="a",
    )
    if phase != "submitted" or changes:
        journal.record(store, key, "test", phase=phase, **changes)


class InteractiveJob:
    """A real `oarsub -I` by a user, under a pseudo-terminal (oarsub -I wants one), as a user
    at a terminal types it: the shell on the node is reached when `Connect to OAR job` shows.

    A thread reads the terminal so oarsub never blocks on output while the test steps the
    manager; `started_after_s` is how long the user waited for the shell."""

    def __init__(self, user: str, resource: str, properties: str) -> None:
        self.user = user
        home = pwd.getpwnam(user).pw_dir
        argv = ["runuser", "-u", user, "--", "oarsub", "-I", "-l", resource, "-p", properties]
        env = {"PATH": os.environ["PATH"], "PWD": home, "HOME": home, "LANG": "C", "TERM": "dumb"}
        self.submitted = time.monotonic()
        self.started_after_s: float | None = None
        self.output = b""
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: becomes the user's oarsub, never returns
            os.chdir(home)
            os.execvpe(argv[0], argv, env)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 4096)
            except OSError:  # the terminal closed: oarsub ended
                return
            if not data:
                return
            self.output += data
            if self.started_after_s is None and b"Connect to OAR job" in self.output:
                self.started_after_s = time.monotonic() - self.submitted

    @property
    def job_id(self) -> str | None:
        found = re.search(rb"OAR_JOB_ID=(\d+)", self.output)
        return found.group(1).decode() if found else None

    def wait_for(self, text: bytes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if time.monotonic() > deadline:
                raise AssertionError(f"oarsub -I: {text!r} not seen in {timeout:.0f} s: {self.output[-600:]!r}")
            time.sleep(0.2)

    def type(self, line: str) -> None:
        os.write(self.fd, line.encode() + b"\n")

    def close(self) -> int:
        """Leave the shell, end oarsub (killed if it does not end), and make sure the job is
        over in OAR before returning (`end_job`)."""
        if self.started_after_s is not None:
            with contextlib.suppress(OSError):
                self.type("exit")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.2)
        else:
            os.kill(self.pid, signal.SIGTERM)
            _, status = os.waitpid(self.pid, 0)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self._reader.join(timeout=5)
        self.end_job()
        return os.waitstatus_to_exitcode(status)

    def end_job(self, timeout: float = 60) -> None:
        """Delete the job if OAR still runs it, and wait until OAR has finished it.

        Why: oarsub ends an interactive job only when it is told the shell is gone (SIGUSR1 to
        the node's oarexec, or its own oardel on a hang-up); in full-suite runs a closed
        `oarsub -I` left its job Running until its walltime, its OAREXEC alive, holding all of
        site a, and the next test waited 240 s in vain for the site."""
        if self.job_id is None:
            return
        oar = OarCommands(timeout_s=30)
        job = oar.job(self.job_id)
        if job is None or job.finished:
            return
        print(
            f"oarsub -I ended, its job {self.job_id} still {job.state}: oardel, waiting for its end; "
            f"its terminal: {self.output[-400:]!r}",
            file=sys.stderr,
        )
        with contextlib.suppress(CommandError):  # oarsub's own oardel may have come first
            oar.delete(self.job_id, user=self.user)
        deadline = time.monotonic() + timeout
        while job is not None and not job.finished:
            if time.monotonic() > deadline:
                raise AssertionError(f"oarsub -I: OAR job {self.job_id} still {job.state} {timeout:.0f} s after oardel")
            time.sleep(1)
            job = oar.job(self.job_id)


def until(
    manager: Manager, key: str, predicate: Callable[[journal.SalineJob], bool], timeout: float, what: str
) -> journal.SalineJob:
    """Manager passes, one a second, until the vjob `key` satisfies `predicate`; the journal
    is in the error when it does not within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        manager.step()
        job = journal.get(manager.ports.store, key)
        if predicate(job):
            return job
        time.sleep(1)
    kinds = [(e.kind, e.detail) for e in journal.events(manager.ports.store, key)]
    raise AssertionError(f"{what}: not reached in {timeout:.0f} s; journal: {kinds}")
