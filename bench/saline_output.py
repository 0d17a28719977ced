"""A Saline vjob's output and exit status on a real guest: what the user gets back.

Root only (root's libvirt). The vjob runs the real `debian12` image (`vjob image build`,
cached by content) on one VM; its first VM's guest agent runs COMMAND as the user:

    print "before", wait until the host's snapshot is taken, print "after" on stdout and
    "to stderr" on stderr, exit 3

The manager's own code drives it: `deployment.deploy`, a periodic `snapshots.snapshot` once
"before" is out (its output is committed up to the cut), then, when the guest powered off,
`deployment.complete` (the rest of the output, the exit status read off the job disk). OAR is not
involved (its client points at nothing). Checked: the kept stdout is exactly "before\\nafter\\n",
stderr "to stderr\\n", exit_code 3. Figures: start → COMMAND ended, the snapshot with its
output commit, the end's commit and exit read. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from devkit.saline_bench import (
    USER,
    leased_job,
    require_root,
    saline_bench,
    wait_for,
)
from plugins.oar.parse import OarJob
from saline_bew import deployment, journal, snapshots
from saline_bew.manager import Manager
from vjob import progress

COMMAND = ["sh", "-c", "echo before; sleep 25; echo after; echo to stderr >&2; exit 3"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--boot-timeout", type=float, default=600.0)
    args = ap.parse_args()
    require_root("root's libvirt")
    figures: dict[str, Any] = {"bench": "saline_output", "image": "debian12", "load_1m": round(os.getloadavg()[0], 1)}
    with progress.Progress(4, "saline output bench") as bar, saline_bench("saline-out", bar, figures) as b:
        figures.update(run(b.manager, bar, args.boot_timeout))
    print(json.dumps(figures))


def run(manager: Manager, bar: progress.Progress, boot_timeout_s: float) -> dict[str, Any]:
    store = manager.ports.store
    job = leased_job(manager, "be0a7b0e7a1c", COMMAND, vm_count=1, memory_mb=512)
    journal.record(store, job.key, "bench", oar_job_id="1")
    vm = job.vm_names[0]
    out_log, _err_log = manager.ports.vms.output_logs(vm, "na")
    bar.relabel("deploy and boot (TCG here: about a minute)")
    started = time.monotonic()
    try:
        oar_job = OarJob(id="1", state="Running", user=USER, types=("besteffort",), hosts=("na",), resources=(1,))
        deployment.deploy(manager.ports, journal.get(store, job.key), oar_job)
        printed = wait_for(lambda: out_log.exists() and b"before" in out_log.read_bytes(), boot_timeout_s, "'before'")
        bar.advance()
        bar.relabel("snapshot while COMMAND sleeps")
        t = time.monotonic()
        assert snapshots.snapshot(manager.ports, journal.get(store, job.key), reason="periodic")
        snapshot_s = time.monotonic() - t
        snap = [e for e in journal.events(store, job.key) if e.kind == "snapshot"][-1].detail
        bar.advance()
        bar.relabel("COMMAND ends")
        wait_for(lambda: deployment.finished(manager.ports, journal.get(store, job.key)), 300, "the guest to power off")
        ended_s = time.monotonic() - started
        t = time.monotonic()
        deployment.complete(manager.ports, journal.get(store, job.key))
        complete_s = time.monotonic() - t
        bar.advance()
        finished = journal.events(store, job.key)[-1].detail
        kept = (manager.ports.output_dir / f"{job.key}.stdout").read_bytes()
        kept_err = (manager.ports.output_dir / f"{job.key}.stderr").read_bytes()
    finally:
        manager.ports.vms.stop(vm, "na")
        manager.ports.vms.network_down(manager.ports.subnet(job), ["na"])
    ok = kept == b"before\nafter\n" and kept_err == b"to stderr\n" and finished.get("exit_code") == 3
    return {
        "ok": ok,
        "exit_code": finished.get("exit_code"),
        "stdout": kept.decode(errors="replace"),
        "stderr": kept_err.decode(errors="replace"),
        "snapshot_output_at": snap.get("output_at"),
        "start_to_first_line_s": round(printed, 1),
        "snapshot_s": round(snapshot_s, 2),
        "start_to_end_s": round(ended_s, 1),
        "complete_s": round(complete_s, 2),
    }


if __name__ == "__main__":
    main()
