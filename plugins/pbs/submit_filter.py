#!/usr/bin/env python3
"""Torque SUBMITFILTER for vjob: tag each job script with its class and OS image.

qsub runs the program named by SUBMITFILTER in torque.cfg with qsub's own arguments, feeds it
the job script on stdin and submits what it prints on stdout; a non-zero exit refuses the
job and shows the filter's stderr to the user. This filter:

* derives the job's class from what the user cannot forge: `-I` among qsub's arguments
  (interactive), or the queue (`-q`, `#PBS -q`) being one of the operator's
  `interactive_queues` / `besteffort_queues`; otherwise batch. A user's own word —
  `#VJOB class=...`, `-v VJOB_CLASS=...`, `VJOB_CLASS` in the environment — is ignored (with
  a notice on stderr), since any batch job could otherwise claim interactive priority;
* reads the OS image from `#VJOB os=...` or `-v VJOB_OS=...` and refuses one the site does
  not offer, saying which and what is allowed (a user's mistake: better now than at run time);
  a batch job naming none in one of the operator's `vjob_queues` (`-q`, `#PBS -q`, else
  `default_queue`) gets that queue's image; `#VJOB off` opts out where `allow_opt_out` is
  true and is refused, saying so, where not;
* adds `#PBS -v VJOB_CLASS=...,VJOB_OS=...` (merged into an existing `#PBS -v` line), for
  the pilot and for people reading `qstat -f`; the adapter itself derives the class again
  from the job's `interactive` attribute and queue, never from this variable;
* refuses a job with a deadline (`-v VJOB_DEADLINE=EPOCH`) and a walltime (`-l walltime=`)
  whose x-factor is at or over the X the vjob agent publishes in its threshold file
  ([deadline] threshold_file), with job_submit.lua's message (x, X and why); no file, a
  malformed, stale or future-dated one: no check (docs/deadline.md);
* fails open: on any internal error, an unreadable configuration, or when it needs longer
  than its time budget, it prints the script unchanged and exits 0, so a broken filter can
  never stop a site from submitting jobs.

Why standalone (standard library only, no `vjob` import): it runs on every login node for
every qsub, where the vjob package may not be installed and where start-up time is paid by
every user. It reads the [pbs] section of the vjob configuration ($VJOB_CONFIG or
/etc/vjob/vjob.toml): os_images, interactive_queues, besteffort_queues, filter_budget_s,
vjob_queues, allow_opt_out, default_queue; and
[deadline] threshold_file. It carries its own reader of the threshold file, with the rules of
preemption.deadline.threshold_file (as job_submit.lua and the OpenPBS hook do).
Needs Python >= 3.8, and tomllib (3.11) or the tomli package to read the configuration
(without either it passes every script through unchanged). Installation: deploy/pbs/README.md.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import BinaryIO

DEFAULT_CONFIG = "/etc/vjob/vjob.toml"
CLASSES = ("batch", "interactive", "besteffort")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
"""An OS image name: no shell metacharacter, no option-looking name, no path."""
HEADER_LINES = 5000
"""Directives are only read from the header; stop looking after this many lines."""
HEADER_BYTES = 1 << 20
CHUNK = 1 << 16
THRESHOLD_LINE = re.compile(
    r"x=(-?\d{1,3}(?:\.\d{1,9})?) slowdown=(\d{1,3}(?:\.\d{1,9})?) at=(\d{1,12})(?: stale=(\d{1,5}))?\n?"
)
"""preemption.deadline.threshold_file's line; the same limits below."""
THRESHOLD_MAX_BYTES = 256
THRESHOLD_DEFAULT_STALE_S = 600
THRESHOLD_MAX_STALE_S = 86400
DEADLINE = re.compile(r"[0-9]{1,12}")
WALLTIME = re.compile(r"(?:(?:([0-9]{1,6}):)?([0-9]{1,6}):)?([0-9]{1,9})")
COUNTER_IMAGE = "debian-tiny"  # the counter guest runs no script and is not sized
GUEST_MIN_MIB = 256  # vjob.allocation.GUEST_MIN_MEMORY_MIB (standalone: no vjob import)
SIZE = re.compile(r"([0-9]{1,15})(b|kb|mb|gb|tb|pb|w|kw|mw|gw|tw|pw)?", re.IGNORECASE)  # no unit: bytes
SIZE_SHIFT = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40, "p": 50}
NODE_COUNT = re.compile(r"[0-9]{1,6}")
PPN = re.compile(r"(?:^|:)ppn=([0-9]{1,6})(?=:|$)")


class Rejected(Exception):
    """The script asks for something the site does not offer: refuse the job, say why."""


class BudgetExceeded(Exception):
    """The filter ran out of its time budget: pass the script through unchanged."""


@dataclass
class Settings:
    os_images: tuple[str, ...] = ()
    interactive_queues: tuple[str, ...] = ("interactive",)
    besteffort_queues: tuple[str, ...] = ()
    budget_s: float = 2.0
    threshold_file: str = ""
    """[deadline] threshold_file: where the agent publishes X; empty: no deadline check."""
    vjob_queues: dict[str, str] = field(default_factory=dict)
    """[pbs] vjob_queues: queue → the image every batch job there gets (the site default)."""
    allow_opt_out: bool = False
    """[pbs] allow_opt_out: whether `#VJOB off` lets a job of such a queue run bare."""
    default_queue: str = ""
    """[pbs] default_queue: the server's default queue, for a job that names none."""
    vm_overhead_mib: int = 256  # [provisioning] vm_overhead_mib
    node_max_mib: int = 0  # [pbs] node_max_mib: the largest vjob node's memory; 0: no upper check


@dataclass
class Request:
    """What the script and the command line ask for."""

    job_class: str = ""
    os_image: str = ""
    interactive: bool = False
    queue: str = ""
    variables: dict[str, str] = field(default_factory=dict)
    walltime: str = ""
    opt_out: bool = False
    """A `#VJOB off` line: the user asks to run bare in a vjob queue."""
    resources: dict[str, str] = field(default_factory=dict)  # -l mem, pmem, nodes...: argv's win


def load_settings(environ: dict[str, str]) -> Settings:
    """The [pbs] section of the vjob configuration; missing file → defaults."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11 on the login node: the tomli backport, else fail open
        import tomli as tomllib

    path = environ.get("VJOB_CONFIG") or DEFAULT_CONFIG
    if not os.path.exists(path):
        return Settings()
    with open(path, "rb") as fh:
        document = tomllib.load(fh)
    section = document.get("pbs", {})
    budget = float(section.get("filter_budget_s", 2.0))
    if not 0 < budget <= 60:
        raise ValueError(f"{path}: pbs.filter_budget_s = {budget}: must be in (0, 60]")
    return Settings(
        os_images=tuple(str(x) for x in section.get("os_images", ())),
        interactive_queues=tuple(str(x) for x in section.get("interactive_queues", ("interactive",))),
        besteffort_queues=tuple(str(x) for x in section.get("besteffort_queues", ())),
        budget_s=budget,
        threshold_file=str(document.get("deadline", {}).get("threshold_file", "")),
        vjob_queues={str(k): str(v) for k, v in dict(section.get("vjob_queues", {})).items()},
        allow_opt_out=bool(section.get("allow_opt_out", False)),
        default_queue=str(section.get("default_queue", "")),
        vm_overhead_mib=int(document.get("provisioning", {}).get("vm_overhead_mib", 256)),
        node_max_mib=int(section.get("node_max_mib", 0)),
    )


def _variable_list(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in re.split(r"(?<!\\),", text):
        if item:
            key, _, value = item.partition("=")
            out[key.strip()] = value
    return out


def _options(tokens: Sequence[str], request: Request, *, argv: bool = False) -> None:
    """Read the qsub options vjob cares about from a directive or from qsub's argv.

    `-I` counts only on qsub's command line (`argv`): that is where qsub takes it from to open
    an interactive session; a `#PBS -I` line in a batch script makes no session.
    """
    i = 0
    while i < len(tokens):
        token = tokens[i]
        value = tokens[i + 1] if i + 1 < len(tokens) else ""
        if token == "-I" and argv:
            request.interactive = True
        elif token == "-q" and value:
            request.queue, i = value.split("@", 1)[0], i + 1
        elif token.startswith("-q") and len(token) > 2:
            request.queue = token[2:].split("@", 1)[0]
        elif token == "-v" and value:
            request.variables.update(_variable_list(value))
            i += 1
        elif token == "-l" and value:
            for item in value.split(","):
                key, _, amount = item.partition("=")
                if key.strip() == "walltime":
                    request.walltime = amount.strip()
                elif key.strip():
                    request.resources[key.strip()] = amount.strip()
            i += 1
        i += 1


def read_header(lines: list[str], argv: Sequence[str]) -> tuple[Request, int]:
    """The request, and the index of the first line after the directive header."""
    request = Request()
    _options(argv, request, argv=True)
    end = 0
    for index, line in enumerate(lines[:HEADER_LINES]):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        end = index + 1
        words = stripped.split()
        if not words:
            continue
        if words[0] == "#PBS":
            _options(words[1:], request)
        elif words[0].upper() == "#VJOB" and [w.lower() for w in words[1:]] == ["off"]:
            request.opt_out = True
        elif words[0].upper() == "#VJOB":
            for word in words[1:]:
                key, eq, value = word.partition("=")
                key = key.lower()
                if not eq or key not in ("class", "os"):
                    raise Rejected(f"line {index + 1}: '{word}': #VJOB takes class=NAME and os=NAME, or off")
                if key == "class":
                    request.job_class = value
                else:
                    request.os_image = value
    given = Request()  # qsub's command line overrides the script's directives
    _options(argv, given, argv=True)
    request.walltime = given.walltime or request.walltime
    request.resources.update(given.resources)
    if "VJOB_DEADLINE" in given.variables:
        request.variables["VJOB_DEADLINE"] = given.variables["VJOB_DEADLINE"]
    return request, end


def job_class(request: Request, settings: Settings) -> str:
    """The class from the submission mode and the operator's queue lists, never from the user."""
    if request.interactive or request.queue in settings.interactive_queues:
        return "interactive"
    return "besteffort" if request.queue in settings.besteffort_queues else "batch"


def ignored_claim(request: Request, derived: str) -> str:
    """The notice for a user who named a class of their own that differs from the derived one."""
    claimed = (request.job_class or request.variables.get("VJOB_CLASS", "")).strip()
    if not claimed or claimed.lower() == derived:
        return ""
    return (
        f"vjob: class {claimed[:40]!r} ignored, this job is {derived}: the class comes from "
        "qsub -I or the queue, not from #VJOB class= or VJOB_CLASS\n"
    )


def decide(request: Request, settings: Settings) -> tuple[str, str]:
    """(class, os image) to tag, or Rejected naming what is wrong and what is allowed."""
    derived = job_class(request, settings)
    image = queue_default(request, settings, derived)
    if image and not NAME.fullmatch(image):
        raise Rejected(f"os = {image!r}: an OS image name has only letters, digits and . _ + - (at most 64)")
    if image and settings.os_images and image not in settings.os_images:
        raise Rejected(f"os = {image!r}: unknown OS image; this site offers {', '.join(settings.os_images)}")
    return derived, image


def queue_default(request: Request, settings: Settings, derived: str) -> str:
    """The image asked for, else the one the job's queue gives every batch job ("" for none or
    an allowed `#VJOB off`); Rejected for `#VJOB off` beside an image, or where not allowed."""
    image = (request.os_image or request.variables.get("VJOB_OS", "")).strip()
    if image.lower() == "off":  # -v VJOB_OS=off: the OpenPBS spelling of the opt-out
        request.opt_out, image = True, ""
    if request.opt_out and image:
        raise Rejected(f"the script says both '#VJOB off' and os={image}: give one")
    queue = request.queue or settings.default_queue
    default = settings.vjob_queues.get(queue, "")
    if image or derived != "batch" or not default:
        return image
    if not request.opt_out:
        return default
    if settings.allow_opt_out:
        return ""
    raise Rejected(
        f"every job of queue {queue} runs in a VM (image {default}) and this site does not let a job opt out: "
        "remove '#VJOB off' or submit to another queue"
    )


def load_threshold(path: str, now: float) -> tuple[float, float] | None:
    """(X, slowdown) the agent published, or None (no check): missing, malformed, stale (older
    than the file's own stale=) or from the future."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(THRESHOLD_MAX_BYTES + 1)
    except OSError:
        return None
    m = THRESHOLD_LINE.fullmatch(raw.decode("ascii", "replace")) if len(raw) <= THRESHOLD_MAX_BYTES else None
    if not m:
        return None
    x, slowdown, at = float(m.group(1)), float(m.group(2)), int(m.group(3))
    stale = int(m.group(4)) if m.group(4) else THRESHOLD_DEFAULT_STALE_S
    if slowdown <= 0 or not 1 <= stale <= THRESHOLD_MAX_STALE_S or now - at > stale or at - now > 60:
        return None
    return x, slowdown


def deadline_refusal(request: Request, settings: Settings, now: float) -> str | None:
    """Why a job cannot be expected to meet its deadline (x >= X), or None: no threshold file
    configured or usable, no deadline (digits only) or no walltime ([[H:]M:]S) — no check."""
    deadline = request.variables.get("VJOB_DEADLINE", "").strip()
    wall = WALLTIME.fullmatch(request.walltime)
    if not settings.threshold_file or not DEADLINE.fullmatch(deadline) or not wall:
        return None
    hours, minutes, seconds = (int(g) if g else 0 for g in wall.groups())
    limit = hours * 3600 + minutes * 60 + seconds
    published = load_threshold(settings.threshold_file, now)
    if limit <= 0 or published is None:
        return None
    threshold, slowdown = published
    remaining = limit * slowdown
    left = int(deadline) - now
    x = (remaining - left) / remaining
    if x < threshold:
        return None
    return (
        f"the job cannot be expected to meet its deadline: x = {x:.2f} >= X = {threshold:.2f} "
        f"(time limit {limit // 60} min x VM slowdown {slowdown:.2f} = {remaining / 60:.0f} min to run, "
        f"deadline in {left / 60:.0f} min); ask for a later deadline or a shorter time limit"
    )


def tag(lines: list[str], header_end: int, derived: str, image: str) -> list[str]:
    """The script with the VJOB_* variables added to (or merged into) a `#PBS -v` directive."""
    ours = {"VJOB_CLASS": derived}
    if image:
        ours["VJOB_OS"] = image
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    out = list(lines)
    for index in range(header_end):
        tokens = out[index].split()
        if len(tokens) >= 3 and tokens[0] == "#PBS" and tokens[1] == "-v":
            merged = {k: v for k, v in _variable_list(tokens[2]).items() if k not in ours}
            merged.update(ours)
            rest = " ".join(tokens[3:])
            text = "#PBS -v " + ",".join(f"{k}={v}" for k, v in merged.items()) + (f" {rest}" if rest else "")
            out[index] = text + newline
            return out
    line = "#PBS -v " + ",".join(f"{k}={v}" for k, v in ours.items()) + newline
    at = 1 if out and out[0].startswith("#!") else 0
    if at == 1 and not out[0].endswith("\n"):
        out[0] += newline
    out.insert(at, line)
    return out


def size_mib(text: str) -> int | None:
    """A Torque size in whole MiB, None when it is not one."""
    m = SIZE.fullmatch(text.strip())
    if not m:
        return None
    unit = (m.group(2) or "b").lower()
    factor = 8 if unit.endswith("w") else 1  # a word
    return (int(m.group(1)) * factor << SIZE_SHIFT[unit[:-1]]) >> 20


def node_memory(resources: dict[str, str]) -> tuple[str, int] | None:
    """(what the user wrote, MiB) of the job's memory on each node: `pmem` × the `ppn` of
    `nodes=N:ppn=P`, else the job-wide `mem` split over its nodes; None when it asks neither."""
    spec = resources.get("nodes", "")
    parts = [p for p in spec.split("+") if p]
    count = sum(int(p.split(":")[0]) if NODE_COUNT.fullmatch(p.split(":")[0]) else 1 for p in parts) or 1
    ppn = max([int(m.group(1)) for p in parts if (m := PPN.search(p))] or [1])
    if resources.get("pmem"):
        what, each = f"pmem={resources['pmem']} x ppn={ppn}", size_mib(resources["pmem"])
        mib = None if each is None else each * ppn
    elif resources.get("mem"):
        what = f"mem={resources['mem']}" + (f" over {count} nodes" if count > 1 else "")
        mib = None if (whole := size_mib(resources["mem"])) is None else whole // count
    else:
        return None
    if mib is None:
        raise Rejected(f"{what[:80]}: not a Torque size (e.g. 4gb, 512mb)")
    return what, mib


def memory_refusal(request: Request, settings: Settings, derived: str, image: str) -> str | None:
    """Why a batch job's VM cannot hold its memory per node (issue 33): below the guest's
    minimum once the VM's overhead is taken, or above the largest node; None otherwise, and for
    a job that gets no VM."""
    if derived != "batch" or not image or image == COUNTER_IMAGE:
        return None
    if (asked := node_memory(request.resources)) is None:
        return None
    (what, mib), overhead = asked, settings.vm_overhead_mib
    if mib - overhead < GUEST_MIN_MIB:
        return (
            f"{what} ({mib} MiB per node) leaves {mib - overhead} MiB for the VM after its overhead of "
            f"{overhead} MiB, below the guest's minimum of {GUEST_MIN_MIB} MiB: ask for at least "
            f"{GUEST_MIN_MIB + overhead} MiB per node"
        )
    largest = settings.node_max_mib
    if largest > 0 and mib > largest:
        return (
            f"{what} ({mib} MiB per node) is more than the largest node's {largest} MiB, whose VM gets at most "
            f"{largest - overhead} MiB (its memory minus the VM's overhead of {overhead} MiB): ask for at most "
            f"{largest} MiB per node"
        )
    return None


def header_lines(data: bytes) -> list[str]:
    """The first HEADER_BYTES of the script as lines (a cut last line dropped), each with its \\n."""
    head = data[:HEADER_BYTES].decode("utf-8", errors="surrogateescape")
    if len(data) > HEADER_BYTES:
        head = head.rsplit("\n", 1)[0] + "\n" if "\n" in head else ""
    parts = head.split("\n")  # only \n ends a line for the shell (not \f, \v, U+2028, ...)
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def filter_script(data: bytes, argv: Sequence[str], settings: Settings, notices: list[str] | None = None) -> bytes:
    """The tagged script; raises Rejected for a user's mistake; appends notices for the user."""
    lines = header_lines(data)
    request, end = read_header(lines, argv)
    derived, image = decide(request, settings)
    refusal = memory_refusal(request, settings, derived, image) or deadline_refusal(request, settings, time.time())
    if refusal:
        raise Rejected(refusal)
    if notices is not None and (notice := ignored_claim(request, derived)):
        notices.append(notice)
    tagged = "".join(tag(lines[:end], end, derived, image)).encode("utf-8", errors="surrogateescape")
    consumed = len("".join(lines[:end]).encode("utf-8", errors="surrogateescape"))
    return tagged + data[consumed:]


def _on_alarm(_signum: int, _frame: FrameType | None) -> None:
    raise BudgetExceeded


def main(
    argv: Sequence[str],
    stdin: BinaryIO,
    stdout: BinaryIO,
    stderr: BinaryIO,
    environ: dict[str, str],
    transform: Callable[..., bytes] = filter_script,
) -> int:
    """qsub's filter protocol around `transform` (filter_script, or wrap_filter's wrapping one):
    its budget, its refusals, and the fail-open paths are the same for both."""
    received = bytearray()
    try:
        # The default budget runs from the start: reading the configuration is inside it (a
        # FIFO or a hung mount at $VJOB_CONFIG must not hold qsub); the configured budget then
        # counts from the same start.
        started = time.monotonic()
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, Settings.budget_s)
        try:
            settings = load_settings(environ)
        except BudgetExceeded:
            stderr.write(
                f"vjob submit filter: configuration not read within {Settings.budget_s:g} s; job passed "
                "unchanged\n".encode()
            )
            raise
        except Exception as exc:  # noqa: BLE001 - fail open: a bad configuration must not stop qsub
            stderr.write(f"vjob submit filter: configuration unreadable ({exc}); job passed unchanged\n".encode())
            settings = None
        left = (settings.budget_s if settings else Settings.budget_s) - (time.monotonic() - started)
        if left <= 0:
            raise BudgetExceeded
        signal.setitimer(signal.ITIMER_REAL, left)
        while chunk := _read_some(stdin):
            received += chunk
        if settings is None:
            raise BudgetExceeded  # already reported: just pass the script through
        notices: list[str] = []
        result = transform(bytes(received), argv, settings, notices)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for notice in notices:
            stderr.write(notice.encode("utf-8", errors="replace"))
    except Rejected as exc:
        signal.setitimer(signal.ITIMER_REAL, 0)
        stderr.write(f"qsub: job rejected by vjob: {exc}\n".encode("utf-8", errors="replace"))
        return 1
    except BudgetExceeded:
        signal.setitimer(signal.ITIMER_REAL, 0)
        return _pass_through(received, stdin, stdout)
    except Exception as exc:  # noqa: BLE001 - fail open: any bug of ours must not stop qsub
        signal.setitimer(signal.ITIMER_REAL, 0)
        stderr.write(f"vjob submit filter: internal error ({type(exc).__name__}); job passed unchanged\n".encode())
        return _pass_through(received, stdin, stdout)
    stdout.write(result)
    stdout.flush()
    return 0


def _read_some(stdin: BinaryIO) -> bytes:
    """What is there now (at most CHUNK bytes): a budget alarm must not lose bytes already read."""
    read1 = getattr(stdin, "read1", None)
    return read1(CHUNK) if read1 is not None else stdin.read(CHUNK)


def _pass_through(received: bytearray, stdin: BinaryIO, stdout: BinaryIO) -> int:
    """Print what was read and the rest of stdin, byte for byte."""
    stdout.write(bytes(received))
    while chunk := _read_some(stdin):
        stdout.write(chunk)
    stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], sys.stdin.buffer, sys.stdout.buffer, sys.stderr.buffer, dict(os.environ)))
