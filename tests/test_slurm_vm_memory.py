"""A real image's job whose memory per node no VM can honour is refused by job_submit.lua with
the numbers (issue 33, item 1), on the real dev cluster (Slurm 22.05, 8 nodes of 4 CPUs and
4096 MiB). The figures come from vjob-vm-sizes, written by the agent's adapter when it reads the
nodes (plugins.slurm.vm_sizes.Publisher): here the same Publisher, given the cluster's real nodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.devcluster import DevCluster
from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.commands import SlurmCommands
from plugins.slurm.vm_sizes import Publisher, VMSizes, read_sizes, sizes_file
from tests.test_realjob_slurm import wrapped_cluster  # noqa: F401 - the fixture, shared

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("wrapped_cluster")]
REPO = Path(__file__).resolve().parents[1]
SCRIPT = "#!/bin/sh\n#VJOB os=debian12\ntrue\n"


@pytest.fixture(scope="module")
def sized(slurm_cluster: DevCluster) -> Iterator[dict[str, str]]:
    """The cluster's environment, with vjob-vm-sizes written from its nodes as the agent would;
    the file is removed afterwards (the cluster had none)."""
    path = sizes_file(slurm_cluster.conf)
    before = path.read_bytes() if path.exists() else None
    adapter = SlurmAdapter(SlurmCommands(conf=str(slurm_cluster.conf), timeout_s=20), on_nodes=Publisher(path, 256))
    nodes = adapter.nodes()
    assert read_sizes(path) == VMSizes(256, 256, max(n.memory_mb for n in nodes))
    time.sleep(2.5)  # job_submit.lua caches the figures for 2 s
    try:
        yield {**os.environ, **slurm_cluster.env}
    finally:
        if before is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(before)
        time.sleep(2.5)


def _sbatch(env: dict[str, str], *options: str) -> subprocess.CompletedProcess[str]:
    """Submit SCRIPT held (it never runs); an accepted job is cancelled at once."""
    res = subprocess.run(
        ["sbatch", "--parsable", "--hold", "-o", "/dev/null", *options],
        input=SCRIPT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    if res.returncode == 0:
        job = res.stdout.strip().split(";")[0]
        subprocess.run(["scancel", job], env=env, timeout=30, check=False, capture_output=True)
    return res


def test_the_published_figures_are_the_cluster_nodes(sized: dict[str, str], slurm_cluster: DevCluster) -> None:
    assert (sizes_file(slurm_cluster.conf)).read_text() == "overhead_mib=256 guest_min_mib=256 node_max_mib=4096\n"


REFUSED = [
    (
        ["--mem-per-cpu=300M"],
        "--mem-per-cpu=300M x 1 CPU (the fewest a node of this job may get) = 300 MiB leaves 44 MiB for the VM"
        " after its overhead of 256 MiB, below the guest's minimum of 256 MiB: ask for at least --mem=512M",
    ),
    (
        ["-n4", "--mem-per-cpu=400M"],  # Slurm may put one task on a node: 400 MiB there
        "--mem-per-cpu=400M x 1 CPU (the fewest a node of this job may get) = 400 MiB leaves 144 MiB",
    ),
    (
        ["--mem=5000M"],
        "--mem=5000M is more than the largest node's 4096 MiB, whose VM gets at most 3840 MiB (its memory"
        " minus the VM's overhead of 256 MiB): ask for at most --mem=4096M per node, or --mem=0 for whole nodes",
    ),
    (
        ["-N2", "--ntasks-per-node=3", "--mem-per-cpu=1500M"],
        "--mem-per-cpu=1500M x 3 CPUs (the fewest a node of this job may get) = 4500 MiB is more than the"
        " largest node's 4096 MiB",
    ),
]
"""sbatch options and what the refusal says."""
ACCEPTED = [
    ["-c2", "--mem-per-cpu=300M"],  # 600 MiB on its node
    ["-N1", "-n2", "--mem-per-cpu=300M"],  # one node: both CPUs there
    ["-N2", "--ntasks-per-node=2", "--mem-per-cpu=1500M"],  # 3000 MiB per node
    ["--mem=4096M"],  # the whole of a node: its VM gets 3840 MiB
    ["--mem=0"],  # whole nodes
    ["-c2"],  # no memory asked: the site's DefMemPerCPU, read by the pilot at start
]


def test_a_size_no_vm_can_honour_is_refused_with_the_numbers(sized: dict[str, str]) -> None:
    for options, said in REFUSED:
        res = _sbatch(sized, *options)
        assert res.returncode != 0, (options, res.stdout)
        assert said in res.stderr, (options, res.stderr)


def test_a_size_a_vm_can_honour_is_accepted(sized: dict[str, str]) -> None:
    for options in ACCEPTED:
        res = _sbatch(sized, *options)
        assert res.returncode == 0, (options, res.stderr)


def test_without_the_figures_only_the_minimum_is_checked(slurm_cluster: DevCluster) -> None:
    """No vjob-vm-sizes (an agent that never ran): the built-in overhead still refuses a job too
    small, and a job above every node is left to Slurm — which, in 22.05, accepts it held (it
    would pend for ever): the refusal with the figures is vjob's."""
    path = sizes_file(slurm_cluster.conf)
    before = path.read_bytes() if path.exists() else None
    path.unlink(missing_ok=True)
    time.sleep(2.5)
    env = {**os.environ, **slurm_cluster.env}
    try:
        small = _sbatch(env, "--mem-per-cpu=300M")
        assert "below the guest's minimum of 256 MiB" in small.stderr, small.stderr
        large = _sbatch(env, "--mem=5000M")
        assert "vjob:" not in large.stderr, large.stderr
    finally:
        if before is not None:
            path.write_bytes(before)


READ_ALLOCATION = (
    "import json, os, sys; from plugins import job_allocations; "
    "a = job_allocations('slurm', os.environ, os.environ['SLURMD_NODENAME']); "
    "json.dump({n: [x.cpus, x.memory_mib] for n, x in a.items()}, sys.stdout)"
)


@pytest.mark.parametrize(
    ("options", "want"),
    [
        (["-N2", "--mem=0"], {"node1": [1, 4096], "node2": [1, 4096]}),  # whole nodes: Slurm's record
        (["-c3", "--mem-per-cpu=300M"], {"node1": [3, 900]}),  # the environment's figure × CPUs
    ],
)
def test_the_pilot_reads_the_memory_slurm_allocated_on_each_node(
    slurm_cluster: DevCluster, tmp_path: Path, options: list[str], want: dict[str, list[int]]
) -> None:
    """In a real batch job: `--mem=0` puts no memory in the environment, so the reading asks
    `scontrol -d show job` for the allocation's memory per node."""
    out = tmp_path / "alloc.json"
    env = {**os.environ, **slurm_cluster.env}
    res = subprocess.run(
        ["sbatch", "--parsable", "-o", str(out), "-D", str(REPO), "-w", ",".join(want), *options],
        input=f'#!/bin/sh\nexec {sys.executable} -c "{READ_ALLOCATION}"\n',
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (out.exists() and out.read_text().strip().endswith("}")):
            time.sleep(0.5)
        assert json.loads(out.read_text()) == want
    finally:
        subprocess.run(["scancel", job], env=env, timeout=30, check=False, capture_output=True)
