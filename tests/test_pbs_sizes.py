"""The OpenPBS hook refuses, at qsub, a vjob whose chunk memory no VM can honour, with the
numbers (issue 33, item 1): run as PBS runs it, against the stand-in `pbs` module (OpenPBS cannot
run here: tests/pbs_standins.py). The chunk syntax is the MetaCentrum record's
(../shared/data/fixtures/openpbs: `select=1:ncpus=2:mem=4194304kb`)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.test_pbs_hook import Hook, _job
from tests.test_pbs_submit_filter import run_filter


@pytest.fixture
def sized(tmp_path: Any) -> Hook:
    hook = Hook(tmp_path)
    hook.config.update({"vm_overhead_mib": 256, "guest_min_mib": 256, "node_max_mib": 4096})
    return hook


def _queue(hook: Hook, resources: dict[str, str], image: str = "debian12", **attrs: Any) -> dict[str, Any]:
    return hook.run("QUEUEJOB", _job(Variable_List={"VJOB_OS": image}, Resource_List=resources, **attrs))


@pytest.mark.parametrize(
    ("resources", "said"),
    [
        (
            {"select": "1:ncpus=1:mem=300mb"},
            "vjob: mem=300mb (300 MiB per node) leaves 44 MiB for the VM after its overhead of 256 MiB, below the"
            " guest's minimum of 256 MiB: ask for at least mem=512mb per chunk",
        ),
        (
            {"select": "2:ncpus=2:mem=4194304kb+1:ncpus=1:mem=5gb"},  # the second chunk is too big
            "vjob: mem=5gb (5120 MiB per node) is more than the largest node's 4096 MiB, whose VM gets at most"
            " 3840 MiB (its memory minus the VM's overhead of 256 MiB): ask for at most mem=4096mb per chunk",
        ),
        (
            {"select": "2:ncpus=1", "mem": "600mb"},  # 300 MiB for each of the two chunks
            "vjob: mem=600mb over 2 chunks (300 MiB per node) leaves 44 MiB",
        ),
        ({"select": "1:ncpus=1:mem=4gib"}, "vjob: mem=4gib: not a PBS size"),
        ({"select": "1:ncpus=1:mem=" + "9" * 40}, "vjob: mem=" + "9" * 40),
    ],
)
def test_a_chunk_no_vm_can_honour_is_refused_with_the_numbers(
    sized: Hook, resources: dict[str, str], said: str
) -> None:
    result = _queue(sized, resources)
    assert result["outcome"] == "reject", result
    assert said in result["message"], result["message"]


@pytest.mark.parametrize(
    ("resources", "image", "attrs"),
    [
        ({"select": "2:ncpus=2:mem=4194304kb"}, "debian12", {}),  # 4096 MiB: the whole of a node
        ({"select": "1:ncpus=1:mem=64mw"}, "debian12", {}),  # 64 Mi words = 512 MiB
        ({"select": "1:ncpus=4"}, "debian12", {}),  # no memory asked: the pilot reads PBS_RESC_MEM at start
        ({"select": "1:ncpus=1:mem=100mb"}, "debian-tiny", {}),  # the counter guest: not sized
        ({"select": "1:ncpus=1:mem=100mb"}, "off", {}),  # no VM
        ({"select": "1:ncpus=1:mem=100mb"}, "debian12", {"interactive": "True"}),  # interactive: no VM
    ],
)
def test_a_job_a_vm_can_honour_or_that_gets_none_is_accepted(
    sized: Hook, resources: dict[str, str], image: str, attrs: dict[str, Any]
) -> None:
    assert _queue(sized, resources, image, **attrs)["outcome"] == "accept"


def test_without_a_node_figure_only_the_minimum_is_checked(tmp_path: Any) -> None:
    """The shipped defaults: overhead and minimum 256 MiB, node_max_mib 0 (no upper check)."""
    hook = Hook(tmp_path)
    assert _queue(hook, {"select": "1:ncpus=1:mem=1tb"})["outcome"] == "accept"
    assert "minimum of 256 MiB" in _queue(hook, {"select": "1:ncpus=1:mem=256mb"})["message"]


# The Torque submit filter (plugins/pbs/submit_filter.py), run as qsub runs it.
TORQUE_CONFIG = "[provisioning]\nvm_overhead_mib = 256\n[pbs]\nnode_max_mib = 4096\nfilter_budget_s = 10\n"


@pytest.mark.parametrize(
    ("script", "args", "said"),
    [
        (
            b"#!/bin/sh\n#VJOB os=debian12\n#PBS -l nodes=1:ppn=1,mem=300mb\ntrue\n",
            (),
            "qsub: job rejected by vjob: mem=300mb (300 MiB per node) leaves 44 MiB for the VM after its overhead of"
            " 256 MiB, below the guest's minimum of 256 MiB: ask for at least 512 MiB per node",
        ),
        (
            b"#!/bin/sh\n#VJOB os=debian12\ntrue\n",
            ("-l", "nodes=2:ppn=4,pmem=1200mb"),  # 4 × 1200 on each node
            "pmem=1200mb x ppn=4 (4800 MiB per node) is more than the largest node's 4096 MiB, whose VM gets at"
            " most 3840 MiB (its memory minus the VM's overhead of 256 MiB): ask for at most 4096 MiB per node",
        ),
        (
            b"#!/bin/sh\n#VJOB os=debian12\n#PBS -l nodes=2,mem=4gb\ntrue\n",
            ("-l", "mem=1000mb"),  # the command line wins: 500 MiB per node
            "mem=1000mb over 2 nodes (500 MiB per node) leaves 244 MiB",
        ),
        (b"#!/bin/sh\n#VJOB os=debian12\n#PBS -l mem=4GiB\ntrue\n", (), "mem=4GiB: not a Torque size"),
    ],
)
def test_the_torque_filter_refuses_a_size_no_vm_can_honour(
    tmp_path: Any, script: bytes, args: tuple[str, ...], said: str
) -> None:
    config = tmp_path / "vjob.toml"
    config.write_text(TORQUE_CONFIG)
    done = run_filter(script, *args, config=config)
    assert done.returncode == 1, done.stdout
    assert said in done.stderr.decode(), done.stderr


@pytest.mark.parametrize(
    ("script", "args"),
    [
        (b"#!/bin/sh\n#VJOB os=debian12\n#PBS -l nodes=2:ppn=2,mem=8gb\ntrue\n", ()),  # 4096 per node
        (b"#!/bin/sh\n#VJOB os=debian12\n#PBS -l nodes=1:ppn=8\ntrue\n", ()),  # no memory: read at start
        (b"#!/bin/sh\n#VJOB os=debian-tiny\n#PBS -l mem=100mb\ntrue\n", ()),  # the counter guest
        (b"#!/bin/sh\n#PBS -l mem=100mb\ntrue\n", ()),  # no VM
        (b"#!/bin/sh\n#VJOB os=debian12\n#PBS -l mem=100mb\ntrue\n", ("-I",)),  # interactive: no VM
    ],
)
def test_the_torque_filter_accepts_a_size_a_vm_can_honour(tmp_path: Any, script: bytes, args: tuple[str, ...]) -> None:
    config = tmp_path / "vjob.toml"
    config.write_text(TORQUE_CONFIG)
    done = run_filter(script, *args, config=config)
    assert done.returncode == 0, done.stderr
