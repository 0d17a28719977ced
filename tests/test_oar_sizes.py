"""An OAR job's VM memory from the site's memory property (issue 33, item 1): the `memcore`
of each of the job's resources, read from `$OAR_RESOURCE_PROPERTIES_FILE` (plugins/oar/allocation.py).
Unit tests on the lines recorded on the test OAR 2.5.9, and one real OAR job reading its own.
"""

from __future__ import annotations

import json
import pwd
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from plugins import job_allocations
from plugins.oar.allocation import memory_per_host, resource_properties
from plugins.oar.client import OarCommands, SubmitRequest
from saline_bew import size_rule
from vjob.allocation import Allocation
from vjob.errors import InputError

REPO = Path(__file__).resolve().parents[1]
# `oarsub -l /host=2/core=1` with `memcore` (and `memnode`) set on every resource: the job's
# $OAR_RESOURCE_PROPERTIES_FILE, as the test OAR wrote it.
RECORDED = (
    " memnode = '2048' , memcore = '1024' , site = 'b' , cpuset = '0' , deploy = 'NO' , network_address = "
    "'127.0.0.1' , desktop_computing = 'NO' , last_available_upto = '0' , available_upto = '2147483647' , "
    "type = 'default' , host = '127.0.0.1' , core = '3' , besteffort = 'YES' , cpu = '3' , drain = 'NO' \n"
    " type = 'default' , available_upto = '2147483647' , core = '1' , besteffort = 'YES' , host = 'localhost' , "
    "cpu = '1' , drain = 'NO' , memnode = '2048' , site = 'a' , memcore = '1024' , cpuset = '0' , deploy = 'NO' , "
    "desktop_computing = 'NO' , network_address = 'localhost' , last_available_upto = '0' \n"
)


def _files(tmp_path: Path, nodes: str, properties: str) -> dict[str, str]:
    (tmp_path / "nodes").write_text(nodes)
    (tmp_path / "props").write_text(properties)
    return {"OAR_NODEFILE": str(tmp_path / "nodes"), "OAR_RESOURCE_PROPERTIES_FILE": str(tmp_path / "props")}


def test_the_recorded_properties_give_each_host_its_cores_memory(tmp_path: Path) -> None:
    assert [p["host"] for p in resource_properties(RECORDED)] == ["127.0.0.1", "localhost"]
    env = _files(tmp_path, "127.0.0.1\nlocalhost\n", RECORDED)
    assert job_allocations("oar", env, "localhost") == {
        "127.0.0.1": Allocation(1, 1024),
        "localhost": Allocation(1, 1024),
    }


def test_cores_on_one_host_add_up_and_a_host_without_the_property_has_no_figure(tmp_path: Path) -> None:
    lines = "".join(
        f" host = 'gros-{h}.nancy.grid5000.fr' , network_address = 'gros-{h}.nancy.grid5000.fr' , core = '{c}'"
        + (" , memcore = '3000' \n" if h == 1 else " \n")
        for h, c in ((1, 1), (1, 2), (2, 3))
    )
    env = _files(tmp_path, "gros-1.nancy.grid5000.fr\n" * 2 + "gros-2.nancy.grid5000.fr\n", lines)
    assert memory_per_host(env) == {"gros-1": 6000}
    assert job_allocations("oar", env, "gros-1") == {"gros-1": Allocation(2, 6000), "gros-2": Allocation(1, None)}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("host = 'a' , memcore = '-1'\n", "memcore = '-1'"),
        ("host = 'a' , memcore = '1e9'\n", "memcore = '1e9'"),
        ("host = 'a' ; rm -rf /\n", "line 1: not OAR's"),
        ("host = 'a' , memcore = '67108864'\nhost = 'a' , memcore = '67108864'\n", "past any node"),
    ],
)
def test_hostile_properties_are_refused_naming_the_file(tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(InputError, match="OAR_RESOURCE_PROPERTIES_FILE") as exc:
        memory_per_host(_files(tmp_path, "a\n", text))
    assert said in str(exc.value)


READ = (
    "import json, os, sys; from plugins import job_allocations; "
    "a = job_allocations('oar', os.environ, 'localhost'); "
    "json.dump({n: [x.cpus, x.memory_mib] for n, x in a.items()}, sys.stdout)"
)


@pytest.mark.oar
def test_a_real_oar_job_reads_its_memory_from_the_memcore_property(oar_cluster) -> None:
    user = oar_cluster.user
    home = Path(pwd.getpwnam(user).pw_dir)
    work = Path(tempfile.mkdtemp(prefix="vjob-oar-sizes-"))
    subprocess.run(["oarproperty", "-a", "memcore"], check=True, capture_output=True, timeout=60)
    try:
        subprocess.run(
            ["oarnodesetting", "--sql", "true", "-p", "memcore=1536"], check=True, capture_output=True, timeout=60
        )
        work.chmod(0o755)
        (work / "read.py").write_text(READ)
        path = f"PYTHONPATH={REPO}:{sysconfig.get_paths()['purelib']}"
        cli = OarCommands(timeout_s=30)
        name = f"vjobsizes{uuid.uuid4().hex[:8]}"
        request = SubmitRequest(
            command=["env", path, "/usr/bin/python3", str(work / "read.py")],
            name=name,
            resource="/host=2/core=1",
            walltime="0:05:00",
            directory=str(home),
        )
        job = cli.submit(request, user=user)
        started, state = time.monotonic(), ""
        while time.monotonic() - started < 120:
            found = cli.job(job, user=user)
            state = found.state if found is not None else "gone"
            if state in ("Terminated", "Error", "gone"):
                break
            time.sleep(0.5)
        out, err = home / f"OAR.{name}.{job}.stdout", home / f"OAR.{name}.{job}.stderr"
        detail = f"state {state}; stderr {err.read_text()[-1500:] if err.exists() else ''!r}"
        assert state == "Terminated", detail
        assert json.loads(out.read_text().strip().splitlines()[-1]) == {"localhost": [1, 1536], "127.0.0.1": [1, 1536]}
        for f in (out, err):
            f.unlink(missing_ok=True)
    finally:
        subprocess.run(["oarproperty", "-d", "memcore"], check=False, capture_output=True, timeout=60)
        shutil.rmtree(work, ignore_errors=True)


def _oarsub(user: str, home: Path, resource: str, command: str) -> subprocess.CompletedProcess[str]:
    """`oarsub` as the test user (an accepted job is deleted at once: it only has to be queued)."""
    done = subprocess.run(
        ["runuser", "-u", user, "--", "oarsub", "-l", f"{resource},walltime=0:05:00", command],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=home,
        check=False,
    )
    for job in re.findall(r"OAR_JOB_ID=([0-9]+)", done.stdout):
        subprocess.run(["runuser", "-u", user, "--", "oardel", job], capture_output=True, timeout=60, check=False)
    return done


@pytest.mark.oar
def test_the_size_rule_refuses_a_pilot_job_whose_hosts_cannot_hold_its_vm(oar_cluster) -> None:
    """memcore = 300 MiB: one core leaves 44 MiB after the 256 MiB overhead (refused, with the
    numbers); two cores per host leave 344 (accepted); a job that is not a pilot is not checked."""
    user = oar_cluster.user
    home = Path(pwd.getpwnam(user).pw_dir)
    subprocess.run(["oarproperty", "-a", "memcore"], check=True, capture_output=True, timeout=60)
    put = subprocess.run(
        [sys.executable, "-m", "vjob.cli", "oar", "install-size-rule"], capture_output=True, text=True, timeout=120
    )  # the operator's command, on the embedded default overhead (256 MiB)
    m = re.match(r"vjob size rule #(\d+) installed, overhead 256 MiB per VM", put.stdout)
    assert put.returncode == 0 and m, put.stdout + put.stderr
    rule_id = int(m.group(1))
    try:
        subprocess.run(
            ["oarnodesetting", "--sql", "true", "-p", "memcore=300"], check=True, capture_output=True, timeout=60
        )
        pilot = "vjob run --rms oar --os debian12 --script job.sh"
        small = _oarsub(user, home, "/host=1/core=1", pilot)
        assert small.returncode != 0, small.stdout
        said = small.stdout + small.stderr
        assert (
            "vjob: 1 core (the fewest a host of this job may get) x memcore 300 MiB = 300 MiB leaves 44 MiB for the VM"
            " after its overhead of 256 MiB, below the guest's minimum of 256 MiB: ask for at least 2 cores per host"
        ) in said, said
        spread = _oarsub(user, home, "/core=2", "/usr/local/bin/vjob --config /etc/vjob/vjob.toml run --script j")
        assert "1 core (the fewest a host" in spread.stdout + spread.stderr  # two cores may land on two hosts
        for resource, command in (("/host=1/core=2", pilot), ("/host=1/core=1", "sleep 60")):
            done = _oarsub(user, home, resource, command)
            assert done.returncode == 0 and "OAR_JOB_ID=" in done.stdout, (resource, done.stdout, done.stderr)
        tiny = _oarsub(user, home, "/host=1/core=1", "vjob run --rms oar --os debian-tiny")
        assert tiny.returncode == 0, tiny.stderr  # the counter guest is not sized
    finally:
        size_rule.uninstall()
        subprocess.run(["oarproperty", "-d", "memcore"], check=False, capture_output=True, timeout=60)
    assert rule_id > 0 and size_rule.installed() == []


def test_the_size_rule_renders_checked_figures_into_valid_perl(tmp_path: Path) -> None:
    rule = size_rule.render(overhead_mib=192, guest_min_mib=256)
    assert rule.startswith(size_rule.MARK) and "@" not in rule.replace("@{", "")
    assert "$mem - 192 < 256" in rule
    for bad in (-1, 1 << 30, "256; system('id')"):
        with pytest.raises(InputError, match="overhead_mib"):
            size_rule.render(overhead_mib=bad)  # type: ignore[arg-type]
    wrapped = tmp_path / "rule.pl"
    wrapped.write_text("use strict; use warnings; my ($command, $ref_resource_list, $dbh);\n" + rule)
    checked = subprocess.run(["perl", "-c", str(wrapped)], capture_output=True, text=True, timeout=60, check=False)
    assert checked.returncode == 0, checked.stderr
