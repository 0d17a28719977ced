"""The Slurm development cluster for the tests (deploy/devcluster, devkit.devcluster).

A cluster already up in the run directory ($VJOB_DEVCLUSTER_DIR or /var/lib/vjob/devcluster)
is used as it is and left running. Otherwise `slurm_cluster` brings one up without the agent
(tests that need the agent run it themselves) and without libvirtd (tests that need VMs ask
for the libvirt fixture), and takes it down at the end of the run: by pid, only what it started.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devkit.devcluster import DevCluster, Settings
from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.commands import SlurmCommands


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[DevCluster]:
    """A running 8-node Slurm cluster; `.env` holds SLURM_CONF and VJOB_CONFIG for it."""
    cluster = DevCluster()
    if cluster.is_up():
        yield cluster
        return
    try:
        cluster.up(Settings(run_dir=cluster.root, agent="no", libvirt=False))
        yield cluster
    finally:
        cluster.down()  # also after a failed `up`: whatever it started is stopped by pid


@pytest.fixture
def slurm_adapter(slurm_cluster: DevCluster) -> SlurmAdapter:
    """The adapter talking to the development cluster (JSON observation, as on 22.05)."""
    return SlurmAdapter(SlurmCommands(conf=str(slurm_cluster.conf), timeout_s=20))
