"""libvirt for the tests: test-driver nodes, the system libvirtd, a second node, the tiny guest.

Test-driver nodes need no daemon: each test gets its own node XML files (one per node), so
tests never see each other's domains. Real QEMU tests (marker `realvm`) share, per run, the
system libvirtd (started under `tini -s` when not running), a second libvirtd acting as a
second node, and the counter guest; what the set-up started is stopped by pid at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit import libvirtd
from provisioning import guest

NODE_XML = """<node>
  <cpu><mhz>2000</mhz><model>fakecpu</model><active>{cpus}</active><nodes>1</nodes>
       <sockets>1</sockets><cores>{cpus}</cores><threads>1</threads></cpu>
  <memory>{memory_kib}</memory>
</node>
"""

SECOND_NODE_DIR = Path(os.environ.get("VJOB_TEST_SECOND_NODE_DIR", "/var/tmp/vjob-nodeb"))


def make_test_node(directory: Path, name: str, *, cpus: int = 4, memory_mib: int = 8192) -> str:
    """A libvirt test-driver node of its own; returns its URI (test:///abs/path.xml)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.xml"
    path.write_text(NODE_XML.format(cpus=cpus, memory_kib=memory_mib * 1024))
    return f"test://{path.resolve()}"


@pytest.fixture
def test_nodes(tmp_path: Path) -> dict[str, str]:
    """Two private test-driver nodes, n1 and n2: {name: uri}."""
    return {name: make_test_node(tmp_path / "nodes", name) for name in ("n1", "n2")}


@pytest.fixture(scope="session")
def libvirt_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """qemu:///system served by a libvirtd under tini (started here when not running)."""
    daemons = libvirtd.start_system(tmp_path_factory.mktemp("libvirtd"))
    try:
        yield daemons.uri
    finally:
        libvirtd.stop(daemons)


@pytest.fixture(scope="session")
def libvirt_second_node(libvirt_system: str) -> Iterator[str]:
    """A second libvirtd (own namespace, own host_uuid) acting as another node."""
    daemons = libvirtd.start_second_node(SECOND_NODE_DIR)
    try:
        yield daemons.uri
    finally:
        if daemons.owned:
            libvirtd.stop(daemons, virtlogd_pidfile=SECOND_NODE_DIR / "run" / "virtlogd.pid")


@pytest.fixture(scope="session")
def tiny_guest() -> guest.GuestFiles:
    """The counter guest (Debian cloud kernel + busybox), built once and cached."""
    return guest.build()
