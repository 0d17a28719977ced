"""A real job's VM sized to its allocation (issue 33, item 1): each RMS's reading of the job's
environment (plugins/<rms>/allocation.py), the pilot's choice (pilot.sizing) and the vCPUs in the
domain XML. The environments are Slurm 22.05's batch variables (sbatch(1)), the MetaCentrum PBS
record of ../shared/data/fixtures/openpbs, and OAR's node file.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pilot.sizing import VMSize, choose
from plugins import job_allocations
from plugins.slurm.allocation import cpus_per_node
from provisioning.domain_xml import domain_xml
from provisioning.vm_types import VMSpec
from vjob.allocation import Allocation
from vjob.config import ProvisioningConfig
from vjob.errors import InputError, UsageError

REPO = Path(__file__).resolve().parents[1]

# `sbatch -N2 -c2 --mem=768M` on node[1-2] (one task per node).
SLURM_MEM = {
    "SLURM_JOB_ID": "41",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_JOB_CPUS_PER_NODE": "2(x2)",
    "SLURM_CPUS_ON_NODE": "2",
    "SLURM_MEM_PER_NODE": "768",
    "SLURMD_NODENAME": "node1",
}
# `sbatch -c3 --mem-per-cpu=500M` (or the site's DefMemPerCPU=500).
SLURM_PER_CPU = {"SLURM_JOB_NODELIST": "node1", "SLURM_JOB_CPUS_PER_NODE": "3", "SLURM_CPUS_ON_NODE": "3"}
SLURM_PER_CPU["SLURM_MEM_PER_CPU"] = "500"
# `sbatch --exclusive` on a 4-CPU node, no --mem, no DefMemPerCPU: no memory figure.
SLURM_EXCLUSIVE = {"SLURM_JOB_NODELIST": "node3", "SLURM_JOB_CPUS_PER_NODE": "4", "SLURM_CPUS_ON_NODE": "4"}


def test_slurm_mem_per_node_gives_every_node_its_cpus_and_memory() -> None:
    got = job_allocations("slurm", SLURM_MEM, "node1")
    assert got == {"node1": Allocation(2, 768), "node2": Allocation(2, 768)}


def test_slurm_mem_per_cpu_is_multiplied_by_the_node_cpus() -> None:
    assert job_allocations("slurm", SLURM_PER_CPU, "node1") == {"node1": Allocation(3, 1500)}


def test_slurm_without_memory_gives_cpus_only_and_outside_a_job_nothing() -> None:
    assert job_allocations("slurm", SLURM_EXCLUSIVE, "node3") == {"node3": Allocation(4, None)}
    assert job_allocations("slurm", {**SLURM_EXCLUSIVE, "SLURM_MEM_PER_NODE": "0"}, "node3")["node3"].memory_mib is None
    assert job_allocations("slurm", {"SLURM_JOB_ID": "1"}, "node1") == {}


def test_slurm_uneven_nodes_follow_the_nodelist_order() -> None:
    env = {"SLURM_JOB_NODELIST": "n[1-3],m7", "SLURM_JOB_CPUS_PER_NODE": "4(x2),2,1", "SLURM_MEM_PER_CPU": "100"}
    got = job_allocations("slurm", env, "n1")
    assert got == {
        "n1": Allocation(4, 400),
        "n2": Allocation(4, 400),
        "n3": Allocation(2, 200),
        "m7": Allocation(1, 100),
    }
    assert cpus_per_node("2(x3),1") == [2, 2, 2, 1]


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("SLURM_CPUS_ON_NODE", "99999999999999999999999"),
        ("SLURM_CPUS_ON_NODE", "-2"),
        ("SLURM_CPUS_ON_NODE", "two"),
        ("SLURM_CPUS_ON_NODE", "0"),
        ("SLURM_CPUS_ON_NODE", "1e3"),
        ("SLURM_MEM_PER_NODE", "-768"),
        ("SLURM_MEM_PER_NODE", "768G"),
        ("SLURM_MEM_PER_NODE", "18446744073709551615"),
        ("SLURM_MEM_PER_CPU", "x"),
        ("SLURM_JOB_CPUS_PER_NODE", "2(x2"),
        ("SLURM_JOB_CPUS_PER_NODE", "2(x-1)"),
    ],
)
def test_slurm_hostile_values_are_refused_naming_the_variable_and_value(var: str, value: str) -> None:
    env = {**SLURM_MEM, var: value}
    if var == "SLURM_MEM_PER_CPU":  # read only without --mem
        del env["SLURM_MEM_PER_NODE"]
    with pytest.raises(InputError, match=re.escape(f"${var} = {value[:40]!r}")):
        job_allocations("slurm", env, "node1")


def test_slurm_memory_per_cpu_times_cpus_past_any_node_is_refused() -> None:
    env = {**SLURM_PER_CPU, "SLURM_CPUS_ON_NODE": "4096", "SLURM_JOB_CPUS_PER_NODE": "4096"}
    env["SLURM_MEM_PER_CPU"] = str(1 << 25)
    with pytest.raises(InputError, match=r"\$SLURM_MEM_PER_CPU"):
        job_allocations("slurm", env, "node1")


def test_slurm_cpu_list_that_does_not_match_the_nodelist_is_refused() -> None:
    with pytest.raises(InputError, match=r"3 nodes, \$SLURM_JOB_NODELIST has 2"):
        job_allocations("slurm", {**SLURM_MEM, "SLURM_JOB_CPUS_PER_NODE": "2(x3)"}, "node1")


def test_pbs_reads_ncpus_and_the_chunk_memory_of_the_metacentrum_record(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodes"
    nodefile.write_text("charon24.nti.tul.cz\ncharon24.nti.tul.cz\ncharon21.nti.tul.cz\ncharon21.nti.tul.cz\n")
    env = {"PBS_NCPUS": "2", "PBS_NUM_PPN": "2", "PBS_RESC_MEM": "4294967296", "PBS_NODEFILE": str(nodefile)}
    got = job_allocations("pbs", env, "charon24")
    assert got == {"charon24": Allocation(2, 4096), "charon21": Allocation(2, 4096)}
    assert job_allocations("pbs", {"NCPUS": "8"}, "cn1") == {"cn1": Allocation(8, None)}
    assert job_allocations("pbs", {}, "cn1") == {}
    with pytest.raises(InputError, match=r"\$NCPUS = '-4'"):
        job_allocations("pbs", {"NCPUS": "-4"}, "cn1")
    with pytest.raises(InputError, match=r"\$PBS_RESC_MEM = '4gb'"):
        job_allocations("pbs", {"NCPUS": "4", "PBS_RESC_MEM": "4gb"}, "cn1")


def test_oar_counts_each_host_lines_as_its_cores(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodes"
    nodefile.write_text("gros-1.nancy.grid5000.fr\n" * 4 + "gros-2.nancy.grid5000.fr\n" * 2)
    got = job_allocations("oar", {"OAR_NODEFILE": str(nodefile)}, "gros-1")
    assert got == {"gros-1": Allocation(4, None), "gros-2": Allocation(2, None)}
    assert job_allocations("oar", {}, "gros-1") == {}


def test_an_unknown_rms_is_refused() -> None:
    with pytest.raises(UsageError):
        job_allocations("lsf", {}, "n1")


# Recorded on the dev cluster (Slurm 22.05.8, 4 CPUs and DefMemPerCPU=1024 per node): `env` in
# a batch script submitted with these options.
RECORDED = {
    "-c2 --mem=768M": (
        {
            "SLURM_CPUS_ON_NODE": "2",
            "SLURM_CPUS_PER_TASK": "2",
            "SLURM_JOB_CPUS_PER_NODE": "2",
            "SLURM_JOB_NODELIST": "node1",
            "SLURM_MEM_PER_NODE": "768",
            "SLURM_NNODES": "1",
            "SLURM_TASKS_PER_NODE": "1",
        },
        "node1",
        {"node1": Allocation(2, 768)},
    ),
    "-c3 --mem-per-cpu=300M": (
        {
            "SLURM_CPUS_ON_NODE": "3",
            "SLURM_CPUS_PER_TASK": "3",
            "SLURM_JOB_CPUS_PER_NODE": "3",
            "SLURM_JOB_NODELIST": "node2",
            "SLURM_MEM_PER_CPU": "300",
            "SLURM_NNODES": "1",
            "SLURM_TASKS_PER_NODE": "1",
        },
        "node2",
        {"node2": Allocation(3, 900)},
    ),
    "-c2 (DefMemPerCPU)": (
        {
            "SLURM_CPUS_ON_NODE": "2",
            "SLURM_CPUS_PER_TASK": "2",
            "SLURM_JOB_CPUS_PER_NODE": "2",
            "SLURM_JOB_NODELIST": "node1",
            "SLURM_MEM_PER_CPU": "1024",
            "SLURM_NNODES": "1",
            "SLURM_TASKS_PER_NODE": "1",
        },
        "node1",
        {"node1": Allocation(2, 2048)},
    ),
    "--exclusive": (
        {
            "SLURM_CPUS_ON_NODE": "4",
            "SLURM_JOB_CPUS_PER_NODE": "4",
            "SLURM_JOB_NODELIST": "node3",
            "SLURM_MEM_PER_CPU": "1024",
            "SLURM_NNODES": "1",
            "SLURM_TASKS_PER_NODE": "4",
        },
        "node3",
        {"node3": Allocation(4, 4096)},
    ),
    "-N2 -c2 --mem=768M": (
        {
            "SLURM_CPUS_ON_NODE": "2",
            "SLURM_CPUS_PER_TASK": "2",
            "SLURM_JOB_CPUS_PER_NODE": "2(x2)",
            "SLURM_JOB_NODELIST": "node[4-5]",
            "SLURM_MEM_PER_NODE": "768",
            "SLURM_NNODES": "2",
            "SLURM_TASKS_PER_NODE": "1(x2)",
        },
        "node4",
        {"node4": Allocation(2, 768), "node5": Allocation(2, 768)},
    ),
}


@pytest.mark.parametrize("options", sorted(RECORDED))
def test_slurm_environments_recorded_on_the_dev_cluster(options: str) -> None:
    env, node, want = RECORDED[options]
    assert job_allocations("slurm", env, node) == want


SIZE = {"overhead_mib": 192, "floor_mib": 256, "default_mib": 256}


def test_the_vm_gets_the_allocation_minus_the_overhead() -> None:
    got = choose(Allocation(2, 768), node="n1", asked_cpus=None, asked_memory=None, **SIZE)
    assert got == VMSize(2, 768 - 192)


def test_an_explicit_size_wins_but_is_capped_by_the_allocation() -> None:
    assert choose(Allocation(4, 4096), node="n1", asked_cpus=2, asked_memory=1024, **SIZE) == VMSize(2, 1024)
    assert choose(Allocation(2, 1024), node="n1", asked_cpus=8, asked_memory=4096, **SIZE) == VMSize(2, 1024 - 192)
    assert choose(Allocation(2, 1024), node="n1", asked_cpus=None, asked_memory=100, **SIZE) == VMSize(2, 256)


def test_no_memory_figure_keeps_the_default_and_no_allocation_the_old_size() -> None:
    assert choose(Allocation(4, None), node="n1", asked_cpus=None, asked_memory=None, **SIZE) == VMSize(4, 256)
    assert choose(Allocation(4, None), node="n1", asked_cpus=None, asked_memory=512, **SIZE) == VMSize(4, 512)
    assert choose(None, node="n1", asked_cpus=None, asked_memory=None, **SIZE) == VMSize(1, 256)
    assert choose(None, node="n1", asked_cpus=3, asked_memory=128, **SIZE) == VMSize(3, 256)


def test_an_allocation_no_vm_can_honour_is_refused_with_the_numbers() -> None:
    with pytest.raises(InputError) as exc:
        choose(Allocation(1, 400), node="node2", asked_cpus=None, asked_memory=None, **SIZE)
    msg = str(exc.value)
    for part in ("node node2", "400 MiB", "overhead of 192 MiB", "leaves 208 MiB", "minimum of 256 MiB", "448"):
        assert part in msg, msg
    with pytest.raises(InputError, match=r"--cpus 0"):
        choose(Allocation(1, 4096), node="n1", asked_cpus=0, asked_memory=None, **SIZE)


def test_the_vcpus_reach_the_domain_xml(tmp_path: Path) -> None:
    spec = VMSpec(name="vjob-slurm-1", image=tmp_path / "base.qcow2", memory_mib=576, vcpus=2)
    root = ET.fromstring(domain_xml(spec, dom_type="qemu", overlay=tmp_path / "o", console_log=tmp_path / "c"))
    assert root.findtext("vcpu") == "2"
    assert root.findtext("currentMemory") == "576"


def test_the_submit_filter_uses_the_configured_default_overhead() -> None:
    lua = (REPO / "plugins" / "slurm" / "job_submit.lua").read_text()
    m = re.search(r"local VM_OVERHEAD_MIB = (\d+)", lua)
    assert m and int(m.group(1)) == ProvisioningConfig().vm_overhead_mib
    assert "local REAL_MIN_MIB = 256" in lua


def test_the_pilot_refuses_at_start_a_job_whose_memory_holds_no_vm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sbatch --mem=300M` of a real image: exit 2 before anything starts, the numbers in the job's output."""
    from vjob.cli import main as vjob_main

    for var in [v for v in os.environ if v.startswith("SLURM")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "1")
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "300")
    config = tmp_path / "vjob.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n')
    (tmp_path / "job.sh").write_text("#!/bin/sh\necho hi\n")
    monkeypatch.chdir(tmp_path)
    argv = ["--config", str(config), "run", "--job-id", "7", "--node", "n1", "--os", "debian12", "--script", "job.sh"]
    assert vjob_main(argv) == 2
    err = capsys.readouterr().err
    assert "node n1: the job's 300 MiB minus the VM's overhead of" in err and "minimum of 256 MiB" in err, err
    assert not (tmp_path / "data").exists()


# `scontrol -d show job` of `sbatch -N2 --mem=0` on the dev cluster (Slurm 22.05.8, 4096 MiB
# nodes): the environment had no SLURM_MEM_*; the allocation's memory per node is here.
DETAIL_MEM0 = """JobId=1 JobName=wrap
   NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   TRES=cpu=2,mem=8G,node=2,billing=2
     Nodes=node[1-2] CPU_IDs=0 Mem=4096 GRES=
   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0
"""


def test_slurm_memory_per_node_from_scontrol_detail() -> None:
    from plugins.slurm.allocation import job_memory

    assert job_memory(DETAIL_MEM0) == {"node1": 4096, "node2": 4096}
    uneven = "     Nodes=a[1-2] CPU_IDs=0-3 Mem=2048 GRES=\n     Nodes=b7 CPU_IDs=0 Mem=512 GRES=\n"
    assert job_memory(uneven) == {"a1": 2048, "a2": 2048, "b7": 512}
    assert job_memory("     Nodes=node1 CPU_IDs=0 Mem=0 GRES=\n") == {}  # memory not tracked
    with pytest.raises(InputError, match="Mem"):
        job_memory("     Nodes=node1 CPU_IDs=0 Mem=99999999999 GRES=\n")


def test_slurm_without_a_memory_variable_asks_slurm_only_inside_a_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """--mem=0: no SLURM_MEM_*; the reading takes Slurm's record for each node (here a stand-in
    for scontrol's answer: the live run is tests/test_slurm_vm_memory.py)."""
    import plugins.slurm.allocation as reader

    asked: list[str] = []
    monkeypatch.setattr(reader, "allocated_memory", lambda env: asked.append(env["SLURM_JOB_ID"]) or {"node3": 4096})
    env = {**SLURM_EXCLUSIVE, "SLURM_JOB_ID": "9"}
    assert job_allocations("slurm", env, "node3") == {"node3": Allocation(4, 4096)}
    assert job_allocations("slurm", {**env, "SLURM_MEM_PER_NODE": "0"}, "node3") == {"node3": Allocation(4, 4096)}
    assert job_allocations("slurm", {**env, "SLURM_MEM_PER_NODE": "768"}, "node3") == {"node3": Allocation(4, 768)}
    assert asked == ["9", "9"]


def test_the_size_file_job_submit_lua_reads(tmp_path: Path) -> None:
    """vjob-vm-sizes: written atomically, only on a change, from the nodes' memories; a damaged
    or hostile file reads as absent (the Lua then keeps its defaults)."""
    from plugins.slurm.vm_sizes import Publisher, VMSizes, read_sizes, site_sizes, write_sizes
    from vjob.model import Node

    path = tmp_path / "vjob-vm-sizes"
    publish = Publisher(path, 192)
    publish([Node("n1", cpus=4, memory_mb=4096), Node("n2", cpus=8, memory_mb=8192)])
    assert path.read_text() == "overhead_mib=192 guest_min_mib=256 node_max_mib=8192\n"
    assert (path.stat().st_mode & 0o777) == 0o644
    assert not write_sizes(path, VMSizes(192, 256, 8192))  # unchanged: not rewritten
    assert site_sizes(256, 256, []) is None
    publish([])  # no node seen: the file stays
    assert read_sizes(path) == VMSizes(192, 256, 8192)
    for text in (
        "overhead_mib=-1 guest_min_mib=256 node_max_mib=1\n",
        "x" * 4096,
        "overhead_mib=1 guest_min_mib=0 node_max_mib=9\n",
    ):
        path.write_text(text)
        assert read_sizes(path) is None, text
    with pytest.raises(InputError, match="node_max_mib"):
        VMSizes(0, 256, 1 << 40)
    (tmp_path / "a-file").write_text("")  # a directory that cannot be written (ENOTDIR, even as root)
    Publisher(tmp_path / "a-file" / "vjob-vm-sizes", 256)([Node("n1", cpus=1, memory_mb=1024)])  # logged, not raised


def test_the_agent_adapter_publishes_the_sizes_beside_slurm_conf(tmp_path: Path) -> None:
    """make_adapter gives the Slurm adapter a Publisher writing beside `[slurm] conf`, with the
    configured overhead: the agent's every read of the nodes keeps job_submit.lua's figures."""
    from plugins.slurm.adapter import make_adapter
    from plugins.slurm.vm_sizes import Publisher
    from vjob.config import Config

    conf = tmp_path / "etc" / "slurm.conf"
    conf.parent.mkdir()
    cfg = Config.model_validate(
        {"data_dir": str(tmp_path / "data"), "slurm": {"conf": str(conf)}, "provisioning": {"vm_overhead_mib": 192}}
    )
    publisher = make_adapter(cfg).on_nodes
    assert isinstance(publisher, Publisher)
    assert publisher.path == tmp_path / "etc" / "vjob-vm-sizes" and publisher.overhead_mib == 192
