"""What job_submit.lua's wrapping costs a submission: the same script sbatch'ed plain and wrapped.

job_submit.lua runs inside slurmctld under its job lock, so every millisecond it spends on a
script is a millisecond every other RPC waits. This submits one script (4 MiB less 1 KiB by
default, ending in a newline: the literal here-document path; its wrapper must stay within
Slurm's max_script_size, 4 MiB) held, `--repeat` times each way,
alternating: plain (no image asked: not wrapped) and wrapped (`--comment=vjob:os=debian12`:
same bytes), and takes the medians. It then does the same for a 1 MiB script without a final
newline, which still goes base64 in pure Lua (the path every script took before). The first
wrapped job of each size is checked: Slurm stores the wrapper, and the user's script in it.
Brings the dev cluster up when it is not running (and down at the end, only then); installs
this checkout's job_submit.lua and lists debian12 for the run (the list is restored).
Usage: flock /tmp/vjob-devcluster.lock .venv/bin/python bench/submit_wrap.py [--kib 4095] [--repeat 5]
Last line: {"bench": "submit_wrap", "script_bytes": N, "plain_s": ..., "wrapped_s": ..., "ratio": ...,
"base64_bytes": N, "base64_plain_s": ..., "base64_wrapped_s": ..., "base64_ratio": ...}
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devkit.devcluster import JOB_SUBMIT_LUA, DevCluster, Settings
from plugins.slurm.images import read_image_list, write_image_list

WRAPPED = "--comment=vjob:os=debian12"


def make_script(size: int, final_newline: bool = True) -> str:
    """A shell script of exactly `size` characters: a header, then `: ...` lines."""
    head = "#!/bin/sh\n#SBATCH -J wrapbench\necho start\n"
    line = ": " + "x" * 61 + "\n"
    body = line * ((size - len(head)) // len(line))
    tail = size - len(head) - len(body)
    text = head + body + (": " + "y" * (tail - 3) + "\n" if tail >= 3 else "\n" * tail)
    if not final_newline:
        text = text[:-1] + "z"
    assert len(text) == size
    return text


def sbatch(env: dict[str, str], script: str, *args: str) -> tuple[str, float]:
    """Submit held; (job id, seconds from sbatch's start to its exit)."""
    t = time.monotonic()
    res = subprocess.run(
        ["sbatch", "--parsable", "--hold", "-o", "/dev/null", *args],
        input=script,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    took = time.monotonic() - t
    if res.returncode != 0:
        raise SystemExit(f"bench/submit_wrap: sbatch {' '.join(args)} of {len(script)} bytes: {res.stderr.strip()}")
    return res.stdout.strip().split(";")[0], took


def stored_script(env: dict[str, str], job: str) -> str:
    out = Path(tempfile.mkdtemp()) / "script"
    subprocess.run(["scontrol", "write", "batch_script", job, str(out)], env=env, check=True, capture_output=True)
    text = out.read_text()
    shutil.rmtree(out.parent)
    return text


def user_script_in(wrapper: str) -> str:
    """The user's script back out of the wrapper (literal or base64)."""
    _, _, rest = wrapper.partition("<<'")
    delim, _, rest = rest.partition("'\n")
    body = rest[: -len(delim) - 1]
    return base64.b64decode(body).decode() if "--base64" in wrapper else body


def measure(cluster: DevCluster, script: str, repeat: int) -> dict[str, float]:
    """Median sbatch time plain and wrapped (alternating), the wrapper checked once."""
    env = {**os.environ, **cluster.env}
    times: dict[str, list[float]] = {"plain": [], "wrapped": []}
    jobs: list[str] = []
    try:
        for i in range(repeat):
            for kind, args in (("plain", ()), ("wrapped", (WRAPPED,))):
                job, took = sbatch(env, script, *args)
                jobs.append(job)
                times[kind].append(took)
                if i == 0:
                    stored = stored_script(env, job)
                    if kind == "plain" and stored != script:
                        raise SystemExit("bench/submit_wrap: the plain job's script was changed")
                    if kind == "wrapped" and user_script_in(stored) != script:
                        raise SystemExit("bench/submit_wrap: the wrapped job does not hold the script")
    finally:
        if jobs:
            subprocess.run(["scancel", *jobs], env=env, check=False, capture_output=True, timeout=60)
    plain, wrapped = statistics.median(times["plain"]), statistics.median(times["wrapped"])
    return {"plain_s": round(plain, 4), "wrapped_s": round(wrapped, 4), "ratio": round(wrapped / plain, 2)}


def prepared(cluster: DevCluster) -> list[str]:
    """Install this checkout's job_submit.lua and list debian12; the list as it was."""
    lua = cluster.etc / "job_submit.lua"
    if lua.read_text() != JOB_SUBMIT_LUA.read_text():
        shutil.copyfile(JOB_SUBMIT_LUA, lua)
    before = read_image_list(cluster.image_list)
    write_image_list(cluster.image_list, [*before, "debian12"])
    time.sleep(2.5)  # the Lua's 2 s cache of the list
    return before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kib", type=int, default=4095, help="size of the literal-path script (KiB)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    cluster = DevCluster()
    started = not cluster.is_up()
    if started:
        cluster.up(Settings(run_dir=cluster.root, agent="no", libvirt=False))
    before = prepared(cluster)
    try:
        size = args.kib << 10
        literal = measure(cluster, make_script(size), args.repeat)
        b64_size = 1 << 20
        old = measure(cluster, make_script(b64_size, final_newline=False), args.repeat)
    finally:
        write_image_list(cluster.image_list, before)
        if started:
            cluster.down()
    line = {"bench": "submit_wrap", "script_bytes": size, **literal, "base64_bytes": b64_size}
    line.update({f"base64_{k}": v for k, v in old.items()})
    print(json.dumps(line))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
