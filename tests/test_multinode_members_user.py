"""An ordinary user's multi-node job runs per-node pilots (pilot.members.launch.pilots_mode), and
its leader never takes its own session libvirt for another node's (leader.reaches_only_here).

The whole job, as a user on the dev cluster, is tests/test_multinode_slurm.py's CI case.
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest

from pilot.members.launch import check_user_network, pilots_mode
from pilot.members.leader import reaches_only_here
from tests.as_user import as_nobody
from vjob.errors import UsageError
from vjob.pilot_files import PilotDir


@pytest.mark.parametrize("configured", ["leader", "per-node"])
def test_a_users_job_runs_per_node_pilots_whatever_the_site_says_and_root_follows_it(configured: str) -> None:
    assert pilots_mode(configured, 1000) == "per-node"
    assert pilots_mode(configured, 0) == configured


def test_a_users_multi_node_job_without_a_node_service_is_refused_by_name() -> None:
    with pytest.raises(UsageError, match=r"ordinary user needs the node service .* \[node\] socket is unset"):
        check_user_network(1000, False)
    check_user_network(1000, True)
    check_user_network(0, False)  # root's pilot makes the job's bridge on its own libvirt


@pytest.mark.parametrize(
    ("uri", "here_only"),
    [
        ("qemu:///session", True),
        ("qemu+unix:///session", True),
        ("qemu:///session?socket=/run/user/1000/libvirt/libvirt-sock", True),
        ("qemu:///system", False),  # root's: the dev cluster's nodes, or a node's by configuration
        ("qemu+ssh://node2/session", False),  # another node's, reached through ssh
        ("qemu+ssh://node2/system", False),
        ("test:///default", False),
    ],
)
def test_only_a_hostless_session_uri_is_taken_for_this_node_alone(uri: str, here_only: bool) -> None:
    assert reaches_only_here(uri) is here_only


def test_the_agents_request_reaches_a_users_pilot() -> None:
    """The agent (root) writes its checkpoint request into the user's own pilot directory
    (0700): the file must be the user's to read — it was root's 0600, and a user's pilot failed
    on its first request ("cannot be read safely (Permission denied)"; found by the user's MPI
    ring, tests/test_multinode_slurm.py)."""
    assert os.geteuid() == 0, "the agent's side runs as root: run the suite as root, as CI does"
    base = Path(tempfile.mkdtemp(prefix="vjob-userreq-", dir="/var/tmp"))  # pytest's tmp is root's 0700
    try:
        _request_to_nobody(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _request_to_nobody(base: Path) -> None:
    base.chmod(0o755)
    root = base / "pilots"
    root.mkdir()
    root.chmod(0o1777)
    made = as_nobody(lambda: PilotDir(root, "slurm", "77").ensure())
    assert made.returncode == 0, made.stderr
    PilotDir(root, "slurm", "77").request_checkpoint("req-1", "test")  # as the agent does

    def read() -> int:
        req = PilotDir(root, "slurm", "77").read_request()
        print(req.request_id if req else "none")
        return 0

    seen = as_nobody(read)
    assert (seen.returncode, seen.stdout.strip()) == (0, "req-1"), seen.stderr
    st = (PilotDir(root, "slurm", "77").path / "request.json").stat()
    assert (st.st_uid, st.st_mode & 0o777) == (pwd.getpwnam("nobody").pw_uid, 0o600)
