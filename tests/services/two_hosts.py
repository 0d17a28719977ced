"""The development cluster on two network-namespace hosts (`deploy/devcluster up --hosts 2`).

Why a cluster of its own (another run directory and port than tests/services/slurm.py's): the
one-host cluster's tests stay as they are, and a two-host cluster is what a cross-host test
needs whole — host A (node1,3,5,7) and host B (node2,4,6,8), each with its own libvirtd, node-local
directories, sshd and node service, nothing shared with the other but the wire, the
controller's state and the site's shared files (devkit.devcluster_hosts). A cluster already up
in that directory is used as it is and left running; otherwise it is brought up here without
the agent and without the root namespace's libvirtd, and taken down at the end of the run: by
pid, namespaces, veths and bridge removed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.devcluster import DevCluster, Settings
from devkit.devcluster_hosts import Topology

TWO_HOSTS_DIR = Path(os.environ.get("VJOB_TWO_HOSTS_DIR", "/var/lib/vjob/devcluster-hosts"))
TWO_HOSTS_PORT = 6827
"""slurmctld's port of the two-host cluster: beside the one-host cluster's 6817."""


@pytest.fixture(scope="session")
def two_host_cluster() -> Iterator[tuple[DevCluster, Topology]]:
    """The running two-host cluster and its topology (hosts, `enter`, `enrol`)."""
    cluster = DevCluster(TWO_HOSTS_DIR)
    topology = Topology(cluster.root)
    if cluster.is_up() and len(topology.hosts()) == 2:
        yield cluster, topology
        return
    try:
        cluster.up(Settings(run_dir=cluster.root, agent="no", libvirt=False, port=TWO_HOSTS_PORT, hosts=2))
        yield cluster, topology
    finally:
        cluster.down()  # also after a failed `up`: whatever it started is stopped by pid
