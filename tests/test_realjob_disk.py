"""The job disk and the guest agent's checks, without a VM (docs/realjobs.md).

The guest side is simulated with debugfs -w on the disk the pilot built: what a job writes in
the guest is what a real guest writes there (tests/test_realjob_realvm.py does it for real).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pilot import job as run_job
from provisioning import job_disk
from provisioning.guest_agent import agent
from vjob import proc
from vjob.cli import main as vjob_main
from vjob.errors import InputError


def _job(cwd: Path, **changes: object) -> job_disk.JobDescription:
    fields: dict[str, object] = dict(
        script=b"#!/bin/sh\necho hi\n",
        args=["a b"],
        env={"X": "1"},
        uid=os.getuid(),
        gid=os.getgid(),
        user="alice",
        home="/home/alice",
        cwd=str(cwd),
    )
    fields.update(changes)
    return job_disk.JobDescription(**fields)  # type: ignore[arg-type]


def _guest_writes(disk: Path, tmp: Path, files: dict[str, bytes], exit_code: int | None) -> None:
    """What a guest would do: write files under /work and the exit status, on the qcow2 disk."""
    raw = tmp / "g.raw"
    proc.run(["qemu-img", "convert", "-q", "-O", "raw", str(disk), str(raw)], timeout_s=60)
    cmds = []
    for i, (name, data) in enumerate(files.items()):
        src = tmp / f"g{i}"
        src.write_bytes(data)
        cmds += [f"rm /work/{name}", f"write {src} /work/{name}"]
    if exit_code is not None:
        (tmp / "exit").write_text(f"{exit_code}\n")
        cmds.append(f"write {tmp / 'exit'} /.vjob/exit")
    script = tmp / "cmds"
    script.write_text("\n".join(cmds) + "\n")
    proc.run(["debugfs", "-w", "-f", str(script), str(raw)], timeout_s=60)
    proc.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(disk)], timeout_s=60)


def test_results_come_back_and_the_hosts_own_writes_are_kept(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "input.txt").write_text("in\n")
    (work / "sub" / "keep.txt").write_text("keep\n")
    (work / "slurm-1.out").write_text("")
    vms = tmp_path / "vms"
    vms.mkdir()
    disk = vms / "vm.job.qcow2"
    job_disk.build(work, _job(work), disk, limit_bytes=2**20, free_bytes=64 * 2**20)
    # The pilot writes the job's output into the working directory while the job runs.
    (work / "slurm-1.out").write_text("progress 1\nprogress 2\n")
    _guest_writes(disk, tmp_path, {"result.txt": b"42\n"}, exit_code=3)
    results = job_disk.collect(disk, work)
    assert results.exit_code == 3
    assert (work / "result.txt").read_text() == "42\n"
    assert (work / "slurm-1.out").read_text() == "progress 1\nprogress 2\n", "an unchanged staged copy won"
    assert (work / "sub" / "keep.txt").read_text() == "keep\n"
    assert (work / "result.txt").stat().st_uid == os.getuid()
    assert not list(vms.glob(".vjob-results-*")), "scratch copy left behind"


def test_a_guest_that_never_ended_has_no_exit_status(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    disk = tmp_path / "vm.job.qcow2"
    job_disk.build(work, _job(work), disk, limit_bytes=2**20, free_bytes=64 * 2**20)
    assert job_disk.collect(disk, work).exit_code is None


def test_a_working_directory_over_the_limit_is_refused_before_anything(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "big.bin").write_bytes(b"\0" * (3 * 2**20))
    disk = tmp_path / "vm.job.qcow2"
    with pytest.raises(InputError, match=r"more than 1 MiB to stage \(provisioning.stage_limit_mb\)"):
        job_disk.build(work, _job(work), disk, limit_bytes=2**20, free_bytes=64 * 2**20)
    assert not disk.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    assert (work / "big.bin").stat().st_size == 3 * 2**20


def test_vjob_run_refuses_an_oversized_working_directory_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the real command: the refusal comes before any VM, with the limit named."""
    images = tmp_path / "data" / "images"
    images.mkdir(parents=True)
    for suffix in ("qcow2", "vmlinuz", "initrd"):
        (images / f"debian12-1.{suffix}").write_bytes(b"x")
    (images / "debian12.image.json").write_text(
        json.dumps(
            {
                "name": "debian12",
                "version": "1",
                "format": "qcow2",
                "path": str(images / "debian12-1.qcow2"),
                "sha256": "0" * 64,
                "kernel": str(images / "debian12-1.vmlinuz"),
                "initrd": str(images / "debian12-1.initrd"),
                "cmdline": "root=/dev/vda",
            }
        )
    )
    config = tmp_path / "vjob.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n[provisioning]\nstage_limit_mb = 1\n')
    work = tmp_path / "work"
    work.mkdir()
    (work / "big.bin").write_bytes(b"\1" * (2 * 2**20))
    (work / "job.sh").write_text("#!/bin/sh\necho hi\n")
    monkeypatch.chdir(work)
    code = vjob_main(
        ["--config", str(config), "run", "--job-id", "7", "--node", "n1", "--os", "debian12", "--script", "job.sh"]
    )
    assert code == 2
    assert "more than 1 MiB to stage" in capsys.readouterr().err
    assert sorted(p.name for p in work.iterdir()) == ["big.bin", "job.sh"]
    unknown = vjob_main(
        ["--config", str(config), "run", "--job-id", "7", "--node", "n1", "--os", "centos7", "--script", "job.sh"]
    )
    assert unknown == 2
    assert "OS image 'centos7': unknown on this node; known images: debian-tiny, debian12" in capsys.readouterr().err


def test_the_job_description_is_checked_on_both_sides(tmp_path: Path) -> None:
    good = _job(tmp_path).to_json()
    assert agent.parse_job(good).cwd == str(tmp_path)
    bad = {
        "user": ("alice\n", "user"),
        "cwd": ("/etc", "system directory"),
        "home": ("rel/home", "absolute"),
        "uid": (-1, "uid"),
        "env": ({"A=B": "x"}, "env"),
        "argv": ([], "argv"),
        "hostname": ("a b", "hostname"),
    }
    for field, (value, message) in bad.items():
        with pytest.raises(agent.JobError, match=message):
            agent.parse_job({**good, field: value})
    with pytest.raises(InputError, match="job for the guest: cwd"):
        job_disk.check_description(_job(Path("/usr/lib")))
    with pytest.raises(InputError, match=r"script: .* at most"):
        job_disk.check_description(_job(tmp_path, script=b"x" * (job_disk.MAX_SCRIPT_BYTES + 1)))


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["argv", "env", "uid", "gid", "user", "home", "cwd", "hostname", "x"]),
        st.one_of(
            st.none(),
            st.integers(),
            st.text(max_size=20),
            st.lists(st.text(max_size=5)),
            st.dictionaries(st.text(max_size=5), st.text(max_size=5)),
        ),
    )
)
def test_any_job_json_is_a_job_or_a_job_error(data: dict[str, object]) -> None:
    try:
        agent.parse_job(data)
    except agent.JobError:
        pass


def test_the_guest_user_gets_the_hosts_ids(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/a:/bin/sh\n")
    (etc / "group").write_text("root:x:0:\n")
    job = agent.parse_job({**_job(Path("/home/alice/w"), uid=1003, gid=1004).to_json()})
    agent.ensure_user(job, etc)
    agent.ensure_user(job, etc)  # idempotent
    assert (etc / "passwd").read_text().count(":1003:") == 1
    assert "vjob-u1003:x:1003:1004::/home/alice:/bin/bash" in (etc / "passwd").read_text()  # name taken
    assert "alice:x:1004:" in (etc / "group").read_text()


def test_the_pilot_describes_the_job_from_the_kernels_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("USER", "someone-else")
    monkeypatch.setenv("BASH_FUNC_f%%", "() { :; }")
    job = run_job.job_description(b"#!/bin/sh\n", ["x"], "node1")
    assert (job.uid, job.gid, job.cwd, job.hostname) == (os.getuid(), os.getgid(), str(tmp_path), "node1")
    assert "BASH_FUNC_f%%" not in job.env and job.env["VJOB_NODE"] == "node1"
