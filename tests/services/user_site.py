"""The whole site an ordinary user's job meets, for the combined CI scenario (issue 33, "Tests").

One context, `user_site(cluster)`, starts the whole site, so one job (one boot) uses all of it
(tests/test_multinode_slurm.py's user case; the one-node network and filesystem tests that
started parts of it separately were folded into that job):

* the /home and /scratch stand-ins: plain directories on this host (`<base>/home`,
  `<base>/scratch`) with the user's own `home/<user>` (0755) and `scratch/<user>` (0700), declared
  in `[guest] mounts` with targets /home and /scratch — the guests mount them from the job's NFS
  gateway (provisioning.node_service.nfs_ops), this host reads them as plain files;
* the site network: the namespace of tests/services/site_network.py, its licence server and its
  name server, which `[guest] dns` hands the guests (`[guest] network = "nat"`);
* a root `vjob node-service` with that `[guest]`, the cluster's node names and Slurm as its RMS
  (its usage writer fills the job's AdminComment), started and stopped by pid.

Why a service of its own and not the session's (tests/services/node_service.py): that one serves
no mounts and hands out no network ("none"), which every other test relies on.

`UserSite.guest` is the `[guest]` section the pilots' configuration must carry too: the pilot
computes job.json's mounts from it, and the service checks they agree.
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from devkit.devcluster import DevCluster
from tests.services import site_network as sn
from tests.services.node_service import running


@dataclass(frozen=True)
class UserSite:
    base: Path
    socket: Path
    guest: str
    """The `[guest]` section's lines (network, dns, mounts): the service's and the pilots'."""
    net: sn.Site
    log: Path

    def home(self, user: str) -> Path:
        """The user's home as the host sees it (/home/<user> in the guests)."""
        return self.base / "home" / user

    def scratch(self, user: str) -> Path:
        """The user's scratch directory as the host sees it (/scratch/<user> in the guests)."""
        return self.base / "scratch" / user


def _stand_ins(base: Path, user: pwd.struct_passwd) -> str:
    """The two exported trees with the user's directories in them; the `mounts = [...]` line."""
    for d in (base / "home", base / "scratch"):
        d.mkdir(mode=0o755)
        d.chmod(0o755)
    for d, mode in ((base / "home" / user.pw_name, 0o755), (base / "scratch" / user.pw_name, 0o700)):
        d.mkdir()
        os.chown(d, user.pw_uid, user.pw_gid)
        d.chmod(mode)
    home = f'{{source = "{base / "home"}", target = "/home"}}'
    scratch = f'{{source = "{base / "scratch"}", target = "/scratch"}}'
    return f"mounts = [{home}, {scratch}]"


@contextmanager
def user_site(cluster: DevCluster, user: pwd.struct_passwd) -> Iterator[UserSite]:
    """The stand-ins, the site network and a node service serving both (module docstring); the
    service samples the VMs' usage at its default interval (the pilots ask for a sample when
    their VMs have started and before a save, so the test's short runs are counted too)."""
    base = Path(tempfile.mkdtemp(prefix="vjob-usersite-", dir="/var/tmp"))
    base.chmod(0o755)
    net: sn.Site | None = None
    try:
        guest = f'network = "nat"\ndns = ["{sn.SITE_IP}"]\n{_stand_ins(base, user)}'
        net = sn.start()
        with running(cluster, guest, "vjob-usersvc-") as service:
            yield UserSite(base, service.socket, guest, net, service.log)
    finally:
        if net is not None:
            sn.stop(net)
        shutil.rmtree(base, ignore_errors=True)
