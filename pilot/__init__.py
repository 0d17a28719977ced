"""The in-job pilot (`vjob run`): the program that runs inside a user's job and runs the job in a VM.

Why a package of its own, a sibling the agent may not import (devkit/architecture.py): the pilot
is another program than the agent. It runs inside the user's RMS allocation, as the user (with
the user's own libvirt, qemu:///session, unless the job runs as root), started by the RMS's hook
rather than by the operator, on a compute node rather than on the controller; the agent is a
root daemon next to the RMS. The two never share memory nor call each other: they talk only
through the pilot files, whose contract (paths, states, requests, VM names) is
`vjob/pilot_files/`. Keeping the code apart keeps that true — a name both sides need belongs
in the contract, not in either program.

Modules: `cli` (`vjob run`'s arguments and wiring), `job` (the job as this process sees it),
`specs` (the VM a job gets, its memory and images), `pilot` (the life cycle: boot, save,
restore, finish, with its `settings` and the `signals` it obeys), `vm` (one VM through the
driver), `output` (the guest's output copied to the job's), `switch_requests` (the agent's live
context-switch requests), `multinode` (a VM per node driven together), `members/` (per-node
member pilots and their leader).
"""
