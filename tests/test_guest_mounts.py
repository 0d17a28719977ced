"""The site's filesystems in every guest (issue 33, item 2): the per-job NFS gateway's
configuration and life (provisioning.node_service.nfs_ops, real nfs-ganesha), job.json's
`mounts` as the guest reads it (provisioning.guest_agent.mounts), the working directory used
in place (provisioning.job_disk), and one real guest that mounts /home and /scratch from the
gateway, tries other uids as its root, and is checkpointed and resumed with its gateway down.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pilot import site_mounts
from provisioning import job_disk, network
from provisioning.guest_agent import mounts
from provisioning.guest_config import GuestMount
from provisioning.node_service import nfs_ops, protocol, site
from provisioning.node_service.grant import Grant
from provisioning.node_service.net_rules import NFS_PORT
from tests.services.nfs import job_bridge, nfs_state  # noqa: F401 - a fixture
from vjob.config import load
from vjob.errors import InputError

pytestmark = pytest.mark.host_network
"""Real bridges, taps and firewall rules in this host's namespace, and sweeps that remove what they
do not claim: one module of this marker at a time (tests/conftest.py), even under pytest-xdist."""
USER = "vjobtest"


def _mounts(*pairs: tuple[str, str]) -> list[GuestMount]:
    return [GuestMount(source=s, target=t) for s, t in pairs]


# -- the gateway's configuration ------------------------------------------------------------
def test_the_export_squashes_every_uid_to_the_jobs_and_serves_only_the_jobs_network(tmp_path: Path) -> None:
    sub = network.pilot_subnet_id("slurm", "4242")
    conf = nfs_ops.export_config(
        uid=1004, gid=1005, subnet_id=sub, mounts=_mounts(("/home", "/home"), ("/scratch", "")), state=tmp_path
    )
    gw = network.gateway_address(sub)
    assert f"Bind_addr = {gw};" in conf and f"NFS_Port = {NFS_PORT};" in conf
    assert conf.count("Squash = All_Squash; Anonymous_Uid = 1004; Anonymous_Gid = 1005;") == 2
    assert conf.count("Access_Type = None;") == 2  # nobody but the CLIENT block's network
    net = ".".join(str(gw).split(".")[:3]) + ".0/24"
    assert conf.count(f"CLIENT {{ Clients = {net}; Access_Type = RW; Protocols = 4; }}") == 2
    assert 'Path = "/home"; Pseudo = "/vjob/0";' in conf and 'Path = "/scratch"; Pseudo = "/vjob/1";' in conf
    assert "Protocols = 4;" in conf and "Enable_NLM = false" in conf
    assert f'RecoveryRoot = "{tmp_path / "recovery"}"' in conf


def test_nothing_the_user_controls_reaches_the_configuration(tmp_path: Path) -> None:
    """The job id and user name are not written at all; ids must be integers; a source that
    bypassed the config model's check (model_construct) is checked again."""
    hostile_job = '1"; } EXPORT { Path = "/"; Squash = None; #'
    sub = network.pilot_subnet_id("slurm", hostile_job)
    conf = nfs_ops.export_config(uid=1004, gid=1004, subnet_id=sub, mounts=_mounts(("/home", "")), state=tmp_path)
    assert hostile_job not in conf and "Squash = None" not in conf and "EXPORT {" in conf
    assert conf.count("EXPORT {") == 1
    for bad in (True, -1, 2**31, "1004"):
        with pytest.raises(InputError, match="uid"):
            nfs_ops.export_config(uid=bad, gid=1, subnet_id=sub, mounts=[], state=tmp_path)  # type: ignore[arg-type]
    sneaky = GuestMount.model_construct(source='/home"; } EXPORT { Path = "/', target="", options=[])
    with pytest.raises(ValueError, match="absolute path of plain names"):
        nfs_ops.export_config(uid=1, gid=1, subnet_id=sub, mounts=[sneaky], state=tmp_path)
    for bad_source in ('/home"x', "/home/../etc", "home", "/ho me", "/home\n"):
        with pytest.raises(ValueError):
            GuestMount(source=bad_source)


def test_the_answer_is_what_the_guest_accepts() -> None:
    sub = network.pilot_subnet_id("slurm", "77")
    ans = nfs_ops.answer(sub, [GuestMount(source="/export/home", target="/home", options=["noatime"])])
    assert ans["server"] == str(network.gateway_address(sub)) and ans["port"] == NFS_PORT
    assert ans["exports"][0] == {
        "export": "/vjob/0",
        "source": "/export/home",
        "target": "/home",
        "options": ["noatime"],
    }
    guest = {**ans, "exports": [{k: v for k, v in e.items() if k != "source"} for e in ans["exports"]]}
    parsed = mounts.parse_mounts(guest)
    assert parsed is not None and parsed.exports[0].target == "/home"
    assert mounts.mount_command(parsed, parsed.exports[0])[-2:] == [f"{ans['server']}:/vjob/0", "/home"]


# -- job.json's `mounts` in the guest ---------------------------------------------------------
GOOD: dict[str, Any] = {
    "server": "10.1.2.254",
    "port": 2049,
    "exports": [{"export": "/vjob/0", "target": "/home", "options": ["noatime"]}],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"server": "10.1.2"}, "mounts.server"),
        ({"server": 7}, "mounts.server"),
        ({"port": 0}, "mounts.port"),
        ({"port": True}, "mounts.port"),
        ({"wait_s": 10**9}, "mounts.wait_s"),
        ({"exports": []}, "mounts.exports"),
        ({"exports": [{"export": "/vjob/0", "target": "/home"}] * 17}, "mounts.exports"),
        ({"exports": [{"export": "/vjob/../x", "target": "/home"}]}, "mounts.exports.export"),
        ({"exports": [{"export": "/vjob/0,addr=1.2.3.4", "target": "/home"}]}, "mounts.exports.export"),
        ({"exports": [{"export": "/vjob/0", "target": "/etc"}]}, "system directory"),
        ({"exports": [{"export": "/vjob/0", "target": "/usr/local"}]}, "system directory"),
        ({"exports": [{"export": "/vjob/0", "target": "/"}]}, "mounts.exports.target"),
        ({"exports": [{"export": "/vjob/0", "target": "home"}]}, "mounts.exports.target"),
        ({"exports": [{"export": "/vjob/0", "target": "/home/../etc"}]}, "mounts.exports.target"),
        ({"exports": [{"export": "/vjob/0", "target": "/ho me"}]}, "mounts.exports.target"),
        ({"exports": [{"export": "/vjob/0", "target": "/home", "options": ["ro,addr=1.2.3.4"]}]}, "options"),
        ({"exports": [{"export": "/vjob/0", "target": "/home", "options": ["port=111"]}]}, "set by the agent"),
        ({"exports": [{"export": "/vjob/0", "target": "/home", "options": ["sec=none"]}]}, "set by the agent"),
        ({"exports": [{"export": "/vjob/0", "target": "/home", "options": ["x"] * 17}]}, "options"),
        ({"exports": [{"export": "/vjob/0", "target": "/home", "extra": 1}]}, "mounts.exports"),
        (
            {"exports": [{"export": "/vjob/0", "target": "/home"}, {"export": "/vjob/1", "target": "/home"}]},
            "twice",
        ),
    ],
)
def test_a_bad_mount_entry_is_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(mounts.MountError, match=message):
        mounts.parse_mounts({**GOOD, **change})


def test_no_mounts_means_none_and_covers_only_paths_under_a_target() -> None:
    assert mounts.parse_mounts(None) is None
    with pytest.raises(mounts.MountError, match="must be an object"):
        mounts.parse_mounts([GOOD])
    site_mounts = mounts.parse_mounts(GOOD)
    assert mounts.covers(site_mounts, "/home") and mounts.covers(site_mounts, "/home/u/work")
    assert not mounts.covers(site_mounts, "/homework") and not mounts.covers(None, "/home/u")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=24),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=24,
)
_EXPORT = st.fixed_dictionaries(
    {
        "export": st.one_of(st.just("/vjob/0"), _JSON),
        "target": st.one_of(st.just("/home"), st.text(max_size=40), _JSON),
    },
    optional={"options": st.one_of(st.lists(st.text(max_size=20), max_size=4), _JSON)},
)


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "server": st.one_of(st.just("10.1.2.254"), _JSON),
            "port": st.one_of(st.just(2049), _JSON),
            "wait_s": _JSON,
            "exports": st.one_of(st.lists(_EXPORT, max_size=3), _JSON),
        },
    )
)
def test_any_mounts_object_is_accepted_whole_or_refused_with_a_mount_error(data: dict[str, Any]) -> None:
    try:
        parsed = mounts.parse_mounts(data)
    except mounts.MountError:
        return
    assert parsed is not None
    for export in parsed.exports:  # what is accepted reaches the mount table as plain names only
        assert mounts.PATH_RE.fullmatch(export.target) and mounts.EXPORT_RE.fullmatch(export.export)
        assert all("," not in o and mounts.OPTION_RE.fullmatch(o) for o in export.options)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_agent_retries_an_unreachable_server_then_stops_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site_mounts = mounts.parse_mounts(
        {**GOOD, "wait_s": 10, "exports": [{"export": "/vjob/0", "target": str(tmp_path / "h")}]}
    )
    assert site_mounts is not None
    clock, calls = _Clock(), []

    def refused(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 32, "", "mount.nfs4: Connection refused")

    told = tmp_path / "stderr"
    told.write_text("")
    monkeypatch.setattr(mounts, "JOB_STDERR", str(told))
    with pytest.raises(mounts.MountError) as err:
        mounts.mount_all(site_mounts, run=refused, clock=clock, sleep=clock.sleep, say=lambda _m: None)
    assert told.read_text() == f"vjob: the job was not started: {err.value}\n"
    text = str(err.value)
    assert "10.1.2.254:/vjob/0 (port 2049)" in text and "after 10 s" in text and "Connection refused" in text
    assert calls[0] == ["modprobe", "nfsv4"] and len(calls) == 1 + 6  # tries at 0, 2, 4, 6, 8, 10 s
    assert "vers=4.2" in calls[1][4] and "hard" in calls[1][4] and "port=2049" in calls[1][4]

    answers = iter([32, 32, 0])
    clock.now = 0.0

    def later(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        code = 0 if cmd[0] == "modprobe" else next(answers)
        return subprocess.CompletedProcess(cmd, code, "", "")

    said: list[str] = []
    mounts.mount_all(site_mounts, run=later, clock=clock, sleep=clock.sleep, say=said.append)
    assert said[-1].endswith("(try 3)") and (tmp_path / "h").is_dir()


# -- the working directory in place ------------------------------------------------------------
def test_a_working_directory_on_a_mount_is_not_staged(tmp_path: Path) -> None:
    work = tmp_path / "home" / "u" / "work"
    work.mkdir(parents=True)
    (work / "big.bin").write_bytes(b"x" * (2 << 20))
    base = {"script": b"#!/bin/sh\n", "args": [], "env": {}, "uid": os.getuid(), "gid": os.getgid(), "user": "u"}
    base |= {"home": "/home/u", "cwd": "/home/u/work"}
    on_mount = job_disk.JobDescription(**base, mounts={**GOOD, "exports": [{"export": "/vjob/0", "target": "/home"}]})
    assert on_mount.in_place and not job_disk.JobDescription(**base).in_place
    # 2 MiB in the directory and a 1 MiB staging limit: refused when staged, fine in place
    job_disk.build(work, on_mount, tmp_path / "job.qcow2", limit_bytes=1 << 20, free_bytes=1 << 20)
    assert (tmp_path / "job.qcow2").exists()
    with pytest.raises(InputError, match="more than 1 MiB to stage"):
        job_disk.build(work, job_disk.JobDescription(**base), tmp_path / "j2.qcow2", limit_bytes=1 << 20, free_bytes=0)
    with pytest.raises(InputError, match=r"mounts\.exports\.target"):
        job_disk.check_description(
            job_disk.JobDescription(**base, mounts={**GOOD, "exports": [{"export": "/vjob/0", "target": "/etc"}]})
        )


# -- real gateways (nfs-ganesha) ----------------------------------------------------------------
def _grant(job: str, uid: int, gid: int, node: str = "n1", nodes: tuple[str, ...] = ("n1", "n2")) -> Grant:
    return Grant(
        rms="slurm", job=job, uid=uid, gid=gid, user='hostile"}user', node=node, nodes=nodes, cpus=1, memory_mib=512
    )


@pytest.fixture(autouse=True)
def _own_site(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test installs its own site configuration; the service's is put back afterwards."""
    monkeypatch.setattr(site, "_current", None)


def _install_site(tmp_path: Path, sources: list[Path]) -> None:
    lines = [
        "[guest]",
        "mounts = [" + ", ".join(f'{{source = "{s}", target = "/m{i}"}}' for i, s in enumerate(sources)) + "]",
    ]
    (tmp_path / "vjob.toml").write_text("\n".join(lines) + "\n")
    site.install(load(tmp_path / "vjob.toml"))


def _call(op: str, grant: Grant, **fields: Any) -> dict[str, Any]:
    request = protocol.check({"op": op, "job": grant.job, "node": grant.node, **fields}, nfs_ops.OPERATIONS)
    return nfs_ops.OPERATIONS[op].run(grant, request.fields)


@pytest.mark.slow
@pytest.mark.usefixtures("nfs_state")
def test_gateways_of_two_jobs_run_at_once_and_live_as_long_as_a_node_of_their_job_asks(tmp_path: Path) -> None:
    src = tmp_path / "home"
    src.mkdir()
    _install_site(tmp_path, [src])
    with job_bridge("slurm", "880001") as sub1, job_bridge("slurm", "880002") as sub2:
        a1 = _call("nfs.up", _grant("880001", 1004, 1004))
        pid1 = nfs_ops.read_record(nfs_ops.job_dir(sub1)).pid  # type: ignore[union-attr]
        assert a1["server"] == str(network.gateway_address(sub1))
        again = _call("nfs.up", _grant("880001", 1004, 1004, node="n2"))  # a second node of the job, same host
        assert again == a1 and nfs_ops.read_record(nfs_ops.job_dir(sub1)).pid == pid1  # type: ignore[union-attr]
        _call("nfs.up", _grant("880002", 1005, 1005))
        pid2 = nfs_ops.read_record(nfs_ops.job_dir(sub2)).pid  # type: ignore[union-attr]
        assert pid2 != pid1 and nfs_ops.running(pid1, nfs_ops.job_dir(sub1))
        for sub in (sub1, sub2):
            socket.create_connection((str(network.gateway_address(sub)), NFS_PORT), timeout=2).close()
        conf = (nfs_ops.job_dir(sub1) / "ganesha.conf").read_text()
        assert "880001" not in conf and "hostile" not in conf and (nfs_ops.job_dir(sub1)).stat().st_mode & 0o077 == 0
        # another user's job on the same subnetID cannot take the gateway
        with pytest.raises(InputError, match="held on this node by slurm job 880001"):
            _call("nfs.up", Grant("slurm", str(880001 + 65535), 1006, 1006, "x", "n1", ("n1",), 1, 0))
        assert _call("nfs.down", _grant("880001", 1004, 1004)) == {"stopped": False}  # n2 still holds it
        assert nfs_ops.running(pid1, nfs_ops.job_dir(sub1))
        assert _call("nfs.down", _grant("880001", 1004, 1004, node="n2")) == {"stopped": True}
        assert not nfs_ops.running(pid1, nfs_ops.job_dir(sub1)) and not nfs_ops.job_dir(sub1).exists()

        class Gone:
            def grant(self, job: str, node: str) -> Grant | None:
                return None

        class Running:
            def grant(self, job: str, node: str) -> Grant | None:
                return _grant(job, 1005, 1005, node)

        os.kill(pid2, 9)  # the gateway died while its job runs: the sweep starts it again
        time.sleep(0.5)
        assert nfs_ops.sweep(Running()) == [f"restarted {nfs_ops.job_dir(sub2).name}"]
        pid2b = nfs_ops.read_record(nfs_ops.job_dir(sub2)).pid  # type: ignore[union-attr]
        assert pid2b != pid2 and nfs_ops.running(pid2b, nfs_ops.job_dir(sub2))
        assert nfs_ops.sweep(Running()) == []  # adopted as it is
        assert nfs_ops.sweep(Gone()) == [f"stopped {nfs_ops.job_dir(sub2).name}"]
        assert not nfs_ops.running(pid2b, nfs_ops.job_dir(sub2))


@pytest.mark.slow
@pytest.mark.usefixtures("nfs_state")
def test_a_gateway_without_its_job_network_fails_with_its_log(tmp_path: Path) -> None:
    src = tmp_path / "home"
    src.mkdir()
    _install_site(tmp_path, [src])
    with pytest.raises(Exception, match=r"is not an address of this node: is the job network up \(net\.up first\)\?"):
        _call("nfs.up", _grant("880003", 1004, 1004))
    _install_site(tmp_path, [tmp_path / "absent"])
    with pytest.raises(InputError, match="no such directory on this node"):
        _call("nfs.up", _grant("880003", 1004, 1004))


# -- the pilot's side ------------------------------------------------------------------------------
def _pilot_config(tmp_path: Path, socket_line: str) -> Any:
    (tmp_path / "pilot.toml").write_text(
        f"[node]\n{socket_line}\n[guest]\n"
        'mounts = [{source = "/export/home", target = "/home"}, {source = "/export/home/shared", target = "/shared"},'
        ' {source = "/scratch"}]\n'
    )
    return load(tmp_path / "pilot.toml")


def test_the_pilot_maps_a_working_directory_on_a_source_to_its_guest_path(tmp_path: Path) -> None:
    cfg = _pilot_config(tmp_path, 'socket = "/run/vjob/node.sock"')
    declared = site_mounts.declared(cfg)
    assert site_mounts.guest_path(declared, "/export/home/u/run") == "/home/u/run"
    assert site_mounts.guest_path(declared, "/export/home/shared/data") == "/shared/data"  # the longest source
    assert site_mounts.guest_path(declared, "/scratch") == "/scratch"
    assert site_mounts.guest_path(declared, "/export/homework") is None
    base = {"script": b"#!/bin/sh\n", "args": [], "env": {}, "uid": 1004, "gid": 1004, "user": "u"}
    desc = job_disk.JobDescription(**base, home="/export/home/u", cwd="/export/home/u/run")
    mine = site_mounts.with_mounts(cfg, "slurm", "4242", desc)
    assert (mine.cwd, mine.home, mine.in_place) == ("/home/u/run", "/home/u", True)
    sub = network.pilot_subnet_id("slurm", "4242")
    assert mine.mounts == {
        "server": str(network.gateway_address(sub)),
        "port": NFS_PORT,
        "exports": [
            {"export": "/vjob/0", "target": "/home", "options": []},
            {"export": "/vjob/1", "target": "/shared", "options": []},
            {"export": "/vjob/2", "target": "/scratch", "options": []},
        ],
    }
    local = site_mounts.with_mounts(cfg, "slurm", "4242", job_disk.JobDescription(**base, home="/home/u", cwd="/tmp/x"))
    assert local.mounts is not None and not local.in_place and local.cwd == "/tmp/x"  # staged as before
    no_service = _pilot_config(tmp_path, "")  # mounts declared but no node service to serve them
    assert site_mounts.with_mounts(no_service, "slurm", "4242", desc) == desc
    assert site_mounts.up(no_service, "slurm", "4242", "n1") is False


def test_a_bad_mount_entry_in_the_site_configuration_is_named(tmp_path: Path) -> None:
    for entry, field in (
        ('{source = "/home/../etc"}', "guest.mounts.0.source"),
        ('{source = "/home", target = "rel"}', "guest.mounts.0.target"),
        ('{source = "/home", options = ["ro,sec=none"]}', "guest.mounts.0.options"),
    ):
        (tmp_path / "bad.toml").write_text(f"[guest]\nmounts = [{entry}]\n")
        with pytest.raises(Exception, match=re.escape(field)):
            load(tmp_path / "bad.toml")


def test_the_image_carries_every_helper_module_of_the_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every .py beside the agent (mounts.py among them) goes to /usr/lib/vjob-guest and into the
    image's cache key, so a change to one rebuilds the image."""
    from provisioning import guest_agent, image_build

    names = [p.name for p in guest_agent.helper_modules()]
    assert "mounts.py" in names and "agent.py" not in names and "__init__.py" not in names
    script = image_build._inject_script()
    assert f"cd {guest_agent.GUEST_LIB}\n" in script and "sif mounts.py mode 0100644\n" in script
    keys = []
    for tail in ("", "# changed\n"):
        copy = tmp_path / tail.strip("# \n") / "mounts.py"
        copy.parent.mkdir(exist_ok=True)
        copy.write_text(Path(mounts.__file__).read_text() + tail)
        monkeypatch.setattr(image_build, "helper_modules", lambda c=copy: [c])
        keys.append(image_build._cache_key([]))
    assert keys[0] != keys[1]
