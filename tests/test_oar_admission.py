"""vjob's admission rule in a real OAR 2.5.9: the user types `oarsub`, Saline gets the job.

Installed with OAR's own `oaradmissionrules` (as `vjob oar install-rules` does), then a real
`oarsub -t besteffort -t vjob=IMAGE` by a real user: the OAR job becomes the holder named
after the vjob and the manager adopts it. With no manager, or with the manager's store down,
the same `oarsub` is accepted as a plain best-effort job (fail open). Also here: the REST
client reads a listing of more than 500 jobs completely (OAR's API pages at 500).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.oar.client import OarCommands
from preemption.deadline.threshold_file import THRESHOLD_NAME, read_threshold, write_threshold
from provisioning.driver import Driver
from saline_bew import admission, deadline_rule, journal, server
from saline_bew.manager import Manager
from saline_bew.repository import Repository
from saline_bew.sites import Site
from saline_bew.submission import HOLDER, VJOB_COMMAND
from saline_bew.vms import SalineVMs
from tests.saline_env import make_image
from tests.services import free_port
from vjob.config import parse
from vjob.store.db import Store

pytestmark = pytest.mark.oar


def oarsub(user: str, *args: str) -> subprocess.CompletedProcess[str]:
    home = os.path.expanduser(f"~{user}")
    env = {"PATH": os.environ["PATH"], "PWD": home, "HOME": home, "LANG": "C"}
    return subprocess.run(
        ["runuser", "-u", user, "--", "oarsub", *args], capture_output=True, text=True, timeout=60, cwd=home, env=env
    )


def job_id(proc: subprocess.CompletedProcess[str]) -> str:
    found = re.search(r"OAR_JOB_ID=(\d+)", proc.stdout)
    assert found, (proc.returncode, proc.stdout, proc.stderr)
    return found.group(1)


def oarstat(job: str) -> dict:
    out = subprocess.run(["oarstat", "-f", "-J", "-j", job], capture_output=True, text=True, timeout=30, check=True)
    return json.loads(out.stdout)[job]


def oardel(*jobs: str) -> None:
    subprocess.run(["oardel", *jobs], capture_output=True, timeout=30, check=False)


@pytest.fixture
def manager(tmp_path: Path, oar_cluster) -> Iterator[Manager]:
    store = Store(f"sqlite:///{tmp_path / 'vjob.sqlite'}")
    store.upgrade()
    make_image(store, tmp_path)
    cfg = parse(
        {
            "data_dir": str(tmp_path),
            "provisioning": {"snapshot_dir": str(tmp_path / "snap" / "{node}"), "vm_dir": str(tmp_path / "vm")},
            "saline": {
                "sites": [{"name": "a", "repository": str(tmp_path / "repo"), "oar_properties": "site='a'"}],
            },
        }
    )
    sites = {"a": Site("a", OarCommands(timeout_s=30), Repository("a", str(tmp_path / "repo")), "site='a'")}
    with Driver(cfg.provisioning, data_dir=tmp_path, store=store) as driver:
        yield Manager(cfg, store, sites, SalineVMs(driver, store), owner="admission-test")
    store.close()


@pytest.fixture
def rule_and_socket(oar_cluster) -> Iterator[Path]:
    """The rule installed in OAR, pointing at a socket in a directory uid oar can reach."""
    where = Path(tempfile.mkdtemp(prefix="vjob-oar-rule-"))
    os.chmod(where, 0o755)
    path = where / "saline.sock"
    new, _ = admission.install(admission.render(site="a", socket=str(path), timeout_s=10))
    try:
        assert admission.installed() == [new]
        yield path
    finally:
        assert admission.uninstall() == [new]
        assert admission.installed() == []
        shutil.rmtree(where, ignore_errors=True)


def test_oarsub_besteffort_vjob_is_wrapped_and_fails_open_without_vjob(
    oar_cluster, manager: Manager, rule_and_socket: Path
) -> None:
    user = oar_cluster.user
    submit = ("-t", "besteffort", "-t", "vjob=empty", "-l", "/resource_id=1,walltime=0:05:00", "sleep 300")
    submitted: list[str] = []  # deleted at the end whatever fails: later tests need the sites free
    try:
        with server.Server(manager, rule_and_socket):
            proc = oarsub(user, *submit)
            oar_id = job_id(proc)
            submitted.append(oar_id)
            key = re.search(r"best-effort vjob (be[0-9a-f]{10})", proc.stdout).group(1)
            seen = oarstat(oar_id)
            holder = f"/bin/sh {HOLDER} {key} {VJOB_COMMAND} {rule_and_socket} stage"  # it sends the directory
            assert seen["name"] == key and seen["command"] == holder
            assert "besteffort" in seen["types"] and not any(t.startswith("vjob") for t in seen["types"])
            assert "AND (site='a')" in seen["properties"], seen["properties"]
            deadline = time.monotonic() + 30
            while journal.get(manager.ports.store, key).oar_job_id is None and time.monotonic() < deadline:
                manager.step()
                time.sleep(0.5)
            assert journal.get(manager.ports.store, key).oar_job_id == oar_id
            manager.cancel(key)  # oardel: no VM is started in this test

        # No manager listening: the same oarsub is accepted as a plain best-effort job.
        proc = oarsub(user, *submit)
        plain = job_id(proc)
        submitted.append(plain)
        assert "Saline did not take the job (no Saline manager at" in proc.stdout
        seen = oarstat(plain)
        assert seen["command"] == "sleep 300" and seen["name"] in (None, "") and seen["types"] == ["besteffort"]

        # The manager up, its store down: accepted untouched too, on the manager's answer (not
        # the rule's timeout: the message says which). oarsub's own timeout bounds a hang.
        dead = Store(f"postgresql+psycopg://vjob:x@127.0.0.1:{free_port()}/vjob", connect_timeout_s=2)
        manager.ports.store = manager.ports.vms.store = dead
        with server.Server(manager, rule_and_socket):
            proc = oarsub(user, *submit)
        untouched = job_id(proc)
        submitted.append(untouched)
        assert "Saline did not take the job (Saline refused it" in proc.stdout, proc.stdout
        assert oarstat(untouched)["command"] == "sleep 300"

        # -t vjob=IMAGE without -t besteffort: refused by OAR with the reason, whatever vjob's state
        alone = oarsub(user, *[w for w in submit if w != "besteffort"][1:])
        said = alone.stdout + alone.stderr
        assert alone.returncode != 0 and "OAR_JOB_ID" not in said, said
        assert "vjob: refused: -t vjob=IMAGE needs -t besteffort" in said, said
    finally:
        oardel(*submitted)


def _local(t: float) -> str:
    """A date as OAR's `-t deadline=` takes it (local time, as its scheduler reads it)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def test_oarsub_with_a_deadline_over_X_is_refused_and_the_rule_fails_open(oar_cluster) -> None:
    """vjob's deadline rule (saline_bew.deadline_rule) in a real OAR: `oarsub -t deadline=DATE`
    whose x-factor is at or over the X in the agent's threshold file is refused with x, X and
    why; with the file missing, corrupt, stale or future-dated, the same oarsub is accepted."""
    where = Path(tempfile.mkdtemp(prefix="vjob-oar-deadline-"))
    os.chmod(where, 0o755)
    path = where / THRESHOLD_NAME
    vjob = [sys.executable, "-m", "vjob.cli", "oar"]
    done = subprocess.run(
        [*vjob, "install-deadline-rule", "--threshold-file", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (new,) = deadline_rule.installed()
    assert f"vjob deadline rule #{new} installed, reading {path}" in done.stdout
    accepted: list[str] = []
    user = oar_cluster.user
    try:
        assert deadline_rule.installed() == [new] and new not in admission.installed()
        now = time.time()
        write_threshold(path, 0.2, 1.1, now)
        # 60 min × 1.1 = 66 min to run, 30 min left: x = (66 − 30) / 66 = 0.55 >= 0.2
        late = ("-t", f"deadline={_local(now + 1800)}", "-l", "/resource_id=1,walltime=1:00:00", "sleep 300")
        refused = oarsub(user, *late)
        said = refused.stdout + refused.stderr
        assert refused.returncode != 0 and "OAR_JOB_ID" not in said, said
        assert "vjob: refused: the job cannot be expected to meet its deadline: x = 0.55 >= X = 0.20" in said
        assert "time limit 60 min x VM slowdown 1.10 = 66 min to run, deadline in 30 min" in said
        # two hours left: accepted, the deadline kept for OAR's own scheduler
        ok = job_id(oarsub(user, "-t", f"deadline={_local(now + 7200)}", *late[2:]))
        accepted.append(ok)
        assert any(t.startswith("deadline=") for t in oarstat(ok)["types"])
        # no usable threshold: no check, the refused request accepted (fail open)
        for content in ("corrupt", "stale", "future", "missing"):
            if content == "corrupt":
                path.write_bytes(b"x=banana slowdown=\xff at=yesterday\n")
            elif content in ("stale", "future"):
                write_threshold(path, 0.0, 1.1, now + (3600 if content == "future" else -3600))
            else:
                path.unlink()
            assert read_threshold(path, now=time.time()) is None  # the agent's reader agrees
            accepted.append(job_id(oarsub(user, *late)))
    finally:
        oardel(*accepted)
        gone = subprocess.run([*vjob, "uninstall-deadline-rule"], capture_output=True, text=True, timeout=60)
        assert f"vjob deadline rule #[{new}] removed" in gone.stdout and deadline_rule.installed() == []
        shutil.rmtree(where, ignore_errors=True)
