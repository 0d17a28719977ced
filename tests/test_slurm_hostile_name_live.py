"""Hostile job names through the live `squeue --json` (issue 39, "Tests that would have caught these").

Until now this was checked by hand, in-process: here real `sbatch` submits jobs whose names hold
line breaks, quotes, a JSON fragment forging a record for alice, ANSI and every other control
character, shell metacharacters, a reversed-text mark and names imitating another job (its id,
its VM's name, `scontrol`'s `Key=value` fields), at the longest Slurm accepts; then the real
adapter (plugins/slurm, JSON observation) and the agent's own observe (with its store) look at
the cluster. Nothing crashes, no record is forged, every name comes back byte for byte as data,
and the honest neighbour job is seen exactly as submitted. The jobs are held (`--hold`): they
never take a node from anyone else's test.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.loop import Agent
from agent.metrics import AgentMetrics
from plugins.slurm import parse_json
from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.commands import SlurmCommands
from vjob.config import parse
from vjob.model import JobClass
from vjob.store import jobs as store_jobs
from vjob.store.db import Store

pytestmark = pytest.mark.slurm

SLURM_NAME_MAX = 1024
"""The longest job name slurmctld takes, in UTF-8 bytes (a longer one is refused at submission)."""


def _hostile(neighbour: str) -> dict[str, str]:
    controls = "".join(chr(i) for i in range(1, 32)) + "\x7f"
    names = {
        "line breaks": "first\nsecond\r\nthird",
        "quotes": "q'\"`\\",
        "json record": f'"}}],"jobs":[{{"job_id":{neighbour},"user_name":"alice","name":"x',
        "ansi": "\x1b[2J\x1b[31mred\x1b]0;title\x07\x1b[0m",
        "controls": controls,
        "shell": "$(touch /tmp/vjob-pwned);`id`|&;<>*?~!{a,b}",
        "unicode": "é\u202eevil\ufeff\u2028x",
        "another job's id": neighbour,
        "another job's vm": f"vjob-slurm-{neighbour}",
        "scontrol fields": f"x JobId={neighbour} UserId=alice(1001) BatchFlag=0 AdminComment=vjob:class=interactive",
    }
    mixed = "".join(names.values())
    longest = mixed * (SLURM_NAME_MAX // len(mixed) + 1)
    while len(longest.encode()) > SLURM_NAME_MAX:  # Slurm counts bytes
        longest = longest[:-1]
    names["longest"] = longest
    return names


def _sbatch(env: dict[str, str], name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sbatch", "--parsable", "--hold", f"--job-name={name}", "-o", "/dev/null", "--wrap", "sleep 60"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=30,
    )


@pytest.fixture(scope="module")
def submitted(slurm_cluster: Any) -> Iterator[tuple[dict[str, str], str, dict[str, str]]]:
    """({job id: name} of the hostile jobs, the neighbour's id, the env), cancelled at the end."""
    env = {"PATH": "/usr/bin:/bin", **slurm_cluster.env}
    ids: list[str] = []
    try:
        r = _sbatch(env, "honest-neighbour")
        assert r.returncode == 0, r.stderr
        neighbour = r.stdout.strip().split(";")[0]
        ids.append(neighbour)
        jobs: dict[str, str] = {}
        for what, name in _hostile(neighbour).items():
            r = _sbatch(env, name)
            assert r.returncode == 0, f"{what}: {r.stderr}"
            job_id = r.stdout.strip().split(";")[0]
            jobs[job_id] = name
            ids.append(job_id)
        yield jobs, neighbour, env
    finally:
        if ids:
            subprocess.run(["scancel", *ids], env=env, check=False, timeout=30)


def test_a_10_kib_name_never_reaches_the_queue(slurm_cluster: Any) -> None:
    """Slurm bounds a name itself: 10 KiB is refused at submission, so what the adapter can meet
    is at most SLURM_NAME_MAX (the `longest` name above)."""
    env = {"PATH": "/usr/bin:/bin", **slurm_cluster.env}
    r = _sbatch(env, _hostile("1")["longest"] * 10)
    if r.returncode == 0:  # a Slurm that takes it: then it must not stay to disturb anyone
        subprocess.run(["scancel", r.stdout.strip().split(";")[0]], env=env, check=False, timeout=30)
    assert r.returncode != 0 and "too long" in r.stderr


def test_live_squeue_json_carries_each_name_as_data(submitted: tuple[dict[str, str], str, dict[str, str]]) -> None:
    jobs, neighbour, env = submitted
    out = subprocess.run(["squeue", "--json"], capture_output=True, text=True, env=env, check=True, timeout=30)
    listed: dict[str, list[dict[str, Any]]] = {}
    for item in json.loads(out.stdout)["jobs"]:
        listed.setdefault(str(item["job_id"]), []).append(item)
    for job_id, name in jobs.items():
        (item,) = listed[job_id]
        assert item["name"] == name
    (item,) = listed[neighbour]  # the forged record for the neighbour's id did not appear
    assert (item["name"], item["user_name"]) == ("honest-neighbour", "root")
    assert all(item["user_name"] != "alice" for items in listed.values() for item in items)


def test_the_adapter_sees_every_hostile_job_as_roots_batch_job(
    slurm_cluster: Any, submitted: tuple[dict[str, str], str, dict[str, str]]
) -> None:
    jobs, neighbour, _env = submitted
    adapter = SlurmAdapter(SlurmCommands(conf=str(slurm_cluster.conf), timeout_s=20))
    seen = {j.id: j for j in adapter.jobs()}
    for job_id in [*jobs, neighbour]:
        job = seen[job_id]
        assert (job.user, job.job_class, job.os_image) == ("root", JobClass.BATCH, ""), job_id
        assert adapter.job(job_id).user == "root"
    assert all(j.user != "alice" and j.job_class is JobClass.BATCH for j in seen.values() if j.id in jobs)


def test_the_agents_observe_tracks_them_without_a_crash(
    slurm_cluster: Any, submitted: tuple[dict[str, str], str, dict[str, str]], tmp_path: Path
) -> None:
    """The agent's observe (RMS, pilot directories, store) as a tick does it: every job is seen
    and recorded in the store as root's, the store undisturbed by the names."""
    jobs, neighbour, _env = submitted
    cfg = parse({"data_dir": str(tmp_path / "data"), "agent": {"pilot_dir": str(tmp_path / "pilots")}})
    adapter = SlurmAdapter(SlurmCommands(conf=str(slurm_cluster.conf), timeout_s=20))
    agent = Agent(cfg, adapter, rms="slurm", metrics=AgentMetrics(), owner="test")
    store = Store(f"sqlite:///{tmp_path / 'vjob.sqlite'}")
    store.upgrade()
    agent.ports.store.opened = store
    try:
        obs = agent.observe()
        assert obs.store_ok
        seen = {j.id: j for j in obs.view.jobs}
        for job_id in [*jobs, neighbour]:
            assert seen[job_id].user == "root" and seen[job_id].job_class is JobClass.BATCH
            record = store_jobs.get(store, "slurm", job_id)
            assert record is not None and record.user == "root"
        assert agent.observe().store_ok  # a second tick's look: the records read back
    finally:
        store.close()


def test_the_streamed_reads_by_layout_see_them_as_the_whole_decode_does(
    slurm_cluster: Any, submitted: tuple[dict[str, str], str, dict[str, str]]
) -> None:
    """Issue 37: the adapter's reads by change cut each job's members out of the live output by
    Slurm's layout (plugins.slurm.json_stream, json_fields); over these names they must give what
    decoding the whole output gives, learnt from the live layout (not its job-by-job fallback),
    and the nodes likewise."""
    jobs, neighbour, _env = submitted
    mine = [*jobs, neighbour]
    whole = SlurmAdapter(SlurmCommands(conf=str(slurm_cluster.conf), timeout_s=20))
    streamed = SlurmAdapter(SlurmCommands(conf=str(slurm_cluster.conf), timeout_s=20), resync_every=5)
    expected = {j.id: j for j in whole.jobs() if j.id in mine}
    first = {j.id: j for j in streamed.jobs() if j.id in mine}
    assert first == expected and streamed.incremental.last.full
    assert streamed.reuse.misses >= len(mine)  # read by the layout: the fallback keeps no Jobs
    again = {j.id: j for j in streamed.jobs() if j.id in mine}
    assert not streamed.incremental.last.full and all(again[k] is first[k] for k in mine)
    fetched = streamed._fetch_jobs(set(mine))  # 22.05: squeue into a memfd, searched from its end
    assert {j.id: j for j in fetched} == expected and all(j is first[j.id] for j in fetched)
    flag = whole._json_flag()
    command = ("scontrol", [flag, "show", "node"]) if whole.data_parser() else ("sinfo", [flag])
    nodes_whole = parse_json.nodes(json.loads(whole.cmd.run(*command)), source=command[0])
    assert streamed.nodes() == nodes_whole
