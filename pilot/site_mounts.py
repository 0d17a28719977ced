"""The site's filesystems (`[guest] mounts`) for a job's guests: job.json's `mounts`, the working
directory used in place, and the job's NFS gateway asked of the node service (`nfs.up` /
`nfs.down`, provisioning.node_service.nfs_ops) as root or as the job's ordinary user.

Why job.json's `mounts` is computed here and not taken from the service's answer: it is a pure
function of the site's configuration and the job's subnetID (gateway address, port, pseudo
paths `/vjob/<index>`, nfs_ops.answer), the same on every node, so the job disk is built once
and a guest resumed or moved anywhere finds the same server at the same address; the service's
answer is only checked against it.

A working directory under a declared source is used in place: the guest works in it over the
mount (at its target path: a source `/export/home` shown as `/home` maps
`/export/home/u/run` to `/home/u/run`), nothing is staged onto the job disk and nothing is copied
back; the job's files land on the site's filesystem as it writes them. Without `[node] socket`
or with no mounts declared, nothing changes: the directory is staged as before.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from provisioning import job_disk, network
from provisioning.guest_config import GuestMount
from provisioning.node_service import nfs_ops
from provisioning.node_service.client import NodeClient
from vjob import log
from vjob.errors import VjobError

CALL_TIMEOUT_S = 60.0
"""nfs.up starts ganesha (well under a second here) and waits until it listens (30 s at most)."""
_log = log.get("pilot")


def declared(cfg: Any) -> list[GuestMount]:
    """`[guest] mounts` when the site runs a node service to serve them, else []."""
    socket_path = str(getattr(getattr(cfg, "node", None), "socket", "") or "")
    return list(getattr(getattr(cfg, "guest", None), "mounts", None) or []) if socket_path else []


def guest_mounts(cfg: Any, rms: str, job: str) -> dict[str, object] | None:
    """job.json's `mounts` for `job` (provisioning.guest_agent.mounts reads it), None when the
    site declares none or runs no node service."""
    mounts = declared(cfg)
    if not mounts:
        return None
    ans = nfs_ops.answer(network.pilot_subnet_id(rms, job), mounts)
    exports = [{k: v for k, v in e.items() if k != "source"} for e in ans["exports"]]
    return {"server": ans["server"], "port": ans["port"], "exports": exports}


def guest_path(mounts: list[GuestMount], path: str) -> str | None:
    """Where host `path` appears in the guest when it lies under a declared source; else None.
    The longest source wins (a mount of /home/shared over one of /home)."""
    best: GuestMount | None = None
    for m in mounts:
        if (path == m.source or path.startswith(m.source.rstrip("/") + "/")) and (
            best is None or len(m.source) > len(best.source)
        ):
            best = m
    if best is None:
        return None
    rest = path[len(best.source) :].lstrip("/")
    return os.path.join(best.guest_path, rest) if rest else best.guest_path


def with_mounts(cfg: Any, rms: str, job: str, desc: job_disk.JobDescription) -> job_disk.JobDescription:
    """`desc` with the site's mounts, its working directory (and home) at their guest paths when
    they lie on one: then the job runs in place (desc.in_place). Unchanged without mounts."""
    mounts = declared(cfg)
    table = guest_mounts(cfg, rms, job)
    if table is None:
        return desc
    cwd = guest_path(mounts, desc.cwd) or desc.cwd
    home = guest_path(mounts, desc.home) or desc.home
    out = dataclasses.replace(desc, mounts=table, cwd=cwd, home=home)
    if out.in_place:
        _log.info("working directory used in place on the site's filesystem", host=desc.cwd, guest=cwd)
    return job_disk.check_description(out)


def up(cfg: Any, rms: str, job: str, node: str) -> bool:
    """nfs.up on `node` (before a boot or a restore there, after the job's network is up);
    False when the site declares no mounts. The answer must be what job.json holds."""
    if not declared(cfg):
        return False
    answer = NodeClient(cfg.node.socket, timeout=CALL_TIMEOUT_S).call("nfs.up", job=job, node=node)
    want = nfs_ops.answer(network.pilot_subnet_id(rms, job), declared(cfg))
    got = {k: answer.get(k) for k in ("server", "port", "exports")}
    if got != want:
        raise VjobError(
            f"node service: nfs.up answered {str(got)[:200]}, not this job's gateway {str(want)[:200]} "
            "(is the node's [guest] mounts the same as the pilot's?)"
        )
    _log.info("NFS gateway up", job=job, node=node, server=want["server"])
    return True


def down(cfg: Any, rms: str, job: str, node: str) -> bool:
    """nfs.down on `node` (after a save, at the end); never raises: False is logged and the
    service's sweep stops a gateway whose job no longer runs on the node."""
    if not declared(cfg):
        return True
    try:
        NodeClient(cfg.node.socket, timeout=CALL_TIMEOUT_S).call("nfs.down", job=job, node=node)
    except VjobError as exc:
        _log.warning("NFS gateway not stopped (the service's sweep will)", job=job, node=node, error=str(exc))
        return False
    return True
