"""Stand-ins for a job's QEMU in the usage tests: real processes of another uid that burn CPU and
touch memory, with QEMU's `-name guest=<vm>,debug-threads=on` on their command line.

Why real processes: the sampler reads the kernel's counters (/proc), so what it measures must be
something the kernel counted; a process of another uid shows that the uid check is the kernel's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PYTHON = "/usr/bin/python3"
"""The system interpreter: any uid may run it (the venv's lives under /root)."""
BURN = """
import sys, time
block = bytearray(int(sys.argv[2]) * 1024 * 1024)
for i in range(0, len(block), 4096):
    block[i] = 1
end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    pass
print("burnt", flush=True)
time.sleep(600)
"""


def _drop(uid: int) -> None:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(uid)


@contextmanager
def burner(vm: str, *, uid: int = 65534, cpu_s: float = 1.0, mib: int = 40) -> Iterator[subprocess.Popen[str]]:
    """A process of `uid` named like QEMU of VM `vm` that burns `cpu_s` of CPU, holds `mib` MiB,
    then sleeps; killed (and reaped) on leaving."""
    child = subprocess.Popen(
        [PYTHON, "-c", BURN, str(cpu_s), str(mib), "-name", f"guest={vm},debug-threads=on"],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: _drop(uid),
        cwd="/",
    )
    try:
        yield child
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)


def wait_burnt(child: subprocess.Popen[str], timeout: float = 60.0) -> None:
    """Until the burner has used its CPU (it prints a line then)."""
    assert child.stdout is not None
    t0 = time.monotonic()
    line = child.stdout.readline()
    assert line.strip() == "burnt", f"burner said {line!r} after {time.monotonic() - t0:.1f} s"


def cpu_of(pid: int) -> float:
    """utime + stime of `pid` in seconds, read here independently of provisioning.vm_usage."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
