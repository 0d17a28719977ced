"""Every timeout a save or a move must meet grows with the VM's memory, from one rule
(vjob.save_time; issue 33 item 1): a 64 GiB guest, whose save takes 320 s at the measured
5 s/GiB, must not be timed out by the agent, by libvirt's save/restore call, nor by the pilot's
wait on a member, and the KillWait vjob advises must hold it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from provisioning import op_timeouts
from provisioning.driver import Driver, VMSpec
from provisioning.libvirt_link import LibvirtLink
from provisioning.transfer import Endpoint
from tests.services.libvirt import make_test_node
from vjob.config import AgentConfig, ProvisioningConfig
from vjob.save_time import BUDGET_S_PER_GIB, SAVE_S_PER_GIB, budget_s, expected_save_s, killwait_s

GIB64 = 64 * 1024
"""A 64 GiB guest, in MiB."""


def test_the_rule_at_64_gib() -> None:
    assert expected_save_s(GIB64) == 320.0 == 64 * SAVE_S_PER_GIB
    assert BUDGET_S_PER_GIB == 2 * SAVE_S_PER_GIB
    assert budget_s(GIB64, 120.0) == 120.0 + 640.0
    assert budget_s(GIB64, 120.0, cap_s=500.0) == 500.0
    assert budget_s(-5, 30.0) == budget_s(0, 30.0) == 30.0


def test_the_agent_waits_for_a_64_gib_save_with_room() -> None:
    cfg = AgentConfig()
    wait = cfg.checkpoint_timeout_for(GIB64)
    assert wait == 760.0 and wait >= 2 * expected_save_s(GIB64)
    assert wait < cfg.checkpoint_timeout_max_s  # the lease keeper feeds the watchdog that long
    assert cfg.lease_s / 3 < wait  # the wait outlasts the lease: the keeper renews it meanwhile (agent.lease)
    assert AgentConfig(checkpoint_timeout_per_gib_s=20).checkpoint_timeout_for(GIB64) == 120 + 1280


def test_libvirt_operations_on_a_64_gib_guest_get_more_than_its_save() -> None:
    prov = ProvisioningConfig()
    assert prov.operation_timeout_s == 300.0 < expected_save_s(GIB64)  # the old flat timeout: aborted
    assert prov.operation_timeout_for(GIB64) == 940.0
    assert prov.operation_timeout_for(0) == 300.0


def test_a_file_timeout_follows_its_size(tmp_path: Path) -> None:
    state = tmp_path / "vm.state"
    with state.open("wb") as f:
        f.truncate(GIB64 << 20)  # sparse: 64 GiB as stat sees it
    prov = ProvisioningConfig()
    assert op_timeouts.for_file(prov, Endpoint(state)) == 940.0
    assert op_timeouts.for_file(prov, Endpoint(tmp_path / "missing")) == 300.0


def test_killwait_advice() -> None:
    assert killwait_s(1024) == 20  # Slurm's default 30 s holds it
    assert killwait_s(GIB64) == 650
    assert killwait_s(4096, vms_per_node=2) == 90
    assert killwait_s(GIB64) > expected_save_s(GIB64)


@pytest.mark.libvirt
def test_a_64_gib_vm_is_saved_and_restored_under_a_timeout_scaled_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libvirt's test driver holds a 64 GiB domain (nothing is allocated): the save's and the
    restore's calls get the floor plus 10 s/GiB, where they got a flat operation_timeout_s."""
    node = make_test_node(tmp_path / "nodes", "n1", memory_mib=2 * GIB64)
    base = tmp_path / "base.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "64M"], check=True, timeout=30)
    seen: dict[str, float] = {}
    original = LibvirtLink.call

    def recording(self: LibvirtLink, what: str, vm: str, node: str, fn: Any, **kw: Any) -> Any:
        if what in ("save", "restore") and kw.get("timeout_s") is not None:
            seen[what] = kw["timeout_s"]
        return original(self, what, vm, node, fn, **kw)

    monkeypatch.setattr(LibvirtLink, "call", recording)
    cfg = ProvisioningConfig(nodes={"n1": node}, snapshot_dir=str(tmp_path / "snap" / "{node}"), operation_timeout_s=30)
    with Driver(cfg, data_dir=tmp_path / "data") as drv:
        drv.define(VMSpec("big", base, memory_mib=GIB64), "n1")
        drv.boot("big", "n1")
        assert drv.domain("big", "n1").maxMemory() == GIB64 * 1024
        snap = drv.save("big", "n1")
        drv.restore("big", "n1")
    assert seen["save"] == 30 + 640.0
    state_gib = snap.size_bytes / 2**30  # the test driver's state is small: the restore's floor
    assert seen["restore"] == pytest.approx(30 + 10 * state_gib)


def test_the_killwait_table_in_the_docs_is_the_rule() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "slurm.md").read_text()
    rows = re.findall(r"^   \| (\d+) GiB[^|]*\| (\d+) s \|$", text, re.MULTILINE)
    assert len(rows) == 4
    for gib_text, seconds in rows:
        assert killwait_s(int(gib_text) * 1024) == int(seconds), gib_text
    assert f"KillWait={killwait_s(GIB64)}" in text
