"""The Saline manager's unit: no physical devices, a bounded capability set (issue 39, item 13).

The manager runs as root on an OAR site master. `006ad0b`'s unit had neither `PrivateDevices`
nor `CapabilityBoundingSet`: a flaw in the manager (it parses what users send over a 0666
socket) was worth raw disks, /dev/mem, module loading and every other capability. Now the
unit gives it what it really does and nothing more. The capability set is proven here by
running the manager's privileged steps under exactly that bounding set (setpriv, as systemd
applies it); the one device it looks at, /dev/kvm, by a private /dev such as PrivateDevices
makes. The content tests fail on `006ad0b`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.test_operator_deploy import _unit

REPO = Path(__file__).resolve().parents[1]
UNIT = REPO / "vjob" / "deploy_files" / "saline" / "vjob-saline-manager.service"
NEEDED = {
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_CHOWN",
    "CAP_KILL",
    "CAP_SETUID",
    "CAP_SETGID",
    "CAP_AUDIT_WRITE",
    "CAP_SYS_RESOURCE",
}
NEVER = {
    "CAP_SYS_ADMIN",
    "CAP_NET_ADMIN",
    "CAP_SYS_PTRACE",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_MKNOD",
    "CAP_SYS_BOOT",
    "CAP_BPF",
    "CAP_NET_RAW",
    "CAP_SETPCAP",
}
root_only = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")


def _service() -> dict[str, list[str]]:
    return _unit(UNIT.read_text())["Service"]


def _bounding() -> set[str]:
    (line,) = _service()["CapabilityBoundingSet"]
    return set(line.split())


def test_the_unit_has_no_physical_devices_but_the_kvm_node_the_manager_checks() -> None:
    svc = _service()
    assert svc["PrivateDevices"] == ["yes"]
    assert svc["BindPaths"] == ["-/dev/kvm"] and svc["DeviceAllow"] == ["/dev/kvm rw"]
    assert os.path.realpath(REPO / "deploy" / "oar" / "vjob-saline-manager.service") == str(UNIT)


def test_the_unit_bounds_the_capabilities_to_what_the_manager_does() -> None:
    assert _bounding() == NEEDED
    assert not _bounding() & NEVER


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_accepts_the_hardened_unit() -> None:
    r = subprocess.run(["systemd-analyze", "verify", str(UNIT)], capture_output=True, text=True, timeout=60)
    complaints = [line for line in r.stderr.splitlines() if "man vjob" not in line and "not executable" not in line]
    assert complaints == [], r.stderr


_STEPS = textwrap.dedent(
    """
    import os, pwd, signal, subprocess, sys
    nobody = pwd.getpwnam("nobody")
    work = sys.argv[1]
    # oarsub as the job's owner (plugins/oar/client.py)
    r = subprocess.run(["runuser", "-u", "nobody", "--", "id", "-u"], capture_output=True, text=True)
    if r.returncode != 0 or r.stdout.strip() != str(nobody.pw_uid):
        sys.exit("runuser: " + r.stderr.strip())
    # the job-disk reader's child dropping to the job's ids, killed by root (provisioning/ext4_tree.py)
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([]); os.setgid(nobody.pw_gid); os.setuid(nobody.pw_uid)
        except OSError:
            os._exit(3)
        signal.pause()
        os._exit(0)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if not os.WIFSIGNALED(status):
        sys.exit("the child could not drop to nobody")
    # a file handed to another user, then read and re-moded by root (QEMU's 0600 states, the socket)
    path = os.path.join(work, "state")
    with open(path, "w") as f:
        f.write("memory")
    os.chown(path, nobody.pw_uid, nobody.pw_gid)
    os.chmod(path, 0o600)
    with open(path) as f:
        assert f.read() == "memory"
    os.chmod(path, 0o640)
    print("ok")
    """
)


def _under(caps: set[str], work: Path) -> subprocess.CompletedProcess[str]:
    """The manager's privileged steps in a root process whose bounding set is `caps`."""
    spec = ",".join(["-all", *(f"+{c.removeprefix('CAP_').lower()}" for c in sorted(caps))])
    return subprocess.run(
        ["setpriv", f"--bounding-set={spec}", "--", sys.executable, "-c", _STEPS, str(work)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@root_only
def test_the_managers_privileged_steps_work_within_the_units_capabilities(tmp_path: Path) -> None:
    work = tmp_path / "w"
    work.mkdir(mode=0o755)
    r = _under(_bounding(), work)
    assert (r.returncode, r.stdout.strip()) == (0, "ok"), r.stderr


@root_only
def test_the_capability_check_has_teeth(tmp_path: Path) -> None:
    """Without CAP_SETUID the same steps fail at runuser: the test above would see a set too small."""
    work = tmp_path / "w"
    work.mkdir(mode=0o755)
    r = _under(_bounding() - {"CAP_SETUID"}, work)
    assert r.returncode != 0 and "runuser" in r.stderr


_KVM = "from provisioning.kvm_probe import kvm_usable; print(kvm_usable())"


def _in_private_dev(tmp_path: Path, *, bind_kvm: bool) -> str:
    """kvm_usable() in a mount namespace whose /dev holds only null (and kvm when bound), as
    PrivateDevices=yes (and BindPaths=/dev/kvm) make it."""
    dev = tmp_path / ("dev-kvm" if bind_kvm else "dev")
    dev.mkdir()
    script = textwrap.dedent(
        f"""
        set -e
        touch {dev}/null && mount --bind /dev/null {dev}/null
        {f"touch {dev}/kvm && mount --bind /dev/kvm {dev}/kvm" if bind_kvm else ":"}
        mount --rbind {dev} /dev
        cd {REPO} && exec {sys.executable} -c '{_KVM}'
        """
    )
    r = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or not os.path.exists("/dev/kvm"),
    reason="needs root, unshare and /dev/kvm",
)
def test_a_private_dev_without_the_kvm_node_would_silently_mean_tcg(tmp_path: Path) -> None:
    """Why the unit binds /dev/kvm in: the manager decides KVM or TCG by it (domain_type auto)."""
    assert _in_private_dev(tmp_path, bind_kvm=False) == "False"
    assert _in_private_dev(tmp_path, bind_kvm=True) == "True"
