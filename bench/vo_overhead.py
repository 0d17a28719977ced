"""Virtualisation overhead (VO): the same small CPU, memory and I/O jobs bare and in a vjob VM,
alone and beside 1–3 co-located ones — the measurements the deadline VO model is fitted to.

Why ratios at equal co-location: with k other jobs on the node the bare jobs contend too (two
cores here); what the VM adds is vm_k / bare_k, which is what preemption.deadline.fit_vo_model
takes (its `colocated` = k). Each job is a busybox sh script — the guest's own busybox runs it
bare too, so both sides run the same binary — that times itself with /proc/uptime (10 ms):

- cpu: a shell arithmetic loop;
- mem: dd of zeroes to /dev/null in 4 MiB blocks (kernel memory copy bandwidth);
- io:  dd of zeroes to a scratch disk with fsync (bare: a file on the host's disk; VM: a raw
       virtio disk backed by a file on the same disk).

The VM is the tiny test guest (provisioning.guest: Debian's kernel, busybox initramfs, 256 MiB,
one vCPU) run by qemu-system-x86_64 directly under TCG (here /dev/kvm exists but a KVM guest
hangs after SeaBIOS; `--accel kvm` where it works). Every run boots its own guest; boot time is
not counted (the script times itself).

    .venv/bin/python bench/vo_overhead.py [--kinds cpu,mem,io] [--colocated 0,1,2,3] [--out FILE]

Prints a table and ends with one JSON line: {"accel", "measurements": [{kind, colocated,
bare_s, vm_s}], "model": the fitted VOModel}. `--out` also writes that JSON (the file
`vjob simulate --vo-model` and simulator.deadline_reproduce read).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
from pathlib import Path

from preemption.deadline import fit_vo_model
from provisioning import guest
from vjob.errors import CommandError
from vjob.proc import run

WORK = {
    "cpu": "i=0; while [ $i -lt {n} ]; do i=$((i+1)); done",
    "mem": "dd if=/dev/zero of=/dev/null bs=4M count={n} 2>/dev/null",
    "io": "dd if=/dev/zero of={disk} bs=64k count={n} conv=fsync 2>/dev/null",
}
SIZE = {"cpu": 100_000, "mem": 500, "io": 400}  # about a second bare on this machine
TIMED = (
    "read a _ < /proc/uptime\n{work}\nread b _ < /proc/uptime\n"
    'echo "VO_SECONDS $(( (${{b%.*}}${{b#*.}}) - (${{a%.*}}${{a#*.}}) ))"\n'
)
_RESULT = re.compile(r"VO_SECONDS (-?\d+)")


def script(kind: str, disk: str) -> str:
    return TIMED.format(work=WORK[kind].format(n=SIZE[kind], disk=disk))


def _seconds(output: str, what: str) -> float:
    m = _RESULT.search(output)
    if not m:
        raise CommandError([what], f"no VO_SECONDS line in its output: {output[-300:]!r}")
    return int(m.group(1)) / 100.0


def _parallel(fns: list) -> list[float]:  # type: ignore[type-arg]
    out: list[float | BaseException] = [0.0] * len(fns)

    def one(i: int) -> None:
        try:
            out[i] = fns[i]()
        except BaseException as exc:  # noqa: BLE001 - re-raised below in the caller's thread
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return [float(r) for r in out]  # type: ignore[arg-type]


def bare(busybox: Path, kind: str, scratch: Path, i: int) -> float:
    disk = scratch / f"bare-{i}.img"
    try:
        return _seconds(run([str(busybox), "sh", "-c", script(kind, str(disk))], timeout_s=600), "bare")
    finally:
        disk.unlink(missing_ok=True)


def vm(files: guest.GuestFiles, accel: str, scratch: Path, i: int) -> float:
    disk = scratch / f"vm-{i}.img"
    with open(disk, "wb") as fh:
        fh.truncate(128 * 2**20)
    try:
        out = run(
            [
                "qemu-system-x86_64",
                "-machine",
                f"accel={accel}",
                "-m",
                "256",
                "-smp",
                "1",
                "-nographic",
                "-no-reboot",
                "-nodefaults",
                "-serial",
                "stdio",
                "-kernel",
                str(files.kernel),
                "-initrd",
                str(files.initrd),
                "-append",
                f"{files.cmdline} no_timer_check",  # a starved TCG guest fails the timer check
                "-drive",
                f"file={disk},if=virtio,format=raw,cache=none",
            ],
            timeout_s=900,
            stdin="",
        )
        return _seconds(out, "qemu")
    finally:
        disk.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", default="cpu,mem,io")
    ap.add_argument("--colocated", default="0,1,2,3")
    ap.add_argument("--accel", default=None, help="tcg (default) or kvm (only where KVM is proven to boot a guest)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    a = ap.parse_args(argv)
    kinds = [k for k in a.kinds.split(",") if k]
    for k in kinds:
        if k not in WORK:
            ap.error(f"--kinds: {k!r} is not one of {', '.join(WORK)}")
    cols = [int(c) for c in a.colocated.split(",")]
    accel = a.accel or "tcg"
    rows = []
    with tempfile.TemporaryDirectory(prefix="vjob-vo-", dir="/var/tmp") as tmp:
        scratch = Path(tmp)
        os.chmod(scratch, 0o755)
        busybox = guest.cache_dir() / "guest" / "parts" / "busybox"
        for kind in kinds:
            files = guest.build(f"cd /tmp\n{script(kind, '/dev/vda')}")
            if not busybox.exists():
                raise SystemExit(f"{busybox}: missing (provisioning.guest.build fetches it)")
            for k in cols:
                b = _parallel([lambda i=i, kd=kind: bare(busybox, kd, scratch, i) for i in range(k + 1)])
                v = _parallel([lambda i=i, f=files: vm(f, accel, scratch, i) for i in range(k + 1)])
                row = {"kind": kind, "colocated": k, "bare_s": sum(b) / len(b), "vm_s": sum(v) / len(v)}
                rows.append(row)
                print(
                    f"{kind:4s} +{k} co-located: bare {row['bare_s']:7.2f} s  vm {row['vm_s']:7.2f} s  "
                    f"ratio {row['vm_s'] / row['bare_s']:6.2f}",
                    file=sys.stderr,
                )
    model = fit_vo_model(rows, source=f"bench/vo_overhead.py ({accel})")
    doc = {"accel": accel, "cores": os.cpu_count(), "measurements": rows, "model": model.to_dict()}
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
