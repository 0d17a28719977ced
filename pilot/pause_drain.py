"""A checkpoint that frees the job's CPUs at once: pause the VM, answer, save in the background.

Why: a save writes the guest's whole memory (about 5 s per GiB here), so an interactive job
that waits for its victims' saves waits minutes behind a victim of tens of GiB, while the CPUs
those victims hold could be handed over the moment their vCPUs stop. A `pause_checkpoint`
request (vjob.pilot_files.RequestKind) therefore:

1. pauses the VM (libvirt's suspend: the vCPUs stop, the memory stays),
2. starts the *drainer* (this module's `main`), a process outside the job's process tree
   that saves the paused VM to disk and answers `saved` in the state file,
3. answers `saving` with the request's id: the agent may now tell the RMS that the job's CPUs
   are free while its memory is not (Slurm: `scontrol suspend`, docs/preempt-pause.md),
4. waits: to be requeued (the RMS kills the pilot; nothing is left for it to do), or for the
   request to be withdrawn (the agent gave up: the VM runs again where it is).

Why the drainer is outside the job's process tree: `scontrol suspend` stops every process of
the job (SIGTSTP, then SIGSTOP, through the proctrack plugin) — the pilot included — and the
requeue that follows kills them without a SIGCONT (measured on Slurm 22.05,
docs/preempt-pause.md). A process whose parent has gone (double fork, own session) is not in
proctrack/linuxproc's tree, so it finishes the save whatever Slurm does to the job; the
guest's QEMU is under the libvirt daemon, outside it as well. The drainer writes only this
job's state file, as the job's user; it holds nothing the job does not.

The drainer learns what to save from its parent through a pipe (the VM, its node, the request),
never from a file another user could write; it reads the pilot's configuration (the file the
pilot's `--config` named, passed in the order; else `$VJOB_CONFIG`, inherited, else the site's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from pilot.settings import PilotSettings
from pilot.signals import Signals
from pilot.site_network import SiteLink
from pilot.specs import open_driver, user_provisioning
from pilot.vm import DriverVM
from vjob.config import load
from vjob.errors import VjobError
from vjob.pilot_files import CheckpointRequest, PilotDir, PilotState, PilotStatus

EXIT_REQUEUED = 0
DRAINER_READY_S = 30.0
"""How long the drainer waits for its pilot's `saving` answer before it writes its own (the
pilot writes it right after starting the drainer; a state file not yet saying so means the
pilot was stopped in between, and the drainer's answer must not come first)."""

_LAUNCH = (
    "import subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, start_new_session=True)\n"
    "p.stdin.write(sys.stdin.buffer.read())\n"
    "p.stdin.close()\n"
)
"""The middle process of the double fork: starts the drainer in a session of its own, hands it
the pilot's order on its stdin, and exits, so the drainer's parent is no longer in the job."""


class PausedPilot(Protocol):
    """What a pause checkpoint needs of its pilot (pilot.pilot.Pilot), as in pilot.switch_requests."""

    status: PilotStatus | None
    s: PilotSettings
    signals: Signals
    pdir: PilotDir
    vm: DriverVM
    log: Any
    usage: Any
    """pilot.usage.RunUsage, or None."""

    def set_state(self, state: PilotState, **changes: Any) -> None: ...

    def say(self, text: str) -> None: ...

    def output_marks(self) -> tuple[int, list[int]]: ...


def checkpoint(pilot: PausedPilot, req: CheckpointRequest) -> int | None:
    """Carry out a `pause_checkpoint` request (see the module docstring); the pilot's exit
    status when the RMS ends the job, None when the VM runs again (the request was withdrawn)."""
    vm = pilot.vm
    if len(vm.nodes()) > 1:
        raise VjobError(
            f"VM {vm.name}: a pause checkpoint is for a job of one VM; a multi-node job is saved as one cut"
        )
    t0 = time.monotonic()
    if not vm.driver.pause(vm.name, vm.node):
        raise VjobError(f"VM {vm.name} is not running on {vm.node}: nothing to pause")
    printed, copied = pilot.output_marks()  # the guest is paused: its output so far is all there is
    usage = pilot.usage
    if usage is not None:
        # The run's usage into the job's record now: its vCPUs are stopped, and the RMS will
        # kill this pilot stopped, with no chance to write it at its end. Written once.
        usage.final()
        pilot.usage = None
    _spawn_drainer(pilot, req)
    paused_s = time.monotonic() - t0
    pilot.set_state(
        PilotState.SAVING,
        request_id=req.request_id,
        request_error="",
        saved_node=vm.node,
        saved_nodes=list(req.nodes) or [vm.node],
        console_bytes_at_save=printed,
        output_bytes_at_save=copied,
        message=f"paused in {paused_s:.2f} s; its memory drains to disk",
    )
    pilot.say(f"paused VM {vm.name} on {vm.node} in {paused_s:.2f} s: its CPUs are free, its memory drains to disk")
    pilot.log.info("paused for a checkpoint", request=req.request_id, seconds=round(paused_s, 3))
    ended = _wait(pilot, req)
    if ended is None and usage is not None:
        pilot.usage = usage  # running again: measured from here, written at the job's end
        usage.start()
    return ended


def _spawn_drainer(pilot: PausedPilot, req: CheckpointRequest) -> None:
    """Start the drainer through a middle process that exits at once (see _LAUNCH)."""
    order = {
        "pilot_root": str(pilot.pdir.root),
        "rms": pilot.pdir.rms,
        "job_id": pilot.pdir.job_id,
        "vm": pilot.vm.name,
        "node": pilot.vm.node,
        "request_id": req.request_id,
        "site": pilot.vm.site is not None,
        "real": pilot.s.workdir is not None,
        "config": config_for_drainer(pilot.s.config_path),
    }
    try:
        subprocess.run(
            [sys.executable, "-c", _LAUNCH, sys.executable, "-m", "pilot.pause_drain"],
            input=json.dumps(order).encode(),
            check=True,
            timeout=60,
            stdout=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        pilot.vm.driver.unpause(pilot.vm.name, pilot.vm.node)
        raise VjobError(f"VM {pilot.vm.name}: could not start the process that saves it: {exc}") from None


def config_for_drainer(config_path: str) -> str:
    """The configuration file the drainer must read: the pilot's `--config` as an absolute
    path (the drainer may not share its working directory for long), else "" (the drainer
    then reads $VJOB_CONFIG, inherited, or the site's file, as the pilot did)."""
    return os.path.abspath(config_path) if config_path else ""


def _wait(pilot: PausedPilot, req: CheckpointRequest) -> int | None:
    """After the answer: until the RMS ends the job, the request is withdrawn, or (saved, and
    nobody requeued the job within `orphan_resume_s`) the pilot resumes the VM itself."""
    saved_at: float | None = None
    while True:
        if pilot.signals.terminate.wait(pilot.s.poll_s):
            pilot.say("requeued by the resource manager: exiting (the VM's state is saved or being saved)")
            return EXIT_REQUEUED
        st = _state(pilot.pdir)
        drained = st is not None and st.request_id == req.request_id and st.state is PilotState.SAVED
        failed = st is not None and st.request_id == req.request_id and bool(st.request_error)
        if drained and saved_at is None:
            saved_at = time.monotonic()
        try:
            asked = pilot.pdir.read_request()
        except VjobError:
            asked = req  # unreadable: not a withdrawal
        withdrawn = asked is None or asked.request_id != req.request_id
        orphaned = saved_at is not None and time.monotonic() - saved_at > pilot.s.orphan_resume_s
        if (withdrawn or orphaned) and (drained or failed):
            _run_again(pilot, st, why="withdrawn" if withdrawn else "not requeued")
            return None


def _run_again(pilot: PausedPilot, st: PilotStatus | None, *, why: str) -> None:
    """The VM runs again here: restored from its saved state, or let go on where it paused."""
    vm = pilot.vm
    if st is not None:
        pilot.status = st  # the drainer's answer is the state now
    pilot.say(f"checkpoint {why}: resuming VM {vm.name} here")
    pilot.log.warning("pause checkpoint not followed by a requeue: resuming", why=why)
    pilot.pdir.withdraw_request()
    if vm.active():
        vm.driver.unpause(vm.name, vm.node)
        pilot.set_state(PilotState.RUNNING, memory_path="", message="")
        return
    t0 = time.monotonic()
    vm.restore(vm.node)
    assert pilot.status is not None
    pilot.set_state(
        PilotState.RUNNING,
        memory_path="",
        restores=pilot.status.restores + 1,
        local_restores=pilot.status.local_restores + 1,
        restore_seconds=time.monotonic() - t0,
        message="",
    )


def _state(pdir: PilotDir) -> PilotStatus | None:
    try:
        return pdir.read_state()
    except VjobError:
        return None


# -- the drainer ------------------------------------------------------------------------------
def drain(order: dict[str, Any]) -> int:
    """Save the paused VM named in `order` and answer `saved` (or the error) in the state file."""
    path = order.get("config") or None
    if path is not None and not isinstance(path, str):
        raise VjobError(f"the drainer's order: config = {str(path)[:80]!r}: must be a path")
    cfg = load(path)  # the pilot's: its --config, else $VJOB_CONFIG (inherited) or the site's file
    pdir = PilotDir(Path(order["pilot_root"]), order["rms"], order["job_id"])
    pdir.ensure()
    vm, node, rid = order["vm"], order["node"], order["request_id"]
    prov = user_provisioning(cfg.provisioning) if order["real"] else None
    driver = open_driver(cfg, prov)
    t0 = time.monotonic()
    error = ""
    snap = None
    try:
        snap = driver.save(vm, node)
        if order["site"]:
            SiteLink(cfg, order["rms"], order["job_id"], node, [1]).down()
    except Exception as exc:  # noqa: BLE001 - whatever stopped the save, the pilot and the agent must hear it
        error = str(exc) or type(exc).__name__
    finally:
        driver.close()
    took = time.monotonic() - t0
    st = _pilot_answered(pdir, rid)
    if st is None:
        return 1  # the pilot never answered: its request was withdrawn, the pilot rolls back by itself
    if snap is None:
        pdir.write_state(replace(st, request_error=f"save failed: {error}"[:2000]))
        print(f"vjob: saving VM {vm} failed: {error}", file=sys.stderr)
        return 1
    pdir.write_state(
        st.moved(
            PilotState.SAVED,
            save_seconds=took,
            save_bytes=int(snap.size_bytes),
            memory_path=str(snap.memory_path),
            message="",
        )
    )
    print(f"vjob: checkpointed VM {vm} on {node}: {snap.size_bytes / 2**20:.0f} MiB in {took:.2f} s", file=sys.stderr)
    return 0


def _pilot_answered(pdir: PilotDir, request_id: str) -> PilotStatus | None:
    """The pilot's `saving` answer to `request_id` (waited for: see DRAINER_READY_S)."""
    deadline = time.monotonic() + DRAINER_READY_S
    while True:
        st = _state(pdir)
        if st is not None and st.request_id == request_id and st.state is PilotState.SAVING:
            return st
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def main() -> int:
    """`python -m pilot.pause_drain`, the order as JSON on stdin (from `_spawn_drainer`)."""
    order = json.loads(sys.stdin.buffer.read(1 << 20))
    os.umask(0o077)
    return drain(order)


if __name__ == "__main__":
    sys.exit(main())
