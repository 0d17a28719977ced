"""The VMs' usage (issue 33 item 5) without an RMS: the record's words (vjob.usage_record), the
sampler on real processes of another uid (provisioning.vm_usage), and the node service's
usage.start / usage.final (provisioning.node_service.usage_ops) with a writer that keeps the
record in memory. The Slurm writer on the real dev cluster: tests/test_accounting_slurmdbd.py."""

from __future__ import annotations

import os
import random
import subprocess
import time
from collections.abc import Iterator

import pytest

from pilot.settings import PilotSettings
from pilot.usage import LocalUsage, NoUsage, for_pilot
from provisioning.node_service import protocol, usage_ops
from provisioning.node_service.grant import Grant
from provisioning.vm_usage import JobMeter, job_processes, names_vm
from tests.usage_burners import PYTHON, burner, cpu_of, wait_burnt
from vjob import usage_record
from vjob.errors import InputError
from vjob.usage_record import Usage

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="starts processes of another uid (needs root)")


# -- the record --------------------------------------------------------------------------------
def test_merge_replaces_only_its_own_word_and_accumulates() -> None:
    text = "vjob:class=batch,os=debian12  operator:  keep\tthis"
    one = usage_record.merged(text, "node1", Usage(10.5, 300, 1))
    assert one.startswith(text + " ")  # every other character kept, tabs and double spaces too
    two = usage_record.merged(one, "node2", Usage(4.0, 900, 1))
    three = usage_record.merged(two, "node1", Usage(2.25, 120, 1))
    assert three.startswith(text + " ")
    parsed = usage_record.parse(three)
    assert parsed["node1"] == Usage(12.75, 300, 2)  # CPU summed, the larger peak, two runs
    assert parsed["node2"] == Usage(4.0, 900, 1)
    assert usage_record.total(three) == Usage(16.75, 900, 2)


def test_merge_against_a_model_of_random_runs() -> None:
    rng = random.Random(33)
    text, model = "note", {}
    for _ in range(200):
        node = rng.choice(["n1", "n2", "node-3.site"])
        run = Usage(round(rng.uniform(0, 500), 2), rng.randrange(0, 5000), 1)
        text = usage_record.merged(text, node, run)
        old = model.get(node, (0.0, 0, 0))
        model[node] = (old[0] + run.cpu_s, max(old[1], run.peak_mib), old[2] + 1)
    assert text.startswith("note ")
    for node, (cpu, peak, runs) in model.items():
        got = usage_record.parse(text)[node]
        assert abs(got.cpu_s - cpu) < 0.01 * runs and got.peak_mib == peak and got.runs == runs


@pytest.mark.parametrize(
    "bad",
    [
        "vjob-usage@n1:cpu_s=1.00,peak_mib=1,runs=1 vjob-usage@n1:cpu_s=2.00,peak_mib=1,runs=1",
        "x" * (usage_record.MAX_FIELD_CHARS + 1),
    ],
)
def test_a_tampered_or_oversized_record_is_refused(bad: str) -> None:
    with pytest.raises(InputError, match="usage record"):
        usage_record.parse(bad)


def test_words_of_another_shape_are_not_ours() -> None:
    text = "vjob-usage@n1:cpu_s=-5,peak_mib=1,runs=1 vjob-usage@n2:cpu_s=1e9 vjob:usage"
    assert usage_record.parse(text) == {}
    with pytest.raises(InputError, match="cpu_s"):
        Usage(float("nan"), 0, 0)
    with pytest.raises(InputError, match="peak_mib"):
        Usage(1.0, True, 0)  # type: ignore[arg-type]


def test_names_vm_reads_qemus_name_argument_only() -> None:
    names = frozenset({"vjob-slurm-77"})
    assert names_vm(b"qemu\0-name\0guest=vjob-slurm-77,debug-threads=on\0-m\0512\0", names)
    assert names_vm(b"qemu\0-name\0vjob-slurm-77\0", names)
    assert not names_vm(b"qemu\0-name\0guest=vjob-slurm-777,debug-threads=on\0", names)
    assert not names_vm(b"sleep\0guest=vjob-slurm-77\0", names)  # not after -name
    assert not names_vm(b"qemu\0-name\0", names)


# -- the sampler on real processes -------------------------------------------------------------
@root_only
def test_the_sampler_counts_the_jobs_processes_only() -> None:
    """A CPU-burning process of uid 65534 named as job 77's VM grows the figures; the same uid's
    VM of job 78 and another uid's process named as job 77's VM are not counted."""
    meter = JobMeter(frozenset({65534}), frozenset({"vjob-slurm-77"}))
    with (
        burner("vjob-slurm-77", cpu_s=1.5, mib=48) as mine,
        burner("vjob-slurm-78", cpu_s=0.5) as other_job,
        burner("vjob-slurm-77", uid=65533, cpu_s=0.5) as other_uid,
    ):
        assert meter.sample() == 1
        first = meter.seen[next(iter(meter.seen))].cpu_s
        wait_burnt(mine)
        wait_burnt(other_job)
        wait_burnt(other_uid)
        assert meter.sample() == 1
        assert [pid for pid, _start in meter.seen] == [mine.pid]
        later = meter.seen[next(iter(meter.seen))].cpu_s
        assert later > first and later >= 1.4
        assert abs(later - cpu_of(mine.pid)) < 0.05
        run = meter.take()
    assert 1.4 <= run.cpu_s <= later + 0.05
    assert run.peak_mib >= 48  # VmHWM: the block it touched
    assert meter.take().cpu_s == 0.0  # handed out once: never counted twice


@root_only
def test_a_process_already_running_counts_from_first_sight() -> None:
    """A VM adopted by a new meter (a restarted service): only what it uses from then on."""
    with burner("vjob-slurm-79", cpu_s=1.0) as old:
        wait_burnt(old)
        time.sleep(0.05)
        meter = JobMeter(frozenset({65534}), frozenset({"vjob-slurm-79"}))
        meter.sample()
        assert meter.take().cpu_s == 0.0


@root_only
def test_a_process_holding_the_jobs_tap_counts_whatever_its_name() -> None:
    """The tap proof: a process in its own network namespace opens /dev/net/tun as the job's
    tap (the kernel writes `iff:` in its fdinfo); its name is not the VM's."""
    code = (
        "import fcntl, os, struct, time\n"
        "fd = os.open('/dev/net/tun', os.O_RDWR)\n"
        "fcntl.ioctl(fd, 0x400454ca, struct.pack('16sH', b'vjob-00ab-t01', 0x0002 | 0x1000))\n"
        "print('up', flush=True); time.sleep(600)\n"
    )
    child = subprocess.Popen(["unshare", "--net", PYTHON, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        found = job_processes({0}, {"vjob-slurm-nothing"}, {"vjob-00ab-t01"})
        assert [f.pid for f in found] == [child.pid]
        assert job_processes({0}, {"vjob-slurm-nothing"}, {"vjob-00ab-t02"}) == []
    finally:
        child.kill()
        child.wait(timeout=10)


# -- the node service's operations ---------------------------------------------------------------
class MemoryRecord:
    """A writer that keeps one job record's text in memory (the RMS's side is tested for real in
    tests/test_accounting_slurmdbd.py)."""

    def __init__(self, text: str = "vjob:class=batch,os=debian12") -> None:
        self.text = text
        self.calls: list[tuple[str, str, Usage]] = []

    def add(self, job: str, node: str, run: Usage) -> str:
        self.calls.append((job, node, run))
        self.text = usage_record.merged(self.text, node, run)
        return self.text


@pytest.fixture(autouse=True)
def _rounds_only_when_the_test_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The service's background sampler (started by the first usage.start) sleeps `interval_s()`
    between rounds: 30 s, or `[node] usage_interval_s` (5 s by default) of whatever site
    configuration an earlier test of this process installed. A round of its own inside a test
    that counts rounds (GONE_SAMPLES) ends a run early, and which tests ran before in the same
    process changes with pytest-xdist's order: here every round is one the test asks for."""
    monkeypatch.setattr(usage_ops, "interval_s", lambda: 3600.0)


@pytest.fixture
def record() -> Iterator[MemoryRecord]:
    writer = MemoryRecord()
    usage_ops.install_writer(writer)
    try:
        yield writer
    finally:
        usage_ops.install_writer(None)


def call(op: str, grant: Grant) -> dict:
    request = protocol.check({"op": op, "job": grant.job, "node": grant.node}, usage_ops.OPERATIONS)
    return usage_ops.OPERATIONS[op].run(grant, request.fields)


def grant_of(job: str) -> Grant:
    """Job `job` of uid 65534 running on node n1 (the service's Grant, built by hand)."""
    nobody = {"uid": 65534, "gid": 65534, "user": "nobody"}
    return Grant(rms="slurm", job=job, node="n1", nodes=("n1",), cpus=1, memory_mib=0, **nobody)


GRANT = grant_of("81")


@root_only
def test_two_runs_accumulate_and_a_repeated_final_adds_nothing(record: MemoryRecord) -> None:
    for cpu in (1.0, 0.6):
        assert call("usage.start", GRANT)["tracking"] is True
        with burner("vjob-slurm-81", cpu_s=cpu) as vm:
            wait_burnt(vm)
            answer = call("usage.final", GRANT)
        assert answer["written"] is True and answer["cpu_s"] >= cpu - 0.1
        assert call("usage.final", GRANT) == answer  # a retry after a timeout: nothing added
    assert len(record.calls) == 2
    mine = usage_record.parse(record.text)["n1"]
    assert mine.runs == 2 and mine.cpu_s >= 1.5 and mine.peak_mib >= 40
    assert record.text.startswith("vjob:class=batch,os=debian12 ")
    usage_ops.sample_all()  # its VMs are gone and its run written: forgotten
    assert ("slurm", "81", "n1") not in usage_ops.tracked_jobs()


@root_only
def test_a_final_without_any_vm_writes_nothing(record: MemoryRecord) -> None:
    grant = grant_of("82")
    call("usage.start", grant)
    answer = call("usage.final", grant)
    assert answer["written"] is False and "no VM of job 82" in answer["reason"]
    assert record.calls == []


def test_a_final_without_start_and_unknown_fields_are_refused(record: MemoryRecord) -> None:
    grant = grant_of("83")
    with pytest.raises(InputError, match=r"no usage\.start"):
        call("usage.final", grant)
    with pytest.raises(protocol.ProtocolError, match="cpu_s"):
        protocol.check({"op": "usage.final", "job": "83", "node": "n1", "cpu_s": 1e9}, usage_ops.OPERATIONS)


@root_only
def test_the_sampler_keeps_the_figures_of_a_vm_that_ended_before_final(record: MemoryRecord) -> None:
    """A guest that powers off: its QEMU is gone at usage.final; the last sample's figures are
    what is written (the CPU after that sample is what the figure misses)."""
    grant = grant_of("84")
    call("usage.start", grant)
    with burner("vjob-slurm-84", cpu_s=0.8) as vm:
        wait_burnt(vm)
        usage_ops.sample_all()  # the background sampler's round
    answer = call("usage.final", grant)
    assert answer["written"] is True and answer["cpu_s"] >= 0.7


# -- the pilot's side ------------------------------------------------------------------------------
def test_a_pilot_outside_its_rms_job_measures_nothing() -> None:
    settings = PilotSettings(rms="slurm", job_id="90", node="n1")
    assert isinstance(for_pilot(settings, 1, env={"SLURM_JOB_ID": "89"}), NoUsage)
    assert isinstance(for_pilot(settings, 1, env={}), NoUsage)


@root_only
def test_a_root_pilot_measures_its_nodes_vm_and_writes_once() -> None:
    """A root pilot's run (root's libvirt runs QEMU as root here): sampled in the background,
    written at the end through the RMS's writer; a run that saw no VM writes nothing."""
    writer = MemoryRecord()
    usage = LocalUsage(PilotSettings(rms="slurm", job_id="91", node="n1"), 1, writer, interval_s=0.2)
    usage.start()
    with burner("vjob-slurm-91", uid=0, cpu_s=0.6) as vm:
        wait_burnt(vm)
        time.sleep(0.5)  # a background sample or two
    usage.final()  # the VM is gone: its last sample counts
    assert [(job, node) for job, node, _run in writer.calls] == [("91", "n1")]
    assert writer.calls[0][2].cpu_s >= 0.5
    idle = LocalUsage(PilotSettings(rms="slurm", job_id="92", node="n1"), 1, writer, interval_s=0.2)
    idle.start()
    idle.final()
    assert len(writer.calls) == 1


@root_only
def test_a_run_whose_pilot_never_ends_is_written_when_its_vms_are_gone(record: MemoryRecord) -> None:
    """A pilot SIGKILLed (no usage.final): once the sampler has missed the job's VMs for
    GONE_SAMPLES rounds, it writes what it measured and forgets the run."""
    grant = grant_of("85")
    call("usage.start", grant)
    with burner("vjob-slurm-85", cpu_s=0.5) as vm:
        wait_burnt(vm)
        usage_ops.sample_all()
    for _ in range(usage_ops.GONE_SAMPLES - 1):
        usage_ops.sample_all()
    assert record.calls == []  # not yet: a VM may come back (a restore)
    usage_ops.sample_all()
    assert [(job, node) for job, node, _run in record.calls] == [("85", "n1")]
    assert record.calls[0][2].cpu_s >= 0.45
    assert ("slurm", "85", "n1") not in usage_ops.tracked_jobs()
