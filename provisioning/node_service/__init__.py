"""The node-side service: the one root-side piece a job's pilot asks for what only root may do
on a node (the job's bridge and taps, its NAT and firewall, its NFS gateway, the VMs' usage
written into the RMS's job record), never running the job or its pilot as root.

Why a small daemon on a Unix socket: the peer's uid comes from the kernel (SO_PEERCRED), not
from anything the caller says, and every request is checked against the RMS (a running job of
that uid, on this node) before anything is made. docs/security.md holds its threat model.
"""
