"""`vjob image build` refuses what it cannot build before touching the catalogue; real-job VMs
get their job disk and output ports in the domain XML, and keep them across a restore elsewhere."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from provisioning import domain_xml, image_build
from provisioning.images import Catalogue
from provisioning.vm_types import VMSpec
from vjob.config import ProvisioningConfig
from vjob.errors import InputError
from vjob.store.db import Store


def _catalogue(store: Store, tmp_path: Path) -> Catalogue:
    return Catalogue(store, ProvisioningConfig(image_dir=str(tmp_path / "images")), data_dir=tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="image builds run as root")
def test_a_package_that_does_not_exist_is_named_and_the_catalogue_is_unchanged(store: Store, tmp_path: Path) -> None:
    cat = _catalogue(store, tmp_path)
    with pytest.raises(InputError, match=r"no such package .*: no-such-package-vjob\b.*catalogue is unchanged"):
        image_build.build(cat, "site", packages="python3,no-such-package-vjob")
    assert cat.list() == []
    assert not (tmp_path / "images").exists()


def test_package_names_are_matched_whole(store: Store, tmp_path: Path) -> None:
    cat = _catalogue(store, tmp_path)
    for bad in ("python3;rm -rf /", "num\npy", "-oAPT::x=1", "a b", "A"):
        with pytest.raises(InputError, match="not a Debian package name"):
            image_build.build(cat, "site", packages=bad)
    with pytest.raises(InputError, match="image name"):
        image_build.build(cat, "bad\nname")
    assert cat.list() == []


def test_a_real_job_vm_has_its_job_disk_output_ports_and_a_pinned_cpu(tmp_path: Path) -> None:
    spec = VMSpec(
        name="vjob-slurm-7",
        image=tmp_path / "i.qcow2",
        memory_mib=256,
        kernel=tmp_path / "k",
        initrd=tmp_path / "i",
        cmdline="root=/dev/vda",
        job_disk=tmp_path / "vm.job.qcow2",
        output_ports=True,
        cpu_model="qemu64",
    )
    logs = (tmp_path / "out.log", tmp_path / "err.log")
    xml = domain_xml.domain_xml(
        spec,
        dom_type="qemu",
        overlay=tmp_path / "vm.qcow2",
        console_log=tmp_path / "c.log",
        job_disk=spec.job_disk,
        output_logs=logs,
    )
    root = ET.fromstring(xml)
    disks = {d.find("target").get("dev"): d.find("source").get("file") for d in root.iter("disk")}  # type: ignore[union-attr]
    assert disks == {"vda": str(tmp_path / "vm.qcow2"), "vdb": str(tmp_path / "vm.job.qcow2")}
    ports = {s.find("target").get("port"): s.find("log").get("file") for s in root.iter("serial")}  # type: ignore[union-attr]
    assert ports == {"0": str(tmp_path / "c.log"), "1": str(logs[0]), "2": str(logs[1])}
    assert root.find("cpu/model").text == "qemu64"  # type: ignore[union-attr]
    # Restored on another node: each disk and log goes to that node's own path.
    other = tmp_path / "nodeb"
    moved = domain_xml.retarget(
        xml,
        overlay=other / "vm.qcow2",
        console_log=other / "c.log",
        job_disk=other / "vm.job.qcow2",
        output_logs=(other / "o", other / "e"),
    )
    assert moved is not None
    root = ET.fromstring(moved)
    disks = {d.find("target").get("dev"): d.find("source").get("file") for d in root.iter("disk")}  # type: ignore[union-attr]
    assert disks == {"vda": str(other / "vm.qcow2"), "vdb": str(other / "vm.job.qcow2")}
    ports = [s.find("log").get("file") for s in root.iter("serial")]  # type: ignore[union-attr]
    assert ports == [str(other / "c.log"), str(other / "o"), str(other / "e")]
    # A running domain's XML repeats serial 0 as its console, log included (a migration's)
    live = xml.replace('<console type="pty">', f'<console type="pty"><log file="{tmp_path / "c.log"}" append="on" />')
    assert live != xml
    moved = domain_xml.retarget(live, overlay=other / "vm.qcow2", console_log=other / "c.log")
    assert moved is not None
    consoles = [c.find("log").get("file") for c in ET.fromstring(moved).iter("console")]  # type: ignore[union-attr]
    assert consoles == [str(other / "c.log")]
