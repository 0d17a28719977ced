"""The in-job pilot (`vjob run`): the job's command inside its allocation runs the job in a VM.

Why a pilot inside the job rather than the agent starting VMs itself: the RMS stays the one
that allocates nodes, starts, kills and requeues jobs, with its accounting, limits and
prolog/epilog intact; vjob only changes what runs inside the allocation. The RMS's own
controls then mean the right thing for a vjob:

* a job that starts for the first time boots a fresh VM (overlay over its OS image);
* a job that starts again after a checkpoint restores the saved VM — on the same node when
  the RMS gave it back its node (a local resume), elsewhere by copying the state over (a
  remote resume, done by the VM driver);
* the agent asks for a checkpoint by writing a request file (vjob.pilot_files): the pilot
  saves the VM, answers in its state file and then waits to be requeued. If nobody requeues
  it within `orphan_resume_s` (the agent died or withdrew the request), it restores the VM and
  carries on, so a crashed agent can never leave a job "running" with its VM on disk;
* SIGTERM (the RMS requeues, preempts or kills the job, and sends SIGKILL after its grace
  time, Slurm's KillWait) saves the VM at once and exits, so nothing is lost whatever the RMS
  does next. A save takes about 0.3–1.3 s for a 128 MiB guest;
* a pilot killed outright (SIGKILL) leaves its VM running: the job's next pilot on the same
  libvirt adopts it instead of booting a second copy.
* a job that ends while a remapping swap has its VM on another node (the partner's VM runs on
  this one) holds its node, at most `partner_hold_s`, until the agent sends that VM home and
  releases it, so the RMS does not give the node away under it (docs/remap.md); then it ends
  anyway.

The VM itself is handled by provisioning.driver; this module decides when to boot, save,
restore and delete, and keeps the state file true.

A real job (a catalogue image such as `debian12`, docs/realjobs.md) differs in three ways: its
VM has a job disk built from the working directory at the first boot
(provisioning.job_disk), the guest's stdout and stderr serial logs are copied to the pilot's
stdout and stderr, and when the guest ends the job's files are copied back and the pilot exits
with the script's exit status (so the RMS records it).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import IO, Any

from pilot import switch_requests
from pilot.output import ConsoleTail, empty_file, last_lines
from pilot.settings import PilotSettings
from pilot.signals import Signals
from pilot.usage import RunUsage, for_pilot
from pilot.vm import DriverVM
from vjob import log
from vjob.errors import VjobError
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, RequestKind

EXIT_FINISHED = 0
EXIT_CHECKPOINTED = 0
"""Exit status after a checkpoint on SIGTERM: the RMS requeues or ends the job itself."""
EXIT_FAILED = 1


class Pilot:
    """One vjob's pilot: boot or restore, then watch for the end, a request or SIGTERM."""

    def __init__(
        self,
        settings: PilotSettings,
        pdir: PilotDir,
        vm: DriverVM,
        *,
        out: IO[str] | None = None,
        err: IO[str] | None = None,
        replay: bool | None = None,
        usage: RunUsage | None = None,
    ) -> None:
        """`replay`: whether the job's output was empty when the pilot began (default: looked at
        in `run`); given when something (member pilots' start) wrote to it before `run`.
        `usage`: who measures the VMs of this run for the RMS's record (default: pilot.usage)."""
        self.s = settings
        self.pdir = pdir
        self.vm = vm
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self._replay = replay
        self.real = settings.workdir is not None
        self.signals = Signals()
        self.log = log.get("pilot").bind(job=settings.job_id, vm=vm.name, node=settings.node)
        self.status: PilotStatus | None = None
        self._resumed = False
        self._tails: list[ConsoleTail] = []
        self.usage = usage

    def set_state(self, state: PilotState, **changes: Any) -> None:
        """Move to `state` with `changes` and write the state file at once: the agent knows the
        pilot only by that file, so nothing the pilot did may stay unwritten."""
        assert self.status is not None
        self.status = self.status.moved(state, **changes)
        self.pdir.write_state(self.status)

    def say(self, text: str) -> None:
        """One line for the job's user in the job's output, `vjob: …`."""
        stream = self.err if self.real else self.out  # a real job's stdout is the job's own
        stream.write(f"vjob: {text}\n")
        stream.flush()

    # -- main ---------------------------------------------------------------------------
    def run(self) -> int:
        self.signals.install()
        # the RMS truncated the output at a requeue: copy it all again
        replay = self._replay if self._replay is not None else empty_file(self.out)
        try:
            self.pdir.ensure()  # finds or makes the job's own directory (a squatted name is passed by)
            if self.usage is None:
                self.usage = for_pilot(self.s, len(self.vm.nodes()))
            self.usage.start()  # before any VM starts: root counts each new QEMU from its birth
            self._start()
            self.usage.sample()  # the VMs run now: a short run is counted from here
            if self.real:
                out_log, err_log = self.vm.output_logs()
                go_on = self._resumed and not replay
                saved = list(self.status.output_bytes_at_save) if go_on and self.status is not None else []
                offsets: list[int | None] = list(saved) if len(saved) == 2 else [None, None]
                tails = [
                    ConsoleTail(out_log, self.out, start_at_end=go_on, offset=offsets[0]),
                    ConsoleTail(err_log, self.err, start_at_end=go_on, offset=offsets[1]),
                ]
            else:
                tails = [ConsoleTail(self.vm.console_log(), self.out, start_at_end=self._resumed)]
            self._tails = tails
            for tail in tails:
                tail.start()
            try:
                return self._watch()
            finally:
                for tail in self._tails:  # the tails now copying (a context switch may have moved them)
                    tail.stop()
        except VjobError as exc:
            self.log.error("pilot failed", error=str(exc))
            if self.status is not None:
                self.set_state(PilotState.FAILED, message=str(exc))
            self.say(f"failed: {exc}")
            return EXIT_FAILED
        finally:
            if self.usage is not None:
                self.usage.final()  # the run's VMs measured into the job's record (never fatal)
            self.signals.restore()

    def _start(self) -> None:
        """Adopt a VM still running, restore a saved one, or boot a fresh one."""
        previous = self.pdir.read_state()
        if previous is not None and self.s.restart_count == 0:
            # Job ids come round again (a controller whose state was wiped starts at 1): what
            # is here belongs to an older job, and restoring it would hand over its memory.
            self.say(f"discarding the state of an older job {self.s.job_id} (this job never ran before)")
            self.log.warning("stale vjob state of a reused job id discarded", old_since=previous.since)
            self.vm.forget(previous.saved_node or previous.node)
            previous = None
        elif previous is None and self.s.restart_count == 0 and self.vm.leftover():
            # The same on the node's side: the domain (or saved memory) of an older job of this
            # id, left by a crash or a wiped controller, with this pilot's directory gone or
            # elsewhere. Booting would meet its domain; adopting it would run its memory.
            self.say(f"removing VM {self.vm.name} of an older job {self.s.job_id} (this job never ran before)")
            self.log.warning("stale VM of a reused job id removed", vm=self.vm.name)
            self.vm.forget(self.s.node)
        self.status = previous or PilotStatus(
            job_id=self.s.job_id,
            vm=self.vm.name,
            node=self.s.node,
            uri=self.vm.uri,
            state=PilotState.STARTING,
            since=time.time(),
            image=self.s.image,
            memory_mb=self.s.memory_mb,
        )
        self.set_state(
            PilotState.STARTING,
            node=self.s.node,
            uri=self.vm.uri,
            pid=os.getpid(),
            request_id="",
            console_log=str(self.vm.console_log()),
            member_nodes=self.vm.nodes() if len(self.vm.nodes()) > 1 else [],
        )
        # A request left over from before this start was answered (or withdrawn) already.
        self.pdir.withdraw_request()
        if self.vm.active():
            self._resumed = True
            self.say(f"adopting VM {self.vm.name}, still running from the job's previous start")
            self.set_state(PilotState.RUNNING)
            return
        # the node's view: the file itself here (memory_saved is the record the agent trusts)
        if previous is not None and (previous.memory_on_this_host or self._saved_elsewhere(previous)):
            self._resumed = True
            self._restore(previous.saved_node, previous.member_nodes)
            return
        self.say(f"booting VM {self.vm.name} ({self.s.image or 'default image'}) on {self.s.node}")
        self.vm.boot()
        self.set_state(PilotState.RUNNING, boots=self.status.boots + 1)
        self.log.info("booted")

    def _saved_elsewhere(self, previous: PilotStatus) -> bool:
        """Whether the state file says the VM was saved on another node, into a directory of
        that node's own (`user_vm_dir`, a `vm_dir` not shared): its path is not a file here,
        yet the restore copies it over and checks it on arrival. Found on two hosts (issue 38):
        looking for the path here made the job boot afresh, its work and state left behind."""
        return (
            previous.state is PilotState.SAVED
            and bool(previous.memory_path)
            and bool(previous.saved_node)
            and previous.saved_node != self.s.node
        )

    def _restore(self, saved_on: str, member_nodes: Sequence[str] = ()) -> None:
        local = saved_on == self.s.node
        where = "locally" if local else f"remotely (saved on {saved_on})"
        self.say(f"restoring VM {self.vm.name} {where} on {self.s.node}")
        self.set_state(PilotState.RESTORING)
        t0 = time.monotonic()
        self.vm.restore(saved_on, member_nodes)
        took = time.monotonic() - t0
        st = self.status
        assert st is not None
        self.set_state(
            PilotState.RUNNING,
            memory_path="",
            restores=st.restores + 1,
            local_restores=st.local_restores + (1 if local else 0),
            restore_seconds=took,
        )
        self.log.info("restored", local=local, seconds=round(took, 3))

    def retail(self) -> None:
        """Copy the guest's output from where its VM now is (a context switch moved it; the
        console and output logs on the new node start empty)."""
        for tail in self._tails:
            tail.stop()
        if self.real:
            out_log, err_log = self.vm.output_logs()
            self._tails = [
                ConsoleTail(out_log, self.out, start_at_end=False),
                ConsoleTail(err_log, self.err, start_at_end=False),
            ]
        else:
            self._tails = [ConsoleTail(self.vm.console_log(), self.out, start_at_end=False)]
        for tail in self._tails:
            tail.start()

    def _watch(self) -> int:
        """The pilot's loop until the guest ends or the job is checkpointed."""
        while True:
            if self.signals.terminate.is_set():
                return self._save_and_exit("SIGTERM")
            request = self.pdir.read_request()
            if request is not None and request.kind is not RequestKind.CHECKPOINT:
                ended = switch_requests.carry_out(self, request)  # one action of a live context switch
                if ended is not None:
                    return ended
                request = None
            if request is not None or self.signals.checkpoint.is_set():
                self.signals.checkpoint.clear()
                self.save(request.request_id if request else "signal", request.nodes if request else ())
                if self._wait_for_requeue(withdrawable=request is not None):
                    return EXIT_CHECKPOINTED
                continue
            if not self.vm.active():
                return self._finish()
            self._sample_cpu()
            self.signals.wake.wait(self.s.poll_s)
            self.signals.wake.clear()

    def _sample_cpu(self) -> None:
        """Every `cpu_sample_s`, the VM's CPU counter into the state file (no history entry)."""
        st = self.status
        now = time.time()
        if st is None or st.state is not PilotState.RUNNING or now - st.cpu_at < self.s.cpu_sample_s:
            return
        reading = self.vm.cpu()
        if reading is not None:
            self.status = replace(st, cpu_seconds=reading[0], cpu_at=now, vcpus=reading[1])
            self.pdir.write_state(self.status)

    def _finish(self) -> int:
        """The guest powered off: a real job's files come back and its exit status is ours."""
        code = EXIT_FINISHED
        if self.s.workdir is not None:
            exit_code = self.vm.collect(self.s.workdir)
            if exit_code is None:
                self.say(f"the job ended without an exit status; guest console: {self.vm.console_log()}")
                self.say("last console lines: " + " | ".join(last_lines(self.vm.console_log(), 8)))
                self.set_state(PilotState.FAILED, message="the guest ended without the job's exit status")
                return EXIT_FAILED  # VM kept (powered off) for a look; deleted with the job's next run
            code = exit_code
            self.say(f"job exited with status {code}; files copied back to {self.s.workdir}")
        else:
            self.say("guest ended")
        self.vm.delete()
        self.set_state(PilotState.FINISHED)
        self.log.info("finished", exit_code=code)
        self._hold_while_lent()
        return code

    def save(self, request_id: str, nodes: tuple[str, ...] = ()) -> None:
        """Save the VM (all of a multi-node job's, one cut) and answer `request_id` in the state
        file with where the state is; the output copied so far is noted for the job's restart."""
        # a refusal before is no answer to this
        self.set_state(PilotState.SAVING, request_id=request_id, request_error="")
        t0 = time.monotonic()
        if self.usage is not None:
            self.usage.sample()  # the VMs' CPU up to the cut: their QEMU ends with the save
        path, size = self.vm.save()
        took = time.monotonic() - t0
        printed, copied = self.output_marks()
        self.set_state(
            PilotState.SAVED,
            saved_node=self.vm.node,  # the pilot's node unless a context switch moved the VM
            saved_nodes=list(nodes) or [self.vm.node],
            member_nodes=self.vm.nodes() if len(self.vm.nodes()) > 1 else [],
            save_seconds=took,
            save_bytes=size,
            memory_path=str(path),
            console_bytes_at_save=printed,
            output_bytes_at_save=copied,
        )
        self.say(f"checkpointed VM {self.vm.name} on {self.s.node}: {size / 2**20:.0f} MiB in {took:.2f} s")
        self.log.info("saved", request=request_id, seconds=round(took, 3), bytes=size)

    def output_marks(self) -> tuple[int, list[int]]:
        """Once the guest is stopped (saved or paused): its console's size and, for a real job,
        how far each output copy went, after copying everything it printed into the job's
        output (noted in the state for the job's restart)."""
        try:
            printed = self.vm.console_log().stat().st_size
        except OSError:
            printed = 0
        for tail in self._tails:
            tail.drain()  # everything the guest printed before the save is in the job's output now
        return printed, [t.offset for t in self._tails] if self.real and len(self._tails) == 2 else []

    def _save_and_exit(self, why: str) -> int:
        if self.vm.active():
            self.save("")
        self.say(f"{why}: exiting, VM state kept for the job's restart")
        self._hold_while_lent()
        return EXIT_CHECKPOINTED

    def _hold_while_lent(self) -> None:
        """The job ends with its VM away from its own node (a remapping swap moved it; the
        partner's VM runs on the pilot's node): wait, at most `partner_hold_s`, for the agent's
        `release` — it sends the partner's VM home first — so the RMS does not give the node to
        another job while a foreign VM still runs there. Bounded and fail-open: the RMS's end of
        the job is delayed by the bound at most, and only for a job whose VM the agent moved
        (the agent releases only when its journal shows no foreign VM on the node)."""
        bound, now = self.s.partner_hold_s, self.vm.nodes()
        home = getattr(self.vm, "home", (self.s.node,))  # a multi-node job's: every node of its allocation
        lent = [n for n in home if n not in now]
        if not lent or bound <= 0:
            return
        own, away = ",".join(lent), ",".join(n for n in now if n not in home)
        self.say(
            f"the job ended with its VM on {away}: holding {own} (at most {bound:g} s) until the VM "
            f"remapping lent it goes home"
        )
        self.log.info("holding the node for a lent VM", own=own, away=away, bound_s=bound)
        t0 = time.monotonic()
        while time.monotonic() - t0 < bound:
            try:
                req = self.pdir.read_request()
            except VjobError as exc:
                self.log.warning("unreadable request while holding", error=str(exc))
                req = None
            if req is not None and req.kind is RequestKind.RELEASE:
                assert self.status is not None
                self.status = replace(self.status, request_id=req.request_id, request_error="")
                self.pdir.write_state(self.status)
                self.log.info("released by the agent", own=own, waited_s=round(time.monotonic() - t0, 3))
                return
            time.sleep(self.s.poll_s)
        self.say(f"not released within {bound:g} s: ending anyway ({own} may still host a remapped VM)")
        self.log.warning("hold timed out: ending with a foreign VM maybe still on the node", own=own, bound_s=bound)

    def _wait_for_requeue(self, *, withdrawable: bool) -> bool:
        """After a requested save: True when the RMS kills us; False to carry on running.

        A save asked for by a request file ends early when the file goes (the agent withdrew
        it); one asked for by SIGUSR1 (an operator) waits the whole `orphan_resume_s`.
        """
        deadline = time.monotonic() + self.s.orphan_resume_s
        while time.monotonic() < deadline:
            if self.signals.terminate.wait(self.s.poll_s):
                self.say("requeued by the resource manager: exiting")
                return True
            if withdrawable and self.pdir.read_request() is None:
                break  # the agent withdrew its request: resume at once
        self.say("not requeued: resuming the VM here")
        self.log.warning("checkpoint not followed by a requeue: resuming", waited=self.s.orphan_resume_s)
        self.pdir.withdraw_request()
        self._restore(self.s.node, self.vm.nodes() if len(self.vm.nodes()) > 1 else ())
        return False
