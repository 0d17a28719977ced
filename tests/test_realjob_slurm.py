"""Transparent submission on the real Slurm dev cluster with real QEMU (docs/realjobs.md).

A plain `sbatch job.sh` by an ordinary user, whose script says nothing of vjob: the partition
is the operator's vjob partition (`[slurm] vjob_partitions`, issue 33 item 6), so
job_submit.lua wraps it, the pilot runs it in the guest as that user (qemu:///session: no
privilege anywhere); mid-run the vjob agent preempts it pause-first for the same user's
interactive job on every node (the VM paused, the job suspended, its memory drained to disk by
pilot.pause_drain, then requeue-held: the interactive job must run before the save ends), and
releases it once that job ended (the VM is restored; docs/preempt-pause.md). The result must
equal the chain computed here, slurm-<id>.out must hold every progress line, Slurm must record
the script's `exit 3`, and the files belong to the user. The job asks `-c2 --mem=768M`: its
guest has 2 vCPUs and 768 MiB minus the VM's overhead.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.devcluster import JOB_SUBMIT_LUA, DevCluster
from devkit.preempt_pause import PauseRun
from plugins.slurm.config import SlurmConfig
from plugins.slurm.images import read_image_list, write_image_list
from plugins.slurm.site_default import DEFAULTS_NAME, sync_partition_defaults
from tests import local_users
from tests.services import user_pilot, wait_for
from tests.test_realjob_realvm import SCRIPT, STEPS, expected_chain
from vjob.config import ProvisioningConfig

pytestmark = [pytest.mark.slurm]
SIZE_LINE = "echo \"size $(nproc) $(awk '/^MemTotal/ {print $2}' /proc/meminfo)\"\n"
"""The guest's vCPUs and MemTotal (KiB), the first line of the sized job's output."""
USER = "vjrun"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def wrapped_cluster(slurm_cluster: DevCluster) -> Iterator[DevCluster]:
    """The dev cluster with this checkout's job_submit.lua and debian12 in its image list."""
    lua = slurm_cluster.etc / "job_submit.lua"
    if lua.read_text() != JOB_SUBMIT_LUA.read_text():
        shutil.copyfile(JOB_SUBMIT_LUA, lua)  # slurmctld reloads a changed script by itself
    before = read_image_list(slurm_cluster.image_list)
    write_image_list(slurm_cluster.image_list, [*before, "debian12"])
    time.sleep(2.5)  # job_submit.lua caches the list for 2 s
    try:
        yield slurm_cluster
    finally:
        write_image_list(slurm_cluster.image_list, before)


def _sbatch(cluster: DevCluster, script: str, *args: str, env: dict[str, str] | None = None) -> str:
    res = subprocess.run(
        ["sbatch", "--parsable", *args],
        input=script,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **cluster.env, **(env or {})},
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def test_the_wrapper_keeps_the_script_byte_for_byte(wrapped_cluster: DevCluster) -> None:
    script = "#!/bin/bash\n#VJOB os=debian12\necho \"it's $HOME `id`\"\ncat <<'VJOB_SCRIPT_END'\nx\nVJOB_SCRIPT_END\n"
    job = _sbatch(wrapped_cluster, script, "--hold", "-o", "/dev/null")
    try:
        out = Path(tempfile.mkdtemp()) / "w.sh"
        subprocess.run(
            ["scontrol", "write", "batch_script", job, str(out)],
            env={**os.environ, **wrapped_cluster.env},
            check=True,
            capture_output=True,
            timeout=30,
        )
        wrapper = out.read_text()
        assert wrapper.startswith("#!/bin/sh\n# vjob wrapper (job_submit.lua)")
        assert 'exec vjob run --os debian12 --script - -- "$@" <<' in wrapper  # literal (issue 33 item 6)
        delim = wrapper.split("<<'", 1)[1].split("'\n", 1)[0]
        assert wrapper.split(f"<<'{delim}'\n", 1)[1] == script + f"{delim}\n"
    finally:
        subprocess.run(["scancel", job], env={**os.environ, **wrapped_cluster.env}, timeout=30, check=False)
    tiny = _sbatch(wrapped_cluster, "#!/bin/sh\n#VJOB os=debian-tiny\nexec vjob run\n", "--hold", "-o", "/dev/null")
    subprocess.run(["scancel", tiny], env={**os.environ, **wrapped_cluster.env}, timeout=30, check=False)
    refused = subprocess.run(
        ["sbatch", "--comment=vjob:os=centos7"],
        input="#!/bin/sh\ntrue\n",
        text=True,
        capture_output=True,
        env={**os.environ, **wrapped_cluster.env},
        timeout=30,
    )
    assert refused.returncode != 0
    assert "unknown OS image 'centos7'; known images: debian-tiny, debian12" in refused.stderr


def _user() -> pwd.struct_passwd:
    return local_users.ensure(USER)


@pytest.mark.realvm
@pytest.mark.slow
def test_plain_sbatch_runs_the_unchanged_script_in_the_guest_across_a_requeue(wrapped_cluster: DevCluster) -> None:
    user = _user()
    site = Path(tempfile.mkdtemp(prefix="vjob-rjslurm-", dir="/var/tmp"))
    site.chmod(0o755)
    work = Path(user.pw_dir) / f"rjtest-{os.getpid()}"
    try:
        bindir = user_pilot.prepare(site)
        user_pilot.write_config(site)
        work.mkdir()
        # No #VJOB line: the partition is the operator's vjob partition (issue 33 item 6)
        head = "#!/bin/bash\n#SBATCH -N1 -c2 --mem=768M\n" + SIZE_LINE
        sync_partition_defaults(SlurmConfig(conf=str(wrapped_cluster.conf), vjob_partitions={"main": "debian12"}))
        time.sleep(2.5)  # job_submit.lua's cache
        (work / "job.sh").write_text(SCRIPT.replace("#!/bin/bash\n", head))
        (work / "input.txt").write_text("vjob-seed\n")
        for p in (work, work / "job.sh", work / "input.txt"):
            os.chown(p, user.pw_uid, user.pw_gid)
        env = {
            **wrapped_cluster.env,
            "HOME": user.pw_dir,
            "PATH": f"{bindir}:/usr/bin:/bin",
            "VJOB_CONFIG": str(site / "vjob.toml"),
        }
        res = subprocess.run(
            [
                "runuser",
                "-u",
                USER,
                "--",
                "env",
                "-i",
                *(f"{k}={v}" for k, v in env.items()),
                "sbatch",
                "--parsable",
                "--requeue",
                "job.sh",
            ],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert res.returncode == 0, res.stderr
        job = res.stdout.strip().split(";")[0]
        out = work / f"slurm-{job}.out"
        t0 = time.monotonic()
        wait_for(lambda: out.exists() and b"progress 1/" in out.read_bytes(), 300, "the script's first progress line")
        first_line_s = time.monotonic() - t0
        scontrol = ["scontrol"]
        cenv = {**os.environ, **wrapped_cluster.env}

        def state() -> tuple[str, str]:
            text = subprocess.run(
                [*scontrol, "show", "job", job], env=cenv, capture_output=True, text=True, timeout=30
            ).stdout
            m = re.search(r"JobState=(\S+)", text)
            e = re.search(r"ExitCode=(\S+)", text)
            return (m.group(1) if m else "", e.group(1) if e else "")

        # Preempted by the agent, pause-first, for the user's interactive job on every node
        # (issue 37 item 2): the job's CPUs are handed over while its memory drains to disk,
        # and its memory (the hash chain it computes) must come back intact.
        listed = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], env=cenv, capture_output=True, text=True, timeout=30)
        agent_work = Path(tempfile.mkdtemp(prefix="vjob-rjagent-", dir="/var/tmp"))
        run = PauseRun(wrapped_cluster, site, bindir, USER, agent_work)
        run.outputs[job] = out
        run.start_agent(pause_first=True)
        try:
            got = run.preempt("pause", job, 512, nodes=len(set(listed.stdout.split())), mem_mib=1024)
            assert got.started_before_saved, got  # the interactive job ran while the save went on
            assert got.paused_to_saved_s is not None and got.save_bytes > 0, got
            # released by the agent once the interactive job ended: restored, run to its end
            wait_for(lambda: state()[0] in ("COMPLETED", "FAILED", "CANCELLED"), 600, f"job {job} to end")
        finally:
            run.stop_agent()
            shutil.rmtree(agent_work, ignore_errors=True)
        assert state() == ("FAILED", "3:0"), out.read_text(errors="replace")[-3000:]
        text = out.read_text()
        assert "restoring VM" in text, text[-3000:]
        assert [line.split()[1] for line in text.splitlines() if line.startswith("progress")] == [
            f"{i}/{STEPS}" for i in range(1, STEPS + 1)
        ], text
        assert f"as {USER} in {work}" in text
        # sized to the allocation (issue 33, item 1): 2 vCPUs, 768 MiB minus the VM's overhead
        size = re.search(r"^size (\d+) (\d+)$", text, re.M)
        assert size, text[-3000:]
        guest_mib, overhead = int(size.group(2)) / 1024, ProvisioningConfig().vm_overhead_mib
        assert int(size.group(1)) == 2 and 768 - overhead - 96 <= guest_mib <= 768 - overhead, size.group(0)
        assert (work / "result.txt").read_text() == expected_chain(b"vjob-seed") + "\n"
        assert (work / "result.txt").stat().st_uid == user.pw_uid
        assert out.stat().st_uid == user.pw_uid
        print(f"submission -> first progress line: {first_line_s:.1f} s")
    finally:
        (wrapped_cluster.etc / DEFAULTS_NAME).unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(site, ignore_errors=True)
