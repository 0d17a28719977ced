"""The OpenPBS hook's suspend = checkpoint on a real QEMU guest.

PBS cannot run here, so the hook runs as the PBS MoM would run it (a fresh interpreter
importing a stand-in `pbs` module, tests/test_pbs_hook.py); everything it calls is real: the
shipped command templates of deploy/pbs/vjob_hook.json, the `vjob vm save|restore` CLI, the
state store, libvirtd and a QEMU guest whose counter must go on n → n+1 across the suspend.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit import guest_probe
from devkit.guest_probe import wait_for_counter
from provisioning import guest
from provisioning.driver import Driver, VMSpec
from tests.test_pbs_hook import HOOK, Hook
from vjob import config as vconfig
from vjob.model import VMState
from vjob.pilot_files import vm_name
from vjob.store.db import Store

pytestmark = [pytest.mark.libvirt, pytest.mark.realvm]

JOB = "4242.pbs-server"
NODE = socket.gethostname().split(".")[0]  # what the hook's {node} becomes without PBS


@pytest.fixture
def site(libvirt_system: str, tiny_guest: guest.GuestFiles, tmp_path: Path) -> Iterator[tuple[Path, Driver]]:
    """A vjob.toml naming this node, a store at head, and the job's VM booted as the pilot would."""
    work = Path(tempfile.mkdtemp(prefix="vjob-pbs-", dir="/var/tmp"))
    work.chmod(0o755)  # QEMU runs as libvirt-qemu and must reach the overlay and the image
    toml = tmp_path / "vjob.toml"
    toml.write_text(
        f'data_dir = "{work}"\n\n[provisioning]\noperation_timeout_s = 120.0\n\n'
        f'[provisioning.nodes]\n"{NODE}" = "{libvirt_system}"\n'
    )
    cfg = vconfig.load(toml)
    store = Store(cfg.database_url)
    store.upgrade()
    image = work / "empty.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True, timeout=30)
    driver = Driver(cfg.provisioning, data_dir=cfg.data_path, store=store)
    vm = vm_name("pbs", JOB)
    driver.delete(vm, NODE)
    spec = VMSpec(
        vm, image, memory_mib=128, kernel=tiny_guest.kernel, initrd=tiny_guest.initrd, cmdline=tiny_guest.cmdline
    )
    driver.define(spec, NODE)
    driver.boot(vm, NODE)
    wait_for_counter(driver.console_log(vm, NODE), 2, 90)
    try:
        yield toml, driver
    finally:
        driver.delete(vm, NODE)
        driver.close()
        store.close()
        shutil.rmtree(work, ignore_errors=True)


def test_suspend_saves_the_vm_and_resume_restores_it(site: tuple[Path, Driver], tmp_path: Path) -> None:
    toml, driver = site
    vm = vm_name("pbs", JOB)
    shipped = json.loads((HOOK.parents[2] / "deploy" / "pbs" / "vjob_hook.json").read_text())
    (tmp_path / "hook").mkdir()
    hook = Hook(tmp_path / "hook")
    for key in ("checkpoint_command", "restore_command"):  # the shipped lines, with this venv's python
        assert shipped[key][:4] == ["/usr/bin/python3", "-I", "-m", "plugins.pbs.hook_vm"]
        hook.config[key] = [sys.executable, *shipped[key][1:4], "--config", str(toml), *shipped[key][4:]]
    hook.config["command_timeout_s"] = 200
    job = {"id": JOB, "queue": "workq", "interactive": None, "Variable_List": {}}

    result = hook.run("EXECJOB_POSTSUSPEND", job)
    assert result["outcome"] == "accept", result
    assert driver.state(vm, NODE) is VMState.SAVED, result["log"]
    before = guest_probe.last_counter(driver.console_log(vm, NODE))
    marker = tmp_path / "hook" / "state" / f"{JOB}.saved"
    assert marker.exists() and marker.stat().st_mode & 0o777 == 0o600

    result = hook.run("EXECJOB_PRERESUME", job)
    assert result["outcome"] == "accept", result
    assert driver.state(vm, NODE) is VMState.RUNNING
    log = driver.console_log(vm, NODE)
    wait_for_counter(log, before + 2, 60)
    seen = guest_probe.counters(log)
    assert seen == list(range(1, len(seen) + 1)), f"the counter did not continue: {seen}"
    assert guest_probe.boots(log) == 1
    assert not marker.exists()
