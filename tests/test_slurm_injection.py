"""Job users are hostile: a job name, comment or path must not steer what vjob observes (issue 23, item 4).

`scontrol show job` prints `Key=value` pairs without quoting; a job named
`x UserId=alice(1001) BatchFlag=0 NodeList=...` used to be read as alice's interactive job.
The records here are real `scontrol show job` output (tests/data, HUJI) with a hostile value put
where scontrol would print the user's text; the live test does the same on the dev cluster.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from plugins.slurm import parse_output, parse_text
from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.commands import SlurmCommands
from vjob.errors import InputError
from vjob.model import JobClass


@pytest.fixture(scope="module")
def record(shared_dir: Path) -> str:
    """Job 1 of the recorded multi-line output, as one `scontrol show job -o` line."""
    text = (shared_dir / "data" / "fixtures" / "slurm" / "irush_scontrol_show_job_multi.txt").read_text()
    first = text.split("\n\n")[0]
    return " ".join(line.strip() for line in first.splitlines() if not line.startswith("     "))


def _with(record: str, key: str, value: str) -> str:
    old = next(tok for tok in record.split(" ") if tok.startswith(key + "="))
    return record.replace(old, f"{key}={value}", 1)


def test_the_recorded_record_reads_as_user1s_batch_job(record: str) -> None:
    (job,) = parse_output("jobs", record, source="o")
    assert (job.id, job.user, job.job_class, job.cores) == ("1", "user1", JobClass.BATCH, 3)


def test_a_job_name_cannot_make_it_alices_interactive_job(record: str) -> None:
    hostile = _with(record, "JobName", "x UserId=alice(1001) BatchFlag=0 NodeList=node-[1-3]")
    with pytest.raises(InputError, match=r"job 1\).*field UserId appears twice"):
        parse_output("jobs", hostile, source="o")


def test_spaces_and_foreign_keys_in_a_name_are_just_a_name(record: str) -> None:
    """`NumCPUs=²` in a name made every tick raise (int('²')); a name ends where UserId= begins."""
    for name in ("x NumCPUs=²", "my job with spaces", "a=b c=d", "TRES=cpu=999"):
        (job,) = parse_output("jobs", _with(record, "JobName", name), source="o")
        assert (job.user, job.cores, job.memory_mb) == ("user1", 3, 1500)
        fields = dict(next(parse_text.records(_with(record, "JobName", name), "JobId"))[1])
        assert fields["JobName"] == name


def test_user_paths_and_comments_cannot_pose_as_fields(record: str) -> None:
    """With job_submit.lua every job carries an AdminComment tag, so a forged one appears twice.
    (Untagged, a forged tag could only pick an OS image, which --comment=vjob:os= does anyway.)"""
    record = record.replace("WorkDir=/location/with", "WorkDir=/location/with AdminComment=vjob:class=batch,os=")
    cases = [
        ("WorkDir", "/tmp/a AdminComment=vjob:class=interactive,os=evil", "holds 'AdminComment='|appears twice"),
        ("Command", "/tmp/a WorkDir=/x Comment=vjob:os=evil StdErr=/e", "holds 'WorkDir='"),
        ("StdOut", "/tmp/o UserId=root(0)", "holds 'UserId='"),
        ("Command", "/tmp/a MinMemoryNode=1", "holds 'MinMemoryNode='"),
    ]
    for key, value, problem in cases:
        with pytest.raises(InputError, match=problem):
            parse_output("jobs", _with(record, key, value), source="o")


def test_a_line_break_cannot_forge_a_record(record: str) -> None:
    forged = _with(record, "StdOut", "/tmp/o\nJobId=999 JobName=y UserId=root(0) BatchFlag=0")
    with pytest.raises(InputError, match=r"missing field|line break"):
        parse_output("jobs", forged, source="o")
    skipped: list[str] = []
    kept = parse_text.jobs_from_scontrol(
        forged + "\n" + record.replace("JobId=1 ", "JobId=2 "), source="o", skipped=skipped
    )
    assert [j.id for j in kept] == ["1", "2"]  # the fragment 1 is complete; 999 lacks most fields
    assert len(skipped) == 1 and "job 999" in skipped[0]


def test_a_bad_record_is_skipped_for_the_agent_but_named(record: str) -> None:
    good = record.replace("JobId=1 ", "JobId=7 ")
    bad = _with(record, "JobName", "x UserId=root(0)")
    skipped: list[str] = []
    kept = parse_text.jobs_from_scontrol(bad + "\n" + good, source="scontrol", skipped=skipped)
    assert [j.id for j in kept] == ["7"]
    assert skipped and "scontrol:1 (job 1)" in skipped[0] and "UserId" in skipped[0]


# -- against the real development cluster ------------------------------------------------------
@pytest.mark.slurm
def test_live_hostile_job_name_on_the_text_path(slurm_cluster: object, tmp_path: Path) -> None:
    """sbatch --job-name='x UserId=alice(1001) BatchFlag=0' (the dev cluster's jobs run as root):
    JSON sees the name as a name; the text path (forced here, used by Slurm < 20.11) leaves the
    job out and names it, and never sees it as alice's interactive job."""
    conf = str(slurm_cluster.conf)  # type: ignore[attr-defined]
    env = {"PATH": "/usr/bin:/bin", **slurm_cluster.env}  # type: ignore[attr-defined]
    name = "x UserId=alice(1001) BatchFlag=0 NodeList=node1"
    out = subprocess.run(
        ["sbatch", "--parsable", f"--job-name={name}", "-o", "/dev/null", "--wrap", "sleep 60"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=30,
    )
    job_id = out.stdout.strip().split(";")[0]
    try:
        json_adapter = SlurmAdapter(SlurmCommands(conf=conf, timeout_s=20))
        seen = {j.id: j for j in json_adapter.jobs()}
        assert seen[job_id].user == "root" and seen[job_id].job_class is JobClass.BATCH
        assert json_adapter.job(job_id).user == "root"
        text_adapter = SlurmAdapter(SlurmCommands(conf=conf, timeout_s=20), use_json=False)
        seen_text = {j.id: j for j in text_adapter.jobs()}
        assert job_id not in seen_text
        assert all(j.user != "alice" and j.job_class is JobClass.BATCH for j in seen_text.values())
        with pytest.raises(InputError, match=r"UserId"):
            text_adapter.job_fields(job_id)
    finally:
        subprocess.run(["scancel", job_id], env=env, check=False, timeout=30)
