"""The pilot directory of one vjob: the only channel between its pilot and the agent.

Why files and not the database or an RMS signal: the pilot runs inside the job's allocation on
a compute node, where the state store may be out of reach (and a pilot must never fail a job
because the database is down), while every RMS has its own way to signal a job. A directory
per job on a filesystem shared with the agent holds the pilot's state file and the agent's
checkpoint request. Every write is an atomic rename, so a reader never sees half a file and a
process killed mid-write leaves the previous version.

Who writes what, and what root trusts: the directory and state.json belong to the job's user
(the pilot runs as that user), so the root agent reads them as hostile data — opened without
following symlinks, only if a regular file, at most MAX_FILE_BYTES, every field type-checked —
and only in a directory owned by the job's user (or root). The agent's own request.json is
written through a directory descriptor opened without following symlinks, to a random
O_EXCL|O_NOFOLLOW temporary name, then renamed over: a planted symlink is replaced, never
followed.

Layout of `<pilot_dir>/<rms>-<job id>/` (mode 0700, files 0600; `[agent] pilot_dir`, default
<data_dir>/pilots, on a filesystem the agent and the compute nodes share). The pilot root is 1777,
so that name may be taken by another user first: the job's directory is then a
`<rms>-<job id>~<16 random hex>` its pilot made, and which one is the job's is decided by its
owner, never by its name (PilotDir.ensure, find_dir; the agent: agent.observe.read_pilots):
  state.json    written by the pilot: where the VM runs, what it is doing, where it was saved
  request.json  written by the agent: "checkpoint now" (removed to withdraw it), or one action
                of a context switch: suspend, resume on a node, migrate, stop (RequestKind)
The VM's overlay, console log and memory state are where the VM driver keeps them
(provisioning.driver); state.json names the paths.

The package's names are its API; its modules say what they hold: `records` the two files'
contents, `names` what both sides derive from a job id, `directory` the directory itself.
"""

from vjob.pilot_files.directory import PilotDir, all_dirs, find_dir, pilot_root
from vjob.pilot_files.names import (
    USER_DATA_DIR,
    claimed_vms,
    member_names,
    vm_name,
    vm_names,
    vms_of,
)
from vjob.pilot_files.records import (
    CheckpointRequest,
    PilotState,
    PilotStatus,
    RequestKind,
    request_from_json,
)

__all__ = [
    "USER_DATA_DIR",
    "CheckpointRequest",
    "PilotDir",
    "PilotState",
    "PilotStatus",
    "RequestKind",
    "all_dirs",
    "claimed_vms",
    "find_dir",
    "member_names",
    "pilot_root",
    "request_from_json",
    "vm_name",
    "vm_names",
    "vms_of",
]
