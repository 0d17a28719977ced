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
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import IO, Any

from agent import pilot_requests
from provisioning import job_disk
from vjob import log
from vjob.errors import VjobError
from vjob.model import VMState
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, RequestKind

EXIT_FINISHED = 0
EXIT_CHECKPOINTED = 0
"""Exit status after a checkpoint on SIGTERM: the RMS requeues or ends the job itself."""
EXIT_FAILED = 1


class DriverVM:
    """One vjob's VM on one node, through provisioning's VM driver."""

    def __init__(self, driver: Any, name: str, node: str, spec_factory: Callable[[], Any]) -> None:
        self.driver = driver
        self.name = name
        self.node = node
        self.uri = driver.uri(node)
        self._spec_factory = spec_factory

    def console_log(self) -> Path:
        return Path(self.driver.console_log(self.name, self.node))

    def active(self) -> bool:
        return bool(self.driver.state(self.name, self.node) is VMState.RUNNING)

    def boot(self) -> None:
        self.driver.define(self._spec_factory(), self.node)
        self.driver.boot(self.name, self.node)

    def save(self) -> tuple[Path, int]:
        snap = self.driver.save(self.name, self.node)
        return Path(snap.memory_path), int(snap.size_bytes)

    def restore(self, saved_on: str, member_nodes: Sequence[str] = ()) -> None:
        """`member_nodes`: a multi-node job's (agent.pilot_multinode); one VM has none."""
        self.driver.restore(self.name, self.node, from_node=saved_on or self.node)

    def nodes(self) -> list[str]:
        """The node of each VM of the job: one here (agent.pilot_multinode has several)."""
        return [self.node]

    def delete(self) -> None:
        self.driver.delete(self.name, self.node)

    def output_logs(self) -> tuple[Path, Path]:
        return self.driver.output_logs(self.name, self.node)

    def collect(self, workdir: Path) -> int | None:
        """A real job's exit status, after copying its files back (None: it never ended)."""
        return job_disk.collect(self.driver.job_disk_path(self.name, self.node), workdir).exit_code

    def cpu(self) -> tuple[float, int] | None:
        """CPU seconds used so far and vCPUs, from libvirt's domain info; None when unreadable."""
        import libvirt  # heavy: libvirt-python, only in a pilot that runs a VM

        try:
            info = self.driver.connection(self.node).lookupByName(self.name).info()
        except (libvirt.libvirtError, VjobError):  # a domain gone, a node unreachable: a reading is never needed
            return None
        return info[4] / 1e9, int(info[3])

    def forget(self, node: str) -> None:
        """Delete whatever an older job of the same name left on `node` (VM, disk, state)."""
        self.driver.delete(self.name, node)


@dataclass(frozen=True)
class PilotSettings:
    """How one pilot behaves; `node` is the RMS node name it runs on."""

    rms: str
    job_id: str
    node: str
    image: str = ""
    memory_mb: int = 128
    poll_s: float = 0.2
    orphan_resume_s: float = 30.0
    """After an agent-requested save, restore the VM if not requeued within this time."""
    restart_count: int | None = None
    """How often the RMS restarted the job (Slurm: SLURM_RESTART_COUNT); None when unknown.
    0 means a first start: state left under the same job id belongs to an older job."""
    workdir: Path | None = None
    """A real job's working directory (staged into its job disk, results copied back); None
    for the counter guest."""
    cpu_sample_s: float = 5.0
    """How often the VM's CPU time is written to the state file (the control loop's demand)."""
    partner_hold_s: float = 0.0
    """When the job ends with its VM moved away by a remapping swap, how long the pilot holds its
    own node at most for the agent to send the partner's VM there home (`[remap] partner_hold_s`)."""


class _Signals:
    """SIGTERM/SIGINT/SIGUSR1 turned into flags the main loop reads (handlers do nothing else)."""

    def __init__(self) -> None:
        self.terminate = threading.Event()
        self.checkpoint = threading.Event()
        self.wake = threading.Event()
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        for sig, event in ((signal.SIGTERM, self.terminate), (signal.SIGINT, self.terminate)):
            self._old[sig] = signal.signal(sig, self._setter(event))
        self._old[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._setter(self.checkpoint))

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _setter(self, event: threading.Event) -> Callable[[int, FrameType | None], None]:
        def handler(_sig: int, _frame: FrameType | None) -> None:
            event.set()
            self.wake.set()

        return handler


class ConsoleTail(threading.Thread):
    """Copies what the guest prints (its console log) to the job's output as it grows."""

    def __init__(self, path: Path, out: IO[str], start_at_end: bool, *, offset: int | None = None) -> None:
        super().__init__(name="console-tail", daemon=True)
        self.path = path
        self.out = out
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        if offset is not None:
            self.offset = offset  # where the copy stood at the last save: nothing skipped, nothing twice
        else:
            self.offset = path.stat().st_size if start_at_end and path.exists() else 0

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.drain()
            self.stop_event.wait(0.25)
        self.drain()

    def drain(self) -> None:
        with self.lock:  # the loop and a save both drain
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(self.offset)
                    data = fh.read()
            except (FileNotFoundError, PermissionError):
                return
            if data:
                self.offset += len(data)
                self.out.write(data.decode("utf-8", errors="replace"))
                self.out.flush()

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=2)


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
    ) -> None:
        """`replay`: whether the job's output was empty when the pilot began (default: looked at
        in `run`); given when something (member pilots' start) wrote to it before `run`."""
        self.s = settings
        self.pdir = pdir
        self.vm = vm
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self._replay = replay
        self.real = settings.workdir is not None
        self.signals = _Signals()
        self.log = log.get("pilot").bind(job=settings.job_id, vm=vm.name, node=settings.node)
        self.status: PilotStatus | None = None
        self._resumed = False
        self._tails: list[ConsoleTail] = []

    def _move(self, state: PilotState, **changes: Any) -> None:
        assert self.status is not None
        self.status = self.status.moved(state, **changes)
        self.pdir.write_state(self.status)

    def _say(self, text: str) -> None:
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
            self._start()
            if self.real:
                out_log, err_log = self.vm.output_logs()
                go_on = self._resumed and not replay
                saved = list(self.status.output_bytes_at_save) if go_on and self.status is not None else []
                offsets: list[int | None] = list(saved) if len(saved) == 2 else [None, None]
                tails = [ConsoleTail(out_log, self.out, start_at_end=go_on, offset=offsets[0]),
                         ConsoleTail(err_log, self.err, start_at_end=go_on, offset=offsets[1])]  # fmt: skip
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
                self._move(PilotState.FAILED, message=str(exc))
            self._say(f"failed: {exc}")
            return EXIT_FAILED
        finally:
            self.signals.restore()

    def _start(self) -> None:
        """Adopt a VM still running, restore a saved one, or boot a fresh one."""
        previous = self.pdir.read_state()
        if previous is not None and self.s.restart_count == 0:
            # Job ids come round again (a controller whose state was wiped starts at 1): what
            # is here belongs to an older job, and restoring it would hand over its memory.
            self._say(f"discarding the state of an older job {self.s.job_id} (this job never ran before)")
            self.log.warning("stale vjob state of a reused job id discarded", old_since=previous.since)
            self.vm.forget(previous.saved_node or previous.node)
            previous = None
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
        self._move(PilotState.STARTING, node=self.s.node, uri=self.vm.uri, pid=os.getpid(), request_id="",
                   console_log=str(self.vm.console_log()),
                   member_nodes=self.vm.nodes() if len(self.vm.nodes()) > 1 else [])  # fmt: skip
        # A request left over from before this start was answered (or withdrawn) already.
        self.pdir.withdraw_request()
        if self.vm.active():
            self._resumed = True
            self._say(f"adopting VM {self.vm.name}, still running from the job's previous start")
            self._move(PilotState.RUNNING)
            return
        if previous is not None and previous.memory_saved:
            self._resumed = True
            self._restore(previous.saved_node, previous.member_nodes)
            return
        self._say(f"booting VM {self.vm.name} ({self.s.image or 'default image'}) on {self.s.node}")
        self.vm.boot()
        self._move(PilotState.RUNNING, boots=self.status.boots + 1)
        self.log.info("booted")

    def _restore(self, saved_on: str, member_nodes: Sequence[str] = ()) -> None:
        local = saved_on == self.s.node
        where = "locally" if local else f"remotely (saved on {saved_on})"
        self._say(f"restoring VM {self.vm.name} {where} on {self.s.node}")
        self._move(PilotState.RESTORING)
        t0 = time.monotonic()
        self.vm.restore(saved_on, member_nodes)
        took = time.monotonic() - t0
        st = self.status
        assert st is not None
        self._move(
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
            self._tails = [ConsoleTail(out_log, self.out, start_at_end=False),
                           ConsoleTail(err_log, self.err, start_at_end=False)]  # fmt: skip
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
                ended = pilot_requests.carry_out(self, request)  # one action of a live context switch
                if ended is not None:
                    return ended
                request = None
            if request is not None or self.signals.checkpoint.is_set():
                self.signals.checkpoint.clear()
                self._save(request.request_id if request else "signal", request.nodes if request else ())
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
                self._say(f"the job ended without an exit status; guest console: {self.vm.console_log()}")
                self._say("last console lines: " + " | ".join(_last_lines(self.vm.console_log(), 8)))
                self._move(PilotState.FAILED, message="the guest ended without the job's exit status")
                return EXIT_FAILED  # VM kept (powered off) for a look; deleted with the job's next run
            code = exit_code
            self._say(f"job exited with status {code}; files copied back to {self.s.workdir}")
        else:
            self._say("guest ended")
        self.vm.delete()
        self._move(PilotState.FINISHED)
        self.log.info("finished", exit_code=code)
        self._hold_while_lent()
        return code

    def _save(self, request_id: str, nodes: tuple[str, ...] = ()) -> None:
        self._move(PilotState.SAVING, request_id=request_id, request_error="")  # a refusal before is no answer to this
        t0 = time.monotonic()
        path, size = self.vm.save()
        took = time.monotonic() - t0
        try:
            printed = self.vm.console_log().stat().st_size
        except OSError:
            printed = 0
        for tail in self._tails:
            tail.drain()  # everything the guest printed before the save is in the job's output now
        copied = [t.offset for t in self._tails] if self.real and len(self._tails) == 2 else []
        self._move(
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
        self._say(f"checkpointed VM {self.vm.name} on {self.s.node}: {size / 2**20:.0f} MiB in {took:.2f} s")
        self.log.info("saved", request=request_id, seconds=round(took, 3), bytes=size)

    def _save_and_exit(self, why: str) -> int:
        if self.vm.active():
            self._save("")
        self._say(f"{why}: exiting, VM state kept for the job's restart")
        self._hold_while_lent()
        return EXIT_CHECKPOINTED

    def _hold_while_lent(self) -> None:
        """The job ends with its VM away from its own node (a remapping swap moved it; the
        partner's VM runs on the pilot's node): wait, at most `partner_hold_s`, for the agent's
        `release` — it sends the partner's VM home first — so the RMS does not give the node to
        another job while a foreign VM still runs there. Bounded and fail-open: the RMS's end of
        the job is delayed by the bound at most, and only for a job whose VM the agent moved
        (the agent releases only when its journal shows no foreign VM on the node)."""
        own, away, bound = self.s.node, self.vm.node, self.s.partner_hold_s
        if own == away or bound <= 0 or len(self.vm.nodes()) > 1:
            return
        self._say(f"the job ended with its VM on {away}: holding {own} (at most {bound:g} s) until the VM "
                  f"remapping lent it goes home")  # fmt: skip
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
        self._say(f"not released within {bound:g} s: ending anyway ({own} may still host a remapped VM)")
        self.log.warning("hold timed out: ending with a foreign VM maybe still on the node", own=own, bound_s=bound)

    def _wait_for_requeue(self, *, withdrawable: bool) -> bool:
        """After a requested save: True when the RMS kills us; False to carry on running.

        A save asked for by a request file ends early when the file goes (the agent withdrew
        it); one asked for by SIGUSR1 (an operator) waits the whole `orphan_resume_s`.
        """
        deadline = time.monotonic() + self.s.orphan_resume_s
        while time.monotonic() < deadline:
            if self.signals.terminate.wait(self.s.poll_s):
                self._say("requeued by the resource manager: exiting")
                return True
            if withdrawable and self.pdir.read_request() is None:
                break  # the agent withdrew its request: resume at once
        self._say("not requeued: resuming the VM here")
        self.log.warning("checkpoint not followed by a requeue: resuming", waited=self.s.orphan_resume_s)
        self.pdir.withdraw_request()
        self._restore(self.s.node, self.vm.nodes() if len(self.vm.nodes()) > 1 else ())
        return False


def empty_file(stream: IO[str]) -> bool:
    """Whether `stream` is an empty regular file (a fresh or truncated job output file)."""
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == 0


def _last_lines(path: Path, count: int) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 8192))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip()][-count:]
